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
    /// The node will die while writing: at its next handler that persists anything, only a
    /// prefix of what that handler persisted (maybe nothing) reaches the disk, and none of its
    /// other effects happen (write-ahead: its messages had not left yet). A torn last record is
    /// a lost one (a host drops a record that fails its checksum). The next
    /// [`Fault::Restart`] of the node restarts it, or disarms this if it wrote nothing before.
    CrashMidWrite(NodeId),
    /// The node's disk is lost (a replaced machine): it keeps nothing durable.
    WipeDisk(NodeId),
    /// Symmetric partition: nodes in different groups cannot reach each other; nodes not named
    /// in any group keep full connectivity.
    Partition(Vec<Vec<NodeId>>),
    /// Asymmetric cut: messages from `from` to `to` are dropped; the other direction works.
    CutLink {
        from: NodeId,
        to: NodeId,
    },
    /// Heal every partition and cut link.
    HealAll,
    /// The node's clock jumps by `delta_ns` (negative: backwards).
    ClockStep {
        node: NodeId,
        delta_ns: i64,
    },
    /// Change the message-loss probability from now on.
    SetLoss(f64),
    /// Change the probability that a message is delivered twice from now on.
    SetDuplicate(f64),
    /// Deliver again this many messages drawn from those sent recently (an old message that
    /// resurfaces: a retransmission, a slow path through the network). Needs
    /// [`crate::Sim::keep_sent_for_replay`]; cut links still drop them.
    Replay(u32),
    /// The node stops running (a stop-the-world pause, a descheduled process, a VM migrated)
    /// but keeps everything: messages to it wait in its inbox (up to its bound), timers that
    /// fall due wait, its clock runs on. At [`Fault::Resume`] it takes them all at once, late,
    /// unaware of the gap: a leader that was replaced meanwhile acts as one until it learns.
    Pause(NodeId),
    Resume(NodeId),
    /// Every message the node sends from now on takes `extra_ns` longer to arrive (a congested
    /// uplink, a slow NIC: a gray failure, the node alive and unaware); links stay FIFO, so
    /// what it sends after the episode waits behind what it sent during it. 0 ends it.
    Slow {
        node: NodeId,
        extra_ns: u64,
    },
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Crash(n) => write!(f, "crash {n}"),
            Fault::Restart(n) => write!(f, "restart {n}"),
            Fault::CrashMidWrite(n) => write!(f, "crash {n} mid-write"),
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
            Fault::SetDuplicate(p) => write!(f, "duplicate {p}"),
            Fault::Replay(n) => write!(f, "replay {n} old messages"),
            Fault::Pause(n) => write!(f, "pause {n}"),
            Fault::Resume(n) => write!(f, "resume {n}"),
            Fault::Slow { node, extra_ns: 0 } => write!(f, "slow {node} ends"),
            Fault::Slow { node, extra_ns } => write!(f, "slow {node} +{:.3}ms", *extra_ns as f64 / 1e6),
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
    /// Largest duplication probability of a duplication episode.
    pub duplicate_max: f64,
    /// Most old messages one replay delivers again.
    pub replay_max: u32,
    /// At most this many nodes down at once (keep it below what the protocol tolerates).
    pub max_crashed: usize,
    /// The nodes that may lose their disk ([`FaultKinds::disk_loss`]): those whose role comes
    /// back safely from nothing ([`kairos_core::Process::on_amnesia`]). Empty: no disk is lost.
    pub disk_loss_targets: Vec<NodeId>,
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
    /// Deliver messages twice with a probability drawn up to [`FaultRates::duplicate_max`].
    pub dup: bool,
    /// Deliver old messages again ([`Fault::Replay`]).
    pub replay: bool,
    /// Crash a node in the middle of a write ([`Fault::CrashMidWrite`]), restart it at the end
    /// of the episode.
    pub torn: bool,
    /// Crash a node, wipe its disk ([`Fault::WipeDisk`]), restart it at the end of the
    /// episode: once per run, on one of [`FaultRates::disk_loss_targets`].
    pub disk_loss: bool,
    /// Pause a node ([`Fault::Pause`]) for up to five episodes' length, then resume it.
    pub pause: bool,
    /// Slow a node's outgoing messages ([`Fault::Slow`]) by up to 1.5 s for up to five
    /// episodes' length.
    pub slow: bool,
}

