//! Tiga's roles, unchanged, as real nodes over TCP on loopback: 2 shards × 3 replicas (replica
//! r of each shard in sc / fi / br, so both leaders sit in sc) and 2 coordinators (sc and hk),
//! with the GCP matrix's one-way delays injected per link. Each coordinator runs a short open
//! loop of MicroBench transactions on a small, skewed key space (so transactions conflict); the
//! merged history must be strictly serializable, every transaction must commit, the sc
//! coordinator must commit mostly on the fast path, and hk's transactions must take at least the
//! wide-area round trip that the injected delays impose.
//!
//! All nodes share the machine's clock, so the servers' `ctx.now()` and the coordinators'
//! future timestamps agree to within the scheduling noise (clock skew ≈ 0).
#![allow(clippy::disallowed_methods)] // the run's wall time, for the report only

use kairos_check::{check, Model};
use kairos_core::history::HistoryRecord;
use kairos_core::{LatencyMatrix, MicroOp, NodeId, OpType};
use kairos_net::{spawn_node, ClusterConfig, NodeOptions, NodeSpec};
use kairos_tiga::coordinator::Coordinator;
use kairos_tiga::server::Server;
use kairos_tiga::{TigaConfig, Topology};
use kairos_workload::MicroBench;
use kairos_workload::OpenLoop;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

const SERVER_REGIONS: [&str; 3] = ["sc", "fi", "br"];
const COORDINATOR_REGIONS: [&str; 2] = ["sc", "hk"];
const SHARDS: usize = 2;
const TXNS_PER_COORDINATOR: u64 = 40;

