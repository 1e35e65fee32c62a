//! `kairos bench causal`: the replica set with signed cluster time and causal sessions, every
//! run's session history checked against the four session guarantees.

use crate::cli::{CausalBenchArgs, CausalWorkloadArg, OnOff, ReadConcernArg, ReadPrefArg, SigningArg, WriteConcernArg};
use crate::progress;
use crate::result::{self, CheckResult, RunResult};
use crate::stats::{self, Percentiles};
use crate::CliError;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use kairos_causal::{ReadConcern, ReadPref, WriteConcern};
use kairos_check::Model;
use kairos_harness::causal::{measure_hmac_ns, Deployment, Signing};
use kairos_sim::CpuModel;
use std::collections::BTreeMap;
use std::time::Duration;

impl From<WriteConcernArg> for WriteConcern {
    fn from(w: WriteConcernArg) -> Self {
        match w {
            WriteConcernArg::W1 => WriteConcern::W1,
            WriteConcernArg::Majority => WriteConcern::Majority,
        }
    }
}

impl From<ReadConcernArg> for ReadConcern {
    fn from(r: ReadConcernArg) -> Self {
        match r {
            ReadConcernArg::Local => ReadConcern::Local,
            ReadConcernArg::Majority => ReadConcern::Majority,
        }
    }
}

impl From<ReadPrefArg> for ReadPref {
    fn from(r: ReadPrefArg) -> Self {
        match r {
            ReadPrefArg::Primary => ReadPref::Primary,
            ReadPrefArg::Secondary => ReadPref::Secondary,
            ReadPrefArg::Nearest => ReadPref::Nearest,
        }
    }
}

/// MongoDB promises causal sessions only with majority reads and writes; elsewhere an anomaly
/// is the expected, reported outcome (Jepsen's finding), not a Kairos bug.
fn guarantees_hold(d: &Deployment) -> bool {
    d.causal && d.write_concern == WriteConcern::Majority && d.read_concern == ReadConcern::Majority
}

fn deployments(a: &CausalBenchArgs) -> Result<Vec<Deployment>, CliError> {
    if a.nodes.is_empty() || a.nodes.iter().any(|n| !(3..=7).contains(n)) {
        return Err(CliError::Usage(format!("--nodes takes replica-set sizes from 3 to 7, not {:?}", a.nodes)));
    }
    if a.threads == 0 || a.threads > 4_096 {
        return Err(CliError::Usage(format!("--threads must be 1..=4096 sessions, not {}", a.threads)));
    }
    if !(a.duration_s > 0.0 && a.duration_s <= 3_600.0) {
        return Err(CliError::Usage(format!(
            "--duration-s must be between 0 and 3600 virtual seconds, not {}",
            a.duration_s
        )));
    }
    if !(0.0..=1.0).contains(&a.read_fraction) {
        return Err(CliError::Usage(format!("--read-fraction is a share between 0 and 1, not {}", a.read_fraction)));
    }
    let mut out = Vec::new();
    for &nodes in &a.nodes {
        for &signing in &a.signing {
            for &causal in &a.causal {
                let mut d = Deployment::default().with_members(nodes);
                d.seed = a.seed;
                d.sessions = a.threads;
                d.write_concern = a.write_concern.into();
                d.read_concern = a.read_concern.into();
                d.read_pref = a.read_pref.into();
                if a.workload == CausalWorkloadArg::Tpcc {
                    d.workload = kairos_harness::causal::WorkloadKind::Tpcc(kairos_causal::tpcc::TpccConfig::default());
                }
                d.causal = causal == OnOff::On;
                d.signing = match signing {
                    SigningArg::Range => Signing::Range,
                    SigningArg::PerReply => Signing::PerReply,
                };
                d.read_fraction = a.read_fraction;
                d.duration = Duration::from_secs_f64(a.duration_s);
                if a.measured_cpu {
                    d.cpu = CpuModel::MEASURED;
                }
                out.push(d);
            }
        }
    }
    Ok(out)
}

