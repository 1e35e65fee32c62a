//! Schedules from a review outside the suite (2026-12-07), one member driven message by
//! message: each failed before its fix.
//! - A primary whose earlier Keys entry was rolled back still counted those keys as live and
//!   never wrote new ones: no reply carried `$clusterTime` or `operationTime` until they
//!   expired (90 days).
//! - Copies of a majority write that already ran each parked one more waiter, past
//!   `max_waiters` (a replaying network grew the queue without bound).
//!
//! And from a review of the MongoDB command path:
//! - An upsert whose filter named an existing `_id` but did not match it replaced the document
//!   (MongoDB answers E11000: the insert meets the `_id` index).
//! - On a one-member set, a `w: "majority"` write was answered only by the next write or the
//!   idle no-op 10 s later.
//! - A retryable write split over two oplog entries, whose primary failed between them, ran
//!   again in full on the next primary when the driver retried it (two documents incremented
//!   twice, and a reply indistinguishable from a first run).
//! - `findAndModify`, part of the driver surface, was missing (59 CommandNotFound).
//!
//! And from a third review (2026-12-07, later):
//! - A copy of a majority write that reached its old primary after it stepped down was parked
//!   there as a waiter; the entry was rolled back, and once the member was primary again and
//!   the commit point passed the old optime, the copy was answered `Written`.
//! - Any client could `getMore` another session's cursor (ids were sequential).
//! - Retry records were kept by count: after 100,000 other sessions' writes, a retry ran again.
//! - Each cursor held a copy of its whole result, a thousand cursors per member with no byte
//!   limit: one client could pin a thousand collections' worth of memory.
//!
//! And from a fourth review (2026-12-08):
//! - Retry records expired by cluster time, which a client allowed to advance it may move a
//!   year ahead: after one such gossip, the next retryable write dropped every session's
//!   record, and an in-flight write ran twice when its driver retried it. (The review of its
//!   fix: a primary whose clock was 40 minutes behind an earlier one's dropped its own records.)
//! - A majority cursor's `getMore` reported the last applied time as `operationTime`, not
//!   the commit point it read at (not a violation: the session's next read waited longer).

use bson::{doc, Document};
use kairos_causal::msg::{
    codes, ClientOp, Entry, MongoRequest, Op, OpPos, PeerBody, PeerMsg, ReadConcern, Reply, ReplyBody, Request,
    WriteConcern,
};
use kairos_causal::{CausalMsg, Member, MemberConfig};
use kairos_clock::ClusterTime;
use kairos_core::harness::{sent, RoleHarness};
use kairos_core::{Effect, NodeId};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

fn config(max_waiters: Option<usize>) -> Arc<MemberConfig> {
    let mut c = MemberConfig::new((0..3).map(NodeId).collect());
    if let Some(m) = max_waiters {
        c.max_waiters = m;
    }
    Arc::new(c)
}

fn peer(term: u64, body: PeerBody, seq: u64) -> CausalMsg {
    CausalMsg::Peer(PeerMsg { term, cluster_time: None, body, seq })
}

/// The term of the vote request (a dry run, or a real one) among `effects`.
fn vote_term(effects: &[Effect<CausalMsg>], dry: bool) -> Option<u64> {
    sent(effects).into_iter().find_map(|(_, m)| match m {
        CausalMsg::Peer(PeerMsg { term, body: PeerBody::RequestVote { dry_run, .. }, .. }) if *dry_run == dry => {
            Some(*term)
        }
        _ => None,
    })
}

/// Lets the election timeout pass, then grants the dry run and the real vote from `voter`:
/// the member becomes primary. Returns its first messages as primary.
fn elect(h: &mut RoleHarness<Member>, voter: u32, seq: &mut u64) -> Vec<Effect<CausalMsg>> {
    let timeout = config(None).election_timeout;
    let dry = vote_term(&h.advance(timeout * 2 + Duration::from_millis(10)), true).expect("a dry run");
    *seq += 1;
    let granted = peer(dry, PeerBody::VoteReply { granted: true, dry_run: true }, *seq);
    let real = vote_term(&h.deliver(NodeId(voter), granted), false).expect("it stands");
    *seq += 1;
    let e = h.deliver(NodeId(voter), peer(real, PeerBody::VoteReply { granted: true, dry_run: false }, *seq));
    assert!(h.role().is_primary());
    e
}

