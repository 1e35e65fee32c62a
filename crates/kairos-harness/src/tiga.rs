//! Tiga's runner: the paper's deployment in the simulator ([`TxnDeployment`]: 3 shards × 3
//! replicas in sc / fi / br, co-located or separated leaders, coordinators in sc / fi / br /
//! hk, a clock per node), plus what only Tiga has: one view-manager node in each server
//! region, the timestamp-agreement mode, Tiga's knobs, a leader crash, and Tiga's analytic
//! latency.

use kairos_core::history::HistoryRecord;
use kairos_core::{LatencyMatrix, NodeId, SimTime};
use kairos_sim::{AloneCost, Sim, SimStats};
use kairos_tiga::coordinator::{Coordinator, CoordinatorStats};
use kairos_tiga::cow_map::CowMap;
use kairos_tiga::msg::{ShardId, TigaMsg, Ts, TxnId};
use kairos_tiga::ops::{Entry, StoreKey};
use kairos_tiga::server::Server;
use kairos_tiga::topology::{TigaConfig, Topology};
use kairos_tiga::view::{ModeRule, ServerState, View, ViewManager};

use crate::{DeployError, TxnDeployment};
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::time::Duration;

use crate::micro::{run_until_quiet, tpcc_outcome_of, ReplicaData, TpccBench, TpccOutcome};
use kairos_tiga::tpcc::TpccShard;
use kairos_workload::tpcc::{TpccSource, WarehouseDb};
use kairos_workload::{KindSample, Partitioner, Placement, TxnSource};

/// Which timestamp-agreement mode the leaders use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Preventive when the leaders are co-located (one region), detective otherwise — the
    /// view manager's choice in the paper.
    Auto,
    Preventive,
    Detective,
}

/// One MicroBench run of Tiga: the deployment every transaction protocol shares, and
/// Tiga's own knobs.
#[derive(Clone, Debug)]
pub struct Deployment {
    /// Regions, clocks, load and faults, as the peers get them ([`TxnDeployment`]).
    pub base: TxnDeployment,
    pub mode: Mode,
    pub config: TigaConfig,
    /// Crash a shard's leader during the run (the recovery experiment).
    pub kill_leader: Option<LeaderKill>,
    /// Run TPC-C instead of MicroBench (the keys placed by warehouse: the `Integer`
    /// partitioner).
    pub tpcc: Option<TpccBench>,
    /// Record shard 0's leader's inputs and, after the run, handle them again on a fresh
    /// instance with nothing else running ([`Sim::replay_alone`]): its CPU on a host of its
    /// own ([`RoleBusy::leader_alone`]). Keeps a copy of every message it received.
    pub replay_leader_alone: bool,
}

/// The recovery experiment's fault: the leader of `shard` in view 0 crashes at `at` (true time
/// since the start; coordinators keep going, nobody is told) and, with `restart_after`, comes
/// back that long after.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaderKill {
    pub at: Duration,
    pub shard: ShardId,
    pub restart_after: Option<Duration>,
}

impl Default for Deployment {
    fn default() -> Self {
        Deployment {
            base: TxnDeployment::default(),
            mode: Mode::Auto,
            config: TigaConfig::default(),
            kill_leader: None,
            tpcc: None,
            replay_leader_alone: false,
        }
    }
}

