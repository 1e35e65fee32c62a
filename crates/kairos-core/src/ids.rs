use serde::{Deserialize, Serialize};
use std::fmt;

/// Identifies one process (a protocol role instance) in a deployment. Dense, starting at 0.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// Index of a region in a [`crate::LatencyMatrix`] (its names live in the matrix).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RegionId(pub u8);

impl RegionId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A role's own name for one of its timers. Setting a timer with an id that is already armed
/// re-arms it (the earlier deadline is forgotten).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TimerId(pub u64);
