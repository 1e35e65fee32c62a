//! Unit tests of one Tiga server, driven message by message through the role harness:
//! release in timestamp order, the leader's bump and the follower's hold, a speculative
//! transaction holding its keys until agreement, a lower leader revising its timestamp, and
//! view-change messages that are stale, bogus or from strangers changing nothing.

use kairos_core::harness::{sent, RoleHarness};
use kairos_core::{Effect, LocalTime, NodeId};
use kairos_tiga::msg::{
    Agreement, LogEntry, LogReport, Piece, ReplyKind, ServerReply, ShardId, Submit, TigaMsg, Ts, TxnId,
};
use kairos_tiga::ops::{key_id, Op, OpKind, OpOutput};
use kairos_tiga::server::Server;
use kairos_tiga::topology::{TigaConfig, Topology};
use kairos_tiga::view::{ServerState, View};
use std::time::Duration;

const COORDINATOR: NodeId = NodeId(10);

/// Two shards of three replicas: shard 0 on nodes 0–2, shard 1 on nodes 3–5; replica 0 leads.
fn topology() -> Topology {
    Topology {
        shards: vec![vec![NodeId(0), NodeId(1), NodeId(2)], vec![NodeId(3), NodeId(4), NodeId(5)]],
        leader: vec![0, 0],
    }
}

fn server(shard: ShardId, replica: u32) -> RoleHarness<Server> {
    let node = topology().shards[shard as usize][replica as usize];
    let mut h = RoleHarness::new(node, Server::new(topology(), TigaConfig::default(), shard, replica), 1);
    h.start();
    h
}

fn ns(t: LocalTime) -> Ts {
    Ts::at(t)
}

/// Test key `k` as bytes: a key on shard `k mod 2` (its id has k's parity), so even test
/// keys are shard 0.
fn tk(k: u64) -> Vec<u8> {
    (0u32..).map(|j| format!("k{k}-{j}").into_bytes()).find(|b| key_id(b) % 2 == k % 2).expect("some suffix")
}

/// A piece of shard `shards[0]` incrementing the test keys `keys` (a multi-shard one carries
/// them as its transaction's operations too; the other shards' are not needed here).
fn piece(seq: u32, shards: &[ShardId], keys: &[u64]) -> Piece {
    let ops: Vec<Op> = keys.iter().map(|k| Op::new(tk(*k), OpKind::IncrBy(1))).collect();
    let txn_ops = if shards.len() > 1 { ops.clone() } else { Vec::new() };
    Piece::new(TxnId::new(COORDINATOR, seq), shards[0], shards.to_vec(), ops).with_txn_ops(txn_ops)
}

/// Submits `piece` with a timestamp `after` from now.
fn submit(h: &mut RoleHarness<Server>, piece: Piece, after: Duration) -> Vec<Effect<TigaMsg>> {
    let now = h.now();
    h.deliver(
        COORDINATOR,
        TigaMsg::Submit(Submit {
            view: 0,
            piece: piece.into(),
            ts: Ts::at(now + after),
            send_time: now,
            first_send_time: now,
        }),
    )
}

/// A reply to the coordinator: (transaction's sequence number, kind, timestamp, the versions
/// the leader read — for increments also the values read).
type Reply = (u32, ReplyKind, Ts, Option<Vec<u64>>);