/// What a run produced.
pub struct Outcome {
    pub history: Vec<HistoryRecord>,
    pub trace_hash: u64,
    pub stats: SimStats,
    pub metrics: BTreeMap<&'static str, u64>,
    /// Region of each Jepsen process id range: (first process id, one past last, region).
    pub process_regions: Vec<(u64, u64, String)>,
    pub topology: Topology,
    /// Each coordinator's region and counters (fast / slow commits, revisions, …).
    pub coordinators: Vec<(String, CoordinatorStats)>,
    pub wall: Duration,
    /// The view the view manager reached (0: no view change), and its leaders.
    pub view: u64,
    pub leaders: Vec<u32>,
    /// Simulated CPU time spent, summed by role: the leaders of view 0, the other servers and
    /// the coordinators (with the measured-CPU model: the code's real speed).
    pub busy: RoleBusy,
    /// The simulated CPU time of the busiest server (the one that saturates first).
    pub busiest_server: Duration,
    /// The part of `busiest_server` charged for its messages (measured-CPU model).
    pub busiest_server_wire: Duration,
    /// TPC-C runs: the end-of-run checks of the servers' databases.
    pub tpcc: Option<TpccOutcome>,
    /// Every coordinator's finished transactions by type (TPC-C runs; empty otherwise).
    pub kinds: Vec<KindSample>,
}

/// Simulated CPU time by role (see [`Outcome::busy`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoleBusy {
    pub leaders: Duration,
    /// Pieces the leaders appended to their logs as final (one per shard a transaction
    /// touched): what `leaders` is spent on. `None` when a view change moved a leader (the
    /// roles are the first view's, so the figure would mix roles).
    pub leader_pieces: Option<u64>,
    /// The longest single handler of a first-view leader (a stall: everything queued behind
    /// it waits).
    pub leader_handler_max: Duration,
    pub followers: Duration,
    pub coordinators: Duration,
    /// The part of `coordinators` charged for their messages (measured-CPU model).
    pub coordinators_wire: Duration,
    /// [`Deployment::replay_leader_alone`]: shard 0's leader in the run and alone.
    pub leader_alone: Option<LeaderAlone>,
}

/// Shard 0's leader's CPU in the run and replayed alone ([`Deployment::replay_leader_alone`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaderAlone {
    /// Pieces it finalized.
    pub pieces: u64,
    /// Its handlers' CPU time in the run (without the measured model's per-message cost,
    /// which the replay does not charge).
    pub in_run: Duration,
    /// Its longest handler in the run (with that handler's messages' cost, if charged).
    pub in_run_handler_max: Duration,
    pub alone: AloneCost,
}

impl Outcome {
    /// Coordinator counters summed by region, in region order of first appearance.
    pub fn stats_by_region(&self) -> Vec<(String, CoordinatorStats)> {
        let mut out: Vec<(String, CoordinatorStats)> = Vec::new();
        for (region, s) in &self.coordinators {
            let i = match out.iter().position(|(r, _)| r == region) {
                Some(i) => i,
                None => {
                    out.push((region.clone(), CoordinatorStats::default()));
                    out.len() - 1
                }
            };
            out[i].1 += *s;
        }
        out
    }

    /// The region of the coordinator that ran Jepsen process `p`.
    pub fn region_of_process(&self, p: u64) -> Option<&str> {
        self.process_regions.iter().find(|(a, b, _)| (*a..*b).contains(&p)).map(|(_, _, r)| r.as_str())
    }
}

/// A built, not yet run, simulated deployment.
pub struct World {
    pub sim: Sim<TigaMsg>,
    pub topology: Topology,
    /// (first Jepsen process id, one past the last, region) of each coordinator.
    pub process_regions: Vec<(u64, u64, String)>,
    /// The view manager's nodes (one in each server region, after the coordinators).
    pub view_managers: Vec<NodeId>,
}

impl Deployment {
    /// This deployment with another offered load.
    pub fn at_load(&self, load_txn_per_s: f64) -> Deployment {
        let mut d = self.clone();
        d.base.load_txn_per_s = load_txn_per_s;
        d
    }

