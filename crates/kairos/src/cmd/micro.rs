//! `kairos bench micro` and `kairos bench tpcc`: Tiga and its peers on identical MicroBench or
//! TPC-C work, side by side.
//!
//! For each protocol: its maximum throughput (the best windowed throughput over the given
//! loads, or over a sweep: see [`saturation_search`]), then a run at one common load for
//! latency, then optionally (MicroBench) a skew sweep.
//! Every run's history is checked strictly serializable, and a TPC-C run's databases against
//! TPC-C's consistency conditions; the exit status is an anomaly if any run is invalid.

use crate::cli::{DeliveryArg, MicroBenchArgs, TpccBenchArgs, TxnBenchArgs};
use crate::progress;
use crate::result::{self, CheckResult, RunResult};
use crate::stats::{self, Percentiles};
use crate::CliError;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use kairos_check::{CheckReport, Model};
use kairos_harness::micro::{Bench, Protocol, RunOutcome, TpccBench, TpccOutcome};
use kairos_harness::{window_throughput, TxnDeployment};
use kairos_sim::CpuModel;
use kairos_txn::shell::KindSample;
use kairos_txn::shell::ShellConfig;
use kairos_workload::tpcc::{DeliveryScope, TpccMix, TpccScale, TxnType};
use kairos_workload::Placement;
use std::collections::BTreeMap;
use std::time::Duration;

/// A sweep point is saturated when its throughput falls below this share of the offered load.
const SATURATED_SHARE: f64 = 0.85;
/// Past saturation, a doubled load must raise the best throughput by this share for the sweep
/// to double again.
const PAST_SATURATION_GAIN_MIN: f64 = 0.10;
/// Most transactions a point past saturation may offer (load × duration). Simulating a point
/// costs about a third of a millisecond of wall time per transaction on this project's
/// machines, so this bounds such a point to about half a minute; the protocols that saturate
/// above it (Tiga, Calvin+) are bound by CPU and their maximum is marked as a lower bound.
const PAST_SATURATION_TXNS_MAX: f64 = 100_000.0;
/// A point past saturation runs only if the point before it took at most this much wall time
/// (the next offers twice the load). A dependency-graph protocol's wall time per transaction
/// grows with what it has in flight (Janus and Detock on TPC-C). This bound depends on the
/// machine (the points themselves do not, under `--cpu-us`); the search says when it applied.
const PAST_SATURATION_WALL_BEFORE_MAX: Duration = Duration::from_secs(30);
/// Nor if it would take more than this, extrapolated from the last two points (the last one's
/// wall time times its growth over the one before): Janus on TPC-C, once its executions no
/// longer collapsed, took 4 s at 3,906 txn/s, 18 s at 7,812, and at 15,625 still ran after six
/// minutes, holding 15 GB.
const PAST_SATURATION_WALL_PREDICTED_MAX: Duration = Duration::from_secs(60);
/// Most points of one protocol's saturation sweep.
const SWEEP_POINTS_MAX: usize = 16;
/// The latency bound of the side-by-side table's second maximum: a point counts when its
/// median latency is at most this many times the protocol's median at the common load.
const P50_BOUND_OVER_COMMON: f64 = 2.0;
/// Highest offered load the harness accepts, txn/s.
const LOAD_MAX: f64 = 2_000_000.0;
/// Shards of the TPC-C deployment (the paper's: 6 shards × 3 replicas).
const TPCC_SHARDS: u32 = 6;

/// The verdict of one checked run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Valid,
    /// No checker could decide: shown neither valid nor invalid. (A transaction of unknown
    /// outcome records its increments as writes of unknown value, which the checkers take
    /// into account: a read of its value is no anomaly.)
    Unverified,
    Invalid,
}

impl Verdict {
    fn of(report: &CheckReport) -> Self {
        if report.valid {
            Verdict::Valid
        } else if report.verdict == kairos_check::Verdict::Unknown {
            Verdict::Unverified
        } else {
            Verdict::Invalid
        }
    }

    fn label(self) -> &'static str {
        match self {
            Verdict::Valid => "valid",
            Verdict::Unverified => "unverified*",
            Verdict::Invalid => "INVALID",
        }
    }
}

/// One checked run, summarized.
pub struct Point {
    pub protocol: Protocol,
    pub offered_txn_per_s: f64,
    pub skew: f64,
    /// Arrivals the coordinators started (the offered load less those refused at their
    /// in-flight limit), per second of load.
    pub admitted_txn_per_s: f64,
    /// Commits completed in the measurement window, per second.
    pub throughput_txn_per_s: f64,
    pub latency_ms: Percentiles,
    pub latency_ms_by_region: BTreeMap<String, Percentiles>,
    pub commit_rate: f64,
    /// Messages sent in the whole run per committed transaction.
    pub messages_per_commit: f64,
    /// Simulated CPU time of the busiest server per committed transaction, µs.
    pub busiest_server_us_per_commit: f64,
    /// The part of it charged for the busiest server's messages (sending and receiving), µs.
    pub busiest_server_wire_us_per_commit: f64,
    /// Simulated CPU time of all coordinators together per committed transaction, and the part
    /// of it charged for their messages, µs.
    pub coordinators_us_per_commit: f64,
    pub coordinators_wire_us_per_commit: f64,
    pub verdict: Verdict,
    /// TPC-C runs: what the end-of-run checks of the databases found.
    pub tpcc: Option<TpccOutcome>,
    /// TPC-C runs: latency and aborts per transaction type.
    pub by_type: Vec<TypeStats>,
    pub result: RunResult,
}

/// One transaction type's figures in one run (from the coordinators' samples: latency on
/// their clocks, from invocation to commit).
#[derive(Clone, Debug, serde::Serialize)]
pub struct TypeStats {
    pub name: &'static str,
    pub committed: u64,
    /// Failed after their last attempt.
    pub failed: u64,
    pub attempts: u64,
    /// Aborted attempts / attempts.
    pub abort_rate: f64,
    pub latency_ms: Percentiles,
}