/// The replies to the coordinator among `effects`.
fn replies(effects: &[Effect<TigaMsg>]) -> Vec<Reply> {
    sent(effects)
        .into_iter()
        .filter_map(|(to, m)| match m {
            TigaMsg::Reply(ServerReply { txn, kind, ts, result, .. }) if to == COORDINATOR => {
                if let Some(r) = result {
                    let values: Vec<OpOutput> = r.versions.iter().map(|v| OpOutput::Int(*v as i64 + 1)).collect();
                    assert_eq!(r.outputs, values, "an increment returns the value after it");
                }
                Some((txn.seq(), *kind, *ts, result.as_ref().map(|r| r.versions.clone())))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn transactions_are_released_in_timestamp_order_once_the_clock_passes_them() {
    let mut h = server(0, 0);
    // Arrive in the opposite order of their timestamps.
    assert!(replies(&submit(&mut h, piece(2, &[0], &[6]), Duration::from_millis(20))).is_empty());
    assert!(replies(&submit(&mut h, piece(1, &[0], &[6]), Duration::from_millis(10))).is_empty());
    let r = replies(&h.advance(Duration::from_millis(30)));
    assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2], "{r:?}");
    // The leader executes: the first read 0, the second read the first's increment.
    assert_eq!(r[0].3, Some(vec![0]));
    assert_eq!(r[1].3, Some(vec![1]));
    assert!(r.iter().all(|x| x.1 == ReplyKind::Fast));
    assert!(r[0].2 < r[1].2);
}

#[test]
fn a_leader_bumps_a_late_timestamp_and_a_follower_holds_it() {
    let mut leader = server(0, 0);
    let mut follower = server(0, 1);
    let mut released = Ts::ZERO;
    for h in [&mut leader, &mut follower] {
        submit(h, piece(1, &[0], &[6]), Duration::from_millis(10));
        let r = replies(&h.advance(Duration::from_millis(20)));
        assert_eq!(r.len(), 1);
        released = r[0].2;
    }
    // Transaction 2 proposes a timestamp below the one already released on key 6.
    for h in [&mut leader, &mut follower] {
        let now = h.now();
        assert!(Ts::at(now) > released);
        let ts = Ts::from_nanos(released.as_nanos() - 1);
        h.deliver(
            COORDINATOR,
            TigaMsg::Submit(Submit {
                view: 0,
                piece: piece(2, &[0], &[6]).into(),
                ts,
                send_time: now,
                // A coordinator whose clock lags: its first send is no later than its timestamp.
                first_send_time: LocalTime::from_nanos(ts.as_nanos()),
            }),
        );
    }
    let bumped = replies(&leader.advance(Duration::from_millis(1)));
    assert_eq!(bumped.len(), 1, "the leader bumps and releases it: {bumped:?}");
    assert!(bumped[0].2 > released);
    assert!(
        replies(&follower.advance(Duration::from_millis(50))).is_empty(),
        "the follower holds it for the leader's log"
    );
    assert_eq!(leader.role.stats().bumped, 1);
    assert_eq!(follower.role.stats().held, 1);
}

#[test]
fn a_speculative_transaction_holds_its_keys_until_its_timestamp_is_agreed() {
    let mut h = server(0, 0);
    // T1 spans both shards (detective mode: executed at once, then agreed); T2 conflicts on
    // key 8 with a later timestamp.
    let e = submit(&mut h, piece(1, &[0, 1], &[8]), Duration::from_millis(10));
    let announced: Vec<Ts> = sent(&e)
        .into_iter()
        .filter_map(|(to, m)| match m {
            TigaMsg::Agree(Agreement { ts, confirm: false, .. }) if to == NodeId(3) => Some(*ts),
            _ => None,
        })
        .collect();
    assert_eq!(announced.len(), 1, "round 1 goes to shard 1's leader on arrival");
    submit(&mut h, piece(2, &[0], &[8]), Duration::from_millis(15));
    let r = replies(&h.advance(Duration::from_millis(40)));
    assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1], "T2 waits behind T1's hold: {r:?}");
    // Shard 1's leader had the same timestamp: T1 is final, its hold drops, T2 goes.
    let agree = TigaMsg::Agree(Agreement {
        view: 0,
        txn: TxnId::new(COORDINATOR, 1),
        shard: 1,
        ts: announced[0],
        confirm: false,
        resend: false,
    });
    let r = replies(&h.deliver(NodeId(3), agree));
    assert_eq!(r.iter().map(|x| (x.0, x.3.clone())).collect::<Vec<_>>(), vec![(2, Some(vec![1]))]);
}

#[test]
fn a_lower_leader_revokes_and_re_executes_at_the_agreed_timestamp_then_confirms() {
    let mut h = server(0, 0);
    let e = submit(&mut h, piece(1, &[0, 1], &[10]), Duration::from_millis(10));
    let mine = sent(&e)
        .into_iter()
        .find_map(|(_, m)| match m {
            TigaMsg::Agree(Agreement { ts, .. }) => Some(*ts),
            _ => None,
        })
        .unwrap();
    assert_eq!(replies(&h.advance(Duration::from_millis(20))).len(), 1, "executed speculatively");
    let agreed = mine + Duration::from_millis(50);
    let txn = TxnId::new(COORDINATOR, 1);
    let e = h.deliver(
        NodeId(3),
        TigaMsg::Agree(Agreement { view: 0, txn, shard: 1, ts: agreed, confirm: false, resend: false }),
    );
    assert!(replies(&e).is_empty(), "revoked and re-queued at the agreed timestamp");
    assert_eq!(h.role.stats().revoked, 1);
    let e = h.advance(Duration::from_millis(60));
    let r = replies(&e);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].2, r[0].3.clone()),
        (agreed, Some(vec![0])),
        "re-executed at the agreed timestamp on the undone state"
    );
    let confirmed = sent(&e).into_iter().any(
        |(to, m)| matches!(m, TigaMsg::Agree(Agreement { confirm: true, ts, .. }) if to == NodeId(3) && *ts == agreed),
    );
    assert!(confirmed, "the lower leader confirms round 2");
    assert_eq!(h.role.log().len(), 1);
}

