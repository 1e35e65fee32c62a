//! A third review's schedules (2026-12-07) of the register's lives, each failing before its
//! fix: a replayed recovery request after a restart revived an ended life (the nonces a
//! replica had seen were not on its disk); and a replica that missed another's recovery
//! reported its ended life forever, so that, with the client counting only acknowledgements
//! that agree, no write completed while two of five replicas were down.

mod common;

use common::{boot, drain, drain_if, msgs, query_round, Msg};
use kairos_core::harness::RoleHarness;
use kairos_core::NodeId;
use kairos_register::{Client, RegisterMsg, Replica};
use std::collections::VecDeque;
use std::time::Duration;

const A: NodeId = NodeId(0);
const B: NodeId = NodeId(1);
const C: NodeId = NodeId(2);
const D: NodeId = NodeId(3);
const E: NodeId = NodeId(4);
const W: NodeId = NodeId(9);

fn writer(replicas: &[NodeId]) -> RoleHarness<Client> {
    common::client(W, replicas, 0, true)
}

/// `nonces_seen` (the guard against a replayed RecoverRequest of an earlier recovery)
/// is memory only: after B restarts with its disk it is empty, and a delayed duplicate of A's
/// *first-start* RecoverRequest makes B record (and persist) A's first life again, ended
/// though it is. B's acknowledgement then agrees with A's acknowledgement from that ended life,
/// and the write completes on A's forgotten ack and B's: one holder of three.
#[test]
fn a_replayed_recover_request_after_a_restart_does_not_revive_an_ended_life() {
    let reps = vec![A, B, C];
    let (mut hs, first) = boot(&reps);
    // A's RecoverRequest to B at the first start, duplicated by the network.
    let replay = first
        .iter()
        .find(|(f, t, m)| *f == A && *t == B && matches!(m, RegisterMsg::RecoverRequest { .. }))
        .unwrap()
        .2
        .clone();

    let mut w = writer(&reps);
    let stores = query_round(&mut w, &mut hs, &reps);
    assert_eq!(stores.len(), 3);
    let store_for = |r: NodeId| stores.iter().find(|(_, to, _)| *to == r).unwrap().2.clone();

    // A acknowledges from its first life; the client counts it.
    let a_ack = msgs(A, hs[A.index()].deliver(W, store_for(A))).pop().unwrap().2;
    w.deliver(A, a_ack);
    // A loses its disk and recovers from B and C (neither holds the value).
    hs[A.index()] = RoleHarness::new(A, Replica::new(A, &reps), 1_000);
    let mut q: VecDeque<Msg> = msgs(A, hs[A.index()].restart(Replica::new(A, &reps))).into();
    drain(&mut hs, &mut q);
    assert!(hs[A.index()].role().is_recovered());
    // B crashes and restarts with its disk (not amnesia: it serves at once).
    let _ = hs[B.index()].restart(Replica::new(B, &reps));
    assert!(hs[B.index()].role().is_recovered());
    // The duplicate of A's first-start request arrives at B (its reply is ignored by A).
    let _ = hs[B.index()].deliver(A, replay);
    // B stores the value; its ack reports A's first life.
    let b_ack = msgs(B, hs[B.index()].deliver(W, store_for(B))).pop().unwrap().2;
    w.deliver(B, b_ack);

    assert_eq!(w.role().last_ok(), None, "the write completed on A's ended life's ack and B's (one holder of three)");
}

/// Five replicas. A loses its disk and recovers from B, C and D; its request to E
/// is lost (E was down), and A did not ask again once recovered, so E kept reporting A's
/// first life. B and C then crash for good (two faults of five). A, D and E, a majority, are
/// up and every message among them is delivered; before the fix A's and E's acknowledgements
/// always disagreed (each round both dropped and asked again) and no write completed. Now A
/// tells E of its new life on its retry timer.
#[test]
fn a_replica_that_missed_a_recovery_does_not_block_writes() {
    let reps = vec![A, B, C, D, E];
    let (mut hs, _) = boot(&reps);
    hs[A.index()] = RoleHarness::new(A, Replica::new(A, &reps), 1_000);
    let mut q: VecDeque<Msg> = msgs(A, hs[A.index()].restart(Replica::new(A, &reps))).into();
    drain_if(&mut hs, &mut q, |(_, to, _)| *to != E);
    assert!(hs[A.index()].role().is_recovered(), "A recovered from B, C and D");

    // B and C are down for good.
    let up = [A, D, E];
    let mut w = writer(&reps);
    let stores = query_round(&mut w, &mut hs, &up);
    assert_eq!(stores.len(), 5);
    let mut round: Vec<Msg> = stores;
    for _ in 0..50 {
        for (_, to, m) in round.drain(..) {
            if up.contains(&to) {
                for (_, _, ack) in msgs(to, hs[to.index()].deliver(W, m)) {
                    let _ = w.deliver(to, ack);
                }
            }
        }
        if w.role().last_ok().is_some() {
            break;
        }
        // Time passes for A too: it tells the peers that missed its recovery (E, now up).
        let mut q: VecDeque<Msg> = msgs(A, hs[A.index()].advance(Duration::from_secs(61))).into();
        drain_if(&mut hs, &mut q, |(_, to, _)| up.contains(to));
        round = msgs(W, w.advance(Duration::from_secs(61)));
    }
    let holders = up.iter().filter(|r| hs[r.index()].role().get(0).value.is_some()).count();
    assert_eq!(holders, 3, "A, D and E hold the value");
    assert!(w.role().last_ok().is_some(), "50 rounds: A's and E's acks always disagree; the write never completes");
}

/// As above, but A restarts with its disk before its retry timer fires: it serves at once and
/// (before the fix) no longer told E of its new life, so A's and E's acknowledgements always
/// disagreed and no write completed. A restarted replica now announces its life again to every
/// peer, until each has answered.
#[test]
fn a_replica_restarted_with_its_disk_still_tells_the_peers_that_missed_its_recovery() {
    let reps = vec![A, B, C, D, E];
    let (mut hs, _) = boot(&reps);
    hs[A.index()] = RoleHarness::new(A, Replica::new(A, &reps), 1_000);
    let mut q: VecDeque<Msg> = msgs(A, hs[A.index()].restart(Replica::new(A, &reps))).into();
    drain_if(&mut hs, &mut q, |(_, to, _)| *to != E);
    assert!(hs[A.index()].role().is_recovered(), "A recovered from B, C and D");
    // A crashes and restarts with its disk; B and C are down for good.
    let up = [A, D, E];
    let mut q: VecDeque<Msg> = msgs(A, hs[A.index()].restart(Replica::new(A, &reps))).into();
    assert!(hs[A.index()].role().is_recovered(), "A serves at once from its disk");
    drain_if(&mut hs, &mut q, |(_, to, _)| up.contains(to));

    let mut w = writer(&reps);
    let mut round = query_round(&mut w, &mut hs, &up);
    for _ in 0..50 {
        for (_, to, m) in round.drain(..) {
            if up.contains(&to) {
                for (_, _, ack) in msgs(to, hs[to.index()].deliver(W, m)) {
                    let _ = w.deliver(to, ack);
                }
            }
        }
        if w.role().last_ok().is_some() {
            break;
        }
        let mut q: VecDeque<Msg> = msgs(A, hs[A.index()].advance(Duration::from_secs(61))).into();
        drain_if(&mut hs, &mut q, |(_, to, _)| up.contains(to));
        round = msgs(W, w.advance(Duration::from_secs(61)));
    }
    assert!(w.role().last_ok().is_some(), "50 rounds: A's and E's acks always disagree; the write never completes");
}
