//! `kairos serve --config cluster.toml --node N`: one node of a cluster as a real process over
//! TCP. The node's `role` in the cluster file picks the role:
//! * `register-replica`, `register-client` — the replicated register;
//! * `causal-member` — a member of the causal replica set (the set is every node with this
//!   role, in node-id order); with `--mongo-listen ADDR` (or `mongo_addr` in the cluster file)
//!   it also serves MongoDB drivers ([`super::mongo_listen`]); `--per-reply-signing` turns
//!   range signing off (to measure it);
//! * `tiga-server`, `tiga-view-manager`, `tiga-gateway` — Tiga's servers, the view manager
//!   that replaces failed leaders, and a coordinator serving Redis clients on
//!   `--redis-listen` (see [`super::redis`]);
//! * `causal-session` — a session against those members, set by `--read-pref`,
//!   `--write-concern`, `--read-concern`, `--causal` (defaults: reads from secondaries,
//!   majority writes and reads, causal on), starting after `--warmup-s` (keys exist only after
//!   the first election).
//!
//! Client roles (`register-client`, `causal-session`) stop after `--ops` completed operations
//! and write their history to `--history`. On exit every node prints its non-zero metrics to
//! stderr (`node N stopped; name=value …`); a session's include
//! `causal.session.reads_from_secondary` and `causal.session.own_write_reads_from_secondary`.

use crate::cli::{ServeArgs, ServeRole};
use crate::CliError;
use kairos_causal::{Member, MemberConfig, ReadConcern, ReadPref, Session, SessionConfig, WriteConcern};
use kairos_core::history::{HistoryRecord, OpType};
use kairos_core::{NodeId, Process};
use kairos_net::{ClusterConfig, HistorySink, NodeOptions};
use kairos_register::{Client, ClientConfig, Replica};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

/// Roles `kairos serve` can run, as named in the cluster file.
const ROLES: &str =
    "register-replica, register-client, causal-member, causal-session, tiga-server, tiga-view-manager, tiga-gateway";

/// How a `causal-session` node runs its session.
#[derive(Clone, Debug, PartialEq)]
pub struct CausalSessionOptions {
    pub read_pref: ReadPref,
    pub write_concern: WriteConcern,
    pub read_concern: ReadConcern,
    pub causal: bool,
    /// The first operation waits this long (the first election and the first signing keys).
    pub warmup: Duration,
    /// Keys the session draws from.
    pub keys: u64,
    /// Share of operations that are reads.
    pub read_fraction: f64,
}

impl Default for CausalSessionOptions {
    /// Read preference secondary, write concern majority, read concern majority, causal on,
    /// 3 s warm-up, 4 keys, half reads.
    fn default() -> Self {
        CausalSessionOptions {
            read_pref: ReadPref::Secondary,
            write_concern: WriteConcern::Majority,
            read_concern: ReadConcern::Majority,
            causal: true,
            warmup: Duration::from_secs(3),
            keys: 4,
            read_fraction: 0.5,
        }
    }
}

