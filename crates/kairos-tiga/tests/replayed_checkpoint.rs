//! A review's schedule (2026-12-07), as a regression test: a follower that restarted with its
//! disk (recovering, in the view it served) took a delayed or replayed `InstallCheckpoint` of
//! that view although its log reached past the checkpoint, so it dropped log entries it had
//! acknowledged — which the leader's commit point counted — and still voted in the next view
//! change: two transactions committed on the slow path (leader + that follower) were lost. A
//! follower now skips a checkpoint its matching log reaches, whatever its state.

use kairos_core::harness::{sent, RoleHarness};
use kairos_core::{Effect, NodeId};
use kairos_tiga::msg::{Piece, ReplyKind, ServerReply, Submit, TigaMsg, Ts, TxnId};
use kairos_tiga::ops::{Op, OpKind};
use kairos_tiga::server::Server;
use kairos_tiga::topology::{TigaConfig, Topology};
use kairos_tiga::view::{ServerState, View};
use std::time::Duration;

const COORDINATOR: NodeId = NodeId(10);
const VM: NodeId = NodeId(20);

fn topology() -> Topology {
    Topology { shards: vec![vec![NodeId(0), NodeId(1), NodeId(2)]], leader: vec![0] }
}

fn config() -> TigaConfig {
    TigaConfig { checkpoint_interval: 2, checkpoint_positions_per_key: 0, ..TigaConfig::default() }
}

fn server(r: u32) -> Server {
    Server::new(topology(), config(), 0, r).with_view_managers(vec![VM])
}

fn piece(seq: u32) -> Piece {
    let key = format!("key-{seq}").into_bytes();
    Piece::new(TxnId::new(COORDINATOR, seq), 0, vec![0], vec![Op::new(key, OpKind::IncrBy(1))])
}

fn submit(h: &mut RoleHarness<Server>, seq: u32) -> Vec<Effect<TigaMsg>> {
    let now = h.now();
    let s = Submit {
        view: 0,
        piece: piece(seq).into(),
        ts: Ts::at(now + Duration::from_millis(1)),
        send_time: now,
        first_send_time: now,
    };
    h.deliver(COORDINATOR, TigaMsg::Submit(s))
}

/// Messages among `effects` sent to `to`.
fn to(effects: &[Effect<TigaMsg>], node: NodeId) -> Vec<TigaMsg> {
    sent(effects).into_iter().filter(|(t, _)| *t == node).map(|(_, m)| m.clone()).collect()
}

fn replies(effects: &[Effect<TigaMsg>]) -> Vec<(u32, ReplyKind, Ts)> {
    to(effects, COORDINATOR)
        .into_iter()
        .filter_map(|m| match m {
            TigaMsg::Reply(ServerReply { txn, kind, ts, .. }) => Some((txn.seq(), kind, ts)),
            _ => None,
        })
        .collect()
}

fn log_txns(s: &Server) -> Vec<u32> {
    s.log().iter().map(|e| e.piece.txn.seq()).collect()
}

