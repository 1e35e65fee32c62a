//! Helpers shared by the integration tests: clusters on 127.0.0.1 with ports picked by the OS.
#![allow(dead_code)]

use kairos_core::history::HistoryRecord;
use kairos_core::{LatencyMatrix, NodeId};
use kairos_net::{ClusterConfig, NodeOptions, NodeSpec};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Every test step waits at most this long.
pub const STEP: Duration = Duration::from_secs(10);

/// Binds one listener per region name on 127.0.0.1:0 and builds a config with those addresses.
pub fn cluster(name: &str, matrix: LatencyMatrix, regions: &[&str]) -> (Arc<ClusterConfig>, Vec<TcpListener>) {
    let listeners: Vec<TcpListener> =
        regions.iter().map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")).collect();
    let nodes = listeners
        .iter()
        .zip(regions)
        .enumerate()
        .map(|(i, (l, r))| NodeSpec {
            id: NodeId(i as u32),
            addr: l.local_addr().expect("local addr"),
            region: r.to_string(),
            role: String::new(),
        })
        .collect();
    let cfg = ClusterConfig::new(name, matrix, nodes).expect("valid test cluster");
    (Arc::new(cfg), listeners)
}

/// A single-region cluster of `n` nodes with no injected delay.
pub fn local_cluster(name: &str, n: usize) -> (Arc<ClusterConfig>, Vec<TcpListener>) {
    let regions = vec!["local"; n];
    cluster(name, LatencyMatrix::single("local", Duration::from_micros(100)), &regions)
}

pub fn opts(listener: TcpListener) -> NodeOptions {
    NodeOptions::with_seed(7).listener(listener)
}

/// Receives `n` history records, failing the test if they do not come within [`STEP`].
pub async fn recv_n(rx: &mut mpsc::Receiver<HistoryRecord>, n: usize) -> Vec<HistoryRecord> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match tokio::time::timeout(STEP, rx.recv()).await {
            Ok(Some(r)) => out.push(r),
            Ok(None) => panic!("history closed after {} of {n} records: {out:?}", out.len()),
            Err(_) => panic!("only {} of {n} history records within {STEP:?}: {out:?}", out.len()),
        }
    }
    out
}
