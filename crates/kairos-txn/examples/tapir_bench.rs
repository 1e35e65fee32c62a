//! Measures Tapir in the simulator (not a test: numbers depend on the machine under the
//! measured CPU model).
//!
//! ```text
//! cargo run --release -p kairos-txn --example tapir_bench -- saturation 5000 10000 20000 40000
//! cargo run --release -p kairos-txn --example tapir_bench -- latency
//! ```
//!
//! `saturation`: Tapir at each offered load (txn/s) under `CpuModel::Measured { scale: 1.0,
//! floor: 0 }` (handlers cost their real CPU time): throughput, commit rate, fast share,
//! median latency. `latency`: per-region median latency at 1,000 txn/s, Tapir vs Tiga, on the
//! identical bench (default CPU model).
//!
//! On the shared 2-core development machine (so only indicative), MicroBench skew 0.5:
//! throughput follows the offered load up to ~40k txn/s (offered 45k → 38.9k, 50k → 40.5k;
//! the busiest replica's CPU ~0.7 busy, coordinators ~0.25), then collapses (60k → 30.6k,
//! 80k → 23.9k, median latency ~1 s): queueing delays outlast the wait for a super quorum,
//! shards fall to the slow path, whose finalize round adds load. Tiga's paper: Tapir 44.2k.

use std::collections::BTreeMap;
use std::time::Duration;

use kairos_core::{NodeId, OpType, SimTime};
use kairos_sim::CpuModel;
use kairos_txn::deploy::RunOutcome;
use kairos_txn::tapir::{analytic_latency, Tapir, TapirConfig};
use kairos_txn::Bench;

/// Latencies (ms) of committed transactions by region, and commit times (ns).
fn latencies(out: &RunOutcome) -> (BTreeMap<String, Vec<f64>>, Vec<u64>) {
    let mut open = BTreeMap::new();
    let mut by_region: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut commits = Vec::new();
    for r in &out.history {
        match r.event.op_type {
            OpType::Invoke => {
                open.insert(r.event.process, r.time);
            }
            OpType::Ok => {
                if let Some(t) = open.remove(&r.event.process) {
                    let region = out.region_of_process(r.event.process).unwrap_or("?").to_string();
                    by_region.entry(region).or_default().push((r.time - t) as f64 / 1e6);
                    commits.push(r.time);
                }
            }
            _ => {
                open.remove(&r.event.process);
            }
        }
    }
    for v in by_region.values_mut() {
        v.sort_by(f64::total_cmp);
    }
    (by_region, commits)
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn saturation(loads: &[f64]) {
    println!(
        "load_txn_per_s,throughput_txn_per_s,commit_rate,fast_share,p50_ms,p90_ms,failed,\
         replica_busy_max,coordinator_busy_max,wall_s"
    );
    for &load in loads {
        let bench = Bench {
            load_txn_per_s: load,
            duration: Duration::from_secs(3),
            drain: Duration::from_secs(3),
            cpu: CpuModel::Measured { scale: 1.0, floor: Duration::ZERO },
            ..Bench::default()
        };
        let out = bench.run_peer::<Tapir>(&TapirConfig::default(), |_| {}).unwrap();
        // Busy share of the loaded period (CPU time charged / duration), from a second,
        // identical build: which role saturates first.
        let (replica_busy, coordinator_busy) = {
            let mut world = bench.build::<Tapir>(&TapirConfig::default()).unwrap();
            world.sim.run_until(SimTime::ZERO + bench.duration);
            let servers = world.topology.shard_count() * world.topology.replicas_per_shard();
            let busy = |n: usize| world.sim.busy_time(NodeId(n as u32)).as_secs_f64() / bench.duration.as_secs_f64();
            let max = |r: std::ops::Range<usize>| r.map(busy).fold(0.0, f64::max);
            (max(0..servers), max(servers..world.sim.node_count()))
        };
        let (by_region, commits) = latencies(&out);
        let mut all: Vec<f64> = by_region.values().flatten().copied().collect();
        all.sort_by(f64::total_cmp);
        // Throughput: commits in [1 s, duration) of true time, per second.
        let (from, to) = (1_000_000_000u64, bench.duration.as_nanos() as u64);
        let window = commits.iter().filter(|t| (from..to).contains(*t)).count() as f64;
        let t = out.totals();
        println!(
            "{load},{:.0},{:.3},{:.3},{:.1},{:.1},{},{replica_busy:.2},{coordinator_busy:.2},{:.1}",
            window / ((to - from) as f64 / 1e9),
            t.commit_rate(),
            t.committed_fast as f64 / t.committed.max(1) as f64,
            pct(&all, 0.5),
            pct(&all, 0.9),
            t.failed,
            out.wall.as_secs_f64()
        );
    }
}

fn latency() {
    let bench = Bench { load_txn_per_s: 1_000.0, duration: Duration::from_secs(5), ..Bench::default() };
    let tapir = bench.run_peer::<Tapir>(&TapirConfig::default(), |_| {}).unwrap();
    let tiga = bench.run_tiga(|_| {}).unwrap();
    let (tapir_lat, _) = latencies(&tapir);
    let (tiga_lat, _) = latencies(&tiga);
    println!("region,tapir_p50_ms,tapir_analytic_ms,tiga_p50_ms,tapir_fast_share");
    for (region, s) in tapir.stats_by_region() {
        println!(
            "{region},{:.1},{:.1},{:.1},{:.3}",
            pct(&tapir_lat[&region], 0.5),
            analytic_latency(&bench, &region).unwrap().as_secs_f64() * 1e3,
            tiga_lat.get(&region).map_or(f64::NAN, |v| pct(v, 0.5)),
            s.committed_fast as f64 / s.committed.max(1) as f64
        );
    }
    let (t, g) = (tapir.totals(), tiga.totals());
    println!("tapir: committed {} commit_rate {:.3}; tiga: committed {}", t.committed, t.commit_rate(), g.committed);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("saturation") => {
            let loads: Vec<f64> = args[1..].iter().filter_map(|a| a.parse().ok()).collect();
            saturation(if loads.is_empty() { &[5_000.0, 10_000.0, 20_000.0, 40_000.0] } else { &loads });
        }
        Some("latency") => latency(),
        _ => eprintln!("usage: tapir_bench saturation [LOAD_TXN_PER_S ...] | latency"),
    }
}
