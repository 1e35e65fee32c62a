//! Swarm testing: every seed draws its own deployment (clients, keys, value size, in-flight
//! operations, clock skew, a memory-node crash or a client crash) and its history must be
//! linearizable. `SWARM_SEEDS=N` runs more seeds, `SWARM_HARD=1` harder ones.

use kairos_swarm::engine::Protocol;
use kairos_swarm::sim::SwarmRun;
use kairos_swarm::ycsb::Workload;
use rand::{Rng, SeedableRng};
use std::time::Duration;

fn draw(seed: u64) -> SwarmRun {
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // SWARM_HARD=1: more writers on fewer keys (the lock and repair paths), shorter runs.
    let hard = std::env::var("SWARM_HARD").is_ok();
    let clients = if hard { r.random_range(4..=8) } else { r.random_range(2..=6) };
    let ops = if hard { r.random_range(20..=40) } else { r.random_range(50..=150) };
    SwarmRun {
        protocol: if r.random_bool(0.8) { Protocol::SwarmKv } else { Protocol::DmAbd },
        workload: if r.random_bool(0.5) { Workload::YcsbA } else { Workload::YcsbB },
        clients,
        ops,
        inflight: r.random_range(1..=2),
        keys: if hard { 1 } else { r.random_range(1..=6) },
        value_size: [8, 64, 512][r.random_range(0..3)],
        warmup: r.random_range(0..200),
        clock_offset_max: Duration::from_nanos(r.random_range(0..=1_000_000)),
        clock_drift_ppm_max: r.random_range(0..=100),
        crash_node_at: r
            .random_bool(0.3)
            .then(|| (r.random_range(0..3), Duration::from_micros(r.random_range(5..200)))),
        crash_client_after: r.random_bool(0.3).then(|| (r.random_range(0..clients), r.random_range(1..ops))),
        piece_ns_max: r.random_range(1..=100),
        seed,
        ..SwarmRun::default()
    }
}

#[test]
fn random_deployments_are_linearizable() {
    let seeds: u64 = std::env::var("SWARM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(12);
    for seed in 1..=seeds {
        let run = draw(seed);
        let o = run.run().unwrap();
        assert_eq!(o.linearizable, Some(true), "seed {seed} ({run:?}):\n{}", o.check_report);
    }
}
