//! # kairos-consensus — replication components that protocol roles embed
//!
//! - [`paxos`]: durable Multi-Paxos, a sans-IO component (not a node) that an embedding role
//!   feeds messages and timers. The classic transaction stacks in `kairos-txn` replicate each
//!   shard's 2PC records with it; Tiga's view manager replicates its sequence of views with it.
//!
//! It depends on `kairos-core` only, so any protocol crate can use it.

pub mod paxos;
