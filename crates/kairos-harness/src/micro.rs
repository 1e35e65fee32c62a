//! The protocol-neutral transactional deployment: one description ([`Bench`]) that runs Tiga or
//! any peer on the identical workload (MicroBench, or TPC-C with [`Bench::tpcc`]), placement,
//! clock draws and seed, and one outcome ([`RunOutcome`]) for all of them.
//!
//! The deployment is Tiga's ([`TxnDeployment`]: node ids, regions and clocks assigned
//! alike for every protocol from the same seed); the run drains for [`Bench::drain`] after
//! the load stops. A TPC-C run ends with checks of the servers' databases ([`TpccOutcome`]).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use kairos_core::history::HistoryRecord;
use kairos_core::{Message, NodeId, SimTime};
use kairos_sim::{Sim, SimStats, WorldCheck};
use kairos_txn::calvin::{CalvinMsg, CalvinPlus};
use kairos_txn::detock::Detock;
use kairos_txn::janus::{Janus, JanusMsg};
use kairos_txn::ncc::NccPaxos;
use kairos_txn::occ::OccPaxos;
use kairos_txn::peer::Peer;
use kairos_txn::shell::{KindSample, ShellConfig, TxnShell, TxnStats};
use kairos_txn::store::Store;
use kairos_txn::tapir::{Tapir, TapirMsg};
use kairos_txn::tpl::TwoPlPaxos;
use kairos_txn::twopc::TxnMsg;
use kairos_workload::tpcc::{
    consistency, ConsistencyReport, DeliveryScope, TpccMix, TpccScale, TpccSource, TpccTerminal, WarehouseDb,
};
use kairos_workload::{Topology, TxnSource};
use rand::SeedableRng;

use crate::tapir_agreement::decisions_agree;
use crate::tiga::Deployment as TigaDeployment;
use crate::twopc_agreement::applied_slots_agree;
use crate::{DeployError, TxnDeployment};

/// The protocols the harness can run.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tiga,
    TwoPlPaxos,
    OccPaxos,
    Tapir,
    Janus,
    CalvinPlus,
    Detock,
    /// NCC as the Tiga paper ran it: NCC+'s code with one server per shard, where the shard's
    /// leader would be ([`Bench::unreplicated`]; no fault tolerance).
    Ncc,
    NccPaxos,
    /// 2PL+Paxos in its native interactive form ([`TpccBench::interactive`]).
    TwoPlPaxosInteractive,
    /// OCC+Paxos in its native interactive form ([`TpccBench::interactive`]).
    OccPaxosInteractive,
    /// Tapir in its native interactive form ([`TpccBench::interactive`]).
    TapirInteractive,
}

impl Protocol {
    pub const ALL: [Protocol; 9] = [
        Protocol::Tiga,
        Protocol::TwoPlPaxos,
        Protocol::OccPaxos,
        Protocol::Tapir,
        Protocol::Janus,
        Protocol::CalvinPlus,
        Protocol::Detock,
        Protocol::Ncc,
        Protocol::NccPaxos,
    ];

    /// 2PL+Paxos, OCC+Paxos and Tapir run interactively, as those protocols natively run a
    /// transaction ([`TpccBench::interactive`]): on TPC-C besides their one-shot form, where
    /// the two differ; on MicroBench they would be the same runs.
    pub const INTERACTIVE: [Protocol; 3] =
        [Protocol::TwoPlPaxosInteractive, Protocol::OccPaxosInteractive, Protocol::TapirInteractive];

    /// The protocols a comparison runs by default: every one, and on TPC-C the interactive
    /// forms besides.
    pub fn all(tpcc: bool) -> Vec<Protocol> {
        let interactive: &[Protocol] = if tpcc { &Protocol::INTERACTIVE } else { &[] };
        Protocol::ALL.iter().chain(interactive).copied().collect()
    }

