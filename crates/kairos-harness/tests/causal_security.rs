//! Cluster-time security through the protocol, and range versus per-reply signing.

use kairos_causal::msg::codes;
use kairos_causal::{ClientOp, Member, Probe, ReadConcern, Reply, Request, WriteConcern};
use kairos_check::{check, Model};
use kairos_clock::{ClusterTime, Signature, SignedClusterTime, TimeProof};
use kairos_core::{NodeId, SimTime};
use kairos_harness::causal::{Deployment, Signing, World};
use std::time::Duration;

fn req(id: u64, op: ClientOp, ct: Option<SignedClusterTime>) -> Request {
    Request {
        id,
        op,
        read_concern: ReadConcern::Local,
        write_concern: WriteConcern::W1,
        after_cluster_time: None,
        cluster_time: ct,
        max_time_ms: 2_000,
        secondary_ok: true,
        term: None,
    }
}

fn world(d: &Deployment) -> World {
    let mut w = d.build().unwrap();
    w.sim.run_until(SimTime::from_secs(6));
    w
}

fn primary(w: &World) -> NodeId {
    w.members.iter().copied().find(|&m| w.sim.role::<Member>(m).is_some_and(|r| r.is_primary())).unwrap()
}

/// Adds a probe in sc running `script` (times relative to now) and runs `run_for`.
fn probe(w: &mut World, script: Vec<(Duration, NodeId, Request)>, run_for: Duration) -> NodeId {
    let sc = w.sim.matrix().region("sc").unwrap();
    let id = w.sim.add_node(sc, kairos_clock::SimClock::perfect(), move |_| Box::new(Probe::new(script.clone())));
    let until = w.sim.now() + run_for;
    w.sim.run_until(until);
    id
}

fn reply(w: &World, p: NodeId, id: u64) -> Reply {
    w.sim.role::<Probe>(p).unwrap().reply(id).unwrap_or_else(|| panic!("no reply to {id}")).clone()
}

fn code(r: &Reply) -> Option<i32> {
    r.result.as_ref().err().map(|e| e.code)
}

fn quiet() -> Deployment {
    Deployment {
        sessions: 1,
        duration: Duration::from_secs(1),
        warmup: Duration::from_secs(100),
        ..Deployment::default()
    }
}

#[test]
fn forged_unknown_key_and_reused_range_are_rejected_and_the_clock_does_not_move() {
    let mut w = world(&quiet());
    let p = primary(&w);
    let read = ClientOp::Read { key: 1 };
    // A genuine signed time first.
    let pr = probe(&mut w, vec![(Duration::ZERO, p, req(1, read, None))], Duration::from_secs(1));
    let genuine = reply(&w, pr, 1).cluster_time.expect("a signed reply");
    let sig = genuine.signature.unwrap();
    assert!(!sig.is_dummy() && sig.key_id != 0);
    let before = w.sim.role::<Member>(p).unwrap().cluster_time();
    let far = ClusterTime::new(genuine.time.secs + 1_000, 0);
    let forged = SignedClusterTime { time: far, signature: Some(Signature { hash: TimeProof([7; 20]), ..sig }) };
    let unknown = SignedClusterTime { time: far, signature: Some(Signature { key_id: 12_345, ..sig }) };
    let unsigned = SignedClusterTime { time: far, signature: None };
    // The genuine signature, reused for a time in the next 65,536-range.
    let next_range = ClusterTime::from_u64(genuine.time.as_u64() + 0x1_0000);
    let reused = SignedClusterTime { time: next_range, signature: Some(sig) };
    let script = vec![
        (Duration::ZERO, p, req(2, read, Some(forged))),
        (Duration::from_millis(1), p, req(3, read, Some(unknown))),
        (Duration::from_millis(2), p, req(4, read, Some(unsigned))),
        (Duration::from_millis(3), p, req(5, ClientOp::Append { key: 1, value: 5 }, Some(reused))),
        (Duration::from_millis(4), p, req(6, read, Some(genuine))),
    ];
    let pr = probe(&mut w, script, Duration::from_secs(1));
    assert_eq!(code(&reply(&w, pr, 2)), Some(codes::TIME_PROOF_MISMATCH));
    assert_eq!(code(&reply(&w, pr, 3)), Some(codes::KEY_NOT_FOUND));
    assert_eq!(code(&reply(&w, pr, 4)), Some(codes::KEY_NOT_FOUND));
    assert_eq!(code(&reply(&w, pr, 5)), Some(codes::TIME_PROOF_MISMATCH));
    assert_eq!(code(&reply(&w, pr, 6)), None, "the genuine time is still accepted");
    let after = w.sim.role::<Member>(p).unwrap().cluster_time();
    assert!(after < next_range && after >= before, "clock moved from {before} to {after}");
    assert!(!w.sim.role::<Member>(p).unwrap().read_local(1).contains(&5), "the rejected write did not happen");
    // Errors carry operationTime and $clusterTime too.
    let e = reply(&w, pr, 2);
    assert!(e.operation_time.is_some() && e.cluster_time.is_some());
    assert_eq!(e.result.unwrap_err().code_name, "TimeProofMismatch");
}

