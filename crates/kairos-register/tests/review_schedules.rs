//! Schedules from a review outside the suite (2026-12-07), each failing before its fix:
//! - An acknowledgement from a replica's previous life that arrived *after* another replica
//!   had reported that life's end was counted: the client checked each StoreAck's `lives` only
//!   against acknowledgements received before it. A write completed with one holder of three.
//! - A client that crashed and restarted numbered its operations from 1 again, so a reply to
//!   its previous incarnation's operation 1 (queued at a replica's dialer while it was down, or
//!   delayed) was taken for a reply to its new operation 1: a read missed a completed write.
//!
//! And from the review of those fixes: keeping every report of the phase, a stale report of
//! a replica's life voided each later acknowledgement of its current life, and a write held
//! by a majority never completed.

mod common;

use common::{boot, drain, msgs, query_round};
use kairos_core::harness::RoleHarness;
use kairos_core::NodeId;
use kairos_register::{Client, RegisterMsg, Replica};
use std::collections::VecDeque;
use std::time::Duration;

const A: NodeId = NodeId(0);
const B: NodeId = NodeId(1);
const C: NodeId = NodeId(2);
const W: NodeId = NodeId(3);
const R: NodeId = NodeId(4);

fn replicas() -> Vec<NodeId> {
    vec![A, B, C]
}

/// Three replicas, started and recovered from one another's empty states.
fn bootstrapped() -> Vec<RoleHarness<Replica>> {
    boot(&replicas()).0
}

/// The writer (process 0, at W) or the reader (process 1, at R).
fn client(process: u64, write: bool) -> RoleHarness<Client> {
    common::client(if write { W } else { R }, &replicas(), process, write)
}

#[test]
fn an_ack_of_an_ended_life_arriving_after_the_report_of_its_end_is_not_counted() {
    // Three replicas, bootstrapped (each recovers from the empty states of the others).
    let mut hs = bootstrapped();

    // The writer's query round, answered by all three.
    let mut w = client(0, true);
    let stores = query_round(&mut w, &mut hs, &replicas());
    assert_eq!(stores.len(), 3, "the store round goes to A, B and C");
    let store_for = |r: NodeId| stores.iter().find(|(_, to, _)| *to == r).unwrap().2.clone();

    // A stores the value and acknowledges it; the acknowledgement is still on the wire when A
    // crashes and loses its disk.
    let old_ack = msgs(A, hs[A.index()].deliver(W, store_for(A))).pop().unwrap().2;
    assert!(matches!(old_ack, RegisterMsg::StoreAck { .. }));
    hs[A.index()] = RoleHarness::new(A, Replica::new(A, &replicas()), 1_000);
    let out = hs[A.index()].restart(Replica::new(A, &replicas()));
    drain(&mut hs, &mut msgs(A, out).into()); // A recovers from B and C (neither holds the value yet)
    assert!(hs[A.index()].role().is_recovered());

    // B stores the value after it answered A's recovery: its ack reports A's new life.
    let b_ack = msgs(B, hs[B.index()].deliver(W, store_for(B))).pop().unwrap().2;
    w.deliver(B, b_ack);
    // Then A's acknowledgement from its previous life arrives (C never gets the store).
    w.deliver(A, old_ack);

    assert_eq!(w.role().last_ok(), None, "the write completed on B's ack and A's ended life's ack (only B holds it)");
    // C acknowledges; the client asks A and B again, and they acknowledge from their current
    // lives: the write completes, with a majority holding it.
    let c_ack = msgs(C, hs[C.index()].deliver(W, store_for(C))).pop().unwrap().2;
    w.deliver(C, c_ack);
    for (_, to, m) in msgs(W, w.advance(Duration::from_secs(61))) {
        for (_, _, ack) in msgs(to, hs[to.index()].deliver(W, m)) {
            w.deliver(to, ack);
        }
    }
    let (key, tag) = w.role().last_ok().expect("the write completed on its current lives' acknowledgements");
    let holders = hs.iter().filter(|h| h.role().get(key).tag >= tag).count();
    assert!(holders >= 2, "the write completed with tag {tag:?}, but only {holders} of 3 replicas hold it");
}

