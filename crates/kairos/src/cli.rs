//! Command-line arguments (clap). Every flag says what it does and its unit.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "kairos",
    version,
    about = "Kairos: replicated data made fast by trusting clocks, with every run checked.",
    long_about = "Kairos runs clock-based replication protocols as sans-IO state machines, either in a \
deterministic simulator of a wide-area deployment (virtual time, skewed clocks, a region-to-region \
latency matrix, faults) or as real processes over TCP, and checks every run's client-visible history \
with independent checkers.\n\nStart with `kairos demo`.",
    after_help = "Examples:\n  kairos demo\n  kairos bench register --clients-per-region 4 --duration-s 30 --json results/register.json\n  kairos bench des\n  kairos sim register --seeds 1..51\n  kairos check history.jsonl --model strict-serializable\n  kairos serve --config cluster.toml --node 0\n  kairos serve swarm-memory --listen 127.0.0.1:7000 --bytes 67108864\n  kairos report --quick --out report"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the main job: a short simulated geo-replicated run with its checker's verdict.
    Demo(DemoArgs),
    /// Measure: a protocol in the simulated WAN, or the simulator itself.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Hunt bugs: many seeded simulated runs with random faults, each history checked.
    #[command(subcommand)]
    Sim(SimCommand),
    /// Check a history file (JSON lines, or Jepsen/Elle EDN). Exit 0 = valid, 1 = anomaly found, 2 = unreadable,
    /// 3 = unknown (no checker could decide).
    Check(CheckArgs),
    /// Run one node of a cluster as a real process over TCP.
    Serve(ServeArgs),
    /// Run a whole local cluster: `kairos cluster up` starts Tiga with a Redis gateway per region.
    #[command(subcommand)]
    Cluster(crate::cmd::redis::cluster::ClusterCommand),
    /// Draw the papers' figures (HTML + SVG) from runs of the benches or their --json results.
    Report(crate::cmd::report::ReportArgs),
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Seed of every random choice (clocks, network, workload).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the result objects (see the result contract in architecture.md) to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Tiga on MicroBench in the paper's simulated deployment (3 shards × 3 replicas in sc / fi / br, 8 coordinators).
    Tiga(TigaBenchArgs),
    /// Tiga against its peers (2PL+Paxos, OCC+Paxos, Tapir, Janus, Calvin+, Detock, NCC, NCC+) on identical MicroBench work, side by side.
    Micro(MicroBenchArgs),
    /// Tiga and its peers on identical TPC-C work in the Tiga paper's deployment (6 shards × 3 replicas), side by side, with
    /// TPC-C's consistency conditions checked at the end of every run.
    Tpcc(TpccBenchArgs),
    /// MongoDB-style replica set with signed cluster time and causal sessions (list-append session workload).
    Causal(CausalBenchArgs),
    /// The replicated register (multi-writer ABD) in the simulated four-region deployment.
    Register(RegisterBenchArgs),
    /// Events per second of the bare simulator on a ping-pong workload, by pending events.
    Des(DesBenchArgs),
    /// CPU per message of the TCP host (encode, frame, checksum, system calls, decode) by size, sender and
    /// receiver side: the per-message cost the throughput benches add to handler CPU.
    #[command(
        after_help = "Examples:\n  kairos bench net\n  kairos bench net --sizes 64,1024 --windows 16 --json net.json"
    )]
    Net(NetBenchArgs),
    /// SWARM-KV against DM-ABD and RAW over passive memory nodes (YCSB A/B, checked linearizable).
    Swarm(crate::cmd::swarm::SwarmBenchArgs),
}

#[derive(Args, Debug, Clone)]
pub struct RegisterArgs {
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Clock preset of every node (synchronization error measured in the Tiga paper).
    #[arg(long, value_enum, default_value_t = ClockArg::Chrony)]
    pub clock: ClockArg,
    /// Closed-loop clients in each of sc, fi, br, hk.
    #[arg(long, default_value_t = 2)]
    pub clients_per_region: u32,
    /// Keys (registers) the clients pick from uniformly.
    #[arg(long, default_value_t = 8)]
    pub keys: u64,
    /// Share of operations that are writes, 0..1.
    #[arg(long, default_value_t = 0.5)]
    pub write_ratio: f64,
    /// Virtual (simulated) seconds to run.
    #[arg(long, default_value_t = 20.0)]
    pub duration_s: f64,
    /// Message loss probability, 0..1.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
}

#[derive(Args, Debug)]
pub struct RegisterBenchArgs {
    #[command(flatten)]
    pub run: RegisterArgs,
    /// Write the result contract JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the run's history (JSON lines) to this file.
    #[arg(long)]
    pub history: Option<PathBuf>,
}

