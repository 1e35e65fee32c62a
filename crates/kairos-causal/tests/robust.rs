//! No handler panics on any message content.

use kairos_causal::msg::{Entry, Op, OpPos, PeerBody, PeerMsg};
use kairos_causal::{CausalMsg, ClientOp, Member, MemberConfig, ReadConcern, Request, WriteConcern};
use kairos_clock::{ClusterTime, Signature, SignedClusterTime, TimeProof};
use kairos_core::{Ctx, LocalTime, NodeId, Process, Rng, TimerId};
use rand::{Rng as _, SeedableRng};
use std::sync::Arc;

fn ct(rng: &mut Rng) -> ClusterTime {
    match rng.random_range(0..3) {
        0 => ClusterTime::new(rng.random(), rng.random()),
        1 => ClusterTime::new(1_767_225_600 + rng.random_range(0..5), rng.random_range(0..5)),
        _ => ClusterTime::ZERO,
    }
}

fn signed(rng: &mut Rng) -> Option<SignedClusterTime> {
    let time = ct(rng);
    match rng.random_range(0..3) {
        0 => None,
        1 => Some(SignedClusterTime::unsigned(time)),
        _ => Some(SignedClusterTime {
            time,
            signature: Some(Signature { hash: TimeProof([rng.random(); 20]), key_id: rng.random() }),
        }),
    }
}

#[test]
fn random_messages_never_panic_a_member() {
    let members: Vec<NodeId> = (0..3).map(NodeId).collect();
    let cfg = Arc::new(MemberConfig::new(members));
    let mut rng = Rng::seed_from_u64(5);
    for round in 0..20 {
        let mut m = Member::new(cfg.clone(), round % 3);
        let mut effects = Vec::new();
        let mut node_rng = Rng::seed_from_u64(round as u64);
        let mut now = LocalTime::from_secs(1_767_225_600);
        m.on_start(&mut Ctx::new(NodeId(round % 3), now, &mut node_rng, &mut effects));
        for _ in 0..2_000 {
            now = now + std::time::Duration::from_millis(rng.random_range(0..300));
            let entries: Vec<Entry> = (0..rng.random_range(0..4))
                .map(|_| Entry {
                    optime: ct(&mut rng),
                    term: rng.random_range(0..4),
                    op: Op::Append { key: 1, value: rng.random() },
                    origin: None,
                })
                .collect();
            let pos = OpPos { optime: ct(&mut rng), term: rng.random_range(0..4) };
            let body = match rng.random_range(0..7) {
                0 => PeerBody::RequestVote { last: pos, dry_run: rng.random() },
                1 => PeerBody::VoteReply { granted: rng.random(), dry_run: rng.random() },
                2 => PeerBody::Heartbeat { commit_point: ct(&mut rng) },
                3 => PeerBody::Pull { last: pos },
                4 => PeerBody::Batch {
                    after: pos,
                    entries,
                    commit_point: ct(&mut rng),
                    rollback_to: Some(ct(&mut rng)).filter(|_| rng.random()),
                },
                5 => PeerBody::NoopRequest { at_least: ct(&mut rng) },
                _ => PeerBody::HeartbeatAck { applied: pos },
            };
            let msg = if rng.random_bool(0.3) {
                CausalMsg::Request(Request {
                    id: rng.random(),
                    op: if rng.random() {
                        ClientOp::Read { key: rng.random() }
                    } else {
                        ClientOp::Append { key: 1, value: rng.random() }
                    },
                    read_concern: if rng.random() { ReadConcern::Local } else { ReadConcern::Majority },
                    write_concern: if rng.random() { WriteConcern::W1 } else { WriteConcern::Majority },
                    after_cluster_time: Some(ct(&mut rng)).filter(|_| rng.random()),
                    cluster_time: signed(&mut rng),
                    max_time_ms: rng.random(),
                    secondary_ok: rng.random(),
                    term: rng.random_bool(0.5).then(|| rng.random_range(0..5)),
                })
            } else {
                CausalMsg::Peer(PeerMsg {
                    term: rng.random_range(0..5),
                    cluster_time: signed(&mut rng),
                    body,
                    seq: rng.random_range(0..8),
                })
            };
            let from = NodeId(rng.random_range(0..5));
            let mut ctx = Ctx::new(NodeId(round % 3), now, &mut node_rng, &mut effects);
            if rng.random_bool(0.1) {
                m.on_timer(&mut ctx, TimerId(rng.random_range(0..4)));
            } else {
                m.on_message(&mut ctx, from, msg);
            }
            effects.clear();
        }
        // The oplog stays ordered by optime whatever arrived.
        assert!(m.oplog().windows(2).all(|w| w[0].optime < w[1].optime));
    }
}
