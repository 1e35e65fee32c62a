//! Schedules from a review outside the suite (2026-12-07), one member driven message by
//! message: each failed before its fix.
//! - A primary whose earlier Keys entry was rolled back still counted those keys as live and
//!   never wrote new ones: no reply carried `$clusterTime` or `operationTime` until they
//!   expired (90 days).
//! - Copies of a majority write that already ran each parked one more waiter, past
//!   `max_waiters` (a replaying network grew the queue without bound).

use kairos_causal::msg::{codes, ClientOp, Op, OpPos, PeerBody, PeerMsg, ReadConcern, Reply, Request, WriteConcern};
use kairos_causal::{CausalMsg, Member, MemberConfig};
use kairos_clock::ClusterTime;
use kairos_core::harness::{sent, RoleHarness};
use kairos_core::{Effect, NodeId};
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
/// the member becomes primary.
fn elect(h: &mut RoleHarness<Member>, voter: u32, seq: &mut u64) {
    let timeout = config(None).election_timeout;
    let dry = vote_term(&h.advance(timeout * 2 + Duration::from_millis(10)), true).expect("a dry run");
    *seq += 1;
    let granted = peer(dry, PeerBody::VoteReply { granted: true, dry_run: true }, *seq);
    let real = vote_term(&h.deliver(NodeId(voter), granted), false).expect("it stands");
    *seq += 1;
    h.deliver(NodeId(voter), peer(real, PeerBody::VoteReply { granted: true, dry_run: false }, *seq));
    assert!(h.role().is_primary());
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