pub fn run(args: ServeArgs) -> Result<(), CliError> {
    if let Some(ServeRole::SwarmMemory(a)) = args.role {
        return super::swarm_memory::run(a);
    }
    let (Some(config), Some(node)) = (args.config.clone(), args.node) else {
        return Err(CliError::Usage("kairos serve needs --config FILE --node N (or a role: swarm-memory)".into()));
    };
    let cfg = ClusterConfig::load(&config).map_err(|e| CliError::Io(e.to_string()))?;
    let me = NodeId(node);
    let spec = cfg
        .node(me)
        .ok_or_else(|| CliError::Usage(format!("--node {}: {} has nodes 0..{}", node, config.display(), cfg.len())))?
        .clone();
    let duration = match args.duration_s {
        Some(s) if !(s > 0.0 && s <= 86_400.0 * 365.0) => {
            return Err(CliError::Usage(format!("--duration-s must be a positive number of seconds, not {s}")))
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    let replicas = cfg.nodes_with_role("register-replica");
    let causal_members = cfg.nodes_with_role("causal-member");
    let seed = start_seed(args.seed);
    eprintln!("node {node}: random seed {seed}");
    let mut node_opts = NodeOptions::with_seed(seed);
    // One folder per node, so one --data-dir can hold a whole local cluster.
    node_opts.data_dir = args.data_dir.as_ref().map(|d| d.join(format!("node-{node}")));
    node_opts.rejoin = args.rejoin;
    if let Some(dir) = node_opts.data_dir.as_deref().filter(|_| args.rejoin) {
        let role = spec.role.as_str();
        let cannot_rejoin_from_nothing = role == super::redis::VIEW_MANAGER_ROLE;
        let empty = std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_none());
        if empty && !cannot_rejoin_from_nothing {
            eprintln!(
                "node {node}: {} is empty, so its disk was lost (--rejoin): it rejoins without the promises it made",
                dir.display()
            );
        } else if empty {
            return Err(CliError::Usage(format!(
                "--rejoin: {} is empty, so node {node} lost its disk, and a `{role}` cannot yet rejoin safely \
                 without it (it would vote again on what it forgot; an old copy of its directory forgets as \
                 much). Kairos has no membership change yet: start the whole set anew, every node with an \
                 empty data directory and without --rejoin",
                dir.display()
            )));
        }
    }
    let cfg = Arc::new(cfg);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::Runtime(format!("cannot start the async runtime: {e}")))?;
    let history_out = match &args.history {
        Some(path) => Some(
            std::fs::File::create(path).map_err(|e| CliError::Io(format!("cannot write {}: {e}", path.display())))?,
        ),
        None => None,
    };
    let tiga = || -> Result<super::redis::TigaServeOptions, CliError> {
        if !(args.tiga_margin_ms >= 0.0 && args.tiga_margin_ms <= 10_000.0) {
            return Err(CliError::Usage(format!("--tiga-margin-ms must be 0..=10000, not {}", args.tiga_margin_ms)));
        }
        if args.redis_max_bulk_bytes == 0 || args.redis_max_bulk_bytes > super::redis::resp::BULK_BYTES_MAX {
            return Err(CliError::Usage("--redis-max-bulk-bytes must be 1..=536870912".into()));
        }
        Ok(super::redis::TigaServeOptions {
            replicas_per_shard: args.tiga_replicas,
            margin: Duration::from_secs_f64(args.tiga_margin_ms / 1e3),
            quorum_choice: args.tiga_quorum_choice,
            redis_listen: args.redis_listen,
            redis_limits: super::redis::resp::Limits {
                bulk_bytes_max: args.redis_max_bulk_bytes,
                ..Default::default()
            },
            redis_max_clients: args.redis_max_clients,
            redis_timeout_s: args.redis_timeout_s,
        })
    };
    match spec.role.as_str() {
        "tiga-server" => {
            // With --data-dir, a restarted server recovers its log, checkpoint and released
            // transactions, and rejoins (a failed leader is replaced by a view change).
            let server = super::redis::server(&cfg, me, &tiga()?)?;
            runtime.block_on(serve(cfg, me, server, node_opts, duration, None, history_out))
        }
        super::redis::VIEW_MANAGER_ROLE => {
            // With --data-dir, a restarted member recovers its Paxos state.
            let vm = super::redis::view_manager(&cfg, me, &tiga()?)?;
            runtime.block_on(serve(cfg, me, vm, node_opts, duration, None, history_out))
        }
        "tiga-gateway" => {
            runtime.block_on(super::redis::run_gateway(cfg, me, tiga()?, node_opts, duration, history_out))
        }
        "register-replica" => {
            runtime.block_on(serve(cfg, me, Replica::new(me, &replicas), node_opts, duration, None, history_out))
        }
        "register-client" => {
            if replicas.is_empty() {
                return Err(CliError::Usage(format!(
                    "{} has no node with role `register-replica` for this client to use",
                    config.display()
                )));
            }
            let mut cc = ClientConfig::new(replicas, me.0 as u64);
            cc.max_ops = Some(args.ops);
            runtime.block_on(serve(cfg, me, Client::new(cc), node_opts, duration, Some(args.ops), history_out))
        }
        "causal-member" => {
            let Some(index) = causal_members.iter().position(|&m| m == me) else {
                return Err(CliError::Usage(format!("node {me} is not among the causal members")));
            };
            let mut mc = MemberConfig::new(causal_members.clone());
            mc.per_reply_signing = args.per_reply_signing;
            // A batch of document writes must fit one frame between members.
            let frame_bytes = cfg.max_frame_bytes() as usize;
            (mc.max_docs_entry_bytes, mc.batch_max_bytes) = (frame_bytes / 5 * 3, frame_bytes / 5);
            let mongo = super::mongo_listen::listen_addr(&args, &cfg, me)?;
            if let Some(l) = &mongo {
                mc.mongo = Some(super::mongo_listen::set_config(&args, &cfg, &causal_members, index, l)?);
            }
            // With --data-dir, a restarted process recovers its term, vote and oplog.
            let member = Member::new(Arc::new(mc), index as u32);
            match mongo {
                Some(l) => runtime.block_on(super::mongo_listen::serve(cfg, me, member, node_opts, duration, l)),
                None => runtime.block_on(serve(cfg, me, member, node_opts, duration, None, history_out)),
            }
        }
        "causal-session" => {
            if causal_members.is_empty() {
                return Err(CliError::Usage(format!(
                    "{} has no node with role `causal-member` for this session to use",
                    config.display()
                )));
            }
            if !(0.0..=3_600.0).contains(&args.warmup_s) {
                return Err(CliError::Usage(format!(
                    "--warmup-s must be between 0 and 3600 seconds, not {}",
                    args.warmup_s
                )));
            }
            let o = CausalSessionOptions {
                read_pref: args.read_pref.into(),
                write_concern: args.write_concern.into(),
                read_concern: args.read_concern.into(),
                causal: args.causal == crate::cli::OnOff::On,
                warmup: Duration::from_secs_f64(args.warmup_s),
                ..CausalSessionOptions::default()
            };
            let sc = session_config(&cfg, me, causal_members, &o, duration, args.ops);
            runtime.block_on(serve(cfg, me, Session::new(sc), node_opts, duration, Some(args.ops), history_out))
        }
        other => Err(CliError::Usage(format!(
            "node {} has role `{other}` in {}; kairos serve runs these roles: {ROLES}",
            node,
            config.display()
        ))),
    }
}

