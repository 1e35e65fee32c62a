//! `kairos sim <protocol> --seeds A..B [--faults …]`: fault campaigns (swarm testing) for the
//! register, the transactional protocols, the causal replica set and SWARM's stores. Each seed
//! draws its own fault plan — which kinds of fault are on, when, where — over the servers (or
//! members); the run checks **safety** (every role's invariants at every event, then the
//! history checker) and, once every fault is repaired, **liveness**: every client that asks
//! for something afterwards gets an answer. A failing seed's history is saved with the command
//! that replays it.
//!
//! `--corrupt` also changes a share of the messages on the wire ([`Sim::corrupt_messages`]): a
//! Byzantine sender, outside every protocol's fault model, so only panics are judged then. A
//! panic fails its seed in any campaign (caught, with its message, instead of ending the
//! campaign).

use kairos_harness::TxnDeployment;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use kairos_check::{Model, Verdict};
use kairos_core::history::{HistoryRecord, OpType};
use kairos_core::{Message, NodeId, SimTime};
use kairos_harness::micro::{in_doubt, settle, Bench, PeerProtocol, PeerWorld, TpccBench, TpccOutcome};
use kairos_harness::register::RegisterRun;
use kairos_harness::swarm::sim::SwarmRun;
use kairos_sim::fault::random_plan;
use kairos_sim::{FaultKinds, FaultRates, ScheduledFault, Sim, Violation};
use kairos_swarm::engine::Protocol;
use kairos_txn::calvin::{CalvinConfig, CalvinPlus};
use kairos_txn::detock::{Detock, DetockConfig};
use kairos_txn::janus::{Janus, JanusConfig};
use kairos_txn::ncc::NccPaxos;
use kairos_txn::occ::OccPaxos;
use kairos_txn::tapir::{Tapir, TapirConfig};
use kairos_txn::tpl::TwoPlPaxos;
use kairos_txn::twopc::ClassicConfig;
use kairos_workload::tpcc::TpccScale;
use serde::Serialize;

use crate::cli::{CampaignArgs, CampaignProtocol, CampaignWorkload};
use crate::progress;
use crate::CliError;

/// Faults start here and are all repaired by `FAULTS_END`; load runs `RECOVERY` longer.
const FAULTS_START: Duration = Duration::from_millis(500);

/// What one seed's run produced.
struct SeedRun {
    /// Faults in the plan (SWARM: the crashes and adversarial parts its deployment drew).
    faults: usize,
    /// Set when the protocol's runner checked the history itself (SWARM: per key), with why.
    checked: Option<(Verdict, String)>,
    /// Set when a liveness rule other than "every client answered" failed (SWARM: reads).
    stuck_why: Option<String>,
    plan: Vec<ScheduledFault>,
    history: Vec<HistoryRecord>,
    /// The history to save for a failing seed when it differs from `history` (SWARM: with the
    /// warm-up's final values as initial writes, so that `kairos check` judges it as the run did).
    saved_history: Option<Vec<HistoryRecord>>,
    model: Model,
    /// Jepsen process ids of each client (coordinator or session).
    clients: Vec<(u64, u64)>,
    violation: Option<Violation>,
    events: u64,
    /// Handlers that died writing ([`kairos_sim::Fault::CrashMidWrite`]).
    torn_writes: u64,
    trace_hash: u64,
    /// Tiga: the view the view manager reached (each view change bumps it by one).
    view_changes: Option<u64>,
    /// Tiga: how often each view-change path ran (its `tiga.vc_*` metrics).
    view_change_paths: BTreeMap<String, u64>,
    /// Liveness is judged on what clients asked after this: the last repair, plus the longest
    /// a request made during the faults may still hold a one-at-a-time client.
    live_from: SimTime,
    /// When the run stopped.
    ended: SimTime,
    /// TPC-C campaigns: the end-of-run checks of the servers' databases.
    database: Option<TpccOutcome>,
    /// Messages whose encoding `--corrupt` changed and that were delivered.
    corrupted: u64,
}

