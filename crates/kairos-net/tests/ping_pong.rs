//! Nodes exchange messages over real TCP on 127.0.0.1; history and metrics flow out.

// A test of the real-network host: it measures real time.
#![allow(clippy::disallowed_methods)]

mod common;

use common::{local_cluster, opts, recv_n, STEP};
use kairos_core::{Ctx, HistoryEvent, MicroOp, NodeId, OpType, Process, TimerId};
use kairos_net::{metric, spawn_node, NodeOptions};
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::timeout;

const ROUNDS: u64 = 5;

#[derive(Clone, Debug, Serialize, Deserialize)]
enum Msg {
    Ping(u64),
    Pong(u64),
    Note(String),
}

/// Node 0 plays ROUNDS of ping-pong with every other node and sends itself a note; the others
/// answer pings.
struct PingPong {
    peers: Vec<NodeId>,
}

fn event(process: u64, key: u64, f: &str) -> HistoryEvent {
    HistoryEvent::new(OpType::Ok, process, f, vec![MicroOp::Write { key, value: process }])
}

impl Process for PingPong {
    type Msg = Msg;
    fn on_start(&mut self, ctx: &mut Ctx<'_, Msg>) {
        if ctx.me() == NodeId(0) {
            ctx.send_all(self.peers.clone(), &Msg::Ping(1));
            ctx.send(ctx.me(), Msg::Note("to myself".into()));
        }
    }
    fn on_message(&mut self, ctx: &mut Ctx<'_, Msg>, from: NodeId, msg: Msg) {
        match msg {
            Msg::Ping(i) => ctx.send(from, Msg::Pong(i)),
            Msg::Pong(i) => {
                ctx.record(event(u64::from(from.0), i, "pong"));
                ctx.metric("test.pongs", 1);
                if i < ROUNDS {
                    ctx.send(from, Msg::Ping(i + 1));
                }
            }
            Msg::Note(s) => {
                assert_eq!(from, ctx.me());
                assert_eq!(s, "to myself");
                ctx.record(event(u64::from(from.0), 0, "note"));
            }
        }
    }
    fn on_timer(&mut self, _: &mut Ctx<'_, Msg>, _: TimerId) {}
}

#[tokio::test]
async fn three_nodes_play_ping_pong_and_record_history() {
    let (cfg, listeners) = local_cluster("pingpong", 3);
    let peers = vec![NodeId(1), NodeId(2)];
    let mut nodes = Vec::new();
    // The listeners are bound before any node starts, so early connects wait in the backlog.
    for (i, l) in listeners.into_iter().enumerate() {
        let p = PingPong { peers: peers.clone() };
        nodes.push(spawn_node(cfg.clone(), NodeId(i as u32), p, opts(l)).await.expect("node starts"));
    }
    let before_ns = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut history = nodes[0].take_history().expect("history channel");
    let recs = recv_n(&mut history, 2 * ROUNDS as usize + 1).await;
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r.index, i as u64, "indexes are dense per node");
        assert!(r.time + 60_000_000_000 > before_ns, "time is ns since the Unix epoch: {r:?}");
    }
    assert!(recs.windows(2).all(|w| w[0].time <= w[1].time));
    assert_eq!(recs.iter().filter(|r| r.event.f == "note").count(), 1);
    for peer in [1u64, 2] {
        let keys: Vec<u64> = recs
            .iter()
            .filter(|r| r.event.f == "pong" && r.event.process == peer)
            .map(|r| r.event.value[0].key())
            .collect();
        assert_eq!(keys, (1..=ROUNDS).collect::<Vec<_>>(), "rounds with node {peer} in order");
    }
    assert_eq!(nodes[0].metric("test.pongs"), 2 * ROUNDS);
    assert_eq!(nodes[0].metric(metric::SELF_MESSAGES), 1);
    assert_eq!(nodes[0].metric(metric::IN_MESSAGES), 2 * ROUNDS);
    assert_eq!(nodes[1].metric(metric::IN_MESSAGES), ROUNDS);
    assert_eq!(nodes[2].metric(metric::IN_BAD_FRAME), 0);
    for n in nodes {
        let m = timeout(STEP, n.shutdown()).await.expect("shutdown in time").expect("clean shutdown");
        assert!(m.contains_key(metric::OUT_MESSAGES), "{m:?}");
    }
}

/// Sends `count` messages to node 1 at start; node 1 never runs.
struct Flood {
    count: u64,
}

impl Process for Flood {
    type Msg = Msg;
    fn on_start(&mut self, ctx: &mut Ctx<'_, Msg>) {
        for i in 0..self.count {
            ctx.send(NodeId(1), Msg::Ping(i));
        }
        ctx.send(NodeId(9), Msg::Ping(0));
    }
    fn on_message(&mut self, _: &mut Ctx<'_, Msg>, _: NodeId, _: Msg) {}
    fn on_timer(&mut self, _: &mut Ctx<'_, Msg>, _: TimerId) {}
}

#[tokio::test]
async fn unreachable_peer_full_queue_and_unknown_peer_are_counted_and_shutdown_is_prompt() {
    let (cfg, mut listeners) = local_cluster("unreachable", 2);
    drop(listeners.pop()); // node 1's port is closed: connects are refused
    let l0 = listeners.pop().unwrap();
    let options = NodeOptions {
        outbound_queue: 4,
        reconnect_backoff_min: Duration::from_millis(5),
        reconnect_backoff_max: Duration::from_millis(20),
        shutdown_grace: Duration::from_millis(100),
        ..opts(l0)
    };
    let node = spawn_node(cfg, NodeId(0), Flood { count: 100 }, options).await.unwrap();
    let deadline = tokio::time::Instant::now() + STEP;
    while node.metric(metric::OUT_CONNECT_FAILED) < 3 {
        assert!(tokio::time::Instant::now() < deadline, "no connection attempts: {:?}", node.metrics());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // At most the queue (4) plus the one message in the dialer's hands are kept.
    assert!(node.metric(metric::OUT_QUEUE_FULL) >= 95, "{:?}", node.metrics());
    assert_eq!(node.metric(metric::OUT_UNKNOWN_PEER), 1);
    assert_eq!(node.metric(metric::OUT_MESSAGES), 0);
    timeout(STEP, node.shutdown()).await.expect("shutdown does not wait for an unreachable peer").unwrap();
}
