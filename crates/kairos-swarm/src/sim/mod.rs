//! The roles that stand in for SWARM's machines in the simulator: memory nodes
//! ([`memory_node::MemoryNode`]) and client machines ([`client_node::ClientNode`]), and the
//! message between them. The deployment and its runs (`SwarmRun`) live in
//! `kairos_harness::swarm::sim`.

pub mod client_node;
pub mod memory_node;

use crate::verbs::{Chain, VerbError, VerbOutcome};
use serde::{Deserialize, Serialize};

/// What travels between clients and memory nodes in the simulator.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum SwarmMsg {
    /// Execute `chain`; `prefix` (a crashing client) applies only that many verbs and never replies;
    /// `pause` = `(k, ns)` (the adversary) stalls the connection `ns` nanoseconds after `k` verbs.
    Chain {
        tag: u64,
        chain: Chain,
        prefix: Option<usize>,
        pause: Option<(usize, u64)>,
    },
    Reply {
        tag: u64,
        reply: Result<Vec<VerbOutcome>, VerbError>,
    },
}
