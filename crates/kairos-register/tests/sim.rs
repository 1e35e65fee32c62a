//! The register in the simulated four-region deployment: every history is checked
//! linearizable, with and without faults, and the protocol's round trips are as designed.

use kairos_check::{check, Model};
use kairos_clock::ClockPreset;
use kairos_core::{LatencyMatrix, NodeId, SimTime};
use kairos_register::{Client, ClientConfig, RegisterMsg, Replica};
use kairos_sim::{fault, FaultRates, Sim, SimConfig};
use rand::SeedableRng;
use std::time::Duration;

/// Three replicas in sc / fi / br and one client per region (sc, fi, br, hk).
fn world(seed: u64, ops_per_client: u64) -> (Sim<RegisterMsg>, Vec<NodeId>) {
    let matrix = LatencyMatrix::gcp();
    let mut sim = Sim::new(SimConfig::new(seed), matrix.clone());
    let replicas: Vec<NodeId> = (0..3).map(NodeId).collect();
    let mut clock_rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for (i, region) in ["sc", "fi", "br"].iter().enumerate() {
        let rs = replicas.clone();
        let clock = ClockPreset::Chrony.sample(&mut clock_rng);
        sim.add_node(matrix.region(region).unwrap(), clock, move |me| Box::new(Replica::new(me, &rs)));
        assert_eq!(replicas[i], NodeId(i as u32));
    }
    for (i, region) in ["sc", "fi", "br", "hk"].iter().enumerate() {
        let mut config = ClientConfig::new(replicas.clone(), i as u64);
        config.max_ops = Some(ops_per_client);
        config.keys = 2;
        let clock = ClockPreset::Chrony.sample(&mut clock_rng);
        sim.add_node(matrix.region(region).unwrap(), clock, move |_| Box::new(Client::new(config.clone())));
    }
    (sim, replicas)
}

fn clients_done(sim: &Sim<RegisterMsg>) -> bool {
    (3..7).all(|n| sim.role::<Client>(NodeId(n)).is_some_and(|c| c.is_done()))
}

#[test]
fn fault_free_runs_are_linearizable_and_take_two_round_trips_per_operation() {
    let (mut sim, _) = world(1, 50);
    assert!(sim.run_until_pred(SimTime::from_secs(120), clients_done), "all clients finish");
    let report = check(sim.history(), Model::Linearizable).unwrap();
    assert!(report.valid, "{report}");
    assert_eq!(sim.metric("register.ops_ok"), 200);
    assert_eq!(sim.metric("register.ops_info"), 0);
    // ABD: a query round and a store round, no retransmission without faults.
    assert_eq!(sim.metric("register.round_trips"), 400);
}

#[test]
fn runs_under_random_faults_stay_linearizable_and_make_progress_after_healing() {
    for seed in 1..=6u64 {
        let (mut sim, replicas) = world(seed, 1_000_000);
        let plan =
            fault::random_plan(seed, &replicas, SimTime::from_secs(1), SimTime::from_secs(20), &FaultRates::default());
        sim.schedule_all(plan.clone());
        sim.run_until(SimTime::from_secs(20));
        let ok_before = sim.metric("register.ops_ok");
        // Liveness: after every fault is repaired, clients make progress again.
        sim.run_until(SimTime::from_secs(30));
        assert!(sim.metric("register.ops_ok") > ok_before + 20, "seed {seed}: no progress after healing");
        let report = check(sim.history(), Model::Linearizable).unwrap();
        let faults: Vec<String> = plan.iter().map(|f| format!("{} {}", f.at, f.fault)).collect();
        assert!(report.valid, "seed {seed} violated linearizability under {faults:?}:\n{report}");
    }
}

#[test]
fn a_replica_that_restarts_with_its_disk_serves_at_once_with_everything_it_acknowledged() {
    let (mut sim, _) = world(9, 1_000_000);
    sim.run_until(SimTime::from_secs(5));
    let stored = sim.stored(NodeId(0)).records.len();
    assert!(stored > 10, "stores were persisted before they were acknowledged: {stored}");
    sim.schedule(SimTime::from_secs(5), kairos_sim::Fault::Crash(NodeId(0)));
    sim.schedule(SimTime::from_secs(6), kairos_sim::Fault::Restart(NodeId(0)));
    sim.run_until(SimTime::from_secs(6) + Duration::from_micros(1));
    assert!(sim.role::<Replica>(NodeId(0)).unwrap().is_recovered(), "recovered from its disk, not from peers");
    sim.run_until(SimTime::from_secs(8));
    assert_eq!(sim.metric("register.recoveries"), 3, "only the 3 initial recoveries from peers");
    assert!(check(sim.history(), Model::Linearizable).unwrap().valid);
}

#[test]
fn a_replica_that_lost_its_disk_recovers_before_it_answers() {
    let (mut sim, _) = world(9, 1_000_000);
    sim.run_until(SimTime::from_secs(5));
    sim.schedule(SimTime::from_secs(5), kairos_sim::Fault::Crash(NodeId(0)));
    sim.schedule(SimTime::from_secs(5), kairos_sim::Fault::WipeDisk(NodeId(0)));
    sim.schedule(SimTime::from_secs(6), kairos_sim::Fault::Restart(NodeId(0)));
    sim.run_until(SimTime::from_secs(6) + Duration::from_micros(1));
    assert!(!sim.role::<Replica>(NodeId(0)).unwrap().is_recovered());
    sim.run_until(SimTime::from_secs(8));
    assert!(sim.role::<Replica>(NodeId(0)).unwrap().is_recovered());
    assert!(sim.metric("register.recoveries") >= 4, "3 initial recoveries and the restart's");
    assert!(check(sim.history(), Model::Linearizable).unwrap().valid);
}
