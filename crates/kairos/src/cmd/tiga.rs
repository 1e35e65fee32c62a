//! `kairos bench tiga`: Tiga on MicroBench in the paper's simulated deployment, every run's
//! history checked strictly serializable.

use super::bench::verdict;
use crate::cli::{ModeArg, TigaArgs, TigaBenchArgs};
use crate::progress;
use crate::result::{self, CheckResult, RunResult};
use crate::stats;
use crate::CliError;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use kairos_check::{CheckReport, Model};
use kairos_harness::tiga::{analytic_latency, analytic_latency_in, Deployment, LeaderKill, Mode, Outcome};
use kairos_harness::TxnDeployment;
use kairos_sim::CpuModel;
use kairos_workload::Placement;
use std::collections::BTreeMap;
use std::time::Duration;

/// Most keys `--load-keys` loads (about 0.5 KB each over the six copies of a shard's store).
const LOADED_KEYS_MAX: u64 = 10_000_000;

impl TigaArgs {
    /// Validates the flags and builds one deployment per offered load.
    pub fn to_deployments(&self) -> Result<Vec<Deployment>, CliError> {
        if self.load.is_empty() || self.load.iter().any(|l| !(*l > 0.0 && *l <= 10_000_000.0)) {
            return Err(CliError::Usage(format!(
                "--load takes offered loads in transactions per second, each above 0 and at most 10,000,000 (got {:?})",
                self.load
            )));
        }
        if !(0.0..=5.0).contains(&self.skew) {
            return Err(CliError::Usage(format!("--skew is a Zipf exponent between 0 and 5, not {}", self.skew)));
        }
        if !(1..=100_000_000).contains(&self.keys_per_shard) {
            return Err(CliError::Usage(format!(
                "--keys-per-shard must be between 1 and 100,000,000, not {}",
                self.keys_per_shard
            )));
        }
        let keys = self.keys_per_shard.saturating_mul(3);
        if self.load_keys && keys > LOADED_KEYS_MAX {
            return Err(CliError::Usage(format!(
                "--load-keys loads at most {LOADED_KEYS_MAX} keys, not {keys} (3 shards × {} keys): pass fewer \
                 --keys-per-shard, or drop --load-keys",
                self.keys_per_shard
            )));
        }
        if !(self.duration_s > 0.0 && self.duration_s <= 3_600.0) {
            return Err(CliError::Usage(format!(
                "--duration-s must be between 0 and 3600 virtual seconds, not {}",
                self.duration_s
            )));
        }
        if !(0.0..1.0).contains(&self.loss) {
            return Err(CliError::Usage(format!("--loss is a probability in [0, 1), not {}", self.loss)));
        }
        if !(-10_000.0..=10_000.0).contains(&self.headroom_shift_ms) {
            return Err(CliError::Usage(format!(
                "--headroom-shift-ms must be within ±10000 ms, not {}",
                self.headroom_shift_ms
            )));
        }
        if !(0.0..=1_000_000.0).contains(&self.cpu_us) {
            return Err(CliError::Usage(format!("--cpu-us must be between 0 and 1,000,000 µs, not {}", self.cpu_us)));
        }
        let kill_leader = match self.kill_leader_at_s {
            None => None,
            Some(at) => {
                if !(at > 0.0 && at < self.duration_s) {
                    return Err(CliError::Usage(format!(
                        "--kill-leader-at-s must fall within the run (0 < s < --duration-s = {}), not {at}",
                        self.duration_s
                    )));
                }
                if self.kill_shard >= 3 {
                    return Err(CliError::Usage(format!(
                        "--kill-shard names one of the 3 shards (0, 1 or 2), not {}",
                        self.kill_shard
                    )));
                }
                let restart_after = match self.restart_after_s {
                    Some(r) if !(0.0..=3_600.0).contains(&r) => {
                        return Err(CliError::Usage(format!(
                            "--restart-after-s must be between 0 and 3600 seconds, not {r}"
                        )))
                    }
                    r => r.map(Duration::from_secs_f64),
                };
                Some(LeaderKill { at: Duration::from_secs_f64(at), shard: self.kill_shard, restart_after })
            }
        };
        let template = Deployment {
            base: TxnDeployment {
                seed: self.seed,
                clock: self.clock.into(),
                placement: self.placement.into(),
                skew: self.skew,
                keys_per_shard: self.keys_per_shard,
                preload: self.load_keys,
                duration: Duration::from_secs_f64(self.duration_s),
                loss: self.loss,
                cpu: if self.measured_cpu {
                    CpuModel::MEASURED
                } else {
                    CpuModel::Fixed(Duration::from_secs_f64(self.cpu_us / 1e6))
                },
                ..Default::default()
            },
            kill_leader,
            mode: match self.mode {
                ModeArg::Auto => Mode::Auto,
                ModeArg::Preventive => Mode::Preventive,
                ModeArg::Detective => Mode::Detective,
            },
            ..Deployment::default()
        };
        let mut template = template;
        template.config.headroom_shift_ns = (self.headroom_shift_ms * 1e6) as i64;
        template.config.zero_headroom = self.zero_headroom;
        template.config.quorum_choice = self.quorum_choice;
        template.config.announce_at_release = self.announce_at_release_ms.map(|ms| Duration::from_secs_f64(ms / 1e3));
        template.config.admission_control = self.admission.admission_control;
        Ok(self.load.iter().map(|l| template.at_load(*l)).collect())
    }
}