fn replies(effects: &[Effect<CausalMsg>]) -> Vec<Reply> {
    sent(effects)
        .into_iter()
        .filter_map(|(_, m)| match m {
            CausalMsg::Reply(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

fn request(id: u64, op: ClientOp, write_concern: WriteConcern, term: Option<u64>) -> CausalMsg {
    CausalMsg::Request(Request {
        id,
        op,
        read_concern: ReadConcern::Local,
        write_concern,
        after_cluster_time: None,
        cluster_time: None,
        max_time_ms: 60_000,
        secondary_ok: false,
        term,
    })
}

/// Member 1, primary of term 2, whose oplog shares nothing with the member's after `after`,
/// tells it to roll back to the start.
fn roll_back_everything(h: &mut RoleHarness<Member>, after: OpPos, seq: &mut u64) {
    *seq += 1;
    let rb = PeerBody::Batch {
        after,
        entries: vec![],
        commit_point: ClusterTime::ZERO,
        rollback_to: Some(ClusterTime::ZERO),
    };
    h.deliver(NodeId(1), peer(2, rb, *seq));
}

fn has_keys_entry(m: &Member) -> bool {
    m.oplog().iter().any(|e| matches!(e.op, Op::Keys(_)))
}

#[test]
fn a_primary_whose_earlier_keys_entry_was_rolled_back_writes_new_keys() {
    let mut h = RoleHarness::new(NodeId(0), Member::new(config(None), 0), 21);
    h.start();
    let mut seq = 1_000;

    // 1. Member 0 is elected in term 1 with member 1's vote: it writes a no-op and a Keys
    //    entry. Neither reaches anybody.
    elect(&mut h, 1, &mut seq);
    assert_eq!(h.role().term(), 1);
    assert!(has_keys_entry(h.role()), "a new primary writes keys");
    let last = h.role().oplog().last().map(|e| OpPos { optime: e.optime, term: e.term }).unwrap();

    // 2. Member 1 was elected in term 2; its heartbeat makes member 0 step down and follow.
    seq += 1;
    h.deliver(NodeId(1), peer(2, PeerBody::Heartbeat { commit_point: ClusterTime::ZERO }, seq));
    assert!(!h.role().is_primary());

    // 3. Member 1's oplog has none of member 0's term-1 entries: roll back to the start.
    roll_back_everything(&mut h, last, &mut seq);
    assert!(h.role().oplog().is_empty() && !has_keys_entry(h.role()), "rolled back");

    // 4. Member 1 crashes before its entries reach anybody; members 0 and 2 (empty oplogs)
    //    elect member 0 in term 3, and member 2 replicates all it has.
    elect(&mut h, 2, &mut seq);
    assert_eq!(h.role().term(), 3);
    for _ in 0..3 {
        let last = h.role().oplog().last().map(|e| OpPos { optime: e.optime, term: e.term }).unwrap();
        seq += 1;
        h.deliver(NodeId(2), peer(3, PeerBody::Pull { last }, seq));
        seq += 1;
        h.deliver(NodeId(2), peer(3, PeerBody::HeartbeatAck { applied: last }, seq));
        h.advance(Duration::from_millis(300));
    }
    assert_eq!(h.role().commit_point(), h.role().oplog().last().unwrap().optime);

    // The set's oplog held no key: the new primary writes keys, and once they commit its
    // replies to an untrusted client carry a signed cluster time.
    let r = replies(&h.deliver(NodeId(9), request(1, ClientOp::Read { key: 1 }, WriteConcern::W1, None)));
    assert_eq!(r.len(), 1);
    assert!(has_keys_entry(h.role()), "no Keys entry (keys generated: {})", h.role().stats().keys_generated);
    assert!(r[0].cluster_time.is_some() && r[0].operation_time.is_some(), "unsigned reply: {:?}", r[0]);
}

#[test]
fn copies_of_a_majority_write_cannot_grow_the_waiters_past_max_waiters() {
    const MAX_WAITERS: usize = 4;
    let mut h = RoleHarness::new(NodeId(0), Member::new(config(Some(MAX_WAITERS)), 0), 31);
    h.start();
    let mut seq = 0;
    elect(&mut h, 1, &mut seq);
    assert_eq!(h.role().term(), 1);

    // The primary is cut off from both secondaries: nothing commits. One majority write, then
    // 1,000 copies of it (a replaying network, or a client).
    let client = NodeId(9);
    let write = || request(1, ClientOp::Append { key: 1, value: 1 }, WriteConcern::Majority, Some(1));
    assert!(replies(&h.deliver(client, write())).is_empty(), "waits for majority");
    for _ in 0..1_000 {
        assert!(replies(&h.deliver(client, write())).is_empty(), "a copy waits with the original");
    }
    // The primary steps down after the election timeout and answers every waiting write.
    let timeout = config(None).election_timeout;
    let answered = replies(&h.advance(timeout * 2));
    assert!(!h.role().is_primary());
    let interrupted = answered
        .iter()
        .filter(|r| r.result.as_ref().is_err_and(|e| e.code == codes::INTERRUPTED_DUE_TO_REPL_STATE_CHANGE))
        .count();
    assert_eq!(interrupted, 1, "one waiter for the request and its copies");
}

const CLIENT: NodeId = NodeId(9);

fn mongo(id: u64, cmd: &Document) -> CausalMsg {
    CausalMsg::MongoRequest(MongoRequest { id, command: bson::to_vec(cmd).unwrap() })
}

fn mongo_replies(effects: &[Effect<CausalMsg>]) -> Vec<Document> {
    sent(effects)
        .into_iter()
        .filter_map(|(_, m)| match m {
            CausalMsg::MongoReply(r) => Some(Document::from_reader(&mut r.reply.as_slice()).unwrap()),
            _ => None,
        })
        .collect()
}

/// A one-member replica set (`mongod --replSet` as developers run it), primary.
fn one_member_primary() -> RoleHarness<Member> {
    one_member_primary_with(|_| {})
}

/// As [`one_member_primary`], its configuration changed by `tweak` first.
fn one_member_primary_with(tweak: impl FnOnce(&mut MemberConfig)) -> RoleHarness<Member> {
    let mut config = MemberConfig::new(vec![NodeId(0)]);
    tweak(&mut config);
    let config = Arc::new(config);
    let timeout = config.election_timeout;
    let mut h = RoleHarness::new(NodeId(0), Member::new(config, 0), 3);
    h.start();
    h.advance(timeout * 2 + Duration::from_millis(10));
    assert!(h.role().is_primary(), "a one-member set elects itself");
    h
}

fn find_all(h: &mut RoleHarness<Member>, id: u64) -> Vec<Document> {
    let r = mongo_replies(&h.deliver(CLIENT, mongo(id, &doc! { "find": "c", "$db": "test" })));
    assert_eq!(r.len(), 1, "{r:?}");
    let batch = r[0].get_document("cursor").unwrap().get_array("firstBatch").unwrap();
    batch.iter().map(|b| b.as_document().unwrap().clone()).collect()
}

#[test]
fn an_upsert_on_an_existing_id_that_does_not_match_is_a_duplicate_key_error() {
    let mut h = one_member_primary();
    let ins = doc! { "insert": "c", "$db": "test", "writeConcern": { "w": 1 },
    "documents": [ { "_id": 1, "version": 1, "keep": "me" } ] };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(1, &ins)));
    assert_eq!(r.first().map(|r| r.get_i32("n")), Some(Ok(1)), "{r:?}");
    // A writer that read version 0 (stale) tries to install version 1 with an upsert.
    let up = doc! { "update": "c", "$db": "test", "writeConcern": { "w": 1 }, "updates": [
    { "q": { "_id": 1, "version": 0 }, "u": { "$set": { "version": 1, "by": "loser" } }, "upsert": true } ] };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(2, &up)));
    assert_eq!(r.len(), 1);
    let code = r[0]
        .get_array("writeErrors")
        .ok()
        .and_then(|e| e.first())
        .and_then(|e| e.as_document())
        .and_then(|e| e.get_i32("code").ok());
    assert_eq!(code, Some(11000), "E11000 duplicate key, as MongoDB: {:?}", r[0]);
    assert_eq!(find_all(&mut h, 3), vec![doc! { "_id": 1, "version": 1, "keep": "me" }], "untouched");
}