impl FaultKinds {
    pub const ALL: FaultKinds = FaultKinds {
        crash: true,
        partition: true,
        oneway: true,
        clock_step: true,
        loss: true,
        dup: true,
        replay: true,
        torn: true,
        disk_loss: true,
        pause: true,
        slow: true,
    };
    const NONE: FaultKinds = FaultKinds {
        crash: false,
        partition: false,
        oneway: false,
        clock_step: false,
        loss: false,
        dup: false,
        replay: false,
        torn: false,
        disk_loss: false,
        pause: false,
        slow: false,
    };
    const NAMES: [&'static str; 11] =
        ["crash", "partition", "oneway", "clock-step", "loss", "dup", "replay", "torn", "disk-loss", "pause", "slow"];

    fn as_array(self) -> [bool; 11] {
        [
            self.crash,
            self.partition,
            self.oneway,
            self.clock_step,
            self.loss,
            self.dup,
            self.replay,
            self.torn,
            self.disk_loss,
            self.pause,
            self.slow,
        ]
    }

    /// Parses a comma-separated list of `crash`, `partition`, `oneway`, `clock-step`, `loss`,
    /// `dup`, `replay`, `torn`, `disk-loss`, `pause`, `slow` (`restart` is part of `crash`; `all`
    /// is every kind).
    pub fn parse(list: &str) -> Result<FaultKinds, String> {
        let mut k = FaultKinds::NONE;
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match name {
                "all" => k = FaultKinds::ALL,
                "crash" | "restart" => k.crash = true,
                "partition" => k.partition = true,
                "oneway" => k.oneway = true,
                "clock-step" => k.clock_step = true,
                "loss" => k.loss = true,
                "dup" | "duplicate" => k.dup = true,
                "replay" => k.replay = true,
                "torn" => k.torn = true,
                "disk-loss" => k.disk_loss = true,
                "pause" => k.pause = true,
                "slow" => k.slow = true,
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
            duplicate_max: 0.3,
            replay_max: 40,
            max_crashed: 1,
            disk_loss_targets: Vec::new(),
            kinds: FaultKinds::ALL,
        }
    }
}

/// Draws a fault script for `targets` over `[start, end)` from `seed`. Every episode is
/// repaired before `end`, so liveness can be checked after it. Swarm testing: the seed also
/// decides which kinds of fault this run uses at all.
///
/// Duplication and replay are drawn from a stream of their own, after the other kinds: a
/// seed's crashes, partitions, cuts, clock steps and loss are the same whether or not they
/// are allowed (so a seed found before they existed replays as it did, with
/// `--faults crash,partition,oneway,clock-step,loss`); so are crashes mid-write, lost disks,
/// pauses and slow nodes, each after the ones before it.
pub fn random_plan(
    seed: u64,
    targets: &[NodeId],
    start: SimTime,
    end: SimTime,
    rates: &FaultRates,
) -> Vec<ScheduledFault> {
    if targets.is_empty() || end <= start {
        return Vec::new();
    }
    let mut plan = node_and_link_faults(seed, targets, start, end, rates);
    plan.extend(duplication_and_replay(seed, start, end, rates));
    let torn = torn_writes(seed, targets, start, end, rates, &plan);
    plan.extend(torn);
    let lost = disk_loss(seed, start, end, rates, &plan);
    plan.extend(lost);
    let paused = pauses(seed, targets, start, end, rates, &plan);
    plan.extend(paused);
    plan.extend(slow_nodes(seed, targets, start, end, rates));
    plan.sort_by_key(|f| f.at);
    plan
}

/// Each crash episode of `plan`: from the crash (or crash mid-write) to its node's next
/// restart (or `end`).
fn down_intervals(plan: &[ScheduledFault], end: SimTime) -> Vec<(SimTime, SimTime)> {
    plan.iter()
        .enumerate()
        .filter_map(|(i, f)| match f.fault {
            Fault::Crash(v) | Fault::CrashMidWrite(v) => {
                let back = plan[i..].iter().find(|r| r.fault == Fault::Restart(v)).map_or(end, |r| r.at);
                Some((f.at, back))
            }
            _ => None,
        })
        .collect()
}

/// Draws a crash episode on one of `targets` in `[start, end)`: when it starts, when it is
/// repaired, and on which node. `None` (after the same draws) if it would be empty or overlap
/// one of `down`, the episodes already planned.
fn draw_episode(
    rng: &mut rand_chacha::ChaCha8Rng,
    targets: &[NodeId],
    start: SimTime,
    end: SimTime,
    rates: &FaultRates,
    down: &[(SimTime, SimTime)],
) -> Option<(SimTime, SimTime, NodeId)> {
    let (s, e) = (start.as_nanos(), end.as_nanos());
    let episode_ns = kairos_core::duration_nanos(rates.episode).max(2);
    let at = rng.random_range(s..e);
    let repair = (at + rng.random_range(episode_ns / 2..=episode_ns)).min(e - 1);
    let victim = targets[rng.random_range(0..targets.len())];
    let (at, repair) = (SimTime(at), SimTime(repair));
    (repair > at && !down.iter().any(|(a, b)| at <= *b && *a <= repair)).then_some((at, repair, victim))
}

/// Positions in [`FaultKinds::NAMES`] of the kinds drawn from streams of their own.
const TORN: usize = 7;
const DISK_LOSS: usize = 8;
const PAUSE: usize = 9;
const SLOW: usize = 10;

/// The random stream of the kind at `index` of [`FaultKinds::NAMES`] (the seed mixed with the
/// kind's own `salt`), if this seed switches the kind on: it must be allowed and `possible`, and
/// then it is on for half the seeds, and for every seed when no kind before it is allowed.
fn own_stream(
    seed: u64,
    salt: u64,
    rates: &FaultRates,
    index: usize,
    possible: bool,
) -> Option<rand_chacha::ChaCha8Rng> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ salt);
    let kinds = rates.kinds.as_array();
    let only_this = kinds[..index].iter().all(|on| !on);
    if kinds[index] && possible && (rng.random_bool(0.5) || only_this) {
        Some(rng)
    } else {
        None
    }
}