    /// The name on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tiga => "tiga",
            Protocol::TwoPlPaxos => "2pl-paxos",
            Protocol::OccPaxos => "occ-paxos",
            Protocol::Tapir => "tapir",
            Protocol::Janus => "janus",
            Protocol::CalvinPlus => "calvin+",
            Protocol::Detock => "detock",
            Protocol::Ncc => "ncc",
            Protocol::NccPaxos => "ncc+",
            Protocol::TwoPlPaxosInteractive => "2pl-paxos-interactive",
            Protocol::OccPaxosInteractive => "occ-paxos-interactive",
            Protocol::TapirInteractive => "tapir-interactive",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A protocol name that is not one of [`Protocol::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown protocol {0:?}; the protocols are {names}", names = Protocol::all(true).into_iter().map(Protocol::name).collect::<Vec<_>>().join(", "))]
pub struct UnknownProtocol(pub String);

impl FromStr for Protocol {
    type Err = UnknownProtocol;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase();
        Protocol::all(true).into_iter().find(|p| p.name() == s).ok_or(UnknownProtocol(s))
    }
}

/// One MicroBench run, protocol-neutral (see the module docs).
#[derive(Clone, Debug)]
pub struct Bench {
    /// Regions, clocks, load and faults: Tiga's deployment ([`TxnDeployment`]).
    pub base: TxnDeployment,
    /// How long the run continues after the load stops, so in-flight transactions finish.
    pub drain: Duration,
    /// Admission and retry policy of the peers' coordinators.
    pub shell: ShellConfig,
    /// Run TPC-C instead of MicroBench (`base.skew` and `base.keys_per_shard` then play no
    /// part).
    pub tpcc: Option<TpccBench>,
}

/// The TPC-C database and mix of a [`Bench`] run. Warehouse `w` lives on shard `w mod
/// shards`, so the shards must divide the warehouses (the paper: one warehouse per shard).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TpccBench {
    pub scale: TpccScale,
    pub mix: TpccMix,
    pub delivery: DeliveryScope,
    /// Run the peers interactively: a by-name payment or order-status looks its customer up
    /// where its piece runs, on the customers key its execution read (2PL's execute round at
    /// the leader, under that key's lock; OCC's, whose version the prepare validates; Tapir's
    /// commit at every replica, on the version its execute round read from the closest
    /// replica and the prepare validated), instead of in a pre-read round trip of its own
    /// before it starts (`kairos_workload::tpcc::pre_read`, the one-shot form every protocol
    /// runs by default). TPC-C never changes a name, so the lookup finds the customer a
    /// pre-read would. Tiga has no interactive form (ignored).
    pub interactive: bool,
}

impl TpccBench {
    /// The terminal every coordinator of a run with `seed` draws from: all draw TPC-C's NURand
    /// constants alike, from the seed.
    pub fn terminal(&self, seed: u64) -> TpccTerminal {
        let mut terminal =
            TpccTerminal::new(self.scale, self.mix, &mut kairos_core::Rng::seed_from_u64(seed ^ 0x7470_6363));
        terminal.delivery = self.delivery;
        terminal
    }
}

/// What the end of a TPC-C run found in the servers' databases.
#[derive(Clone, Debug, Default)]
pub struct TpccOutcome {
    /// TPC-C's consistency conditions over the most advanced live replica of each shard.
    pub consistency: ConsistencyReport,
    /// Live replicas that applied as many writes as their shard's most advanced one but hold
    /// other data, described.
    pub replicas_differ: Vec<String>,
    /// Live replicas that had not applied everything their shard's most advanced one had (a
    /// Paxos follower learns the last commits lazily).
    pub replicas_behind: u64,
    /// Pieces the servers refused as bad input (none from Kairos's own coordinators).
    pub pieces_refused: u64,
    /// New orders placed and payments made over the run (rows beyond the populated ones, on
    /// the most advanced replica of each shard): a run that committed its transactions without
    /// running their pieces would leave these at 0.
    pub orders_placed: u64,
    pub payments_made: u64,
    /// The rows were read with transactions still in flight: the world had not settled
    /// ([`settle`]; Tiga's: [`crate::tiga::settle`]) within the drain's length after the
    /// drain. A condition across
    /// shards may then fail on a transaction applied on one shard and not yet on another, so
    /// a bench reports such a failure without judging the run by it.
    pub read_in_flight: bool,
}

impl TpccOutcome {
    /// The conditions hold, every live replica of a shard holds the same rows, and no piece
    /// was refused.
    pub fn holds(&self) -> bool {
        self.consistency.holds() && self.replicas_differ.is_empty() && self.pieces_refused == 0
    }
}

impl Default for Bench {
    fn default() -> Self {
        let tiga = kairos_tiga::TigaConfig::default();
        Bench {
            base: TxnDeployment::default(),
            // Tiga's own drain (its coordinators' give-up time + 1 s), so both drain alike.
            drain: tiga.retry_timeout * tiga.max_sends + Duration::from_secs(1),
            shell: ShellConfig::default(),
            tpcc: None,
        }
    }
}

/// What a run produced, the same for every protocol.
pub struct RunOutcome {
    pub protocol: Protocol,
    pub history: Vec<HistoryRecord>,
    pub trace_hash: u64,
    pub stats: SimStats,
    pub metrics: BTreeMap<&'static str, u64>,
    /// (first Jepsen process id, one past the last, region) of each coordinator.
    pub process_regions: Vec<(u64, u64, String)>,
    /// Each coordinator's region and counters.
    pub coordinators: Vec<(String, TxnStats)>,
    /// The simulated CPU time of the busiest server (the one that saturates first).
    pub busiest_server: Duration,
    /// The part of `busiest_server` charged for its messages (measured-CPU model).
    pub busiest_server_wire: Duration,
    /// The simulated CPU time of all coordinators together, and the part of it charged for
    /// their messages.
    pub coordinators_busy: Duration,
    pub coordinators_wire: Duration,
    pub wall: Duration,
    /// TPC-C runs: the end-of-run checks of the servers' databases.
    pub tpcc: Option<TpccOutcome>,
    /// Every coordinator's finished transactions by type (TPC-C runs; empty otherwise).
    pub kinds: Vec<KindSample>,
}

impl RunOutcome {
    /// Coordinator counters summed by region, in region order of first appearance.
    pub fn stats_by_region(&self) -> Vec<(String, TxnStats)> {
        let mut out: Vec<(String, TxnStats)> = Vec::new();
        for (region, s) in &self.coordinators {
            match out.iter_mut().find(|(r, _)| r == region) {
                Some((_, acc)) => *acc += *s,
                None => out.push((region.clone(), *s)),
            }
        }
        out
    }

