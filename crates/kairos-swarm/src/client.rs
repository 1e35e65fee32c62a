//! The sans-IO client interface every SWARM-side protocol implements (SWARM-KV, DM-ABD, RAW).
//!
//! A backend (simulator, shared memory, TCP) drives a [`KvClient`] with three inputs and
//! executes what it asks for:
//!
//! * [`KvClient::invoke`]: a new key-value operation ([`KvOp`]) with the caller's `op_id`;
//! * [`KvClient::on_reply`]: the outcomes of a [`Chain`] the client issued (tagged), or the
//!   [`VerbError`] that stopped it;
//! * [`KvClient::on_tick`]: time passes (timeouts, background work, grace periods). Call it
//!   at least every [`KvClient::tick_interval`].
//!
//! Effects go to an [`Outbox`]: chains to issue ([`Issue`], each with a tag the reply must
//! carry back) and operation completions ([`Completion`]). Many operations may be in flight per
//! client. A chain to a crashed node never gets a reply: clients detect it by timeout, drop the
//! node from their view ([`Membership`]) and carry on with the remaining majority.
//!
//! Time is the client's *local* clock ([`LocalTime`]), possibly skewed; clients never read a
//! clock themselves.

use crate::verbs::{Chain, MemNodeId, VerbError, VerbOutcome};
use kairos_core::LocalTime;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::time::Duration;
use thiserror::Error;

/// The caller's name for one operation (unique per client while in flight).
pub type OpId = u64;
/// The client's name for one issued chain; the backend hands it back with the reply.
pub type ChainTag = u64;

/// A key-value operation. Keys and values are bytes, bounded by the [`crate::layout::LayoutConfig`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvOp {
    /// The current value (`None` if the key exists but holds no value yet — never after insert).
    Get { key: Vec<u8> },
    /// Replace the value of an existing key.
    Update { key: Vec<u8>, value: Vec<u8> },
    /// Create a key with a value (or overwrite it if it exists).
    Insert { key: Vec<u8>, value: Vec<u8> },
    /// Delete a key for good: later operations on it fail with [`KvError::Deleted`].
    Delete { key: Vec<u8> },
}

impl KvOp {
    pub fn key(&self) -> &[u8] {
        match self {
            KvOp::Get { key } | KvOp::Update { key, .. } | KvOp::Insert { key, .. } | KvOp::Delete { key } => key,
        }
    }
    /// `get`, `update`, `insert` or `delete`.
    pub fn kind(&self) -> OpKind {
        match self {
            KvOp::Get { .. } => OpKind::Get,
            KvOp::Update { .. } => OpKind::Update,
            KvOp::Insert { .. } => OpKind::Insert,
            KvOp::Delete { .. } => OpKind::Delete,
        }
    }
}

/// The four operation types (for per-type statistics).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum OpKind {
    Get,
    Update,
    Insert,
    Delete,
}

impl OpKind {
    pub const ALL: [OpKind; 4] = [OpKind::Get, OpKind::Update, OpKind::Insert, OpKind::Delete];
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Get => "get",
            OpKind::Update => "update",
            OpKind::Insert => "insert",
            OpKind::Delete => "delete",
        }
    }
}

/// Why an operation failed. `Unavailable` and `Timeout` are *unknown* outcomes for writes (they
/// may have taken effect); the others certainly did not take effect.
#[derive(Clone, Debug, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum KvError {
    #[error("key of {len} bytes is longer than the configured key size of {max} bytes; raise --key-size")]
    KeyTooLong { len: usize, max: usize },
    #[error("value of {len} bytes is longer than the configured value size of {max} bytes; raise --value-size")]
    ValueTooLong { len: usize, max: usize },
    #[error("the key is empty; keys need at least one byte")]
    EmptyKey,
    #[error("unknown key: it was never inserted (insert it first)")]
    UnknownKey,
    #[error("the key was deleted; a deleted key cannot be used again")]
    Deleted,
    #[error("the index is full: no room for a new key in its bucket (raise --keys)")]
    IndexFull,
    #[error("no free out-of-place buffer: every buffer of this client is still in use (raise the buffer pool)")]
    OutOfBuffers,
    #[error("fewer than a majority of memory nodes are reachable ({alive} of {needed} needed)")]
    Unavailable { alive: usize, needed: usize },
    #[error("the operation did not finish within its deadline; it may or may not have taken effect")]
    Timeout,
    #[error("too many operations in flight ({0}); wait for completions")]
    Busy(usize),
    #[error("the timestamp space is exhausted (clock beyond the 35-bit timestamp range)")]
    TimestampExhausted,
    #[error("memory refused a verb: {0}")]
    Verb(VerbError),
    #[error("the stored copy stays torn: concurrent writes interleaved in it (RAW has no concurrency control)")]
    Corrupt,
}