pub fn bench(args: TigaBenchArgs) -> Result<(), CliError> {
    let mut deployments = args.run.to_deployments()?;
    let mut message_cost = None;
    if args.run.measured_cpu {
        let (wire, source) = super::net::wire_cost(args.message_cost_us)?;
        println!("CPU: {}", super::net::cpu_header(&wire));
        for d in &mut deployments {
            d.base.cpu = CpuModel::Measured { scale: 1.0, floor: Duration::ZERO, wire };
            d.replay_leader_alone = true;
        }
        message_cost = Some(source);
    }
    let mut results = Vec::new();
    let mut reports = Vec::new();
    for d in &deployments {
        let (outcome, report) = run_and_check(d)?;
        if let Some(path) = &args.history {
            result::write_history(path, &outcome.history)?;
        }
        let mut r = tiga_result(d, &outcome, &report);
        if let Some(source) = &message_cost {
            r.extra.insert("message_cost".into(), source.clone());
        }
        print_table(d, &outcome, &r);
        if matches!(d.base.cpu, CpuModel::Measured { .. }) {
            for (key, us) in print_cpu(&outcome, r.committed) {
                r.extra.insert(key.into(), us.into());
            }
        }
        if d.kill_leader.is_some() {
            print_recovery(d, &outcome, &mut r, 1);
        }
        println!("{report}");
        println!();
        results.push(r);
        reports.push(report);
    }
    if results.len() > 1 {
        print_sweep(&results);
    }
    if let Some(path) = &args.json {
        result::write_json(path, &results)?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        let d = &deployments[0];
        let title = format!("Tiga, {} clocks, skew {}: commit latency CDF", d.base.clock, d.base.skew);
        crate::report::write_run_figure(path, &title, &results)?;
    }
    for (d, report) in deployments.iter().zip(&reports) {
        verdict(report, d.base.seed)?;
    }
    Ok(())
}

/// Prints the measured CPU time per committed transaction by role (what `kairos cluster
/// bench --no-delay` measures on real processes for the same roles), and per piece at the
/// leaders unless a view change moved one; returns the figures for `--json`.
fn print_cpu(outcome: &Outcome, committed: u64) -> Vec<(&'static str, f64)> {
    let per = |d: Duration| d.as_secs_f64() * 1e6 / committed.max(1) as f64;
    let b = &outcome.busy;
    let piece = b.leader_pieces.map(|n| b.leaders.as_secs_f64() * 1e6 / n.max(1) as f64);
    let [leaders, followers, coordinators, all] =
        [b.leaders, b.followers, b.coordinators, b.leaders + b.followers + b.coordinators].map(per);
    let longest_ms = b.leader_handler_max.as_secs_f64() * 1e3;
    println!(
        "measured CPU per committed transaction: leaders {leaders:.1} µs ({}; longest handler {longest_ms:.2} ms), \
         followers {followers:.1} µs, coordinators {coordinators:.1} µs (all servers and coordinators: {all:.1} µs)",
        piece.map_or("per piece: - (a view change moved a leader)".into(), |us| format!("{us:.1} µs per piece")),
    );
    let mut figures = vec![("leaders_cpu_us_per_txn", leaders), ("leader_handler_ms_max", longest_ms)];
    figures.extend(piece.map(|us| ("leader_cpu_us_per_piece", us)));
    if let Some(a) = &b.leader_alone {
        let per_piece = |d: Duration| d.as_secs_f64() * 1e6 / a.pieces.max(1) as f64;
        let (in_run, alone) = (per_piece(a.in_run), per_piece(a.alone.cpu));
        let alone_longest_ms = a.alone.handler_max.as_secs_f64() * 1e3;
        println!(
            "shard 0's leader: {in_run:.1} µs per piece in the run (longest handler {:.2} ms); its {} handlers replayed \
             alone on a fresh instance: {alone:.1} µs per piece (longest {alone_longest_ms:.2} ms)",
            a.in_run_handler_max.as_secs_f64() * 1e3,
            a.alone.handlers,
        );
        figures.extend([
            ("leader0_cpu_us_per_piece", in_run),
            ("leader0_alone_cpu_us_per_piece", alone),
            ("leader0_alone_handler_ms_max", alone_longest_ms),
        ]);
    }
    figures.extend([
        ("followers_cpu_us_per_txn", followers),
        ("coordinators_cpu_us_per_txn", coordinators),
        ("all_cpu_us_per_txn", all),
    ]);
    figures
}