#[test]
fn a_time_beyond_the_drift_limit_is_205_and_after_cluster_time_beyond_the_clock_is_72() {
    // Trusted clients skip signature checks, so the rate limiter is what stops them.
    let mut w = world(&Deployment { trusted_clients: true, ..quiet() });
    let p = primary(&w);
    let now = w.sim.role::<Member>(p).unwrap().cluster_time();
    let far = SignedClusterTime::dummy(ClusterTime::new(now.secs + 366 * 24 * 3600, 0));
    let mut ahead = req(2, ClientOp::Read { key: 0 }, None);
    ahead.after_cluster_time = Some(ClusterTime::new(now.secs + 3600, 0));
    let script =
        vec![(Duration::ZERO, p, req(1, ClientOp::Read { key: 0 }, Some(far))), (Duration::from_millis(1), p, ahead)];
    let pr = probe(&mut w, script, Duration::from_secs(1));
    assert_eq!(code(&reply(&w, pr, 1)), Some(codes::CLUSTER_TIME_FAILS_RATE_LIMITER));
    assert_eq!(code(&reply(&w, pr, 2)), Some(codes::INVALID_OPTIONS));
    assert!(w.sim.role::<Member>(p).unwrap().cluster_time().secs < now.secs + 1_000);
    // A trusted client gets the dummy signature.
    assert!(reply(&w, pr, 1).cluster_time.unwrap().is_dummy_signed());
}

#[test]
fn untrusted_sessions_never_get_a_dummy_trusted_ones_do() {
    let base = Deployment { duration: Duration::from_secs(5), ..Deployment::default() };
    let untrusted = base.run().unwrap();
    assert!(untrusted.sessions.reads_ok + untrusted.sessions.writes_ok > 50);
    assert_eq!(untrusted.sessions.dummy_signatures, 0);
    let trusted = Deployment { trusted_clients: true, ..base }.run().unwrap();
    assert!(trusted.sessions.dummy_signatures >= trusted.sessions.reads_ok + trusted.sessions.writes_ok);
    assert!(trusted.sessions.dummy_signatures > 50);
    assert_eq!(trusted.hmac_computations, 0, "no HMAC for trusted clients");
}

#[test]
fn a_member_without_keys_omits_cluster_time_and_operation_time() {
    let mut d = quiet();
    d.member.generate_keys = false;
    let mut w = world(&d);
    let p = primary(&w);
    let pr = probe(
        &mut w,
        vec![(Duration::ZERO, p, req(1, ClientOp::Append { key: 1, value: 1 }, None))],
        Duration::from_secs(1),
    );
    let r = reply(&w, pr, 1);
    assert_eq!(r.result, Ok(kairos_causal::ReplyBody::Written));
    assert_eq!((r.cluster_time, r.operation_time), (None, None));
}

#[test]
fn key_rotation_across_expiries_keeps_operations_working() {
    let mut d = Deployment { duration: Duration::from_secs(30), ..Deployment::default() };
    d.member.key_rotation_secs = 4;
    let World { mut sim, members, sessions } = d.build().unwrap();
    sim.run_until(SimTime::ZERO + d.warmup + d.duration + Duration::from_secs(5));
    let generated: u64 = members.iter().filter_map(|&m| sim.role::<Member>(m)).map(|m| m.stats().keys_generated).sum();
    assert!(generated >= 8, "keys rotate every 4 s: {generated} generated");
    let out = kairos_harness::causal::collect(&mut sim, &members, &sessions, d.duration, Duration::ZERO);
    for bad in [codes::KEY_NOT_FOUND, codes::TIME_PROOF_MISMATCH] {
        assert_eq!(out.sessions.errors.get(&bad), None, "{:?}", out.sessions.errors);
    }
    assert_eq!(out.sessions.replies_without_cluster_time, 0);
    assert!(out.sessions.ok_in_second_half > 100, "{:?}", out.sessions);
    assert!(check(&out.history, Model::Causal).unwrap().valid);
}

