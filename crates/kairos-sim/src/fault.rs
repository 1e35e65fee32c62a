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
    /// A crashed node starts again as a fresh role instance from its factory, given what it
    /// had made durable ([`kairos_core::Process::on_recover`]).
    Restart(NodeId),
    /// The node's disk is lost (a replaced machine): it keeps nothing durable.
    WipeDisk(NodeId),
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
            Fault::WipeDisk(n) => write!(f, "wipe disk {n}"),
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
    /// Which kinds of fault a plan may use at all (each seed then switches each on or off).
    pub kinds: FaultKinds,
}

/// The kinds of fault a random plan may draw from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultKinds {
    /// Crash a node, restart it at the end of the episode.
    pub crash: bool,
    /// Split the targets in two groups.
    pub partition: bool,
    /// Cut one link in one direction.
    pub oneway: bool,
    /// Step a node's clock forwards or backwards.
    pub clock_step: bool,
    /// Lose messages with probability [`FaultRates::loss`].
    pub loss: bool,
}

impl FaultKinds {
    pub const ALL: FaultKinds = FaultKinds { crash: true, partition: true, oneway: true, clock_step: true, loss: true };
    const NAMES: [&'static str; 5] = ["crash", "partition", "oneway", "clock-step", "loss"];

    fn as_array(self) -> [bool; 5] {
        [self.crash, self.partition, self.oneway, self.clock_step, self.loss]
    }

    /// Parses a comma-separated list of `crash`, `partition`, `oneway`, `clock-step`, `loss`
    /// (`restart` is part of `crash`; `all` is every kind).
    pub fn parse(list: &str) -> Result<FaultKinds, String> {
        let mut k = FaultKinds { crash: false, partition: false, oneway: false, clock_step: false, loss: false };
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match name {
                "all" => k = FaultKinds::ALL,
                "crash" | "restart" => k.crash = true,
                "partition" => k.partition = true,
                "oneway" => k.oneway = true,
                "clock-step" => k.clock_step = true,
                "loss" => k.loss = true,
                other => {
                    return Err(format!(
                        "unknown fault kind `{other}`; use a comma-separated list of {} (or all)",
                        Self::NAMES.join(", ")
                    ))
                }
            }
        }
        if k.as_array().iter().all(|on| !on) {
            return Err(format!("name at least one fault kind: {}", Self::NAMES.join(", ")));
        }
        Ok(k)
    }

    /// The names of the kinds that are on.
    pub fn names(self) -> Vec<String> {
        Self::NAMES.iter().zip(self.as_array()).filter(|(_, on)| *on).map(|(n, _)| n.to_string()).collect()
    }
}

impl Default for FaultRates {
    fn default() -> Self {
        FaultRates {
            mean_interval: Duration::from_millis(800),
            episode: Duration::from_millis(600),
            clock_step_max: Duration::from_millis(20),
            loss: 0.05,
            max_crashed: 1,
            kinds: FaultKinds::ALL,
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
    // Swarm testing: each allowed kind is on with probability 1/2, and at least one is on.
    let allowed = rates.kinds.as_array();
    let coins =
        [rng.random_bool(0.5), rng.random_bool(0.5), rng.random_bool(0.5), rng.random_bool(0.5), rng.random_bool(0.5)];
    let mut kinds = [0, 1, 2, 3, 4].map(|k| coins[k] && allowed[k]);
    let allowed_ids: Vec<usize> = (0..5).filter(|k| allowed[*k]).collect();
    if allowed_ids.is_empty() {
        return plan;
    }
    if !kinds.iter().any(|k| *k) {
        kinds[allowed_ids[rng.random_range(0..allowed_ids.len())]] = true;
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
