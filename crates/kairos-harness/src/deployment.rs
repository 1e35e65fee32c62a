//! The deployment every transaction protocol's simulated run shares ([`TxnDeployment`]):
//! the Tiga paper's regions, placement, clocks, MicroBench load and network faults. Tiga's
//! runner ([`crate::tiga::Deployment`]) and the protocol-neutral bench ([`crate::micro::Bench`])
//! each add their own knobs to it, so a peer runs on exactly Tiga's deployment without its
//! description repeating Tiga's.
//!
//! Node ids, regions and clocks: the servers of shard s are nodes s·n … s·n + n − 1 (replica 0
//! is the initial leader; co-located: every leader in the first server region; separated:
//! shard s's replica list rotated by s), then the coordinators region by region; every node's
//! clock is drawn from the preset in that order from the same seed. Each coordinator offers
//! `load / coordinators` transactions per second of open-loop Poisson arrivals for `duration`.

use std::time::Duration;

use kairos_clock::ClockPreset;
use kairos_core::history::{HistoryRecord, OpType};
use kairos_core::{LatencyMatrix, Message, NodeId};
use kairos_sim::{CpuModel, Role, Sim, SimConfig};
use kairos_workload::txn::ShardId;
use kairos_workload::{MicroBench, OpenLoop, Placement, Topology};
use rand::SeedableRng;

use crate::DeployError;

/// See the module docs. The defaults are the Tiga paper's deployment: 3 shards × 3 replicas
/// in sc / fi / br, 2 coordinators in each of sc / fi / br / hk, chrony clocks, skew 0.5.
#[derive(Clone, Debug)]
pub struct TxnDeployment {
    pub seed: u64,
    pub clock: ClockPreset,
    pub placement: Placement,
    pub shards: u32,
    pub server_regions: Vec<String>,
    /// Replicas of each shard, placed over `server_regions` by `placement`; `None`: one per
    /// server region. (`Some(1)`: an unreplicated deployment, each shard's one server where its
    /// leader would be.)
    pub replicas_per_shard: Option<usize>,
    /// (region, coordinators there).
    pub coordinator_regions: Vec<(String, u32)>,
    /// Total offered load over all coordinators, transactions per second.
    pub load_txn_per_s: f64,
    pub skew: f64,
    pub keys_per_shard: u64,
    /// Load every MicroBench key into every server's store before the run, as the Tiga paper's
    /// setup does, so that a run's handlers do not pay for tables growing as keys are first
    /// written (under the measured-CPU model, page faults and rehashing). A loaded key reads as
    /// a never-written one (Tiga: an entry with no value at version 0; the peers: 0 at version
    /// 0), so no run's outputs change. TPC-C runs load their warehouses either way.
    pub preload: bool,
    /// How long the coordinators generate load.
    pub duration: Duration,
    pub loss: f64,
    pub cpu: CpuModel,
}

impl Default for TxnDeployment {
    fn default() -> Self {
        TxnDeployment {
            seed: 1,
            clock: ClockPreset::Chrony,
            placement: Placement::CoLocated,
            shards: 3,
            server_regions: ["sc", "fi", "br"].map(String::from).to_vec(),
            replicas_per_shard: None,
            coordinator_regions: ["sc", "fi", "br", "hk"].map(|r| (r.to_string(), 2)).to_vec(),
            load_txn_per_s: 1_000.0,
            skew: 0.5,
            keys_per_shard: 1_000_000,
            preload: false,
            duration: Duration::from_secs(5),
            loss: 0.0,
            cpu: CpuModel::Fixed(Duration::from_micros(5)),
        }
    }
}

/// What a deployment gives one coordinator (see [`TxnDeployment::build_with`]).
#[derive(Clone, Debug)]
pub struct CoordinatorSlot {
    pub topology: Topology,
    /// One-way delay from the coordinator's region to each (shard, replica), from the matrix.
    pub owd: Vec<Vec<Duration>>,
    /// One-way delay between the replicas of each shard (`[shard][from][to]`), from the matrix.
    pub replica_owd: Vec<Vec<Vec<Duration>>>,
    /// The first of the coordinator's Jepsen process ids.
    pub process_base: u64,
    pub workload: MicroBench,
    pub load: OpenLoop,
}

impl TxnDeployment {
    /// Every MicroBench key, as the peers name them (`0..keys_per_shard × shards`; Tiga's key
    /// is the decimal form of the same number).
    pub fn micro_keys(&self) -> std::ops::Range<u64> {
        0..self.keys_per_shard.saturating_mul(u64::from(self.shards))
    }

