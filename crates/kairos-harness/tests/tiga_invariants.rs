//! Invariants checked at every event: a broken one stops the run at the event that broke
//! it, before any history anomaly could show it (or when none ever would).

use kairos_harness::tiga::Deployment;
use kairos_harness::{DeployError, TxnDeployment};
use kairos_workload::Placement;
use std::time::Duration;

/// Contended MicroBench with no headroom (timestamp = send time): leaders bump most
/// timestamps, so followers must adopt the leader's final timestamp for what they held.
fn contended(unsafe_follower_keeps_own_ts: bool) -> Deployment {
    let base = TxnDeployment {
        seed: 3,
        load_txn_per_s: 3_000.0,
        skew: 0.99,
        keys_per_shard: 1_000,
        placement: Placement::Separated,
        duration: Duration::from_secs(1),
        ..Default::default()
    };
    let mut d = Deployment { base, ..Deployment::default() };
    d.config.zero_headroom = true;
    d.config.unsafe_follower_keeps_own_ts = unsafe_follower_keeps_own_ts;
    d
}

#[test]
fn replicas_logs_agree_at_every_event_of_a_contended_run() {
    let out = contended(false).run(|_| {}).expect("no invariant is violated");
    assert!(out.history.len() > 1_000, "the run did work");
}

#[test]
fn a_follower_that_logs_its_own_timestamp_is_stopped_at_the_divergent_entry() {
    let Err(DeployError::Invariant(v)) = contended(true).run(|_| {}) else {
        panic!("the log-agreement check must catch a follower that keeps its own timestamp");
    };
    assert_eq!(v.node, None, "a cross-replica (world) check found it: {v}");
    assert!(v.what.contains("executed log position"), "{v}");
    assert_eq!(v.seed, 3);
    // Stopped early: the run did not go on to its end (1 s of load plus the drain).
    assert!(v.time.as_nanos() < 7_000_000_000, "{v}");
}
