//! The same register roles, unchanged, as real nodes over TCP on loopback: 3 replicas and
//! 3 clients, with the GCP matrix's delays injected per link; the merged history of the
//! clients must be linearizable.

use kairos_check::{check, Model};
use kairos_core::history::HistoryRecord;
use kairos_core::{LatencyMatrix, NodeId};
use kairos_net::{spawn_node, ClusterConfig, NodeOptions, NodeSpec};
use kairos_register::{Client, ClientConfig, Replica};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_over_tcp_with_injected_wan_delay_is_linearizable() {
    let regions = ["sc", "fi", "br", "sc", "fi", "hk"];
    let listeners: Vec<std::net::TcpListener> =
        regions.iter().map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let specs: Vec<NodeSpec> = listeners
        .iter()
        .zip(regions)
        .enumerate()
        .map(|(i, (l, region))| NodeSpec {
            id: NodeId(i as u32),
            addr: l.local_addr().unwrap(),
            region: region.to_string(),
            role: if i < 3 { "register-replica".into() } else { "register-client".into() },
        })
        .collect();
    let cfg =
        Arc::new(ClusterConfig::new("register-test", LatencyMatrix::gcp(), specs).unwrap().with_inject_delay(true));
    let replicas = cfg.nodes_with_role("register-replica");
    let mut nodes = Vec::new();
    let mut histories = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let me = NodeId(i as u32);
        let opts = NodeOptions::with_seed(7).listener(listener);
        let mut node = if i < 3 {
            spawn_node(cfg.clone(), me, Replica::new(me, &replicas), opts).await.unwrap()
        } else {
            let mut cc = ClientConfig::new(replicas.clone(), i as u64);
            cc.max_ops = Some(8);
            cc.keys = 2;
            spawn_node(cfg.clone(), me, Client::new(cc), opts).await.unwrap()
        };
        if i >= 3 {
            histories.push(node.take_history().unwrap());
        }
        nodes.push(node);
    }
    // Each client: 1 s start-up, then 8 operations of 2 WAN round trips (≤ 0.6 s each).
    let mut history: Vec<HistoryRecord> = Vec::new();
    let collect = async {
        for h in histories.iter_mut() {
            let mut completions = 0;
            while completions < 8 {
                let rec = h.recv().await.expect("client history open");
                if rec.event.op_type != kairos_core::OpType::Invoke {
                    completions += 1;
                }
                history.push(rec);
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), collect).await.expect("clients finish within 60 s");
    for node in nodes {
        node.shutdown().await.unwrap();
    }
    // Records of several nodes: order by real time, then renumber.
    history.sort_by_key(|r| (r.time, r.event.process));
    for (i, r) in history.iter_mut().enumerate() {
        r.index = i as u64;
    }
    assert_eq!(history.len(), 48);
    let report = check(&history, Model::Linearizable).unwrap();
    assert!(report.valid, "{report}");
    let ok = history.iter().filter(|r| r.event.op_type == kairos_core::OpType::Ok).count();
    assert_eq!(ok, 24, "no operation timed out");
    // Injected WAN delay is real: an ABD operation from hk needs two round trips to a majority
    // (hk↔sc 196.7 ms, hk↔fi 294.2 ms RTT), so it cannot finish in less than ~2 × 294 ms.
    let hk = history.iter().filter(|r| r.event.process == 5).collect::<Vec<_>>();
    let first_latency_ms = (hk[1].time - hk[0].time) as f64 / 1e6;
    assert!(first_latency_ms >= 580.0, "hk operation took {first_latency_ms} ms");
}