    /// All coordinators' counters summed.
    pub fn totals(&self) -> TxnStats {
        let mut t = TxnStats::default();
        for (_, s) in &self.coordinators {
            t += *s;
        }
        t
    }

    /// Median commit latency (invocation → ok, true time) of the coordinators in `region`, ms;
    /// NaN if none committed.
    pub fn median_latency_ms(&self, region: &str) -> f64 {
        let mut open = BTreeMap::new();
        let mut latencies_ms = Vec::new();
        for r in self.history.iter().filter(|r| self.region_of_process(r.event.process) == Some(region)) {
            match r.event.op_type {
                kairos_core::OpType::Invoke => {
                    open.insert(r.event.process, r.time);
                }
                kairos_core::OpType::Ok => {
                    if let Some(t) = open.remove(&r.event.process) {
                        latencies_ms.push(r.time.saturating_sub(t) as f64 / 1e6);
                    }
                }
                _ => {}
            }
        }
        latencies_ms.sort_by(f64::total_cmp);
        latencies_ms.get(latencies_ms.len() / 2).copied().unwrap_or(f64::NAN)
    }

    /// The region of the coordinator that ran Jepsen process `p`.
    pub fn region_of_process(&self, p: u64) -> Option<&str> {
        self.process_regions.iter().find(|(a, b, _)| (*a..*b).contains(&p)).map(|(_, _, r)| r.as_str())
    }
}

/// A peer of Tiga's, as [`Bench`] runs it: its [`Peer`] roles under the [`Protocol`] name
/// that results carry, and the properties over all its nodes checked as the run goes.
pub trait PeerProtocol: Peer {
    const PROTOCOL: Protocol;
    /// Properties over all the protocol's nodes (e.g. replicas agree on what they applied),
    /// checked as the run goes ([`Sim::add_world_check`]: every `u64` events).
    fn world_checks(topology: &Topology) -> Vec<(u64, WorldCheck<Self::Msg>)> {
        let _ = topology;
        Vec::new()
    }
}

impl PeerProtocol for TwoPlPaxos {
    const PROTOCOL: Protocol = Protocol::TwoPlPaxos;
    fn world_checks(topology: &Topology) -> Vec<(u64, WorldCheck<TxnMsg>)> {
        vec![(64, applied_slots_agree(topology.clone()))]
    }
}

impl PeerProtocol for OccPaxos {
    const PROTOCOL: Protocol = Protocol::OccPaxos;
    fn world_checks(topology: &Topology) -> Vec<(u64, WorldCheck<TxnMsg>)> {
        vec![(64, applied_slots_agree(topology.clone()))]
    }
}

impl PeerProtocol for NccPaxos {
    const PROTOCOL: Protocol = Protocol::NccPaxos;
    fn world_checks(topology: &Topology) -> Vec<(u64, WorldCheck<TxnMsg>)> {
        vec![(64, applied_slots_agree(topology.clone()))]
    }
}

impl PeerProtocol for CalvinPlus {
    const PROTOCOL: Protocol = Protocol::CalvinPlus;
    fn world_checks(topology: &Topology) -> Vec<(u64, WorldCheck<CalvinMsg>)> {
        vec![(64, crate::calvin_agreement::executions_agree(topology.clone()))]
    }
}

/// Detock has one executor per shard (its home), so there is no agreement between replicas
/// to check as the run goes: the history checker judges its order.
impl PeerProtocol for Detock {
    const PROTOCOL: Protocol = Protocol::Detock;
}

impl PeerProtocol for Janus {
    const PROTOCOL: Protocol = Protocol::Janus;
    fn world_checks(topology: &Topology) -> Vec<(u64, WorldCheck<JanusMsg>)> {
        // Every 256 events: the check looks at each replica's last `RECENT_WRITES` writes.
        vec![(256, crate::janus_agreement::key_orders_agree(topology.clone()))]
    }
}

impl PeerProtocol for Tapir {
    const PROTOCOL: Protocol = Protocol::Tapir;
    fn world_checks(topology: &Topology) -> Vec<(u64, WorldCheck<TapirMsg>)> {
        vec![(64, decisions_agree(topology.clone()))]
    }
}

/// A built, not yet run, peer deployment (tests may schedule faults before running it).
pub struct PeerWorld<M: Message> {
    pub sim: Sim<M>,
    pub topology: Topology,
    pub process_regions: Vec<(u64, u64, String)>,
}

impl Bench {
    /// This bench with another offered load.
    pub fn at_load(&self, load_txn_per_s: f64) -> Bench {
        let mut bench = self.clone();
        bench.base.load_txn_per_s = load_txn_per_s;
        bench
    }