#[test]
fn a_majority_write_on_a_one_member_set_is_answered_at_once() {
    let mut h = one_member_primary();
    let ins = doc! { "insert": "c", "$db": "test", "documents": [ { "_id": 1 } ] };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(1, &ins)));
    assert_eq!(h.role().commit_point(), h.role().last_applied(), "the write is committed");
    assert_eq!(r.len(), 1, "answered in the handler that committed it");
    assert_eq!(r[0].get_i32("n"), Ok(1));
}

/// Relays messages between members 0 and 1 until none is left (those to member 2 are lost);
/// returns the client's replies. `pass` decides whether a message from 0 to 1 arrives.
fn relay(
    h0: &mut RoleHarness<Member>,
    h1: &mut RoleHarness<Member>,
    first: Vec<Effect<CausalMsg>>,
    pass: &dyn Fn(&CausalMsg) -> bool,
) -> Vec<Document> {
    let mut queue: VecDeque<(u32, NodeId, CausalMsg)> =
        sent(&first).into_iter().map(|(to, m)| (0, to, m.clone())).collect();
    let mut client = Vec::new();
    let mut steps = 0;
    while let Some((from, to, m)) = queue.pop_front() {
        steps += 1;
        assert!(steps < 10_000, "relay does not quiesce");
        if to == CLIENT {
            client.extend(mongo_replies(&[kairos_core::Effect::Send { to, msg: m }]));
            continue;
        }
        let effects = match (from, to) {
            (0, NodeId(1)) if pass(&m) => h1.deliver(NodeId(0), m),
            (1, NodeId(0)) => h0.deliver(NodeId(1), m),
            _ => continue,
        };
        let me = if to == NodeId(0) { 0 } else { 1 };
        queue.extend(sent(&effects).into_iter().map(|(to, m)| (me, to, m.clone())));
    }
    client
}

#[test]
fn a_retryable_write_split_over_two_entries_is_never_run_twice_after_failover() {
    let mut seq = 10_000;
    let mut h0 = RoleHarness::new(NodeId(0), Member::new(config(None), 0), 1);
    let mut h1 = RoleHarness::new(NodeId(1), Member::new(config(None), 1), 2);
    h0.start();
    h1.start();
    let e = elect(&mut h0, 1, &mut seq);
    relay(&mut h0, &mut h1, e, &|_| true);
    let e = h0.advance(Duration::from_millis(300));
    relay(&mut h0, &mut h1, e, &|_| true);
    // Three documents of about 1.2 MiB: two fit one 3 MiB entry, three do not.
    for i in 0..3 {
        let big = doc! { "_id": i, "n": 0, "pad": "x".repeat(1_200_000) };
        let e = h0.deliver(CLIENT, mongo(100 + i as u64, &doc! { "insert": "c", "$db": "test", "documents": [big] }));
        let r = relay(&mut h0, &mut h1, e, &|_| true);
        assert_eq!(r.first().map(|r| r.get_f64("ok")), Some(Ok(1.0)), "{r:?}");
    }
    // A retryable update of all three (lsid + txnNumber): two oplog entries.
    let lsid = doc! { "id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] } };
    let update = doc! {
        "update": "c", "$db": "test", "ordered": true, "lsid": lsid, "txnNumber": 1i64,
        "writeConcern": { "w": "majority" },
        "updates": [
            { "q": { "_id": 0 }, "u": { "$inc": { "n": 1 } } },
            { "q": { "_id": 1 }, "u": { "$inc": { "n": 1 } } },
            { "q": { "_id": 2 }, "u": { "$inc": { "n": 1 } } },
        ],
    };
    let e = h0.deliver(CLIENT, mongo(200, &update));
    let entries = h0.role().oplog().iter().filter(|e| matches!(e.op, Op::Docs { .. })).count();
    assert_eq!(entries, 3 + 2, "the update is two oplog entries");
    // Member 0 crashes before the batch with the last entry leaves it: member 1 has the first.
    let last_entry = |m: &CausalMsg| match m {
        CausalMsg::Peer(PeerMsg { body: PeerBody::Batch { entries, .. }, .. }) => {
            entries.iter().any(|e| matches!(&e.op, Op::Docs { retry: Some(r), .. } if r.complete))
        }
        _ => false,
    };
    assert!(relay(&mut h0, &mut h1, e, &|m| !last_entry(m)).is_empty(), "no reply reached the client");
    // Member 1 is elected in term 2 with member 2's vote; member 2 pulls everything.
    elect(&mut h1, 2, &mut seq);
    let last = h1.role().oplog().last().map(|e| OpPos { optime: e.optime, term: e.term }).unwrap();
    seq += 1;
    h1.deliver(NodeId(2), peer(2, PeerBody::Pull { last }, seq));
    // The driver retries on the new primary (same lsid and txnNumber): refused, not run again.
    let r = mongo_replies(&h1.deliver(CLIENT, mongo(201, &update)));
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].get_i32("code"), Ok(217), "IncompleteTransactionHistory: {:?}", r[0]);
    let find = doc! { "find": "c", "$db": "test", "projection": { "pad": 0 } };
    let r = mongo_replies(&h1.deliver(CLIENT, mongo(300, &find)));
    let batch = r[0].get_document("cursor").unwrap().get_array("firstBatch").unwrap();
    let n: Vec<i32> = batch.iter().map(|d| d.as_document().unwrap().get_i32("n").unwrap()).collect();
    assert_eq!(n, vec![1, 1, 0], "each statement ran at most once (the first entry's two)");
}

