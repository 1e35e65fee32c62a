//! `kairos bench register` and `kairos bench des`.

use crate::cli::{DesBenchArgs, RegisterBenchArgs};
use crate::progress;
use crate::result::{self, CheckResult, RunResult};
use crate::stats;
use crate::CliError;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use kairos_check::{CheckReport, Model, Verdict};
use kairos_harness::register::{RegisterOutcome, RegisterRun};
use kairos_register::ROUND_TRIP_METRICS;
use std::collections::BTreeMap;
use std::time::Instant;

pub fn register(args: RegisterBenchArgs) -> Result<(), CliError> {
    let run = args.run.to_run()?;
    let (outcome, report) = run_and_check(&run, "register")?;
    if let Some(path) = &args.history {
        result::write_history(path, &outcome.history)?;
    }
    let result = register_result(&run, &outcome, &report);
    print_register_table(&[&result]);
    if report.ops == 0 {
        // "VALID: 0 operations checked" would read as a pass; a check of nothing is not one.
        println!("NOTHING CHECKED: no operation completed");
        return Err(CliError::Unknown(format!(
            "no operation completed within {} virtual s, so there is no history to check; give a longer \
             --duration-s (the default is 20)",
            args.run.duration_s
        )));
    }
    println!("{report}");
    if let Some(path) = &args.json {
        result::write_json(path, &[result])?;
        println!("wrote {}", path.display());
    }
    verdict(&report, run.seed)
}

/// Runs the register deployment with a progress bar and checks its history.
pub fn run_and_check(run: &RegisterRun, label: &str) -> Result<(RegisterOutcome, CheckReport), CliError> {
    let bar = progress::bar(100, label);
    bar.set_message(format!("seed {}", run.seed));
    let outcome = run.run(|f| bar.set_position((f * 100.0) as u64)).map_err(|e| CliError::Usage(e.to_string()))?;
    bar.finish_and_clear();
    let report = kairos_check::check(&outcome.history, Model::Linearizable).map_err(|e| {
        CliError::Runtime(format!("the simulator wrote a history the checker cannot read (a Kairos bug): {e}"))
    })?;
    Ok((outcome, report))
}

/// Exit status of a checked run: an anomaly is an error, with the seed to replay it.
pub fn verdict(report: &CheckReport, seed: u64) -> Result<(), CliError> {
    match report.verdict {
        Verdict::Valid => Ok(()),
        Verdict::Invalid => Err(CliError::Anomaly(format!(
            "the history of seed {seed} is not {} (replay with --seed {seed})",
            report.model
        ))),
        Verdict::Unknown => Err(CliError::Unknown(format!(
            "the history of seed {seed} is UNVERIFIED: no checker could decide whether it is {} (replay with --seed {seed})",
            report.model
        ))),
    }
}

