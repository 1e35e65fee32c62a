//! A register replica that forgets what it acknowledged: recovery protects the history, and
//! without it (a test-only unsafe switch) both the history checker and the cross-replica
//! invariant ([`acknowledged_tags_held_by_a_majority`]) catch it — the invariant at the event
//! the replica comes back, the checker only once a read returns stale data. A recovery that
//! does not persist what it adopted (another switch) is caught by the replica's own invariant
//! at the handler that adopted the value.

use std::time::Duration;

use kairos_check::{check, CheckReport, Model};
use kairos_core::{LatencyMatrix, NodeId, SimTime};
use kairos_harness::register::acknowledged_tags_held_by_a_majority;
use kairos_register::{Client, ClientConfig, RegisterMsg, Replica};
use kairos_sim::{Fault, Sim, SimConfig};

/// When replica B restarts without its disk.
const RESTART: SimTime = SimTime::from_millis(4_100);

/// How replica B comes back after losing its disk.
#[derive(Clone, Copy, PartialEq)]
enum Recovery {
    /// Adopts a majority's state, persisting it, before it serves.
    Safe,
    /// Serves at once with what it has (nothing): [`Replica::skip_recovery_unsafe`].
    Skipped,
    /// Recovers, but leaves what it adopted off the disk: [`Replica::unpersisted_recovery_unsafe`].
    Unpersisted,
}

/// Writes reach only replicas A and B (the writer's link to C is cut); B crashes, loses its
/// disk and restarts; then a reader that cannot reach A reads from the quorum {B, C}. With
/// recovery, B first re-learns the state from A and C and the read sees the last write.
/// Without it, B answers with empty state and the read returns the initial value after a
/// completed write. With `invariant`, the cross-replica check runs after every event.
fn amnesia_scenario(recovery: Recovery, invariant: bool) -> Sim<RegisterMsg> {
    let matrix = LatencyMatrix::gcp();
    let mut sim = Sim::new(SimConfig::new(5), matrix.clone());
    let replicas: Vec<NodeId> = (0..3).map(NodeId).collect();
    for region in ["sc", "fi", "br"] {
        let rs = replicas.clone();
        sim.add_node(matrix.region(region).unwrap(), kairos_clock::SimClock::perfect(), move |me| {
            let r = Replica::new(me, &rs);
            Box::new(match recovery {
                Recovery::Safe => r,
                Recovery::Skipped => r.skip_recovery_unsafe(),
                Recovery::Unpersisted => r.unpersisted_recovery_unsafe(),
            })
        });
    }
    let (writer, reader) = (NodeId(3), NodeId(4));
    let mut w = ClientConfig::new(replicas.clone(), 0);
    (w.keys, w.write_ratio, w.max_ops) = (1, 1.0, Some(5));
    let mut r = ClientConfig::new(replicas.clone(), 1);
    (r.keys, r.write_ratio, r.max_ops, r.start_delay) = (1, 0.0, Some(3), Duration::from_secs(5));
    for config in [w, r] {
        sim.add_node(matrix.region("sc").unwrap(), kairos_clock::SimClock::perfect(), move |_| {
            Box::new(Client::new(config.clone()))
        });
    }
    if invariant {
        sim.add_world_check(1, acknowledged_tags_held_by_a_majority(replicas, vec![writer, reader]));
    }
    sim.schedule(SimTime::ZERO, Fault::CutLink { from: writer, to: NodeId(2) });
    sim.schedule(SimTime::ZERO, Fault::CutLink { from: reader, to: NodeId(0) });
    sim.schedule(SimTime::from_secs(4), Fault::Crash(NodeId(1)));
    sim.schedule(SimTime::from_secs(4), Fault::WipeDisk(NodeId(1)));
    sim.schedule(RESTART, Fault::Restart(NodeId(1)));
    sim.run_until(SimTime::from_secs(10));
    sim
}

fn checked(sim: &Sim<RegisterMsg>) -> CheckReport {
    assert_eq!(sim.metric("register.ops_ok"), 8, "all 5 writes and 3 reads complete");
    check(sim.history(), Model::Linearizable).unwrap()
}

#[test]
fn recovery_protects_reads_after_a_replica_forgets() {
    let sim = amnesia_scenario(Recovery::Safe, true);
    assert_eq!(sim.violation(), None, "a recovering replica counts as holding what it forgot");
    let report = checked(&sim);
    assert!(report.valid, "{report}");
}

#[test]
fn an_amnesiac_replica_without_recovery_is_caught_by_the_checker() {
    let report = checked(&amnesia_scenario(Recovery::Skipped, false));
    assert!(!report.valid, "the stale read after amnesia went unnoticed:\n{report}");
}

#[test]
fn an_amnesiac_replica_without_recovery_breaks_the_invariant_when_it_comes_back() {
    let sim = amnesia_scenario(Recovery::Skipped, true);
    let v = sim.violation().expect("the forgotten write went unnoticed by the invariant");
    eprintln!("{v}");
    assert!(v.time >= RESTART && v.time < SimTime::from_secs(5), "{v}");
    assert!(v.what.contains("only 1 of 3 replicas hold it"), "{v}");
}

#[test]
fn a_recovery_that_does_not_persist_what_it_adopted_breaks_the_replica_invariant_at_once() {
    let sim = amnesia_scenario(Recovery::Unpersisted, false);
    let v = sim.violation().expect("the unpersisted recovery went unnoticed by the replica invariant");
    eprintln!("{v}");
    assert_eq!(v.node, Some(NodeId(1)), "{v}");
    // B's recovery replies come back within one round trip of its restart (sc–fi–br < 0.5 s).
    assert!(v.time > RESTART && v.time < RESTART + Duration::from_millis(500), "{v}");
    assert!(v.what.contains("but the disk has only"), "{v}");
}