/// A client that crashes and restarts does not take replies to its previous incarnation's
/// operations for replies to its own.
#[test]
fn a_restarted_client_does_not_take_replies_to_its_previous_incarnation() {
    let mut hs = bootstrapped();

    // The reader's first incarnation queries key 0; A and B answer (empty), then it crashes
    // before the answers reach it.
    let mut r = client(1, false);
    r.start();
    let mut stale = Vec::new();
    for (_, to, m) in msgs(R, r.advance(Duration::from_millis(1))) {
        if to != C {
            stale.extend(msgs(to, hs[to.index()].deliver(R, m)));
        }
    }
    assert_eq!(stale.len(), 2);

    // A write of key 0 completes, everywhere.
    let mut w = client(0, true);
    w.start();
    let mut pending: VecDeque<(NodeId, NodeId, RegisterMsg)> = msgs(W, w.advance(Duration::from_millis(1))).into();
    while let Some((from, to, m)) = pending.pop_front() {
        if to == W {
            pending.extend(msgs(W, w.deliver(from, m)));
        } else {
            pending.extend(msgs(to, hs[to.index()].deliver(W, m)));
        }
    }
    let (_, written) = w.role().last_ok().expect("the write completed");

    // The reader restarts (same node, same process) and reads key 0 as its operation 1.
    r.restart(client(1, false).role);
    let fresh = msgs(R, r.advance(Duration::from_millis(1)));
    assert!(!fresh.is_empty(), "the new incarnation sent its query");
    // The old replies arrive first.
    let mut writeback = Vec::new();
    for (from, _, m) in stale {
        writeback.extend(msgs(R, r.deliver(from, m)));
    }
    for (_, to, m) in writeback {
        for (_, _, ack) in msgs(to, hs[to.index()].deliver(R, m)) {
            r.deliver(to, ack);
        }
    }
    assert_eq!(r.role().last_ok(), None, "replies to the previous incarnation's operation 1 were counted");
    // The new incarnation's own query round completes the read, with the write in it.
    let mut pending: VecDeque<(NodeId, NodeId, RegisterMsg)> = fresh.into();
    while let Some((from, to, m)) = pending.pop_front() {
        if to == R {
            pending.extend(msgs(R, r.deliver(from, m)));
        } else {
            pending.extend(msgs(to, hs[to.index()].deliver(R, m)));
        }
    }
    let (_, read) = r.role().last_ok().expect("the read completed");
    assert!(read >= written, "a read invoked after the write of tag {written:?} completed returned tag {read:?}");
}
/// C acknowledges the store while A is in its first life; the ack (reporting A's first life)
/// is delayed. A loses its disk and recovers from B and C, then stores the value and
/// acknowledges it from its new life. B is down for good (one fault of three). C's delayed
/// ack then arrives and its stale report of A's life is kept for the phase: every later
/// acknowledgement from A's *current* life is dropped as "ended", and the write never
/// completes though A and C, a majority, hold it. (It passed before the first fix.)
#[test]
fn a_stale_report_of_a_life_does_not_void_the_current_lifes_acks_forever() {
    let mut hs = bootstrapped();

    let mut w = client(0, true);
    let stores = query_round(&mut w, &mut hs, &replicas());
    assert_eq!(stores.len(), 3);
    let store_for = |r: NodeId| stores.iter().find(|(_, to, _)| *to == r).unwrap().2.clone();

    // C stores and acks in A's first life; the ack is delayed.
    let c_ack = msgs(C, hs[C.index()].deliver(W, store_for(C))).pop().unwrap().2;
    // A loses its disk and recovers from B and C.
    hs[A.index()] = RoleHarness::new(A, Replica::new(A, &replicas()), 1_000);
    let out = hs[A.index()].restart(Replica::new(A, &replicas()));
    drain(&mut hs, &mut msgs(A, out).into());
    assert!(hs[A.index()].role().is_recovered());
    // B crashes now and never comes back. A stores the value in its new life and acks.
    let a_ack = msgs(A, hs[A.index()].deliver(W, store_for(A))).pop().unwrap().2;
    w.deliver(A, a_ack);
    // C's delayed ack arrives: it names A's first life (true when C sent it).
    w.deliver(C, c_ack);
    // The client asks the replicas missing from its acks again; A and C (alive) answer.
    for _ in 0..20 {
        for (_, to, m) in msgs(W, w.advance(Duration::from_secs(61))) {
            if to != B {
                for (_, _, ack) in msgs(to, hs[to.index()].deliver(W, m)) {
                    w.deliver(to, ack);
                }
            }
        }
        if w.role().last_ok().is_some() {
            break;
        }
    }
    let holders = hs.iter().enumerate().filter(|(i, h)| *i != B.index() && h.role().get(0).value.is_some()).count();
    assert_eq!(holders, 2, "A (current life) and C hold the value");
    assert!(
        w.role().last_ok().is_some(),
        "the write never completes: every ack of A's current life is dropped as ended"
    );
}
