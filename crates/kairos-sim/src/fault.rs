//! Faults: scripted ("at t do x") or drawn from the seed with randomized rates (swarm
//! testing). A random plan is turned into a script up front, so it can be printed, replayed
//! and kept as a regression test.

use kairos_core::{NodeId, SimTime};
use rand::{Rng as _, SeedableRng};
use std::fmt;
use std::time::Duration;

/// One fault or repair.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// The node stops; its volatile state (the role instance, its timers, its inbox) is lost,
    /// and messages to it are dropped.
    Crash(NodeId),
    /// A crashed node starts again as a fresh role instance from its factory.
    Restart(NodeId),
    /// Symmetric partition: nodes in different groups cannot reach each other; nodes not named
    /// in any group keep full connectivity.
    Partition(Vec<Vec<NodeId>>),
    /// Asymmetric cut: messages from `from` to `to` are dropped; the other direction works.
    CutLink { from: NodeId, to: NodeId },
    /// Heal every partition and cut link.
    HealAll,
    /// The node's clock jumps by `delta_ns` (negative: backwards).
    ClockStep { node: NodeId, delta_ns: i64 },
    /// Change the message-loss probability from now on.
    SetLoss(f64),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Crash(n) => write!(f, "crash {n}"),
            Fault::Restart(n) => write!(f, "restart {n}"),
            Fault::Partition(groups) => {
                let g: Vec<String> =
                    groups.iter().map(|g| g.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",")).collect();
                write!(f, "partition {{{}}}", g.join("} {"))
            }
            Fault::CutLink { from, to } => write!(f, "cut {from}->{to}"),
            Fault::HealAll => write!(f, "heal all"),
            Fault::ClockStep { node, delta_ns } => write!(f, "clock step {node} {:+.3}ms", *delta_ns as f64 / 1e6),
            Fault::SetLoss(p) => write!(f, "loss {p}"),
        }
    }
}

/// A fault at a true time.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduledFault {
    pub at: SimTime,
    pub fault: Fault,
}

/// Rates for a randomized fault plan (swarm testing: each run draws which faults are on).
#[derive(Clone, Debug, PartialEq)]
pub struct FaultRates {
    /// Mean time between fault episodes.
    pub mean_interval: Duration,
    /// How long an episode lasts before it is repaired (restart, heal, loss back to 0).
    pub episode: Duration,
    /// Largest clock step, in either direction.
    pub clock_step_max: Duration,
    /// Loss probability during a loss episode.
    pub loss: f64,
    /// At most this many nodes down at once (keep it below what the protocol tolerates).
    pub max_crashed: usize,
}

impl Default for FaultRates {
    fn default() -> Self {
        FaultRates {
            mean_interval: Duration::from_millis(800),
            episode: Duration::from_millis(600),
            clock_step_max: Duration::from_millis(20),
            loss: 0.05,
            max_crashed: 1,
        }
    }
}

/// Draws a fault script for `targets` over `[start, end)` from `seed`. Every episode is
/// repaired before `end`, so liveness can be checked after it. Swarm testing: the seed also
/// decides which kinds of fault this run uses at all.
pub fn random_plan(
    seed: u64,
    targets: &[NodeId],
    start: SimTime,
    end: SimTime,
    rates: &FaultRates,
) -> Vec<ScheduledFault> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x6661_756c_7473);
    let mut plan = Vec::new();
    if targets.is_empty() || end <= start {
        return plan;
    }
    // Swarm testing: each kind is on with probability 1/2, and at least one is on.
    let mut kinds =
        [rng.random_bool(0.5), rng.random_bool(0.5), rng.random_bool(0.5), rng.random_bool(0.5), rng.random_bool(0.5)];
    if !kinds.iter().any(|k| *k) {
        kinds[rng.random_range(0..kinds.len())] = true;
    }
    let [crash_on, partition_on, cut_on, step_on, loss_on] = kinds;
    let episode_ns = kairos_core::duration_nanos(rates.episode).max(1);
    let interval_ns = kairos_core::duration_nanos(rates.mean_interval).max(1);
    let mut t = start.as_nanos();
    loop {
        t += rng.random_range(interval_ns / 2..=interval_ns * 3 / 2);
        let repair_at = t + rng.random_range(episode_ns / 2..=episode_ns);
        if repair_at >= end.as_nanos() {
            break;
        }
        let (at, repair) = (SimTime(t), SimTime(repair_at));
        let kind = loop {
            let k = rng.random_range(0..5);
            if kinds[k] {
                break k;
            }
        };
        match kind {
            0 if crash_on && rates.max_crashed > 0 => {
                let mut victims: Vec<NodeId> = targets.to_vec();
                let count = rng.random_range(1..=rates.max_crashed.min(victims.len()));
                for _ in 0..count {
                    let v = victims.swap_remove(rng.random_range(0..victims.len()));
                    plan.push(ScheduledFault { at, fault: Fault::Crash(v) });
                    plan.push(ScheduledFault { at: repair, fault: Fault::Restart(v) });
                }
            }
            1 if partition_on => {
                let mut a = Vec::new();
                let mut b = Vec::new();
                for &n in targets {
                    if rng.random_bool(0.5) {
                        a.push(n)
                    } else {
                        b.push(n)
                    }
                }
                plan.push(ScheduledFault { at, fault: Fault::Partition(vec![a, b]) });
                plan.push(ScheduledFault { at: repair, fault: Fault::HealAll });
            }
            2 if cut_on && targets.len() > 1 => {
                let from = targets[rng.random_range(0..targets.len())];
                let to = loop {
                    let n = targets[rng.random_range(0..targets.len())];
                    if n != from {
                        break n;
                    }
                };
                plan.push(ScheduledFault { at, fault: Fault::CutLink { from, to } });
                plan.push(ScheduledFault { at: repair, fault: Fault::HealAll });
            }
            3 if step_on => {
                let max = kairos_core::duration_nanos(rates.clock_step_max).max(1) as i64;
                let node = targets[rng.random_range(0..targets.len())];
                plan.push(ScheduledFault {
                    at,
                    fault: Fault::ClockStep { node, delta_ns: rng.random_range(-max..=max) },
                });
            }
            4 if loss_on => {
                plan.push(ScheduledFault { at, fault: Fault::SetLoss(rates.loss) });
                plan.push(ScheduledFault { at: repair, fault: Fault::SetLoss(0.0) });
            }
            _ => {}
        }
        t = repair_at;
    }
    plan.sort_by_key(|f| f.at);
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_plans_are_reproducible_repaired_and_bounded() {
        let nodes: Vec<NodeId> = (0..5).map(NodeId).collect();
        let rates = FaultRates::default();
        let end = SimTime::from_secs(30);
        let a = random_plan(7, &nodes, SimTime::ZERO, end, &rates);
        assert_eq!(a, random_plan(7, &nodes, SimTime::ZERO, end, &rates));
        assert!(!a.is_empty());
        assert!(a.iter().all(|f| f.at < end));
        let crashes = a.iter().filter(|f| matches!(f.fault, Fault::Crash(_))).count();
        let restarts = a.iter().filter(|f| matches!(f.fault, Fault::Restart(_))).count();
        assert_eq!(crashes, restarts, "every crash is repaired");
        let differs = (0..20).any(|s| random_plan(s, &nodes, SimTime::ZERO, end, &rates) != a);
        assert!(differs, "other seeds give other plans");
    }
}
