//! How a simulated world behaves: network, CPU service model, limits.

use std::time::Duration;

/// The network between nodes. Delays come from the [`kairos_core::LatencyMatrix`] of the
/// world; these knobs add noise and unreliability on top.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkConfig {
    /// Each delivery's delay is the matrix one-way delay × (1 + u), u uniform in
    /// `[-jitter_ratio, +jitter_ratio]`. 0 disables jitter.
    pub jitter_ratio: f64,
    /// Links are FIFO by default (a later message never overtakes an earlier one on the same
    /// directed link). With `reorder`, jitter may reorder messages.
    pub reorder: bool,
    /// Probability that a message is lost.
    pub loss: f64,
    /// Probability that a message is delivered twice (the copy gets its own jitter).
    pub duplicate: f64,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig { jitter_ratio: 0.02, reorder: false, loss: 0.0, duplicate: 0.0 }
    }
}

/// How much simulated CPU time a handler costs. A node runs one handler at a time; events that
/// arrive while it is busy wait in its inbox, so a node offered more work than its service time
/// allows builds a queue and latency grows — saturation is real.
#[derive(Clone, Debug, PartialEq)]
pub enum CpuModel {
    /// Handlers take no time (pure protocol latency, infinite capacity).
    Free,
    /// Every handler costs the same fixed service time.
    Fixed(Duration),
    /// Every handler costs its real measured CPU time × `scale` (plus `floor`), plus what a
    /// real host spends on the messages it received and sent (`wire`), so saturation
    /// throughput reflects the real efficiency of the code. Not bit-for-bit reproducible:
    /// measured costs vary from run to run, so the trace hash does too.
    Measured { scale: f64, floor: Duration, wire: WireCost },
}

impl CpuModel {
    /// The handler's measured CPU time and nothing else (no per-message cost).
    pub const MEASURED: CpuModel = CpuModel::Measured { scale: 1.0, floor: Duration::ZERO, wire: WireCost::ZERO };
}

/// What a real host spends on one message beyond the role's handler — encoding, framing,
/// checksumming, the system calls and the wake-ups on each side, decoding — as a linear
/// function of its encoded size (postcard bytes). The simulator never serializes a message or
/// makes a system call, so without it a protocol that sends twice as many messages pays
/// nothing for them. `kairos bench net` measures it on the TCP host of `kairos-net`; a message
/// a node sends to itself costs nothing (the host loops it back without TCP).
#[derive(Clone, Copy, Debug, PartialEq, Default, serde::Serialize)]
pub struct WireCost {
    pub send_ns_base: f64,
    pub send_ns_per_byte: f64,
    pub receive_ns_base: f64,
    pub receive_ns_per_byte: f64,
}

impl WireCost {
    pub const ZERO: WireCost =
        WireCost { send_ns_base: 0.0, send_ns_per_byte: 0.0, receive_ns_base: 0.0, receive_ns_per_byte: 0.0 };

    /// A flat cost per message, split evenly between its sender and its receiver.
    pub fn flat(per_message: Duration) -> WireCost {
        let half = per_message.as_secs_f64() * 1e9 / 2.0;
        WireCost { send_ns_base: half, receive_ns_base: half, ..WireCost::ZERO }
    }

    pub fn is_zero(&self) -> bool {
        *self == WireCost::ZERO
    }

    /// The sender's cost of a message of `bytes` encoded bytes.
    pub fn send(&self, bytes: usize) -> Duration {
        Duration::from_nanos((self.send_ns_base + self.send_ns_per_byte * bytes as f64).max(0.0) as u64)
    }

    /// The receiver's cost of a message of `bytes` encoded bytes.
    pub fn receive(&self, bytes: usize) -> Duration {
        Duration::from_nanos((self.receive_ns_base + self.receive_ns_per_byte * bytes as f64).max(0.0) as u64)
    }
}

/// Limits, so a runaway protocol fails loudly instead of exhausting memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Events waiting in one node's inbox (CPU model busy). Beyond it, messages are dropped
    /// (counted as `dropped_overload`), as an overloaded NIC would.
    pub inbox_max: usize,
    /// Events pending in the whole simulation.
    pub pending_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { inbox_max: 1 << 20, pending_max: 1 << 26 }
    }
}

/// Everything a simulated world needs besides its nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// The one seed every random choice derives from (network, clocks, every node's rng).
    pub seed: u64,
    pub network: NetworkConfig,
    pub cpu: CpuModel,
    pub limits: Limits,
    /// Keep a log of every handled event (for tests and `kairos sim --trace`); costs memory.
    pub keep_trace_log: bool,
    /// Call each role's [`kairos_core::Process::invariants`] after every handler, and stop the
    /// run at the first violation ([`crate::Sim::violation`]). On by default: they are cheap.
    pub check_invariants: bool,
}

impl SimConfig {
    pub fn new(seed: u64) -> Self {
        SimConfig {
            seed,
            network: NetworkConfig::default(),
            cpu: CpuModel::Free,
            limits: Limits::default(),
            keep_trace_log: false,
            check_invariants: true,
        }
    }
}