    /// The same run as Tiga's deployment (Tiga's own knobs at their defaults).
    pub fn tiga(&self) -> TigaDeployment {
        let t = TigaDeployment::default();
        TigaDeployment {
            base: self.base.clone(),
            tpcc: self.tpcc,
            // The same admission of open-loop arrivals as the peers' shells.
            config: kairos_tiga::TigaConfig { admission_control: self.shell.admission_control, ..t.config },
            ..t
        }
    }

    /// Builds the simulated world of peer `P` (nothing has run yet), node for node and clock
    /// for clock as Tiga's deployment builds Tiga's.
    pub fn build<P: PeerProtocol>(&self, config: &P::Config) -> Result<PeerWorld<P::Msg>, DeployError> {
        let (c, s) = (config.clone(), config.clone());
        let shell = self.shell.clone();
        let tpcc = self.tpcc;
        if let Some(t) = &tpcc {
            t.scale.validate(self.base.shards).map_err(|e| DeployError::Shape(e.to_string()))?;
            t.mix.validate().map_err(|e| DeployError::Shape(e.to_string()))?;
        }
        let (seed, shards) = (self.base.seed, self.base.shards);
        let terminal = tpcc.map(|t| t.terminal(seed));
        // MicroBench with the keys loaded: each shard's keys, placed as the coordinators place
        // them, copied into every replica's store.
        let loaded: Vec<Store> = if self.base.preload && tpcc.is_none() {
            (0..shards).map(|s| Store::loaded(self.base.peer_keys_of(s))).collect()
        } else {
            Vec::new()
        };
        let (sim, topology, process_regions) = self.base.build_with(
            self.shell.inflight_max as u64,
            // A restarted server is built the same way and recovers from what it made durable.
            move |t, shard, replica| {
                let mut server = P::server(t, &s, shard, replica);
                if let (Some(tpcc), Some(store)) = (&tpcc, P::store_mut(&mut server)) {
                    *store = Store::tpcc(&tpcc.scale, seed, shard, shards);
                }
                if let (Some(keys), Some(store)) = (loaded.get(shard as usize), P::store_mut(&mut server)) {
                    *store = keys.clone();
                }
                Box::new(server)
            },
            // A restarted coordinator recovers its shell's incarnation (fresh Jepsen processes).
            move |slot| {
                let source: Box<dyn TxnSource> = match &terminal {
                    Some(terminal) => Box::new(TpccSource { terminal: terminal.clone() }),
                    None => Box::new(slot.workload.clone()),
                };
                let t = &slot.topology;
                let leader_first = |(s, rs): (usize, &Vec<NodeId>)| {
                    let mut rs = rs.clone();
                    let leader = t.leader.get(s).map_or(0, |&l| l as usize).min(rs.len());
                    rs.rotate_left(leader);
                    rs
                };
                let pre_reads = tpcc.is_some_and(|t| !t.interactive);
                let pre_read_replicas =
                    if pre_reads { t.shards.iter().enumerate().map(leader_first).collect() } else { Vec::new() };
                let config = ShellConfig { shard_count: t.shard_count(), pre_read_replicas, ..shell.clone() };
                let shell = TxnShell::new(source, slot.load.clone(), config, slot.process_base);
                Box::new(P::coordinator(&slot.topology, &c, shell))
            },
        )?;
        let mut sim = sim;
        for (every, check) in P::world_checks(&topology) {
            sim.add_world_check(every, check);
        }
        Ok(PeerWorld { sim, topology, process_regions })
    }

