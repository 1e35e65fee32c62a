//! A third review's schedules (2026-12-07) of the register's lives, each failing before its
//! fix: a replayed recovery request after a restart revived an ended life (the nonces a
//! replica had seen were not on its disk); and a replica that missed another's recovery
//! reported its ended life forever, so that, with the client counting only acknowledgements
//! that agree, no write completed while two of five replicas were down.
//!
//! And from the review of those fixes (2026-12-08): with unordered lives, a delayed request of
//! an ended life made a peer report it again (a write completed with two holders of five, and
//! then no write completed at all); and a restarted replica's announcement was answered with
//! every peer's whole store. And from the review of ordered lives: a recovery took a reply cut
//! at `RECOVERY_KEYS_MAX` keys for a peer's whole state.

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

/// Runs writer `w`'s store `round` and up to 50 retries of it, only the replicas in `up`
/// reachable, time passing for A too between them (its retry timer tells the peers that have
/// not answered it its life), until the write completes.
fn write_among(w: &mut RoleHarness<Client>, hs: &mut [RoleHarness<Replica>], mut round: Vec<Msg>, up: &[NodeId]) {
    for _ in 0..50 {
        for (_, to, m) in round.drain(..) {
            if up.contains(&to) {
                for (_, _, ack) in msgs(to, hs[to.index()].deliver(W, m)) {
                    let _ = w.deliver(to, ack);
                }
            }
        }
        if w.role().last_ok().is_some() {
            return;
        }
        let mut q: VecDeque<Msg> = msgs(A, hs[A.index()].advance(Duration::from_secs(61))).into();
        drain_if(hs, &mut q, |(_, to, _)| up.contains(to));
        round = msgs(W, w.advance(Duration::from_secs(61)));
    }
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
    let mut hs = recovered_without_e(&reps);

    // B and C are down for good.
    let up = [A, D, E];
    let mut w = writer(&reps);
    let round = query_round(&mut w, &mut hs, &up);
    assert_eq!(round.len(), 5);
    write_among(&mut w, &mut hs, round, &up);
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
    let mut hs = recovered_without_e(&reps);
    // A crashes and restarts with its disk; B and C are down for good.
    let up = [A, D, E];
    let mut q: VecDeque<Msg> = msgs(A, hs[A.index()].restart(Replica::new(A, &reps))).into();
    assert!(hs[A.index()].role().is_recovered(), "A serves at once from its disk");
    drain_if(&mut hs, &mut q, |(_, to, _)| up.contains(to));

    let mut w = writer(&reps);
    let round = query_round(&mut w, &mut hs, &up);
    write_among(&mut w, &mut hs, round, &up);
    assert!(w.role().last_ok().is_some(), "50 rounds: A's and E's acks always disagree; the write never completes");
}

/// Five replicas, booted; then A loses its disk and recovers from B, C and D (E misses it).
fn recovered_without_e(reps: &[NodeId]) -> Vec<RoleHarness<Replica>> {
    let (mut hs, _) = boot(reps);
    hs[A.index()] = RoleHarness::new(A, Replica::new(A, reps), 1_000);
    let mut q: VecDeque<Msg> = msgs(A, hs[A.index()].restart(Replica::new(A, reps))).into();
    drain_if(&mut hs, &mut q, |(_, to, _)| *to != E);
    assert!(hs[A.index()].role().is_recovered(), "A recovered from B, C and D");
    hs
}

/// Five replicas: A loses its disk and recovers from B, C and D (E misses it), then restarts
/// with its disk and announces its life; the announcement to E is returned, delayed, the
/// others delivered.
fn announced_late_to_e(reps: &[NodeId]) -> (Vec<RoleHarness<Replica>>, Msg) {
    let mut hs = recovered_without_e(reps);
    let announce = msgs(A, hs[A.index()].restart(Replica::new(A, reps)));
    let is_recover_request = |m: &Msg| matches!(m.2, RegisterMsg::RecoverRequest { .. });
    let delayed = announce.iter().find(|m| m.1 == E && is_recover_request(m)).cloned().expect("A announces to E");
    let mut q: VecDeque<Msg> = announce.into_iter().filter(|m| m.1 != E).collect();
    drain(&mut hs, &mut q);
    (hs, delayed)
}

