//! Detock on MicroBench in the paper's simulated deployment: the latency of the common case
//! against its analytic formula, strict serializability under contention and message loss,
//! and a known bug (the Tiga paper's code's) caught.

use kairos_harness::TxnDeployment;
use std::time::Duration;

use kairos_check::{check, CheckReport, Model};
use kairos_harness::micro::{Bench, RunOutcome};
use kairos_txn::detock::{analytic_median, Detock, DetockConfig, Server};
use kairos_workload::Placement;

fn run(bench: &Bench, config: &DetockConfig) -> (RunOutcome, CheckReport) {
    let out = bench.run_peer::<Detock>(config, |_| {}).unwrap();
    let report = check(&out.history, Model::StrictSerializable).unwrap();
    assert!(report.ops > 0, "a history with no operations proves nothing: {report}");
    (out, report)
}

/// Runs MicroBench without conflicts under `placement` and checks every region's median
/// against the analytic median over MicroBench's mix of single- and multi-home transactions;
/// returns the medians by region.
fn medians_match_the_analytic_latency(placement: Placement) -> Vec<(String, f64)> {
    let base = TxnDeployment {
        load_txn_per_s: 400.0,
        skew: 0.0,
        duration: Duration::from_secs(3),
        placement,
        ..Default::default()
    };
    let bench = Bench { base, ..Bench::default() };
    let config = DetockConfig::default();
    let (out, report) = run(&bench, &config);
    let t = out.totals();
    eprintln!("{t:?}\n{:?}\n{report}", out.metrics);
    assert!(report.valid, "{report}");
    assert!(t.committed > 1_000, "{t:?}");
    assert_eq!((t.failed, t.unknown, t.aborted_attempts), (0, 0, 0), "{t:?}");
    let mut medians = Vec::new();
    let servers: Vec<&str> = bench.base.server_regions.iter().map(String::as_str).collect();
    for (region, _) in out.stats_by_region() {
        let median_ms = out.median_latency_ms(&region);
        let analytic = analytic_median(&region, &servers, bench.base.placement, bench.base.shards, &config).unwrap();
        let analytic_ms = analytic.as_secs_f64() * 1e3;
        eprintln!("{placement:?} {region}: median {median_ms:.1} ms, analytic {analytic_ms:.1} ms");
        assert!((median_ms - analytic_ms).abs() <= 0.10 * analytic_ms, "{region}: {median_ms} ms vs {analytic_ms} ms");
        medians.push((region, median_ms));
    }
    medians
}

#[test]
fn without_conflicts_detock_commits_at_its_analytic_latency_in_every_region() {
    medians_match_the_analytic_latency(Placement::CoLocated);
}

/// The paper: Detock already spreads its homes over the regions, so rotating the replicas
/// (its Table 2's separated leaders) leaves one home per region and changes little.
#[test]
fn separated_placement_keeps_one_home_per_region_and_its_analytic_latency() {
    let co_located = medians_match_the_analytic_latency(Placement::CoLocated);
    let separated = medians_match_the_analytic_latency(Placement::Separated);
    let overall = |m: &[(String, f64)]| m.iter().map(|(_, v)| v).sum::<f64>() / m.len() as f64;
    let (c, s) = (overall(&co_located), overall(&separated));
    eprintln!("mean of the regions' medians: co-located {c:.1} ms, separated {s:.1} ms");
    assert!((s - c).abs() <= 0.10 * c, "{s} vs {c}");
}

/// A small, skewed key space: concurrent increments of hot keys conflict, and the homes' logs
/// order multi-home transactions differently (cycles, resolved deterministically).
fn contended(loss: f64) -> Bench {
    let base = TxnDeployment {
        keys_per_shard: 1_000,
        skew: 0.99,
        load_txn_per_s: 600.0,
        duration: Duration::from_secs(3),
        loss,
        ..Default::default()
    };
    Bench { base, ..Bench::default() }
}

#[test]
fn under_contention_and_message_loss_detock_stays_strictly_serializable_and_finishes_everything() {
    for loss in [0.0, 0.02] {
        let (out, report) = run(&contended(loss), &DetockConfig::default());
        let t = out.totals();
        let m = |k: &str| out.metrics.get(k).copied().unwrap_or(0);
        eprintln!("loss {loss}: {t:?}\n{:?}\n{report}", out.metrics);
        assert!(report.valid, "loss {loss}: {report}");
        assert!(t.committed > 1_000, "{t:?}");
        // Deterministic ordering never aborts, and the repair pulls finish every transaction.
        assert_eq!((t.aborted_attempts, t.failed, t.unknown), (0, 0, 0), "{t:?}");
        assert_eq!(t.invoked, t.committed, "{t:?}");
        // The logs disagreed, and the executors resolved it.
        assert!(m("detock.cycles") > 0, "{:?}", out.metrics);
        if loss > 0.0 {
            assert!(m("detock.resubmits") + m("detock.sync_fetches") + m("detock.appends_again") > 0);
        }
    }
}

/// The injected bug (the Tiga paper's code's filter: an executor skips the transactions that
/// do not touch its shard) hides cycles through other shards' transactions, so homes order
/// them differently: the history checker finds it. Control: the same run reading every log.
#[test]
fn skipping_other_shards_transactions_is_caught() {
    let buggy = DetockConfig { unsafe_skip_foreign_txns: true, ..DetockConfig::default() };
    let (_, report) = run(&contended(0.0), &buggy);
    eprintln!("{report}");
    assert!(!report.valid, "{report}");
    let (out, report) = run(&contended(0.0), &DetockConfig::default());
    assert!(report.valid && report.ops > 1_000, "{report}");
    assert!(out.metrics.get("detock.executed").copied().unwrap_or(0) > 1_000);
}

/// After a contended run with message loss has drained, every home's graph is empty (every
/// transaction it read ran, and it remembers no key for one), and the homes wrote the keys.
#[test]
fn after_a_lossy_run_every_home_executed_everything_it_read() {
    let bench = contended(0.02);
    let mut world = bench.build::<Detock>(&DetockConfig::default()).unwrap();
    world.sim.run_until(kairos_core::SimTime::ZERO + bench.base.duration + bench.drain);
    assert!(world.sim.violation().is_none(), "{:?}", world.sim.violation());
    let mut written = 0;
    for replicas in &world.topology.shards {
        for n in replicas {
            let s = world.sim.role::<Server>(*n).unwrap();
            assert_eq!((s.unexecuted(), s.keys_tracked()), (0, 0), "{n:?} {:?}", s.stats());
            assert!(s.waits_idle(), "{n:?} {:?}", s.stats());
            written += s.store().map_or(0, |st| st.len());
        }
    }
    assert!(written > 500, "the run wrote {written} keys");
}
