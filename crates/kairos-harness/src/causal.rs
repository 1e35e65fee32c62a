//! The paper's replica set in the simulator: 3 or 5 members in GCP regions, N session clients.
//!
//! [`Deployment::run`] builds the world, runs the sessions for `duration` plus a drain, and
//! returns the history (for `kairos_check::check(.., Model::Causal)`), metrics, latency
//! percentiles per operation type, throughput and the HMAC count.

use crate::oplog_agreement::committed_entries_agree;
use crate::DeployError;
use kairos_causal::member::{Member, MemberConfig};
use kairos_causal::msg::{CausalMsg, ReadConcern, WriteConcern};
use kairos_causal::session::{ReadPref, Session, SessionConfig, SessionStats, SessionWorkload};
use kairos_causal::tpcc::TpccConfig;
use kairos_clock::ClockPreset;
use kairos_core::history::HistoryRecord;
use kairos_core::{LatencyMatrix, NodeId, SimTime};
use kairos_sim::{CpuModel, FaultRates, ScheduledFault, Sim, SimConfig, SimStats};
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How replies are signed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Signing {
    /// One HMAC per 65,536-time range, with a one-entry cache (MongoDB).
    Range,
    /// One HMAC per reply (for measurement).
    PerReply,
}

/// Which faults a run injects (on members only).
#[derive(Clone, Debug, PartialEq)]
pub enum Faults {
    None,
    Scripted(Vec<ScheduledFault>),
    /// [`kairos_sim::fault::random_plan`] over `[start, duration − quiet)` with these rates.
    Random {
        rates: FaultRates,
        start: Duration,
        quiet: Duration,
    },
}

/// What the sessions run.
#[derive(Copy, Clone, Debug, PartialEq, Default)]
pub enum WorkloadKind {
    /// Uniform reads and unique appends over `keys` keys, `read_fraction` reads.
    #[default]
    ListAppend,
    /// The TPC-C-derived session workload ([`kairos_causal::tpcc`]); `read_fraction` and `keys` are
    /// ignored. Session `i`'s kind is [`TpccConfig::session_kind`]`(i)`, its home warehouse
    /// `i % warehouses`.
    Tpcc(TpccConfig),
}

/// One simulated run.
#[derive(Clone, Debug)]
pub struct Deployment {
    pub seed: u64,
    /// One region per member (GCP matrix names: sc, fi, br, hk).
    pub member_regions: Vec<String>,
    /// Regions of the sessions, cycled.
    pub session_regions: Vec<String>,
    pub sessions: usize,
    pub write_concern: WriteConcern,
    pub read_concern: ReadConcern,
    pub read_pref: ReadPref,
    pub causal: bool,
    pub signing: Signing,
    pub trusted_clients: bool,
    pub read_fraction: f64,
    pub keys: u64,
    /// Sessions run for this long (after `warmup`).
    pub duration: Duration,
    /// Before the first operation: the first election and the first keys.
    pub warmup: Duration,
    pub think_time: Duration,
    pub faults: Faults,
    pub cpu: CpuModel,
    pub clock: ClockPreset,
    /// Member settings (`members` is filled in by `build`).
    pub member: MemberConfig,
    /// What the sessions run (default: the list-append workload).
    pub workload: WorkloadKind,
}

impl Default for Deployment {
    fn default() -> Self {
        Deployment {
            seed: 1,
            member_regions: ["sc", "fi", "br"].map(String::from).to_vec(),
            session_regions: ["sc", "fi", "br", "hk"].map(String::from).to_vec(),
            sessions: 4,
            write_concern: WriteConcern::Majority,
            read_concern: ReadConcern::Majority,
            read_pref: ReadPref::Nearest,
            causal: true,
            signing: Signing::Range,
            trusted_clients: false,
            read_fraction: 0.5,
            keys: 4,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(5),
            think_time: Duration::from_millis(10),
            faults: Faults::None,
            cpu: CpuModel::Free,
            clock: ClockPreset::Chrony,
            member: MemberConfig::new(Vec::new()),
            workload: WorkloadKind::ListAppend,
        }
    }
}

impl Deployment {
    /// `n` members (3 or 5) in sc, fi, br, hk, sc.
    pub fn with_members(mut self, n: usize) -> Self {
        self.member_regions = ["sc", "fi", "br", "hk", "sc"].iter().cycle().take(n).map(|s| s.to_string()).collect();
        self
    }
}

/// A built, not yet run, world.
pub struct World {
    pub sim: Sim<CausalMsg>,
    pub members: Vec<NodeId>,
    pub sessions: Vec<NodeId>,
}