/// One seed's verdicts.
#[derive(Clone, Debug, Serialize)]
pub struct SeedResult {
    pub seed: u64,
    pub faults: usize,
    pub ok: usize,
    pub unknown: usize,
    /// "valid", "invalid" or "unknown" (the history checker), or "invariant" (stopped early).
    pub safety: String,
    /// Clients that asked for something after the faults were repaired and got no answer.
    pub clients_stuck: usize,
    pub events: u64,
    /// Handlers that died while writing (the `torn` fault kind).
    pub torn_writes: u64,
    pub trace_hash: String,
    /// Tiga: view changes during the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub view_changes: Option<u64>,
    /// Tiga: how often each view-change path ran (the servers' `tiga.vc_*` metrics: merges,
    /// transactions fetched, moved, reordered, dropped…), so that a campaign shows which
    /// recovery paths its plans reached.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub view_change_paths: BTreeMap<String, u64>,
    /// TPC-C campaigns: consistency conditions checked on the databases at the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpcc_conditions_checked: Option<u64>,
    /// `--corrupt`: messages whose encoding was changed and that were delivered.
    #[serde(skip_serializing_if = "is_zero")]
    pub messages_corrupted: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// The campaign's summary (`--json`).
#[derive(Clone, Debug, Serialize)]
pub struct CampaignSummary {
    pub protocol: String,
    pub seeds_run: usize,
    pub violations: usize,
    pub unverified: usize,
    pub liveness_failures: usize,
    /// Seeds where a role panicked (counted among the violations too).
    pub panics: usize,
    /// `--corrupt`: the share of messages changed on the wire (0: none).
    pub corrupt_share: f64,
    pub events_per_s: f64,
    /// Handlers that died while writing, over every seed.
    pub torn_writes: u64,
    pub wall_s: f64,
    pub fault_kinds: Vec<String>,
    pub seeds: Vec<SeedResult>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn rates(args: &CampaignArgs) -> Result<FaultRates, CliError> {
    let kinds = FaultKinds::parse(&args.faults).map_err(CliError::Usage)?;
    Ok(FaultRates { kinds, ..FaultRates::default() })
}

/// `kinds` without the faults that crash a node (for protocols without recovery).
fn without_crashes(kinds: FaultKinds) -> FaultKinds {
    FaultKinds { crash: false, torn: false, disk_loss: false, ..kinds }
}

fn faults_end(args: &CampaignArgs) -> Duration {
    Duration::from_secs_f64(args.fault_s.max(1.0))
}

/// Parses `N`, `A..B` (B excluded) or `A..=B`.
pub fn parse_seeds(spec: &str) -> Result<Vec<u64>, CliError> {
    let bad = || CliError::Usage(format!("--seeds takes N, A..B or A..=B (e.g. 1..51), not `{spec}`"));
    let num = |s: &str| s.trim().parse::<u64>().map_err(|_| bad());
    let seeds: Vec<u64> = if let Some((a, b)) = spec.split_once("..=") {
        (num(a)?..=num(b)?).collect()
    } else if let Some((a, b)) = spec.split_once("..") {
        (num(a)?..num(b)?).collect()
    } else {
        vec![num(spec)?]
    };
    if seeds.is_empty() || seeds.len() > 100_000 {
        return Err(CliError::Usage(format!("--seeds `{spec}` names {} seeds; give 1 to 100,000", seeds.len())));
    }
    Ok(seeds)
}

/// Runs one seed of `protocol`.
fn run_seed(
    protocol: CampaignProtocol,
    seed: u64,
    args: &CampaignArgs,
    rates: &FaultRates,
) -> Result<SeedRun, CliError> {
    let end = faults_end(args);
    let recovery = Duration::from_secs_f64(args.recovery_s.max(1.0));
    let usage = |e: &dyn std::fmt::Display| CliError::Usage(e.to_string());
    // TPC-C: 6 warehouses (2 per shard) with small tables, so that a seed populates quickly.
    let tpcc = (args.workload == CampaignWorkload::Tpcc)
        .then(|| TpccBench { scale: TpccScale::small(6, 1_000), ..TpccBench::default() });
    let bench = Bench {
        base: TxnDeployment {
            seed,
            load_txn_per_s: args.load,
            duration: end + recovery,
            keys_per_shard: 2_000,
            ..Default::default()
        },
        tpcc,
        ..Bench::default()
    };
    // Faults over [offset + 0.5 s, offset + end): offset is the warm-up before clients start.
    // `lose_disks`: the targets whose roles come back safely without their disk (amnesia).
    let plan_with = |targets: &[NodeId], lose_disks: &[NodeId], offset: Duration| {
        let rates = FaultRates { disk_loss_targets: lose_disks.to_vec(), ..rates.clone() };
        random_plan(seed, targets, SimTime::ZERO + offset + FAULTS_START, SimTime::ZERO + offset + end, &rates)
    };
    let plan_for = |targets: &[NodeId], offset: Duration| plan_with(targets, &[], offset);
    let healed = SimTime::ZERO + end;
    // Transactions in flight when the load stops get time to finish or be given up.
    let drain = Duration::from_secs(10);
    let plan_servers = |servers: &[NodeId]| plan_for(servers, Duration::ZERO);
    macro_rules! peer_without_crashes {
        ($p:ty, $bench:expr, $config:expr) => {{
            let bench = $bench;
            let mut w = bench.build::<$p>(&$config).map_err(|e| usage(&e))?;
            corrupt(&mut w.sim, args);
            let until = SimTime::ZERO + end + recovery + drain;
            let rates = FaultRates { kinds: without_crashes(rates.kinds), ..rates.clone() };
            let plan = |servers: &[NodeId]| {
                random_plan(seed, servers, SimTime::ZERO + FAULTS_START, SimTime::ZERO + end, &rates)
            };
            peer_run::<$p>(&bench, &mut w, &plan, until, healed)
        }};
    }
    macro_rules! peer {
        ($p:ty, $config:expr) => {{
            let mut w = bench.build::<$p>(&$config).map_err(|e| usage(&e))?;
            corrupt(&mut w.sim, args);
            let until = SimTime::ZERO + end + recovery + drain;
            peer_run::<$p>(&bench, &mut w, &plan_servers, until, healed)
        }};
    }
    Ok(match protocol {
        CampaignProtocol::TwoPlPaxos => peer!(TwoPlPaxos, ClassicConfig::default()),
        CampaignProtocol::OccPaxos => peer!(OccPaxos, ClassicConfig::default()),
        CampaignProtocol::NccPaxos => peer!(NccPaxos, ClassicConfig::default()),
        CampaignProtocol::Tapir => peer!(Tapir, TapirConfig::default()),
        // Calvin+, Detock and Janus have no recovery (a restarted server comes back empty), and NCC
        // has one server per shard (a crash loses what it acknowledged): every fault but
        // crashes.
        CampaignProtocol::CalvinPlus => peer_without_crashes!(CalvinPlus, bench.clone(), CalvinConfig::default()),
        CampaignProtocol::Janus => peer_without_crashes!(Janus, bench.clone(), JanusConfig::default()),
        CampaignProtocol::Detock => peer_without_crashes!(Detock, bench.clone(), DetockConfig::default()),
        CampaignProtocol::Ncc => peer_without_crashes!(NccPaxos, bench.unreplicated(), ClassicConfig::default()),
        CampaignProtocol::Tiga => {
            let mut d = bench.tiga();
            // Checkpoints every few hundred positions, so that every seed also truncates logs
            // and transfers state to replicas the leader's log no longer reaches.
            d.config.checkpoint_interval = 300;
            d.config.checkpoint_positions_per_key = 0;
            let w = d.build().map_err(|e| usage(&e))?;
            let drain = d.config.retry_timeout * d.config.max_sends + Duration::from_secs(1);
            let until = SimTime::ZERO + end + recovery + drain;
            // Any server crashes and restarts (a leader's crash is a view change), and so do
            // the view manager's nodes; a server may also lose its disk (a view manager's
            // Paxos acceptor cannot come back from that yet).
            let mut sim = w.sim;
            corrupt(&mut sim, args);
            let servers: Vec<NodeId> = w.topology.shards.iter().flatten().copied().collect();
            let targets: Vec<NodeId> = servers.iter().chain(&w.view_managers).copied().collect();
            let plan = plan_with(&targets, &servers, Duration::ZERO);
            sim.schedule_all(plan.clone());
            sim.run_until(until);
            let views = w
                .view_managers
                .iter()
                .filter_map(|n| sim.role::<kairos_tiga::view::ViewManager>(*n).map(|vm| vm.view().number))
                .max();
            let clients = w.process_regions.iter().map(|(a, b, _)| (*a, *b)).collect();
            let run = finish(&mut sim, plan, Model::StrictSerializable, clients, healed);
            // Coordinators do not crash here, and every transaction is retried long enough to
            // outlast the faults and a view change: one given up means servers never answered
            // its coordinator in a way that finishes it (a liveness bug, even when the
            // transaction took effect).
            let given_up = run.history.iter().filter(|r| r.event.op_type == kairos_core::history::OpType::Info).count();
            let stuck_why = run.stuck_why.clone().or_else(|| {
                (given_up > 0).then(|| {
                    format!("{given_up} transactions were given up: their coordinators never learned the outcome")
                })
            });
            let view_change_paths = sim
                .metrics()
                .iter()
                .filter(|(name, _)| name.starts_with("tiga.vc_"))
                .map(|(name, n)| (name.to_string(), *n))
                .collect();
            let database = d.tpcc_outcome(&sim, &w.topology);
            SeedRun { view_changes: views, view_change_paths, stuck_why, database, ..run }
        }
        CampaignProtocol::SwarmKv | CampaignProtocol::DmAbd | CampaignProtocol::Fusee => {
            let p = match protocol {
                CampaignProtocol::SwarmKv => Protocol::SwarmKv,
                CampaignProtocol::DmAbd => Protocol::DmAbd,
                _ => Protocol::Fusee,
            };
            let mut run = SwarmRun::draw(seed, false, Some(p));
            if p == Protocol::Fusee {
                // No recovery: a crashed writer or memory node would stall FUSEE for good.
                run.crash_node_at = None;
                run.crash_client_after = None;
                run.adversary.crash_client_at_chain = None;
            }
            run.corrupt_messages = args.corrupt;
            // A corrupted run's history is not judged: checking it would only cost time.
            run.check = args.corrupt == 0.0;
            let o = kairos_harness::swarm::run(&run).map_err(|e| CliError::Usage(e.to_string()))?;
            let verdict = match o.linearizable {
                Some(true) => Verdict::Valid,
                Some(false) => Verdict::Invalid,
                None => Verdict::Unknown,
            };
            let metric = |name: &str| o.metrics.get(name).copied().unwrap_or(0);
            let bound = 2 * u64::from(run.clients) + 1;
            let (timeouts, iterations) = (metric("get_timeouts"), metric("read_iterations_max"));
            let stuck_why = (timeouts > 0 || iterations > bound).then(|| {
                format!("{timeouts} gets timed out; the longest read took {iterations} iterations (bound {bound})")
            });
            let a = &run.adversary;
            let faults = [
                run.crash_node_at.is_some(),
                run.crash_client_after.is_some(),
                a.stall_client.is_some(),
                a.pause_client.is_some(),
                a.crash_client_at_chain.is_some(),
            ];
            SeedRun {
                faults: faults.iter().filter(|f| **f).count(),
                checked: Some((verdict, o.check_report.clone())),
                stuck_why,
                plan: Vec::new(),
                model: Model::Linearizable,
                clients: Vec::new(),
                violation: None,
                events: metric("events"),
                torn_writes: 0,
                trace_hash: o.trace_hash,
                saved_history: Some(o.history_with_initial_values()),
                history: o.history,
                live_from: SimTime::ZERO,
                ended: SimTime::ZERO,
                view_changes: None,
                view_change_paths: BTreeMap::new(),
                database: None,
                corrupted: metric("sim.messages_corrupted"),
            }
        }
        CampaignProtocol::Register => {
            // A client runs one operation at a time: one invoked during the faults may hold it
            // until its timeout, after the repair.
            let grace = kairos_register::ClientConfig::new(Vec::new(), 0).op_timeout;
            let run = RegisterRun { seed, duration: end + grace + recovery, ..RegisterRun::default() };
            let mut world = run.build().map_err(|e| usage(&e))?;
            corrupt(&mut world.sim, args);
            let plan = plan_with(&world.replicas, &world.replicas, Duration::ZERO);
            world.sim.schedule_all(plan.clone());
            world.sim.run_until(SimTime::ZERO + run.duration);
            // Client `i` is Jepsen process `i`.
            let clients = (0..world.process_region.len() as u64).map(|p| (p, p + 1)).collect();
            finish(&mut world.sim, plan, Model::Linearizable, clients, healed + grace)
        }
        CampaignProtocol::Causal => {
            // A session runs one operation at a time: one invoked during the faults may hold
            // it until its timeout, after the repair.
            let grace = kairos_causal::session::SessionConfig::new(0, Vec::new()).op_timeout;
            let d = kairos_harness::causal::Deployment {
                seed,
                sessions: 8,
                warmup: Duration::from_secs(3),
                duration: end + grace + recovery,
                ..kairos_harness::causal::Deployment::default()
            };
            let mut world = d.build().map_err(|e| usage(&e))?;
            corrupt(&mut world.sim, args);
            // A member may lose its disk: it comes back amnesiac (`kairos_causal::member::amnesia`).
            let plan = plan_with(&world.members, &world.members, d.warmup);
            world.sim.schedule_all(plan.clone());
            world.sim.run_until(SimTime::ZERO + d.warmup + end + recovery + Duration::from_secs(5));
            // One client per session: its Jepsen process.
            let mut processes: Vec<u64> = world.sim.history().iter().map(|r| r.event.process).collect();
            processes.sort_unstable();
            processes.dedup();
            let clients = processes.into_iter().map(|p| (p, p + 1)).collect();
            finish(&mut world.sim, plan, Model::Causal, clients, healed + d.warmup + grace)
        }
    })
}

/// Runs a peer's deployment with faults on its servers until `until`, lets its coordinators
/// settle, and judges the end ([`peer_end`]).
fn peer_run<P: PeerProtocol>(
    bench: &Bench,
    w: &mut PeerWorld<P::Msg>,
    plan_for: &dyn Fn(&[NodeId]) -> Vec<ScheduledFault>,
    until: SimTime,
    live_from: SimTime,
) -> SeedRun {
    let servers: Vec<NodeId> = w.topology.shards.iter().flatten().copied().collect();
    let plan = plan_for(&servers);
    w.sim.schedule_all(plan.clone());
    w.sim.run_until(until);
    let settled = settle::<P>(&mut w.sim, &w.topology, w.process_regions.len(), SETTLE_MAX);
    let clients = w.process_regions.iter().map(|(a, b, _)| (*a, *b)).collect();
    let run = finish(&mut w.sim, plan, Model::StrictSerializable, clients, live_from);
    peer_end::<P>(bench, w, run, settled)
}

/// How long a peer's coordinators get, after the drain, to finish what they have in flight
/// (retries of transactions still aborting, decisions not yet acknowledged) before the
/// servers' rows are read.
const SETTLE_MAX: Duration = Duration::from_secs(30);

/// A peer's end-of-run checks beyond the history, once its coordinators settled (or
/// `SETTLE_MAX` passed): coordinators still busy, or attempts still in doubt on a server (a
/// decision that never reached a participant), are liveness failures; then the TPC-C
/// databases. Rows read then may be mid-commit, so the database verdict counts only when
/// everything settled (the liveness failure quotes it).
fn peer_end<P: PeerProtocol>(bench: &Bench, w: &PeerWorld<P::Msg>, run: SeedRun, settled: bool) -> SeedRun {
    let database = bench.tpcc_outcome::<P>(w);
    let in_doubt = in_doubt::<P>(w);
    let why = match (settled, in_doubt) {
        (true, 0) => return SeedRun { database, ..run },
        (false, _) => format!(
            "coordinators still had transactions or unacknowledged decisions {} s after the drain",
            SETTLE_MAX.as_secs()
        ),
        (true, n) => {
            format!("{n} attempts were still prepared and undecided after every coordinator settled")
        }
    };
    let read = database.filter(|d| !d.holds()).map(|d| format!("; the databases read then: {d:?}"));
    SeedRun { stuck_why: run.stuck_why.or(Some(why + &read.unwrap_or_default())), ..run }
}

/// The seed's run as the campaign judges it.
fn finish<M: Message>(
    sim: &mut Sim<M>,
    plan: Vec<ScheduledFault>,
    model: Model,
    clients: Vec<(u64, u64)>,
    live_from: SimTime,
) -> SeedRun {
    SeedRun {
        faults: plan.len(),
        checked: None,
        stuck_why: None,
        plan,
        model,
        clients,
        violation: sim.violation().cloned(),
        events: sim.stats().events_handled,
        torn_writes: sim.stats().torn_writes,
        trace_hash: sim.trace_hash(),
        history: sim.take_history(),
        saved_history: None,
        live_from,
        ended: sim.now(),
        view_changes: None,
        view_change_paths: BTreeMap::new(),
        database: None,
        corrupted: sim.stats().corrupted,
    }
}

/// `--corrupt`: changes that share of `sim`'s messages on the wire.
fn corrupt<M: Message>(sim: &mut Sim<M>, args: &CampaignArgs) {
    if args.corrupt > 0.0 {
        sim.corrupt_messages(args.corrupt);
    }
}

/// Runs `f`; a panic in it becomes `Err` with its message and place, which the campaign
/// reports as the seed's failure (the default hook's print is held back meanwhile).
fn catching_panics<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static MESSAGE: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        *MESSAGE.lock().unwrap_or_else(|e| e.into_inner()) = Some(info.to_string());
    }));
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    out.map_err(|_| {
        MESSAGE.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_else(|| "a panic without a message".into())
    })
}

