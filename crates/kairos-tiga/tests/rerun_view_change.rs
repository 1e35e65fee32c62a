//! A review's schedule: a new leader that crashes after its merge and its exchange with the
//! other shards' leaders, but before it starts the view, restarts with its disk. Had it run the
//! view change for the same view again (before 2026-12-07 it did: its disk did not hold the
//! view, and `enter_view` lets a restarted replica lead a view it may lead), its second merge
//! could take another f + 1 replicas (the restarted old leader), so that its state for a
//! multi-shard transaction differs from what it told the other shard's leader, which has
//! already started the view with that transaction kept: the transaction ended up in one
//! shard's log and not in the other's.
//!
//! Now a leader makes the view durable before it collects, so that restarted it waits in that
//! view, recovering, until the view manager names the next view's leaders, and every shard
//! decides in the next view from what the views before left in the logs (the other shard's
//! started view 1 settled the transaction there).

mod common;

use common::{server, tk, topology, COORDINATOR, VM};
use kairos_core::harness::{sent, RoleHarness};
use kairos_core::{Effect, LocalTime, NodeId};
use kairos_tiga::msg::{Piece, ShardId, Submit, TigaMsg, Ts, TxnId};
use kairos_tiga::ops::{key_id, Op, OpKind};
use kairos_tiga::server::Server;
use kairos_tiga::view::{ServerState, View};
use std::time::Duration;

fn harness(shard: ShardId, replica: u32) -> RoleHarness<Server> {
    let node = topology().shards[shard as usize][replica as usize];
    let mut h = RoleHarness::new(node, server(shard, replica), 1 + node.0 as u64);
    h.start();
    h
}

/// T (seq 1): increments key 0 (shard 0) and key 1 (shard 1). Its piece of `shard`.
fn t_piece(shard: ShardId) -> Piece {
    let all = vec![Op::new(tk(0), OpKind::IncrBy(1)), Op::new(tk(1), OpKind::IncrBy(1))];
    let mine: Vec<Op> = all.iter().filter(|op| key_id(&op.key) % 2 == shard as u64).cloned().collect();
    Piece::new(TxnId::new(COORDINATOR, 1), shard, vec![0, 1], mine).with_txn_ops(all)
}

/// T' (seq 2): single-shard on shard 0, increments key 0.
fn t2_piece() -> Piece {
    Piece::new(TxnId::new(COORDINATOR, 2), 0, vec![0], vec![Op::new(tk(0), OpKind::IncrBy(1))])
}

fn submit(h: &mut RoleHarness<Server>, piece: Piece, ts: Ts, view: u64) -> Vec<Effect<TigaMsg>> {
    let now = h.now();
    h.deliver(
        COORDINATOR,
        TigaMsg::Submit(Submit { view, piece: piece.into(), ts, send_time: now, first_send_time: now }),
    )
}

fn to(effects: &[Effect<TigaMsg>], node: NodeId) -> Vec<TigaMsg> {
    sent(effects).into_iter().filter(|(t, _)| *t == node).map(|(_, m)| m.clone()).collect()
}

fn log_txns(s: &Server) -> Vec<(u32, Ts)> {
    s.log().iter().map(|e| (e.piece.txn.seq(), e.ts)).collect()
}

/// Each Verify message as (kind, [(txn seq, state)]).
fn kinds(msgs: &[TigaMsg]) -> Vec<String> {
    msgs.iter()
        .map(|m| match m {
            TigaMsg::Verify { kind, items, .. } => {
                format!("{kind:?} {:?}", items.iter().map(|i| (i.txn.seq(), i.state)).collect::<Vec<_>>())
            }
            other => other.kind().to_string(),
        })
        .collect()
}