/// A piece whose declared read / write sets are not the ones its operations imply is refused:
/// conflict detection trusts those sets.
#[test]
fn a_piece_whose_sets_do_not_match_its_operations_is_refused() {
    let mut h = server(0, 0);
    let mut bad = piece(1, &[0], &[6]);
    bad.writes.clear(); // an increment that claims to write nothing
    assert!(replies(&submit(&mut h, bad, Duration::from_millis(5))).is_empty());
    assert!(replies(&h.advance(Duration::from_millis(20))).is_empty(), "never released");
    assert_eq!(h.role.stats().rejected, 1);
    // The honest piece goes through, and a GET after SET in one piece reads its own write.
    let ops = vec![Op::new(tk(6), OpKind::Set(b"hello".to_vec())), Op::new(tk(6), OpKind::Get)];
    let good = Piece::new(TxnId::new(COORDINATOR, 2), 0, vec![0], ops);
    submit(&mut h, good, Duration::from_millis(5));
    let e = h.advance(Duration::from_millis(20));
    let outputs: Vec<Vec<OpOutput>> = sent(&e)
        .into_iter()
        .filter_map(|(_, m)| match m {
            TigaMsg::Reply(ServerReply { result: Some(r), .. }) => Some(r.outputs.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(outputs, vec![vec![OpOutput::Ok, OpOutput::Bulk(b"hello".to_vec())]]);
    assert_eq!(h.role.entry(&tk(6)).map(|e| e.version), Some(1));
}

/// The view-manager node of the view-change tests.
const VIEW_MANAGER: NodeId = NodeId(20);

fn server_with_view_manager(shard: ShardId, replica: u32) -> RoleHarness<Server> {
    let node = topology().shards[shard as usize][replica as usize];
    let s = Server::new(topology(), TigaConfig::default(), shard, replica).with_view_managers(vec![VIEW_MANAGER]);
    let mut h = RoleHarness::new(node, s, 1);
    h.start();
    h
}

fn view_of(h: &mut RoleHarness<Server>) -> (u64, ServerState) {
    h.call(|s, _| (s.view().0.number, s.view().1)).0
}

fn metric_names(effects: &[Effect<TigaMsg>]) -> Vec<&'static str> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Metric { name, .. } => Some(*name),
            _ => None,
        })
        .collect()
}

/// Replica 1 of shard 0 leads view 1; shard 1 keeps replica 0.
fn view_1() -> View {
    View { number: 1, leaders: vec![1, 0], preventive: false }
}

#[test]
fn views_from_strangers_that_do_not_fit_or_that_are_stale_change_nothing() {
    let mut h = server_with_view_manager(0, 2);
    // Neither a server nor a view-manager node.
    h.deliver(NodeId(99), TigaMsg::NewView { view: view_1() });
    assert_eq!(view_of(&mut h), (0, ServerState::Normal));
    // A leader that is not a replica of the shard, a missing shard, a view with no successor.
    for bogus in [
        View { number: 1, leaders: vec![7, 0], preventive: false },
        View { number: 1, leaders: vec![1], preventive: false },
        View { number: u64::MAX, leaders: vec![1, 0], preventive: false },
    ] {
        let e = h.deliver(VIEW_MANAGER, TigaMsg::NewView { view: bogus });
        assert!(metric_names(&e).contains(&"tiga.server_bad_view"));
        assert_eq!(view_of(&mut h), (0, ServerState::Normal));
    }
    // A CollectLog from a server the view does not name as this shard's leader.
    let e = h.deliver(NodeId(0), TigaMsg::CollectLog { view: view_1(), from: 0 });
    assert!(sent(&e).is_empty() && metric_names(&e).contains(&"tiga.server_bad_view"));
    assert_eq!(view_of(&mut h), (0, ServerState::Normal));
    // The real thing: the named leader collects, this replica stops serving and reports.
    let e = h.deliver(NodeId(1), TigaMsg::CollectLog { view: view_1(), from: 0 });
    assert!(sent(&e).iter().any(|(to, m)| *to == NodeId(1) && matches!(m, TigaMsg::LogState { view: 1, .. })));
    assert_eq!(view_of(&mut h), (1, ServerState::ViewChange));
    // Now a stale view changes nothing.
    let stale = View { number: 0, leaders: vec![0, 0], preventive: false };
    h.deliver(VIEW_MANAGER, TigaMsg::NewView { view: stale });
    assert_eq!(view_of(&mut h), (1, ServerState::ViewChange));
    // Submits of the new view wait until it starts; one from the old view learns the view.
    let e = submit(&mut h, piece(1, &[0], &[2]), Duration::from_millis(5));
    assert!(sent(&e)
        .iter()
        .any(|(to, m)| *to == COORDINATOR && matches!(m, TigaMsg::NewView { view } if view.number == 1)));
}