    /// Runs peer `P` for `duration` + `drain`, calling `progress(fraction)` along the way.
    pub fn run_peer<P: PeerProtocol>(
        &self,
        config: &P::Config,
        progress: impl FnMut(f64),
    ) -> Result<RunOutcome, DeployError> {
        #[allow(clippy::disallowed_methods)] // wall time of the run, for the report only
        let started = std::time::Instant::now();
        let PeerWorld { mut sim, topology, process_regions } = self.build::<P>(config)?;
        run_sliced(&mut sim, SimTime::ZERO + self.base.duration + self.drain, progress);
        if let Some(v) = sim.violation() {
            return Err(DeployError::Invariant(v.clone()));
        }
        let servers = topology.shard_count() * topology.replicas_per_shard();
        let (busiest_server, busiest_server_wire) = (0..servers)
            .map(|n| (sim.busy_time(NodeId(n as u32)), sim.wire_time(NodeId(n as u32))))
            .max()
            .unwrap_or_default();
        let coordinator_nodes = || (0..process_regions.len()).map(|i| NodeId((servers + i) as u32));
        let coordinators_busy = coordinator_nodes().map(|n| sim.busy_time(n)).sum();
        let coordinators_wire = coordinator_nodes().map(|n| sim.wire_time(n)).sum();
        let coordinators = process_regions
            .iter()
            .enumerate()
            .map(|(i, (_, _, region))| {
                let node = NodeId((servers + i) as u32);
                (region.clone(), sim.role::<P::Coordinator>(node).map(P::coordinator_stats).unwrap_or_default())
            })
            .collect();
        let kinds = (0..process_regions.len())
            .filter_map(|i| sim.role::<P::Coordinator>(NodeId((servers + i) as u32)))
            .flat_map(|c| P::shell(c).kind_samples().iter().copied())
            .collect();
        let (history, trace_hash) = (sim.take_history(), sim.trace_hash());
        let (stats, metrics) = (sim.stats().clone(), sim.metrics().clone());
        // The run is measured; its rows are read once the transactions in flight finished.
        let tpcc = self.tpcc.map(|t| {
            let settled = settle::<P>(&mut sim, &topology, process_regions.len(), self.drain);
            TpccOutcome { read_in_flight: !settled, ..tpcc_outcome::<P>(&sim, &topology, &t.scale) }
        });
        Ok(RunOutcome {
            protocol: P::PROTOCOL,
            history,
            trace_hash,
            stats,
            metrics,
            process_regions,
            coordinators,
            busiest_server,
            busiest_server_wire,
            coordinators_busy,
            coordinators_wire,
            wall: started.elapsed(),
            tpcc,
            kinds,
        })
    }

    /// A TPC-C bench's end-of-run checks of a world built by [`Bench::build`] (a test that
    /// schedules faults runs the world itself); `None` for MicroBench.
    pub fn tpcc_outcome<P: PeerProtocol>(&self, world: &PeerWorld<P::Msg>) -> Option<TpccOutcome> {
        self.tpcc.map(|t| tpcc_outcome::<P>(&world.sim, &world.topology, &t.scale))
    }

