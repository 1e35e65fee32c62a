//! # kairos-sim — a deterministic simulator of a wide-area deployment
//!
//! The simulator hosts sans-IO roles ([`kairos_core::Process`]) in virtual true time. It owns
//! everything a role must not touch:
//!
//! - **Time and clocks.** True time ([`kairos_core::SimTime`]) advances from event to event.
//!   Each node reads its own [`kairos_clock::SimClock`] (offset, drift, jitter, steps), so
//!   clocks disagree as they do in a real deployment.
//! - **Network.** A message from region a to region b arrives after the one-way delay of the
//!   [`kairos_core::LatencyMatrix`] (RTT / 2 of the reference table) ± jitter. Links are FIFO
//!   unless reordering is switched on; messages can be lost or duplicated; links can be cut
//!   symmetrically (partitions) or in one direction only.
//! - **Faults.** Crash (the role instance, its timers and inbox are dropped: volatile state is
//!   lost) and restart (a fresh instance from the node's factory), crashes mid-write and lost
//!   disks, partitions and their healing, clock steps, loss, duplication and replay of old
//!   messages, pauses (a node stops with its state kept), slow nodes (what one node sends
//!   arrives late, in order) — scripted ("at t do x") or drawn from the seed
//!   ([`fault::random_plan`], swarm testing).
//! - **CPU.** A node runs one handler at a time and each handler costs service time
//!   ([`CpuModel`]: free, fixed, or the handler's real measured CPU time plus a calibrated
//!   [`WireCost`] per message sent and received), so a node offered more work than it can
//!   serve builds a queue and saturation is real.
//! - **Evidence.** Roles' history events are stamped with true time into a Jepsen-shaped
//!   history for the checkers of `kairos-check`; every handled event is folded into a trace
//!   hash, so the same seed gives the same hash, bit for bit.
//!
//! Events are ordered by (time, sequence number). Every random choice — network jitter and
//! loss, every node's clock noise and its role's generator — derives from [`SimConfig::seed`].

mod config;
pub mod fault;
pub mod pingpong;
mod queue;
mod trace;
mod world;

pub mod cpu_clock;
pub use config::{CpuModel, Limits, NetworkConfig, SimConfig, WireCost};
pub use fault::{Fault, FaultKinds, FaultRates, ScheduledFault};
pub use trace::{TraceEntry, TraceKind};
pub use world::{AloneCost, Role, RoleFactory, Sim, SimStats, Violation, WorldCheck};