    /// Builds the simulated world (nothing has run yet).
    pub fn build(&self) -> Result<World, DeployError> {
        let mut tiga_config = self.config.clone();
        // TPC-C: every shard's replicas start from the shard's warehouses, populated once from
        // the seed, and the coordinators draw TPC-C's transactions.
        let mut warehouses = Vec::new();
        let mut terminal = None;
        if let Some(t) = &self.tpcc {
            t.scale.validate(self.base.shards).map_err(|e| DeployError::Shape(e.to_string()))?;
            t.mix.validate().map_err(|e| DeployError::Shape(e.to_string()))?;
            tiga_config.partitioner = Partitioner::Integer;
            let shards = self.base.shards;
            warehouses = (0..shards).map(|s| TpccShard::populate(&t.scale, self.base.seed, s, shards)).collect();
            terminal = Some(t.terminal(self.base.seed));
        }
        // MicroBench with the keys loaded: every shard's replicas start from its keys, placed
        // as the coordinators place them.
        let mut loaded = Vec::new();
        if self.base.preload && self.tpcc.is_none() {
            let shards = self.base.shards as usize;
            loaded = vec![CowMap::new(); shards];
            for k in self.base.micro_keys() {
                let key = k.to_string();
                let shard = tiga_config.partitioner.shard_of(key.as_bytes(), shards) as usize;
                loaded[shard].insert(StoreKey::new(key.as_bytes()), Entry::default());
            }
        }
        tiga_config.preventive = match self.mode {
            Mode::Preventive => true,
            Mode::Detective => false,
            Mode::Auto => self.base.placement == Placement::CoLocated || self.base.shards == 1,
        };
        let n = self.base.server_regions.len();
        let coordinators: u32 = self.base.coordinator_regions.iter().map(|(_, c)| c).sum();
        // The view manager's nodes come after the servers and coordinators.
        let first_vm = self.base.shards as usize * n + coordinators as usize;
        let view_managers: Vec<NodeId> = (0..n).map(|i| NodeId((first_vm + i) as u32)).collect();
        let (c, vms) = (tiga_config.clone(), view_managers.clone());
        let coordinator_config = tiga_config.clone();
        let (mut sim, topology, process_regions) = self.base.build_with(
            self.config.inflight_max as u64,
            // A restarted server is built the same way and recovers from what it made durable.
            move |t, s, r| {
                let mut server = Server::new(t.clone(), c.clone(), s, r).with_view_managers(vms.clone());
                if let Some(keys) = loaded.get(s as usize) {
                    server = server.with_loaded_keys(keys);
                }
                Box::new(match warehouses.get(s as usize) {
                    Some(w) => server.with_tpcc(w.clone()),
                    None => server,
                })
            },
            move |slot| {
                let source: Box<dyn TxnSource> = match &terminal {
                    Some(terminal) => Box::new(TpccSource { terminal: terminal.clone() }),
                    None => Box::new(slot.workload.clone()),
                };
                Box::new(
                    Coordinator::new(
                        slot.topology.clone(),
                        coordinator_config.clone(),
                        source,
                        slot.owd.clone(),
                        slot.process_base,
                    )
                    .with_replica_owd(slot.replica_owd.clone())
                    .with_open_loop(slot.load.clone()),
                )
            },
        )?;
        let matrix = LatencyMatrix::gcp();
        let regions: Vec<Vec<u32>> = (0..self.base.shards as usize)
            .map(|s| (0..n).map(|r| self.base.region_index(s, r) as u32).collect())
            .collect();
        let mode = match self.mode {
            Mode::Auto => ModeRule::ByPlacement,
            Mode::Preventive => ModeRule::Preventive,
            Mode::Detective => ModeRule::Detective,
        };
        let initial = View::initial(&topology, tiga_config.preventive);
        let mut clock_rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.base.seed ^ 0x766d);
        for (i, region) in self.base.server_regions.iter().enumerate() {
            let (t, regions, config, initial, members) =
                (topology.clone(), regions.clone(), tiga_config.clone(), initial.clone(), view_managers.clone());
            let id = sim.add_node(matrix.region(region)?, self.base.clock.sample(&mut clock_rng), move |_| {
                Box::new(ViewManager::new(
                    t.clone(),
                    regions.clone(),
                    config.clone(),
                    mode,
                    initial.clone(),
                    members.clone(),
                    i as u32,
                ))
            });
            debug_assert_eq!(id, view_managers[i]);
        }
        sim.add_world_check(64, executed_logs_agree(topology.clone()));
        Ok(World { sim, topology, process_regions, view_managers })
    }

    /// A TPC-C deployment's end-of-run checks of the servers' databases (each live replica's
    /// executed state); `None` for MicroBench. Also: a serving leader with nothing speculative
    /// left must hold in its live state exactly its executed state (what revocations undid is
    /// exactly what ran).
    pub fn tpcc_outcome(&self, sim: &Sim<TigaMsg>, topology: &Topology) -> Option<TpccOutcome> {
        self.tpcc.map(|t| {
            let live = |replicas: &Vec<NodeId>| -> Vec<(NodeId, &Server)> {
                let up = replicas.iter().filter(|n| sim.is_up(**n));
                up.filter_map(|n| sim.role::<Server>(*n).map(|s| (*n, s))).collect()
            };
            let shards: Vec<Vec<(NodeId, &Server)>> = topology.shards.iter().map(live).collect();
            let executed = shards.iter().map(|rs| rs.iter().map(|(n, s)| (*n, ExecutedState(s))).collect());
            let mut outcome = tpcc_outcome_of(&t.scale, executed.collect());
            for (shard, replicas) in shards.iter().enumerate() {
                for (node, s) in replicas {
                    let serving = s.is_leader() && s.view().1 == ServerState::Normal;
                    if serving && s.settled() && s.live_state() != s.executed_state() {
                        let why = format!("shard {shard}: leader {node}'s live rows differ from its executed ones");
                        outcome.replicas_differ.push(why);
                    }
                }
            }
            outcome
        })
    }

    /// Runs the load for `duration`, then lets in-flight transactions finish (up to the
    /// coordinators' give-up time), calling `progress(fraction)` along the way.
    pub fn run(&self, mut progress: impl FnMut(f64)) -> Result<Outcome, DeployError> {
        #[allow(clippy::disallowed_methods)] // wall time of the run, for the report only
        let started = std::time::Instant::now();
        let World { mut sim, topology, process_regions, view_managers } = self.build()?;
        if let Some(k) = &self.kill_leader {
            let shard = k.shard.min(topology.shard_count().saturating_sub(1) as ShardId);
            let victim = topology.leader_node(shard);
            sim.schedule(SimTime::ZERO + k.at, kairos_sim::Fault::Crash(victim));
            if let Some(after) = k.restart_after {
                sim.schedule(SimTime::ZERO + k.at + after, kairos_sim::Fault::Restart(victim));
            }
        }
        let drain = self.config.retry_timeout * self.config.max_sends + Duration::from_secs(1);
        let end = SimTime::ZERO + self.base.duration + drain;
        if self.replay_leader_alone {
            sim.record_inputs(topology.leader_node(0));
        }
        const SLICES: u32 = 100;
        for i in 1..=SLICES {
            sim.run_until(SimTime::from_nanos(end.as_nanos() / SLICES as u64 * i as u64));
            progress(i as f64 / SLICES as f64);
        }
        sim.run_until(end);
        if let Some(v) = sim.violation() {
            return Err(DeployError::Invariant(v.clone()));
        }
        let servers = topology.shard_count() * topology.replicas_per_shard();
        let coordinators = process_regions
            .iter()
            .enumerate()
            .map(|(i, (_, _, region))| {
                let stats =
                    sim.role::<Coordinator>(NodeId((servers + i) as u32)).map(|c| c.stats()).unwrap_or_default();
                (region.clone(), stats)
            })
            .collect();
        let last_view = view_managers
            .iter()
            .filter_map(|n| sim.role::<ViewManager>(*n))
            .map(|v| v.view().clone())
            .max_by_key(|v| v.number);
        let leaders = last_view.as_ref().map_or_else(|| topology.leader.clone(), |v| v.leaders.clone());
        let leaders_moved = leaders != topology.leader;
        let mut busy = RoleBusy { leader_pieces: (!leaders_moved).then_some(0), ..RoleBusy::default() };
        let mut busiest_server = (Duration::ZERO, Duration::ZERO);
        for (s, replicas) in topology.shards.iter().enumerate() {
            for (r, node) in replicas.iter().enumerate() {
                let leader = r as u32 == topology.leader[s];
                let role = if leader { &mut busy.leaders } else { &mut busy.followers };
                *role += sim.busy_time(*node);
                if leader {
                    busy.leader_handler_max = busy.leader_handler_max.max(sim.longest_handler(*node));
                }
                if let Some(pieces) = busy.leader_pieces.as_mut().filter(|_| leader) {
                    *pieces += sim.role::<Server>(*node).map_or(0, |s| s.stats().finalized);
                }
                busiest_server = busiest_server.max((sim.busy_time(*node), sim.wire_time(*node)));
            }
        }
        let (busiest_server, busiest_server_wire) = busiest_server;
        if self.replay_leader_alone && !leaders_moved {
            let leader = topology.leader_node(0);
            let pieces = sim.role::<Server>(leader).map_or(0, |s| s.stats().finalized);
            let in_run = sim.busy_time(leader).saturating_sub(sim.wire_time(leader));
            let in_run_handler_max = sim.longest_handler(leader);
            busy.leader_alone =
                sim.replay_alone(leader).map(|alone| LeaderAlone { pieces, in_run, in_run_handler_max, alone });
        }
        let coordinator_nodes = || (0..process_regions.len()).map(|i| NodeId((servers + i) as u32));
        busy.coordinators = coordinator_nodes().map(|n| sim.busy_time(n)).sum();
        busy.coordinators_wire = coordinator_nodes().map(|n| sim.wire_time(n)).sum();
        let kinds = (0..process_regions.len())
            .filter_map(|i| sim.role::<Coordinator>(NodeId((servers + i) as u32)))
            .flat_map(|c| c.kind_samples().iter().copied())
            .collect();
        let (trace_hash, stats, metrics) = (sim.trace_hash(), sim.stats().clone(), sim.metrics().clone());
        let history = sim.take_history();
        // The run is measured; its rows are read once nothing is in flight.
        let tpcc = if self.tpcc.is_some() {
            let quiescent = settle(&mut sim, &topology, process_regions.len(), drain);
            self.tpcc_outcome(&sim, &topology).map(|t| TpccOutcome { read_in_flight: !quiescent, ..t })
        } else {
            None
        };
        Ok(Outcome {
            tpcc,
            kinds,
            busy,
            busiest_server,
            busiest_server_wire,
            coordinators,
            trace_hash,
            stats,
            metrics,
            history,
            process_regions,
            topology,
            wall: started.elapsed(),
            view: last_view.as_ref().map_or(0, |v| v.number),
            leaders,
        })
    }
}