#[test]
fn a_log_report_that_contradicts_itself_or_comes_from_a_stranger_is_refused() {
    // Replica 1 of shard 0 becomes the leader of view 1 and collects from replicas 0 and 2.
    let mut h = server_with_view_manager(0, 1);
    let e = h.deliver(VIEW_MANAGER, TigaMsg::NewView { view: view_1() });
    let asked: Vec<NodeId> =
        sent(&e).into_iter().filter(|(_, m)| matches!(m, TigaMsg::CollectLog { .. })).map(|(to, _)| to).collect();
    assert_eq!(asked, vec![NodeId(0), NodeId(2)]);
    let report = |sync_point: u64, last_normal: u64| TigaMsg::LogState {
        view: 1,
        replica: 2,
        report: LogReport {
            voter: true,
            last_normal,
            sync_point,
            executed: 0,
            from: 0,
            entries: Vec::new(),
            released: Vec::new(),
            checkpoint: None,
        },
    };
    let listings = |e: &[Effect<TigaMsg>]| sent(e).iter().filter(|(_, m)| matches!(m, TigaMsg::Verify { .. })).count();
    // Claims 5 synchronized entries and sends none: refused, no merge.
    let e = h.deliver(NodeId(2), report(5, 0));
    assert!(metric_names(&e).contains(&"tiga.server_bad_log_state"));
    assert_eq!(listings(&e), 0);
    // Claims to have served in a view after this one: refused.
    let e = h.deliver(NodeId(2), report(0, 7));
    assert!(metric_names(&e).contains(&"tiga.server_bad_log_state"));
    // Shard 1's replica claiming to be replica 2 of shard 0: ignored.
    let e = h.deliver(NodeId(5), report(0, 0));
    assert_eq!(listings(&e), 0);
    // A consistent report makes f + 1 voters: the log is merged and listed to shard 1's leader.
    let e = h.deliver(NodeId(2), report(0, 0));
    assert!(sent(&e).iter().any(|(to, m)| *to == NodeId(3) && matches!(m, TigaMsg::Verify { view: 1, .. })), "{e:?}");
}

/// Regression (campaign seeds 1326, 3163): a report whose log starts beyond where the new
/// leader asked, with nothing bridging the gap, is not merged (its entries between would be
/// lost); the leader asks that replica again.
#[test]
fn a_log_report_from_beyond_what_the_leader_asked_is_asked_again() {
    let mut h = server_with_view_manager(0, 1);
    h.deliver(VIEW_MANAGER, TigaMsg::NewView { view: view_1() });
    let report = |from: u64, sync_point: u64| TigaMsg::LogState {
        view: 1,
        replica: 2,
        report: LogReport {
            voter: true,
            last_normal: 0,
            sync_point,
            executed: sync_point,
            from,
            entries: Vec::new(),
            released: Vec::new(),
            checkpoint: None,
        },
    };
    let e = h.deliver(NodeId(2), report(5, 5));
    assert!(
        sent(&e).iter().any(|(to, m)| *to == NodeId(2) && matches!(m, TigaMsg::CollectLog { from: 0, .. })),
        "{e:?}"
    );
    assert!(!sent(&e).iter().any(|(_, m)| matches!(m, TigaMsg::Verify { .. })), "not merged: {e:?}");
    let e = h.deliver(NodeId(2), report(0, 0));
    assert!(sent(&e).iter().any(|(_, m)| matches!(m, TigaMsg::Verify { .. })), "merged: {e:?}");
}

