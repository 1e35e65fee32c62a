//! The result contract of `kairos bench … --json PATH` (see shared/docs/architecture.md):
//! one object per protocol run, stable field names; fields that do not apply are omitted.

use crate::stats::{Cdf, Percentiles};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CheckResult {
    pub model: String,
    /// True only when some checker proved the model (never for an unknown verdict).
    pub valid: bool,
    /// "valid", "invalid" or "unknown".
    pub verdict: String,
    pub ops: usize,
    /// Every checker that ran, `name version`, joined by " + ".
    pub checker: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    pub system: String,
    pub protocol: String,
    pub workload: serde_json::Value,
    pub host: String,
    pub clock: String,
    pub seed: u64,
    pub duration_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offered_ops_per_s: Option<f64>,
    pub throughput_ops_per_s: f64,
    pub latency_ms: Percentiles,
    pub latency_ms_by_region: BTreeMap<String, Percentiles>,
    /// Latency CDF of completed operations as `[latency_ms, quantile]` points (a bounded number
    /// of quantiles; see `stats::latency_cdfs`). Omitted when the bench does not record it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub latency_cdf_ms: Cdf,
    /// The same CDF per coordinator (client) region.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub latency_cdf_ms_by_region: BTreeMap<String, Cdf>,
    /// The same CDF per operation kind (SWARM: get, update).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub latency_cdf_ms_by_op: BTreeMap<String, Cdf>,
    pub committed: u64,
    pub aborted: u64,
    pub unknown: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fast_path_ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollback_ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round_trips: Option<BTreeMap<String, f64>>,
    pub check: CheckResult,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_hash: Option<String>,
    pub wall_s: f64,
    /// Anything protocol-specific (message counts, fault plan, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl CheckResult {
    /// The contract's summary of a checker report: every checker that ran, joined by " + ".
    pub fn from_report(report: &kairos_check::CheckReport) -> Self {
        CheckResult {
            model: report.model.to_string(),
            valid: report.valid,
            verdict: report.verdict.name().to_lowercase(),
            ops: report.ops,
            checker: report
                .checkers
                .iter()
                .map(|c| format!("{} {}", c.name, c.version))
                .collect::<Vec<_>>()
                .join(" + "),
        }
    }
}

/// Writes a history as JSON lines (the format `kairos check` reads), creating parent folders.
pub fn write_history(path: &Path, history: &[kairos_core::history::HistoryRecord]) -> Result<(), crate::CliError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| crate::CliError::Io(format!("cannot create {}: {e}", dir.display())))?;
    }
    let mut text = String::new();
    for r in history {
        text.push_str(&serde_json::to_string(r).map_err(|e| crate::CliError::Runtime(e.to_string()))?);
        text.push('\n');
    }
    std::fs::write(path, text).map_err(|e| crate::CliError::Io(format!("cannot write {}: {e}", path.display())))
}

/// Writes the array of results to `path` (pretty JSON), creating parent folders.
pub fn write_json(path: &Path, results: &[RunResult]) -> Result<(), crate::CliError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| crate::CliError::Io(format!("cannot create {}: {e}", dir.display())))?;
    }
    let text = serde_json::to_string_pretty(results).map_err(|e| crate::CliError::Io(e.to_string()))?;
    std::fs::write(path, text + "\n").map_err(|e| crate::CliError::Io(format!("cannot write {}: {e}", path.display())))
}

/// Reads a result file written by `--json` (an array of result objects, or one object).
pub fn read_json(path: &Path) -> Result<Vec<RunResult>, crate::CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| crate::CliError::Io(format!("cannot read result file {}: {e}", path.display())))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        crate::CliError::Usage(format!(
            "{} is not JSON ({e}); pass files written by `kairos bench … --json`",
            path.display()
        ))
    })?;
    let value = if value.is_array() { value } else { serde_json::Value::Array(vec![value]) };
    serde_json::from_value(value).map_err(|e| {
        crate::CliError::Usage(format!(
            "{} is not a result file of `kairos bench … --json` ({e}); see the result contract in architecture.md",
            path.display()
        ))
    })
}