/// One lost disk, on for a seed with probability 1/2 (always when it is the only kind
/// allowed), from a stream of its own: a node of [`FaultRates::disk_loss_targets`] crashes,
/// loses its disk and restarts at the end of the episode, while no other node is down.
fn disk_loss(
    seed: u64,
    start: SimTime,
    end: SimTime,
    rates: &FaultRates,
    plan: &[ScheduledFault],
) -> Vec<ScheduledFault> {
    let targets = &rates.disk_loss_targets;
    let possible = !targets.is_empty() && rates.max_crashed > 0;
    let Some(mut rng) = own_stream(seed, 0x6469_736b, rates, DISK_LOSS, possible) else { return Vec::new() };
    let Some((at, repair, victim)) = draw_episode(&mut rng, targets, start, end, rates, &down_intervals(plan, end))
    else {
        return Vec::new();
    };
    vec![
        ScheduledFault { at, fault: Fault::Crash(victim) },
        ScheduledFault { at, fault: Fault::WipeDisk(victim) },
        ScheduledFault { at: repair, fault: Fault::Restart(victim) },
    ]
}

/// Pauses, on for a seed with probability 1/2 (always when they are the only kind allowed),
/// from a stream of their own: one or two episodes, each on a node no crash or other pause has
/// down at the same time (a paused node is as unavailable as a crashed one), half of them up to
/// an episode long and half up to five (3 s by default: longer than the roles' failure
/// detectors, so that the others replace a paused leader, which then resumes believing it leads).
fn pauses(
    seed: u64,
    targets: &[NodeId],
    start: SimTime,
    end: SimTime,
    rates: &FaultRates,
    plan: &[ScheduledFault],
) -> Vec<ScheduledFault> {
    let Some(mut rng) = own_stream(seed, 0x0070_6175_7365, rates, PAUSE, rates.max_crashed > 0) else {
        return Vec::new();
    };
    let long = FaultRates { episode: rates.episode * 5, ..rates.clone() };
    let length = |rng: &mut rand_chacha::ChaCha8Rng| if rng.random_bool(0.5) { long.clone() } else { rates.clone() };
    node_episodes(&mut rng, targets, (start, end), plan, length, (Fault::Pause, Fault::Resume))
}

