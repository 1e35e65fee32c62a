//! # kairos-core — the vocabulary every Kairos crate shares
//!
//! Kairos writes every protocol role (a Tiga server, a SWARM client, a replica-set member, a
//! baseline's coordinator, …) as a **sans-IO state machine**: a plain struct implementing
//! [`Process`], which reacts to exactly three inputs — start, a message, a timer — and answers
//! with [`Effect`]s pushed through a [`Ctx`]: send a message, set or cancel a timer, record a
//! client-visible [`HistoryEvent`], emit a metric. A role reads time only through
//! [`Ctx::now`] (its own, possibly skewed, [`LocalTime`]) and draws randomness only from
//! [`Ctx::rng`], a generator seeded by its host.
//!
//! Because of that the same role code runs unchanged in the deterministic simulator
//! (`kairos-sim`) and as a real process over TCP (`kairos-net`).
//!
//! The crate also holds the pieces both hosts need: node and region ids, time newtypes
//! ([`SimTime`] is true time, only the simulator sees it; [`LocalTime`] is a node's clock
//! reading), the history event shape that the checkers in `kairos-check` read, and the
//! region-to-region [`LatencyMatrix`] loaded from the reference RTT table, and
//! [`harness::RoleHarness`], a host for one role in a unit test.

mod error;
pub mod harness;
pub mod history;
mod ids;
mod process;
mod time;
pub mod topology;

pub use error::CoreError;
pub use history::{HistoryEvent, MicroOp, OpType, ReadValue};
pub use ids::{check_timer_encoding, NodeId, RegionId, Timer, TimerId};
pub use process::{Ctx, Effect, Message, Persist, Process, Rng, Stored};
pub use time::{duration_nanos, LocalTime, SimTime};
pub use topology::LatencyMatrix;