/// Latency percentiles in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Percentiles {
    pub fn of(samples_ns: &[u64]) -> Percentiles {
        if samples_ns.is_empty() {
            return Percentiles::default();
        }
        let mut v = samples_ns.to_vec();
        v.sort_unstable();
        let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1] as f64 / 1e6;
        Percentiles { p50: at(0.5), p90: at(0.9), p99: at(0.99) }
    }
}

/// What a run produced.
pub struct Outcome {
    pub history: Vec<HistoryRecord>,
    pub metrics: BTreeMap<&'static str, u64>,
    pub stats: SimStats,
    pub trace_hash: u64,
    /// Every session's counters, summed.
    pub sessions: SessionStats,
    pub read_latency_ms: Percentiles,
    pub write_latency_ms: Percentiles,
    pub all_latency_ms: Percentiles,
    /// Ok operations per second of `duration`.
    pub throughput_ops_per_s: f64,
    pub reads_per_s: f64,
    /// HMAC-SHA1 computations over all members (signing and validation).
    pub hmac_computations: u64,
    /// Replies sent to clients.
    pub replies: u64,
    /// Summed simulated CPU time of the members (non-zero only with a CPU model).
    pub member_busy: Duration,
    pub wall: Duration,
}

impl Outcome {
    /// HMAC computations per million replies.
    pub fn hmac_per_million_replies(&self) -> f64 {
        if self.replies == 0 {
            0.0
        } else {
            self.hmac_computations as f64 * 1e6 / self.replies as f64
        }
    }
}

impl Deployment {
    /// Builds the world (nothing has run yet).
    pub fn build(&self) -> Result<World, DeployError> {
        let matrix = LatencyMatrix::gcp();
        let n = self.member_regions.len();
        if n == 0 || n > 50 || self.sessions == 0 || self.session_regions.is_empty() {
            return Err(DeployError::Shape(format!(
                "a replica set needs 1 to 50 members and at least one session, got {n} members and {} sessions",
                self.sessions
            )));
        }
        let regions: Vec<_> = self.member_regions.iter().map(|r| matrix.region(r)).collect::<Result<_, _>>()?;
        let session_regions: Vec<_> =
            self.session_regions.iter().map(|r| matrix.region(r)).collect::<Result<_, _>>()?;
        let members: Vec<NodeId> = (0..n as u32).map(NodeId).collect();
        let mut mc = self.member.clone();
        mc.members = members.clone();
        mc.trusted_clients = self.trusted_clients;
        mc.per_reply_signing = self.signing == Signing::PerReply;
        let mc = Arc::new(mc);
        let mut config = SimConfig::new(self.seed);
        config.cpu = self.cpu.clone();
        let mut sim = Sim::new(config, matrix.clone());
        let mut clock_rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed ^ 0x6361_7573);
        for (i, &r) in regions.iter().enumerate() {
            let cfg = mc.clone();
            sim.add_node(r, self.clock.sample(&mut clock_rng), move |_| Box::new(Member::new(cfg.clone(), i as u32)));
        }
        let mut sessions = Vec::new();
        for s in 0..self.sessions {
            let region = session_regions[s % session_regions.len()];
            let mut nearest = members.clone();
            nearest.sort_by_key(|m| (matrix.one_way(region, regions[m.index()]), *m));
            let mut sc = SessionConfig::new(s as u64, members.clone());
            sc.nearest = nearest;
            sc.read_pref = self.read_pref;
            sc.read_concern = self.read_concern;
            sc.write_concern = self.write_concern;
            sc.causal = self.causal;
            sc.read_fraction = self.read_fraction;
            sc.keys = self.keys;
            sc.think_time = self.think_time;
            sc.start_after = self.warmup;
            sc.stop_after = self.duration;
            if let WorkloadKind::Tpcc(cfg) = self.workload {
                let home = s as u64 % cfg.warehouses.max(1);
                sc.workload = SessionWorkload::Tpcc { cfg, kind: cfg.session_kind(s), home };
            }
            let id =
                sim.add_node(region, self.clock.sample(&mut clock_rng), move |_| Box::new(Session::new(sc.clone())));
            sessions.push(id);
        }
        // Raft's safety from outside: committed entries agree and stay on a majority. After
        // every event, so that a member that crashes is counted with exactly what it held.
        sim.add_world_check(1, committed_entries_agree(members.clone(), mc.majority()));
        match &self.faults {
            Faults::None => {}
            Faults::Scripted(plan) => sim.schedule_all(plan.iter().cloned()),
            Faults::Random { rates, start, quiet } => {
                let end = SimTime::ZERO + self.warmup + self.duration.saturating_sub(*quiet);
                let plan = kairos_sim::fault::random_plan(self.seed, &members, SimTime::ZERO + *start, end, rates);
                sim.schedule_all(plan);
            }
        }
        Ok(World { sim, members, sessions })
    }

    /// Runs the sessions for `warmup + duration`, then a drain of one operation timeout.
    pub fn run(&self) -> Result<Outcome, DeployError> {
        #[allow(clippy::disallowed_methods)] // wall time of the run, for the report only
        let started = std::time::Instant::now();
        let World { mut sim, members, sessions } = self.build()?;
        let drain = Duration::from_secs(5);
        sim.run_until(SimTime::ZERO + self.warmup + self.duration + drain);
        if let Some(v) = sim.violation() {
            return Err(DeployError::Invariant(v.clone()));
        }
        Ok(collect(&mut sim, &members, &sessions, self.duration, started.elapsed()))
    }
}