/// Per-type figures of a run's samples, in [`TxnType::ALL`] order (types never run left out).
fn type_stats(samples: &[KindSample]) -> Vec<TypeStats> {
    TxnType::ALL
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let of: Vec<&KindSample> = samples.iter().filter(|s| usize::from(s.kind) == i).collect();
            if of.is_empty() {
                return None;
            }
            let committed = of.iter().filter(|s| s.committed).count() as u64;
            let attempts: u64 = of.iter().map(|s| u64::from(s.attempts)).sum();
            let mut latencies: Vec<u64> = of.iter().filter(|s| s.committed).map(|s| s.latency_ns).collect();
            latencies.sort_unstable();
            let at = |q: f64| {
                latencies
                    .get(((latencies.len().max(1) - 1) as f64 * q).round() as usize)
                    .map_or(0.0, |n| *n as f64 / 1e6)
            };
            Some(TypeStats {
                name: t.name(),
                committed,
                failed: of.len() as u64 - committed,
                attempts,
                abort_rate: (attempts - committed) as f64 / attempts.max(1) as f64,
                latency_ms: Percentiles { p50: at(0.5), p90: at(0.9), p99: at(0.99) },
            })
        })
        .collect()
}

impl TxnBenchArgs {
    /// Validates the flags: the protocols in order (each once; `all`: every protocol, and on
    /// TPC-C the interactive forms of 2PL, OCC and Tapir besides) and the base bench.
    pub fn to_bench(&self, tpcc: bool) -> Result<(Vec<Protocol>, Bench), CliError> {
        let mut protocols = Vec::new();
        for name in self.protocols.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            let named: Vec<Protocol> = if name.eq_ignore_ascii_case("all") {
                Protocol::all(tpcc)
            } else {
                vec![name
                    .parse()
                    .map_err(|e: kairos_harness::micro::UnknownProtocol| CliError::Usage(format!("{e} (or all)")))?]
            };
            for p in named {
                if !protocols.contains(&p) {
                    protocols.push(p);
                }
            }
        }
        if protocols.is_empty() {
            return Err(CliError::Usage(format!(
                "--protocols needs at least one protocol: {} (comma-separated)",
                Protocol::all(tpcc).into_iter().map(Protocol::name).collect::<Vec<_>>().join(", ")
            )));
        }
        for l in &self.load {
            check_load("--load", *l)?;
        }
        if let Some(l) = self.sweep_start {
            check_load("--sweep-start", l)?;
        }
        if let Some(l) = self.common_load {
            check_load("--common-load", l)?;
        }
        if !(self.duration_s >= 0.5 && self.duration_s <= 600.0) {
            return Err(CliError::Usage(format!(
                "--duration-s must be between 0.5 and 600 virtual seconds, not {}",
                self.duration_s
            )));
        }
        // The per-message cost is filled in by `compare` (it may calibrate the host first).
        let cpu = match self.cpu_us {
            None => CpuModel::MEASURED,
            Some(us) if (0.0..=1_000_000.0).contains(&us) => CpuModel::Fixed(Duration::from_secs_f64(us / 1e6)),
            Some(us) => return Err(CliError::Usage(format!("--cpu-us must be between 0 and 1,000,000, not {us}"))),
        };
        let bench = Bench {
            base: TxnDeployment {
                seed: self.seed,
                clock: self.clock.into(),
                placement: self.placement.into(),
                duration: Duration::from_secs_f64(self.duration_s),
                cpu,
                ..Default::default()
            },
            shell: ShellConfig { admission_control: self.admission.admission_control, ..ShellConfig::default() },
            ..Bench::default()
        };
        Ok((protocols, bench))
    }
}

/// Refuses an offered load (`flag`, txn/s) that is not above 0 and at most [`LOAD_MAX`]: NaN and
/// 0 would run no transaction at all, and a huge one queues arrivals without bound. Shared with
/// `kairos sim --load`.
pub(crate) fn check_load(flag: &str, l: f64) -> Result<(), CliError> {
    if l > 0.0 && l <= LOAD_MAX {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "{flag} takes offered loads in transactions per second, above 0 and at most {LOAD_MAX}, not {l}"
        )))
    }
}

impl MicroBenchArgs {
    /// Validates the flags: the protocols in order (each once) and the base bench.
    pub fn to_bench(&self) -> Result<(Vec<Protocol>, Bench), CliError> {
        let (protocols, mut bench) = self.run.to_bench(false)?;
        if let Some(p) = protocols.iter().find(|p| Protocol::INTERACTIVE.contains(p)) {
            return Err(CliError::Usage(format!(
                "{p} differs from its one-shot form only on TPC-C (a by-name customer): run it with `kairos bench tpcc`"
            )));
        }
        if let Some(l) = self.sweep_load {
            check_load("--sweep-load", l)?;
        }
        for s in std::iter::once(&self.skew).chain(&self.skew_sweep) {
            if !(0.0..=5.0).contains(s) {
                return Err(CliError::Usage(format!("a skew is a Zipf exponent between 0 and 5, not {s}")));
            }
        }
        bench.base.skew = self.skew;
        bench.base.preload = !self.empty_stores;
        Ok((protocols, bench))
    }
}

impl TpccBenchArgs {
    /// Validates the flags: the protocols (`all`: those that run TPC-C) and the TPC-C bench.
    pub fn to_bench(&self) -> Result<(Vec<Protocol>, Bench), CliError> {
        let (protocols, mut bench) = self.run.to_bench(true)?;
        let mix = TpccMix::parse(&self.mix).map_err(|e| CliError::Usage(format!("--mix: {e}")))?;
        let scale = TpccScale {
            warehouses: self.warehouses,
            customers_per_district: self.customers_per_district,
            initial_orders_per_district: self.initial_orders_per_district,
            items: self.items,
            ..TpccScale::default()
        };
        scale.validate(TPCC_SHARDS).map_err(|e| CliError::Usage(e.to_string()))?;
        bench.base.shards = TPCC_SHARDS;
        let delivery = match self.delivery {
            DeliveryArg::District => DeliveryScope::District,
            DeliveryArg::Warehouse => DeliveryScope::Warehouse,
        };
        bench.tpcc = Some(TpccBench { scale, mix, delivery, interactive: false });
        Ok((protocols, bench))
    }
}