    /// Runs `protocol` (its default knobs) on this bench.
    pub fn run(&self, protocol: Protocol, progress: impl FnMut(f64)) -> Result<RunOutcome, DeployError> {
        match protocol {
            Protocol::Tiga => self.run_tiga(progress),
            Protocol::TwoPlPaxos => self.run_peer::<TwoPlPaxos>(&Default::default(), progress),
            Protocol::OccPaxos => self.run_peer::<OccPaxos>(&Default::default(), progress),
            Protocol::Tapir => self.run_peer::<Tapir>(&Default::default(), progress),
            Protocol::Janus => self.run_peer::<Janus>(&Default::default(), progress),
            Protocol::CalvinPlus => self.run_peer::<CalvinPlus>(&Default::default(), progress),
            Protocol::Detock => self.run_peer::<Detock>(&Default::default(), progress),
            Protocol::Ncc => {
                let mut outcome = self.unreplicated().run_peer::<NccPaxos>(&Default::default(), progress)?;
                outcome.protocol = Protocol::Ncc;
                Ok(outcome)
            }
            Protocol::NccPaxos => self.run_peer::<NccPaxos>(&Default::default(), progress),
            Protocol::TwoPlPaxosInteractive | Protocol::OccPaxosInteractive | Protocol::TapirInteractive => {
                let mut bench = self.clone();
                if let Some(t) = bench.tpcc.as_mut() {
                    t.interactive = true;
                }
                let mut outcome = match protocol {
                    Protocol::TwoPlPaxosInteractive => bench.run_peer::<TwoPlPaxos>(&Default::default(), progress),
                    Protocol::OccPaxosInteractive => bench.run_peer::<OccPaxos>(&Default::default(), progress),
                    _ => bench.run_peer::<Tapir>(&Default::default(), progress),
                }?;
                outcome.protocol = protocol;
                Ok(outcome)
            }
        }
    }

    /// This bench with one server per shard, where the shard's leader would be (co-located:
    /// all in the first server region; separated: rotated over the regions): how the Tiga paper
    /// ran NCC, which has no fault tolerance.
    pub fn unreplicated(&self) -> Bench {
        let mut bench = self.clone();
        bench.base.replicas_per_shard = Some(1);
        bench
    }

