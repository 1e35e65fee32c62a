//! One member at a time, fed exactly the messages and timers a schedule calls for
//! ([`RoleHarness`], which also checks the member's own invariants after every handler):
//! elections and their dry runs, the durable vote, a primary's commit point, which heartbeats
//! count as a sign of a primary's life, and the term a client write names.

use kairos_causal::msg::{codes, ClientOp, OpPos, PeerBody, PeerMsg, ReadConcern, Reply, Request, WriteConcern};
use kairos_causal::{CausalMsg, Member, MemberConfig, MemberState};
use kairos_clock::ClusterTime;
use kairos_core::harness::{sent, RoleHarness};
use kairos_core::{Effect, NodeId, Process};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// A peer message, numbered after every one made before ([`PeerMsg::seq`]).
fn peer(term: u64, body: PeerBody) -> CausalMsg {
    static SENT: AtomicU64 = AtomicU64::new(1_000);
    peer_numbered(term, body, SENT.fetch_add(1, Ordering::Relaxed))
}

fn peer_numbered(term: u64, body: PeerBody, seq: u64) -> CausalMsg {
    CausalMsg::Peer(PeerMsg { term, cluster_time: None, body, seq })
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
            PeerBody::VoteReply { granted, .. } => Some((to, granted)),
            _ => None,
        })
        .collect()
}

/// The vote requests among `effects`: (to, term, dry run).
fn vote_requests(effects: &[Effect<CausalMsg>]) -> Vec<(NodeId, u64, bool)> {
    peer_sent(effects)
        .into_iter()
        .filter_map(|(to, term, b)| match b {
            PeerBody::RequestVote { dry_run, .. } => Some((to, term, dry_run)),
            _ => None,
        })
        .collect()
}

/// Lets the election timeout pass (plus its largest jitter): the member's dry run.
fn time_out(h: &mut RoleHarness<Member>) -> Vec<(NodeId, u64, bool)> {
    vote_requests(&h.advance(config().election_timeout * 2 + Duration::from_millis(10)))
}

/// Times the member out and answers its dry run yes from member 1: it stands. Returns its real
/// vote requests.
fn stand(h: &mut RoleHarness<Member>) -> Vec<(NodeId, u64)> {
    let term = time_out(h).first().map(|(_, t, _)| *t).expect("a dry run");
    let effects = h.deliver(NodeId(1), peer(term, PeerBody::VoteReply { granted: true, dry_run: true }));
    vote_requests(&effects).into_iter().filter(|(_, _, dry)| !dry).map(|(to, t, _)| (to, t)).collect()
}

fn ask(h: &mut RoleHarness<Member>, candidate: u32, term: u64, last: OpPos, dry_run: bool) -> bool {
    let replies = vote_replies(&h.deliver(NodeId(candidate), peer(term, PeerBody::RequestVote { last, dry_run })));
    assert_eq!(replies.len(), 1, "{replies:?}");
    replies[0].1
}

#[test]
fn a_member_that_hears_no_primary_first_asks_whether_it_would_win_then_stands() {
    let mut h = member(1);
    let every_other: BTreeSet<NodeId> = [NodeId(1), NodeId(2)].into();
    let dry = time_out(&mut h);
    assert_eq!(dry.iter().map(|(n, _, _)| *n).collect::<BTreeSet<_>>(), every_other, "{dry:?}");
    assert!(dry.iter().all(|(_, term, dry)| *term == 0 && *dry), "a dry run, in its current term: {dry:?}");
    assert_eq!(h.role().term(), 0, "a dry run raises no term");
    assert_eq!(h.role().state(), &MemberState::Secondary);

    let asked = stand(&mut h);
    assert_eq!(asked.iter().map(|(n, _)| *n).collect::<BTreeSet<_>>(), every_other, "{asked:?}");
    assert!(asked.iter().all(|(_, term)| *term == 1), "{asked:?}");
    assert_eq!(h.role().term(), 1);
    assert!(!h.role().is_primary(), "one vote (its own) is not a majority of three");
}

#[test]
fn a_candidate_whose_election_timed_out_stands_again_after_a_dry_run() {
    let mut h = member(8);
    assert_eq!(stand(&mut h)[0].1, 1);
    assert!(matches!(h.role().state(), MemberState::Candidate { .. }));
    // Nobody answers: after another timeout, a dry run in term 1, and with a yes, term 2.
    assert_eq!(stand(&mut h)[0].1, 2);
    assert_eq!(h.role().term(), 2);
}

