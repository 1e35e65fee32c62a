//! Tiga as a service: the `tiga-server` and `tiga-gateway` roles of `kairos serve`, and the
//! Redis-protocol front end of the gateway.
//!
//! - [`resp`]: RESP2 parsing (limit-checked) and reply encoding.
//! - [`commands`]: Redis commands → Tiga operations, and their outputs → replies.
//! - [`cluster`]: `kairos cluster up`, the paper's deployment as local processes.
//! - [`bench`](mod@bench): `kairos cluster bench`, that deployment measured through Redis connections.
//! - [`gateway`]: the gateway's role (a coordinator that hands results back) and the RESP
//!   listener with its per-connection state (pipelines, MULTI/EXEC).
//!
//! ## The Tiga cluster from a cluster file
//! Nodes with role `tiga-server`, in id order, are the servers: with `--tiga-replicas n`
//! (default 3) the i-th is replica `i mod n` of shard `i / n`, and replica 0 leads every shard
//! (view 0). Nodes with role `tiga-view-manager` (any odd number; the paper's deployment has
//! one per server region) run the view manager: with them, a leader that fails is replaced
//! (a view change) and the cluster goes on; without them, leaders are fixed. Nodes with role
//! `tiga-gateway` are coordinators; each listens for Redis clients
//! on `--redis-listen ADDR` and records the history of what it served with `--history FILE`
//! (Jepsen processes from `node id × inflight_max`, so gateways' histories merge).

pub mod bench;
pub mod cluster;
pub mod commands;
pub mod gateway;
pub mod resp;

use crate::CliError;
use gateway::{GatewayRole, RedisOptions};
use kairos_core::NodeId;
use kairos_net::{ClusterConfig, HistorySink, NodeOptions};
use kairos_tiga::coordinator::Coordinator;
use kairos_tiga::server::Server;
use kairos_tiga::view::{ModeRule, View, ViewManager};
use kairos_tiga::{TigaConfig, Topology};
use kairos_workload::FixedKeys;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Options of the Tiga roles under `kairos serve`.
#[derive(Clone, Debug)]
pub struct TigaServeOptions {
    pub replicas_per_shard: usize,
    pub margin: Duration,
    /// The per-transaction quorum choice (gateways; see `TigaConfig::quorum_choice`).
    pub quorum_choice: bool,
    pub redis_listen: Option<SocketAddr>,
    pub redis_limits: resp::Limits,
    pub redis_max_clients: usize,
    /// Seconds a Redis client may stay silent before it is disconnected (0: never).
    pub redis_timeout_s: u64,
}

/// The topology the cluster file describes (see the module docs).
pub fn topology(cfg: &ClusterConfig, replicas_per_shard: usize) -> Result<Topology, CliError> {
    let servers = cfg.nodes_with_role("tiga-server");
    let n = replicas_per_shard;
    if n == 0 {
        return Err(CliError::Usage(
            "--tiga-replicas is the number of replicas per shard: at least 1 (the paper's deployment: 3)".into(),
        ));
    }
    if servers.is_empty() || !servers.len().is_multiple_of(n) {
        return Err(CliError::Usage(format!(
            "the cluster file has {} nodes with role `tiga-server`; with --tiga-replicas {n} that must be a \
             positive multiple of {n} (shard-major: replicas 0..{n} of shard 0, then shard 1, …)",
            servers.len()
        )));
    }
    Ok(Topology { shards: servers.chunks(n).map(<[NodeId]>::to_vec).collect(), leader: vec![0; servers.len() / n] })
}

fn config(o: &TigaServeOptions) -> TigaConfig {
    TigaConfig { margin: o.margin, quorum_choice: o.quorum_choice, ..TigaConfig::default() }
}

/// The role naming the view manager's nodes in a cluster file.
pub const VIEW_MANAGER_ROLE: &str = "tiga-view-manager";

/// The server role of node `me` (reporting to the view manager, if the cluster has one).
pub fn server(cfg: &ClusterConfig, me: NodeId, o: &TigaServeOptions) -> Result<Server, CliError> {
    let t = topology(cfg, o.replicas_per_shard)?;
    let (shard, replica) = t.locate(me).ok_or_else(|| CliError::Usage(format!("node {me} is not a tiga-server")))?;
    Ok(Server::new(t, config(o), shard, replica).with_view_managers(cfg.nodes_with_role(VIEW_MANAGER_ROLE)))
}