/// A follower of shard 0 that ran transactions 1..=10 (position p holds transaction p + 1,
/// [`numbered_entry`]), took a checkpoint at 10, served in view 1 (replica 1 leads) and
/// restarted from its journal. Returns it, and the time its entries are stamped from.
fn follower_restarted_from_its_checkpoint_at_10() -> (RoleHarness<Server>, Ts) {
    let config = TigaConfig { checkpoint_interval: 2, checkpoint_positions_per_key: 0, ..TigaConfig::default() };
    let follower = || Server::new(topology(), config.clone(), 0, 2).with_view_managers(vec![VIEW_MANAGER]);
    let mut h = RoleHarness::new(NodeId(2), follower(), 1);
    h.start();
    let now = ns(h.now());
    let entries = (1..=10).map(|i| numbered_entry(now, i)).collect();
    h.deliver(NodeId(0), TigaMsg::LogSync { view: 0, from: 0, entries, commit_point: 10 });
    assert_eq!(h.role.checkpoint().map(|c| c.position), Some(10), "a checkpoint covers the ten entries");
    // A view change to replica 1 (node 1): the follower journals its state, checkpoint included.
    h.deliver(VIEW_MANAGER, TigaMsg::NewView { view: view_1() });
    h.deliver(NodeId(1), TigaMsg::StartView { view: 1, from: 10, entries: Vec::new(), commit_point: 10 });
    assert_eq!(view_of(&mut h), (1, ServerState::Normal));
    h.restart(follower());
    assert_eq!(h.role.checkpoint().map(|c| c.position), Some(10), "the checkpoint came back from the journal");
    (h, now)
}

/// Transaction `i` (it increments key 2i), stamped `now` + i ns.
fn numbered_entry(now: Ts, i: u32) -> LogEntry {
    LogEntry { ts: now + Duration::from_nanos(u64::from(i)), piece: piece(i, &[0], &[2 * u64::from(i)]).into() }
}

/// A follower restarted from its journaled checkpoint still knows the transactions the
/// checkpoint covers (as one sent the leader's checkpoint does): a coordinator's resend of one
/// is answered from the log, not run again.
#[test]
fn a_follower_restarted_from_its_journaled_checkpoint_answers_a_resend_instead_of_running_it() {
    let (mut h, now) = follower_restarted_from_its_checkpoint_at_10();
    h.deliver(NodeId(1), TigaMsg::StartView { view: 1, from: 10, entries: Vec::new(), commit_point: 10 });
    assert_eq!(view_of(&mut h), (1, ServerState::Normal));
    // The coordinator resends transaction 1 in view 1.
    let (piece, ts, send_time) = (piece(1, &[0], &[2]), ns(h.now()) + Duration::from_millis(5), h.now());
    let resend = h.deliver(
        COORDINATOR,
        TigaMsg::Submit(Submit { view: 1, piece: piece.into(), ts, send_time, first_send_time: send_time }),
    );
    assert_eq!(
        replies(&resend),
        vec![(1, ReplyKind::Slow, now + Duration::from_nanos(1), None)],
        "answered at its logged timestamp"
    );
    assert_eq!(h.role.executed(), 10, "nothing ran again");
}

/// A StartView from below a follower's checkpoint (the leader computed it from a report the
/// follower gave before it restarted) is answered with where the follower is. Truncating at it
/// dropped only what the follower held above its checkpoint and put the leader's entries at the
/// wrong positions: position 268's transaction ran at 300 (`kairos sim tiga` seed 5398).
#[test]
fn a_follower_restarted_from_its_checkpoint_refuses_a_start_view_from_below_it() {
    let (mut h, now) = follower_restarted_from_its_checkpoint_at_10();
    let entry = |i: u32| numbered_entry(now, i);
    assert_eq!((h.role.log().base(), h.role.log().len()), (10, 10), "back from its checkpoint at 10");

    let stale = TigaMsg::StartView { view: 1, from: 4, entries: (5..=12).map(entry).collect(), commit_point: 12 };
    let e = h.deliver(NodeId(1), stale);
    assert!(
        sent(&e).iter().any(|(to, m)| *to == NodeId(1) && matches!(m, TigaMsg::LogState { .. })),
        "it says where it is"
    );
    assert_eq!((h.role.log().len(), h.role.executed()), (10, 10), "nothing taken at the wrong positions");

    // From where it is, it takes the leader's entries.
    h.deliver(
        NodeId(1),
        TigaMsg::StartView { view: 1, from: 10, entries: (11..=12).map(entry).collect(), commit_point: 12 },
    );
    assert_eq!((h.role.log().len(), h.role.executed()), (12, 12));
    assert_eq!(view_of(&mut h), (1, ServerState::Normal));
    // Each transaction ran once: transaction i increments key 2i.
    let version = |h: &RoleHarness<Server>, k: u64| h.role.entry(&tk(k)).map(|e| e.version);
    assert_eq!([10, 22, 24].map(|k| version(&h, k)), [Some(1); 3]);
}