#[test]
fn a_refused_dry_run_leaves_the_term_alone() {
    let mut h = member(5);
    time_out(&mut h);
    for m in [1, 2] {
        let effects = h.deliver(NodeId(m), peer(0, PeerBody::VoteReply { granted: false, dry_run: true }));
        assert!(vote_requests(&effects).is_empty());
    }
    // A real vote granted in term 0 does not count toward a dry run either.
    h.deliver(NodeId(1), peer(0, PeerBody::VoteReply { granted: true, dry_run: false }));
    assert_eq!((h.role().term(), h.role().state()), (0, &MemberState::Secondary));
}

#[test]
fn a_dry_run_answer_binds_nobody() {
    let mut h = member(4);
    assert!(ask(&mut h, 1, 5, OpPos::default(), true), "an up-to-date asker, no primary: yes");
    assert!(ask(&mut h, 2, 5, OpPos::default(), true), "and yes to a second asker");
    assert!(ask(&mut h, 2, 5, OpPos::default(), false), "the vote of term 5 is still free");
    assert!(!ask(&mut h, 1, 5, OpPos::default(), false), "and now given");
}

#[test]
fn a_member_behind_the_others_wins_no_dry_run() {
    let mut h = member(6);
    let term = stand(&mut h)[0].1;
    h.deliver(NodeId(1), peer(term, PeerBody::VoteReply { granted: true, dry_run: false }));
    let first = h.role().oplog().last().cloned().expect("a new primary writes an entry");
    let holds = OpPos { optime: first.optime, term: first.term };
    assert!(!ask(&mut h, 2, term, holds, true), "a primary says no");
    // Member 2 stands in the next term with an empty oplog: member 0 steps down, refusing.
    assert!(!ask(&mut h, 2, term + 1, OpPos::default(), false));
    assert!(!h.role().is_primary());
    assert!(!ask(&mut h, 2, term + 1, OpPos::default(), true), "behind: no");
    assert!(ask(&mut h, 1, term + 1, holds, true), "holding every entry: yes");
    assert_eq!(h.role().term(), term + 1, "dry runs raised no term");
}

#[test]
fn a_vote_is_durable_so_a_restarted_member_never_votes_twice_in_a_term() {
    let ask_term_5 = |h: &mut RoleHarness<Member>, candidate: u32| ask(h, candidate, 5, OpPos::default(), false);
    let mut h = member(2);
    assert!(ask_term_5(&mut h, 1), "the first candidate of term 5 gets the vote");
    assert!(!ask_term_5(&mut h, 2), "and no other candidate of term 5 does");
    h.restart(Member::new(config(), 0));
    assert_eq!(h.role().term(), 5, "the term survives the restart");
    assert!(!ask_term_5(&mut h, 2), "nor after a restart with its disk");

    // Control: the same member on a new disk (it remembers nothing) gives candidate 2 the vote
    // of term 5, a second vote in that term: the journaled vote is what prevents it.
    assert!(ask_term_5(&mut member(2), 2));
}

