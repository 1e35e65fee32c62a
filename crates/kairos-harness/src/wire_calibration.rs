//! What one message costs the TCP host, measured: the calibration behind the simulator's
//! [`WireCost`].
//!
//! The simulator charges a handler its measured CPU time, but it never encodes a message,
//! frames it, checksums it, makes a system call or wakes a task; `kairos-net` does all of that
//! for every message a real node sends or receives. This module measures it end to end on the
//! host itself, over loopback:
//!
//! - Two real nodes (`kairos_net::spawn_node`), each on its own OS thread with a
//!   single-threaded tokio runtime, so every task of a node — its role, its dialer, its
//!   connection reader — runs on that thread and the thread's CPU time
//!   (`CLOCK_THREAD_CPUTIME_ID`) is the node's whole cost. Waiting in `epoll` costs nothing.
//! - The sender's role sends `payload_bytes`-byte messages, `window` of them in flight; the
//!   receiver answers each with a one-byte acknowledgement, and each acknowledgement lets the
//!   sender send the next. With a window of 1 every message travels alone (a write and a read
//!   system call of its own); wider windows let the host batch writes and reads, as it does
//!   under load.
//! - After `warmup` messages, each side records its thread's CPU time over the next
//!   `messages` messages. Per message, the sender side is one message sent plus one
//!   acknowledgement received, and the receiver side the reverse.
//!
//! [`Calibration::wire_cost`] fits both sides linearly in the message's encoded size. The
//! acknowledgement is a message of minimal size, so each side's intercept holds one minimal
//! send and one minimal receive; a side's per-message intercept is therefore half of the mean
//! of the two intercepts (the split between sending and receiving a minimal message cannot be
//! observed this way, and is taken as even), and each side keeps its own slope. What the roles'
//! handlers do here (build a payload, count) is in the figures too; it is small beside the
//! system calls, and it slightly overstates the cost.

use kairos_core::{Ctx, LatencyMatrix, NodeId, Process, TimerId};
use kairos_net::{spawn_node, ClusterConfig, HistorySink, NodeOptions, NodeSpec};
use kairos_sim::cpu_clock;
use kairos_sim::WireCost;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Clone, Debug)]
pub struct CalibrationConfig {
    /// Payload sizes, bytes (the encoded message is a few bytes longer).
    pub payload_bytes: Vec<usize>,
    /// Messages in flight at once (1: every message travels alone).
    pub window: usize,
    /// Messages sent before measuring starts (connections, allocator and caches warm up).
    pub warmup: u64,
    /// Messages measured per size.
    pub messages: u64,
    /// A size whose messages have not all arrived after this long is an error.
    pub timeout: Duration,
}

impl Default for CalibrationConfig {
    fn default() -> Self {
        CalibrationConfig {
            payload_bytes: vec![16, 128, 1024, 8192],
            window: 1,
            warmup: 500,
            messages: 5_000,
            timeout: Duration::from_secs(60),
        }
    }
}

/// One size's measurement.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SizePoint {
    pub payload_bytes: usize,
    /// The message's postcard size (what the simulator sizes), bytes.
    pub encoded_bytes: usize,
    /// Sender thread CPU per message (one message sent, one acknowledgement received), ns.
    pub sender_ns_per_message: f64,
    /// Receiver thread CPU per message (one message received, one acknowledgement sent), ns.
    pub receiver_ns_per_message: f64,
    /// Messages per second of wall time over the measurement.
    pub messages_per_s: f64,
}

/// The measurements of every size, and the fitted per-message cost.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Calibration {
    pub window: usize,
    pub messages: u64,
    pub points: Vec<SizePoint>,
}

/// Why a calibration could not run.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error("calibration needs at least one payload size, a window of at least 1 and at least 1 message")]
    Shape,
    #[error("cannot set up the loopback nodes: {0}")]
    Setup(String),
    #[error(
        "{payload_bytes}-byte messages: only {done} of {want} arrived within {timeout:?} (is loopback TCP blocked?)"
    )]
    Timeout { payload_bytes: usize, done: u64, want: u64, timeout: Duration },
}