/// What a history records a deletion as: a write of the checker's tombstone, which a get that
/// reports [`KvError::Deleted`] reads (so the checker holds deletions to the register's rules,
/// and to finality: no write may take effect after one). No workload writes it otherwise.
pub const DELETED_VALUE_ID: u64 = kairos_core::history::TOMBSTONE;

impl KvError {
    /// Whether a write that failed this way may still have taken effect.
    pub fn is_unknown_outcome(&self) -> bool {
        matches!(self, KvError::Timeout | KvError::Unavailable { .. } | KvError::Verb(_))
    }
}

/// A chain the client wants executed on `chain.node`, with the tag its reply must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issue {
    pub tag: ChainTag,
    pub chain: Chain,
}

/// An operation finished (linearized, as far as the caller is concerned).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub op_id: OpId,
    /// `Ok(Some(value))` for a get that found a value; `Ok(None)` for writes (and a get of a
    /// key without a value).
    pub result: Result<Option<Vec<u8>>, KvError>,
    /// Round trips on the operation's critical path (background work is not counted).
    pub round_trips: u32,
}

/// Where a client's effects go. The backend drains it after each call.
#[derive(Clone, Debug, Default)]
pub struct Outbox {
    pub issues: Vec<Issue>,
    pub completions: Vec<Completion>,
}

impl Outbox {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn issue(&mut self, tag: ChainTag, chain: Chain) {
        self.issues.push(Issue { tag, chain });
    }
    pub fn complete(&mut self, op_id: OpId, result: Result<Option<Vec<u8>>, KvError>, round_trips: u32) {
        self.completions.push(Completion { op_id, result, round_trips });
    }
    pub fn is_empty(&self) -> bool {
        self.issues.is_empty() && self.completions.is_empty()
    }
}

/// A sans-IO key-value client over passive memory nodes.
pub trait KvClient {
    /// Starts an operation. Bad input (oversized key or value) completes at once with an error.
    fn invoke(&mut self, op_id: OpId, op: KvOp, now: LocalTime, out: &mut Outbox);
    /// The reply to the chain issued with `tag`: one outcome per verb, or the error that stopped
    /// the chain. Unknown or late tags are ignored.
    fn on_reply(&mut self, tag: ChainTag, reply: Result<Vec<VerbOutcome>, VerbError>, now: LocalTime, out: &mut Outbox);
    /// Time passed: detect timeouts, run background work.
    fn on_tick(&mut self, now: LocalTime, out: &mut Outbox);
    /// How often the host should call [`KvClient::on_tick`].
    fn tick_interval(&self) -> Duration;
    /// Operations invoked and not completed yet.
    fn in_flight(&self) -> usize;
    /// Counters (`name → value`) for reports: fast paths, retries, timeouts, buffers in use.
    fn counters(&self) -> Vec<(&'static str, u64)>;
}

/// A client's view of which memory nodes are alive (good enough to survive crashes: a node that
/// misses a deadline is suspected and skipped until [`Membership::restore`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership {
    nodes: u32,
    suspected: BTreeSet<MemNodeId>,
}

impl Membership {
    pub fn new(nodes: u32) -> Self {
        Membership { nodes, suspected: BTreeSet::new() }
    }
    pub fn nodes(&self) -> u32 {
        self.nodes
    }
    pub fn is_alive(&self, n: MemNodeId) -> bool {
        n < self.nodes && !self.suspected.contains(&n)
    }
    pub fn suspect(&mut self, n: MemNodeId) {
        self.suspected.insert(n);
    }
    pub fn restore(&mut self, n: MemNodeId) {
        self.suspected.remove(&n);
    }
    pub fn suspected(&self) -> impl Iterator<Item = MemNodeId> + '_ {
        self.suspected.iter().copied()
    }
}

/// How long a chain may go unanswered before its node is suspected. Memory verbs take a few
/// microseconds; this is three orders of magnitude more.
pub const CHAIN_TIMEOUT_DEFAULT: Duration = Duration::from_millis(2);
