//! # kairos-swarm — SWARM-KV (SOSP 2024) over passive memory nodes
//!
//! Memory nodes are byte arrays that execute one-sided **verbs** only ([`verbs`]): read,
//! write, 64-bit compare-and-swap, and ordered chains of verbs on one connection (applied in
//! order, never atomically as a group). Everything else — replication, concurrency control,
//! the key-value store — runs in clients.
//!
//! * [`client`]: the sans-IO client interface ([`client::KvClient`]) that SWARM-KV, DM-ABD and
//!   RAW implement and that every backend drives;
//! * [`layout`]: where keys, metadata words, buffers, in-place copies and locks live in a node.

pub mod client;
pub mod layout;
pub mod verbs;

pub mod backend;
pub mod driver;