impl Calibration {
    /// Least-squares lines of both sides against the encoded size; see the module docs.
    pub fn wire_cost(&self) -> WireCost {
        let x: Vec<f64> = self.points.iter().map(|p| p.encoded_bytes as f64).collect();
        let sender: Vec<f64> = self.points.iter().map(|p| p.sender_ns_per_message).collect();
        let receiver: Vec<f64> = self.points.iter().map(|p| p.receiver_ns_per_message).collect();
        let (send_at_zero, send_slope) = fit_line(&x, &sender);
        let (receive_at_zero, receive_slope) = fit_line(&x, &receiver);
        let base = ((send_at_zero + receive_at_zero) / 4.0).max(0.0);
        WireCost {
            send_ns_base: base,
            send_ns_per_byte: send_slope.max(0.0),
            receive_ns_base: base,
            receive_ns_per_byte: receive_slope.max(0.0),
        }
    }
}

/// Intercept and slope of the least-squares line through `(x, y)` (a horizontal line through
/// the mean when all `x` are equal).
fn fit_line(x: &[f64], y: &[f64]) -> (f64, f64) {
    let n = x.len().max(1) as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let sxx: f64 = x.iter().map(|a| (a - mx) * (a - mx)).sum();
    let sxy: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    if sxx == 0.0 {
        return (my, 0.0);
    }
    let slope = sxy / sxx;
    (my - slope * mx, slope)
}

/// Measures every size of `config`, calling `progress(done, total)` after each.
pub fn calibrate(
    config: &CalibrationConfig,
    mut progress: impl FnMut(usize, usize),
) -> Result<Calibration, CalibrationError> {
    if config.payload_bytes.is_empty() || config.window == 0 || config.messages == 0 {
        return Err(CalibrationError::Shape);
    }
    let mut points = Vec::new();
    for (i, &size) in config.payload_bytes.iter().enumerate() {
        points.push(measure(config, size)?);
        progress(i + 1, config.payload_bytes.len());
    }
    Ok(Calibration { window: config.window, messages: config.messages, points })
}

/// The two roles' one message type.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum WireMsg {
    Data(Vec<u8>),
    Ack,
}

/// What a side records: its thread's CPU time when measuring starts and ends.
#[derive(Default)]
struct Probe {
    started: Option<Duration>,
    ended: Option<Duration>,
    count: u64,
}

impl Probe {
    /// Counts one message; reads the thread's CPU clock at the window's two ends.
    fn tick(&mut self, warmup: u64, messages: u64) {
        self.count += 1;
        if self.count == warmup {
            self.started = Some(cpu_clock::now());
        }
        if self.count == warmup + messages {
            self.ended = Some(cpu_clock::now());
        }
    }
    fn spent(&self) -> Option<Duration> {
        Some(self.ended?.saturating_sub(self.started?))
    }
}

struct Sender {
    payload: usize,
    window: usize,
    total: u64,
    sent: u64,
    probe: Arc<Mutex<Probe>>,
    warmup: u64,
    messages: u64,
}

impl Sender {
    fn send_one(&mut self, ctx: &mut Ctx<'_, WireMsg>) {
        if self.sent < self.total {
            self.sent += 1;
            ctx.send(NodeId(1), WireMsg::Data(vec![0xA5; self.payload]));
        }
    }
}