/// A checkpoint carries the recent transactions one segment per interval, and the next
/// checkpoint shares the older segments instead of rebuilding them: taking one costs an
/// interval's worth of work, not the whole at-most-once window's (a rebuild took 24 ms at
/// 47,000 recent transactions in the 10,000 txn/s kill run). The segments cover every position
/// below the checkpoint, each with its executions' results.
#[test]
fn consecutive_checkpoints_share_their_segments_of_recent_transactions() {
    let config = TigaConfig { checkpoint_interval: 2, checkpoint_positions_per_key: 0, ..TigaConfig::default() };
    let mut h = RoleHarness::new(NodeId(2), Server::new(topology(), config, 0, 2), 1);
    h.start();
    let now = ns(h.now());
    let entry = |i: u32| LogEntry {
        ts: now + Duration::from_nanos(u64::from(i)),
        piece: piece(i, &[0], &[2 * u64::from(i)]).into(),
    };
    h.deliver(NodeId(0), TigaMsg::LogSync { view: 0, from: 0, entries: (1..=8).map(entry).collect(), commit_point: 8 });
    let at_8 = h.role.checkpoint().cloned().expect("a checkpoint at 8");
    h.deliver(
        NodeId(0),
        TigaMsg::LogSync { view: 0, from: 8, entries: (9..=10).map(entry).collect(), commit_point: 10 },
    );
    let at_10 = h.role.checkpoint().cloned().expect("a checkpoint at 10");
    assert_eq!((at_8.position, at_10.position), (8, 10));
    assert_eq!((at_8.recent.len(), at_10.recent.len()), (4, 5), "one segment per interval");
    for (old, new) in at_8.recent.iter().zip(&at_10.recent) {
        assert!(std::sync::Arc::ptr_eq(old, new), "segment from {} rebuilt", old.from);
    }
    let mut next = 0;
    for s in &at_10.recent {
        assert_eq!(s.from, next, "contiguous");
        assert_eq!((s.entries.len(), s.results.len()), (2, 2));
        next += 2;
    }
    assert_eq!(next, 10);
    let txns: Vec<u64> = at_10.recent.iter().flat_map(|s| &s.entries).map(|t| t.txn.0).collect();
    assert_eq!(txns, (1..=10).map(|i| piece(i, &[0], &[0]).txn.0).collect::<Vec<_>>());
}

/// A checkpoint goes to disk a few pages per executed position, not all in the event that takes
/// it, and the log below it stays in the journal until its last page and manifest are written.
/// A replica restarted in between comes back from the previous checkpoint on disk (here: none)
/// and its journaled log; one restarted after comes back from the new checkpoint.
#[test]
fn a_checkpoint_is_written_to_disk_a_few_pages_at_a_time_and_the_log_stays_until_it_is_whole() {
    let config = TigaConfig { checkpoint_interval: 40, checkpoint_positions_per_key: 0, ..TigaConfig::default() };
    let follower = || Server::new(topology(), config.clone(), 0, 2);
    let mut h = RoleHarness::new(NodeId(2), follower(), 1);
    h.start();
    let now = ns(h.now());
    let entry = |i: u32| LogEntry {
        ts: now + Duration::from_nanos(u64::from(i)),
        piece: piece(i, &[0], &[2 * u64::from(i)]).into(),
    };
    let sync = |from: u32, to: u32| TigaMsg::LogSync {
        view: 0,
        from: u64::from(from - 1),
        entries: (from..=to).map(entry).collect(),
        commit_point: u64::from(to),
    };
    let e = h.deliver(NodeId(0), sync(1, 40));
    let pages = |e: &[Effect<TigaMsg>]| {
        e.iter().filter(|e| matches!(e, Effect::Persist(kairos_core::Persist::Page { .. }))).count()
    };
    assert_eq!(h.role.checkpoint().map(|c| c.position), Some(40));
    // State, key maps and one segment of recent transactions: three pages, paced over a
    // quarter of the interval (one every third executed position here), then the manifest.
    assert_eq!(pages(&e), 1, "only the first page in the event that took the checkpoint");
    assert_eq!(h.role.log().base(), 0, "the log stays until the checkpoint is on disk");
    let mut in_between = RoleHarness::new(NodeId(2), follower(), 1);
    for (page, bytes) in &h.stored().pages {
        in_between.call(|_, ctx| ctx.persist_page(*page, bytes.clone()));
    }
    for r in &h.stored().records {
        in_between.call(|_, ctx| ctx.persist(r.clone()));
    }
    in_between.restart(follower());
    assert_eq!(in_between.role.checkpoint(), None, "no whole checkpoint on disk yet");
    assert_eq!((in_between.role.log().base(), in_between.role.log().len()), (0, 40), "the journaled log");
    let e = h.deliver(NodeId(0), sync(41, 45));
    assert_eq!(pages(&e), 1, "the second page, at position 43");
    assert_eq!(h.role.log().base(), 0);
    let e = h.deliver(NodeId(0), sync(46, 46));
    assert_eq!(pages(&e), 2, "the last page and the manifest");
    assert_eq!(h.role.log().base(), 40, "the log below the checkpoint on disk goes");
    let before = h.role.checkpoint().cloned();
    h.restart(follower());
    assert_eq!(h.role.checkpoint().map(|c| c.position), Some(40), "back from its pages");
    assert_eq!(h.role.checkpoint(), before.as_ref(), "state, key maps and recent transactions alike");
    assert_eq!((h.role.log().base(), h.role.log().len()), (40, 46));
    assert_eq!(h.role.stats().journal_unreadable, 0);
}