/// The session of node `me` against `members`, stopping after `ops` operations (or `duration`).
fn session_config(
    cfg: &ClusterConfig,
    me: NodeId,
    members: Vec<NodeId>,
    o: &CausalSessionOptions,
    duration: Option<Duration>,
    ops: u64,
) -> SessionConfig {
    let mut sc = SessionConfig::new(u64::from(me.0), members.clone());
    // Nearest first by the cluster's latency matrix (ties by node id).
    let mut nearest = members;
    if let Some(here) = cfg.region_of(me) {
        nearest.sort_by_key(|&m| (cfg.region_of(m).map(|r| cfg.matrix().one_way(here, r)), m));
    }
    sc.nearest = nearest;
    sc.read_pref = o.read_pref;
    sc.write_concern = o.write_concern;
    sc.read_concern = o.read_concern;
    sc.causal = o.causal;
    sc.keys = o.keys;
    sc.read_fraction = o.read_fraction;
    sc.start_after = o.warmup;
    sc.stop_after = duration.unwrap_or(Duration::from_secs(86_400 * 365));
    sc.max_ops = Some(ops);
    sc
}

/// Runs `process` until Ctrl-C, `duration`, or `ops` completed operations, writing history
/// records as JSON lines.
async fn serve<P: Process + Send + 'static>(
    cfg: Arc<ClusterConfig>,
    me: NodeId,
    process: P,
    mut opts: NodeOptions,
    duration: Option<Duration>,
    ops: Option<u64>,
    history_out: Option<std::fs::File>,
) -> Result<(), CliError> {
    opts.history = HistorySink::Channel { capacity: 65_536 };
    let node = kairos_net::spawn_node(cfg, me, process, opts).await.map_err(|e| CliError::Io(e.to_string()))?;
    eprintln!("node {me} listening on {}", node.local_addr());
    let end = Until { duration, ops, history_out, flush_each: false };
    run_until_stopped(node, me, end, Vec::new()).await
}

