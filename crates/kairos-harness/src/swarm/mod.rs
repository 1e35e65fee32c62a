//! SWARM outside its roles: simulated runs ([`sim`]), real memory nodes ([`backend`]: shm and TCP), the
//! driver that runs any `kairos_swarm::client::KvClient` on them with the host clock
//! ([`driver`]), a simulated run's workload on a real backend ([`real`]), and the per-key
//! linearizability check of every run ([`check_per_key`], [`run`]).

pub mod backend;
pub mod driver;
pub mod real;
pub mod sim;

use kairos_check::{check, Model};
use kairos_core::history::HistoryRecord;
use sim::{initial_writes, Outcome, RunError, SwarmRun};
use std::collections::BTreeMap;

/// Runs a simulated SWARM run and, if `run.check`, checks its history per key.
pub fn run(run: &SwarmRun) -> Result<Outcome, RunError> {
    let mut outcome = run.run()?;
    if run.check {
        let (valid, report, keys) = check_per_key(&outcome.history, &outcome.initial_values);
        outcome.linearizable = valid;
        outcome.check_report = report;
        outcome.checked_keys = keys;
    }
    Ok(outcome)
}

/// Checks linearizability key by key; the warm-up's final values enter as synthetic writes.
/// `Some(false)`: some key is not linearizable; `None`: none is known not to be, but some key
/// could not be decided (unknown is never valid); `Some(true)`: every key was proved.
pub fn check_per_key(history: &[HistoryRecord], warm: &BTreeMap<u64, u64>) -> (Option<bool>, String, usize) {
    let mut by_key: BTreeMap<u64, Vec<HistoryRecord>> = BTreeMap::new();
    for r in history {
        if let Some(m) = r.event.value.first() {
            by_key.entry(m.key()).or_default().push(r.clone());
        }
    }
    let keys = by_key.len();
    let mut undecided = None;
    for (key, recs) in by_key {
        let mut h = initial_writes(warm.get(&key).map(|v| (key, *v)));
        for r in recs {
            h.push(HistoryRecord { index: h.len() as u64, time: r.time, event: r.event });
        }
        match check(&h, Model::Linearizable) {
            Ok(rep) if rep.valid => {}
            Ok(rep) if rep.verdict == kairos_check::Verdict::Unknown => {
                undecided.get_or_insert(format!("key {key}: {rep}"));
            }
            Ok(rep) => return (Some(false), format!("key {key}: {rep}"), keys),
            Err(e) => return (Some(false), format!("key {key}: cannot check: {e}"), keys),
        }
    }
    match undecided {
        Some(report) => (None, report, keys),
        None => (Some(true), format!("linearizable ({keys} keys)"), keys),
    }
}
