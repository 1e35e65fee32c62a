//! A register replica that forgets what it acknowledged: recovery protects the history, and
//! without it (a test-only unsafe switch) both the history checker and the cross-replica
//! invariant ([`acknowledged_tags_held_by_a_majority`]) catch it — the invariant at the event
//! the replica comes back, the checker only once a read returns stale data.

use std::time::Duration;

use kairos_check::{check, CheckReport, Model};
use kairos_core::{LatencyMatrix, NodeId, SimTime};
use kairos_harness::register::acknowledged_tags_held_by_a_majority;
use kairos_register::{Client, ClientConfig, RegisterMsg, Replica};
use kairos_sim::{Fault, Sim, SimConfig};

/// When replica B restarts without its disk.
const RESTART: SimTime = SimTime::from_millis(4_100);

/// Writes reach only replicas A and B (the writer's link to C is cut); B crashes, loses its
/// disk and restarts; then a reader that cannot reach A reads from the quorum {B, C}. With
/// recovery, B first re-learns the state from A and C and the read sees the last write.
/// Without it, B answers with empty state and the read returns the initial value after a
/// completed write. With `invariant`, the cross-replica check runs after every event.
fn amnesia_scenario(recover: bool, invariant: bool) -> Sim<RegisterMsg> {
    let matrix = LatencyMatrix::gcp();
    let mut sim = Sim::new(SimConfig::new(5), matrix.clone());
    let replicas: Vec<NodeId> = (0..3).map(NodeId).collect();
    for region in ["sc", "fi", "br"] {
        let rs = replicas.clone();
        sim.add_node(matrix.region(region).unwrap(), kairos_clock::SimClock::perfect(), move |me| {
            let r = Replica::new(me, &rs);
            Box::new(if recover { r } else { r.skip_recovery_unsafe() })
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
    let sim = amnesia_scenario(true, true);
    assert_eq!(sim.violation(), None, "a recovering replica counts as holding what it forgot");
    let report = checked(&sim);
    assert!(report.valid, "{report}");
}

#[test]
fn an_amnesiac_replica_without_recovery_is_caught_by_the_checker() {
    let report = checked(&amnesia_scenario(false, false));
    assert!(!report.valid, "the stale read after amnesia went unnoticed:\n{report}");
}

#[test]
fn an_amnesiac_replica_without_recovery_breaks_the_invariant_when_it_comes_back() {
    let sim = amnesia_scenario(false, true);
    let v = sim.violation().expect("the forgotten write went unnoticed by the invariant");
    eprintln!("{v}");
    assert!(v.time >= RESTART && v.time < SimTime::from_secs(5), "{v}");
    assert!(v.what.contains("only 1 of 3 replicas hold it"), "{v}");
}
