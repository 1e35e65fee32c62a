//! MongoDB-command schedules from a review outside the suite (2026-12-07), one member driven
//! message by message: each failed before its fix.
//! - An upsert whose filter named an existing `_id` but did not match it replaced the document
//!   (MongoDB answers E11000: the insert meets the `_id` index).
//! - On a one-member set, a `w: "majority"` write was answered only by the next write or the
//!   idle no-op 10 s later.

use bson::{doc, Document};
use kairos_causal::msg::MongoRequest;
use kairos_causal::{CausalMsg, Member, MemberConfig};
use kairos_core::harness::{sent, RoleHarness};
use kairos_core::{Effect, NodeId};
use std::sync::Arc;
use std::time::Duration;

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