/// When a served node stops, and where its history goes.
pub(super) struct Until {
    /// Stop after this long (default: at Ctrl-C or when the node stops by itself).
    pub duration: Option<Duration>,
    /// Stop after this many completed operations in the history.
    pub ops: Option<u64>,
    /// Write every history record here as a JSON line.
    pub history_out: Option<std::fs::File>,
    /// Flush after every record (a front end whose history a test reads while it runs).
    pub flush_each: bool,
}

/// Runs a started node until `end` says stop (or Ctrl-C, or the node stops), writing its
/// history as it goes; then stops the front ends (listeners feeding the node), shuts the node
/// down, writes what history is left and prints the node's non-zero metrics.
pub(super) async fn run_until_stopped(
    mut node: kairos_net::NodeHandle,
    me: NodeId,
    mut end: Until,
    front_ends: Vec<tokio::task::AbortHandle>,
) -> Result<(), CliError> {
    let mut history = node.take_history();
    let deadline = async {
        match end.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut completed = 0u64;
    let flush_each = end.flush_each;
    let mut write = |rec: &HistoryRecord| -> Result<(), CliError> {
        if let Some(f) = end.history_out.as_mut() {
            let line = serde_json::to_string(rec).map_err(|e| CliError::Runtime(e.to_string()))?;
            writeln!(f, "{line}").map_err(|e| CliError::Io(format!("cannot write the history: {e}")))?;
            if flush_each {
                f.flush().map_err(|e| CliError::Io(format!("cannot write the history: {e}")))?;
            }
        }
        Ok(())
    };
    loop {
        if end.ops.is_some_and(|n| completed >= n) {
            break;
        }
        tokio::select! {
            _ = &mut deadline => break,
            r = &mut ctrl_c => {
                r.map_err(|e| CliError::Runtime(format!("cannot wait for Ctrl-C: {e}")))?;
                break;
            }
            rec = async { match history.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => {
                match rec {
                    Some(rec) => {
                        if rec.event.op_type != OpType::Invoke {
                            completed += 1;
                        }
                        write(&rec)?;
                    }
                    None => history = None,
                }
            }
            _ = node.stopped() => break,
        }
    }
    for f in front_ends {
        f.abort();
    }
    let metrics = node.shutdown().await.map_err(|e| CliError::Runtime(e.to_string()))?;
    if let Some(mut h) = history {
        while let Ok(rec) = h.try_recv() {
            write(&rec)?;
        }
    }
    let shown: Vec<String> = metrics.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{k}={v}")).collect();
    eprintln!("node {me} stopped; {}", shown.join(" "));
    Ok(())
}

/// The seed of a node process's generator: `--seed` mixed with the start time and process id.
/// With `--seed` alone, a node that lost its disk and restarted drew the recovery nonce of its
/// earlier life again, and a delayed reply to that life then numbered the new one like it (a
/// review's schedule: a register write completed with one holder of three); a restarted
/// client repeated its operation ids the same way.
fn start_seed(seed: u64) -> u64 {
    #[allow(clippy::disallowed_methods)] // a host, not a protocol: the start time only seeds its generator
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let mut h = seed ^ (nanos as u64).rotate_left(17) ^ u64::from(std::process::id()).rotate_left(41);
    // splitmix64's finaliser: nearby inputs give unrelated seeds.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    /// Two starts of a node with the same `--seed` draw from different generators.
    #[test]
    fn a_restarted_node_does_not_repeat_its_seed() {
        let first = super::start_seed(1);
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert_ne!(first, super::start_seed(1));
    }
}