/// The view-manager role of node `me`: one member of the replicated view manager, which
/// places new leaders by the servers' regions in the cluster file.
pub fn view_manager(cfg: &ClusterConfig, me: NodeId, o: &TigaServeOptions) -> Result<ViewManager, CliError> {
    let t = topology(cfg, o.replicas_per_shard)?;
    let members = cfg.nodes_with_role(VIEW_MANAGER_ROLE);
    let index = members.iter().position(|m| *m == me).ok_or_else(|| {
        CliError::Usage(format!("node {me} does not have role `{VIEW_MANAGER_ROLE}` in the cluster file"))
    })?;
    if members.len().is_multiple_of(2) {
        return Err(CliError::Usage(format!(
            "the cluster file has {} nodes with role `{VIEW_MANAGER_ROLE}`; a majority of them decides each view, \
             so give it an odd number (3 is the usual: one per server region)",
            members.len()
        )));
    }
    // Regions by index in the latency matrix (a server without one counts as its own region).
    let region = |n: NodeId| cfg.region_of(n).map_or(u32::MAX - n.0, |r| r.index() as u32);
    let regions: Vec<Vec<u32>> = t.shards.iter().map(|rs| rs.iter().map(|n| region(*n)).collect()).collect();
    let c = config(o);
    let initial = View::initial(&t, c.preventive);
    Ok(ViewManager::new(t, regions, c, ModeRule::ByPlacement, initial, members, index as u32))
}

/// Runs node `me` as a gateway until Ctrl-C or `duration`, writing its history to
/// `history_out` (JSON lines).
pub async fn run_gateway(
    cfg: Arc<ClusterConfig>,
    me: NodeId,
    o: TigaServeOptions,
    mut node_opts: NodeOptions,
    duration: Option<Duration>,
    history_out: Option<std::fs::File>,
) -> Result<(), CliError> {
    let t = topology(&cfg, o.replicas_per_shard)?;
    let tiga = config(&o);
    let here = cfg.region_of(me);
    // One-way delays: the matrix's, when the cluster injects it (else the floor: the links are
    // whatever loopback gives).
    let one_way = |a: Option<kairos_core::RegionId>, b: NodeId| match (cfg.inject_delay(), a, cfg.region_of(b)) {
        (true, Some(x), Some(y)) => cfg.matrix().one_way(x, y),
        _ => tiga.owd_floor,
    };
    // Initial bounds from this gateway to every replica.
    let owd: Vec<Vec<Duration>> = t.shards.iter().map(|rs| rs.iter().map(|r| one_way(here, *r)).collect()).collect();
    // The replicas' delays among themselves, for the quorum choice (without injected delay the
    // choice has nothing to go on and stays off).
    let replica_owd: Vec<Vec<Vec<Duration>>> = match cfg.inject_delay() {
        true => t
            .shards
            .iter()
            .map(|rs| rs.iter().map(|a| rs.iter().map(|b| one_way(cfg.region_of(*a), *b)).collect()).collect())
            .collect(),
        false => Vec::new(),
    };
    let process_base = u64::from(me.0) * tiga.inflight_max as u64;
    let coordinator = Coordinator::new(t, tiga.clone(), Box::new(FixedKeys::default()), owd, process_base)
        .with_replica_owd(replica_owd);
    let listen = o.redis_listen.ok_or_else(|| {
        CliError::Usage("a tiga-gateway needs --redis-listen ADDR (e.g. 127.0.0.1:6379) for its Redis clients".into())
    })?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| CliError::Io(format!("cannot listen for Redis clients on {listen}: {e}")))?;
    let local = listener.local_addr().map_err(|e| CliError::Io(e.to_string()))?;
    let region = here.map(|r| cfg.matrix().name(r).to_string()).unwrap_or_default();
    let info = format!(
        "# Server\r\nredis_version:{}\r\nredis_mode:standalone\r\nkairos_role:tiga-gateway\r\nkairos_node:{me}\r\n\
         kairos_region:{region}\r\nkairos_view:0\r\nkairos_shards:{}\r\ntcp_port:{}\r\n",
        commands::REDIS_VERSION,
        cfg.nodes_with_role("tiga-server").len() / o.replicas_per_shard,
        local.port()
    );
    let ropts = Arc::new(RedisOptions {
        limits: o.redis_limits,
        max_clients: o.redis_max_clients,
        pipeline_max: 1024,
        ops_per_txn_max: tiga.ops_per_txn_max,
        keys_per_txn_max: tiga.keys_per_txn_max,
        txn_bytes_max: tiga.txn_bytes_max,
        query_bytes_max: gateway::query_bytes_max(tiga.txn_bytes_max),
        idle_timeout: (o.redis_timeout_s > 0).then(|| Duration::from_secs(o.redis_timeout_s)),
        partial_command_timeout: gateway::PARTIAL_COMMAND_TIMEOUT,
        info,
    });
    node_opts.history = HistorySink::Channel { capacity: 65_536 };
    let (calls_tx, calls_rx) = tokio::sync::mpsc::channel(4096);
    let node = kairos_net::spawn_node_with_calls(cfg, me, GatewayRole::new(coordinator), node_opts, Some(calls_rx))
        .await
        .map_err(|e| CliError::Io(e.to_string()))?;
    eprintln!("node {me} (tiga-gateway) listening on {} for peers, on {local} for Redis clients", node.local_addr());
    let redis = tokio::spawn(gateway::serve_redis(listener, calls_tx, ropts));
    let end = super::serve::Until { duration, ops: None, history_out, flush_each: true };
    super::serve::run_until_stopped(node, me, end, vec![redis.abort_handle()]).await
}