/// `findAndModify` (part of the driver surface causal.md names; it answered 59 before):
/// update returning the old or the new version, upsert, remove, and a retry that gets the
/// first answer without running again.
#[test]
fn find_and_modify_updates_upserts_and_removes_one_document_at_most_once() {
    let mut h = one_member_primary();
    let ins = doc! { "insert": "c", "$db": "test", "documents": [ { "_id": 1, "n": 0 }, { "_id": 2, "n": 0 } ] };
    assert_eq!(mongo_replies(&h.deliver(CLIENT, mongo(1, &ins)))[0].get_i32("n"), Ok(2));
    let lsid = doc! { "id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![3; 16] } };
    let inc = doc! { "findAndModify": "c", "$db": "test", "query": { "_id": 1 }, "update": { "$inc": { "n": 1 } },
    "new": true, "lsid": lsid.clone(), "txnNumber": 1i64 };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(2, &inc)));
    assert_eq!(r[0].get_document("value"), Ok(&doc! { "_id": 1, "n": 1 }), "{:?}", r[0]);
    assert_eq!(r[0].get_document("lastErrorObject"), Ok(&doc! { "n": 1, "updatedExisting": true }));
    let again = mongo_replies(&h.deliver(CLIENT, mongo(3, &inc)));
    assert_eq!(again[0].get_document("value"), Ok(&doc! { "_id": 1, "n": 1 }), "a retry: the first answer");
    let old = doc! { "findAndModify": "c", "$db": "test", "query": { "_id": 2 }, "update": { "$set": { "n": 5 } } };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(4, &old)));
    assert_eq!(r[0].get_document("value"), Ok(&doc! { "_id": 2, "n": 0 }), "the old version by default");
    let up = doc! { "findAndModify": "c", "$db": "test", "query": { "_id": 3 }, "update": { "$set": { "n": 7 } },
    "upsert": true, "new": true, "fields": { "n": 1, "_id": 0 } };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(5, &up)));
    assert_eq!(r[0].get_document("value"), Ok(&doc! { "n": 7 }), "{:?}", r[0]);
    assert_eq!(r[0].get_document("lastErrorObject").unwrap().get_i32("upserted"), Ok(3));
    let rm = doc! { "findAndModify": "c", "$db": "test", "query": { "n": 5 }, "remove": true };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(6, &rm)));
    assert_eq!(r[0].get_document("value"), Ok(&doc! { "_id": 2, "n": 5 }));
    let none = mongo_replies(&h.deliver(CLIENT, mongo(7, &rm)));
    assert_eq!(none[0].get("value"), Some(&bson::Bson::Null), "nothing left to remove");
    let bad =
        doc! { "findAndModify": "c", "$db": "test", "query": {}, "remove": true, "update": { "$set": { "n": 1 } } };
    assert_eq!(mongo_replies(&h.deliver(CLIENT, mongo(8, &bad)))[0].get_f64("ok"), Ok(0.0));
    let ids: Vec<i32> = find_all(&mut h, 9).iter().map(|d| d.get_i32("_id").unwrap()).collect();
    assert_eq!(ids, vec![1, 3]);
}

// ----- a third review -----

fn five_members() -> Arc<MemberConfig> {
    Arc::new(MemberConfig::new((0..5).map(NodeId).collect()))
}

fn last_pos(m: &Member) -> OpPos {
    m.oplog().last().map(|e| OpPos { optime: e.optime, term: e.term }).unwrap_or_default()
}