    /// The MicroBench keys the peers place on `shard` ([`kairos_workload::shard_of`]).
    pub fn peer_keys_of(&self, shard: ShardId) -> impl Iterator<Item = u64> + Clone {
        let shards = self.shards as usize;
        self.micro_keys().filter(move |&k| kairos_workload::shard_of(k, shards) == shard)
    }

    /// The index (in `server_regions`) of the region of replica `replica` of shard `shard`.
    pub fn region_index(&self, shard: usize, replica: usize) -> usize {
        self.placement.region_index(shard, replica, self.server_regions.len().max(1))
    }

    /// Builds the servers and coordinators (see the module docs) with `server` and
    /// `coordinator` making each node's role, every coordinator owning
    /// `processes_per_coordinator` Jepsen process ids. Returns the simulator, the topology and
    /// each coordinator's (first process id, one past the last, region).
    #[allow(clippy::type_complexity)]
    pub fn build_with<M: Message>(
        &self,
        processes_per_coordinator: u64,
        server: impl FnMut(&Topology, ShardId, u32) -> Box<dyn Role<M>> + Clone + 'static,
        coordinator: impl FnMut(&CoordinatorSlot) -> Box<dyn Role<M>> + Clone + 'static,
    ) -> Result<(Sim<M>, Topology, Vec<(u64, u64, String)>), DeployError> {
        let matrix = LatencyMatrix::gcp();
        let n_regions = self.server_regions.len();
        let n = self.replicas_per_shard.unwrap_or(n_regions);
        let coordinators: u32 = self.coordinator_regions.iter().map(|(_, c)| c).sum();
        if self.shards == 0 || n_regions == 0 || n == 0 || coordinators == 0 {
            return Err(DeployError::Shape(
                "the deployment needs at least one shard, one server region, one replica per shard and one \
                 coordinator"
                    .into(),
            ));
        }
        let regions: Vec<_> = self.server_regions.iter().map(|r| matrix.region(r)).collect::<Result<_, _>>()?;
        let region_of = |shard: usize, replica: usize| regions[self.placement.region_index(shard, replica, n_regions)];
        let topology = Topology {
            shards: (0..self.shards as usize).map(|s| (0..n).map(|r| NodeId((s * n + r) as u32)).collect()).collect(),
            leader: vec![0; self.shards as usize],
        };
        let mut config = SimConfig::new(self.seed);
        config.cpu = self.cpu.clone();
        config.network.loss = self.loss;
        let mut sim = Sim::new(config, matrix.clone());
        let mut clock_rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed ^ 0x7469_6761);
        for s in 0..self.shards as usize {
            for r in 0..n {
                let (t, mut make) = (topology.clone(), server.clone());
                let id = sim.add_node(region_of(s, r), self.clock.sample(&mut clock_rng), move |_| {
                    make(&t, s as ShardId, r as u32)
                });
                debug_assert_eq!(id, topology.shards[s][r]);
            }
        }
        let rate = self.load_txn_per_s / coordinators as f64;
        let mut process_regions = Vec::new();
        for (region_name, count) in &self.coordinator_regions {
            let region = matrix.region(region_name)?;
            for _ in 0..*count {
                let index = (sim.node_count() - self.shards as usize * n) as u64;
                let process_base = index * processes_per_coordinator;
                process_regions.push((process_base, process_base + processes_per_coordinator, region_name.clone()));
                let slot = CoordinatorSlot {
                    topology: topology.clone(),
                    owd: (0..self.shards as usize)
                        .map(|s| (0..n).map(|r| matrix.one_way(region, region_of(s, r))).collect())
                        .collect(),
                    replica_owd: (0..self.shards as usize)
                        .map(|s| {
                            (0..n)
                                .map(|a| (0..n).map(|b| matrix.one_way(region_of(s, a), region_of(s, b))).collect())
                                .collect()
                        })
                        .collect(),
                    process_base,
                    workload: MicroBench::new(self.keys_per_shard, self.shards, self.skew)?,
                    load: OpenLoop { rate_per_s: rate, stop_after: Some(self.duration), max_txns: None },
                };
                let mut make = coordinator.clone();
                sim.add_node(region, self.clock.sample(&mut clock_rng), move |_| make(&slot));
            }
        }
        Ok((sim, topology, process_regions))
    }
}

/// Commits completed in `[duration/3, duration]` of virtual time, per second, for a run whose
/// load lasted `duration`: the window skips the start (no commits before one wide-area round
/// trip) and the drain after the load. Every bench's throughput is this.
pub fn window_throughput(history: &[HistoryRecord], duration: Duration) -> f64 {
    let (from, to) = (duration.as_nanos() as u64 / 3, duration.as_nanos() as u64);
    let commits = history.iter().filter(|r| r.event.op_type == OpType::Ok && (from..=to).contains(&r.time)).count();
    commits as f64 / ((to - from) as f64 / 1e9)
}