/// A seed's safety verdict ("valid", "invalid", "unknown", "invariant" or "database"), why it
/// failed, and its clients stuck after the repair.
fn judge(run: &SeedRun) -> Result<(String, Option<String>, usize), CliError> {
    let (safety, failure) = match &run.violation {
        Some(v) => ("invariant".to_string(), Some(v.to_string())),
        None if run.checked.is_some() => {
            let (verdict, report) = run.checked.clone().unwrap_or((Verdict::Unknown, String::new()));
            (verdict.name().to_lowercase(), (verdict != Verdict::Valid).then_some(report))
        }
        None => {
            let report = kairos_check::check(&run.history, run.model).map_err(|e| {
                CliError::Runtime(format!("the simulator wrote a history the checker cannot read (a Kairos bug): {e}"))
            })?;
            let failure = (report.verdict != Verdict::Valid).then(|| report.to_string());
            (report.verdict.name().to_lowercase(), failure)
        }
    };
    // A TPC-C run's databases must hold TPC-C's conditions, and replicas at the same
    // progress the same rows, whatever the history checker said.
    let (safety, mut failure) = match run.database.as_ref().filter(|d| !d.holds()) {
        Some(d) if failure.is_none() => ("database".to_string(), Some(format!("TPC-C databases: {d:?}"))),
        _ => (safety, failure),
    };
    let mut stuck =
        if run.violation.is_some() { 0 } else { stuck_clients(&run.history, &run.clients, run.live_from, run.ended) };
    if stuck > 0 && failure.is_none() {
        failure = Some(format!("{stuck} clients got no answer to anything they asked after the faults were repaired"));
    }
    if let Some(why) = &run.stuck_why {
        stuck = stuck.max(1);
        failure.get_or_insert_with(|| why.clone());
    }
    Ok((safety, failure, stuck))
}