/// Runs `sim` (a Tiga world with `coordinators` coordinators) on, for at most `max`, until it
/// is quiescent: no coordinator has a transaction in flight and every
/// live server is [`Server::quiescent`]. Past saturation a run's end finds leaders that have
/// not yet executed what they logged, and multi-shard transactions executed on one shard and
/// not yet on another; the end-of-run checks across shards must not read the rows then.
/// Returns whether it became quiescent.
pub fn settle(sim: &mut Sim<TigaMsg>, topology: &Topology, coordinators: usize, max: Duration) -> bool {
    let servers = topology.shard_count() * topology.replicas_per_shard();
    let quiescent = |sim: &Sim<TigaMsg>| {
        let coordinators_done = (servers..servers + coordinators)
            .filter_map(|n| sim.role::<Coordinator>(NodeId(n as u32)))
            .all(|c| c.inflight() == 0);
        let servers_done = (0..servers)
            .map(|n| NodeId(n as u32))
            .filter(|n| sim.is_up(*n))
            .filter_map(|n| sim.role::<Server>(n))
            .all(Server::quiescent);
        coordinators_done && servers_done
    };
    run_until_quiet(sim, max, quiescent)
}

/// A Tiga replica's executed state, as the TPC-C checks compare it.
struct ExecutedState<'a>(&'a Server);