/// From the review of that fix (2026-12-08): lives were unordered random nonces, and a peer
/// took any nonce it had not seen for a *new* life. Five replicas: A loses its disk and
/// recovers life n1 (E misses it); A restarts with its disk and announces n1, the copy to E
/// delayed. A acknowledges a write W's store in life n1, then loses its disk again and recovers
/// n2 from C, D and E (none holds W). The delayed announcement of n1 reaches E, which took it
/// for A's newest life; W's stores reach B (which missed n2) and E, and the acks of A (n1), B
/// and E agreed: W completed with two holders of five. Now lives are ordered (epoch, nonce) and
/// E refuses the older one. (The same came from a delayed first request of a recovery, before
/// any announcement existed.)
#[test]
fn a_delayed_announcement_of_an_ended_life_is_refused() {
    let reps = vec![A, B, C, D, E];
    let (mut hs, delayed) = announced_late_to_e(&reps);
    let n1 = hs[A.index()].role().life();

    let mut w = writer(&reps);
    let stores = query_round(&mut w, &mut hs, &reps);
    assert_eq!(stores.len(), 5);
    let store_for = |r: NodeId| stores.iter().find(|(_, to, _)| *to == r).unwrap().2.clone();
    let a_ack = msgs(A, hs[A.index()].deliver(W, store_for(A))).pop().unwrap().2;
    let _ = w.deliver(A, a_ack);

    // A loses its disk again and recovers from C, D and E (B's messages are lost).
    hs[A.index()] = RoleHarness::new(A, Replica::new(A, &reps), 2_000);
    let mut q: VecDeque<Msg> = msgs(A, hs[A.index()].restart(Replica::new(A, &reps))).into();
    drain_if(&mut hs, &mut q, |(from, to, _)| *to != B && *from != B);
    assert!(hs[A.index()].role().is_recovered(), "A recovered from C, D and E");
    assert!(hs[A.index()].role().life() > n1, "the new life is numbered above the ended one");
    assert_eq!(hs[A.index()].role().get(0).value, None, "none of C, D, E held W's value");

    let _ = hs[E.index()].deliver(A, delayed.2);
    for r in [B, E] {
        for (_, _, ack) in msgs(r, hs[r.index()].deliver(W, store_for(r))) {
            let _ = w.deliver(r, ack);
        }
    }
    let holders = reps.iter().filter(|r| hs[r.index()].role().get(0).value.is_some()).count();
    assert!(
        w.role().last_ok().is_none() || holders >= 3,
        "W completed (acks of A's ended life, B and E) with {holders} holders of 5"
    );
}

/// The same schedule as a liveness failure: once E recorded the ended life again, A's
/// announcements of its new life were "already seen" at E, and with B and C down for good
/// A's and E's acks disagreed forever.
#[test]
fn a_delayed_announcement_does_not_block_writes_forever() {
    let reps = vec![A, B, C, D, E];
    let (mut hs, delayed) = announced_late_to_e(&reps);
    hs[A.index()] = RoleHarness::new(A, Replica::new(A, &reps), 2_000);
    let mut q: VecDeque<Msg> = msgs(A, hs[A.index()].restart(Replica::new(A, &reps))).into();
    drain(&mut hs, &mut q);
    assert!(hs[A.index()].role().is_recovered());
    let _ = hs[E.index()].deliver(A, delayed.2);

    let up = [A, D, E];
    let mut q: VecDeque<Msg> = msgs(A, hs[A.index()].restart(Replica::new(A, &reps))).into();
    drain_if(&mut hs, &mut q, |(_, to, _)| up.contains(to));
    let mut w = writer(&reps);
    let round = query_round(&mut w, &mut hs, &up);
    write_among(&mut w, &mut hs, round, &up);
    assert!(w.role().last_ok().is_some(), "50 rounds: E reports A's ended life forever; no write completes");
}

