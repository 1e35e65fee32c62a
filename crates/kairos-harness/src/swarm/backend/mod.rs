//! Real memory backends: memory nodes that live outside the simulator.
//!
//! - [`shm`]: one region per node in `/dev/shm` (CXL-style shared memory), usable by threads and
//!   by separate processes; a crash is a flag in the region's header that clients honour.
//! - [`tcp`]: a tiny memory server that executes only verb frames, and its client; a crash is a
//!   killed server (process or in-process instance).
//!
//! Both present one client's view of all nodes as a [`MemoryPort`]: [`MemoryPort::submit`]
//! hands a [`Chain`] to its node and returns at once; its outcomes come back later from
//! [`MemoryPort::poll`]. This is the shape of the sans-IO clients (`Issue { tag, chain }` out,
//! `on_reply(tag, ..)` in) and of RDMA (post a work request, poll the completion queue), so one
//! driver loop per client thread runs any protocol with several operations in flight over
//! either backend, without an async runtime in the measured path. Chains submitted to one node
//! through one port complete in submission order (one ordered channel per (client, node)); a
//! chain to a crashed node never completes, which leaves the protocol's timeout path to act.
//!
//! The shared-memory port executes a chain inside `submit` (a CPU load/store is the "round
//! trip") and queues its completion; the TCP port writes a frame and a reader thread per
//! connection queues completions as replies arrive.

pub mod atomic;
pub mod shm;
pub mod tcp;

use std::time::Duration;

use thiserror::Error;

use kairos_swarm::verbs::{Chain, MemNodeId, VerbError, VerbOutcome};

/// Most chains one port may have in flight to one node (bounds every client-side queue).
pub const PORT_IN_FLIGHT_MAX: usize = 1024;

/// A chain's outcomes, delivered by [`MemoryPort::poll`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The tag given to [`MemoryPort::submit`].
    pub tag: u64,
    pub node: MemNodeId,
    /// One outcome per verb, or the first verb the node refused (earlier verbs were applied).
    pub result: Result<Vec<VerbOutcome>, VerbError>,
}

/// Why a backend could not be set up or a chain could not be submitted.
#[derive(Debug, Error)]
pub enum BackendError {
    #[error("memory node {node} does not exist (this backend has {nodes} nodes)")]
    NoSuchNode { node: MemNodeId, nodes: u32 },
    #[error("{in_flight} chains already in flight to memory node {node} (limit {PORT_IN_FLIGHT_MAX}): poll completions before submitting more")]
    TooManyInFlight { node: MemNodeId, in_flight: usize },
    #[error(
        "chain of {verbs} verbs needs a {bytes}-byte frame, over the {max}-byte limit: split it into smaller chains"
    )]
    ChainTooLarge { verbs: usize, bytes: u64, max: u32 },
    #[error("shared-memory region {path}: {what}")]
    Shm { path: String, what: String },
    #[error("memory server {addr}: {what}")]
    Net { addr: String, what: String },
    #[error("{0}")]
    Config(String),
}

/// One client's ordered channels to every memory node of a backend.
pub trait MemoryPort: Send {
    /// Number of memory nodes reachable through this port.
    fn nodes(&self) -> u32;

    /// Hands `chain` to `chain.node` and returns without waiting for its outcome. Chains to one
    /// node complete in the order submitted. A chain to a crashed node is accepted and never
    /// completes.
    fn submit(&mut self, tag: u64, chain: Chain) -> Result<(), BackendError>;

    /// The next completion, waiting at most `timeout` for one.
    fn poll(&mut self, timeout: Duration) -> Option<Completion>;
}

/// A set of memory nodes that clients connect to.
pub trait MemoryBackend: Send + Sync {
    fn nodes(&self) -> u32;

    /// Opens client `client`'s channels to every node (nodes that cannot be reached count as
    /// crashed: their chains never complete).
    fn connect(&self, client: u32) -> Result<Box<dyn MemoryPort>, BackendError>;

    /// Short name for reports: `shm` or `tcp`.
    fn name(&self) -> &'static str;

    /// Bytes of node addresses `start..end` of `node` that hold allocated memory (nodes are
    /// zeroed lazily, page by page), if this backend can tell.
    fn allocated_bytes_in(&self, _node: MemNodeId, _start: u64, _end: u64) -> Option<u64> {
        None
    }
}