/// Runs one deployment with a progress bar and checks its history.
pub fn run_and_check(d: &Deployment) -> Result<(Outcome, CheckReport), CliError> {
    let bar = progress::bar(100, "tiga");
    bar.set_message(format!("{:.0} txn/s, seed {}", d.base.load_txn_per_s, d.base.seed));
    let outcome = d.run(|f| bar.set_position((f * 100.0) as u64)).map_err(|e| CliError::Usage(e.to_string()))?;
    progress::say(
        &bar,
        format!(
            "simulated {} events in {:.1} s wall; checking {} transactions for strict serializability…",
            outcome.stats.events_handled,
            outcome.wall.as_secs_f64(),
            outcome.history.len() / 2
        ),
    );
    bar.set_message("checking strict serializability");
    let checking = std::time::Instant::now();
    let report = kairos_check::check(&outcome.history, Model::StrictSerializable).map_err(|e| {
        CliError::Runtime(format!("the simulator wrote a history the checker cannot read (a Kairos bug): {e}"))
    })?;
    bar.finish_and_clear();
    eprintln!("checked {} operations in {:.1} s wall", report.ops, checking.elapsed().as_secs_f64());
    Ok((outcome, report))
}

/// MicroBench's increments write `read + 1`, so a transaction whose outcome is unknown (given
/// up, or still in flight when the run ends) enters the history without its written values.
/// If it did take effect, a later read of its value looks like a read of a value nobody wrote.
/// Say so when that is all the checker found, instead of leaving a bare verdict.
fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

pub fn tiga_result(d: &Deployment, outcome: &Outcome, report: &CheckReport) -> RunResult {
    let summary = stats::summarize(&outcome.history, |p| outcome.region_of_process(p).map(str::to_string));
    let (cdf, cdf_by_region) =
        stats::latency_cdfs(&outcome.history, |_| true, |e| outcome.region_of_process(e.process).map(str::to_string));
    let by_region = outcome.stats_by_region();
    let total = by_region.iter().fold((0, 0, 0, 0), |acc, (_, s)| {
        (acc.0 + s.committed, acc.1 + s.committed_fast, acc.2 + s.committed_slow, acc.3 + s.ts_revised)
    });
    let mut extra = BTreeMap::new();
    extra.insert("placement".into(), format!("{:?}", d.base.placement).to_lowercase().into());
    extra.insert("mode".into(), format!("{:?}", d.mode).to_lowercase().into());
    let fast_by_region: serde_json::Map<String, serde_json::Value> =
        by_region.iter().map(|(r, s)| (r.clone(), share(s.committed_fast, s.committed).into())).collect();
    extra.insert("fast_path_ratio_by_region".into(), fast_by_region.into());
    extra.insert("messages_sent".into(), outcome.stats.messages_sent.into());
    extra.insert("events_handled".into(), outcome.stats.events_handled.into());
    extra.insert("headroom_shift_ms".into(), (d.config.headroom_shift_ns as f64 / 1e6).into());
    extra.insert("zero_headroom".into(), d.config.zero_headroom.into());
    extra.insert("quorum_choice".into(), d.config.quorum_choice.into());
    let announce_ms = d.config.announce_at_release.map(|t| t.as_secs_f64() * 1e3);
    extra.insert("announce_at_release_ms".into(), announce_ms.into());
    extra.insert("admission_control".into(), d.config.admission_control.into());
    // Every protocol counter of the run (sends, retransmissions, give-ups, admission drops,
    // server revisions…): what explains a throughput or latency figure.
    let metrics: serde_json::Map<String, serde_json::Value> =
        outcome.metrics.iter().map(|(name, n)| (name.to_string(), (*n).into())).collect();
    extra.insert("metrics".into(), metrics.into());
    let analytic: serde_json::Map<String, serde_json::Value> = by_region
        .iter()
        .filter_map(|(r, _)| analytic_latency(d, r).ok().map(|l| (r.clone(), (l.as_secs_f64() * 1e3).into())))
        .collect();
    extra.insert("analytic_latency_ms_by_region".into(), analytic.into());
    RunResult {
        system: "tiga".into(),
        protocol: "tiga".into(),
        workload: serde_json::json!({ "name": "micro", "skew": d.base.skew, "keys_per_shard": d.base.keys_per_shard, "shards": d.base.shards, "keys_per_txn": 3, "keys_loaded": d.base.preload }),
        host: "sim".into(),
        clock: d.base.clock.to_string(),
        seed: d.base.seed,
        duration_s: d.base.duration.as_secs_f64(),
        offered_ops_per_s: Some(d.base.load_txn_per_s),
        // Commits in the measurement window, as `bench micro` counts them: dividing every
        // commit (including the drain after the load) by the load's duration overstates
        // throughput at saturation.
        throughput_ops_per_s: kairos_harness::window_throughput(&outcome.history, d.base.duration),
        latency_ms: summary.overall,
        latency_ms_by_region: summary.by_group,
        latency_cdf_ms: cdf,
        latency_cdf_ms_by_region: cdf_by_region,
        latency_cdf_ms_by_op: BTreeMap::new(),
        committed: summary.ok,
        aborted: summary.failed,
        unknown: summary.unknown,
        // Wide-area round trips from the coordinator: how many times it sent the transaction
        // (fast and slow path both take one; a retransmission adds one).
        round_trips: Some(
            [("1", "tiga.committed_sends_1"), ("2", "tiga.committed_sends_2"), ("3+", "tiga.committed_sends_3plus")]
                .into_iter()
                .filter_map(|(label, metric)| {
                    let n = outcome.metrics.get(metric).copied().unwrap_or(0);
                    (n > 0).then(|| (label.to_string(), share(n, total.0)))
                })
                .collect(),
        ),
        fast_path_ratio: Some(share(total.1, total.0)),
        rollback_ratio: Some(share(total.3, total.0)),
        check: CheckResult::from_report(report),
        trace_hash: Some(format!("{:016x}", outcome.trace_hash)),
        wall_s: outcome.wall.as_secs_f64(),
        extra,
    }
}