/// How an open-loop load's arrivals are admitted (shared by `bench tiga` and `bench micro`).
#[derive(Args, Debug, Clone, Copy)]
pub struct AdmissionArgs {
    /// Admit every arrival up to a fixed in-flight cap, instead of under the adaptive limit
    /// that sheds what the servers cannot take (`kairos_workload::admission`). Without the
    /// limit, open-loop load past saturation queues until heartbeats look like failures and
    /// view changes throw away what is in flight: throughput collapses (use this to see it).
    #[arg(long = "no-admission-control", action = clap::ArgAction::SetFalse)]
    pub admission_control: bool,
}

#[derive(Args, Debug, Clone)]
pub struct TigaArgs {
    /// Total offered load over all coordinators, transactions per second; a comma-separated list runs a sweep.
    #[arg(long, value_delimiter = ',', default_value = "4000")]
    pub load: Vec<f64>,
    /// Zipf skew of MicroBench's key choice (0 = uniform).
    #[arg(long, default_value_t = 0.5)]
    pub skew: f64,
    /// Keys per shard MicroBench draws its keys from (paper: 1,000,000). Fewer keys: more
    /// transactions conflict, and each replica's state is smaller.
    #[arg(long, default_value_t = 1_000_000)]
    pub keys_per_shard: u64,
    /// Load every key into every replica's store before the run, as the paper's setup and `bench micro` do (at most
    /// 10,000,000 keys in all: each costs about 0.5 KB over the six copies its shard keeps). Without it stores start
    /// empty, and handlers also pay for their tables growing as keys are first written.
    #[arg(long)]
    pub load_keys: bool,
    /// Clock preset of every node (synchronization error measured in the Tiga paper).
    #[arg(long, value_enum, default_value_t = ClockArg::Chrony)]
    pub clock: ClockArg,
    /// Where shard leaders live: all in sc (co-located) or one per region (separated).
    #[arg(long, value_enum, default_value_t = PlacementArg::CoLocated)]
    pub placement: PlacementArg,
    /// Timestamp agreement among leaders: agree then execute (preventive), execute then agree and
    /// revoke on disagreement (detective), or auto (preventive when leaders are co-located).
    #[arg(long, value_enum, default_value_t = ModeArg::Auto)]
    pub mode: ModeArg,
    /// Shift added to every headroom estimate, ms (the headroom experiment: -50 … 50).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub headroom_shift_ms: f64,
    /// Use no headroom at all (timestamp = send time), the headroom experiment's worst case.
    #[arg(long)]
    pub zero_headroom: bool,
    /// Per transaction, take the slow path's smaller headroom (only the leaders need the transaction by its
    /// timestamp) when it is predicted to commit sooner than the fast path: beyond the paper, and correct either way.
    #[arg(long)]
    pub quorum_choice: bool,
    /// Leaders announce a multi-shard transaction's timestamp to the other leaders when they release it (the
    /// paper's rule) instead of when it arrives (Kairos's default), or this many ms after arrival if it is still
    /// not released (which breaks the deadlock the paper's rule allows). For measuring the deviation; try it
    /// with `--placement separated --skew 0.9`.
    #[arg(long, value_name = "MS", value_parser = announce_timeout_ms)]
    pub announce_at_release_ms: Option<f64>,
    #[command(flatten)]
    pub admission: AdmissionArgs,
    /// Virtual seconds of load (in-flight transactions then get time to finish); throughput
    /// counts commits after the first third, as `bench micro` does.
    #[arg(long, default_value_t = 5.0)]
    pub duration_s: f64,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Message loss probability, 0..1.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Simulated CPU cost of each handler, microseconds (ignored with --measured-cpu).
    #[arg(long, default_value_t = 5.0)]
    pub cpu_us: f64,
    /// Charge each handler its real measured CPU time (saturation reflects the code's real speed; not bit-for-bit reproducible).
    #[arg(long)]
    pub measured_cpu: bool,
    /// Crash the leader of --kill-shard at this virtual second, with no warning to anyone: the
    /// view manager has to notice. Adds throughput and latency per 100 ms and the recovery
    /// time (crash to throughput back at 90% of before) to the table and to --json.
    #[arg(long, value_name = "SECONDS")]
    pub kill_leader_at_s: Option<f64>,
    /// The shard whose leader --kill-leader-at-s crashes.
    #[arg(long, default_value_t = 0, requires = "kill_leader_at_s")]
    pub kill_shard: u32,
    /// Restart the crashed leader this many seconds after the crash (it rejoins as a follower).
    #[arg(long, value_name = "SECONDS", requires = "kill_leader_at_s")]
    pub restart_after_s: Option<f64>,
}

#[derive(Args, Debug)]
pub struct TigaBenchArgs {
    #[command(flatten)]
    pub run: TigaArgs,
    /// With --measured-cpu: charge every message this flat cost, µs (half to its sender, half to its receiver),
    /// instead of the per-message cost of this host's TCP stack, calibrated at the start of the run
    /// (`kairos bench net`). 0 charges handler CPU only.
    #[arg(long, requires = "measured_cpu", value_parser = message_cost_us)]
    pub message_cost_us: Option<f64>,
    /// Write the result contract JSON (one object per load) to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write this run's figure (latency CDF of every protocol run, SVG) to this file.
    #[arg(long, value_name = "PATH.svg")]
    pub plot: Option<PathBuf>,
    /// Write the (last) run's history (JSON lines) to this file.
    #[arg(long)]
    pub history: Option<PathBuf>,
}