/// The nonce of the view-floor probe a server that lost its disk sends on its next heartbeats.
fn floor_probe_nonce(h: &mut RoleHarness<Server>) -> u64 {
    let e = h.advance(TigaConfig::default().heartbeat_interval * 2);
    sent(&e)
        .iter()
        .find_map(|(to, m)| match m {
            TigaMsg::ViewProbe { nonce } if *to == VIEW_MANAGER => Some(*nonce),
            _ => None,
        })
        .expect("it asks the view manager for the floor")
}

/// A replica restarted with nothing on disk (`on_amnesia`) reports itself as no voter in the
/// view changes that follow, across a further restart, until it has served in a view later
/// than the floor the view managers gave it: the fast replies and sync-points it acknowledged
/// before went with its disk, so counting it among the f + 1 could drop a committed
/// transaction.
#[test]
fn a_replica_that_lost_its_disk_does_not_vote_until_it_serves_in_a_newer_view() {
    let follower = || Server::new(topology(), TigaConfig::default(), 0, 2).with_view_managers(vec![VIEW_MANAGER]);
    let mut h = server_with_view_manager(0, 2);
    assert!(h.stored().is_empty());
    h.restart(follower());
    assert!(h.role.stats().disk_lost);
    let view = |number: u64, leader: u32| View { number, leaders: vec![leader, 0], preventive: false };
    let leader_node = |leader: u32| NodeId(leader);
    // The report it sends the new leader of `view`, then the view started with an empty log.
    let vote_in = |h: &mut RoleHarness<Server>, number: u64, leader: u32| {
        let e = h.deliver(leader_node(leader), TigaMsg::CollectLog { view: view(number, leader), from: 0 });
        let voter = sent(&e)
            .iter()
            .find_map(|(_, m)| match m {
                TigaMsg::LogState { report, .. } => Some(report.voter),
                _ => None,
            })
            .expect("a report");
        let start = TigaMsg::StartView { view: number, from: 0, entries: Vec::new(), commit_point: 0 };
        h.deliver(leader_node(leader), start);
        assert_eq!(view_of(h), (number, ServerState::Normal));
        voter
    };
    assert!(!vote_in(&mut h, 1, 1), "view 1 is the first it heard of: it may have served in it");
    h.restart(follower());
    assert!(!h.role.stats().disk_lost, "restarted from its journal this time");
    assert!(!vote_in(&mut h, 2, 0), "still no vote after a restart with its journal");
    assert!(!vote_in(&mut h, 3, 1), "amnesia outlasts the restart: the floor is not known yet");
    let nonce = floor_probe_nonce(&mut h);
    h.deliver(VIEW_MANAGER, TigaMsg::ViewFloor { nonce, view: 3 });
    assert!(!vote_in(&mut h, 4, 0), "it served in view 3, the floor");
    assert!(vote_in(&mut h, 5, 1), "it served in view 4, past the floor");
}