/// A majority write's request reaches its old primary a second time (the network duplicated
/// it) after that primary stepped down but before its entry was rolled back: the copy is
/// parked as a majority waiter although the member is a secondary. The entry is then rolled
/// back, the member catches up with the new primary and is elected again; the parked copy is
/// answered `Written` because the commit point passed its (rolled-back) optime.
#[test]
fn a_parked_copy_of_a_rolled_back_majority_write_is_never_acknowledged() {
    let mut h = RoleHarness::new(NodeId(0), Member::new(five_members(), 0), 41);
    h.start();
    let mut seq = 1_000;
    // Member 0 is primary in term 1 (5 members; it needs 2 more votes: grant from 1 and 2).
    let timeout = five_members().election_timeout;
    let dry = vote_term(&h.advance(timeout * 2 + Duration::from_millis(10)), true).unwrap();
    for v in [1, 2] {
        seq += 1;
        h.deliver(NodeId(v), peer(dry, PeerBody::VoteReply { granted: true, dry_run: true }, seq));
    }
    let real = h.role().term();
    for v in [1, 2] {
        seq += 1;
        h.deliver(NodeId(v), peer(real, PeerBody::VoteReply { granted: true, dry_run: false }, seq));
    }
    assert!(h.role().is_primary());
    assert_eq!(h.role().term(), 1);

    // 1. The client's majority append (request 1, naming term 1) runs on member 0 only.
    let write = CausalMsg::Request(Request {
        id: 1,
        op: ClientOp::Append { key: 7, value: 77 },
        read_concern: ReadConcern::Majority,
        write_concern: WriteConcern::Majority,
        after_cluster_time: None,
        cluster_time: None,
        max_time_ms: 60_000,
        secondary_ok: false,
        term: Some(1),
    });
    assert!(replies(&h.deliver(CLIENT, write.clone())).is_empty(), "waits for a majority");
    let t_e = h.role().oplog().iter().find(|e| e.origin.is_some_and(|o| o.request == 1)).unwrap().optime;

    // 2. Members 1..4 elected member 1 in term 2; its heartbeat deposes member 0, which
    //    answers the waiter with InterruptedDueToReplStateChange (outcome unknown).
    seq += 1;
    let e = h.deliver(NodeId(1), peer(2, PeerBody::Heartbeat { commit_point: ClusterTime::ZERO }, seq));
    assert!(!h.role().is_primary());
    let r = replies(&e);
    assert!(r.iter().all(|r| r.result.is_err()), "{r:?}");

    // 3. The network delivers a duplicate of request 1 to member 0, now a secondary.
    let r = replies(&h.deliver(CLIENT, write));
    assert!(r.is_empty() || r.iter().all(|r| r.result.is_err()), "a secondary acknowledged: {r:?}");

    // 4. Member 1's oplog has none of member 0's term-1 entries: roll back everything.
    let last = last_pos(h.role());
    roll_back_everything(&mut h, last, &mut seq);
    assert!(h.role().oplog().is_empty(), "rolled back");

    // 5. Member 0 pulls member 1's term-2 no-op, committed by members 1..3, past t_e.
    let noop = Entry { optime: ClusterTime::new(t_e.secs, t_e.inc + 100), term: 2, op: Op::Noop, origin: None };
    seq += 1;
    let b = PeerBody::Batch {
        after: OpPos::default(),
        entries: vec![noop.clone()],
        commit_point: noop.optime,
        rollback_to: None,
    };
    h.deliver(NodeId(1), peer(2, b, seq));
    assert_eq!(h.role().commit_point(), noop.optime);

    // 6. Member 1 dies; member 0 is elected in term 3 (votes of 3 and 4); 3 and 4 pull.
    let dry = vote_term(&h.advance(timeout * 2 + Duration::from_millis(10)), true).expect("a dry run");
    for v in [3, 4] {
        seq += 1;
        h.deliver(NodeId(v), peer(dry, PeerBody::VoteReply { granted: true, dry_run: true }, seq));
    }
    let real = h.role().term();
    let mut answered = Vec::new();
    for v in [3, 4] {
        seq += 1;
        answered.extend(replies(
            &h.deliver(NodeId(v), peer(real, PeerBody::VoteReply { granted: true, dry_run: false }, seq)),
        ));
    }
    assert!(h.role().is_primary() && h.role().term() == 3);
    for v in [3, 4] {
        seq += 1;
        let pull = PeerBody::Pull { last: OpPos { optime: noop.optime, term: 2 } };
        answered.extend(replies(&h.deliver(NodeId(v), peer(3, pull, seq))));
    }

    // Request 1 is in no oplog any more: it must not be acknowledged.
    let in_oplog = h.role().oplog().iter().any(|e| e.origin.is_some_and(|o| o.client == CLIENT.0 && o.request == 1));
    assert!(!in_oplog);
    let acked: Vec<&Reply> =
        answered.iter().filter(|r| r.id == 1 && matches!(r.result, Ok(ReplyBody::Written))).collect();
    assert!(
        acked.is_empty(),
        "majority write acknowledged after its entry was rolled back: {acked:?}; list at key 7 = {:?}",
        h.role().read_local(7)
    );
}

