//! Starting and stopping: clear errors for a wrong id or a busy address, a dead role is reported.

mod common;

use common::{local_cluster, opts, STEP};
use kairos_core::{Ctx, LatencyMatrix, NodeId, Process, TimerId};
use kairos_net::{run_until_ctrl_c, spawn_node, ClusterConfig, HistorySink, NetError, NodeOptions, NodeSpec};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::timeout;

struct Idle {
    panic_on_start: bool,
}

impl Process for Idle {
    type Msg = u8;
    fn on_start(&mut self, ctx: &mut Ctx<'_, u8>) {
        assert!(!self.panic_on_start, "deliberate panic in on_start");
        // A timer far beyond any deadline the runtime can represent is clamped, not a panic.
        ctx.set_timer(TimerId(1), Duration::MAX);
    }
    fn on_message(&mut self, _: &mut Ctx<'_, u8>, _: NodeId, _: u8) {}
    fn on_timer(&mut self, _: &mut Ctx<'_, u8>, _: TimerId) {}
}

#[tokio::test]
async fn unknown_node_id_is_an_error() {
    let (cfg, _listeners) = local_cluster("ids", 1);
    let e = spawn_node(cfg, NodeId(5), Idle { panic_on_start: false }, NodeOptions::default()).await.err().unwrap();
    assert!(matches!(e, NetError::UnknownNode { .. }), "{e}");
    assert!(e.to_string().contains("nodes 0..1"), "{e}");
}

#[tokio::test]
async fn a_busy_address_is_a_bind_error_naming_it() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap();
    let spec = NodeSpec { id: NodeId(0), addr, region: "local".into(), role: "replica".into() };
    let cfg = ClusterConfig::new("busy", LatencyMatrix::single("local", Duration::ZERO), vec![spec]).unwrap();
    let e = spawn_node(Arc::new(cfg), NodeId(0), Idle { panic_on_start: false }, NodeOptions::default())
        .await
        .err()
        .unwrap();
    assert!(matches!(e, NetError::Bind { .. }) && e.to_string().contains(&addr.to_string()), "{e}");
}

#[tokio::test]
async fn a_role_that_panics_is_reported_not_hidden() {
    let (cfg, mut listeners) = local_cluster("dies", 1);
    let options = NodeOptions { history: HistorySink::Discard, ..opts(listeners.pop().unwrap()) };
    let r = timeout(STEP, run_until_ctrl_c(cfg, NodeId(0), Idle { panic_on_start: true }, options, |_| {}))
        .await
        .expect("returns when the role dies");
    assert!(matches!(r, Err(NetError::ProcessDied { .. })), "{r:?}");
}

#[tokio::test]
async fn shutdown_of_an_idle_node_is_clean() {
    let (cfg, mut listeners) = local_cluster("idle", 1);
    let mut node =
        spawn_node(cfg, NodeId(0), Idle { panic_on_start: false }, opts(listeners.pop().unwrap())).await.unwrap();
    assert!(node.take_history().is_some());
    assert!(node.take_history().is_none());
    let metrics = timeout(STEP, node.shutdown()).await.unwrap().unwrap();
    assert!(metrics.is_empty(), "{metrics:?}");
}

/// Remembers how it was started: from its disk, told its disk was lost, or neither (new).
#[derive(Clone, Default)]
struct Start(Arc<std::sync::Mutex<Vec<&'static str>>>);

impl Process for Start {
    type Msg = u8;
    fn on_start(&mut self, ctx: &mut Ctx<'_, u8>) {
        self.0.lock().unwrap().push("start");
        ctx.persist(vec![1]);
    }
    fn on_message(&mut self, _: &mut Ctx<'_, u8>, _: NodeId, _: u8) {}
    fn on_timer(&mut self, _: &mut Ctx<'_, u8>, _: TimerId) {}
    fn on_recover(&mut self, _: &kairos_core::Stored) {
        self.0.lock().unwrap().push("recover");
    }
    fn on_amnesia(&mut self) {
        self.0.lock().unwrap().push("amnesia");
    }
}

/// Starts `role` once on a fresh port with `data_dir` and `rejoin`, then shuts it down.
async fn start_once(role: Start, data_dir: Option<std::path::PathBuf>, rejoin: bool) -> Result<(), NetError> {
    let (cfg, mut listeners) = local_cluster("rejoin", 1);
    let options = NodeOptions { data_dir, rejoin, history: HistorySink::Discard, ..opts(listeners.pop().unwrap()) };
    let node = spawn_node(cfg, NodeId(0), role, options).await?;
    timeout(STEP, node.shutdown()).await.unwrap().unwrap();
    Ok(())
}

/// `--rejoin`: a node that ran before and finds its data directory empty is told its disk was
/// lost; with a disk it recovers as usual; a first start (no `--rejoin`) is a new member.
#[tokio::test]
async fn a_rejoining_node_with_an_empty_data_directory_is_told_its_disk_was_lost() {
    let dir = tempfile::tempdir().unwrap();
    let log = Start::default();
    start_once(log.clone(), Some(dir.path().join("new")), false).await.unwrap();
    start_once(log.clone(), Some(dir.path().join("new")), true).await.unwrap();
    start_once(log.clone(), Some(dir.path().join("wiped")), true).await.unwrap();
    let seen = log.0.lock().unwrap().clone();
    assert_eq!(seen, ["start", "recover", "start", "amnesia", "start"]);
    let e = start_once(log, None, true).await.unwrap_err();
    assert!(matches!(e, NetError::RejoinWithoutDataDir { .. }) && e.to_string().contains("--data-dir"), "{e}");
}
