//! One member at a time, fed exactly the messages and timers a schedule calls for
//! ([`RoleHarness`], which also checks the member's own invariants after every handler):
//! elections, the durable vote, and a primary's commit point.

use kairos_causal::msg::{OpPos, PeerBody, PeerMsg};
use kairos_causal::{CausalMsg, Member, MemberConfig};
use kairos_core::harness::{sent, RoleHarness};
use kairos_core::{Effect, NodeId};
use std::sync::Arc;
use std::time::Duration;

fn config() -> Arc<MemberConfig> {
    Arc::new(MemberConfig::new((0..3).map(NodeId).collect()))
}

fn member(seed: u64) -> RoleHarness<Member> {
    let mut h = RoleHarness::new(NodeId(0), Member::new(config(), 0), seed);
    h.start();
    h
}

fn peer(term: u64, body: PeerBody) -> CausalMsg {
    CausalMsg::Peer(PeerMsg { term, cluster_time: None, body })
}

/// The peer messages among `effects`: (to, term, body).
fn peer_sent(effects: &[Effect<CausalMsg>]) -> Vec<(NodeId, u64, PeerBody)> {
    sent(effects)
        .into_iter()
        .filter_map(|(to, m)| match m {
            CausalMsg::Peer(p) => Some((to, p.term, p.body.clone())),
            _ => None,
        })
        .collect()
}

fn vote_replies(effects: &[Effect<CausalMsg>]) -> Vec<(NodeId, bool)> {
    peer_sent(effects)
        .into_iter()
        .filter_map(|(to, _, b)| match b {
            PeerBody::VoteReply { granted } => Some((to, granted)),
            _ => None,
        })
        .collect()
}

/// Lets the election timeout pass (plus its largest jitter) and returns the vote requests.
fn stand(h: &mut RoleHarness<Member>) -> Vec<(NodeId, u64)> {
    let effects = h.advance(config().election_timeout * 2 + Duration::from_millis(10));
    peer_sent(&effects)
        .into_iter()
        .filter_map(|(to, term, b)| matches!(b, PeerBody::RequestVote { .. }).then_some((to, term)))
        .collect()
}

#[test]
fn a_member_that_hears_no_primary_asks_every_other_member_for_its_vote() {
    let mut h = member(1);
    let asked = stand(&mut h);
    let to: std::collections::BTreeSet<NodeId> = asked.iter().map(|(n, _)| *n).collect();
    assert_eq!(to, [NodeId(1), NodeId(2)].into(), "{asked:?}");
    assert!(asked.iter().all(|(_, term)| *term >= 1), "{asked:?}");
    assert!(!h.role().is_primary(), "one vote (its own) is not a majority of three");
}

#[test]
fn a_vote_is_durable_so_a_restarted_member_never_votes_twice_in_a_term() {
    let ask = |h: &mut RoleHarness<Member>, candidate: u32| {
        vote_replies(&h.deliver(NodeId(candidate), peer(5, PeerBody::RequestVote { last: OpPos::default() })))
    };
    let mut h = member(2);
    assert_eq!(ask(&mut h, 1), vec![(NodeId(1), true)], "the first candidate of term 5 gets the vote");
    assert_eq!(ask(&mut h, 2), vec![(NodeId(2), false)], "and no other candidate of term 5 does");
    h.restart(Member::new(config(), 0));
    assert_eq!(h.role().term(), 5, "the term survives the restart");
    assert_eq!(ask(&mut h, 2), vec![(NodeId(2), false)], "nor after a restart with its disk");

    // Control: the same member on a new disk (it remembers nothing) gives candidate 2 the vote
    // of term 5, a second vote in that term: the journaled vote is what prevents it.
    assert_eq!(ask(&mut member(2), 2), vec![(NodeId(2), true)]);
}

#[test]
fn a_primary_commits_its_first_entry_only_once_a_majority_has_applied_it() {
    let mut h = member(3);
    let asked = stand(&mut h);
    let term = asked.first().map(|(_, t)| *t).expect("it stood for election");
    h.deliver(NodeId(1), peer(term, PeerBody::VoteReply { granted: true }));
    assert!(h.role().is_primary(), "its own vote and member 1's are a majority");
    // A new primary writes an entry of its term; only that commits by counting replicas.
    let first = h.role().oplog().last().cloned().expect("a new primary writes an entry of its term");
    assert_eq!(first.term, term);
    assert!(h.role().commit_point() < first.optime, "applied by the primary alone: not committed");
    // Member 2 reports it has nothing yet: still one copy.
    h.deliver(NodeId(2), peer(term, PeerBody::Pull { last: OpPos::default() }));
    assert!(h.role().commit_point() < first.optime);
    // Member 1 pulls from after that entry: it applied it, and two copies are a majority.
    h.deliver(NodeId(1), peer(term, PeerBody::Pull { last: OpPos { optime: first.optime, term } }));
    assert_eq!(h.role().commit_point(), first.optime);
}