/// Runs one protocol at one load and skew, with a progress bar, and checks its history.
pub fn run_point(bench: &Bench, protocol: Protocol) -> Result<Point, CliError> {
    let bar = progress::bar(100, protocol.name());
    bar.set_message(format!("{:.0} txn/s, skew {}", bench.base.load_txn_per_s, bench.base.skew));
    let outcome =
        bench.run(protocol, |f| bar.set_position((f * 100.0) as u64)).map_err(|e| CliError::Usage(e.to_string()))?;
    bar.set_message(format!("checking {} transactions", outcome.history.len() / 2));
    let report = kairos_check::check(&outcome.history, Model::StrictSerializable).map_err(|e| {
        CliError::Runtime(format!("the simulator wrote a history the checker cannot read (a Kairos bug): {e}"))
    })?;
    bar.finish_and_clear();
    let totals = outcome.totals();
    // A TPC-C run is valid only if its databases are too.
    let verdict = match &outcome.tpcc {
        Some(t) if !t.holds() && !t.read_in_flight => Verdict::Invalid,
        _ => Verdict::of(&report),
    };
    let result = run_result(bench, &outcome, &report);
    progress::say(
        &bar,
        format!(
            "{:>9} {:>8.0} txn/s offered → {:>8.0} txn/s, p50 {:>6.1} ms, commit rate {:.3}, {} ({:.1} s wall)",
            protocol.name(),
            bench.base.load_txn_per_s,
            window_throughput(&outcome.history, bench.base.duration),
            result.latency_ms.p50,
            totals.commit_rate(),
            verdict.label(),
            outcome.wall.as_secs_f64(),
        ),
    );
    if verdict == Verdict::Invalid {
        progress::say(&bar, report.to_string());
    }
    if let Some(t) = outcome.tpcc.as_ref().filter(|t| !t.holds()) {
        progress::say(&bar, tpcc_failures(t));
    }
    let us_per_commit = |d: Duration| d.as_secs_f64() * 1e6 / totals.committed.max(1) as f64;
    Ok(Point {
        protocol,
        offered_txn_per_s: bench.base.load_txn_per_s,
        skew: bench.base.skew,
        admitted_txn_per_s: (bench.base.load_txn_per_s
            - totals.admission_dropped as f64 / bench.base.duration.as_secs_f64().max(1e-9))
        .max(0.0),
        throughput_txn_per_s: window_throughput(&outcome.history, bench.base.duration),
        latency_ms: result.latency_ms.clone(),
        latency_ms_by_region: result.latency_ms_by_region.clone(),
        commit_rate: totals.commit_rate(),
        messages_per_commit: outcome.stats.messages_sent as f64 / totals.committed.max(1) as f64,
        busiest_server_us_per_commit: us_per_commit(outcome.busiest_server),
        busiest_server_wire_us_per_commit: us_per_commit(outcome.busiest_server_wire),
        coordinators_us_per_commit: us_per_commit(outcome.coordinators_busy),
        coordinators_wire_us_per_commit: us_per_commit(outcome.coordinators_wire),
        verdict,
        tpcc: outcome.tpcc.clone(),
        by_type: type_stats(&outcome.kinds),
        result,
    })
}

/// What a TPC-C run's database checks found wrong, for the terminal.
fn tpcc_failures(t: &TpccOutcome) -> String {
    let mut lines = vec![format!(
        "TPC-C databases: {} of {} consistency conditions violated, {} replicas differ, {} pieces refused{}",
        t.consistency.violations,
        t.consistency.checked,
        t.replicas_differ.len(),
        t.pieces_refused,
        if t.read_in_flight {
            " (not judged: transactions were still in flight when the rows were read, a drain's length after \
             the drain)"
        } else {
            ""
        }
    )];
    lines.extend(t.consistency.shown.iter().chain(&t.replicas_differ).map(|v| format!("  {v}")));
    lines.join("\n")
}

/// The result contract of one run.
fn run_result(bench: &Bench, outcome: &RunOutcome, report: &CheckReport) -> RunResult {
    let summary = stats::summarize(&outcome.history, |p| outcome.region_of_process(p).map(str::to_string));
    let (cdf, cdf_by_region) =
        stats::latency_cdfs(&outcome.history, |_| true, |e| outcome.region_of_process(e.process).map(str::to_string));
    let totals = outcome.totals();
    let mut extra = BTreeMap::new();
    extra.insert("commit_rate".into(), totals.commit_rate().into());
    extra.insert("attempts".into(), totals.attempts.into());
    extra.insert("aborted_attempts".into(), totals.aborted_attempts.into());
    extra.insert("messages_sent".into(), outcome.stats.messages_sent.into());
    extra.insert("events_handled".into(), outcome.stats.events_handled.into());
    extra.insert("placement".into(), format!("{:?}", bench.base.placement).to_lowercase().into());
    extra.insert("cpu_model".into(), format!("{:?}", bench.base.cpu).into());
    let has_fast_path =
        matches!(outcome.protocol, Protocol::Tiga | Protocol::Tapir | Protocol::Janus | Protocol::CalvinPlus);
    let workload = match &bench.tpcc {
        None => {
            serde_json::json!({ "name": "micro", "skew": bench.base.skew, "keys_per_shard": bench.base.keys_per_shard, "shards": bench.base.shards, "keys_per_txn": 3, "keys_loaded": bench.base.preload })
        }
        Some(t) => serde_json::json!({
            "name": "tpcc",
            "shards": bench.base.shards,
            "warehouses": t.scale.warehouses,
            "districts_per_warehouse": t.scale.districts_per_warehouse,
            "customers_per_district": t.scale.customers_per_district,
            "initial_orders_per_district": t.scale.initial_orders_per_district,
            "items": t.scale.items,
            "mix": t.mix.to_string(),
            "delivery": t.delivery.name(),
        }),
    };
    if let Some(t) = &outcome.tpcc {
        extra.insert(
            "tpcc_consistency".into(),
            serde_json::json!({
                "conditions_checked": t.consistency.checked,
                "violations": t.consistency.violations,
                "shown": t.consistency.shown,
                "replicas_differ": t.replicas_differ,
                "replicas_behind": t.replicas_behind,
                "pieces_refused": t.pieces_refused,
                "orders_placed": t.orders_placed,
                "payments_made": t.payments_made,
                "read_in_flight": t.read_in_flight,
            }),
        );
    }
    RunResult {
        system: "tiga".into(),
        protocol: outcome.protocol.name().into(),
        workload,
        host: "sim".into(),
        clock: bench.base.clock.to_string(),
        seed: bench.base.seed,
        duration_s: bench.base.duration.as_secs_f64(),
        offered_ops_per_s: Some(bench.base.load_txn_per_s),
        throughput_ops_per_s: window_throughput(&outcome.history, bench.base.duration),
        latency_ms: summary.overall,
        latency_ms_by_region: summary.by_group,
        latency_cdf_ms: cdf,
        latency_cdf_ms_by_region: cdf_by_region,
        latency_cdf_ms_by_op: TxnType::ALL
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let of = outcome.kinds.iter().filter(|s| s.committed && usize::from(s.kind) == i);
                (t.name().to_string(), stats::cdf_of(of.map(|s| s.latency_ns).collect()))
            })
            .filter(|(_, cdf)| !cdf.is_empty())
            .collect(),
        committed: summary.ok,
        aborted: summary.failed,
        unknown: summary.unknown,
        fast_path_ratio: has_fast_path.then(|| {
            if totals.committed == 0 {
                0.0
            } else {
                totals.committed_fast as f64 / totals.committed as f64
            }
        }),
        rollback_ratio: None,
        round_trips: None,
        check: CheckResult::from_report(report),
        trace_hash: Some(format!("{:016x}", outcome.trace_hash)),
        wall_s: outcome.wall.as_secs_f64(),
        extra,
    }
}