/// Slow nodes, on for a seed with probability 1/2 (always when they are the only kind allowed),
/// from a stream of their own: one or two episodes, each making one node's outgoing messages
/// late (a gray failure: the node runs, hears everyone, and is heard late), for up to an
/// episode or up to five. Half add 20-200 ms (a wide-area round trip: timestamps and leases
/// meet messages later than their senders planned), half 0.5-1.5 s (past the roles' failure
/// detectors: the others may replace a node that still acts and is still heard, late). One
/// node is slow at a time; they may overlap anything else (a slow node is not a failed one);
/// every message sent during an episode arrives before `end`.
fn slow_nodes(seed: u64, targets: &[NodeId], start: SimTime, end: SimTime, rates: &FaultRates) -> Vec<ScheduledFault> {
    let Some(mut rng) = own_stream(seed, 0x736c_6f77, rates, SLOW, true) else { return Vec::new() };
    let long = FaultRates { episode: rates.episode * 5, ..rates.clone() };
    let (mut episodes, mut slow) = (Vec::new(), Vec::new());
    for _ in 0..rng.random_range(1..=2) {
        let extra_ms = if rng.random_bool(0.5) { rng.random_range(20..=200) } else { rng.random_range(500..=1500) };
        let extra_ns = extra_ms * 1_000_000;
        let rates = if rng.random_bool(0.5) { &long } else { rates };
        let last = SimTime(end.as_nanos().saturating_sub(extra_ns));
        if last <= start {
            continue;
        }
        let Some((at, back, node)) = draw_episode(&mut rng, targets, start, last, rates, &slow) else { continue };
        slow.push((at, back));
        episodes.push(ScheduledFault { at, fault: Fault::Slow { node, extra_ns } });
        episodes.push(ScheduledFault { at: back, fault: Fault::Slow { node, extra_ns: 0 } });
    }
    episodes
}

/// A fault of one node (`Fault::Pause`, `Fault::Restart`, …).
type NodeFault = fn(NodeId) -> Fault;

/// One or two episodes drawn from `rng`, each on one of `targets` that no crash of `plan` nor
/// an earlier episode here has down at the same time, from `begin(node)` to `repair(node)`;
/// `length` gives each episode's rates (its length), drawing from `rng` first if it likes.
fn node_episodes(
    rng: &mut rand_chacha::ChaCha8Rng,
    targets: &[NodeId],
    (start, end): (SimTime, SimTime),
    plan: &[ScheduledFault],
    mut length: impl FnMut(&mut rand_chacha::ChaCha8Rng) -> FaultRates,
    (begin, repair): (NodeFault, NodeFault),
) -> Vec<ScheduledFault> {
    let mut down = down_intervals(plan, end);
    let mut episodes = Vec::new();
    for _ in 0..rng.random_range(1..=2) {
        let rates = length(rng);
        let Some((at, back, victim)) = draw_episode(rng, targets, start, end, &rates, &down) else {
            continue;
        };
        down.push((at, back));
        episodes.push(ScheduledFault { at, fault: begin(victim) });
        episodes.push(ScheduledFault { at: back, fault: repair(victim) });
    }
    episodes
}

