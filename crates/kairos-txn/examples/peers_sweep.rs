//! Where 2PL+Paxos and OCC+Paxos saturate, and their latency next to Tiga's.
//!
//! ```text
//! cargo run --release -p kairos-txn --example peers_sweep -- sweep 1000 2000 4000 8000
//! cargo run --release -p kairos-txn --example peers_sweep -- latency 1000
//! cargo run --release -p kairos-txn --example peers_sweep -- sweep-tiga 32000 64000
//! ```
//!
//! `sweep`: MicroBench (paper defaults: 1M keys per shard, skew 0.5) at each offered load
//! under `CpuModel::Measured { scale: 1.0, floor: 0 }` (handlers cost their real CPU time, so
//! numbers depend on this machine and its load); prints committed throughput over the second
//! half of the load window, commit rate and per-region median latency. `latency`: the same at one load with
//! free CPU, for 2PL+Paxos, OCC+Paxos and Tiga side by side. `sweep-tiga`: the sweep for Tiga.
//! With `FREE_CPU=1` the sweeps run with free CPU (contention is then the only limit).

use kairos_core::OpType;
use kairos_sim::CpuModel;
use kairos_txn::occ::OccPaxos;
use kairos_txn::tpl::TwoPlPaxos;
use kairos_txn::twopc::ClassicConfig;
use kairos_txn::{Bench, RunOutcome};
use std::collections::BTreeMap;
use std::time::Duration;

fn medians_ms(out: &RunOutcome) -> BTreeMap<String, f64> {
    let mut open = BTreeMap::new();
    let mut lat: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in &out.history {
        match r.event.op_type {
            OpType::Invoke => {
                open.insert(r.event.process, r.time);
            }
            OpType::Ok => {
                if let (Some(t), Some(region)) = (open.remove(&r.event.process), out.region_of_process(r.event.process))
                {
                    lat.entry(region.to_string()).or_default().push((r.time - t) as f64 / 1e6);
                }
            }
            _ => {
                open.remove(&r.event.process);
            }
        }
    }
    lat.into_iter()
        .map(|(r, mut v)| {
            v.sort_by(f64::total_cmp);
            (r, v[v.len() / 2])
        })
        .collect()
}

/// Commits per second over the second half of the load window (after the pipeline filled).
fn throughput(out: &RunOutcome, duration: Duration) -> f64 {
    let (start, end) = ((duration / 2).as_nanos() as u64, duration.as_nanos() as u64);
    let ok = out.history.iter().filter(|r| r.event.op_type == OpType::Ok && (start..end).contains(&r.time)).count();
    ok as f64 / (duration / 2).as_secs_f64()
}

fn report(name: &str, load: f64, bench: &Bench, out: &RunOutcome) {
    let t = out.totals();
    let m: Vec<String> = medians_ms(out).into_iter().map(|(r, v)| format!("{r} {v:.0}")).collect();
    println!(
        "{name:<10} offered {load:>7.0}  committed/s {:>8.0}  invoked {:>7} committed {:>7} commit-rate {:.3} failed {} dropped {}  p50 ms [{}]  wall {:.1}s",
        throughput(out, bench.duration),
        t.invoked,
        t.committed,
        t.commit_rate(),
        t.failed,
        t.admission_dropped,
        m.join(", "),
        out.wall.as_secs_f64()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("sweep");
    let loads: Vec<f64> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
    let config = ClassicConfig::default();
    match mode {
        "latency" => {
            let load = loads.first().copied().unwrap_or(1_000.0);
            let bench = Bench { load_txn_per_s: load, duration: Duration::from_secs(3), ..Bench::default() };
            report("2pl-paxos", load, &bench, &bench.run_peer::<TwoPlPaxos>(&config, |_| {}).unwrap());
            report("occ-paxos", load, &bench, &bench.run_peer::<OccPaxos>(&config, |_| {}).unwrap());
            report("tiga", load, &bench, &bench.run_tiga(|_| {}).unwrap());
        }
        _ => {
            let loads = if loads.is_empty() { vec![1_000.0, 2_000.0, 4_000.0, 8_000.0] } else { loads };
            for load in loads {
                let bench = Bench {
                    load_txn_per_s: load,
                    duration: Duration::from_secs(3),
                    drain: Duration::from_secs(3),
                    cpu: if std::env::var("FREE_CPU").is_ok() {
                        CpuModel::Free
                    } else {
                        CpuModel::Measured { scale: 1.0, floor: Duration::ZERO }
                    },
                    ..Bench::default()
                };
                if mode == "sweep-tiga" {
                    report("tiga", load, &bench, &bench.run_tiga(|_| {}).unwrap());
                } else {
                    report("2pl-paxos", load, &bench, &bench.run_peer::<TwoPlPaxos>(&config, |_| {}).unwrap());
                    report("occ-paxos", load, &bench, &bench.run_peer::<OccPaxos>(&config, |_| {}).unwrap());
                }
            }
        }
    }
}