/// What `bench micro` and `bench tpcc` share: the protocols, the load search, the deployment's
/// clocks and placement, the CPU model and the outputs.
#[derive(Args, Debug, Clone)]
pub struct TxnBenchArgs {
    /// Protocols to compare, comma-separated: tiga, 2pl-paxos, occ-paxos, tapir, janus, calvin+, detock, ncc (one server
    /// per shard, no fault tolerance, as the Tiga paper ran it), ncc+ (NCC over Multi-Paxos), and on TPC-C
    /// 2pl-paxos-interactive, occ-paxos-interactive and tapir-interactive (a by-name customer looked up where the piece
    /// runs, on the customers key its execution read, instead of in a pre-read round trip of its own); `all` names them
    /// all.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub protocols: Vec<String>,
    #[command(flatten)]
    pub admission: AdmissionArgs,
    /// Offered loads to run, txn/s, comma-separated; each protocol's maximum throughput is the best it sustained.
    /// Without it, each protocol's maximum is found by a sweep from --sweep-start.
    #[arg(long, value_delimiter = ',')]
    pub load: Vec<f64>,
    /// First load of the saturation sweep, txn/s (default 2,000 for MicroBench, 250 for TPC-C). The sweep doubles
    /// the load until throughput stops following it, then keeps doubling while that raises the best throughput by
    /// 10 %, up to points that offer 100,000 transactions (or after one that took 30 s of wall time); a maximum where it
    /// stopped at that bound is shown "≥".
    #[arg(long)]
    pub sweep_start: Option<f64>,
    /// Load at which latencies are compared, txn/s (default: half the smallest maximum throughput found).
    #[arg(long)]
    pub common_load: Option<f64>,
    /// Clock preset of every node.
    #[arg(long, value_enum, default_value_t = ClockArg::Chrony)]
    pub clock: ClockArg,
    /// Where shard leaders live: all in sc (co-located) or one per region (separated).
    #[arg(long, value_enum, default_value_t = PlacementArg::CoLocated)]
    pub placement: PlacementArg,
    /// Virtual seconds of load per run; throughput counts commits after the first third.
    #[arg(long, default_value_t = 3.0)]
    pub duration_s: f64,
    /// Seed of every random choice (the same for every protocol).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Charge every handler this fixed CPU cost, µs, instead of its measured CPU time (deterministic runs;
    /// throughput then reflects message counts, not code speed). Every open-loop arrival costs it too, even one
    /// admission control refuses: past saturation a protocol whose coordinators are the bottleneck (Tapir) then
    /// commits less with admission control than without; the measured model has no such cost.
    #[arg(long)]
    pub cpu_us: Option<f64>,
    /// With measured CPU: charge every message this flat cost, µs (half to its sender, half to its receiver),
    /// instead of the per-message cost of this host's TCP stack, which is calibrated at the start of the run
    /// (`kairos bench net`). 0 charges handler CPU only.
    #[arg(long, value_parser = message_cost_us)]
    pub message_cost_us: Option<f64>,
    /// Write one result object per protocol (its common-load run, with the sweeps in `extra`) to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write this run's figure (latency CDF of every protocol run, SVG) to this file.
    #[arg(long, value_name = "PATH.svg")]
    pub plot: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
#[command(
    long_about = "Runs every listed protocol on the identical MicroBench workload, deployment (3 shards × 3 replicas \
in sc / fi / br, 2 coordinators in each of sc / fi / br / hk; every store loaded with its shard's share of the 3M \
keys before the run, as the paper's setup loads them), clock preset and seed, checks every run's history \
for strict serializability, and prints one table: maximum throughput, p50 / p90 latency overall and per coordinator \
region at a common load, commit rate (commits / attempts) and each run's verdict, with Tiga's ratios over each peer.\n\n\
Maximum throughput is measured under the measured-CPU service model (each handler costs its real CPU time; \
results vary with the machine and its load, so compare protocols within one run). Without --load, each protocol's \
maximum is found by a sweep (see --sweep-start).",
    after_help = "Examples:\n  kairos bench micro\n  kairos bench micro --protocols tiga,tapir --load 2000,8000,32000\n  \
kairos bench micro --skew-sweep 0.5,0.7,0.9,0.99 --sweep-load 4000 --json results/micro.json"
)]
pub struct MicroBenchArgs {
    #[command(flatten)]
    pub run: TxnBenchArgs,
    /// Zipf skew of MicroBench's key choice (paper: 0.5).
    #[arg(long, default_value_t = 0.5)]
    pub skew: f64,
    /// Also run every protocol at these skews at --sweep-load and report latency per protocol per skew.
    #[arg(long, value_delimiter = ',')]
    pub skew_sweep: Vec<f64>,
    /// Offered load of the skew sweep, txn/s (default: the common load).
    #[arg(long)]
    pub sweep_load: Option<f64>,
    /// Start every server with an empty store instead of loading the 3M keys first (the paper loads them). With
    /// empty stores, handlers also pay for their tables growing as keys are first written.
    #[arg(long)]
    pub empty_stores: bool,
}