/// Crashes in the middle of a write, on for a seed with probability 1/2 (always when they are
/// the only kind allowed), from a stream of their own like duplication and replay: one or two
/// episodes, each on a node no other crash episode has down at the same time.
fn torn_writes(
    seed: u64,
    targets: &[NodeId],
    start: SimTime,
    end: SimTime,
    rates: &FaultRates,
    plan: &[ScheduledFault],
) -> Vec<ScheduledFault> {
    let Some(mut rng) = own_stream(seed, 0x746f_726e, rates, TORN, rates.max_crashed > 0) else {
        return Vec::new();
    };
    node_episodes(&mut rng, targets, (start, end), plan, |_| rates.clone(), (Fault::CrashMidWrite, Fault::Restart))
}

/// Duplication episodes and replays, each on for a seed with probability 1/2 (see
/// [`random_plan`]); on for every seed when they are the only kinds allowed.
fn duplication_and_replay(seed: u64, start: SimTime, end: SimTime, rates: &FaultRates) -> Vec<ScheduledFault> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x7265_706c_6179);
    let only_these = rates.kinds.as_array()[..5].iter().all(|on| !on);
    let dup_on = rates.kinds.dup && (rng.random_bool(0.5) || only_these);
    let replay_on = rates.kinds.replay && (rng.random_bool(0.5) || only_these);
    let (s, e) = (start.as_nanos(), end.as_nanos());
    let mut plan = Vec::new();
    if dup_on && rates.duplicate_max > 0.0 {
        for _ in 0..rng.random_range(1..=2) {
            let at = rng.random_range(s..e);
            let repair = rng.random_range(at..e);
            let p = rng.random_range(0.01..=rates.duplicate_max.max(0.01));
            plan.push(ScheduledFault { at: SimTime(at), fault: Fault::SetDuplicate(p) });
            plan.push(ScheduledFault { at: SimTime(repair), fault: Fault::SetDuplicate(0.0) });
        }
    }
    if replay_on && rates.replay_max > 0 {
        for _ in 0..rng.random_range(2..=6) {
            let at = rng.random_range(s..e);
            plan.push(ScheduledFault { at: SimTime(at), fault: Fault::Replay(rng.random_range(1..=rates.replay_max)) });
        }
    }
    plan
}