/// Median of a non-empty list of latencies, ms.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiga_over_tcp_with_injected_wan_delay_is_strictly_serializable() {
    let started = std::time::Instant::now();
    let matrix = LatencyMatrix::gcp();
    let n = SERVER_REGIONS.len();
    let servers = SHARDS * n;
    // Replica r of shard s is node s·n + r, in SERVER_REGIONS[r]; the coordinators follow.
    let regions: Vec<&str> = (0..servers).map(|i| SERVER_REGIONS[i % n]).chain(COORDINATOR_REGIONS).collect();
    let listeners: Vec<std::net::TcpListener> =
        regions.iter().map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let specs: Vec<NodeSpec> = listeners
        .iter()
        .zip(&regions)
        .enumerate()
        .map(|(i, (l, region))| NodeSpec {
            id: NodeId(i as u32),
            addr: l.local_addr().unwrap(),
            region: region.to_string(),
            role: if i < servers { "tiga-server".into() } else { "tiga-coordinator".into() },
        })
        .collect();
    let cfg = Arc::new(ClusterConfig::new("tiga-test", matrix.clone(), specs).unwrap().with_inject_delay(true));
    let topology = Topology {
        shards: (0..SHARDS).map(|s| (0..n).map(|r| NodeId((s * n + r) as u32)).collect()).collect(),
        leader: vec![0; SHARDS],
    };
    let config = TigaConfig::default();

    let mut nodes = Vec::new();
    let mut histories = Vec::new();
    // Servers first, so that they listen before any transaction is sent.
    for (i, listener) in listeners.into_iter().enumerate() {
        let me = NodeId(i as u32);
        let opts = NodeOptions::with_seed(11).listener(listener);
        let node = if i < servers {
            let server = Server::new(topology.clone(), config.clone(), (i / n) as u32, (i % n) as u32);
            spawn_node(cfg.clone(), me, server, opts).await.unwrap()
        } else {
            let k = (i - servers) as u64;
            let here = matrix.region(regions[i]).unwrap();
            let owd: Vec<Vec<Duration>> = topology
                .shards
                .iter()
                .map(|rs| rs.iter().map(|r| matrix.one_way(here, cfg.region_of(*r).unwrap())).collect())
                .collect();
            let (t, c) = (topology.clone(), config.clone());
            let process_base = k * config.inflight_max as u64;
            let load = OpenLoop { rate_per_s: 20.0, stop_after: None, max_txns: Some(TXNS_PER_COORDINATOR) };
            let workload = MicroBench::new(1_000, SHARDS as u32, 0.9).unwrap();
            let role = Coordinator::new(t, c, Box::new(workload), owd, process_base).with_open_loop(load);
            let mut node = spawn_node(cfg.clone(), me, role, opts).await.unwrap();
            histories.push((regions[i], process_base, node.take_history().unwrap()));
            node
        };
        nodes.push(node);
    }

    // Each coordinator: 40 arrivals at 20/s (~2 s), each one WAN round trip plus headroom
    // (≤ ~0.35 s); a lost transaction is given up after 3 sends 2 s apart.
    let mut history: Vec<HistoryRecord> = Vec::new();
    let collect = async {
        for (region, _, h) in histories.iter_mut() {
            let mut completions = 0;
            while completions < TXNS_PER_COORDINATOR {
                let rec = h.recv().await.unwrap_or_else(|| panic!("{region} coordinator's history closed"));
                if rec.event.op_type != OpType::Invoke {
                    completions += 1;
                }
                history.push(rec);
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), collect).await.expect("both coordinators finish within 30 s");
    let mut metrics: Vec<BTreeMap<String, u64>> = Vec::new();
    for node in nodes {
        metrics.push(node.shutdown().await.unwrap());
    }
    let wall = started.elapsed();

    // Per coordinator (its own records are in its order): invocation → completion latencies,
    // and every transaction's real-time interval and keys.
    let mut latencies: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut txns: Vec<(u64, u64, BTreeSet<u64>)> = Vec::new();
    for (region, base, _) in &histories {
        let range = *base..*base + config.inflight_max as u64;
        let mut open: BTreeMap<u64, u64> = BTreeMap::new();
        for r in history.iter().filter(|r| range.contains(&r.event.process)) {
            match r.event.op_type {
                OpType::Invoke => assert!(open.insert(r.event.process, r.time).is_none(), "{r:?}"),
                _ => {
                    let t0 = open.remove(&r.event.process).expect("a completion follows its invocation");
                    latencies.entry(region).or_default().push((r.time - t0) as f64 / 1e6);
                    let keys = r.event.value.iter().map(MicroOp::key).collect();
                    txns.push((t0, r.time, keys));
                }
            }
        }
    }

    // Conflicts happened: pairs of transactions that overlap in real time and share a key.
    let conflicts = txns
        .iter()
        .enumerate()
        .flat_map(|(i, a)| txns[i + 1..].iter().map(move |b| (a, b)))
        .filter(|(a, b)| a.0 < b.1 && b.0 < a.1 && !a.2.is_disjoint(&b.2))
        .count();

    // Records of several nodes: order by real time (one machine clock), then renumber.
    history.sort_by_key(|r| (r.time, r.event.process));
    for (i, r) in history.iter_mut().enumerate() {
        r.index = i as u64;
    }
    let report = check(&history, Model::StrictSerializable).unwrap();

    let m = |node: usize, name: &str| metrics[node].get(name).copied().unwrap_or(0);
    let mut fast_share = BTreeMap::new();
    for (k, region) in COORDINATOR_REGIONS.iter().enumerate() {
        let node = servers + k;
        let (committed, fast) = (m(node, "tiga.committed"), m(node, "tiga.committed_fast"));
        let lat = &latencies[region];
        fast_share.insert(*region, fast as f64 / committed.max(1) as f64);
        eprintln!(
            "{region}: committed {committed} (fast {fast}, slow {}), ts revised {}, retransmissions {}, info {}; \
             latency ms min {:.1} median {:.1} max {:.1}",
            m(node, "tiga.committed_slow"),
            m(node, "tiga.ts_revised"),
            m(node, "tiga.retransmissions"),
            m(node, "tiga.info"),
            lat.iter().copied().fold(f64::INFINITY, f64::min),
            median(lat.clone()),
            lat.iter().copied().fold(0.0, f64::max),
        );
    }
    let net_dropped: u64 = (0..metrics.len())
        .map(|i| m(i, "net.out.queue_full") + m(i, "net.out.encode_error") + m(i, "net.in.bad_message"))
        .sum();
    eprintln!(
        "wall {:.2} s, concurrent conflicting pairs {conflicts}, messages dropped by the hosts {net_dropped}\n{report}",
        wall.as_secs_f64()
    );

    assert_eq!(history.len() as u64, 4 * TXNS_PER_COORDINATOR, "an invocation and a completion per transaction");
    let info = history.iter().filter(|r| r.event.op_type == OpType::Info).count();
    assert_eq!(info, 0, "every transaction committed (none given up)");
    assert!(report.valid, "{report}");
    assert!(conflicts > 0, "the skewed workload should make concurrent transactions share keys");
    for (k, region) in COORDINATOR_REGIONS.iter().enumerate() {
        assert_eq!(m(servers + k, "tiga.committed"), TXNS_PER_COORDINATOR, "{region}: {:?}", metrics[servers + k]);
    }
    // From sc, the last of the three fast replies (br, 58.9 ms away) beats a follower's slow
    // reply, which waits for the leader's log sync first.
    assert!(fast_share["sc"] > 0.5, "sc fast share {:.2}", fast_share["sc"]);
    // The injected delay is real: an hk transaction needs a reply from fi or br, which only
    // answer after the transaction reached them (hk→fi 147.1 ms, hk→br 151.05 ms one way), so
    // it cannot commit in less than ~294 ms; on the fast path it waits for the super quorum's
    // farthest member, br: 2 × 151 ms plus the margin. A lower bound only: the machine is shared.
    let hk_median = median(latencies["hk"].clone());
    assert!(hk_median >= 290.0, "hk median latency {hk_median:.1} ms");
    let hk_min = latencies["hk"].iter().copied().fold(f64::INFINITY, f64::min);
    assert!(hk_min >= 290.0, "an hk transaction took only {hk_min:.1} ms");
}
