//! # kairos-txn — Tiga's peers, on the same simulator, workload and history as Tiga
//!
//! The Tiga paper compares Tiga with its peers in one codebase; so does Kairos. This crate
//! holds the peers and what they share:
//!
//! - [`shell`]: the client side every coordinator embeds — open-loop arrivals (MicroBench or
//!   TPC-C), Jepsen process slots and the history encoding (identical to Tiga's, so one checker
//!   reads every protocol's history), abort-and-retry, and protocol-neutral counters.
//! - [`store`]: the shard store the peers execute on (in a TPC-C deployment, also the shard's
//!   warehouses, on which a transaction's pieces run).
//! - [`peer`]: how a peer plugs into a deployment ([`Peer`]: its roles and knobs, and whether
//!   it runs TPC-C's pieces). `kairos_harness::micro::Bench` runs any peer, and Tiga, on the
//!   identical workload, placement, clocks and seed, and checks the properties over all its
//!   nodes.
//! - [`tpl`]: 2PL+Paxos (wound-wait two-phase locking, two-phase commit whose records are
//!   replicated through each shard's Multi-Paxos group, `kairos_consensus::paxos`).
//! - [`occ`]: OCC+Paxos (optimistic execution, validation, two-phase commit over Multi-Paxos).
//! - [`twopc`]: what 2PL+Paxos and OCC+Paxos share (messages, log records, coordinator, server).
//! - [`tapir`]: Tapir (inconsistent replication with optimistic concurrency control).
//! - [`ncc`]: NCC+ (NCC's timestamp rules and response timing control at the shard leaders,
//!   prepare and decision records replicated over Multi-Paxos).
//! - [`janus`]: Janus (dependency tracking at every replica of every involved shard, a fast
//!   path when they agree, execution by strongly connected components in a shared order).
//! - [`calvin`]: Calvin+ (Calvin's deterministic epochs, each shard's epoch log replicated by
//!   Nezha-style deadline-ordered multicast).
//! - [`detock`]: Detock (a log per home, replicated across regions and exchanged between
//!   homes; cycles between the logs resolved alike by every executor).

pub mod calvin;
pub mod detock;
pub mod janus;
pub mod ncc;
pub mod occ;
pub mod peer;
pub mod shell;
pub mod store;
pub mod tapir;
pub mod tpl;
pub mod twopc;

pub use peer::Peer;
pub use shell::{Attempt, ShellConfig, TxnShell, TxnStats};