pub fn print_table(d: &Deployment, outcome: &Outcome, r: &RunResult) {
    println!(
        "Tiga, {} leaders, {} clocks, skew {}, seed {}: offered {:.0} txn/s, throughput {:.0} txn/s, {} committed, {} unknown, trace {}",
        match d.base.placement {
            Placement::CoLocated => "co-located",
            Placement::Separated => "separated",
        },
        r.clock,
        d.base.skew,
        d.base.seed,
        d.base.load_txn_per_s,
        r.throughput_ops_per_s,
        r.committed,
        r.unknown,
        r.trace_hash.as_deref().unwrap_or("-"),
    );
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(["region", "commits", "p50 ms", "p90 ms", "p99 ms", "analytic ms", "fast %", "slow %", "revised %"]);
    for (region, s) in outcome.stats_by_region() {
        let p = r.latency_ms_by_region.get(&region).cloned().unwrap_or_default();
        let analytic =
            analytic_latency(d, &region).map(|l| format!("{:.1}", l.as_secs_f64() * 1e3)).unwrap_or_default();
        t.add_row([
            region.clone(),
            s.committed.to_string(),
            format!("{:.1}", p.p50),
            format!("{:.1}", p.p90),
            format!("{:.1}", p.p99),
            analytic,
            format!("{:.1}", 100.0 * share(s.committed_fast, s.committed)),
            format!("{:.1}", 100.0 * share(s.committed_slow, s.committed)),
            format!("{:.2}", 100.0 * share(s.ts_revised, s.committed)),
        ]);
    }
    let p = &r.latency_ms;
    t.add_row([
        "all".into(),
        r.committed.to_string(),
        format!("{:.1}", p.p50),
        format!("{:.1}", p.p90),
        format!("{:.1}", p.p99),
        String::new(),
        format!("{:.1}", 100.0 * r.fast_path_ratio.unwrap_or(0.0)),
        format!("{:.1}", 100.0 * (1.0 - r.fast_path_ratio.unwrap_or(0.0))),
        format!("{:.2}", 100.0 * r.rollback_ratio.unwrap_or(0.0)),
    ]);
    println!("{t}");
}

/// Bins of the recovery experiment's time series.
const SERIES_BIN: Duration = Duration::from_millis(100);