/// A replica restarted with its disk tells its peers its life without asking for their state
/// (each reply used to carry the peer's whole store, up to 65,536 keys, all discarded).
#[test]
fn an_announcement_is_not_answered_with_the_whole_store() {
    let reps = vec![A, B, C, D, E];
    let (mut hs, _) = boot(&reps);
    for key in 0..2_000u64 {
        let state = kairos_register::Versioned { tag: kairos_register::Tag { ts: 1, writer: 9 }, value: Some(key) };
        for r in &reps {
            let _ = hs[r.index()].deliver(W, RegisterMsg::Store { op: key, key, state });
        }
    }
    let q = msgs(A, hs[A.index()].restart(Replica::new(A, &reps)));
    assert!(hs[A.index()].role().is_recovered());
    assert_eq!(q.len(), 4, "A tells its four peers: {q:?}");
    let mut entries = 0;
    for (from, to, m) in q {
        for (_, _, reply) in msgs(to, hs[to.index()].deliver(from, m)) {
            if let RegisterMsg::RecoverReply { entries: e, .. } = reply {
                entries += e.len();
            }
        }
    }
    assert_eq!(entries, 0, "a restart with the disk pulled {entries} store entries over the network");
}

/// From the review of ordered lives (2026-12-08): a recovery reply carried at most
/// `RECOVERY_KEYS_MAX` keys, the lowest, and the recovering replica took it for the peer's
/// whole state. Three replicas hold 65,536 keys; a write on a key above them completes with
/// A's and B's acks; A loses its disk and recovers from B and C: it came back without the
/// written key, held then by B alone. The state now travels in pages.
#[test]
fn a_recovery_takes_every_key_past_one_reply() {
    let reps = vec![A, B, C];
    let (mut hs, _) = boot(&reps);
    let loader = NodeId(7);
    let filler = kairos_register::Versioned { tag: kairos_register::Tag { ts: 1, writer: loader.0 }, value: Some(1) };
    let keys = kairos_register::RECOVERY_KEYS_MAX as u64;
    for key in 0..keys {
        for r in &reps {
            let _ = hs[r.index()].deliver(loader, RegisterMsg::Store { op: key, key, state: filler });
        }
    }
    let mut c = kairos_register::ClientConfig::new(reps.clone(), 0);
    c.keys = u64::MAX;
    c.write_ratio = 1.0;
    c.max_ops = Some(1);
    c.retry = Duration::from_secs(60);
    c.op_timeout = Duration::from_secs(6000);
    c.start_delay = Duration::from_millis(1);
    let mut w = RoleHarness::new(W, Client::new(c), 42);
    let stores = query_round(&mut w, &mut hs, &reps);
    let RegisterMsg::Store { key, .. } = &stores[0].2 else { panic!("not a store: {:?}", stores[0]) };
    let key = *key;
    assert!(key >= keys, "the written key {key} lies above the first {keys}");
    for (_, to, m) in stores {
        if to != C {
            for (_, _, ack) in msgs(to, hs[to.index()].deliver(W, m)) {
                let _ = w.deliver(to, ack);
            }
        }
    }
    let (_, tag) = w.role().last_ok().expect("the write completed with A and B");

    hs[A.index()] = RoleHarness::new(A, Replica::new(A, &reps), 1_000);
    let mut q: VecDeque<Msg> = msgs(A, hs[A.index()].restart(Replica::new(A, &reps))).into();
    drain(&mut hs, &mut q);
    assert!(hs[A.index()].role().is_recovered());
    let holders = reps.iter().filter(|r| hs[r.index()].role().get(key).tag >= tag).count();
    assert!(holders >= 2, "the write of key {key} completed, but after A's recovery {holders} of 3 hold it");
    assert!((0..keys).step_by(997).all(|k| hs[A.index()].role().get(k).value == Some(1)), "A has the first page");
}
