//! The register's deployment in the simulator: replicas in sc / fi / br, clients in every
//! region of the GCP world (used by `kairos demo`, `kairos bench register` and `kairos sim`).

use crate::DeployError;
use kairos_clock::ClockPreset;
use kairos_core::history::HistoryRecord;
use kairos_core::{LatencyMatrix, NodeId, SimTime};
use kairos_register::{majority, Client, ClientConfig, RegisterMsg, Replica, Tag};
use kairos_sim::{fault, CpuModel, FaultRates, ScheduledFault, Sim, SimConfig, SimStats, WorldCheck};
use rand::SeedableRng;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// One simulated run of the register.
#[derive(Clone, Debug)]
pub struct RegisterRun {
    pub seed: u64,
    pub clock: ClockPreset,
    pub replica_regions: Vec<String>,
    pub client_regions: Vec<String>,
    pub clients_per_region: u32,
    pub keys: u64,
    pub write_ratio: f64,
    pub duration: Duration,
    /// Random faults over the first 80 % of the run (the rest lets clients show progress).
    pub faults: Option<FaultRates>,
    pub loss: f64,
    pub cpu: CpuModel,
}

impl Default for RegisterRun {
    fn default() -> Self {
        RegisterRun {
            seed: 1,
            clock: ClockPreset::Chrony,
            replica_regions: ["sc", "fi", "br"].map(String::from).to_vec(),
            client_regions: ["sc", "fi", "br", "hk"].map(String::from).to_vec(),
            clients_per_region: 2,
            keys: 8,
            write_ratio: 0.5,
            duration: Duration::from_secs(20),
            faults: None,
            loss: 0.0,
            cpu: CpuModel::Fixed(Duration::from_micros(20)),
        }
    }
}

/// What a run produced.
pub struct RegisterOutcome {
    pub history: Vec<HistoryRecord>,
    pub trace_hash: u64,
    pub stats: SimStats,
    pub metrics: BTreeMap<&'static str, u64>,
    /// Region name of each Jepsen process (client) id.
    pub process_region: Vec<String>,
    pub fault_plan: Vec<ScheduledFault>,
    pub wall: Duration,
}

/// A built, not yet run, register deployment.
pub struct RegisterWorld {
    pub sim: Sim<RegisterMsg>,
    /// The replicas, nodes `0..replica_regions.len()`.
    pub replicas: Vec<NodeId>,
    /// Region name of each Jepsen process (client) id; client `i` is process `i`.
    pub process_region: Vec<String>,
    /// The random faults [`RegisterRun::faults`] drew, already scheduled.
    pub fault_plan: Vec<ScheduledFault>,
}

impl RegisterRun {
    /// Builds the world and schedules the run's random faults (nothing has run yet).
    pub fn build(&self) -> Result<RegisterWorld, DeployError> {
        let matrix = LatencyMatrix::gcp();
        let mut config = SimConfig::new(self.seed);
        config.cpu = self.cpu.clone();
        config.network.loss = self.loss;
        let mut sim: Sim<RegisterMsg> = Sim::new(config, matrix.clone());
        let mut clock_rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed ^ 0xc10c);
        let replicas: Vec<NodeId> = (0..self.replica_regions.len() as u32).map(NodeId).collect();
        if replicas.is_empty() {
            return Err(DeployError::Shape("the register needs at least one replica region".into()));
        }
        for region in &self.replica_regions {
            let r = matrix.region(region)?;
            let rs = replicas.clone();
            sim.add_node(r, self.clock.sample(&mut clock_rng), move |me| Box::new(Replica::new(me, &rs)));
        }
        let mut process_region = Vec::new();
        for region in &self.client_regions {
            let r = matrix.region(region)?;
            for _ in 0..self.clients_per_region {
                let mut cc = ClientConfig::new(replicas.clone(), process_region.len() as u64);
                cc.keys = self.keys;
                cc.write_ratio = self.write_ratio;
                process_region.push(region.clone());
                sim.add_node(r, self.clock.sample(&mut clock_rng), move |_| Box::new(Client::new(cc.clone())));
            }
        }
        let fault_plan = match &self.faults {
            Some(rates) => {
                let fault_end = SimTime::ZERO + self.duration.mul_f64(0.8);
                fault::random_plan(self.seed, &replicas, SimTime::from_millis(500), fault_end, rates)
            }
            None => Vec::new(),
        };
        sim.schedule_all(fault_plan.clone());
        let clients = (replicas.len()..replicas.len() + process_region.len()).map(|n| NodeId(n as u32)).collect();
        sim.add_world_check(16, acknowledged_tags_held_by_a_majority(replicas.clone(), clients));
        Ok(RegisterWorld { sim, replicas, process_region, fault_plan })
    }

    /// Runs the deployment; `progress(fraction)` is called as virtual time advances.
    pub fn run(&self, mut progress: impl FnMut(f64)) -> Result<RegisterOutcome, DeployError> {
        #[allow(clippy::disallowed_methods)] // wall time of the run, for the report only
        let started = Instant::now();
        let RegisterWorld { mut sim, process_region, fault_plan, .. } = self.build()?;
        let end = SimTime::ZERO + self.duration;
        const SLICES: u32 = 100;
        for i in 1..=SLICES {
            sim.run_until(SimTime::ZERO + self.duration.mul_f64(i as f64 / SLICES as f64));
            progress(i as f64 / SLICES as f64);
        }
        if let Some(v) = sim.violation() {
            return Err(DeployError::Invariant(v.clone()));
        }
        debug_assert_eq!(sim.now(), end);
        Ok(RegisterOutcome {
            trace_hash: sim.trace_hash(),
            stats: sim.stats().clone(),
            metrics: sim.metrics().clone(),
            history: sim.take_history(),
            process_region,
            fault_plan,
            wall: started.elapsed(),
        })
    }
}

/// The register's cross-replica invariant, as a simulator world check: for every key, the
/// newest tag an operation completed `ok` with (seen through [`Client::last_ok`]) is held, or
/// outdone, by a majority of the replicas — counting a replica that is down (its disk keeps
/// what it acknowledged) or still recovering (it answers nothing until it has adopted a
/// majority's state) as holding it. A replica that comes back without its disk and serves at
/// once breaks it at the event it restarts, long before a stale read shows in the history.
pub fn acknowledged_tags_held_by_a_majority(replicas: Vec<NodeId>, clients: Vec<NodeId>) -> WorldCheck<RegisterMsg> {
    let acknowledged: RefCell<BTreeMap<u64, Tag>> = RefCell::new(BTreeMap::new());
    Box::new(move |sim: &Sim<RegisterMsg>| {
        let mut acknowledged = acknowledged.borrow_mut();
        for (key, tag) in clients.iter().filter_map(|&c| sim.role::<Client>(c).and_then(Client::last_ok)) {
            let newest = acknowledged.entry(key).or_default();
            *newest = (*newest).max(tag);
        }
        for (&key, &tag) in acknowledged.iter() {
            let holding = replicas
                .iter()
                .filter(|&&r| sim.role::<Replica>(r).is_none_or(|rep| !rep.is_recovered() || rep.get(key).tag >= tag))
                .count();
            if holding < majority(replicas.len()) {
                return Err(format!(
                    "key {key}: an operation completed with tag {tag:?}, but only {holding} of {} replicas hold it \
                     or a newer one",
                    replicas.len()
                ));
            }
        }
        Ok(())
    })
}