/// One protocol's throughput search: its points, and why it ended.
pub struct Search {
    pub protocol: Protocol,
    pub points: Vec<Point>,
    pub end: SearchEnd,
}

/// Why a throughput search ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearchEnd {
    /// `--load` was given: exactly those loads ran.
    GivenLoads,
    /// Past saturation, doubling the load no longer raised the best throughput by
    /// [`PAST_SATURATION_GAIN_MIN`].
    Saturated,
    /// The next point past saturation would offer more than [`PAST_SATURATION_TXNS_MAX`]
    /// transactions, or the last took more than [`PAST_SATURATION_WALL_BEFORE_MAX`], or the
    /// next would take more than [`PAST_SATURATION_WALL_PREDICTED_MAX`]: a higher load might
    /// still sustain more.
    CostBound,
    /// The sweep ran out of points or loads before it saturated.
    PointsBound,
}

impl SearchEnd {
    fn name(self) -> &'static str {
        match self {
            SearchEnd::GivenLoads => "given-loads",
            SearchEnd::Saturated => "saturated",
            SearchEnd::CostBound => "cost-bound",
            SearchEnd::PointsBound => "points-bound",
        }
    }
}

impl Search {
    pub fn max_txn_per_s(&self) -> f64 {
        self.points.iter().map(|p| p.throughput_txn_per_s).fold(0.0, f64::max)
    }

    /// Whether the sweep stopped before showing that a higher load sustains no more.
    pub fn max_is_lower_bound(&self) -> bool {
        matches!(self.end, SearchEnd::CostBound | SearchEnd::PointsBound)
    }

    /// The best throughput among the points whose median latency stayed within
    /// [`P50_BOUND_OVER_COMMON`] times `common_p50_ms` (the protocol's median at the common
    /// load); `None` when no point did.
    pub fn max_txn_per_s_within_p50_bound(&self, common_p50_ms: f64) -> Option<f64> {
        best_within_p50_bound(self.points.iter().map(|p| (p.throughput_txn_per_s, p.latency_ms.p50)), common_p50_ms)
    }
}

/// [`Search::max_txn_per_s_within_p50_bound`] of `protocol`'s search, against its p50 in `common`.
fn p50_bounded_max(searches: &[Search], common: &[Point], protocol: Protocol) -> Option<f64> {
    let search = searches.iter().find(|s| s.protocol == protocol)?;
    let common_p50_ms = common.iter().find(|p| p.protocol == protocol)?.latency_ms.p50;
    search.max_txn_per_s_within_p50_bound(common_p50_ms)
}

/// Of `(throughput, p50 ms)` points, the best throughput whose p50 is at most
/// [`P50_BOUND_OVER_COMMON`] × `common_p50_ms`. Past their knee many protocols commit more only
/// by queueing longer (Tiga on TPC-C under measured CPU: 102k txn/s at p50 230 ms, 128k at
/// 646 ms; Janus's and Detock's maxima sat at p50 0.7-1.4 s), so the plain maximum says how
/// much a protocol can commit, and this one how much it can commit at about its usual latency.
fn best_within_p50_bound(points: impl Iterator<Item = (f64, f64)>, common_p50_ms: f64) -> Option<f64> {
    let bound = P50_BOUND_OVER_COMMON * common_p50_ms;
    points.filter(|(_, p50)| *p50 <= bound).map(|(throughput, _)| throughput).reduce(f64::max)
}

/// The throughput search of one protocol: the given loads, or a sweep from `sweep_start`.
///
/// The sweep doubles the load while throughput follows it (within 5 %), then steps by 1.25×
/// up to the first saturated load (throughput below [`SATURATED_SHARE`] of it). Many peers'
/// throughput keeps rising past that point: their transactions wait on locks or dependencies
/// rather than on a CPU, so more of them in flight commit more per second (OCC+Paxos on TPC-C
/// went from 184 at its first saturated load to 351 at 2,000 offered, Janus from 404 to
/// 3,298). So past it the sweep keeps doubling while each doubling raises the best throughput
/// by [`PAST_SATURATION_GAIN_MIN`], as long as a point offers at most
/// [`PAST_SATURATION_TXNS_MAX`] transactions, the one before it took at most
/// [`PAST_SATURATION_WALL_BEFORE_MAX`] and it is not foreseen to take more than
/// [`PAST_SATURATION_WALL_PREDICTED_MAX`]; a search that stops at these bounds says so.
fn saturation_search(
    args: &TxnBenchArgs,
    sweep_start: f64,
    template: &Bench,
    protocol: Protocol,
) -> Result<Search, CliError> {
    let mut points = Vec::new();
    let run = |load: f64| run_point(&template.at_load(load), protocol);
    if !args.load.is_empty() {
        for &load in &args.load {
            points.push(run(load)?);
        }
        return Ok(Search { protocol, points, end: SearchEnd::GivenLoads });
    }
    let mut sweep = Sweep::new(args.sweep_start.unwrap_or(sweep_start), template.base.duration.as_secs_f64());
    let end = loop {
        match sweep.next_load() {
            Ok(load) => {
                let p = run(load)?;
                sweep.record(p.throughput_txn_per_s, Duration::from_secs_f64(p.result.wall_s));
                points.push(p);
            }
            Err(end) => break end,
        }
    };
    Ok(Search { protocol, points, end })
}

/// The rule of [`saturation_search`]'s sweep, apart from running its points.
struct Sweep {
    next_load: f64,
    duration_s: f64,
    last_wall: Duration,
    /// The wall time of the point before the last one.
    previous_wall: Duration,
    points: usize,
    best: f64,
    saturated: bool,
    end: Option<SearchEnd>,
}