    /// Runs Tiga on this bench through its own deployment.
    pub fn run_tiga(&self, progress: impl FnMut(f64)) -> Result<RunOutcome, DeployError> {
        let o = self.tiga().run(progress)?;
        let coordinators = o
            .coordinators
            .iter()
            .map(|(region, s)| {
                // Tiga never aborts: every transaction it finished was one attempt. (Those
                // still in flight at the end are in neither count; the history has them.)
                let finished = s.committed + s.info;
                let stats = TxnStats {
                    invoked: finished,
                    committed: s.committed,
                    attempts: finished,
                    aborted_attempts: 0,
                    failed: 0,
                    unknown: s.info,
                    admission_dropped: s.admission_dropped,
                    committed_fast: s.committed_fast,
                };
                (region.clone(), stats)
            })
            .collect();
        Ok(RunOutcome {
            protocol: Protocol::Tiga,
            history: o.history,
            trace_hash: o.trace_hash,
            stats: o.stats,
            metrics: o.metrics,
            process_regions: o.process_regions,
            coordinators,
            busiest_server: o.busiest_server,
            busiest_server_wire: o.busiest_server_wire,
            coordinators_busy: o.busy.coordinators,
            coordinators_wire: o.busy.coordinators_wire,
            wall: o.wall,
            tpcc: o.tpcc,
            kinds: o.kinds,
        })
    }
}

/// The end-of-run checks of a TPC-C run's databases (see [`TpccOutcome`]).
fn tpcc_outcome<P: PeerProtocol>(sim: &Sim<P::Msg>, topology: &Topology, scale: &TpccScale) -> TpccOutcome {
    let shards = topology.shards.iter().map(|replicas| {
        replicas
            .iter()
            .filter(|n| sim.is_up(**n))
            .filter_map(|n| sim.role::<P::Server>(*n).and_then(P::store).map(|s| (*n, s)))
            .collect()
    });
    tpcc_outcome_of(scale, shards.collect())
}

/// Runs `sim` (a world of peer `P` built by [`Bench::build`], with `coordinators`
/// coordinators) on, in steps of 100 ms and for at most `max`, until every live coordinator has
/// settled ([`Peer::coordinator_settled`]): end-of-run checks that read the servers' rows
/// directly must not read them while a decided transaction is applied on one shard and not yet
/// on another. Returns whether they settled.
pub fn settle<P: PeerProtocol>(sim: &mut Sim<P::Msg>, topology: &Topology, coordinators: usize, max: Duration) -> bool {
    let servers = topology.shard_count() * topology.replicas_per_shard();
    let settled = |sim: &Sim<P::Msg>| {
        (servers..servers + coordinators)
            .filter_map(|n| sim.role::<P::Coordinator>(NodeId(n as u32)))
            .all(P::coordinator_settled)
    };
    run_until_quiet(sim, max, settled)
}

/// Runs `sim` on in steps of 100 ms, for at most `max`, until `quiet` holds; returns whether
/// it did (the end-of-run settling of the peers' worlds and of Tiga's).
pub(crate) fn run_until_quiet<M: Message>(sim: &mut Sim<M>, max: Duration, quiet: impl Fn(&Sim<M>) -> bool) -> bool {
    let until = sim.now() + max;
    while !quiet(sim) {
        if sim.now() >= until {
            return false;
        }
        sim.run_until((sim.now() + Duration::from_millis(100)).min(until));
    }
    true
}

/// Attempts still in doubt at the end of a run ([`Peer::in_doubt`]), summed over the shards:
/// on each shard, those of the live replica that applied the most of its log (a follower that
/// has not learned the last decisions yet would count attempts that are decided).
pub fn in_doubt<P: PeerProtocol>(world: &PeerWorld<P::Msg>) -> usize {
    let sim = &world.sim;
    world
        .topology
        .shards
        .iter()
        .filter_map(|replicas| {
            replicas
                .iter()
                .filter(|n| sim.is_up(**n))
                .filter_map(|n| sim.role::<P::Server>(*n))
                .max_by_key(|s| P::applied(s))
                .map(P::in_doubt)
        })
        .sum()
}

/// One replica's TPC-C data, as the end-of-run checks compare it.
pub(crate) trait ReplicaData {
    /// How far it applied its shard's order (of two replicas, the one that applied more).
    fn progress(&self) -> u64;
    /// Whether it holds the same data as `other` (replicas at the same progress must).
    fn same_data(&self, other: &Self) -> bool;
    fn warehouses(&self) -> Vec<&WarehouseDb>;
    fn pieces_refused(&self) -> u64;
}

impl ReplicaData for &Store {
    fn progress(&self) -> u64 {
        self.writes_applied()
    }
    fn same_data(&self, other: &Self) -> bool {
        Store::same_data(self, other)
    }
    fn warehouses(&self) -> Vec<&WarehouseDb> {
        Store::warehouses(self).iter().collect()
    }
    fn pieces_refused(&self) -> u64 {
        Store::pieces_refused(self)
    }
}

/// [`TpccOutcome`] of the live replicas of each shard (`shards[s]`: node and data).
pub(crate) fn tpcc_outcome_of<D: ReplicaData>(scale: &TpccScale, shards: Vec<Vec<(NodeId, D)>>) -> TpccOutcome {
    let mut outcome = TpccOutcome::default();
    let mut one_per_shard: Vec<&WarehouseDb> = Vec::new();
    for (shard, stores) in shards.iter().enumerate() {
        outcome.pieces_refused += stores.iter().map(|(_, s)| s.pieces_refused()).sum::<u64>();
        // The replica that applied the most; a follower may not have learned the last commits
        // yet, so only replicas that applied as much are compared with it.
        let Some((most_node, most)) = stores.iter().max_by_key(|(n, s)| (s.progress(), std::cmp::Reverse(*n))) else {
            continue;
        };
        for (node, store) in stores {
            if node == most_node {
                continue;
            }
            if store.progress() < most.progress() {
                outcome.replicas_behind += 1;
                continue;
            }
            if !store.same_data(most) {
                outcome
                    .replicas_differ
                    .push(format!("shard {shard}: {node} applied as many writes as {most_node} but holds other data"));
            }
        }
        one_per_shard.extend(most.warehouses());
    }
    one_per_shard.sort_by_key(|db| db.w);
    for dist in one_per_shard.iter().flat_map(|db| &db.districts) {
        outcome.orders_placed += u64::from(dist.next_order.saturating_sub(1 + scale.initial_orders_per_district));
        outcome.payments_made += (dist.history.len() as u64).saturating_sub(scale.customers_per_district.into());
    }
    outcome.consistency = consistency::check(scale, &one_per_shard);
    outcome
}

/// Runs `sim` to `end` in 100 slices, reporting progress after each.
fn run_sliced<M: Message>(sim: &mut Sim<M>, end: SimTime, mut progress: impl FnMut(f64)) {
    const SLICES: u64 = 100;
    for i in 1..=SLICES {
        sim.run_until(SimTime::from_nanos(end.as_nanos() / SLICES * i));
        progress(i as f64 / SLICES as f64);
    }
    sim.run_until(end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_names_round_trip_and_unknown_names_are_explained() {
        for p in Protocol::ALL {
            assert_eq!(p.name().parse::<Protocol>(), Ok(p));
        }
        assert_eq!(" TAPIR ".parse::<Protocol>(), Ok(Protocol::Tapir));
        let e = "slog".parse::<Protocol>().unwrap_err().to_string();
        assert!(e.contains("slog") && e.contains("2pl-paxos") && e.contains("detock"), "{e}");
    }

    /// A loaded key reads as a never-written one, so loading the keys first changes no run:
    /// the same history and the same messages, for every protocol (fixed CPU cost per handler).
    #[test]
    fn loading_the_keys_first_changes_no_run() {
        let base = TxnDeployment {
            load_txn_per_s: 300.0,
            duration: Duration::from_secs(1),
            keys_per_shard: 1_000,
            ..Default::default()
        };
        for p in Protocol::ALL {
            let empty = Bench { base: base.clone(), ..Bench::default() }.run(p, |_| {}).unwrap();
            let loaded = Bench { base: TxnDeployment { preload: true, ..base.clone() }, ..Bench::default() };
            let loaded = loaded.run(p, |_| {}).unwrap();
            assert!(empty.totals().committed > 150, "{p}: {:?}", empty.totals());
            assert!(empty.history == loaded.history, "{p}: the histories differ");
            assert_eq!(empty.trace_hash, loaded.trace_hash, "{p}");
        }
    }

    /// Every replica starts with exactly its shard's keys, as the coordinators place them.
    #[test]
    fn every_replica_starts_with_its_shards_keys() {
        let base = TxnDeployment { keys_per_shard: 1_000, preload: true, ..Default::default() };
        let bench = Bench { base: base.clone(), ..Bench::default() };
        let world = bench.build::<TwoPlPaxos>(&Default::default()).unwrap();
        let shards = world.topology.shards.len();
        for (s, replicas) in world.topology.shards.iter().enumerate() {
            for n in replicas {
                let store =
                    world.sim.role::<kairos_txn::twopc::server::TxnServer>(*n).and_then(TwoPlPaxos::store).unwrap();
                let mine = base.peer_keys_of(s as kairos_workload::ShardId);
                assert_eq!(store.len(), mine.clone().count());
                assert!(mine.into_iter().all(|k| store.get(k) == Default::default()));
            }
        }
        let tiga = bench.tiga().build().unwrap();
        let mut total = 0;
        for (s, replicas) in tiga.topology.shards.iter().enumerate() {
            let stores: Vec<_> =
                replicas.iter().map(|n| tiga.sim.role::<kairos_tiga::server::Server>(*n).unwrap()).collect();
            let keys = &stores[0].live_state().keys;
            for server in &stores {
                assert!(
                    server.live_state() == stores[0].live_state() && server.executed_state() == stores[0].live_state()
                );
            }
            for (key, entry) in keys.iter() {
                assert_eq!(kairos_workload::Partitioner::Hash.shard_of(key, shards) as usize, s);
                assert_eq!(*entry, kairos_tiga::ops::Entry::default());
            }
            total += keys.len();
        }
        assert_eq!(total as u64, base.micro_keys().end);
    }

    #[test]
    fn tiga_runs_through_the_neutral_outcome() {
        let base = TxnDeployment {
            load_txn_per_s: 200.0,
            duration: Duration::from_secs(1),
            keys_per_shard: 1_000,
            ..Default::default()
        };
        let bench = Bench { base, ..Bench::default() };
        let o = bench.run_tiga(|_| {}).unwrap();
        let t = o.totals();
        assert!(t.committed > 100, "{t:?}");
        assert_eq!(t.commit_rate(), 1.0);
        assert_eq!(o.stats_by_region().len(), 4);
        assert_eq!(o.region_of_process(o.process_regions[0].0), Some("sc"));
    }
}