/// The recovery experiment: throughput and median latency per 100 ms around the crash (a row
/// every `step` bins), the recovery time, and both in the result's `extra` (`series`,
/// `recovery_s`). Nothing without a crash in `d`.
pub fn print_recovery(d: &Deployment, outcome: &Outcome, r: &mut RunResult, step: usize) {
    let Some(k) = &d.kill_leader else { return };
    let series = stats::series(&outcome.history, SERIES_BIN, d.base.duration);
    let crash_s = k.at.as_secs_f64();
    let recovery = stats::recovery_s(&series, crash_s, 5);
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(["t (s)", "commits/s", "p50 ms", ""]);
    let around = series.iter().filter(|b| b.t_s >= crash_s - 0.5 && b.t_s < crash_s + 3.0);
    for b in around.step_by(step.max(1)) {
        let row_s = SERIES_BIN.as_secs_f64() * step.max(1) as f64;
        let mark = if (b.t_s..b.t_s + row_s).contains(&crash_s) { "← leader crashes" } else { "" };
        t.add_row([
            format!("{:.1}", b.t_s),
            format!("{:.0}", b.ok_per_s),
            format!("{:.1}", b.latency_ms_p50),
            mark.into(),
        ]);
    }
    println!(
        "Leader of shard {} crashed at {crash_s} s (view now {}):
{t}",
        k.shard, outcome.view
    );
    match recovery {
        Some(s) => {
            println!("recovery: throughput back at ≥ 90% of before {s:.2} s after the crash (detection included)")
        }
        None => println!("recovery: throughput did not come back to 90% of before within the run"),
    }
    // Latency once recovered (from a second after the recovery on, to the end of the load)
    // against the analytic latency of the new placement, where the crashed replica is missing.
    if let Some(rec) = recovery {
        let from_s = crash_s + rec + 1.0;
        if from_s < d.base.duration.as_secs_f64() {
            let restarted_before = k.restart_after.is_some_and(|a| crash_s + a.as_secs_f64() < from_s);
            let old_leader = outcome.topology.leader.get(k.shard as usize).copied().unwrap_or(0);
            let down: Vec<(u32, u32)> = if restarted_before { Vec::new() } else { vec![(k.shard, old_leader)] };
            let after = stats::invoked_from(&outcome.history, Duration::from_secs_f64(from_s));
            let summary = stats::summarize(&after, |p| outcome.region_of_process(p).map(str::to_string));
            let mut t = Table::new();
            t.load_preset(UTF8_FULL_CONDENSED);
            t.set_header(["region", "p50 ms after recovery", "analytic ms (new placement)"]);
            let mut analytic_after = serde_json::Map::new();
            for (region, p) in &summary.by_group {
                let a = analytic_latency_in(d, region, &outcome.leaders, &down).ok().map(|l| l.as_secs_f64() * 1e3);
                if let Some(a) = a {
                    analytic_after.insert(region.clone(), a.into());
                }
                t.add_row([region.clone(), format!("{:.1}", p.p50), a.map(|a| format!("{a:.1}")).unwrap_or_default()]);
            }
            println!("from {from_s:.1} s on, leaders {:?}:\n{t}", outcome.leaders);
            let p50: serde_json::Map<String, serde_json::Value> =
                summary.by_group.iter().map(|(g, p)| (g.clone(), p.p50.into())).collect();
            r.extra.insert("latency_ms_p50_after_recovery_by_region".into(), p50.into());
            r.extra.insert("analytic_latency_ms_after_recovery_by_region".into(), analytic_after.into());
        }
    }
    r.extra.insert("kill_leader_at_s".into(), crash_s.into());
    r.extra.insert("kill_shard".into(), k.shard.into());
    r.extra.insert("view".into(), outcome.view.into());
    r.extra.insert("recovery_s".into(), recovery.into());
    r.extra.insert("series".into(), serde_json::to_value(&series).unwrap_or_default());
}

fn print_sweep(results: &[RunResult]) {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "offered txn/s",
        "throughput txn/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "fast %",
        "revised %",
        "strict-serializable",
    ]);
    for r in results {
        t.add_row([
            format!("{:.0}", r.offered_ops_per_s.unwrap_or(0.0)),
            format!("{:.0}", r.throughput_ops_per_s),
            format!("{:.1}", r.latency_ms.p50),
            format!("{:.1}", r.latency_ms.p90),
            format!("{:.1}", r.latency_ms.p99),
            format!("{:.1}", 100.0 * r.fast_path_ratio.unwrap_or(0.0)),
            format!("{:.2}", 100.0 * r.rollback_ratio.unwrap_or(0.0)),
            match r.check.verdict.as_str() {
                "valid" => "yes".into(),
                "unknown" => "unverified".into(),
                _ => "NO".into(),
            },
        ]);
    }
    println!("Throughput–latency sweep:\n{t}");
}