pub fn register_result(run: &RegisterRun, outcome: &RegisterOutcome, report: &CheckReport) -> RunResult {
    let summary = stats::summarize(&outcome.history, |p| outcome.process_region.get(p as usize).cloned());
    let (cdf, cdf_by_region) =
        stats::latency_cdfs(&outcome.history, |_| true, |e| outcome.process_region.get(e.process as usize).cloned());
    let duration_s = run.duration.as_secs_f64();
    let ok_total: u64 = ROUND_TRIP_METRICS.iter().map(|m| outcome.metrics.get(m).copied().unwrap_or(0)).sum();
    let round_trips: BTreeMap<String, f64> = ROUND_TRIP_METRICS
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            let n = outcome.metrics.get(m).copied().unwrap_or(0);
            let label = if i == ROUND_TRIP_METRICS.len() - 1 { format!("{}+", i + 1) } else { (i + 1).to_string() };
            (n > 0 && ok_total > 0).then(|| (label, n as f64 / ok_total as f64))
        })
        .collect();
    let mut extra = BTreeMap::new();
    extra.insert("messages_sent".into(), outcome.stats.messages_sent.into());
    extra.insert("events_handled".into(), outcome.stats.events_handled.into());
    extra.insert(
        "faults".into(),
        outcome.fault_plan.iter().map(|f| format!("{} {}", f.at, f.fault)).collect::<Vec<_>>().into(),
    );
    RunResult {
        system: "register".into(),
        protocol: "abd".into(),
        workload: serde_json::json!({
            "name": "register",
            "keys": run.keys,
            "write_ratio": run.write_ratio,
            "clients": outcome.process_region.len(),
            "replicas": run.replica_regions,
        }),
        host: "sim".into(),
        clock: run.clock.to_string(),
        seed: run.seed,
        duration_s,
        offered_ops_per_s: None,
        throughput_ops_per_s: summary.ok as f64 / duration_s,
        latency_ms: summary.overall,
        latency_ms_by_region: summary.by_group,
        latency_cdf_ms: cdf,
        latency_cdf_ms_by_region: cdf_by_region,
        latency_cdf_ms_by_op: BTreeMap::new(),
        committed: summary.ok,
        aborted: summary.failed,
        unknown: summary.unknown,
        round_trips: Some(round_trips),
        fast_path_ratio: None,
        rollback_ratio: None,
        check: CheckResult::from_report(report),
        trace_hash: Some(format!("{:016x}", outcome.trace_hash)),
        wall_s: outcome.wall.as_secs_f64(),
        extra,
    }
}

pub fn print_register_table(results: &[&RunResult]) {
    for r in results {
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED);
        t.set_header(["region", "p50 ms", "p90 ms", "p99 ms"]);
        for (region, p) in &r.latency_ms_by_region {
            t.add_row([region.clone(), format!("{:.1}", p.p50), format!("{:.1}", p.p90), format!("{:.1}", p.p99)]);
        }
        let p = &r.latency_ms;
        t.add_row(["all".to_string(), format!("{:.1}", p.p50), format!("{:.1}", p.p90), format!("{:.1}", p.p99)]);
        println!(
            "{} ({}) on {} clocks, seed {}, {} virtual s: {:.1} ops/s, {} ok, {} unknown, trace {}",
            r.protocol,
            r.system,
            r.clock,
            r.seed,
            r.duration_s,
            r.throughput_ops_per_s,
            r.committed,
            r.unknown,
            r.trace_hash.as_deref().unwrap_or("-"),
        );
        if let Some(rt) = &r.round_trips {
            let shares: Vec<String> = rt.iter().map(|(k, v)| format!("{k} RT: {:.1}%", v * 100.0)).collect();
            println!("round trips per completed operation: {}", shares.join(", "));
        }
        println!("{t}");
    }
}

pub fn des(args: DesBenchArgs) -> Result<(), CliError> {
    if args.pending.is_empty() || args.pending.iter().any(|p| *p == 0 || *p > 10_000_000) {
        return Err(CliError::Usage("--pending takes counts between 1 and 10,000,000, comma separated".into()));
    }
    if args.events == 0 {
        return Err(CliError::Usage("--events must be at least 1".into()));
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(["pending events", "events", "wall s", "events/s (millions)"]);
    let mut rows = Vec::new();
    let bar = progress::bar(args.pending.len() as u64, "des");
    for &pending in &args.pending {
        bar.set_message(format!("{pending} pending"));
        let mut sim = kairos_sim::pingpong::world(1, pending);
        // Warm up: one full round of every ball.
        for _ in 0..pending as u64 {
            sim.step();
        }
        let started = Instant::now();
        for _ in 0..args.events {
            sim.step();
        }
        let wall = started.elapsed().as_secs_f64();
        let rate = args.events as f64 / wall;
        table.add_row([
            pending.to_string(),
            args.events.to_string(),
            format!("{wall:.3}"),
            format!("{:.2}", rate / 1e6),
        ]);
        rows.push(
            serde_json::json!({ "pending": pending, "events": args.events, "wall_s": wall, "events_per_s": rate }),
        );
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!("Bare simulator, ping-pong between sc and fi, one core:\n{table}");
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows).map_err(|e| CliError::Runtime(e.to_string()))? + "\n")
            .map_err(|e| CliError::Io(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}