/// Clients that invoked something after `healed` and completed none of it `ok`. Only what
/// was asked early enough to be answered before the run's end counts: at least as long before
/// `ended` as the client's fastest `ok` operation of the whole run took (one asked later and
/// still pending is no sign of a stuck client: with a short recovery window, a far client's
/// only request after the repair may be one the end cut short). The fastest, not a typical
/// latency, so that operations slowed by the faults never excuse a client.
fn stuck_clients(history: &[HistoryRecord], clients: &[(u64, u64)], healed: SimTime, ended: SimTime) -> usize {
    // (Transactional coordinators are open-loop, many transactions in flight: nothing they
    // asked during the faults delays what they ask after.)
    let client_of = |p: u64| clients.iter().position(|(a, b)| (*a..*b).contains(&p));
    let mut fastest_ok = vec![u64::MAX; clients.len()];
    let mut started: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    for r in history {
        let Some(c) = client_of(r.event.process) else { continue };
        match r.event.op_type {
            OpType::Invoke => {
                started.insert(r.event.process, r.time);
            }
            done => {
                if let Some(t) = started.remove(&r.event.process).filter(|_| done == OpType::Ok) {
                    fastest_ok[c] = fastest_ok[c].min(r.time.saturating_sub(t));
                }
            }
        }
    }
    started.clear();
    let mut invoked_after = vec![false; clients.len()];
    let mut ok_after = vec![false; clients.len()];
    for r in history {
        let Some(c) = client_of(r.event.process) else { continue };
        match r.event.op_type {
            OpType::Invoke => {
                started.insert(r.event.process, r.time);
                let answerable = fastest_ok[c] == u64::MAX || r.time.saturating_add(fastest_ok[c]) <= ended.as_nanos();
                if r.time > healed.as_nanos() && answerable {
                    invoked_after[c] = true;
                }
            }
            done => {
                let after = started.remove(&r.event.process).is_some_and(|t| t > healed.as_nanos());
                if after && done == OpType::Ok {
                    ok_after[c] = true;
                }
            }
        }
    }
    invoked_after.iter().zip(&ok_after).filter(|(asked, answered)| **asked && !**answered).count()
}