#[derive(Args, Debug, Clone)]
#[command(
    long_about = "Runs every listed protocol on the identical TPC-C workload as the Tiga paper deployed it (6 shards × \
3 replicas in sc / fi / br, one warehouse per shard, 10 districts each, the mix new-order / payment / delivery / \
order-status / stock-level = 44 / 44 / 4 / 4 / 4, 15 % remote payments, 1 % remote order lines, a delivery delivering \
one district's oldest order), each transaction split into one-shot pieces per warehouse. Every run's history is checked strictly serializable over the conflict keys \
(a district's orders, year-to-date and customers; an item's stock; a warehouse's year-to-date is only ever added to \
and has no key, as in the paper's code; order-status and stock-level only read theirs, under shared locks in 2PL), and \
at its end TPC-C's consistency conditions are checked on the servers' databases \
and the replicas of each shard compared. The table is `bench micro`'s.\n\n\
The customers and orders are scaled down tenfold from TPC-C's (300 customers and initial orders per district) so \
that 18 replicas fit in one process; the warehouses, districts and items (100,000), where TPC-C's contention lies, are \
not scaled. \
Tiga runs it as general one-shot transactions whose keys are placed by warehouse, each leader executing the pieces \
of its warehouses speculatively (undone on a timestamp revision); Tapir's replicas, which apply commits in any \
order, run a commit's pieces once they hold the versions its reads saw.",
    after_help = "Examples:\n  kairos bench tpcc\n  kairos bench tpcc --protocols janus,calvin+,detock --load 500,1000,2000\n  \
kairos bench tpcc --mix new-order=50,payment=50 --json results/tpcc.json"
)]
pub struct TpccBenchArgs {
    #[command(flatten)]
    pub run: TxnBenchArgs,
    /// The transaction mix: type=percent pairs summing to 100 (types: new-order, payment, delivery, order-status,
    /// stock-level; those not named get 0).
    #[arg(long, default_value = "new-order=44,payment=44,delivery=4,order-status=4,stock-level=4")]
    pub mix: String,
    /// What one delivery delivers: the oldest order of one district (the paper's code; TPC-C lets a delivery commit
    /// district by district) or of all ten districts of its warehouse in one transaction.
    #[arg(long, value_enum, default_value_t = DeliveryArg::District)]
    pub delivery: DeliveryArg,
    /// Warehouses, spread evenly over the 6 shards (paper: one per shard).
    #[arg(long, default_value_t = 6)]
    pub warehouses: u32,
    /// Customers per district (TPC-C: 3,000).
    #[arg(long, default_value_t = 300)]
    pub customers_per_district: u32,
    /// Orders each district starts with (TPC-C: 3,000; the last 30 % undelivered).
    #[arg(long, default_value_t = 300)]
    pub initial_orders_per_district: u32,
    /// Items, and stock rows per warehouse (TPC-C: 100,000).
    #[arg(long, default_value_t = 100_000)]
    pub items: u32,
}

