//! Delay injection: messages between regions wait the matrix's one-way delay, links stay FIFO.

mod common;

use common::{cluster, opts, recv_n};
use kairos_core::{Ctx, HistoryEvent, LatencyMatrix, LocalTime, MicroOp, NodeId, OpType, Process, TimerId};
use kairos_net::{spawn_node, ClusterConfig};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

const ROUND_TRIPS: u64 = 3;
const BURST: u64 = 50;

#[derive(Clone, Debug, Serialize, Deserialize)]
enum Msg {
    Ping(u64),
    Pong(u64),
    Burst(u64),
}

/// Node 0 sends a burst of numbered messages, then plays ROUND_TRIPS sequential round trips
/// with node 1, recording each round trip's duration by its own clock. Node 1 records the
/// order in which the burst arrives.
struct Prober {
    sent_at: LocalTime,
}

fn write(f: &str, key: u64, value: u64) -> HistoryEvent {
    HistoryEvent::new(OpType::Ok, 0, f, vec![MicroOp::Write { key, value }])
}

impl Process for Prober {
    type Msg = Msg;
    fn on_start(&mut self, ctx: &mut Ctx<'_, Msg>) {
        if ctx.me() == NodeId(0) {
            for i in 0..BURST {
                ctx.send(NodeId(1), Msg::Burst(i));
            }
            self.sent_at = ctx.now();
            ctx.send(NodeId(1), Msg::Ping(1));
        }
    }
    fn on_message(&mut self, ctx: &mut Ctx<'_, Msg>, from: NodeId, msg: Msg) {
        match msg {
            Msg::Burst(i) => ctx.record(write("burst", i, 0)),
            Msg::Ping(i) => ctx.send(from, Msg::Pong(i)),
            Msg::Pong(i) => {
                let rtt = ctx.now().saturating_since(self.sent_at);
                ctx.record(write("rtt", i, rtt.as_nanos() as u64));
                if i < ROUND_TRIPS {
                    self.sent_at = ctx.now();
                    ctx.send(from, Msg::Ping(i + 1));
                }
            }
        }
    }
    fn on_timer(&mut self, _: &mut Ctx<'_, Msg>, _: TimerId) {}
}

fn two_regions_40ms_apart() -> (Arc<ClusterConfig>, Vec<std::net::TcpListener>) {
    let matrix =
        LatencyMatrix::from_rtt_ms(vec!["east".into(), "west".into()], vec![vec![0.2, 80.0], vec![80.0, 0.2]]).unwrap();
    let (cfg, listeners) = cluster("geo", matrix, &["east", "west"]);
    let cfg = Arc::new(Arc::unwrap_or_clone(cfg).with_inject_delay(true));
    assert_eq!(cfg.injected_delay(NodeId(0), NodeId(1)), Duration::from_millis(40));
    (cfg, listeners)
}

#[tokio::test]
async fn round_trips_take_at_least_twice_the_one_way_delay_and_links_stay_fifo() {
    let (cfg, listeners) = two_regions_40ms_apart();
    let mut nodes = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let node = spawn_node(cfg.clone(), NodeId(i as u32), Prober { sent_at: LocalTime::ZERO }, opts(l));
        nodes.push(node.await.unwrap());
    }
    let mut h0 = nodes[0].take_history().unwrap();
    let mut h1 = nodes[1].take_history().unwrap();
    let burst: Vec<u64> = recv_n(&mut h1, BURST as usize).await.iter().map(|r| r.event.value[0].key()).collect();
    assert_eq!(burst, (0..BURST).collect::<Vec<_>>(), "one link delivers in order");
    for r in recv_n(&mut h0, ROUND_TRIPS as usize).await {
        let MicroOp::Write { key, value: rtt_ns } = r.event.value[0] else { unreachable!() };
        // 2 × 40 ms of injected delay; 1 ms of slack only for the system clock's slewing.
        assert!(rtt_ns >= 79_000_000, "round trip {key} took {rtt_ns} ns, less than 2 × 40 ms");
    }
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}