/// Crashes, partitions, one-way cuts, clock steps and loss (see [`random_plan`]).
fn node_and_link_faults(
    seed: u64,
    targets: &[NodeId],
    start: SimTime,
    end: SimTime,
    rates: &FaultRates,
) -> Vec<ScheduledFault> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x6661_756c_7473);
    let mut plan = Vec::new();
    // Swarm testing: each allowed kind is on with probability 1/2, and at least one is on.
    let all = rates.kinds.as_array();
    let allowed = [all[0], all[1], all[2], all[3], all[4]];
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
        let crashes = a.iter().filter(|f| matches!(f.fault, Fault::Crash(_) | Fault::CrashMidWrite(_))).count();
        let restarts = a.iter().filter(|f| matches!(f.fault, Fault::Restart(_))).count();
        assert_eq!(crashes, restarts, "every crash is repaired");
        let differs = (0..20).any(|s| random_plan(s, &nodes, SimTime::ZERO, end, &rates) != a);
        assert!(differs, "other seeds give other plans");
    }

    /// Duplication and replay come from their own stream: allowing them adds faults to a
    /// seed's plan without changing the others (old seeds replay as they did).
    #[test]
    fn duplication_and_replay_leave_the_other_faults_of_a_seed_unchanged() {
        let nodes: Vec<NodeId> = (0..5).map(NodeId).collect();
        let end = SimTime::from_secs(30);
        let without = FaultRates {
            kinds: FaultKinds::parse("crash,partition,oneway,clock-step,loss").unwrap(),
            ..FaultRates::default()
        };
        let extra = |f: &Fault| matches!(f, Fault::SetDuplicate(_) | Fault::Replay(_));
        let with = FaultRates {
            kinds: FaultKinds::parse("crash,partition,oneway,clock-step,loss,dup,replay").unwrap(),
            ..FaultRates::default()
        };
        let mut added = 0;
        for seed in 0..50 {
            let all = random_plan(seed, &nodes, SimTime::ZERO, end, &with);
            let old = random_plan(seed, &nodes, SimTime::ZERO, end, &without);
            let kept: Vec<_> = all.iter().filter(|f| !extra(&f.fault)).cloned().collect();
            assert_eq!(kept, old, "seed {seed}");
            added += all.len() - old.len();
        }
        assert!(added > 50, "the extra kinds show up: {added}");
        let only = FaultRates { kinds: FaultKinds::parse("replay").unwrap(), ..FaultRates::default() };
        let plan = random_plan(1, &nodes, SimTime::ZERO, end, &only);
        assert!(!plan.is_empty() && plan.iter().all(|f| matches!(f.fault, Fault::Replay(_))));
    }

    /// Crashes mid-write come from their own stream too, each with its restart, and never while
    /// another crash episode has a node down (at most `max_crashed` = 1 down at once).
    #[test]
    fn torn_writes_add_episodes_without_changing_the_rest_or_overlapping_crashes() {
        let nodes: Vec<NodeId> = (0..3).map(NodeId).collect();
        let end = SimTime::from_secs(30);
        let before = FaultRates {
            kinds: FaultKinds::parse("crash,partition,oneway,clock-step,loss,dup,replay").unwrap(),
            ..FaultRates::default()
        };
        let with_torn = FaultRates {
            kinds: FaultKinds::parse(&format!("{},torn", before.kinds.names().join(","))).unwrap(),
            ..before.clone()
        };
        let mut episodes = 0;
        for seed in 0..100 {
            let all = random_plan(seed, &nodes, SimTime::ZERO, end, &with_torn);
            // Strip each CrashMidWrite and the restart that ends it; what remains is the old plan.
            let mut torn_down: Option<(NodeId, SimTime)> = None;
            let mut down: Vec<(SimTime, SimTime)> = Vec::new();
            let mut crashed_at: std::collections::BTreeMap<NodeId, SimTime> = Default::default();
            let mut rest = Vec::new();
            for f in &all {
                match f.fault {
                    Fault::CrashMidWrite(v) => {
                        assert!(torn_down.is_none(), "seed {seed}: one torn episode at a time");
                        torn_down = Some((v, f.at));
                        episodes += 1;
                    }
                    Fault::Restart(v) if torn_down.is_some_and(|(t, _)| t == v) => {
                        let (_, from) = torn_down.take().unwrap();
                        down.push((from, f.at));
                    }
                    Fault::Crash(v) => {
                        crashed_at.insert(v, f.at);
                        rest.push(f.clone());
                    }
                    Fault::Restart(v) => {
                        if let Some(from) = crashed_at.remove(&v) {
                            down.push((from, f.at));
                        }
                        rest.push(f.clone());
                    }
                    _ => rest.push(f.clone()),
                }
            }
            assert!(torn_down.is_none(), "seed {seed}: every torn episode is repaired");
            assert_eq!(rest, random_plan(seed, &nodes, SimTime::ZERO, end, &before), "seed {seed}");
            down.sort();
            assert!(down.windows(2).all(|w| w[0].1 < w[1].0), "seed {seed}: two nodes down at once: {down:?}");
        }
        assert!(episodes > 30, "torn writes show up: {episodes}");
        let only = FaultRates { kinds: FaultKinds::parse("torn").unwrap(), ..FaultRates::default() };
        let plan = random_plan(3, &nodes, SimTime::ZERO, end, &only);
        assert!(plan.iter().any(|f| matches!(f.fault, Fault::CrashMidWrite(_))), "{plan:?}");
    }

    /// Pauses come from their own stream, each with its resume before the end, never while a
    /// crash or another pause has a node down; some outlast a failure detector (over an
    /// episode's length).
    #[test]
    fn pauses_add_episodes_without_changing_the_rest_or_overlapping_crashes() {
        let nodes: Vec<NodeId> = (0..3).map(NodeId).collect();
        let end = SimTime::from_secs(30);
        let before = FaultRates {
            kinds: FaultKinds::parse("crash,partition,oneway,clock-step,loss,dup,replay,torn").unwrap(),
            ..FaultRates::default()
        };
        let with_pauses = FaultRates { kinds: FaultKinds { slow: false, ..FaultKinds::ALL }, ..FaultRates::default() };
        let (mut episodes, mut long) = (0, 0);
        for seed in 0..100 {
            let all = random_plan(seed, &nodes, SimTime::ZERO, end, &with_pauses);
            let rest: Vec<ScheduledFault> =
                all.iter().filter(|f| !matches!(f.fault, Fault::Pause(_) | Fault::Resume(_))).cloned().collect();
            assert_eq!(rest, random_plan(seed, &nodes, SimTime::ZERO, end, &before), "seed {seed}");
            let mut down = down_intervals(&all, end);
            for (i, f) in all.iter().enumerate() {
                if let Fault::Pause(v) = f.fault {
                    let resume = all[i..].iter().find(|r| r.fault == Fault::Resume(v)).expect("every pause ends");
                    assert!(resume.at < end);
                    episodes += 1;
                    long += usize::from(resume.at.as_nanos() - f.at.as_nanos() > 600_000_000);
                    down.push((f.at, resume.at));
                }
            }
            down.sort();
            assert!(down.windows(2).all(|w| w[0].1 < w[1].0), "seed {seed}: two nodes down at once: {down:?}");
        }
        assert!(episodes > 30 && long > 5, "pauses show up, some long: {episodes}, {long}");
        let only = FaultRates { kinds: FaultKinds::parse("pause").unwrap(), ..FaultRates::default() };
        let plan = random_plan(3, &nodes, SimTime::ZERO, end, &only);
        assert!(!plan.is_empty() && plan.iter().all(|f| matches!(f.fault, Fault::Pause(_) | Fault::Resume(_))));
    }

    /// Slow nodes come from their own stream, one at a time, each ended in time for what it
    /// sent to arrive before the end; some add over a second, some last over an episode.
    #[test]
    fn slow_nodes_add_episodes_without_changing_the_rest() {
        let nodes: Vec<NodeId> = (0..3).map(NodeId).collect();
        let end = SimTime::from_secs(30);
        let before = FaultRates { kinds: FaultKinds { slow: false, ..FaultKinds::ALL }, ..FaultRates::default() };
        let (mut episodes, mut late, mut long) = (0, 0, 0);
        for seed in 0..100 {
            let all = random_plan(seed, &nodes, SimTime::ZERO, end, &FaultRates::default());
            let rest: Vec<ScheduledFault> =
                all.iter().filter(|f| !matches!(f.fault, Fault::Slow { .. })).cloned().collect();
            assert_eq!(rest, random_plan(seed, &nodes, SimTime::ZERO, end, &before), "seed {seed}");
            let mut slow = Vec::new();
            for (i, f) in all.iter().enumerate() {
                if let Fault::Slow { node, extra_ns } = f.fault {
                    if extra_ns == 0 {
                        continue;
                    }
                    let stop = Fault::Slow { node, extra_ns: 0 };
                    let back = all[i..].iter().find(|r| r.fault == stop).expect("every slow episode ends");
                    assert!(back.at.as_nanos() + extra_ns <= end.as_nanos(), "seed {seed}: arrives in time");
                    episodes += 1;
                    late += usize::from(extra_ns > 1_000_000_000);
                    long += usize::from(back.at.as_nanos() - f.at.as_nanos() > 600_000_000);
                    slow.push((f.at, back.at));
                }
            }
            slow.sort();
            assert!(slow.windows(2).all(|w| w[0].1 < w[1].0), "seed {seed}: two slow at once: {slow:?}");
        }
        assert!(episodes > 30 && late > 5 && long > 5, "slow nodes show up: {episodes}, {late}, {long}");
        let only = FaultRates { kinds: FaultKinds::parse("slow").unwrap(), ..FaultRates::default() };
        let plan = random_plan(3, &nodes, SimTime::ZERO, end, &only);
        assert!(!plan.is_empty() && plan.iter().all(|f| matches!(f.fault, Fault::Slow { .. })));
    }
}