pub fn bench(a: CausalBenchArgs) -> Result<(), CliError> {
    let runs = deployments(&a)?;
    let hmac_ns = measure_hmac_ns();
    let mut results = Vec::new();
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header([
        "members",
        "causal",
        "signing",
        "ops/s",
        "reads/s",
        "read p50/p90 ms",
        "write p50/p90 ms",
        "HMACs",
        "HMACs per 10^6 replies",
        "signing CPU ms",
        "session checker",
    ]);
    let mut violations = Vec::new();
    let bar = progress::bar(runs.len() as u64, "causal");
    for d in &runs {
        bar.set_message(format!("{} members, causal {}", d.member_regions.len(), d.causal));
        let out = d.run().map_err(|e| CliError::Usage(e.to_string()))?;
        let report = kairos_check::check(&out.history, Model::Causal).map_err(|e| {
            CliError::Runtime(format!("the simulator wrote a history the checker cannot read (a Kairos bug): {e}"))
        })?;
        let signing_cpu_ms = out.hmac_computations as f64 * hmac_ns / 1e6;
        let verdict = if report.valid {
            "valid".to_string()
        } else if report.verdict == kairos_check::Verdict::Unknown {
            "unverified".to_string()
        } else if guarantees_hold(d) {
            violations.push(format!("{} members, seed {}", d.member_regions.len(), d.seed));
            format!("VIOLATION: {}", names(&report))
        } else {
            format!("anomaly (expected without majority/causal): {}", names(&report))
        };
        table.add_row([
            d.member_regions.len().to_string(),
            if d.causal { "on" } else { "off" }.to_string(),
            format!("{:?}", d.signing).to_lowercase(),
            format!("{:.0}", out.throughput_ops_per_s),
            format!("{:.0}", out.reads_per_s),
            format!("{:.1} / {:.1}", out.read_latency_ms.p50, out.read_latency_ms.p90),
            format!("{:.1} / {:.1}", out.write_latency_ms.p50, out.write_latency_ms.p90),
            out.hmac_computations.to_string(),
            format!("{:.0}", out.hmac_per_million_replies()),
            format!("{signing_cpu_ms:.3}"),
            verdict,
        ]);
        if !report.valid && guarantees_hold(d) {
            progress::say(&bar, format!("{report}"));
        } else if let Some(first) = report.anomalies.first() {
            // Expected without causal consistency: one example instead of the whole report.
            progress::say(
                &bar,
                format!(
                    "causal {}, {} signing: {} session-guarantee anomalies, as expected; e.g. {}: {}",
                    if d.causal { "on" } else { "off" },
                    format!("{:?}", d.signing).to_lowercase(),
                    report.anomalies.len(),
                    first.name,
                    first.explanation.lines().next().unwrap_or_default().trim()
                ),
            );
        }
        results.push(causal_result(d, &out, &report, signing_cpu_ms));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let w = if a.write_concern == WriteConcernArg::W1 { "1" } else { "majority" };
    println!(
        "Replica set over the GCP matrix, {} sessions, w:{w}, readConcern {:?}, readPreference {:?}, seed {} ({} virtual s measured):",
        a.threads,
        a.read_concern,
        a.read_pref,
        a.seed,
        a.duration_s
    );
    println!("{table}");
    println!("signing CPU = HMAC computations × {hmac_ns:.0} ns (one HMAC-SHA1 time proof, measured on this machine)");
    if let Some(path) = &a.json {
        result::write_json(path, &results)?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &a.plot {
        crate::report::write_run_figure(path, "Causal sessions: operation latency CDF", &results)?;
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(CliError::Anomaly(format!(
            "causal guarantees violated with majority reads and writes: {}",
            violations.join("; ")
        )))
    }
}

fn names(report: &kairos_check::CheckReport) -> String {
    let mut n: Vec<&str> = report.anomalies.iter().map(|a| a.name.as_str()).collect();
    n.sort_unstable();
    n.dedup();
    n.join(", ")
}

fn pct(p: kairos_harness::causal::Percentiles) -> Percentiles {
    Percentiles { p50: p.p50, p90: p.p90, p99: p.p99 }
}

fn causal_result(
    d: &Deployment,
    out: &kairos_harness::causal::Outcome,
    report: &kairos_check::CheckReport,
    signing_cpu_ms: f64,
) -> RunResult {
    let regions = d.session_regions.clone();
    let summary = stats::summarize(&out.history, |p| regions.get(p as usize % regions.len().max(1)).cloned());
    let (cdf, cdf_by_region) = stats::latency_cdfs(
        &out.history,
        |_| true,
        |e| regions.get(e.process as usize % regions.len().max(1)).cloned(),
    );
    let mut extra = BTreeMap::new();
    extra.insert("hmac_computations".into(), out.hmac_computations.into());
    extra.insert("signing_cpu_ms".into(), signing_cpu_ms.into());
    extra.insert("replies".into(), out.replies.into());
    extra.insert("reads_per_s".into(), out.reads_per_s.into());
    extra.insert("read_latency_ms".into(), serde_json::json!({"p50": out.read_latency_ms.p50, "p90": out.read_latency_ms.p90, "p99": out.read_latency_ms.p99}));
    extra.insert("write_latency_ms".into(), serde_json::json!({"p50": out.write_latency_ms.p50, "p90": out.write_latency_ms.p90, "p99": out.write_latency_ms.p99}));
    extra.insert("guarantees_expected".into(), guarantees_hold(d).into());
    RunResult {
        system: "causal".into(),
        protocol: if d.causal { "causal-on" } else { "causal-off" }.into(),
        workload: serde_json::json!({
            "name": "sessions",
            "members": d.member_regions.len(),
            "sessions": d.sessions,
            "read_fraction": d.read_fraction,
            "write_concern": format!("{:?}", d.write_concern),
            "read_concern": format!("{:?}", d.read_concern),
            "read_pref": format!("{:?}", d.read_pref),
            "signing": format!("{:?}", d.signing),
            "tpcc": matches!(d.workload, kairos_harness::causal::WorkloadKind::Tpcc(_)),
        }),
        host: "sim".into(),
        clock: d.clock.to_string(),
        seed: d.seed,
        duration_s: d.duration.as_secs_f64(),
        offered_ops_per_s: None,
        throughput_ops_per_s: out.throughput_ops_per_s,
        latency_ms: pct(out.all_latency_ms),
        latency_ms_by_region: summary.by_group,
        latency_cdf_ms: cdf,
        latency_cdf_ms_by_region: cdf_by_region,
        latency_cdf_ms_by_op: BTreeMap::new(),
        committed: out.sessions.reads_ok + out.sessions.writes_ok,
        aborted: out.sessions.reads_failed + out.sessions.writes_failed,
        unknown: out.sessions.writes_unknown,
        fast_path_ratio: None,
        rollback_ratio: None,
        round_trips: None,
        check: CheckResult::from_report(report),
        trace_hash: Some(format!("{:016x}", out.trace_hash)),
        wall_s: out.wall.as_secs_f64(),
        extra,
    }
}