/// A server that lost its disk asks the view managers for the highest view they hold (with a
/// fresh nonce) and votes again only after serving in a view past it. Replayed messages of old
/// views do not give it back its vote: the earlier rule (past the first view heard of after
/// the restart) did, here after serving in view 2.
#[test]
fn a_server_that_lost_its_disk_votes_again_only_past_the_view_managers_floor() {
    let follower = || Server::new(topology(), TigaConfig::default(), 0, 2).with_view_managers(vec![VIEW_MANAGER]);
    let mut h = RoleHarness::new(NodeId(2), follower(), 1);
    h.restart(follower()); // nothing on disk
    let nonce = floor_probe_nonce(&mut h);
    let view = |number: u64, leader: u32| View { number, leaders: vec![leader, 0], preventive: false };
    let serve_in = |h: &mut RoleHarness<Server>, number: u64, leader: u32| {
        h.deliver(VIEW_MANAGER, TigaMsg::NewView { view: view(number, leader) });
        let start = TigaMsg::StartView { view: number, from: 0, entries: Vec::new(), commit_point: 0 };
        h.deliver(NodeId(leader), start);
        assert_eq!(view_of(h), (number, ServerState::Normal));
    };
    // Does it vote? Its report to the leader of the next view says.
    let votes = |h: &mut RoleHarness<Server>, number: u64| {
        let e = h.deliver(NodeId(1), TigaMsg::CollectLog { view: view(number, 1), from: 0 });
        sent(&e)
            .iter()
            .find_map(|(_, m)| match m {
                TigaMsg::LogState { report, .. } => Some(report.voter),
                _ => None,
            })
            .expect("a log report")
    };
    // Replayed messages of views 1 and 2 (the cluster has reached view 5).
    h.deliver(VIEW_MANAGER, TigaMsg::NewView { view: view(1, 1) });
    serve_in(&mut h, 2, 0);
    assert!(!votes(&mut h, 3), "served past the first view it heard of, but the floor is unknown");
    // A replayed answer to another probe does not count; the real one gives floor 5.
    h.deliver(VIEW_MANAGER, TigaMsg::ViewFloor { nonce: nonce.wrapping_add(1), view: 0 });
    let e = h.deliver(VIEW_MANAGER, TigaMsg::ViewFloor { nonce, view: 5 });
    assert!(metric_names(&e).contains(&"tiga.vc_amnesiac_floor_known"));
    serve_in(&mut h, 5, 0);
    assert!(!votes(&mut h, 6), "view 5 is the floor, not past it");
    serve_in(&mut h, 7, 0);
    assert!(votes(&mut h, 8), "served in view 7, past the floor");
}

/// In a view change, a shard fetches a multi-shard transaction that another shard reports
/// settled and it lacks, unless the transaction is older than what it remembers of its
/// executed ones (the coordinators' resend horizon): it may have run that one and forgotten
/// it, and would run it twice (`tiga.vc_fetch_forgotten`).
#[test]
fn a_view_change_fetches_a_recent_settled_transaction_but_not_one_older_than_it_remembers() {
    use kairos_tiga::msg::{TxnState, VerifyItem, VerifyKind};
    use std::sync::Arc;
    let mut h = server_with_view_manager(0, 1);
    h.advance(Duration::from_secs(20));
    h.deliver(VIEW_MANAGER, TigaMsg::NewView { view: view_1() });
    let report = LogReport {
        voter: true,
        last_normal: 0,
        sync_point: 0,
        executed: 0,
        from: 0,
        entries: Vec::new(),
        released: Vec::new(),
        checkpoint: None,
    };
    h.deliver(NodeId(2), TigaMsg::LogState { view: 1, replica: 2, report });
    // Shard 1's new leader lists two transactions over both shards that it has settled: one
    // 10 s old (past the 6 s horizon), one 1 s old.
    let now = ns(h.now());
    let settled = |seq: u32, age: Duration| {
        let ops: Vec<Op> = [2u64, 3].iter().map(|k| Op::new(tk(*k), OpKind::IncrBy(1))).collect();
        let txn = TxnId::new(COORDINATOR, seq);
        let piece = Piece::new(txn, 1, vec![0, 1], vec![ops[1].clone()]).with_txn_ops(ops);
        VerifyItem {
            txn,
            shards: vec![0, 1],
            state: TxnState::Settled { ts: now.saturating_sub(age), view: 0 },
            piece: Some(Arc::new(piece)),
        }
    };
    let (old, recent) = (settled(1, Duration::from_secs(10)), settled(2, Duration::from_secs(1)));
    let (old_txn, recent_txn) = (old.txn, recent.txn);
    let listing = TigaMsg::Verify { view: 1, shard: 1, kind: VerifyKind::Listing, items: vec![old, recent] };
    let e = h.deliver(NodeId(3), listing);
    assert!(metric_names(&e).contains(&"tiga.vc_fetch_forgotten"), "{e:?}");
    let started: Vec<TxnId> = sent(&e)
        .iter()
        .filter_map(|(_, m)| match m {
            TigaMsg::StartView { entries, .. } => Some(entries.iter().map(|e| e.piece.txn).collect::<Vec<_>>()),
            _ => None,
        })
        .next()
        .expect("the view starts");
    assert!(started.contains(&recent_txn), "the recent one is fetched: {started:?}");
    assert!(!started.contains(&old_txn), "the old one is not: {started:?}");
}