impl Sweep {
    fn new(start_load: f64, duration_s: f64) -> Self {
        Sweep {
            next_load: start_load,
            duration_s,
            last_wall: Duration::ZERO,
            previous_wall: Duration::ZERO,
            points: 0,
            best: 0.0,
            saturated: false,
            end: None,
        }
    }

    /// The load of the next point, or why the sweep ends.
    fn next_load(&self) -> Result<f64, SearchEnd> {
        if let Some(end) = self.end {
            return Err(end);
        }
        if self.points >= SWEEP_POINTS_MAX || self.next_load > LOAD_MAX {
            return Err(SearchEnd::PointsBound);
        }
        if self.saturated
            && (self.next_load * self.duration_s > PAST_SATURATION_TXNS_MAX
                || self.last_wall > PAST_SATURATION_WALL_BEFORE_MAX
                || self.next_wall_predicted() > PAST_SATURATION_WALL_PREDICTED_MAX)
        {
            return Err(SearchEnd::CostBound);
        }
        Ok(self.next_load)
    }

    /// The next point's wall time: the last one's, times its growth over the one before (at
    /// least 1).
    fn next_wall_predicted(&self) -> Duration {
        let growth = self.last_wall.as_secs_f64() / self.previous_wall.as_secs_f64().max(1e-9);
        self.last_wall.mul_f64(growth.clamp(1.0, 1e6))
    }

    /// Takes the throughput of the point run at [`Sweep::next_load`], and the wall time it took.
    fn record(&mut self, throughput: f64, wall: Duration) {
        let load = self.next_load;
        let gained = throughput >= self.best * (1.0 + PAST_SATURATION_GAIN_MIN);
        self.previous_wall = self.last_wall;
        (self.last_wall, self.points, self.best) = (wall, self.points + 1, self.best.max(throughput));
        if self.saturated {
            if !gained {
                self.end = Some(SearchEnd::Saturated);
            }
            self.next_load = load * 2.0;
            return;
        }
        let share = throughput / load;
        self.saturated = share < SATURATED_SHARE;
        // Double while throughput follows the load; approach the first saturated load in
        // smaller steps (an overloaded run costs more wall time than it tells).
        self.next_load = load * if self.saturated || share >= 0.95 { 2.0 } else { 1.25 };
    }
}

pub fn bench(args: MicroBenchArgs) -> Result<(), CliError> {
    let (protocols, template) = args.to_bench()?;
    let title = format!("MicroBench, skew {}", template.base.skew);
    let skews = SkewSweep { skews: &args.skew_sweep, load: args.sweep_load };
    compare(&args.run, protocols, template, &title, 2_000.0, Some(skews))
}

pub fn bench_tpcc(args: TpccBenchArgs) -> Result<(), CliError> {
    let (protocols, template) = args.to_bench()?;
    let tpcc = template.tpcc.expect("to_bench sets TPC-C");
    let title = format!(
        "TPC-C, {} warehouses on {} shards × 3 replicas, mix {}, delivery per {}, {} customers and {} initial orders per \
         district, {} items",
        tpcc.scale.warehouses,
        template.base.shards,
        tpcc.mix,
        tpcc.delivery.name(),
        tpcc.scale.customers_per_district,
        tpcc.scale.initial_orders_per_district,
        tpcc.scale.items
    );
    compare(&args.run, protocols, template, &title, 250.0, None)
}

/// MicroBench's optional skew sweep: these skews at this load (default: the common load).
struct SkewSweep<'a> {
    skews: &'a [f64],
    load: Option<f64>,
}

/// Runs the comparison of `protocols` on `template`'s work and prints and writes its results.
fn compare(
    args: &TxnBenchArgs,
    protocols: Vec<Protocol>,
    mut template: Bench,
    title: &str,
    sweep_start: f64,
    skew_sweep: Option<SkewSweep>,
) -> Result<(), CliError> {
    let mut message_cost = None;
    if let CpuModel::Measured { wire, .. } = &mut template.base.cpu {
        let (calibrated, source) = super::net::wire_cost(args.message_cost_us)?;
        *wire = calibrated;
        message_cost = Some(source);
    }
    let stores = match (&template.tpcc, template.base.preload) {
        (None, true) => ", keys loaded before each run",
        (None, false) => ", stores empty at the start",
        (Some(_), _) => "",
    };
    println!(
        "{title}{stores}, {} clocks, {} leaders, seed {}, {} virtual s per run, CPU: {}",
        template.base.clock,
        if template.base.placement == Placement::CoLocated { "co-located" } else { "separated" },
        template.base.seed,
        template.base.duration.as_secs_f64(),
        match &template.base.cpu {
            CpuModel::Fixed(d) => format!("fixed {} µs per handler", d.as_secs_f64() * 1e6),
            CpuModel::Measured { wire, .. } if !wire.is_zero() => format!(
                "{} ({}; compare within this run only)",
                super::net::cpu_header(wire),
                if args.message_cost_us.is_some() { "--message-cost-us" } else { "calibrated on this host now" }
            ),
            _ => "measured handler time only (compare within this run only)".into(),
        }
    );
    let mut searches: Vec<Search> = Vec::new();
    for &p in &protocols {
        eprintln!("— {p}: maximum throughput");
        searches.push(saturation_search(args, sweep_start, &template, p)?);
    }
    let common_load = args.common_load.unwrap_or_else(|| {
        let lowest = searches.iter().map(Search::max_txn_per_s).fold(f64::INFINITY, f64::min);
        ((lowest / 2.0 / 100.0).floor() * 100.0).max(100.0)
    });
    let mut common = Vec::new();
    for &p in &protocols {
        eprintln!("— {p}: latency at the common load of {common_load:.0} txn/s");
        common.push(run_point(&template.at_load(common_load), p)?);
    }
    let mut skew_points: Vec<Point> = Vec::new();
    let (skews, sweep_load) = match &skew_sweep {
        Some(s) => (s.skews, s.load.unwrap_or(common_load)),
        None => (&[][..], common_load),
    };
    for &skew in skews {
        for &p in &protocols {
            eprintln!("— {p}: skew {skew} at {sweep_load:.0} txn/s");
            let mut bench = template.at_load(sweep_load);
            bench.base.skew = skew;
            skew_points.push(run_point(&bench, p)?);
        }
    }

    print_searches(&searches);
    let regions: Vec<String> = template.base.coordinator_regions.iter().map(|(r, _)| r.clone()).collect();
    print_comparison(&regions, Some(&searches), &common, common_load, template.tpcc.is_some());
    if template.tpcc.is_some() {
        print_by_type(&common, common_load);
    }
    if !skew_points.is_empty() {
        print_skew_sweep(&protocols, skews, &skew_points, sweep_load);
    }
    let mut all_points = searches.iter().flat_map(|s| &s.points).chain(&common).chain(&skew_points);
    if all_points.clone().any(|p| p.verdict == Verdict::Unverified) {
        println!(
            "* unverified: no checker could decide the history (the report says why). Such runs are neither shown \
             valid nor invalid."
        );
    }

    let invalid = all_points
        .find(|p| p.verdict == Verdict::Invalid)
        .map(|p| (p.protocol, p.offered_txn_per_s, p.skew, p.tpcc.as_ref().is_some_and(|t| !t.holds())));
    if args.json.is_some() || args.plot.is_some() {
        let mut results = json_results(&searches, common, &skew_points);
        if let Some(source) = &message_cost {
            for r in &mut results {
                r.extra.insert("message_cost".into(), source.clone());
            }
        }
        if let Some(path) = &args.json {
            result::write_json(path, &results)?;
            println!("wrote {}", path.display());
        }
        if let Some(path) = &args.plot {
            let title = format!("{title} at {common_load:.0} txn/s: commit latency CDF");
            crate::report::write_run_figure(path, &title, &results)?;
        }
    }
    let Some((protocol, load, skew, databases)) = invalid else { return Ok(()) };
    let what = if databases {
        "left TPC-C databases that fail their checks (see above)"
    } else {
        "has a history that is not strictly serializable"
    };
    let skew_flag = if template.tpcc.is_some() { String::new() } else { format!(" --skew {skew}") };
    Err(CliError::Anomaly(format!(
        "{protocol} at {load:.0} txn/s, seed {} {what} ({})",
        template.base.seed,
        match template.base.cpu {
            CpuModel::Fixed(_) => format!("replay with --seed {} --load {load}{skew_flag}", template.base.seed),
            _ => "measured CPU times vary between runs: rerun with --cpu-us for a bit-for-bit replay".into(),
        }
    )))
}

