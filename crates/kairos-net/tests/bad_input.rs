//! Hostile or broken input closes only the offending connection; the node keeps serving.

// A test of the real-network host: it measures real time.
#![allow(clippy::disallowed_methods)]

mod common;

use common::{local_cluster, opts, recv_n, STEP};
use kairos_core::history::HistoryRecord;
use kairos_core::{Ctx, HistoryEvent, MicroOp, NodeId, OpType, Process, TimerId};
use kairos_net::frame::{self, FrameKind, Hello, DEFAULT_MAX_FRAME_BYTES, HEADER_LEN};
use kairos_net::{metric, spawn_node, NodeOptions};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::timeout;

#[derive(Clone, Debug, Serialize, Deserialize)]
enum Msg {
    Ping(u64),
}

/// Records every ping with its sender; node 1 pings node 0 once at start.
struct Recorder;

impl Process for Recorder {
    type Msg = Msg;
    fn on_start(&mut self, ctx: &mut Ctx<'_, Msg>) {
        if ctx.me() == NodeId(1) {
            ctx.send(NodeId(0), Msg::Ping(7));
        }
    }
    fn on_message(&mut self, ctx: &mut Ctx<'_, Msg>, from: NodeId, Msg::Ping(i): Msg) {
        let ev = HistoryEvent::new(OpType::Ok, u64::from(from.0), "ping", vec![MicroOp::Write { key: i, value: 0 }]);
        ctx.record(ev);
    }
    fn on_timer(&mut self, _: &mut Ctx<'_, Msg>, _: TimerId) {}
}

const MAX: u32 = DEFAULT_MAX_FRAME_BYTES;

fn hello(node: u32, cluster: &str) -> Vec<u8> {
    frame::encode(FrameKind::Hello, &Hello { node: NodeId(node), cluster: cluster.into() }, MAX).unwrap()
}

fn ping(i: u64) -> Vec<u8> {
    frame::encode(FrameKind::Msg, &Msg::Ping(i), MAX).unwrap()
}

/// Connects, writes `bytes` (then half-closes if `eof`), and asserts the node closes the
/// connection (EOF or reset) within the step timeout.
async fn expect_closed(addr: SocketAddr, what: &str, bytes: &[u8], eof: bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    if eof {
        s.shutdown().await.unwrap();
    }
    let mut buf = [0u8; 16];
    match timeout(STEP, s.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!("{what}: the node wrote {n} bytes instead of closing"),
        Err(_) => panic!("{what}: the connection was not closed within {STEP:?}"),
    }
}

fn key(r: &HistoryRecord) -> (u64, u64) {
    (r.event.process, r.event.value[0].key())
}

async fn wait_for(node: &kairos_net::NodeHandle, name: &str, at_least: u64) {
    let deadline = tokio::time::Instant::now() + STEP;
    while node.metric(name) < at_least {
        assert!(tokio::time::Instant::now() < deadline, "{name} < {at_least}: {:?}", node.metrics());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn bad_frames_close_only_their_connection() {
    let (cfg, mut listeners) = local_cluster("hostile", 3);
    let _l2 = listeners.pop().unwrap(); // node 2 is impersonated by a raw socket below
    let l1 = listeners.pop().unwrap();
    let l0 = listeners.pop().unwrap();
    let mut node0 = spawn_node(cfg.clone(), NodeId(0), Recorder, opts(l0)).await.unwrap();
    let addr = node0.local_addr();
    let mut history: mpsc::Receiver<HistoryRecord> = node0.take_history().unwrap();

    // A well-behaved raw connection that stays open through all the abuse.
    let mut good = TcpStream::connect(addr).await.unwrap();
    good.write_all(&hello(2, "hostile")).await.unwrap();
    good.write_all(&ping(100)).await.unwrap();
    assert_eq!(key(&recv_n(&mut history, 1).await[0]), (2, 100));

    let valid = hello(2, "hostile");
    let mut truncated = valid.clone();
    truncated.truncate(HEADER_LEN + 2);
    let mut oversized = valid[..HEADER_LEN].to_vec();
    oversized[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut bad_sum = valid.clone();
    *bad_sum.last_mut().unwrap() ^= 0x55;
    let mut bad_version = valid.clone();
    bad_version[2] = 2;
    let mut bad_kind = valid.clone();
    bad_kind[3] = 77;
    let undecodable = frame::encode_raw(FrameKind::Msg, &[0xff, 0xff, 0xff, 0xff, 0x0f], MAX).unwrap();
    let trailing = frame::encode_raw(FrameKind::Msg, &[0, 1, 2], MAX).unwrap();
    let cases: Vec<(&str, Vec<u8>, bool, &str)> = vec![
        ("garbage", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), false, metric::IN_BAD_FRAME),
        ("truncated frame", truncated, true, metric::IN_BAD_FRAME),
        ("truncated header", valid[..5].to_vec(), true, metric::IN_BAD_FRAME),
        ("oversized length header", oversized, false, metric::IN_BAD_FRAME),
        ("wrong checksum", bad_sum, false, metric::IN_BAD_FRAME),
        ("wrong version", bad_version, false, metric::IN_BAD_FRAME),
        ("unknown kind", bad_kind, false, metric::IN_BAD_FRAME),
        ("garbage after a good Hello", [valid.clone(), vec![0xAB; 40]].concat(), false, metric::IN_BAD_FRAME),
        ("Hello with an unknown id", hello(99, "hostile"), false, metric::IN_BAD_HELLO),
        ("Hello claiming the node itself", hello(0, "hostile"), false, metric::IN_BAD_HELLO),
        ("Hello of another cluster", hello(2, "other"), false, metric::IN_BAD_HELLO),
        ("message before Hello", ping(1), false, metric::IN_BAD_HELLO),
        ("undecodable message", [valid.clone(), undecodable].concat(), false, metric::IN_BAD_MESSAGE),
        ("message with trailing bytes", [valid.clone(), trailing].concat(), false, metric::IN_BAD_MESSAGE),
        ("second Hello", [valid.clone(), valid.clone()].concat(), false, metric::IN_BAD_MESSAGE),
    ];
    for (what, bytes, eof, counter) in cases {
        let before = node0.metric(counter);
        expect_closed(addr, what, &bytes, eof).await;
        wait_for(&node0, counter, before + 1).await;
    }
    assert_eq!(node0.metric(metric::IN_BAD_FRAME), 8);
    assert_eq!(node0.metric(metric::IN_BAD_HELLO), 4);
    assert_eq!(node0.metric(metric::IN_BAD_MESSAGE), 3);

    // The long-lived good connection still works...
    good.write_all(&ping(101)).await.unwrap();
    assert_eq!(key(&recv_n(&mut history, 1).await[0]), (2, 101));
    // ...and a new, real peer gets served.
    let node1 = spawn_node(cfg.clone(), NodeId(1), Recorder, opts(l1)).await.unwrap();
    assert_eq!(key(&recv_n(&mut history, 1).await[0]), (1, 7));
    node1.shutdown().await.unwrap();
    node0.shutdown().await.unwrap();
}

#[tokio::test]
async fn connections_beyond_the_limit_are_closed_and_silent_ones_time_out() {
    let (cfg, mut listeners) = local_cluster("limits", 2);
    let l1 = listeners.pop().unwrap();
    let l0 = listeners.pop().unwrap();
    let options = NodeOptions { max_connections: 2, hello_timeout: Duration::from_millis(1500), ..opts(l0) };
    let mut node0 = spawn_node(cfg.clone(), NodeId(0), Recorder, options).await.unwrap();
    let addr = node0.local_addr();
    let mut history = node0.take_history().unwrap();
    // Two silent connections take both slots; a third is closed at once.
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    wait_for(&node0, metric::IN_CONNECTIONS, 2).await;
    expect_closed(addr, "third connection", &[], false).await;
    assert_eq!(node0.metric(metric::IN_REJECTED_LIMIT), 1);
    // The silent ones send no Hello and are closed after hello_timeout, freeing the slots.
    for mut s in silent {
        let mut buf = [0u8; 1];
        let r = timeout(STEP, s.read(&mut buf)).await.expect("closed after hello_timeout");
        assert!(matches!(r, Ok(0) | Err(_)));
    }
    wait_for(&node0, metric::IN_BAD_HELLO, 2).await;
    let node1 = spawn_node(cfg, NodeId(1), Recorder, opts(l1)).await.unwrap();
    assert_eq!(key(&recv_n(&mut history, 1).await[0]), (1, 7));
    node1.shutdown().await.unwrap();
    node0.shutdown().await.unwrap();
}

#[tokio::test]
async fn identified_connections_that_fall_silent_are_closed_and_oversized_hellos_refused() {
    let (cfg, mut listeners) = local_cluster("idle", 2);
    let _l1 = listeners.pop().unwrap();
    let l0 = listeners.pop().unwrap();
    let options = NodeOptions { idle_timeout: Duration::from_millis(400), ..opts(l0) };
    let node0 = spawn_node(cfg.clone(), NodeId(0), Recorder, options).await.unwrap();
    let addr = node0.local_addr();
    // A valid Hello, then silence: closed after idle_timeout, which frees its permit.
    let mut quiet = TcpStream::connect(addr).await.unwrap();
    quiet.write_all(&hello(1, "idle")).await.unwrap();
    let mut buf = [0u8; 1];
    let r = timeout(STEP, quiet.read(&mut buf)).await.expect("closed after idle_timeout");
    assert!(matches!(r, Ok(0) | Err(_)));
    wait_for(&node0, metric::IN_IDLE_CLOSED, 1).await;
    // A "Hello" larger than any real one is refused before its payload is read.
    let big = frame::encode(FrameKind::Hello, &Hello { node: NodeId(1), cluster: "x".repeat(8_000) }, MAX).unwrap();
    expect_closed(addr, "oversized Hello", &big, false).await;
    wait_for(&node0, metric::IN_BAD_FRAME, 1).await;
    node0.shutdown().await.unwrap();
}