#[test]
fn a_primary_commits_its_first_entry_only_once_a_majority_has_applied_it() {
    let mut h = member(3);
    let asked = stand(&mut h);
    let term = asked.first().map(|(_, t)| *t).expect("it stood for election");
    h.deliver(NodeId(1), peer(term, PeerBody::VoteReply { granted: true, dry_run: false }));
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

/// Member 0, elected primary in term 1 with member 1's vote.
fn primary(seed: u64) -> RoleHarness<Member> {
    let mut h = member(seed);
    let term = stand(&mut h)[0].1;
    h.deliver(NodeId(1), peer(term, PeerBody::VoteReply { granted: true, dry_run: false }));
    assert!(h.role().is_primary() && h.role().term() == 1);
    h
}

/// Client 9's write request `id`, naming `term`, acknowledged at w:1.
fn write(id: u64, term: Option<u64>) -> CausalMsg {
    CausalMsg::Request(Request {
        id,
        op: ClientOp::Append { key: 1, value: id },
        read_concern: ReadConcern::Local,
        write_concern: WriteConcern::W1,
        after_cluster_time: None,
        cluster_time: None,
        max_time_ms: 1_000,
        secondary_ok: false,
        term,
    })
}

/// The one reply among `effects`.
fn reply(effects: &[Effect<CausalMsg>]) -> Reply {
    let replies: Vec<Reply> = sent(effects)
        .into_iter()
        .filter_map(|(_, m)| match m {
            CausalMsg::Reply(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(replies.len(), 1, "{replies:?}");
    replies[0].clone()
}

fn error_code(r: &Reply) -> Option<i32> {
    r.result.as_ref().err().map(|e| e.code)
}

#[test]
fn a_write_runs_only_in_the_term_it_names() {
    let mut h = primary(11);
    let client = NodeId(9);
    let entries = h.role().oplog().len();
    // Named for term 0 (a client that has not heard from this primary yet): refused, and the
    // reply says which term to name. It ran nowhere and never will, so nothing is remembered.
    let r = reply(&h.deliver(client, write(1, Some(0))));
    assert_eq!((error_code(&r), r.term), (Some(codes::PRIMARY_STEPPED_DOWN), Some(1)), "{r:?}");
    assert_eq!(h.role().oplog().len(), entries);
    assert!(codes::write_certainly_failed(codes::PRIMARY_STEPPED_DOWN));
    // A term this primary is not in yet (the client heard of a newer primary): refused too.
    let r = reply(&h.deliver(client, write(1, Some(2))));
    assert_eq!(error_code(&r), Some(codes::PRIMARY_STEPPED_DOWN), "{r:?}");
    // The same request again, naming term 1, runs.
    let r = reply(&h.deliver(client, write(1, Some(1))));
    assert_eq!((r.result.is_ok(), r.term), (true, Some(1)), "{r:?}");
    assert_eq!(h.role().oplog().len(), entries + 1);
    // A copy still naming term 0 (a replayed message) is answered as the write that ran.
    let r = reply(&h.deliver(client, write(1, Some(0))));
    assert!(r.result.is_ok(), "{r:?}");
    assert_eq!(h.role().oplog().len(), entries + 1);
    assert_eq!(h.role().stats().writes_refused_other_term, 2);
}

#[test]
fn an_amnesiac_member_answers_a_write_as_of_unknown_outcome() {
    // It cannot tell whether its life before the lost disk ran this request (a copy of one
    // whose entry can still commit elsewhere): "not primary" would tell the client it failed.
    let mut h = member(12);
    h.call(|m, _| m.on_amnesia());
    let r = reply(&h.deliver(NodeId(9), write(4, Some(1))));
    assert_eq!(error_code(&r), Some(codes::INTERRUPTED_DUE_TO_REPL_STATE_CHANGE), "{r:?}");
    assert!(!codes::write_certainly_failed(codes::INTERRUPTED_DUE_TO_REPL_STATE_CHANGE));
    assert_eq!(h.role().stats().writes_refused_amnesiac, 1);
    // Control: the same member with its disk says "not primary", a certain failure.
    let mut with_disk = member(12);
    let r = reply(&with_disk.deliver(NodeId(9), write(4, Some(1))));
    assert_eq!(error_code(&r), Some(codes::NOT_WRITABLE_PRIMARY), "{r:?}");
}

/// Member 0 follows member 1, primary of term 1 (heartbeat number 100), then gets a heartbeat
/// of member 1 every second for six seconds, numbered from `first`. Returns whether it started
/// a dry run in that time.
fn dry_run_despite_heartbeats(first: u64) -> bool {
    let mut h = member(13);
    h.deliver(NodeId(1), peer_numbered(1, PeerBody::Heartbeat { commit_point: ClusterTime::ZERO }, 100));
    assert_eq!(h.role().term(), 1);
    let mut dry_runs = 0;
    for i in 0..6 {
        dry_runs += vote_requests(&h.advance(Duration::from_secs(1))).len();
        let hb = peer_numbered(1, PeerBody::Heartbeat { commit_point: ClusterTime::ZERO }, first + i);
        dry_runs += vote_requests(&h.deliver(NodeId(1), hb)).len();
    }
    dry_runs > 0
}

#[test]
fn replayed_heartbeats_of_a_crashed_primary_do_not_put_off_the_election() {
    // Copies of heartbeats older than the newest one taken (the primary crashed after it):
    // the member times out as if they were not there.
    assert!(dry_run_despite_heartbeats(90), "old heartbeats re-armed the election timer");
    // Control: newer heartbeats are a live primary, and keep it a secondary.
    assert!(!dry_run_despite_heartbeats(101));
}

#[test]
fn of_two_members_with_the_same_oplog_in_a_dry_run_at_once_the_lower_numbered_goes_first() {
    // Member 0 runs a dry run; member 1, with the same (empty) oplog, asks for its own: no,
    // so that the two do not both stand and split the vote.
    let mut h = member(14);
    assert!(!time_out(&mut h).is_empty());
    assert!(!ask(&mut h, 1, 0, OpPos::default(), true));
    assert_eq!(h.role().stats().dry_runs_refused_contending, 1);
    // Once its own dry run is old (it would have stood by now), yes again.
    h.advance(config().heartbeat * 2);
    assert!(ask(&mut h, 1, 0, OpPos::default(), true));

    // Member 1 in a dry run says yes to member 0, which goes first.
    let mut h = RoleHarness::new(NodeId(1), Member::new(config(), 1), 15);
    h.start();
    h.advance(config().election_timeout * 2 + Duration::from_millis(10));
    assert!(ask(&mut h, 0, 0, OpPos::default(), true));
    assert_eq!(h.role().stats().dry_runs_refused_contending, 0);
}