#[test]
fn a_client_of_two_replica_sets_poisons_neither() {
    let mut a = world(&Deployment { seed: 1, ..quiet() });
    let mut b = world(&Deployment { seed: 2, ..quiet() });
    let (pa, pb) = (primary(&a), primary(&b));
    // Set A runs ahead, so its times are above anything set B has signed or validated.
    a.sim.run_until(SimTime::from_secs(12));
    let w1 = req(1, ClientOp::Append { key: 1, value: 1 }, None);
    let pr = probe(&mut a, vec![(Duration::ZERO, pa, w1)], Duration::from_secs(1));
    let from_a = reply(&a, pr, 1).cluster_time.unwrap();
    let mut r = req(2, ClientOp::Read { key: 1 }, Some(from_a));
    r.after_cluster_time = reply(&a, pr, 1).operation_time;
    let script = vec![(Duration::ZERO, pb, r), (Duration::from_millis(5), pb, req(3, ClientOp::Read { key: 1 }, None))];
    let prb = probe(&mut b, script, Duration::from_secs(1));
    assert_eq!(code(&reply(&b, prb, 2)), Some(codes::KEY_NOT_FOUND), "set B does not know set A's key");
    assert!(b.sim.role::<Member>(pb).unwrap().cluster_time() < from_a.time, "set B's clock did not move");
    assert_eq!(code(&reply(&b, prb, 3)), None, "set B still serves clean clients");
    // B's signed time is no good at A either, and A keeps working.
    let from_b = reply(&b, prb, 3).cluster_time.unwrap();
    let bump = SignedClusterTime { time: ClusterTime::new(from_b.time.secs + 100, 0), ..from_b };
    let pr2 = probe(
        &mut a,
        vec![
            (Duration::ZERO, pa, req(4, ClientOp::Read { key: 1 }, Some(bump))),
            (Duration::from_millis(5), pa, req(5, ClientOp::Read { key: 1 }, Some(from_a))),
        ],
        Duration::from_secs(1),
    );
    assert!(matches!(code(&reply(&a, pr2, 4)), Some(codes::KEY_NOT_FOUND) | Some(codes::TIME_PROOF_MISMATCH)));
    assert_eq!(reply(&a, pr2, 5).result, Ok(kairos_causal::ReplyBody::Read(vec![1])));
}

#[test]
fn range_signing_needs_far_fewer_hmacs_than_per_reply_signing() {
    let base = Deployment {
        sessions: 8,
        write_concern: WriteConcern::W1,
        read_concern: ReadConcern::Local,
        read_fraction: 0.8,
        duration: Duration::from_secs(10),
        think_time: Duration::ZERO,
        ..Deployment::default()
    };
    let range = Deployment { signing: Signing::Range, ..base.clone() }.run().unwrap();
    let per_reply = Deployment { signing: Signing::PerReply, ..base }.run().unwrap();
    assert!(range.replies > 1_000 && per_reply.replies > 1_000);
    assert!(per_reply.hmac_computations >= per_reply.replies, "one HMAC per reply at least");
    let (r, p) = (range.hmac_per_million_replies(), per_reply.hmac_per_million_replies());
    eprintln!(
        "HMACs per million replies: range {r:.0}, per-reply {p:.0} ({} vs {} replies)",
        range.replies, per_reply.replies
    );
    assert!(r * 10.0 < p, "range {r} vs per-reply {p}");
}

/// A write request that reaches the primary again (a retransmission, or a message the network
/// duplicated or replayed) runs once: the second copy is answered with the first's optime, a
/// copy of an older request is refused, and the list holds the value once.
#[test]
fn a_write_request_that_arrives_twice_runs_once() {
    let mut w = world(&quiet());
    let p = primary(&w);
    let w1 = req(1, ClientOp::Append { key: 7, value: 70 }, None);
    let w2 = req(2, ClientOp::Append { key: 7, value: 71 }, None);
    let script = vec![
        (Duration::ZERO, p, w1.clone()),
        (Duration::from_millis(5), p, w1.clone()),
        (Duration::from_millis(10), p, w2),
        (Duration::from_millis(15), p, w1),
        (Duration::from_millis(20), p, req(3, ClientOp::Read { key: 7 }, None)),
    ];
    let pr = probe(&mut w, script, Duration::from_secs(1));
    let probe_role = w.sim.role::<Probe>(pr).unwrap();
    let answers: Vec<&Reply> = probe_role.replies.iter().map(|(_, r)| r).filter(|r| r.id == 1).collect();
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert_eq!(answers[0].result, Ok(kairos_causal::ReplyBody::Written));
    assert_eq!(
        (answers[1].result.clone(), answers[1].operation_time),
        (answers[0].result.clone(), answers[0].operation_time)
    );
    assert_eq!(code(answers[2]), Some(codes::TRANSACTION_TOO_OLD));
    assert_eq!(reply(&w, pr, 3).result, Ok(kairos_causal::ReplyBody::Read(vec![70, 71])));
    assert_eq!(w.sim.role::<Member>(p).unwrap().stats().retried_writes, 2);
}
