//! Review schedule: a follower that restarted (with its disk) in the view it served in adopts a
//! *replayed* `StartView` of that same view — one its leader sent it at an earlier rejoin — and
//! truncates its log back to that old message's `from`, dropping entries it had already
//! acknowledged (and answered on the slow path). Its leader counted the acknowledgement in its
//! commit point and the coordinator counted the slow reply; when the leader then fails, the
//! next view's merge (the other follower and this one) no longer has the transaction.
//!
//! Schedule (f = 1; shard 0 on nodes 0–2, replica 0 leads; shard 1 idle):
//! 1. T0 on shard 0 reaches every replica and commits; everyone logs it.
//! 2. F2 (node 2) crashes, restarts with its disk and rejoins view 0: L0 answers its
//!    `LogState` with `StartView{view 0, from 1, entries []}` — a copy of it stays in the
//!    network (duplicated / delayed).
//! 3. T1 on shard 0 reaches L0 only (the followers' copies are lost). L0 logs it and syncs it to
//!    F2 only; F2 journals it, acknowledges, answers the coordinator on the slow path: the client
//!    is told T1 committed (L0's fast reply + F2's slow reply).
//! 4. F2 crashes again and restarts with its disk (its log holds T0, T1); its `LogState` to L0 is
//!    delayed, and the old `StartView{view 0, from 1}` from step 2 arrives: F2 truncates its log
//!    to position 1, dropping T1.
//! 5. L0 fails. View 1: F1 leads shard 0 and merges from F1 and F2 — T1 is gone.

mod common;

use common::{outgoing, server, Cluster, Queue, COORDINATOR, VM};
use kairos_core::NodeId;
use kairos_tiga::msg::TigaMsg;
use kairos_tiga::topology::TigaConfig;
use kairos_tiga::view::{ServerState, View};
use std::time::Duration;

fn shard0(n: NodeId) -> bool {
    n.0 <= 2
}

/// Runs the schedule; `replay`: whether the stale `StartView` of step 2 is delivered in step 4.
/// Returns whether T1 is in the view-1 log of shard 0's new leader.
fn run(replay: bool) -> bool {
    let mut net = Cluster::new(TigaConfig::default());

    // 1. T0 everywhere on shard 0.
    net.coord.advance(Duration::from_millis(1));
    let (t0, q) = net.submit(0);
    net.pump(q, |_, to, _| shard0(to));
    net.tick(&[0, 1, 2], Duration::from_millis(200), |_, to, _| shard0(to) || to == COORDINATOR);
    for n in 0..3 {
        assert!(net.logged(n, t0), "T0 in replica {n}'s log");
    }

    // 2. F2 restarts with its disk and rejoins view 0; L0's StartView is kept (replayed later).
    let e = net.servers.get_mut(&NodeId(2)).unwrap().restart(server(0, 2));
    assert_eq!(net.s(2).view().1, ServerState::Recovering);
    let mut stale = None;
    for (from, to, m) in outgoing(NodeId(2), &e) {
        if to == NodeId(0) && matches!(m, TigaMsg::LogState { .. }) {
            let e = net.servers.get_mut(&NodeId(0)).unwrap().deliver(from, m);
            for (f2, to2, m2) in outgoing(NodeId(0), &e) {
                if to2 == NodeId(2) && matches!(m2, TigaMsg::StartView { .. }) {
                    stale = Some(m2.clone());
                    net.pump([(f2, to2, m2)].into(), |_, to, _| shard0(to));
                }
            }
        }
    }
    let stale = stale.expect("L0 sent F2 a StartView");
    assert_eq!(net.s(2).view().1, ServerState::Normal, "F2 rejoined view 0");

    // 3. T1 reaches L0 only; L0 syncs it to F2 only; the client is told it committed.
    net.coord.advance(Duration::from_millis(1));
    let (t1, q) = net.submit(0);
    net.pump(q, |_, to, _| to == NodeId(0));
    let allow = |from: NodeId, to: NodeId, _: &TigaMsg| {
        to == COORDINATOR || (from == NodeId(0) && to == NodeId(2)) || (from == NodeId(2) && to == NodeId(0))
    };
    net.tick(&[0], Duration::from_millis(200), allow);
    assert_eq!(net.coord.role().stats().committed, 2, "the client is told T0 and T1 committed");
    assert!(net.logged(0, t1) && net.logged(2, t1), "T1 in L0's and F2's logs");
    assert!(!net.logged(1, t1), "F1 never got T1");

    // 4. F2 crashes and restarts with its disk; its LogState is delayed; the old StartView arrives.
    let _ = net.servers.get_mut(&NodeId(2)).unwrap().restart(server(0, 2));
    assert!(net.logged(2, t1), "F2 recovered T1 from its journal");
    if replay {
        net.pump([(NodeId(0), NodeId(2), stale)].into(), |_, to, _| to == NodeId(2));
    }

    // 5. L0 fails for good. View 1: F1 leads shard 0, replica 0 (node 3) still leads shard 1.
    let view1 = View { number: 1, leaders: vec![1, 0], preventive: false };
    let q: Queue =
        [1u32, 2, 3, 4, 5].iter().map(|n| (VM, NodeId(*n), TigaMsg::NewView { view: view1.clone() })).collect();
    net.pump(q, |_, to, _| to != NodeId(0) && to != COORDINATOR && to != VM);
    assert_eq!(net.s(1).view(), (&view1, ServerState::Normal), "shard 0's new leader started view 1");
    net.logged(1, t1)
}

/// Control: without the replayed StartView, T1 survives the view change.
#[test]
fn without_the_replay_the_committed_txn_survives() {
    assert!(run(false));
}

#[test]
fn a_replayed_start_view_never_drops_entries_a_restarted_follower_acknowledged() {
    assert!(run(true), "T1, committed (slow path) to the client, is in the view-1 log of shard 0");
}