impl ReplicaData for ExecutedState<'_> {
    fn progress(&self) -> u64 {
        self.0.executed()
    }
    fn same_data(&self, other: &Self) -> bool {
        self.0.executed_state() == other.0.executed_state()
    }
    fn warehouses(&self) -> Vec<&WarehouseDb> {
        let tpcc = self.0.executed_state().tpcc.as_ref();
        tpcc.map(|t| t.warehouses.iter().map(|w| &**w).collect()).unwrap_or_default()
    }
    fn pieces_refused(&self) -> u64 {
        self.0.executed_state().tpcc.as_ref().map_or(0, |t| t.pieces_refused)
    }
}

/// The analytic commit latency of a coordinator in `region` for a transaction touching every
/// shard, with perfectly synchronized clocks and no queueing — what the median should approach
/// at moderate load (see the `kairos_tiga` crate docs for the formula), in view 0.
pub fn analytic_latency(d: &Deployment, region: &str) -> Result<Duration, DeployError> {
    analytic_latency_in(d, region, &vec![0; d.base.shards as usize], &[])
}

/// [`analytic_latency`] with `leaders[s]` leading shard `s` and the replicas `down` (shard,
/// replica) crashed: a shard with fewer live replicas than a super quorum commits on the slow
/// path only (after a leader crash, until the old leader rejoins).
pub fn analytic_latency_in(
    d: &Deployment,
    region: &str,
    leaders: &[u32],
    down: &[(ShardId, u32)],
) -> Result<Duration, DeployError> {
    let matrix = LatencyMatrix::gcp();
    let c = matrix.region(region)?;
    let regions: Vec<_> = d.base.server_regions.iter().map(|r| matrix.region(r)).collect::<Result<_, _>>()?;
    let n = regions.len();
    let f = (n - 1) / 2;
    let sq = (1 + f + f.div_ceil(2)).min(n);
    let owd = |a, b| matrix.one_way(a, b);
    let region_of = |s: usize, r: usize| regions[d.base.region_index(s, r)];
    let shards = d.base.shards as usize;
    let leader_of = |s: usize| leaders.get(s).map_or(0, |l| *l as usize);
    let live = |s: usize, r: usize| !down.contains(&(s as ShardId, r as u32));
    let kth = |mut v: Vec<Duration>, k: usize| {
        v.sort();
        v.get(k.max(1) - 1).copied()
    };
    // Headroom: the farthest member of the closest super quorum of each shard, + margin (the
    // coordinator keeps estimating a crashed replica from its initial bound).
    let headroom = (0..shards)
        .filter_map(|s| kth((0..n).map(|r| owd(c, region_of(s, r))).collect(), sq))
        .max()
        .unwrap_or_default()
        + d.config.margin;
    // Leaders of different shards agree on timestamps (half a round trip between them).
    let leader_regions: Vec<_> = (0..shards).map(|s| region_of(s, leader_of(s))).collect();
    let agreement = if shards > 1 {
        leader_regions.iter().flat_map(|a| leader_regions.iter().map(move |b| owd(*a, *b))).max().unwrap_or_default()
    } else {
        Duration::ZERO
    };
    // Slow: the leader's reply, and f followers' replies after agreement and log sync.
    let slow_of = |s: usize| {
        let leader = region_of(s, leader_of(s));
        let followers: Vec<Duration> = (0..n)
            .filter(|r| *r != leader_of(s) && live(s, *r))
            .map(|r| owd(leader, region_of(s, r)) + owd(region_of(s, r), c))
            .collect();
        kth(followers, f).map(|v| owd(leader, c).max(agreement + d.config.sync_interval / 2 + v))
    };
    let mut worst = Duration::ZERO;
    for s in 0..shards {
        let alive: Vec<usize> = (0..n).filter(|r| live(s, *r)).collect();
        // Fast: the super quorum's replies, all released at the timestamp.
        let fast = kth(alive.iter().map(|r| owd(region_of(s, *r), c)).collect(), sq).filter(|_| alive.len() >= sq);
        let best = match (fast, slow_of(s)) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(Duration::MAX / 4),
        };
        worst = worst.max(best);
    }
    let paper = headroom + worst;
    if !d.config.quorum_choice {
        return Ok(paper);
    }
    // The per-transaction quorum choice: the leaders' headroom, then the slow path everywhere.
    let slow_headroom =
        (0..shards).map(|s| owd(c, region_of(s, leader_of(s)))).max().unwrap_or_default() + d.config.margin;
    let slow_worst = (0..shards).map(|s| slow_of(s).unwrap_or(Duration::MAX / 4)).max().unwrap_or_default();
    Ok(paper.min(slow_headroom + slow_worst))
}