#[test]
fn a_leader_restarted_in_its_view_change_leaves_the_view_to_the_next_which_decides_a_multi_shard_transaction_alike() {
    // Shard 0: A (old leader), L (leads view 1), B. Shard 1: M (leads both views), M1, M2.
    let mut a = harness(0, 0);
    let mut l = harness(0, 1);
    let mut b = harness(0, 2);
    let mut m = harness(1, 0);
    let mut m1 = harness(1, 1);
    let m2 = harness(1, 2);

    let base = LocalTime::from_secs(1_000);
    let ts_t = Ts::at(base + Duration::from_millis(3)); // T, multi-shard
    let ts_t2 = Ts::at(base + Duration::from_millis(5)); // T', shard 0 only, same key as T

    // Followers L and B of shard 0 get T and T' in time: they release T at 3 ms, T' at 5 ms.
    for h in [&mut l, &mut b] {
        submit(h, t_piece(0), ts_t, 0);
        submit(h, t2_piece(), ts_t2, 0);
        h.advance(Duration::from_millis(6));
    }
    // The old leader A gets T' first, releases and logs it, then T late: it bumps T past T'
    // and executes it speculatively (its agreement with M is lost).
    submit(&mut a, t2_piece(), ts_t2, 0);
    a.advance(Duration::from_millis(6));
    submit(&mut a, t_piece(0), ts_t, 0);
    a.advance(Duration::from_millis(2)); // its log synchronization is lost
    eprintln!("A: log {:?}", log_txns(a.role()));
    assert_eq!(log_txns(a.role()).iter().map(|e| e.0).collect::<Vec<_>>(), vec![2], "A logged T'");
    // Shard 1: all three release T at 3 ms (agreement messages with A are lost).
    for h in [&mut m, &mut m1] {
        submit(h, t_piece(1), ts_t, 0);
        h.advance(Duration::from_millis(6));
    }

    // A crashes; it restarts with its disk (view 0, recovering).
    a.restart(server(0, 0));

    // View 1: L leads shard 0, M keeps shard 1.
    let view1 = View { number: 1, leaders: vec![1, 0], preventive: false };
    let new_view = TigaMsg::NewView { view: view1.clone() };

    // Shard 1's view change: M merges with M1 (T released by both at 3 ms: tentative).
    let e = m.deliver(VM, new_view.clone());
    let mut m_listing = Vec::new();
    for msg in to(&e, NodeId(4)) {
        for r in to(&m1.deliver(NodeId(3), msg), NodeId(3)) {
            m_listing.extend(to(&m.deliver(NodeId(4), r), NodeId(1)));
        }
    }
    eprintln!("M merged; to L: {:?}", kinds(&m_listing));

    // Shard 0's first run: L merges with B (T and T' released by both: tentative).
    let e = l.deliver(VM, new_view.clone());
    let mut l_listing = Vec::new();
    for msg in to(&e, NodeId(2)) {
        for r in to(&b.deliver(NodeId(1), msg), NodeId(1)) {
            l_listing.extend(to(&l.deliver(NodeId(2), r), NodeId(3)));
        }
    }
    eprintln!("L merged (first run); to M: {:?}", kinds(&l_listing));
    // L's listing reaches M: M decides T with L's state and starts view 1.
    let mut m_started = Vec::new();
    for msg in l_listing {
        m_started.extend(m.deliver(NodeId(1), msg)); // M's answers to L are lost: L crashes now
    }
    assert_eq!(m.role().view().1, ServerState::Normal, "M started view 1");
    // M1 adopts M's view-1 log and acknowledges: T commits on shard 1 and M executes it.
    for msg in to(&m_started, NodeId(4)) {
        for ack in to(&m1.deliver(NodeId(3), msg), NodeId(3)) {
            m.deliver(NodeId(4), ack);
        }
    }
    assert_eq!(m.role().executed(), 1, "shard 1 committed and executed T's piece");
    eprintln!("M's view-1 log: {:?}", log_txns(m.role()));
    assert!(log_txns(m.role()).iter().any(|e| e.0 == 1), "shard 1 keeps T");
    assert_ne!(l.role().view().1, ServerState::Normal, "L has not started view 1");

    // L crashes before it started the view and restarts with its disk: the view it was
    // changing to is on it, so it does not run that view's change again (a second merge could
    // take A's report and decide T otherwise than M did).
    l.restart(server(0, 1));
    assert_eq!(l.role().view(), (&view1, ServerState::Recovering), "L's disk holds view 1; it waits");
    let e = l.deliver(VM, new_view.clone());
    assert!(sent(&e).is_empty(), "L does not collect for view 1 again: {:?}", kinds(&to(&e, NodeId(0))));

    // The view manager replaces it: view 2, B leads shard 0, M keeps shard 1. Every shard runs
    // the view change; A's report reaches B first (it holds T' logged, not T).
    let view2 = View { number: 2, leaders: vec![2, 0], preventive: false };
    let mut servers = [a, l, b, m, m1, m2];
    let mut queue: std::collections::VecDeque<(NodeId, NodeId, TigaMsg)> = Default::default();
    for node in [3, 2, 0, 1, 4, 5] {
        let e = servers[node].deliver(VM, TigaMsg::NewView { view: view2.clone() });
        queue.extend(sent(&e).into_iter().map(|(to, msg)| (NodeId(node as u32), to, msg.clone())));
    }
    let (mut delivered, mut l_reported) = (0, false);
    while let Some((from, to, msg)) = queue.pop_front() {
        if let (NodeId(1), TigaMsg::LogState { report, .. }) = (from, &msg) {
            // Its vote: the snapshot that made view 1 durable kept what it had released.
            let released: Vec<(u32, Ts)> = report.released.iter().map(|e| (e.piece.txn.seq(), e.ts)).collect();
            assert_eq!((report.voter, released), (true, vec![(1, ts_t), (2, ts_t2)]), "L's vote is whole");
            l_reported = true;
        }
        let Some(h) = servers.get_mut(to.0 as usize) else { continue }; // coordinator, view manager
        let e = h.deliver(from, msg);
        queue.extend(sent(&e).into_iter().map(|(next, msg)| (to, next, msg.clone())));
        delivered += 1;
        assert!(delivered < 10_000, "the view change settles");
    }
    assert!(l_reported, "L reported to B");
    let [_, _, b, m, _, _] = &servers;
    assert_eq!(b.role().view(), (&view2, ServerState::Normal), "B started view 2");
    assert_eq!(m.role().view(), (&view2, ServerState::Normal), "M started view 2");
    let shard0 = log_txns(b.role());
    let shard1 = log_txns(m.role());
    eprintln!("view 2: shard 0 log {shard0:?}, shard 1 log {shard1:?}");
    let t0 = shard0.iter().find(|e| e.0 == 1).map(|e| e.1);
    let t1 = shard1.iter().find(|e| e.0 == 1).map(|e| e.1);
    assert_eq!(t1, Some(ts_t), "shard 1 keeps T, which it executed, at its agreed timestamp");
    assert_eq!(t0, t1, "shard 0 keeps T at the same timestamp");
}