impl Process for Sender {
    type Msg = WireMsg;
    fn on_start(&mut self, ctx: &mut Ctx<'_, WireMsg>) {
        for _ in 0..self.window {
            self.send_one(ctx);
        }
    }
    fn on_message(&mut self, ctx: &mut Ctx<'_, WireMsg>, _from: NodeId, msg: WireMsg) {
        if matches!(msg, WireMsg::Ack) {
            self.probe.lock().unwrap_or_else(|e| e.into_inner()).tick(self.warmup, self.messages);
            self.send_one(ctx);
        }
    }
    fn on_timer(&mut self, _ctx: &mut Ctx<'_, WireMsg>, _timer: TimerId) {}
}

struct Receiver {
    probe: Arc<Mutex<Probe>>,
    warmup: u64,
    messages: u64,
}

impl Process for Receiver {
    type Msg = WireMsg;
    fn on_start(&mut self, _ctx: &mut Ctx<'_, WireMsg>) {}
    fn on_message(&mut self, ctx: &mut Ctx<'_, WireMsg>, from: NodeId, msg: WireMsg) {
        if let WireMsg::Data(_) = msg {
            self.probe.lock().unwrap_or_else(|e| e.into_inner()).tick(self.warmup, self.messages);
            ctx.send(from, WireMsg::Ack);
        }
    }
    fn on_timer(&mut self, _ctx: &mut Ctx<'_, WireMsg>, _timer: TimerId) {}
}

/// Runs `role` as node `me` on a thread of its own until its probe has counted `want`
/// messages or `deadline` passes.
#[allow(clippy::disallowed_methods)] // a benchmark of the real host: the wall clock bounds it
fn node_thread<P: Process + Send + 'static>(
    cfg: Arc<ClusterConfig>,
    me: NodeId,
    listener: std::net::TcpListener,
    role: P,
    probe: Arc<Mutex<Probe>>,
    want: u64,
    deadline: Instant,
) -> std::thread::JoinHandle<Result<(), String>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        runtime.block_on(async move {
            let opts = NodeOptions { history: HistorySink::Discard, ..NodeOptions::with_seed(1).listener(listener) };
            let node = spawn_node(cfg, me, role, opts).await.map_err(|e| e.to_string())?;
            while probe.lock().unwrap_or_else(|e| e.into_inner()).count < want && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            node.shutdown().await.map(|_| ()).map_err(|e| e.to_string())
        })
    })
}