/// A world check: every replica of a shard executes the same transaction at the same
/// timestamp in each log position, across view changes (the first replica to execute a
/// position fixes it), and every shard a multi-shard transaction executes on executes it at
/// the same timestamp.
fn executed_logs_agree(topology: Topology) -> kairos_sim::WorldCheck<TigaMsg> {
    struct Seen {
        /// Per shard: the (transaction, timestamp) of each executed position (a replica that
        /// installed a checkpoint skips positions; another may fill them in later).
        positions: Vec<BTreeMap<u64, (TxnId, Ts)>>,
        /// Per server node: how far it was checked.
        checked: Vec<u64>,
        /// Multi-shard transactions: the timestamp the first shard executed them at.
        multi: BTreeMap<TxnId, Ts>,
    }
    let servers: usize = topology.shards.iter().map(Vec::len).sum();
    let seen = std::cell::RefCell::new(Seen {
        positions: vec![BTreeMap::new(); topology.shard_count()],
        checked: vec![0; servers],
        multi: BTreeMap::new(),
    });
    Box::new(move |sim: &Sim<TigaMsg>| {
        let mut seen = seen.borrow_mut();
        let seen = &mut *seen;
        for (s, replicas) in topology.shards.iter().enumerate() {
            for &node in replicas {
                let Some(server) = sim.role::<Server>(node) else { continue };
                let upto = server.executed().min(server.log().len());
                // A restarted replica executes again from 0.
                let from = seen.checked[node.index()].min(upto);
                for pos in from..upto {
                    // A position the replica truncated was checked before it was dropped.
                    let Some(e) = server.log().get(pos) else { continue };
                    let mine = (e.piece.txn, e.ts);
                    match seen.positions[s].get(&pos) {
                        Some(first) if *first != mine => {
                            return Err(format!(
                                "shard {s}: server {node} executed log position {pos} as {:?} at {}, another replica as {:?} at {}",
                                mine.0, mine.1, first.0, first.1
                            ));
                        }
                        Some(_) => {}
                        None => {
                            seen.positions[s].insert(pos, mine);
                            if e.piece.shards.len() > 1 {
                                if let Some(other) = seen.multi.insert(e.piece.txn, e.ts).filter(|t| *t != e.ts) {
                                    return Err(format!(
                                        "multi-shard {:?} executed at {} on shard {s} and at {other} on another shard",
                                        e.piece.txn, e.ts
                                    ));
                                }
                            }
                        }
                    }
                }
                seen.checked[node.index()] = upto;
            }
        }
        Ok(())
    })
}