fn print_searches(searches: &[Search]) {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "protocol",
        "offered txn/s",
        "admitted txn/s",
        "throughput txn/s",
        "p50 ms",
        "p90 ms",
        "commit rate",
        "check",
    ]);
    for search in searches {
        for pt in &search.points {
            t.add_row([
                search.protocol.name().to_string(),
                format!("{:.0}", pt.offered_txn_per_s),
                format!("{:.0}", pt.admitted_txn_per_s),
                format!("{:.0}", pt.throughput_txn_per_s),
                format!("{:.1}", pt.latency_ms.p50),
                format!("{:.1}", pt.latency_ms.p90),
                format!("{:.3}", pt.commit_rate),
                pt.verdict.label().into(),
            ]);
        }
    }
    println!("\nThroughput search:\n{t}");
}

/// The protocol's maximum throughput in the Tiga paper's Table 1, on MicroBench (skew 0.5) or
/// on TPC-C, if the table has it (its NCC column is NCC without replication, all servers in one
/// region; NCC+ is not in the table).
fn paper_max_txn_per_s(tpcc: bool, p: Protocol) -> Option<f64> {
    if tpcc {
        return match p {
            Protocol::Tiga => Some(21_600.0),
            // The paper has one row for each, whichever form it ran.
            Protocol::TwoPlPaxos | Protocol::TwoPlPaxosInteractive => Some(2_100.0),
            Protocol::OccPaxos | Protocol::OccPaxosInteractive => Some(900.0),
            Protocol::Tapir | Protocol::TapirInteractive => Some(1_100.0),
            Protocol::Janus => Some(10_800.0),
            Protocol::CalvinPlus => Some(6_100.0),
            Protocol::Detock => Some(13_300.0),
            Protocol::Ncc => Some(860.0),
            Protocol::NccPaxos => None,
        };
    }
    match p {
        Protocol::Tiga => Some(157_300.0),
        Protocol::TwoPlPaxos => Some(22_900.0),
        Protocol::OccPaxos => Some(21_800.0),
        Protocol::Tapir => Some(44_200.0),
        Protocol::Janus => Some(77_800.0),
        Protocol::CalvinPlus => Some(119_600.0),
        Protocol::Detock => Some(34_500.0),
        Protocol::Ncc => Some(47_400.0),
        Protocol::NccPaxos
        | Protocol::TwoPlPaxosInteractive
        | Protocol::OccPaxosInteractive
        | Protocol::TapirInteractive => None,
    }
}

