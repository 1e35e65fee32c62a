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

use bson::{doc, Document};
use kairos_causal::msg::{
    codes, ClientOp, MongoRequest, Op, OpPos, PeerBody, PeerMsg, ReadConcern, Reply, Request, WriteConcern,
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
    seq += 1;
    let rb = PeerBody::Batch {
        after: last,
        entries: vec![],
        commit_point: ClusterTime::ZERO,
        rollback_to: Some(ClusterTime::ZERO),
    };
    h.deliver(NodeId(1), peer(2, rb, seq));
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
    let config = Arc::new(MemberConfig::new(vec![NodeId(0)]));
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