fn lsid(b: u8) -> Document {
    doc! { "id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![b; 16] } }
}

/// A cursor belongs to the session that opened it (MongoDB: getMore from another session
/// fails with 50738, from no session with 50737). Kairos hands any client the rest of any
/// cursor whose (sequential, guessable) id it names.
#[test]
fn get_more_from_another_session_does_not_read_its_cursor() {
    let mut h = one_member_primary();
    let alice = NodeId(9);
    let mallory = NodeId(10);
    let ins = doc! { "insert": "secret", "$db": "test", "lsid": lsid(1),
    "documents": [ { "_id": 1, "pin": 1111 }, { "_id": 2, "pin": 2222 }, { "_id": 3, "pin": 3333 } ] };
    assert_eq!(mongo_replies(&h.deliver(alice, mongo(1, &ins)))[0].get_i32("n"), Ok(3));
    let find = doc! { "find": "secret", "$db": "test", "lsid": lsid(1), "batchSize": 1 };
    let r = mongo_replies(&h.deliver(alice, mongo(2, &find)));
    let cursor = r[0].get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(cursor, 0, "{r:?}");
    // Another connection, another session: guesses the id (1, 2, 3, … per process life).
    let steal = doc! { "getMore": cursor, "collection": "secret", "$db": "test", "lsid": lsid(2) };
    let r = mongo_replies(&h.deliver(mallory, mongo(3, &steal)));
    assert_eq!(r[0].get_f64("ok"), Ok(0.0), "another session read the cursor: {:?}", r[0]);
    // And the owner still gets the rest.
    let mine = doc! { "getMore": cursor, "collection": "secret", "$db": "test", "lsid": lsid(1) };
    let r = mongo_replies(&h.deliver(alice, mongo(4, &mine)));
    let next = r[0].get_document("cursor").unwrap().get_array("nextBatch").unwrap();
    assert_eq!(next.len(), 2, "the owner lost its documents: {:?}", r[0]);
}

/// A retryable write's record must outlive its retry window (MongoDB keeps a session's record
/// until the session expires, `logicalSessionTimeoutMinutes` = 30). Kairos keeps the newest
/// 100,000 records by count: once 100,000 other sessions have written, a retry of the first
/// write runs it a second time (and an older txnNumber is no longer TransactionTooOld).
#[test]
fn a_retryable_write_is_not_run_twice_after_many_other_sessions_wrote() {
    let mut h = one_member_primary();
    let ins = doc! { "insert": "c", "$db": "test", "documents": [ { "_id": 1, "n": 0 } ] };
    assert_eq!(mongo_replies(&h.deliver(CLIENT, mongo(1, &ins)))[0].get_i32("n"), Ok(1));
    let session = |i: u32| {
        let mut b = vec![0u8; 16];
        b[..4].copy_from_slice(&i.to_be_bytes());
        doc! { "id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: b } }
    };
    let inc = doc! { "update": "c", "$db": "test", "lsid": session(u32::MAX), "txnNumber": 1i64,
    "updates": [ { "q": { "_id": 1 }, "u": { "$inc": { "n": 1 } } } ] };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(2, &inc)));
    assert_eq!(r[0].get_i32("nModified"), Ok(1), "{r:?}");
    // 100,000 other sessions each write once (a busy minute for a real deployment): the
    // table holds 100,000 live records after the first 99,999, and the last session is refused.
    for i in 0..100_000u32 {
        let w = doc! { "insert": "other", "$db": "test", "lsid": session(i), "txnNumber": 1i64,
        "writeConcern": { "w": 1 }, "documents": [ { "_id": i as i64 } ] };
        let r = mongo_replies(&h.deliver(NodeId(100), mongo(10 + u64::from(i), &w)));
        let refused = r[0].get_i32("code") == Ok(261);
        assert_eq!(refused, i == 99_999, "session {i}: {:?}", r[0]);
    }
    // The driver's retry of the first write (its reply was lost): the same answer, no second $inc.
    let r = mongo_replies(&h.deliver(CLIENT, mongo(3, &inc)));
    assert_eq!(r[0].get_f64("ok"), Ok(1.0), "{r:?}");
    let find = doc! { "find": "c", "$db": "test", "filter": { "_id": 1 } };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(4, &find)));
    let d = r[0].get_document("cursor").unwrap().get_array("firstBatch").unwrap()[0].as_document().unwrap().clone();
    assert_eq!(d.get_i32("n"), Ok(1), "the retryable write ran twice: {d:?}");
}

fn batch_ids(reply: &Document, batch: &str) -> Vec<i32> {
    let docs = reply.get_document("cursor").unwrap().get_array(batch).unwrap();
    docs.iter().map(|d| d.as_document().unwrap().get_i32("_id").unwrap()).collect()
}

/// A cursor holds its query, not a copy of its result: a `getMore` reads on after the last
/// `_id` it returned, at the newest state — a document deleted since is not returned, an
/// updated one is returned as it is now, one written behind the cursor is not, one ahead is
/// (as MongoDB's yielding cursors do); and `skip` / `limit` hold across batches.
#[test]
fn a_cursor_reads_on_after_its_last_id_at_the_newest_state() {
    let mut h = one_member_primary();
    let docs: Vec<Document> = (1..=5).map(|i| doc! { "_id": i, "v": 0 }).collect();
    let ins = doc! { "insert": "c", "$db": "test", "documents": docs };
    assert_eq!(mongo_replies(&h.deliver(CLIENT, mongo(1, &ins)))[0].get_i32("n"), Ok(5));
    let r = mongo_replies(&h.deliver(CLIENT, mongo(2, &doc! { "find": "c", "$db": "test", "batchSize": 2 })));
    assert_eq!(batch_ids(&r[0], "firstBatch"), [1, 2]);
    let cursor = r[0].get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(cursor, 0);
    let writes = [
        doc! { "insert": "c", "$db": "test", "documents": [ { "_id": 0 }, { "_id": 6 } ] },
        doc! { "delete": "c", "$db": "test", "deletes": [ { "q": { "_id": 3 }, "limit": 1 } ] },
        doc! { "update": "c", "$db": "test", "updates": [ { "q": { "_id": 4 }, "u": { "$set": { "v": 1 } } } ] },
    ];
    for (i, w) in writes.iter().enumerate() {
        let r = mongo_replies(&h.deliver(CLIENT, mongo(3 + i as u64, w)));
        assert_eq!(r[0].get_f64("ok"), Ok(1.0), "{r:?}");
    }
    let more = doc! { "getMore": cursor, "collection": "c", "$db": "test" };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(6, &more)));
    assert_eq!(batch_ids(&r[0], "nextBatch"), [4, 5, 6], "{r:?}");
    let updated = r[0].get_document("cursor").unwrap().get_array("nextBatch").unwrap()[0].as_document().unwrap();
    assert_eq!(updated.get_i32("v"), Ok(1), "the document as it is now");
    assert_eq!(r[0].get_document("cursor").unwrap().get_i64("id"), Ok(0), "exhausted");
    // skip 1, limit 3, an empty first batch: the skip and the limit carry to the getMores.
    let find = doc! { "find": "c", "$db": "test", "skip": 1, "limit": 3, "batchSize": 0 };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(7, &find)));
    assert!(batch_ids(&r[0], "firstBatch").is_empty());
    let cursor = r[0].get_document("cursor").unwrap().get_i64("id").unwrap();
    let more = |batch: i32| doc! { "getMore": cursor, "collection": "c", "$db": "test", "batchSize": batch };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(8, &more(2))));
    assert_eq!(batch_ids(&r[0], "nextBatch"), [1, 2]);
    let r = mongo_replies(&h.deliver(CLIENT, mongo(9, &more(2))));
    assert_eq!(batch_ids(&r[0], "nextBatch"), [4], "the limit of 3 holds across batches");
    assert_eq!(r[0].get_document("cursor").unwrap().get_i64("id"), Ok(0));
}