#[test]
fn a_replayed_checkpoint_never_drops_entries_a_restarted_follower_acknowledged() {
    let (mut a, mut f, mut g) = (
        RoleHarness::new(NodeId(0), server(0), 1),
        RoleHarness::new(NodeId(1), server(1), 2),
        RoleHarness::new(NodeId(2), server(2), 3),
    );
    a.start();
    f.start();
    g.start();
    let mut coordinator_replies: Vec<(u32, ReplyKind, Ts)> = Vec::new();

    // Batch 0: T0, synchronized to and acknowledged by both followers (commit point 1).
    let mut e = submit(&mut a, 0);
    e.extend(a.advance(Duration::from_millis(3)));
    for (node, h) in [(NodeId(1), &mut f), (NodeId(2), &mut g)] {
        for m in to(&e, node) {
            if let TigaMsg::LogSync { .. } = m {
                for ack in to(&h.deliver(NodeId(0), m), NodeId(0)) {
                    a.deliver(node, ack);
                }
            }
        }
    }
    assert_eq!(a.role().executed(), 1);

    // Batch 1: T1..T4, logged by the leader, synchronized to both followers (commit point 0).
    let mut e = Vec::new();
    for seq in 1..=4 {
        e.extend(submit(&mut a, seq));
    }
    e.extend(a.advance(Duration::from_millis(3)));
    coordinator_replies.extend(replies(&e));
    let mut f_acks = Vec::new();
    let mut g_acks = Vec::new();
    for m in to(&e, NodeId(1)) {
        if let TigaMsg::LogSync { .. } = m {
            let out = f.deliver(NodeId(0), m);
            coordinator_replies.extend(replies(&out));
            f_acks.extend(to(&out, NodeId(0))); // held: F's acks are delayed
        }
    }
    for m in to(&e, NodeId(2)) {
        if let TigaMsg::LogSync { .. } = m {
            g_acks.extend(to(&g.deliver(NodeId(0), m), NodeId(0)));
        }
    }
    assert_eq!(log_txns(f.role()), vec![0, 1, 2, 3, 4]);
    assert_eq!(log_txns(g.role()), vec![0, 1, 2, 3, 4]);

    // Batch 2: T5, T6, synchronized to F only (G's copy is lost); F's acks still delayed.
    let mut e = Vec::new();
    for seq in 5..=6 {
        e.extend(submit(&mut a, seq));
    }
    e.extend(a.advance(Duration::from_millis(3)));
    coordinator_replies.extend(replies(&e));
    for m in to(&e, NodeId(1)) {
        if let TigaMsg::LogSync { .. } = m {
            let out = f.deliver(NodeId(0), m);
            coordinator_replies.extend(replies(&out));
            f_acks.extend(to(&out, NodeId(0)));
        }
    }
    assert_eq!(log_txns(f.role()), vec![0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(f.role().executed(), 1, "F learned commit point 1 only");

    // G's acks arrive: commit point 5, the leader executes and checkpoints at 4 (log base 2).
    for m in g_acks {
        a.deliver(NodeId(2), m);
    }
    assert_eq!(a.role().executed(), 5);
    eprintln!("leader: checkpoint {:?}, log base {}", a.role().checkpoint().map(|c| c.position), a.role().log().base());

    // F's acks stall for sync_resend_after: the leader thinks F is behind its log's base and
    // sends it the checkpoint (F is Normal, its log reaches 4: it ignores it). That message is
    // the one that will resurface later (a replay / a slow link). Everything else the leader
    // sends now is lost.
    let e = a.advance(Duration::from_millis(500));
    let install: Vec<TigaMsg> =
        to(&e, NodeId(1)).into_iter().filter(|m| matches!(m, TigaMsg::InstallCheckpoint { .. })).collect();
    assert!(!install.is_empty(), "the leader sends F its checkpoint");
    let install = install[0].clone();
    if let TigaMsg::InstallCheckpoint { checkpoint, .. } = &install {
        eprintln!("InstallCheckpoint to F at position {}", checkpoint.position);
    }
    f.deliver(NodeId(0), install.clone());
    assert_eq!(log_txns(f.role()), vec![0, 1, 2, 3, 4, 5, 6], "Normal F ignores it: its log reaches it");

    // F's delayed acks arrive: sync point 7 on F, commit point 7 (leader + F): T5, T6 committed.
    for m in f_acks {
        a.deliver(NodeId(1), m);
    }
    assert_eq!(a.role().executed(), 7, "the leader executed T5 and T6: committed (A and F hold them)");
    for seq in [5u32, 6] {
        let fast_leader = coordinator_replies.iter().find(|(s, k, _)| *s == seq && *k == ReplyKind::Fast);
        let slow_f = coordinator_replies.iter().find(|(s, k, _)| *s == seq && *k == ReplyKind::Slow);
        eprintln!("T{seq}: leader fast {fast_leader:?}, F slow {slow_f:?}");
        let (Some(l), Some(s)) = (fast_leader, slow_f) else { panic!("replies of T{seq}") };
        assert_eq!(l.2, s.2, "leader fast + f = 1 slow reply at the same timestamp: the coordinator commits T{seq}");
    }

    // F crashes and restarts with its disk (it executed nothing: no checkpoint on disk).
    let e = f.restart(server(1));
    drop(e); // its LogState to the leader is lost (the leader crashes next)
    assert_eq!(f.role().view().1, ServerState::Recovering);
    assert_eq!(log_txns(f.role()), vec![0, 1, 2, 3, 4, 5, 6], "F recovered its whole log");

    // The old InstallCheckpoint resurfaces (replay) while F is recovering.
    f.deliver(NodeId(0), install);
    eprintln!(
        "F after the replayed InstallCheckpoint: log {:?} (base {}, len {})",
        log_txns(f.role()),
        f.role().log().base(),
        f.role().log().len()
    );

    // The leader A crashes. View 1: G (replica 2) leads; voters G and F.
    let view1 = View { number: 1, leaders: vec![2], preventive: false };
    let e = g.deliver(VM, TigaMsg::NewView { view: view1.clone() });
    let collect: Vec<TigaMsg> = to(&e, NodeId(1));
    let mut reports = Vec::new();
    for m in collect {
        if let TigaMsg::CollectLog { .. } = m {
            reports.extend(to(&f.deliver(NodeId(2), m), NodeId(2)));
        }
    }
    let mut started = Vec::new();
    for m in reports {
        if let TigaMsg::LogState { report, .. } = &m {
            eprintln!(
                "F's report: voter {} last_normal {} sync_point {} entries {}",
                report.voter,
                report.last_normal,
                report.sync_point,
                report.entries.len()
            );
        }
        started.extend(g.deliver(NodeId(1), m));
    }
    assert_eq!(g.role().view().1, ServerState::Normal, "G started view 1");
    let new_log = log_txns(g.role());
    eprintln!("view 1 log at G: {new_log:?} (base {})", g.role().log().base());
    assert!(new_log.contains(&5) && new_log.contains(&6), "committed T5 and T6 lost in view 1: {new_log:?}");
}
