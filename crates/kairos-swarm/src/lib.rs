//! # kairos-swarm — SWARM-KV (SOSP 2024) over passive memory nodes
//!
//! Memory nodes are byte arrays that execute one-sided **verbs** only ([`verbs`]): read,
//! write, 64-bit compare-and-swap, and ordered chains of verbs on one connection (applied in
//! order, never atomically as a group). Everything else — replication, concurrency control,
//! the key-value store — runs in clients.

pub mod verbs;

pub mod backend;