/// Open cursors are bounded in bytes, not only in number: cursors whose queries together pass
/// 64 MiB drop the least recently used (the first cursor here). Before, each cursor copied its
/// result, and a thousand of them were kept whatever their size.
#[test]
fn open_cursors_are_bounded_in_bytes() {
    let mut h = one_member_primary();
    let big = "x".repeat(1 << 20);
    let ins = doc! { "insert": "c", "$db": "test", "documents": [ { "_id": 1, "a": &big }, { "_id": 2, "a": &big } ] };
    assert_eq!(mongo_replies(&h.deliver(CLIENT, mongo(1, &ins)))[0].get_i32("n"), Ok(2));
    let find = doc! { "find": "c", "$db": "test", "filter": { "a": &big }, "batchSize": 1 };
    let mut cursors = Vec::new();
    for i in 0..80 {
        let r = mongo_replies(&h.deliver(CLIENT, mongo(10 + i, &find)));
        cursors.push(r[0].get_document("cursor").unwrap().get_i64("id").unwrap());
    }
    let more = |c: i64| doc! { "getMore": c, "collection": "c", "$db": "test" };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(100, &more(cursors[0]))));
    let code = r[0].get_i32("code");
    assert_eq!(code, Ok(kairos_causal::mongo::codes::CURSOR_NOT_FOUND), "the oldest cursor was dropped");
    let r = mongo_replies(&h.deliver(CLIENT, mongo(101, &more(cursors[79]))));
    assert_eq!(batch_ids(&r[0], "nextBatch"), [2], "the newest cursor reads on");
}

/// Retry records expire by the primaries' clocks, not by the cluster time: a trusted client
/// gossips a cluster time two hours ahead (well inside the rate limiter's year), another
/// session's retryable write lands there, and session A's in-flight write must still be
/// recognised when its driver retries it. Before the fix it ran a second time, with a reply
/// that looked like a first run. Thirty minutes later by the clock, the record has expired.
#[test]
fn a_cluster_time_jump_does_not_expire_retry_records() {
    let mut h = one_member_primary_with(|c| c.trusted_clients = true);
    let ins = doc! { "insert": "c", "$db": "test", "writeConcern": { "w": 1 }, "documents": [ { "_id": 1, "n": 0 } ] };
    assert_eq!(mongo_replies(&h.deliver(CLIENT, mongo(1, &ins)))[0].get_i32("n"), Ok(1));
    let inc = doc! { "update": "c", "$db": "test", "lsid": lsid(0xA), "txnNumber": 1i64, "writeConcern": { "w": 1 },
    "updates": [ { "q": { "_id": 1 }, "u": { "$inc": { "n": 1 } } } ] };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(2, &inc)));
    assert_eq!(r[0].get_i32("nModified"), Ok(1), "{r:?}");

    let now = h.role().cluster_time();
    let ahead = bson::Bson::Timestamp(bson::Timestamp { time: now.secs + 7_200, increment: 1 });
    let dummy = bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0; 20] };
    let gossip = doc! { "ping": 1, "$db": "admin",
    "$clusterTime": { "clusterTime": ahead, "signature": { "hash": dummy, "keyId": 0i64 } } };
    let r = mongo_replies(&h.deliver(NodeId(10), mongo(3, &gossip)));
    assert_eq!(r[0].get_f64("ok"), Ok(1.0), "{r:?}");
    assert!(h.role().cluster_time().secs >= now.secs + 7_200, "the trusted client moved the cluster time");
    let other = |id: i32| {
        doc! { "insert": "c", "$db": "test", "lsid": lsid(0xB), "txnNumber": i64::from(id),
        "writeConcern": { "w": 1 }, "documents": [ { "_id": id } ] }
    };
    assert_eq!(mongo_replies(&h.deliver(NodeId(11), mongo(4, &other(2))))[0].get_i32("n"), Ok(1));

    h.advance(Duration::from_millis(5));
    let r = mongo_replies(&h.deliver(CLIENT, mongo(5, &inc)));
    assert_eq!(r[0].get_f64("ok"), Ok(1.0), "{r:?}");
    let n_of_1 = |h: &mut RoleHarness<Member>, id: u64| {
        let find = doc! { "find": "c", "$db": "test", "filter": { "_id": 1 } };
        let r = mongo_replies(&h.deliver(CLIENT, mongo(id, &find)));
        r[0].get_document("cursor").unwrap().get_array("firstBatch").unwrap()[0]
            .as_document()
            .unwrap()
            .get_i32("n")
            .unwrap()
    };
    assert_eq!(n_of_1(&mut h, 6), 1, "the retry of (lsid A, txnNumber 1) ran the $inc a second time");

    // Thirty-one minutes later by the primary's clock, another session's write expires A's
    // record: a retry of it is now a new write, as after a session's timeout in MongoDB.
    h.advance(Duration::from_secs(31 * 60));
    assert_eq!(mongo_replies(&h.deliver(NodeId(11), mongo(7, &other(3))))[0].get_i32("n"), Ok(1));
    let r = mongo_replies(&h.deliver(CLIENT, mongo(8, &inc)));
    assert_eq!(r[0].get_i32("nModified"), Ok(1), "{r:?}");
    assert_eq!(n_of_1(&mut h, 9), 2, "the record outlived its session's timeout");
}