/// Every append a session saw acknowledged (`ok`), as (key, value): what a member that claims
/// to hold the committed oplog must be able to read.
pub fn acknowledged_appends(history: &[HistoryRecord]) -> Vec<(u64, u64)> {
    history
        .iter()
        .filter(|r| r.event.op_type == kairos_core::OpType::Ok)
        .filter_map(|r| match r.event.value.first() {
            Some(&kairos_core::MicroOp::Append { key, value }) => Some((key, value)),
            _ => None,
        })
        .collect()
}

/// Gathers an [`Outcome`] from a run world.
pub fn collect(
    sim: &mut Sim<CausalMsg>,
    members: &[NodeId],
    sessions: &[NodeId],
    duration: Duration,
    wall: Duration,
) -> Outcome {
    let mut total = SessionStats::default();
    for &s in sessions {
        if let Some(st) = sim.role::<Session>(s).map(|s| s.stats()) {
            total.reads_ok += st.reads_ok;
            total.reads_failed += st.reads_failed;
            total.writes_ok += st.writes_ok;
            total.writes_failed += st.writes_failed;
            total.writes_unknown += st.writes_unknown;
            total.timeouts += st.timeouts;
            total.dummy_signatures += st.dummy_signatures;
            total.replies_without_cluster_time += st.replies_without_cluster_time;
            total.ok_in_second_half += st.ok_in_second_half;
            total.reads_from_secondary += st.reads_from_secondary;
            total.own_write_reads_from_secondary += st.own_write_reads_from_secondary;
            total.txns_abandoned += st.txns_abandoned;
            total.writes_resent_in_new_term += st.writes_resent_in_new_term;
            for (t, k) in &st.txns {
                *total.txns.entry(t).or_default() += k;
            }
            for (c, k) in &st.errors {
                *total.errors.entry(*c).or_default() += k;
            }
            total.read_latency_ns.extend_from_slice(&st.read_latency_ns);
            total.write_latency_ns.extend_from_slice(&st.write_latency_ns);
        }
    }
    let all: Vec<u64> = total.read_latency_ns.iter().chain(&total.write_latency_ns).copied().collect();
    let secs = duration.as_secs_f64().max(1e-9);
    let metrics = sim.metrics().clone();
    Outcome {
        read_latency_ms: Percentiles::of(&total.read_latency_ns),
        write_latency_ms: Percentiles::of(&total.write_latency_ns),
        all_latency_ms: Percentiles::of(&all),
        throughput_ops_per_s: (total.reads_ok + total.writes_ok) as f64 / secs,
        reads_per_s: total.reads_ok as f64 / secs,
        hmac_computations: metrics.get("causal.hmac_computations").copied().unwrap_or(0),
        replies: metrics.get("causal.replies").copied().unwrap_or(0),
        member_busy: members.iter().map(|&m| sim.busy_time(m)).sum(),
        sessions: total,
        metrics,
        stats: sim.stats().clone(),
        trace_hash: sim.trace_hash(),
        history: sim.take_history(),
        wall,
    }
}

/// Measures the real CPU cost of one HMAC-SHA1 time proof on this machine, in nanoseconds
/// (host-side, for turning [`Outcome::hmac_computations`] into `signing_cpu_ms`).
pub fn measure_hmac_ns() -> f64 {
    let key = [7u8; kairos_clock::PROOF_LEN];
    let rounds = 20_000u32;
    #[allow(clippy::disallowed_methods)] // a host-side micro-measurement, not a role
    let started = std::time::Instant::now();
    let mut acc = 0u8;
    for i in 0..rounds {
        let t = kairos_clock::ClusterTime::new(1_767_225_600, i << 16);
        acc ^= kairos_clock::compute_proof(&key, t).0[0];
    }
    std::hint::black_box(acc);
    started.elapsed().as_nanos() as f64 / f64::from(rounds)
}
