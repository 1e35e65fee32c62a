//! Latency and throughput from a checked history: pairs each invocation with its completion
//! (per Jepsen process) and summarizes latencies with an HDR histogram.

use hdrhistogram::Histogram;
use kairos_core::history::{HistoryRecord, OpType};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// p50 / p90 / p99 in milliseconds.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

/// Latency summary of one run, overall and by a grouping of processes (e.g. region).
pub struct LatencySummary {
    pub overall: Percentiles,
    pub by_group: BTreeMap<String, Percentiles>,
    pub ok: u64,
    pub failed: u64,
    pub unknown: u64,
}

fn percentiles(h: &Histogram<u64>) -> Percentiles {
    let ms = |q: f64| if h.is_empty() { 0.0 } else { h.value_at_quantile(q) as f64 / 1e6 };
    Percentiles { p50: ms(0.50), p90: ms(0.90), p99: ms(0.99) }
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 1 hour in nanoseconds, 3 significant digits.
    Histogram::new_with_bounds(1_000, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// Summarizes the latency of completed (`ok`) operations; `group_of(process)` names the group
/// a process belongs to (`None`: not counted by group).
pub fn summarize(history: &[HistoryRecord], group_of: impl Fn(u64) -> Option<String>) -> LatencySummary {
    let mut open: HashMap<u64, u64> = HashMap::new();
    let mut all = histogram();
    let mut groups: BTreeMap<String, Histogram<u64>> = BTreeMap::new();
    let (mut ok, mut failed, mut unknown) = (0, 0, 0);
    for r in history {
        let p = r.event.process;
        match r.event.op_type {
            OpType::Invoke => {
                open.insert(p, r.time);
            }
            done => {
                let Some(start) = open.remove(&p) else { continue };
                match done {
                    OpType::Ok => ok += 1,
                    OpType::Fail => failed += 1,
                    _ => unknown += 1,
                }
                if done != OpType::Ok {
                    continue;
                }
                let latency = r.time.saturating_sub(start).clamp(1_000, 3_600_000_000_000);
                all.saturating_record(latency);
                if let Some(g) = group_of(p) {
                    groups.entry(g).or_insert_with(histogram).saturating_record(latency);
                }
            }
        }
    }
    unknown += open.len() as u64;
    LatencySummary {
        overall: percentiles(&all),
        by_group: groups.iter().map(|(g, h)| (g.clone(), percentiles(h))).collect(),
        ok,
        failed,
        unknown,
    }
}

/// Quantiles at which a latency CDF is sampled: every 2% plus the tail (p99, p99.9). A bounded
/// number of points per series keeps result files small.
const CDF_QUANTILES: usize = 50;

/// A latency CDF as `[latency_ms, quantile]` points, sampled at bounded quantiles from the
/// completed (`ok`) operations' latencies (nearest rank). Empty when nothing completed.
pub type Cdf = Vec<[f64; 2]>;

/// The CDF of these latencies (nanoseconds), sampled as [`latency_cdfs`] samples.
pub fn cdf_of(mut latencies_ns: Vec<u64>) -> Cdf {
    if latencies_ns.is_empty() {
        return Vec::new();
    }
    latencies_ns.sort_unstable();
    let n = latencies_ns.len();
    let mut qs: Vec<f64> = (0..=CDF_QUANTILES).map(|i| i as f64 / CDF_QUANTILES as f64).collect();
    qs.extend([0.99, 0.999]);
    qs.sort_by(f64::total_cmp);
    qs.dedup();
    qs.iter()
        .map(|&q| {
            let i = ((q * (n - 1) as f64).round() as usize).min(n - 1);
            [latencies_ns[i] as f64 / 1e6, q]
        })
        .collect()
}

/// Latency CDFs of completed operations, overall and by a grouping of operations:
/// `group_of(event)` sees the invocation and names its group (`None`: overall only);
/// `counted(event)` leaves out operations that are not the workload's (e.g. a loader).
pub fn latency_cdfs(
    history: &[HistoryRecord],
    counted: impl Fn(&kairos_core::history::HistoryEvent) -> bool,
    group_of: impl Fn(&kairos_core::history::HistoryEvent) -> Option<String>,
) -> (Cdf, BTreeMap<String, Cdf>) {
    let mut open: HashMap<u64, (u64, Option<String>)> = HashMap::new();
    let mut all = Vec::new();
    let mut groups: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in history.iter().filter(|r| counted(&r.event)) {
        let p = r.event.process;
        if r.event.op_type == OpType::Invoke {
            open.insert(p, (r.time, group_of(&r.event)));
            continue;
        }
        let Some((start, group)) = open.remove(&p) else { continue };
        if r.event.op_type != OpType::Ok {
            continue;
        }
        let latency = r.time.saturating_sub(start);
        all.push(latency);
        if let Some(g) = group {
            groups.entry(g).or_default().push(latency);
        }
    }
    (cdf_of(all), groups.into_iter().map(|(g, l)| (g, cdf_of(l))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kairos_core::history::HistoryEvent;

    #[test]
    fn cdf_is_monotone_bounded_and_ends_at_the_maximum() {
        let mut history = Vec::new();
        for i in 0..100u64 {
            let t = i * 1_000_000_000;
            history.push(HistoryRecord {
                index: 2 * i,
                time: t,
                event: HistoryEvent::new(OpType::Invoke, i % 4, "read", vec![]),
            });
            history.push(HistoryRecord {
                index: 2 * i + 1,
                time: t + (i + 1) * 1_000_000,
                event: HistoryEvent::new(OpType::Ok, i % 4, "read", vec![]),
            });
        }
        let (all, by) = latency_cdfs(&history, |_| true, |e| Some(format!("p{}", e.process)));
        assert!(all.len() <= CDF_QUANTILES + 3);
        assert_eq!(all.first().unwrap(), &[1.0, 0.0]);
        assert_eq!(all.last().unwrap(), &[100.0, 1.0]);
        assert!(all.windows(2).all(|w| w[0][0] <= w[1][0] && w[0][1] < w[1][1]));
        assert_eq!(by.len(), 4);
        assert_eq!(by["p3"].last().unwrap()[0], 100.0);
    }
}

/// The operations of `history` invoked at or after `from` (true time), with their completions.
pub fn invoked_from(history: &[HistoryRecord], from: std::time::Duration) -> Vec<HistoryRecord> {
    let from_ns = from.as_nanos() as u64;
    let mut open: HashMap<u64, bool> = HashMap::new();
    let mut out = Vec::new();
    for r in history {
        let keep = match r.event.op_type {
            OpType::Invoke => {
                let keep = r.time >= from_ns;
                open.insert(r.event.process, keep);
                keep
            }
            _ => open.remove(&r.event.process).unwrap_or(false),
        };
        if keep {
            out.push(r.clone());
        }
    }
    out
}

/// One bin of a throughput and latency time series.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SeriesBin {
    /// Start of the bin, true seconds since the run began.
    pub t_s: f64,
    /// Operations completed `ok` in the bin, per second.
    pub ok_per_s: f64,
    /// Median latency of those operations (0 when none completed).
    pub latency_ms_p50: f64,
}

/// Completions and their median latency per `bin` of true time, from 0 to `until`.
pub fn series(history: &[HistoryRecord], bin: std::time::Duration, until: std::time::Duration) -> Vec<SeriesBin> {
    let bin_ns = (bin.as_nanos() as u64).max(1);
    let bins = (until.as_nanos() as u64).div_ceil(bin_ns) as usize;
    let mut latencies: Vec<Vec<u64>> = vec![Vec::new(); bins];
    let mut open: HashMap<u64, u64> = HashMap::new();
    for r in history {
        match r.event.op_type {
            OpType::Invoke => {
                open.insert(r.event.process, r.time);
            }
            done => {
                let Some(start) = open.remove(&r.event.process) else { continue };
                let i = (r.time / bin_ns) as usize;
                if done == OpType::Ok && i < bins {
                    latencies[i].push(r.time.saturating_sub(start));
                }
            }
        }
    }
    latencies
        .into_iter()
        .enumerate()
        .map(|(i, mut l)| {
            l.sort_unstable();
            SeriesBin {
                t_s: (i as u64 * bin_ns) as f64 / 1e9,
                ok_per_s: l.len() as f64 / (bin_ns as f64 / 1e9),
                latency_ms_p50: l.get(l.len().saturating_sub(1) / 2).map_or(0.0, |ns| *ns as f64 / 1e6),
            }
        })
        .collect()
}

/// Seconds from `fault_s` until throughput is back for good: after throughput first fell below
/// half of its mean over the second before the fault, the start of the first window of
/// `window` bins from which every later window's mean is at least 90% of that mean (a burst of
/// backlog followed by another dip does not count). `Some(0.0)` when it never fell; `None` when
/// the last window is still below.
pub fn recovery_s(series: &[SeriesBin], fault_s: f64, window: usize) -> Option<f64> {
    let before: Vec<f64> =
        series.iter().filter(|b| b.t_s >= fault_s - 1.0 && b.t_s < fault_s).map(|b| b.ok_per_s).collect();
    if before.is_empty() {
        return None;
    }
    let baseline = before.iter().sum::<f64>() / before.len() as f64;
    let after: Vec<&SeriesBin> = series.iter().filter(|b| b.t_s >= fault_s).collect();
    let Some(dip) = after.iter().position(|b| b.ok_per_s < 0.5 * baseline) else { return Some(0.0) };
    let window = window.max(1);
    let starts = dip..after.len().saturating_sub(window - 1);
    let back =
        |i: usize| after[i..i + window].iter().map(|b| b.ok_per_s).sum::<f64>() / window as f64 >= 0.9 * baseline;
    let last_below = starts.clone().rev().find(|i| !back(*i));
    let first_good = match last_below {
        None => starts.start,
        Some(i) if i + 1 < starts.end => i + 1,
        Some(_) => return None,
    };
    Some(after[first_good].t_s - fault_s)
}

#[cfg(test)]
mod series_tests {
    use super::*;

    fn bins(rates: &[f64]) -> Vec<SeriesBin> {
        rates
            .iter()
            .enumerate()
            .map(|(i, r)| SeriesBin { t_s: i as f64 * 0.1, ok_per_s: *r, latency_ms_p50: 1.0 })
            .collect()
    }

    #[test]
    fn recovery_is_timed_from_the_fault_to_the_first_window_back_at_ninety_percent() {
        // 1 s at 100/s, a crash at 1.0 s, 0.5 s at 0, a burst of backlog, a second dip, then
        // back for good.
        let mut r = vec![100.0; 10];
        r.extend([80.0, 0.0, 0.0, 0.0, 300.0, 300.0, 10.0, 10.0, 10.0, 95.0, 100.0, 100.0, 100.0, 100.0]);
        let s = bins(&r);
        let rec = recovery_s(&s, 1.0, 3).unwrap();
        assert!((rec - 0.9).abs() < 1e-9, "{rec}");
        // Never below half: no dip, recovered at once; never back: None.
        assert_eq!(recovery_s(&bins(&[100.0; 20]), 1.0, 3), Some(0.0));
        let mut never = vec![100.0; 10];
        never.extend([0.0; 10]);
        assert_eq!(recovery_s(&bins(&never), 1.0, 3), None);
    }
}