/// The side-by-side table: per protocol, its maximum throughput and Tiga's ratio over it (when
/// `searches` are given; the paper's figures are its TPC-C row when `tpcc`), and its latency at
/// the common load against Tiga's.
pub fn print_comparison(
    regions: &[String],
    searches: Option<&[Search]>,
    common: &[Point],
    common_load: f64,
    tpcc: bool,
) {
    let search_of = |p: Protocol| searches?.iter().find(|s| s.protocol == p);
    let tiga_max = search_of(Protocol::Tiga).map(Search::max_txn_per_s);
    let tiga_p50 = common.iter().find(|p| p.protocol == Protocol::Tiga).map(|p| p.latency_ms.p50);
    let bounded_max = |p: Protocol| searches.and_then(|s| p50_bounded_max(s, common, p));
    let tiga_bounded = bounded_max(Protocol::Tiga);
    let ratio = |num: f64, den: f64| if den > 0.0 { format!("{:.2}", num / den) } else { "-".into() };
    let mut header = vec!["protocol".to_string()];
    if searches.is_some() {
        header.extend(["max txn/s", "Tiga ×", "max txn/s, p50 ≤ 2×", "Tiga × (p50 ≤ 2×)"].map(String::from));
        header.extend(["paper max txn/s", "paper Tiga ×"].map(String::from));
    }
    header.extend(["p50 ms", "p90 ms", "p50 / Tiga"].map(String::from));
    header.extend(regions.iter().map(|r| format!("{r} p50/p90 ms")));
    header.extend(
        ["commit rate", "msgs / commit", "busiest µs / commit (wire)", "coordinators µs / commit (wire)", "check"]
            .map(String::from),
    );
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(header);
    for pt in common {
        let mut row = vec![pt.protocol.name().to_string()];
        if searches.is_some() {
            let search = search_of(pt.protocol);
            let max = search.map_or(0.0, Search::max_txn_per_s);
            let bound = if search.is_some_and(Search::max_is_lower_bound) { "≥ " } else { "" };
            row.push(format!("{bound}{max:.0}"));
            row.push(tiga_max.map_or("-".into(), |t| ratio(t, max)));
            let bounded = bounded_max(pt.protocol);
            row.push(bounded.map_or("-".into(), |b| format!("{b:.0}")));
            row.push(match (tiga_bounded, bounded) {
                (Some(t), Some(b)) => ratio(t, b),
                _ => "-".into(),
            });
            match (paper_max_txn_per_s(tpcc, pt.protocol), paper_max_txn_per_s(tpcc, Protocol::Tiga)) {
                (Some(paper), Some(tiga)) => {
                    row.push(format!("{paper:.0}"));
                    row.push(ratio(tiga, paper));
                }
                _ => row.extend(["-".to_string(), "-".to_string()]),
            }
        }
        row.push(format!("{:.1}", pt.latency_ms.p50));
        row.push(format!("{:.1}", pt.latency_ms.p90));
        row.push(tiga_p50.map_or("-".into(), |t| ratio(pt.latency_ms.p50, t)));
        for r in regions {
            row.push(match pt.latency_ms_by_region.get(r) {
                Some(l) => format!("{:.0} / {:.0}", l.p50, l.p90),
                None => "-".into(),
            });
        }
        row.push(format!("{:.3}", pt.commit_rate));
        row.push(format!("{:.1}", pt.messages_per_commit));
        row.push(format!("{:.1} ({:.1})", pt.busiest_server_us_per_commit, pt.busiest_server_wire_us_per_commit));
        row.push(format!("{:.1} ({:.1})", pt.coordinators_us_per_commit, pt.coordinators_wire_us_per_commit));
        row.push(pt.verdict.label().into());
        t.add_row(row);
    }
    if searches.is_some() {
        println!(
            "\nSide by side: maximum throughput, and latency at a common load of {common_load:.0} txn/s \
             (Tiga ×: Tiga's maximum throughput over the protocol's; paper: the Tiga paper's Table 1{}):\n{t}",
            if tpcc { ", TPC-C row" } else { "" }
        );
        println!(
            "p50 ≤ 2×: the best throughput among the protocol's search points whose p50 stayed within \
             {P50_BOUND_OVER_COMMON}× its p50 at the common load (- when none did): past their knee many protocols \
             commit more only by queueing longer."
        );
        if searches.is_some_and(|s| s.iter().any(Search::max_is_lower_bound)) {
            println!(
                "≥: the sweep stopped before this protocol's throughput stopped rising (its next point would offer more \
                 than {PAST_SATURATION_TXNS_MAX:.0} transactions, or its last took more than {} s of wall time, or its \
                 next would take more than {} s, going by the last two); pass --load with higher loads to go on.",
                PAST_SATURATION_WALL_BEFORE_MAX.as_secs(),
                PAST_SATURATION_WALL_PREDICTED_MAX.as_secs()
            );
        }
    } else {
        println!("\nSide by side at {common_load:.0} txn/s:\n{t}");
    }
}

/// Per protocol and transaction type at the common load: latency, commits and abort rate.
pub fn print_by_type(common: &[Point], load: f64) {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(["protocol", "type", "committed", "failed", "p50 ms", "p90 ms", "abort rate"]);
    for pt in common {
        for ty in &pt.by_type {
            t.add_row([
                pt.protocol.name().to_string(),
                ty.name.to_string(),
                ty.committed.to_string(),
                ty.failed.to_string(),
                format!("{:.1}", ty.latency_ms.p50),
                format!("{:.1}", ty.latency_ms.p90),
                format!("{:.3}", ty.abort_rate),
            ]);
        }
    }
    println!("\nBy transaction type at {load:.0} txn/s (abort rate: aborted attempts / attempts):\n{t}");
}