pub fn run(protocol: CampaignProtocol, args: CampaignArgs) -> Result<(), CliError> {
    let seeds = parse_seeds(&args.seeds)?;
    // As `bench micro` refuses it: NaN or 0 would run no transaction and report success.
    super::micro::check_load("--load", args.load)?;
    let rates = rates(&args)?;
    let name = protocol.name();
    let transactional = !matches!(
        protocol,
        CampaignProtocol::Register
            | CampaignProtocol::Causal
            | CampaignProtocol::SwarmKv
            | CampaignProtocol::DmAbd
            | CampaignProtocol::Fusee
    );
    if args.workload == CampaignWorkload::Tpcc && !transactional {
        return Err(CliError::Usage(format!(
            "--workload tpcc: {name} is not transactional; TPC-C campaigns run tiga or one of its peers (e.g. kairos \
             sim tiga --workload tpcc)"
        )));
    }
    let loses_disks =
        matches!(protocol, CampaignProtocol::Register | CampaignProtocol::Tiga | CampaignProtocol::Causal);
    let no_recovery = match protocol {
        CampaignProtocol::CalvinPlus => Some("Calvin+ has no recovery"),
        CampaignProtocol::Detock => Some("Detock has no recovery (nor has the Tiga paper's code)"),
        CampaignProtocol::Janus => Some("Janus has no recovery (nor has its authors' code)"),
        CampaignProtocol::Ncc => Some("NCC has one server per shard and no fault tolerance"),
        _ => None,
    };
    let kinds: Vec<String> = if no_recovery.is_some() {
        without_crashes(rates.kinds).names()
    } else {
        rates.kinds.names().into_iter().filter(|k| loses_disks || k != "disk-loss").collect()
    };
    if let (true, Some(why)) = (kinds.is_empty(), no_recovery) {
        return Err(CliError::Usage(format!(
            "--faults: {why}, so its campaigns crash no node; name other kinds, e.g. --faults partition,loss,dup"
        )));
    }
    if kinds.is_empty() {
        return Err(CliError::Usage(format!(
            "--faults disk-loss: no {name} node loses its disk in these campaigns yet (only register replicas, \
             Tiga servers and causal replica-set members do); name other kinds, e.g. --faults crash,torn"
        )));
    }
    #[allow(clippy::disallowed_methods)] // wall time of the campaign, for the summary only
    let started = std::time::Instant::now();
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(["seed", "faults", "ok", "unknown", "safety", "stuck clients", "trace"]);
    let bar = progress::bar(seeds.len() as u64, name);
    let mut results = Vec::new();
    let mut events_total = 0u64;
    let workload = if args.workload == CampaignWorkload::Tpcc { " --workload tpcc" } else { "" };
    let corrupt = if args.corrupt > 0.0 { format!(" --corrupt {}", args.corrupt) } else { String::new() };
    let replay_of = |seed: u64| {
        format!(
            "kairos sim {name} --seeds {seed} --faults {} --load {} --fault-s {} --recovery-s {}{workload}{corrupt}",
            args.faults, args.load, args.fault_s, args.recovery_s
        )
    };
    for &seed in &seeds {
        bar.set_message(format!("seed {seed}"));
        let run = match catching_panics(|| run_seed(protocol, seed, &args, &rates)) {
            Ok(run) => run?,
            Err(panic) => {
                // What the run held went with the unwinding: the replay command is what is left.
                let path = args.failing_dir.join(format!("{name}-seed-{seed}.replay"));
                std::fs::create_dir_all(&args.failing_dir)
                    .map_err(|e| CliError::Io(format!("cannot create {}: {e}", args.failing_dir.display())))?;
                std::fs::write(&path, format!("{}\n# {}\n", replay_of(seed), panic.replace('\n', "\n# ")))
                    .map_err(|e| CliError::Io(format!("cannot write {}: {e}", path.display())))?;
                progress::say(&bar, format!("seed {seed} FAILED (panic): {panic}\n  replay: {}", replay_of(seed)));
                table.add_row([
                    seed.to_string(),
                    "?".into(),
                    "?".into(),
                    "?".into(),
                    "panic".into(),
                    "?".into(),
                    "".into(),
                ]);
                results.push(SeedResult {
                    seed,
                    faults: 0,
                    ok: 0,
                    unknown: 0,
                    safety: "panic".into(),
                    clients_stuck: 0,
                    events: 0,
                    torn_writes: 0,
                    trace_hash: String::new(),
                    view_changes: None,
                    view_change_paths: BTreeMap::new(),
                    tpcc_conditions_checked: None,
                    messages_corrupted: 0,
                    failure: Some(panic),
                });
                bar.inc(1);
                continue;
            }
        };
        events_total += run.events;
        let summary = crate::stats::summarize(&run.history, |_| None);
        let (safety, failure, stuck) = if args.corrupt > 0.0 {
            // A Byzantine sender: nothing but the absence of panics is judged.
            ("no panic".to_string(), None, 0)
        } else {
            judge(&run)?
        };
        let r = SeedResult {
            seed,
            faults: run.faults,
            ok: summary.ok as usize,
            unknown: summary.unknown as usize,
            safety,
            clients_stuck: stuck,
            events: run.events,
            torn_writes: run.torn_writes,
            trace_hash: format!("{:016x}", run.trace_hash),
            view_changes: run.view_changes,
            view_change_paths: run.view_change_paths.clone(),
            tpcc_conditions_checked: run.database.as_ref().map(|d| d.consistency.checked),
            messages_corrupted: run.corrupted,
            failure,
        };
        table.add_row([
            seed.to_string(),
            r.faults.to_string(),
            r.ok.to_string(),
            r.unknown.to_string(),
            r.safety.clone(),
            r.clients_stuck.to_string(),
            r.trace_hash.clone(),
        ]);
        if let Some(why) = &r.failure {
            let path = args.failing_dir.join(format!("{name}-seed-{seed}.jsonl"));
            crate::result::write_history(&path, run.saved_history.as_ref().unwrap_or(&run.history))?;
            let plan: Vec<String> =
                run.plan.iter().map(|f| format!("{} at {:.3} s", f.fault, f.at.as_nanos() as f64 / 1e9)).collect();
            let replay = replay_of(seed);
            std::fs::write(path.with_extension("replay"), format!("{replay}\n# fault plan: {}\n", plan.join("; ")))
                .map_err(|e| CliError::Io(format!("cannot write the replay file next to {}: {e}", path.display())))?;
            progress::say(
                &bar,
                format!("seed {seed} FAILED ({}): {why}\n  history: {}\n  replay: {replay}", r.safety, path.display()),
            );
        }
        if args.show_faults {
            for f in &run.plan {
                progress::say(&bar, format!("seed {seed}: {} {}", f.at, f.fault));
            }
        }
        results.push(r);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let wall_s = started.elapsed().as_secs_f64();
    let summary = CampaignSummary {
        protocol: name.to_string(),
        seeds_run: results.len(),
        violations: results
            .iter()
            .filter(|r| ["invalid", "invariant", "database", "panic"].contains(&r.safety.as_str()))
            .count(),
        unverified: results.iter().filter(|r| r.safety == "unknown").count(),
        liveness_failures: results.iter().filter(|r| r.clients_stuck > 0).count(),
        panics: results.iter().filter(|r| r.safety == "panic").count(),
        corrupt_share: args.corrupt,
        events_per_s: events_total as f64 / wall_s.max(1e-9),
        torn_writes: results.iter().map(|r| r.torn_writes).sum(),
        wall_s,
        fault_kinds: if matches!(protocol, CampaignProtocol::SwarmKv | CampaignProtocol::DmAbd) {
            ["memory-node crash", "client crash", "stalled chains", "paused client"].map(String::from).to_vec()
        } else if protocol == CampaignProtocol::Fusee {
            ["stalled chains", "paused client"].map(String::from).to_vec()
        } else {
            // Only the register's, Tiga's and the causal replica set's plans lose disks (`run_seed`).
            kinds
        },
        seeds: results,
    };
    if summary.seeds_run <= 200 || args.verbose {
        println!("{table}");
    }
    let speed = if events_total > 0 { format!("{:.0} events/s over ", summary.events_per_s) } else { String::new() };
    if args.corrupt > 0.0 {
        let corrupted: u64 = summary.seeds.iter().map(|r| r.messages_corrupted).sum();
        println!(
            "{name}: {} seeds ({}, and {} of the messages changed on the wire: {corrupted} delivered changed), {} \
             panics (histories and liveness not judged); {speed}{:.1} s",
            summary.seeds_run,
            summary.fault_kinds.join(","),
            args.corrupt,
            summary.panics,
            summary.wall_s
        );
    } else {
        println!(
            "{name}: {} seeds ({}), {} safety violations ({} panics), {} unverified, {} liveness failures; \
             {speed}{:.1} s",
            summary.seeds_run,
            summary.fault_kinds.join(","),
            summary.violations,
            summary.panics,
            summary.unverified,
            summary.liveness_failures,
            summary.wall_s
        );
    }
    if let Some(path) = &args.json {
        write_summary(path, &summary)?;
    }
    let failed: Vec<u64> = summary.seeds.iter().filter(|r| r.failure.is_some()).map(|r| r.seed).collect();
    if summary.violations > 0 || summary.liveness_failures > 0 {
        Err(CliError::Anomaly(format!(
            "{} of {} seeds failed: {failed:?}; histories and replay commands are in {}. Keep a fixed seed as a regression test.",
            failed.len(),
            summary.seeds_run,
            args.failing_dir.display()
        )))
    } else if summary.unverified > 0 {
        Err(CliError::Unknown(format!("{} seeds could not be decided by any checker: {failed:?}", summary.unverified)))
    } else {
        Ok(())
    }
}

fn write_summary(path: &Path, summary: &CampaignSummary) -> Result<(), CliError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| CliError::Io(format!("cannot create {}: {e}", dir.display())))?;
    }
    let text = serde_json::to_string_pretty(summary).map_err(|e| CliError::Runtime(e.to_string()))?;
    std::fs::write(path, text + "\n").map_err(|e| CliError::Io(format!("cannot write {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::{catching_panics, parse_seeds, stuck_clients};
    use kairos_core::history::{HistoryEvent, HistoryRecord, OpType};
    use kairos_core::SimTime;

    /// A request the run's end cut short is not a stuck client; one pending longer than the
    /// client's fastest answer is, and so is a client that never got an answer at all.
    #[test]
    fn a_client_is_stuck_only_by_what_it_asked_early_enough_to_be_answered() {
        let ms = 1_000_000;
        let record = |time_ms: u64, process: u64, op_type: OpType| HistoryRecord {
            index: 0,
            time: time_ms * ms,
            event: HistoryEvent::new(op_type, process, "read", Vec::new()),
        };
        // Process 0 answers in 600 ms (faults made one take 3 s), then asks again.
        let far = |last_ask_ms: u64| {
            vec![
                record(1_000, 0, OpType::Invoke),
                record(1_600, 0, OpType::Ok),
                record(2_000, 0, OpType::Invoke),
                record(5_000, 0, OpType::Ok),
                record(last_ask_ms, 0, OpType::Invoke),
            ]
        };
        let (healed, ended) = (SimTime::from_millis(8_000), SimTime::from_millis(9_000));
        // Asked 560 ms before the end, faster than it ever got an answer: not stuck.
        assert_eq!(stuck_clients(&far(8_440), &[(0, 1)], healed, ended), 0);
        // Asked 700 ms before the end (the slow 3 s answer excuses nothing): stuck.
        assert_eq!(stuck_clients(&far(8_300), &[(0, 1)], healed, ended), 1);
        // Asked before the repair only: nothing to judge.
        assert_eq!(stuck_clients(&far(7_900), &[(0, 1)], healed, ended), 0);
        // Never answered, asked after the repair: stuck however late it asked.
        let silent =
            vec![record(1_000, 0, OpType::Invoke), record(2_000, 0, OpType::Fail), record(8_900, 0, OpType::Invoke)];
        assert_eq!(stuck_clients(&silent, &[(0, 1)], healed, ended), 1);
        // Answered after the repair: live.
        let mut live = far(8_100);
        live.push(record(8_700, 0, OpType::Ok));
        assert_eq!(stuck_clients(&live, &[(0, 1)], healed, ended), 0);
    }

    #[test]
    fn a_panic_becomes_its_message_and_place() {
        assert_eq!(catching_panics(|| 7), Ok(7));
        let panic = catching_panics(|| -> u32 { panic!("role {} took a bad message", 3) }).unwrap_err();
        assert!(panic.contains("role 3 took a bad message") && panic.contains("campaign.rs"), "{panic}");
        // The hook is restored: a later panic is caught again, with its own message.
        let again = catching_panics(|| -> u32 { panic!("again") }).unwrap_err();
        assert!(again.contains("again") && !again.contains("role 3"), "{again}");
    }

    #[test]
    fn seed_ranges_parse_and_bad_ones_are_errors() {
        assert_eq!(parse_seeds("7").unwrap(), vec![7]);
        assert_eq!(parse_seeds("1..4").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_seeds("1..=3").unwrap(), vec![1, 2, 3]);
        for bad in ["", "a..b", "5..5", "1..x", "-1"] {
            assert!(parse_seeds(bad).is_err(), "{bad}");
        }
    }
}
