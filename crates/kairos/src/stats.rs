//! Latency and throughput from a checked history: pairs each invocation with its completion
//! (per Jepsen process) and summarizes latencies with an HDR histogram.

use hdrhistogram::Histogram;
use kairos_core::history::{HistoryRecord, OpType};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// p50 / p90 / p99 in milliseconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
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
