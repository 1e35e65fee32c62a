//! `kairos serve --config cluster.toml --node N`: one node of a cluster as a real process over
//! TCP. The node's `role` in the cluster file picks the role: `register-replica` or
//! `register-client` (the register's clients write their history to `--history`).

use crate::cli::ServeArgs;
use crate::CliError;
use kairos_core::history::{HistoryRecord, OpType};
use kairos_core::{NodeId, Process};
use kairos_net::{ClusterConfig, HistorySink, NodeOptions};
use kairos_register::{Client, ClientConfig, Replica};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

/// Roles `kairos serve` can run, as named in the cluster file.
const ROLES: &str = "register-replica, register-client";

pub fn run(args: ServeArgs) -> Result<(), CliError> {
    let cfg = ClusterConfig::load(&args.config).map_err(|e| CliError::Io(e.to_string()))?;
    let me = NodeId(args.node);
    let spec = cfg
        .node(me)
        .ok_or_else(|| {
            CliError::Usage(format!("--node {}: {} has nodes 0..{}", args.node, args.config.display(), cfg.len()))
        })?
        .clone();
    let duration = match args.duration_s {
        Some(s) if !(s > 0.0 && s <= 86_400.0 * 365.0) => {
            return Err(CliError::Usage(format!("--duration-s must be a positive number of seconds, not {s}")))
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    let replicas = cfg.nodes_with_role("register-replica");
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
    match spec.role.as_str() {
        "register-replica" => {
            runtime.block_on(serve(cfg, me, Replica::new(me, &replicas), args.seed, duration, None, history_out))
        }
        "register-client" => {
            if replicas.is_empty() {
                return Err(CliError::Usage(format!(
                    "{} has no node with role `register-replica` for this client to use",
                    args.config.display()
                )));
            }
            let mut cc = ClientConfig::new(replicas, me.0 as u64);
            cc.max_ops = Some(args.ops);
            runtime.block_on(serve(cfg, me, Client::new(cc), args.seed, duration, Some(args.ops), history_out))
        }
        other => Err(CliError::Usage(format!(
            "node {} has role `{other}` in {}; kairos serve runs these roles: {ROLES}",
            args.node,
            args.config.display()
        ))),
    }
}

/// Runs `process` until Ctrl-C, `duration`, or `ops` completed operations, writing history
/// records as JSON lines.
async fn serve<P: Process + Send + 'static>(
    cfg: Arc<ClusterConfig>,
    me: NodeId,
    process: P,
    seed: u64,
    duration: Option<Duration>,
    ops: Option<u64>,
    mut history_out: Option<std::fs::File>,
) -> Result<(), CliError> {
    let mut opts = NodeOptions::with_seed(seed);
    opts.history = HistorySink::Channel { capacity: 65_536 };
    let mut node = kairos_net::spawn_node(cfg, me, process, opts).await.map_err(|e| CliError::Io(e.to_string()))?;
    eprintln!("node {me} listening on {}", node.local_addr());
    let mut history = node.take_history();
    let deadline = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut completed = 0u64;
    let mut write = |rec: &HistoryRecord| -> Result<(), CliError> {
        if let Some(f) = history_out.as_mut() {
            let line = serde_json::to_string(rec).map_err(|e| CliError::Runtime(e.to_string()))?;
            writeln!(f, "{line}").map_err(|e| CliError::Io(format!("cannot write the history: {e}")))?;
        }
        Ok(())
    };
    loop {
        if ops.is_some_and(|n| completed >= n) {
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