#[allow(clippy::disallowed_methods)] // a benchmark of the real host: the wall clock bounds it and gives its rate
fn measure(config: &CalibrationConfig, payload_bytes: usize) -> Result<SizePoint, CalibrationError> {
    let setup = |e: std::io::Error| CalibrationError::Setup(e.to_string());
    let listeners = [
        std::net::TcpListener::bind("127.0.0.1:0").map_err(setup)?,
        std::net::TcpListener::bind("127.0.0.1:0").map_err(setup)?,
    ];
    let specs = listeners
        .iter()
        .enumerate()
        .map(|(i, l)| {
            Ok(NodeSpec { id: NodeId(i as u32), addr: l.local_addr()?, region: "sc".into(), role: String::new() })
        })
        .collect::<Result<Vec<_>, std::io::Error>>()
        .map_err(setup)?;
    let cfg = Arc::new(
        ClusterConfig::new("wire-calibration", LatencyMatrix::gcp(), specs)
            .map_err(|e| CalibrationError::Setup(e.to_string()))?,
    );
    let want = config.warmup + config.messages;
    let (sender_probe, receiver_probe) =
        (Arc::new(Mutex::new(Probe::default())), Arc::new(Mutex::new(Probe::default())));
    let sender = Sender {
        payload: payload_bytes,
        window: config.window,
        total: want + config.window as u64,
        sent: 0,
        probe: sender_probe.clone(),
        warmup: config.warmup,
        messages: config.messages,
    };
    let receiver = Receiver { probe: receiver_probe.clone(), warmup: config.warmup, messages: config.messages };
    let deadline = Instant::now() + config.timeout;
    let [l0, l1] = listeners;
    let wall = Instant::now();
    let receiving = node_thread(cfg.clone(), NodeId(1), l1, receiver, receiver_probe.clone(), want, deadline);
    let sending = node_thread(cfg, NodeId(0), l0, sender, sender_probe.clone(), want, deadline);
    for handle in [sending, receiving] {
        handle
            .join()
            .map_err(|_| CalibrationError::Setup("a node thread panicked".into()))?
            .map_err(CalibrationError::Setup)?;
    }
    let wall = wall.elapsed();
    let (s, r) = (
        sender_probe.lock().unwrap_or_else(|e| e.into_inner()),
        receiver_probe.lock().unwrap_or_else(|e| e.into_inner()),
    );
    let (Some(sender_cpu), Some(receiver_cpu)) = (s.spent(), r.spent()) else {
        return Err(CalibrationError::Timeout {
            payload_bytes,
            done: s.count.min(r.count),
            want,
            timeout: config.timeout,
        });
    };
    let per = |d: Duration| d.as_nanos() as f64 / config.messages as f64;
    Ok(SizePoint {
        payload_bytes,
        encoded_bytes: postcard::experimental::serialized_size(&WireMsg::Data(vec![0; payload_bytes])).unwrap_or(0),
        sender_ns_per_message: per(sender_cpu),
        receiver_ns_per_message: per(receiver_cpu),
        messages_per_s: want as f64 / wall.as_secs_f64().max(1e-9),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_line_and_splits_the_minimal_message_evenly() {
        let point = |encoded_bytes: usize, sender: f64, receiver: f64| SizePoint {
            payload_bytes: encoded_bytes,
            encoded_bytes,
            sender_ns_per_message: sender,
            receiver_ns_per_message: receiver,
            messages_per_s: 1.0,
        };
        // sender = 4000 + 0.5 b, receiver = 6000 + 0.25 b.
        let c = Calibration {
            window: 1,
            messages: 1,
            points: vec![point(0, 4000.0, 6000.0), point(1000, 4500.0, 6250.0), point(4000, 6000.0, 7000.0)],
        };
        let w = c.wire_cost();
        assert!((w.send_ns_base - 2500.0).abs() < 1e-6, "{w:?}");
        assert!((w.receive_ns_base - 2500.0).abs() < 1e-6, "{w:?}");
        assert!((w.send_ns_per_byte - 0.5).abs() < 1e-9 && (w.receive_ns_per_byte - 0.25).abs() < 1e-9, "{w:?}");
        // One size: no slope, the mean as the intercept.
        assert_eq!(fit_line(&[3.0, 3.0], &[1.0, 3.0]), (2.0, 0.0));
    }

    /// Two real nodes over loopback: every size completes, both sides spend CPU, and the
    /// encoded size is what the simulator computes for that message.
    #[test]
    fn a_small_calibration_runs_over_loopback() {
        let config =
            CalibrationConfig { payload_bytes: vec![8, 2048], warmup: 50, messages: 200, ..Default::default() };
        let mut seen = Vec::new();
        let c = calibrate(&config, |done, total| seen.push((done, total))).expect("loopback works");
        assert_eq!(seen, vec![(1, 2), (2, 2)]);
        for p in &c.points {
            assert!(p.sender_ns_per_message > 0.0 && p.receiver_ns_per_message > 0.0, "{p:?}");
        }
        // postcard: the variant (1 byte), the length (varint: 1 or 2 bytes), the bytes.
        assert_eq!((c.points[0].encoded_bytes, c.points[1].encoded_bytes), (8 + 2, 2048 + 3));
        let w = c.wire_cost();
        assert!(w.send(100) > Duration::ZERO && w.receive(100) > Duration::ZERO, "{w:?}");
    }

    #[test]
    fn a_bad_shape_is_an_error() {
        let bad = CalibrationConfig { payload_bytes: vec![], ..CalibrationConfig::default() };
        assert!(matches!(calibrate(&bad, |_, _| {}), Err(CalibrationError::Shape)));
    }
}
