//! A review's schedule: a follower that restarts with its disk and rejoins its own view through
//! its (live) leader's `StartView` forgot the transactions it had released (and answered on
//! the fast path) but that were not yet in the leader's log: `on_start_view` rebuilt the
//! transaction table from the log and `become_normal` cleared the released list, and the
//! snapshot it then wrote no longer listed them. In a later view change it voted as if it had
//! never released them, so rule (b) of the merge no longer found a fast-committed multi-shard
//! transaction whose agreement was still under way.
//!
//! Schedule (f = 1, two shards of 3; replica 0 leads both in view 0; detective mode):
//! 1. The coordinator submits T (k0 on shard 0, k1 on shard 1). Every replica releases T at
//!    its proposed timestamp; both leaders execute it and reply fast; their agreement messages
//!    are lost (delayed). All six fast replies agree: the coordinator reports T committed.
//! 2. Follower F2 of shard 0 crashes and restarts with its disk (it journaled `Released(T)`),
//!    reports to its live leader L0 and rejoins view 0 from its `StartView` (L0's log is
//!    empty: T is not agreed yet).
//! 3. T3, single-shard on shard 0, writes k0 at a later timestamp; F1 and F2 get it (L0's copy
//!    is delayed) and release it.
//! 4. L0 crashes. View 1: F1 leads shard 0, replica 0 still leads shard 1. Shard 0's merge
//!    (F1, F2; rule (b) needs ⌈f/2⌉ + 1 = 2 of them) must find T; had F2 forgotten it, T3 in
//!    the tail after T's timestamp would make T unplaceable there, and `decide` would drop it
//!    on both shards.

mod common;

use common::{outgoing, server, tk, Cluster, COORDINATOR, VM};
use kairos_core::NodeId;
use kairos_tiga::msg::TigaMsg;
use kairos_tiga::ops::{Op, OpKind};
use kairos_tiga::topology::TigaConfig;
use kairos_tiga::view::{ServerState, View};
use std::collections::VecDeque;
use std::time::Duration;

/// Runs the schedule of the module docs; `restart`: whether follower F2 of shard 0 crashes
/// and rejoins view 0 (step 2). Returns whether T is in shard 0's and shard 1's view-1 logs.
fn run(restart: bool) -> (bool, bool) {
    let mut net = Cluster::new(TigaConfig::default());

    // 1. T over both shards: every replica gets it in time and releases it.
    let ops = vec![Op::new(tk(0), OpKind::IncrBy(1)), Op::new(tk(1), OpKind::IncrBy(1))];
    let (t, e) = net.coord.call(|c, ctx| c.submit(ctx, ops));
    let t = t.expect("submitted");
    let submits = outgoing(COORDINATOR, &e);
    assert_eq!(submits.len(), 6);
    net.pump(submits.into(), |from, _, _| from == COORDINATOR);
    // Agreement messages, log syncs and heartbeats are lost (delayed); the replies arrive.
    let mut to_coord = VecDeque::new();
    for (node, h) in net.servers.iter_mut() {
        let e = h.advance(Duration::from_millis(100));
        to_coord.extend(outgoing(*node, &e).into_iter().filter(|(_, to, _)| *to == COORDINATOR));
    }
    net.pump(to_coord, |_, to, _| to == COORDINATOR);
    let st = net.coord.role().stats();
    assert_eq!((st.committed, st.committed_fast), (1, 1), "the client is told T committed (fast path)");
    assert!(!net.logged(0, t) && !net.logged(3, t), "T is not agreed yet: in neither leader's log");

    // 2. F2 of shard 0 crashes, restarts with its disk (which holds `Released(T)`) and rejoins
    //    view 0 from its live leader L0 (whose log does not hold T yet).
    if restart {
        let n = 2u32;
        let h = net.servers.get_mut(&NodeId(n)).unwrap();
        let e = h.restart(server(0, n));
        assert_eq!(h.role().view().1, ServerState::Recovering);
        let q: VecDeque<_> = outgoing(NodeId(n), &e).into();
        // Only the rejoin exchange with L0 (log state, start view, acknowledgement).
        net.pump(q, |from, to, m| {
            (from == NodeId(n) && to == NodeId(0)) && matches!(m, TigaMsg::LogState { .. } | TigaMsg::SyncAck { .. })
                || (from == NodeId(0) && to == NodeId(n) && matches!(m, TigaMsg::StartView { .. }))
        });
        assert_eq!(net.s(n).view().1, ServerState::Normal, "F2 rejoined view 0");
    }

    // 3. Later, T3 (shard 0 only) writes k0; F1 and F2 get it (L0's copy is delayed).
    net.coord.advance(Duration::from_millis(200));
    let (t3, e) = net.coord.call(|c, ctx| c.submit(ctx, vec![Op::new(tk(0), OpKind::IncrBy(1))]));
    t3.expect("submitted");
    net.pump(outgoing(COORDINATOR, &e).into(), |_, to, _| to == NodeId(1) || to == NodeId(2));
    for n in [1u32, 2] {
        net.servers.get_mut(&NodeId(n)).unwrap().advance(Duration::from_millis(300));
    }

    // 4. L0 crashes for good. View 1: F1 leads shard 0, replica 0 still leads shard 1.
    let view1 = View { number: 1, leaders: vec![1, 0], preventive: false };
    let q: VecDeque<_> =
        [1u32, 2, 3, 4, 5].iter().map(|n| (VM, NodeId(*n), TigaMsg::NewView { view: view1.clone() })).collect();
    net.pump(q, |_, to, _| to != NodeId(0) && to != COORDINATOR);
    assert_eq!(net.s(1).view(), (&view1, ServerState::Normal), "shard 0's new leader started view 1");
    assert_eq!(net.s(3).view(), (&view1, ServerState::Normal), "shard 1's leader started view 1");
    (net.logged(1, t), net.logged(3, t))
}

/// Control: without F2's restart, the same schedule keeps T on both shards.
#[test]
fn without_the_restart_the_committed_txn_is_kept() {
    assert_eq!(run(false), (true, true));
}

#[test]
fn a_fast_committed_multi_shard_txn_survives_a_follower_rejoining_its_view_after_a_restart() {
    assert_eq!(run(true), (true, true), "T, committed (fast path) to the client, is in both shards' view-1 logs");
}