#[derive(Args, Debug)]
pub struct CausalBenchArgs {
    /// Replica-set members (3 to 7; regions sc, fi, br, hk, sc, …); a comma-separated list runs each.
    #[arg(long, value_delimiter = ',', default_value = "3")]
    pub nodes: Vec<usize>,
    /// Write concern: acknowledged by the primary (1) or by a majority.
    #[arg(long, value_enum, default_value_t = WriteConcernArg::Majority)]
    pub write_concern: WriteConcernArg,
    /// Read concern: the member's latest applied data (local) or the majority-committed view.
    #[arg(long, value_enum, default_value_t = ReadConcernArg::Majority)]
    pub read_concern: ReadConcernArg,
    /// Which member a session reads from.
    #[arg(long, value_enum, default_value_t = ReadPrefArg::Nearest)]
    pub read_pref: ReadPrefArg,
    /// Causally consistent sessions on or off; `on,off` runs both side by side.
    #[arg(long, value_delimiter = ',', default_value = "on")]
    pub causal: Vec<OnOff>,
    /// Client sessions (the paper's client threads).
    #[arg(long, default_value_t = 8)]
    pub threads: usize,
    /// Time-proof signing: one HMAC per 65,536-time range (range) or one per reply; `range,per-reply` runs both.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "range")]
    pub signing: Vec<SigningArg>,
    /// Share of operations that are reads, 0..1.
    #[arg(long, default_value_t = 0.5)]
    pub read_fraction: f64,
    /// Virtual seconds measured (after a 5 s warm-up in which the set elects a primary and makes keys).
    #[arg(long, default_value_t = 10.0)]
    pub duration_s: f64,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Charge each handler its real measured CPU time (saturation reflects the code's real speed).
    #[arg(long)]
    pub measured_cpu: bool,
    /// Session workload: unique appends and reads on a few keys (list-append), or TPC-C-derived
    /// sessions (read-write new-order / payment / delivery, read-only order-status / stock-level).
    #[arg(long, value_enum, default_value_t = CausalWorkloadArg::ListAppend)]
    pub workload: CausalWorkloadArg,
    /// Write the result contract JSON (one object per run) to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write this run's figure (latency CDF of every protocol run, SVG) to this file.
    #[arg(long, value_name = "PATH.svg")]
    pub plot: Option<PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CausalWorkloadArg {
    ListAppend,
    Tpcc,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryArg {
    District,
    Warehouse,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteConcernArg {
    #[value(name = "1")]
    W1,
    Majority,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadConcernArg {
    Local,
    Majority,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadPrefArg {
    Primary,
    Secondary,
    Nearest,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnOff {
    On,
    Off,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SigningArg {
    Range,
    PerReply,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeArg {
    Auto,
    Preventive,
    Detective,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementArg {
    CoLocated,
    Separated,
}

impl From<PlacementArg> for kairos_workload::Placement {
    fn from(p: PlacementArg) -> Self {
        match p {
            PlacementArg::CoLocated => kairos_workload::Placement::CoLocated,
            PlacementArg::Separated => kairos_workload::Placement::Separated,
        }
    }
}

#[derive(Args, Debug)]
pub struct DesBenchArgs {
    /// Pending-event counts to measure at, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000,1000000")]
    pub pending: Vec<u32>,
    /// Events to handle per measurement.
    #[arg(long, default_value_t = 2_000_000)]
    pub events: u64,
    /// Write the measurements as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct NetBenchArgs {
    /// Payload sizes to measure, bytes, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "16,128,1024,8192")]
    pub sizes: Vec<usize>,
    /// Messages in flight at once, one table each, comma separated: 1 makes every message travel alone (its own
    /// write and read system calls and wake-ups); a wider window lets the host batch them, as it does under load.
    /// The throughput benches charge the cost measured with a window of 16.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub windows: Vec<usize>,
    /// Messages measured per size (after a warm-up of a tenth as many, at least 100).
    #[arg(long, default_value_t = 5_000)]
    pub messages: u64,
    /// Write the measurements and the fitted cost as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum SimCommand {
    /// The replicated register under random faults on its replicas (a replica may also lose its disk).
    Register(CampaignArgs),
    /// Tiga under random faults on its servers and view-manager nodes (a leader crash is a view change).
    Tiga(CampaignArgs),
    /// 2PL+Paxos under random faults on its servers.
    #[command(name = "2pl-paxos")]
    TwoPlPaxos(CampaignArgs),
    /// OCC+Paxos under random faults on its servers.
    #[command(name = "occ-paxos")]
    OccPaxos(CampaignArgs),
    /// NCC+ (NCC over Multi-Paxos) under random faults on its servers.
    #[command(name = "ncc+")]
    NccPaxos(CampaignArgs),
    /// NCC (one server per shard, as the Tiga paper ran it) under random message faults,
    /// partitions and clock steps on its servers (no crashes: it has no fault tolerance).
    Ncc(CampaignArgs),
    /// Tapir under random faults on its replicas.
    Tapir(CampaignArgs),
    /// Janus under random message faults, partitions and clock steps on its servers (no
    /// crashes: Janus here, as in its authors' code, has no recovery; see `kairos_txn::janus`).
    Janus(CampaignArgs),
    /// Calvin+ under random message faults, partitions and clock steps on its servers (no
    /// crashes: Calvin+ has no recovery; see `kairos_txn::calvin`).
    #[command(name = "calvin+")]
    CalvinPlus(CampaignArgs),
    /// Detock under random message faults, partitions and clock steps on its servers (no
    /// crashes: Detock here, as in the Tiga paper's code, has no recovery; see `kairos_txn::detock`).
    Detock(CampaignArgs),
    /// The causal replica set under random faults on its members.
    Causal(CampaignArgs),
    /// SWARM-KV on simulated memory nodes: random deployments, memory-node and client crashes,
    /// chains stalled between their verbs, paused clients.
    #[command(name = "swarm-kv")]
    SwarmKv(CampaignArgs),
    /// DM-ABD under the same random deployments and adversary as `swarm-kv`.
    #[command(name = "dm-abd")]
    DmAbd(CampaignArgs),
    /// FUSEE under the same random deployments, stalled chains and paused clients, without
    /// crashes (Kairos's FUSEE has no recovery; see its module docs).
    Fusee(CampaignArgs),
}

/// What a transactional fault campaign runs.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CampaignWorkload {
    Micro,
    Tpcc,
}

/// The protocols a fault campaign can run.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CampaignProtocol {
    Register,
    Tiga,
    TwoPlPaxos,
    OccPaxos,
    Ncc,
    NccPaxos,
    Tapir,
    Janus,
    CalvinPlus,
    Detock,
    Causal,
    SwarmKv,
    DmAbd,
    Fusee,
}

impl CampaignProtocol {
    pub fn name(self) -> &'static str {
        match self {
            CampaignProtocol::Register => "register",
            CampaignProtocol::Tiga => "tiga",
            CampaignProtocol::TwoPlPaxos => "2pl-paxos",
            CampaignProtocol::OccPaxos => "occ-paxos",
            CampaignProtocol::Ncc => "ncc",
            CampaignProtocol::NccPaxos => "ncc+",
            CampaignProtocol::Tapir => "tapir",
            CampaignProtocol::Janus => "janus",
            CampaignProtocol::CalvinPlus => "calvin+",
            CampaignProtocol::Detock => "detock",
            CampaignProtocol::Causal => "causal",
            CampaignProtocol::SwarmKv => "swarm-kv",
            CampaignProtocol::DmAbd => "dm-abd",
            CampaignProtocol::Fusee => "fusee",
        }
    }
}

#[derive(Args, Debug, Clone)]
#[command(
    long_about = "A fault campaign (swarm testing): every seed draws its own fault plan over the servers (or members) — \
which of the --faults kinds are on, when and where — from 0.5 s to --fault-s, repairs every fault by then, and keeps the \
load on for --recovery-s more. Safety: every role's invariants are checked after every event (the run stops at the \
first violation) and the history is checked (strict serializability; linearizability for the register; causal session guarantees for the replica set). \
Liveness: every client that asks for something after the repair must get an answer. A failing seed's history and the \
command that replays it are written to --failing-dir.\n\nswarm-kv and dm-abd draw a whole deployment per seed instead \
(clients, keys, value size, clock skew, a memory-node or client crash, chains stalled between verbs for up to ~1,000 \
round trips, a paused client: --faults, --load, --fault-s and --recovery-s do not apply); safety is per-key \
linearizability, liveness is no get timing out and every read within 2 × writers + 1 iterations.\n\nWith --corrupt, a share of the \
messages in flight is also changed on the wire: that sender is Byzantine, outside every protocol's fault model, so \
histories, invariants and liveness are not judged; the seed fails only when a role panics on what it received (no \
input from the network may panic a node). A panic fails its seed under any options, with its message and the replay \
command.\n\nExit status: 0 every seed safe and live, 1 a violation, a panic or a liveness failure, 3 some history no \
checker could decide.",
    after_help = "Examples:\n  kairos sim tapir --seeds 1..101\n  kairos sim 2pl-paxos --seeds 1..1001 --faults crash,partition --json results/2pl.json\n  \
kairos sim tiga --seeds 7 --show-faults\n  kairos sim causal --seeds 1..1001 --corrupt 0.1"
)]
pub struct CampaignArgs {
    /// Seeds to run: `N`, `A..B` (B excluded) or `A..=B`.
    #[arg(long, default_value = "1..21")]
    pub seeds: String,
    /// Fault kinds the plans may use, comma-separated: crash, partition, oneway, clock-step, loss, dup (messages
    /// delivered twice), replay (old messages delivered again), torn (a node dies while writing: a prefix of that
    /// handler's records survives, its messages never leave), disk-loss (once per run a node crashes, loses its disk
    /// and comes back amnesiac: register replicas, Tiga servers and causal replica-set members; other roles cannot
    /// come back from nothing yet and are never chosen), pause (a node stops for up to ~3 s, as in a long GC pause
    /// or a descheduled VM, keeping its state; what was sent to it waits, and it resumes unaware of the gap), slow (a
    /// gray failure: what one node sends arrives 20 ms to 1.5 s late for a while, in order; it hears everyone on
    /// time), or all.
    #[arg(long, default_value = "all")]
    pub faults: String,
    /// Offered load, transactions per second over all coordinators (transactional protocols).
    #[arg(long, default_value_t = 150.0)]
    pub load: f64,
    /// The transactional protocols' work: MicroBench, or TPC-C (6 warehouses over the shards, small
    /// tables), whose databases are then also held to TPC-C's consistency conditions and the replicas of
    /// each shard compared at the end of every seed.
    #[arg(long, value_enum, default_value = "micro")]
    pub workload: CampaignWorkload,
    /// Faults happen from 0.5 s until this many seconds (at least 1, at most 3,600).
    #[arg(long, default_value_t = 4.0, value_parser = campaign_phase_s, allow_hyphen_values = true)]
    pub fault_s: f64,
    /// Seconds of load after every fault is repaired (liveness is judged on them; at least 1, at most 3,600).
    #[arg(long, default_value_t = 2.0, value_parser = campaign_phase_s, allow_hyphen_values = true)]
    pub recovery_s: f64,
    /// Write each failing seed's history (and a .replay file with its command) here.
    #[arg(long, default_value = "results/failing")]
    pub failing_dir: PathBuf,
    /// Change the encoding of this share (0 to 1) of the messages in flight — a few bytes overwritten, the end cut
    /// off or extended — and deliver what still decodes, on top of the fault plan. Only panics are then judged.
    #[arg(long, default_value_t = 0.0, value_parser = parse_share, allow_hyphen_values = true)]
    pub corrupt: f64,
    /// Print each run's fault plan.
    #[arg(long)]
    pub show_faults: bool,
    /// Print the per-seed table even for more than 200 seeds.
    #[arg(long)]
    pub verbose: bool,
    /// Write the summary (seeds run, violations, liveness failures, events per second, every seed) as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Args, Debug)]
#[command(
    long_about = "Checks a history file against a consistency model with every applicable checker, and prints which \
checker proved or refuted it.\n\n\
Input: Jepsen-shaped operations as JSON lines (or one JSON array), or Jepsen's / Elle's history.edn. Keys and values \
may be integers, strings or keywords. Transactions are lists of [r k v], [w k v], [append k v], [cas k [old new]]; \
single-register operations (f = read / write / cas, Knossos's shape) and key-value operations (f = get / put / \
append with a key field, porcupine's shape) are read too. Real-time order is the order of records, as Jepsen takes \
it; `time` is information only.\n\n\
Verdicts: VALID when some checker proved the model asked and none found an anomaly; INVALID when any found one; \
UNKNOWN when none could decide (the report says why and what would settle it). Unknown is never valid.\n\n\
Exit status: 0 valid, 1 anomaly, 2 unreadable input, 3 unknown.",
    after_help = "Examples:\n  kairos check history.jsonl --model strict-serializable\n  \
kairos check history.edn --model serializable --json\n  \
kairos check big.jsonl --model strict-serializable --search-budget 50000000"
)]
pub struct CheckArgs {
    /// History file: JSON lines (or one JSON array), or EDN (a `.edn` name, or text starting with `{:`).
    pub history: PathBuf,
    /// Consistency model to check.
    #[arg(long, value_enum)]
    pub model: ModelArg,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Steps the serial-order search may take before it gives up (its verdict is then unknown).
    /// Default: 2,000,000 plus 20 per transaction.
    #[arg(long)]
    pub search_budget: Option<u64>,
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ServeArgs {
    /// A role that needs no cluster file (`kairos serve swarm-memory --listen ADDR --bytes N`).
    #[command(subcommand)]
    pub role: Option<ServeRole>,
    /// Cluster file (TOML) naming every node, its address, region and role.
    #[arg(long, required = true)]
    pub config: Option<PathBuf>,
    /// This process's node id in the cluster file.
    #[arg(long, required = true)]
    pub node: Option<u32>,
    /// Where a client node writes its history (JSON lines).
    #[arg(long)]
    pub history: Option<PathBuf>,
    /// Stop after this many seconds (default: run until Ctrl-C, or until a client finishes its operations).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Operations a client node performs before it stops.
    #[arg(long, default_value_t = 100)]
    pub ops: u64,
    /// Mixed with the process's start time and id into the seed of the node's random
    /// generator (printed at start). A restarted node must not repeat its earlier draws: its
    /// recovery nonces and operation ids tell its replies from those of its previous life.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Keep what the node persists under DIR/node-N (synced before it answers), and recover it
    /// when the node restarts with the same DIR. Without it nothing survives the process.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// This node ran before: if its folder under --data-dir is empty, its disk was lost, and it
    /// rejoins without the promises it made (a Tiga server does not vote until a later view; a
    /// causal member does not vote until a primary elected without it has caught it up; a
    /// register replica recovers from the others). Refused for a tiga-view-manager, which cannot
    /// yet rejoin safely from nothing. Needs --data-dir.
    #[arg(long, requires = "data_dir")]
    pub rejoin: bool,
    /// causal-session: which member a session reads from.
    #[arg(long, value_enum, default_value_t = ReadPrefArg::Secondary)]
    pub read_pref: ReadPrefArg,
    /// causal-session: write concern.
    #[arg(long, value_enum, default_value_t = WriteConcernArg::Majority)]
    pub write_concern: WriteConcernArg,
    /// causal-session: read concern.
    #[arg(long, value_enum, default_value_t = ReadConcernArg::Majority)]
    pub read_concern: ReadConcernArg,
    /// causal-session: causally consistent session on or off.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub causal: OnOff,
    /// causal-session: seconds to wait before the first operation (the set elects a primary and makes signing keys).
    #[arg(long, default_value_t = 3.0)]
    pub warmup_s: f64,
    /// tiga-server / tiga-gateway: replicas per shard (the `tiga-server` nodes, in id order, are shard-major).
    #[arg(long, default_value_t = 3)]
    pub tiga_replicas: usize,
    /// tiga-server / tiga-gateway: the headroom margin Δ added to the one-way delay estimate, ms (paper: 10).
    #[arg(long, default_value_t = 10.0)]
    pub tiga_margin_ms: f64,
    /// tiga-gateway: per transaction, take the slow path's smaller headroom when it commits sooner (beyond the
    /// paper; needs the cluster file's latency matrix with injected delay to know the replicas' delays).
    #[arg(long)]
    pub tiga_quorum_choice: bool,
    /// tiga-gateway: address to listen on for Redis (RESP2) clients, e.g. 127.0.0.1:6379 (port 0 picks one; it is printed).
    #[arg(long, value_name = "ADDR")]
    pub redis_listen: Option<std::net::SocketAddr>,
    /// tiga-gateway: largest bulk string a Redis client may send, bytes (at most Redis's 512 MiB).
    #[arg(long, default_value_t = 512 << 20)]
    pub redis_max_bulk_bytes: usize,
    /// tiga-gateway: Redis client connections served at once; more are refused.
    #[arg(long, default_value_t = 1024)]
    pub redis_max_clients: usize,
    /// tiga-gateway: close a Redis client connection after this many silent seconds (Redis's `timeout`; 0:
    /// never). A command left incomplete for 10 s closes its connection whatever this is.
    #[arg(long, default_value_t = 300)]
    pub redis_timeout_s: u64,
    /// causal-member: also serve MongoDB drivers on ADDR (default: the node's `mongo_addr` in the cluster file, if any).
    #[arg(long, value_name = "ADDR")]
    pub mongo_listen: Option<String>,
    /// causal-member: the replica-set name MongoDB drivers connect with (`replicaSet=NAME`).
    #[arg(long, value_name = "NAME", default_value = "kairos")]
    pub mongo_set_name: String,
    /// causal-member: one HMAC per reply instead of range signing (to measure what range signing saves).
    #[arg(long)]
    pub per_reply_signing: bool,
}

#[derive(Subcommand, Debug)]
pub enum ServeRole {
    /// A SWARM memory node: a byte array that executes only READ / WRITE / CAS / CHAIN frames over TCP.
    SwarmMemory(SwarmMemoryArgs),
}

#[derive(Args, Debug)]
pub struct SwarmMemoryArgs {
    /// Address to listen on, host:port (port 0 picks a free port; the address is printed).
    #[arg(long)]
    pub listen: String,
    /// Size of the node's memory in bytes.
    #[arg(long)]
    pub bytes: u64,
    /// Connections served at once (one per client); more are closed at once.
    #[arg(long, default_value_t = 256)]
    pub connections_max: usize,
    /// Close a connection that sends nothing for this many seconds.
    #[arg(long, default_value_t = 600.0)]
    pub idle_timeout_s: f64,
    /// Stop after this many seconds (default: run until killed).
    #[arg(long)]
    pub duration_s: Option<f64>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockArg {
    Perfect,
    Huygens,
    Chrony,
    Ntpd,
    Bad,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelArg {
    StrictSerializable,
    Serializable,
    Linearizable,
    Causal,
}

/// `--message-cost-us`: a flat cost per message, 0 to 10,000 µs.
fn announce_timeout_ms(arg: &str) -> Result<f64, String> {
    let ms: f64 = arg.parse().map_err(|_| format!("{arg:?} is not a number of milliseconds"))?;
    if ms > 0.0 && ms <= 10_000.0 {
        Ok(ms)
    } else {
        Err(format!("must be more than 0 and at most 10,000 ms, not {ms}"))
    }
}

/// `--corrupt`: a share of the messages, 0 to 1.
fn parse_share(arg: &str) -> Result<f64, String> {
    let share: f64 = arg.parse().map_err(|_| format!("{arg:?} is not a number; give a share from 0 to 1, e.g. 0.1"))?;
    if (0.0..=1.0).contains(&share) {
        Ok(share)
    } else {
        Err(format!("must be a share from 0 to 1 (0.1 changes a tenth of the messages), not {share}"))
    }
}

/// A number of seconds from the command line: finite, 0 or more (more than 0 unless `zero_ok`) and at
/// most `max_s`. NaN and infinities are refused here, before any `Duration::from_secs_f64` can panic.
pub fn seconds_within(arg: &str, zero_ok: bool, max_s: f64) -> Result<f64, String> {
    let s: f64 = arg.trim().parse().map_err(|_| format!("{arg:?} is not a number of seconds"))?;
    let low_ok = if zero_ok { s >= 0.0 } else { s > 0.0 };
    if low_ok && s <= max_s {
        Ok(s)
    } else {
        let low = if zero_ok { "from 0" } else { "above 0" };
        Err(format!("must be a number of seconds {low} and at most {max_s}, not {arg}"))
    }
}

/// `sim --fault-s` and `--recovery-s`: seconds of a campaign phase, above 0 and at most an hour
/// (below 1 counts as 1).
fn campaign_phase_s(arg: &str) -> Result<f64, String> {
    seconds_within(arg, false, 3_600.0)
}

fn message_cost_us(arg: &str) -> Result<f64, String> {
    let us: f64 = arg.parse().map_err(|_| format!("{arg:?} is not a number of microseconds"))?;
    if (0.0..=10_000.0).contains(&us) {
        Ok(us)
    } else {
        Err(format!("must be between 0 and 10,000 µs, not {us}"))
    }
}
