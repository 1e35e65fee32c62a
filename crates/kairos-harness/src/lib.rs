//! # kairos-harness — what runs the protocols outside their roles
//!
//! Protocol crates hold sans-IO roles: no threads, sockets, wall clock or checker. What a run
//! needs beyond the roles lives here: real backends, the threaded drivers that run roles on
//! them with the host clock, and the calls into the history checkers.
//!
//! | module | what it holds |
//! |---|---|
//! | [`tiga`] | Tiga's deployment in the simulator (the paper's regions, clocks, view managers, a leader crash), its runs and analytic latency |
//! | [`micro`] | the protocol-neutral MicroBench deployment: Tiga and each peer of `kairos-txn` on identical work, one outcome for all |
//! | [`swarm`] | SWARM's real memory nodes (shm, TCP), the client driver, real runs, and the per-key linearizability check of simulated and real runs |
//! | [`twopc_agreement`] | the world check of 2PL+Paxos and OCC+Paxos: a shard's replicas apply the same record in every slot |
//! | [`error`] | the error of every transactional deployment ([`DeployError`]) |
//!
//! The replica set's and the register's runners still live in their crates (the testing-tree
//! issue moves them here, one protocol at a time).

pub mod error;
pub mod micro;
pub mod swarm;
pub mod tiga;
pub mod twopc_agreement;

pub use error::DeployError;