/// A majority cursor reads each batch at the commit point, and its `getMore` says so in
/// `operationTime` (MongoDB: the majority snapshot's time); it used to say the last applied
/// time, which a causal session's next read then waited for, needlessly.
#[test]
fn a_majority_cursor_reports_the_commit_point_it_read_at() {
    let mut h = RoleHarness::new(NodeId(0), Member::new(config(None), 0), 3);
    h.start();
    let mut seq = 0;
    elect(&mut h, 1, &mut seq);
    let ins = doc! { "insert": "c", "$db": "test", "writeConcern": { "w": 1 },
    "documents": [ { "_id": 1 }, { "_id": 2 }, { "_id": 3 } ] };
    assert_eq!(mongo_replies(&h.deliver(CLIENT, mongo(1, &ins)))[0].get_i32("n"), Ok(1 + 2));
    // Member 1 has everything so far: the commit point reaches it.
    seq += 1;
    let term = h.role().term();
    h.deliver(NodeId(1), peer(term, PeerBody::Pull { last: last_pos(h.role()) }, seq));
    let committed = h.role().commit_point();
    assert_eq!(committed, h.role().last_applied(), "the pull committed the inserts");
    let find = doc! { "find": "c", "$db": "test", "batchSize": 1, "readConcern": { "level": "majority" } };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(2, &find)));
    let cursor = r[0].get_document("cursor").unwrap().get_i64("id").unwrap();
    // A write that no secondary has: the last applied time moves past the commit point.
    let ins = doc! { "insert": "c", "$db": "test", "writeConcern": { "w": 1 }, "documents": [ { "_id": 4 } ] };
    assert_eq!(mongo_replies(&h.deliver(CLIENT, mongo(3, &ins)))[0].get_i32("n"), Ok(1));
    assert!(h.role().last_applied() > committed);

    let more = doc! { "getMore": cursor, "collection": "c", "$db": "test", "batchSize": 1 };
    let r = mongo_replies(&h.deliver(CLIENT, mongo(4, &more)));
    assert_eq!(batch_ids(&r[0], "nextBatch"), vec![2]);
    let op_time = r[0].get_timestamp("operationTime").expect("a signed reply carries operationTime");
    assert_eq!((op_time.time, op_time.increment), (committed.secs, committed.inc), "{:?}", r[0]);
}

/// From the review of that fix: member 0's clock is 40 minutes ahead of member 1's. Member 0,
/// primary in term 1, runs session A's retryable write, which reaches member 1; member 1 is
/// elected and runs session B's retryable `$inc`, whose reply is lost. With expiry against
/// the newest clock seen, B's record (written 40 minutes "before" A's) was dropped by the very
/// call that wrote it, and the driver's retry a second later ran the `$inc` again.
#[test]
fn a_primary_whose_clock_is_behind_an_earlier_primarys_keeps_its_retry_records() {
    let mut seq = 10_000;
    let mut h0 = RoleHarness::new(NodeId(0), Member::new(config(None), 0), 1);
    let mut h1 = RoleHarness::new(NodeId(1), Member::new(config(None), 1), 2);
    let _ = h0.advance(Duration::from_secs(40 * 60)); // not started yet: only its clock moves
    h0.start();
    h1.start();
    let all = |_: &CausalMsg| true;
    let e = elect(&mut h0, 1, &mut seq);
    relay(&mut h0, &mut h1, e, &all);
    let e = h0.advance(Duration::from_millis(300));
    relay(&mut h0, &mut h1, e, &all);
    let ins = doc! { "insert": "c", "$db": "test", "writeConcern": { "w": 1 }, "documents": [ { "_id": 1, "n": 0 } ] };
    let e = h0.deliver(CLIENT, mongo(1, &ins));
    assert_eq!(relay(&mut h0, &mut h1, e, &all)[0].get_i32("n"), Ok(1));
    let a = doc! { "insert": "c", "$db": "test", "lsid": lsid(0xA), "txnNumber": 1i64, "writeConcern": { "w": 1 },
    "documents": [ { "_id": 2 } ] };
    let e = h0.deliver(CLIENT, mongo(2, &a));
    assert_eq!(relay(&mut h0, &mut h1, e, &all)[0].get_i32("n"), Ok(1));
    let e = h0.advance(Duration::from_millis(300));
    relay(&mut h0, &mut h1, e, &all);
    assert!(
        h1.role().oplog().iter().any(|e| matches!(&e.op, kairos_causal::msg::Op::Docs { retry: Some(_), .. })),
        "member 1 has session A's entry"
    );

    elect(&mut h1, 2, &mut seq);
    let inc = doc! { "update": "c", "$db": "test", "lsid": lsid(0xB), "txnNumber": 1i64, "writeConcern": { "w": 1 },
    "updates": [ { "q": { "_id": 1 }, "u": { "$inc": { "n": 1 } } } ] };
    let r = mongo_replies(&h1.deliver(CLIENT, mongo(3, &inc)));
    assert_eq!(r[0].get_i32("nModified"), Ok(1), "{r:?}");
    h1.advance(Duration::from_secs(1));
    let r = mongo_replies(&h1.deliver(CLIENT, mongo(4, &inc)));
    assert_eq!(r[0].get_f64("ok"), Ok(1.0), "{r:?}");
    let find = doc! { "find": "c", "$db": "test", "filter": { "_id": 1 } };
    let r = mongo_replies(&h1.deliver(CLIENT, mongo(5, &find)));
    let d = r[0].get_document("cursor").unwrap().get_array("firstBatch").unwrap()[0].as_document().unwrap().clone();
    assert_eq!(d.get_i32("n"), Ok(1), "the retry of (lsid B, txnNumber 1), one second later, ran the $inc again");
}