fn print_skew_sweep(protocols: &[Protocol], skews: &[f64], points: &[Point], load: f64) {
    let mut header = vec!["skew".to_string()];
    for p in protocols {
        header.push(format!("{p} p50/p90 ms"));
        header.push(format!("{p} commit rate"));
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(header);
    for &skew in skews {
        let mut row = vec![format!("{skew}")];
        for &p in protocols {
            match points.iter().find(|pt| pt.protocol == p && pt.skew == skew) {
                Some(pt) => {
                    row.push(format!(
                        "{:.0} / {:.0}{}",
                        pt.latency_ms.p50,
                        pt.latency_ms.p90,
                        if pt.verdict == Verdict::Valid { "" } else { " !" }
                    ));
                    row.push(format!("{:.3}", pt.commit_rate));
                }
                None => row.extend(["-".to_string(), "-".to_string()]),
            }
        }
        t.add_row(row);
    }
    println!("\nSkew sweep at {load:.0} txn/s (! = not verified valid):\n{t}");
}

/// One result per protocol: its common-load run, with the maximum throughput, the ratios and
/// both sweeps in `extra`.
fn json_results(searches: &[Search], common: Vec<Point>, skew_points: &[Point]) -> Vec<RunResult> {
    let tiga_max = searches.iter().find(|s| s.protocol == Protocol::Tiga).map(Search::max_txn_per_s);
    let tiga_p50 = common.iter().find(|p| p.protocol == Protocol::Tiga).map(|p| p.latency_ms.p50);
    let tiga_bounded = p50_bounded_max(searches, &common, Protocol::Tiga);
    let brief = |pt: &Point| {
        serde_json::json!({
            "offered_txn_per_s": pt.offered_txn_per_s,
            "admitted_txn_per_s": pt.admitted_txn_per_s,
            "skew": pt.skew,
            "throughput_txn_per_s": pt.throughput_txn_per_s,
            "latency_ms": pt.latency_ms,
            "commit_rate": pt.commit_rate,
            "messages_per_commit": pt.messages_per_commit,
            "busiest_server_us_per_commit": pt.busiest_server_us_per_commit,
            "busiest_server_wire_us_per_commit": pt.busiest_server_wire_us_per_commit,
            "coordinators_us_per_commit": pt.coordinators_us_per_commit,
            "coordinators_wire_us_per_commit": pt.coordinators_wire_us_per_commit,
            "verdict": pt.verdict.label().trim_end_matches('*'),
        })
    };
    common
        .into_iter()
        .map(|pt| {
            let mut r = pt.result;
            let search = searches.iter().find(|s| s.protocol == pt.protocol);
            let max = search.map_or(0.0, Search::max_txn_per_s);
            r.extra.insert("max_throughput_txn_per_s".into(), max.into());
            if let Some(t) = tiga_max.filter(|_| max > 0.0) {
                r.extra.insert("tiga_throughput_ratio".into(), (t / max).into());
            }
            if let Some(t) = tiga_p50.filter(|t| *t > 0.0) {
                r.extra.insert("p50_over_tiga".into(), (pt.latency_ms.p50 / t).into());
            }
            let bounded = search.and_then(|s| s.max_txn_per_s_within_p50_bound(pt.latency_ms.p50));
            if let Some(b) = bounded {
                r.extra.insert("max_throughput_p50_bounded_txn_per_s".into(), b.into());
                r.extra.insert("p50_bound_over_common".into(), P50_BOUND_OVER_COMMON.into());
            }
            if let Some(t) = tiga_bounded.zip(bounded).filter(|(_, b)| *b > 0.0).map(|(t, b)| t / b) {
                r.extra.insert("tiga_throughput_ratio_p50_bounded".into(), t.into());
            }
            if let Some(search) = search {
                r.extra.insert("throughput_search".into(), search.points.iter().map(brief).collect::<Vec<_>>().into());
                r.extra.insert("throughput_search_end".into(), search.end.name().into());
                r.extra.insert("max_throughput_is_lower_bound".into(), search.max_is_lower_bound().into());
            }
            let skews: Vec<_> = skew_points.iter().filter(|p| p.protocol == pt.protocol).map(brief).collect();
            if !skews.is_empty() {
                r.extra.insert("skew_sweep".into(), skews.into());
            }
            r.extra.insert("verdict".into(), pt.verdict.label().trim_end_matches('*').into());
            if !pt.by_type.is_empty() {
                r.extra.insert("by_type".into(), serde_json::to_value(&pt.by_type).unwrap_or_default());
            }
            r.extra.insert("messages_per_commit".into(), pt.messages_per_commit.into());
            r.extra.insert("busiest_server_us_per_commit".into(), pt.busiest_server_us_per_commit.into());
            r.extra.insert("busiest_server_wire_us_per_commit".into(), pt.busiest_server_wire_us_per_commit.into());
            r.extra.insert("coordinators_us_per_commit".into(), pt.coordinators_us_per_commit.into());
            r.extra.insert("coordinators_wire_us_per_commit".into(), pt.coordinators_wire_us_per_commit.into());
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loads a sweep from 250 txn/s over `duration_s` runs on a protocol whose throughput at
    /// each load is `curve(load)`, each point taking a second of wall time, and why it ends.
    fn sweep_on(curve: impl Fn(f64) -> f64, duration_s: f64) -> (Vec<f64>, SearchEnd) {
        sweep_timed(|load| (curve(load), Duration::from_secs(1)), duration_s)
    }

    /// As `sweep_on`, with the wall time of each point from the curve too.
    fn sweep_timed(curve: impl Fn(f64) -> (f64, Duration), duration_s: f64) -> (Vec<f64>, SearchEnd) {
        let mut sweep = Sweep::new(250.0, duration_s);
        let mut loads = Vec::new();
        loop {
            match sweep.next_load() {
                Ok(load) => {
                    loads.push(load);
                    let (throughput, wall) = curve(load);
                    sweep.record(throughput, wall);
                }
                Err(end) => return (loads, end),
            }
        }
    }

    #[test]
    fn the_latency_bounded_maximum_counts_only_points_within_twice_the_common_p50() {
        let points = [(1_000.0, 200.0), (4_000.0, 390.0), (8_000.0, 401.0), (3_000.0, 250.0)];
        assert_eq!(best_within_p50_bound(points.into_iter(), 200.0), Some(4_000.0));
        assert_eq!(best_within_p50_bound(points.into_iter(), 201.0), Some(8_000.0));
        assert_eq!(best_within_p50_bound(points.into_iter(), 90.0), None);
    }

    #[test]
    fn a_hard_knee_ends_one_doubling_past_saturation() {
        let (loads, end) = sweep_on(|load| load.min(1_000.0), 3.0);
        assert_eq!(loads, [250.0, 500.0, 1_000.0, 2_000.0, 4_000.0]);
        assert_eq!(end, SearchEnd::Saturated);
    }

    #[test]
    fn a_soft_knee_is_followed_while_throughput_rises_then_bounded_by_cost() {
        // Saturated at 2,500 offered (2,000 sustained), yet still 41 % more per doubling.
        let curve = |load: f64| load.min(40.0 * load.sqrt());
        let (loads, end) = sweep_on(curve, 3.0);
        assert_eq!(loads, [250.0, 500.0, 1_000.0, 2_000.0, 2_500.0, 5_000.0, 10_000.0, 20_000.0]);
        // 40,000 txn/s for 3 s would offer 120,000 transactions.
        assert_eq!(end, SearchEnd::CostBound);
        // The same curve over 1 s runs goes one doubling further.
        let (loads, end) = sweep_on(curve, 1.0);
        assert_eq!(loads.last(), Some(&80_000.0));
        assert_eq!(end, SearchEnd::CostBound);
        // Points whose wall time grows faster than their load stop it sooner: 40 s at 10,000.
        let (loads, end) = sweep_timed(|load| (curve(load), Duration::from_secs_f64(load / 250.0)), 3.0);
        assert_eq!(loads.last(), Some(&10_000.0));
        assert_eq!(end, SearchEnd::CostBound);
        // Or with the square of the load: 16 s at 10,000, so 64 s foreseen at 20,000.
        let square = |load: f64| Duration::from_secs_f64((load / 2_500.0).powi(2));
        let (loads, end) = sweep_timed(|load| (curve(load), square(load)), 3.0);
        assert_eq!(loads.last(), Some(&10_000.0));
        assert_eq!(end, SearchEnd::CostBound);
    }

    #[test]
    fn a_collapse_past_saturation_ends_the_sweep() {
        let curve = |load: f64| if load <= 1_000.0 { load } else { 1_000.0 * 1_000.0 / load };
        let (loads, end) = sweep_on(curve, 3.0);
        assert_eq!(loads, [250.0, 500.0, 1_000.0, 2_000.0, 4_000.0]);
        assert_eq!(end, SearchEnd::Saturated);
    }

    #[test]
    fn a_protocol_that_never_saturates_ends_at_the_load_bound() {
        let (loads, end) = sweep_on(|load| load, 3.0);
        assert_eq!(loads.last(), Some(&1_024_000.0));
        assert_eq!(end, SearchEnd::PointsBound);
    }
}
