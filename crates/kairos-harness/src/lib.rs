//! # kairos-harness — what runs the protocols outside their roles
//!
//! Protocol crates hold sans-IO roles: no threads, sockets, wall clock or checker. What a run
//! needs beyond the roles lives here: the deployments in the simulator, real backends, the
//! threaded drivers that run roles on them with the host clock, and the calls into the
//! history checkers.
//!
//! | module | what it holds |
//! |---|---|
//! | [`deployment`] | the deployment every transaction protocol shares (regions, placement, clocks, MicroBench load, loss): Tiga's runner and the bench add their knobs to it |
//! | [`tiga`] | Tiga's deployment in the simulator (the paper's regions, clocks, view managers, a leader crash), its runs and analytic latency |
//! | [`micro`] | the protocol-neutral MicroBench deployment: Tiga and each peer of `kairos-txn` on identical work, one outcome for all |
//! | [`causal`] | the replica set with causally consistent sessions in the simulator (3 or 5 members, list-append or TPC-C sessions, scripted or random faults) |
//! | [`register`] | the multi-writer ABD register's deployment in the simulator (replicas in sc / fi / br, clients everywhere) |
//! | [`swarm`] | SWARM's simulated runs, its real memory nodes (shm, TCP), the client driver, real runs, and the per-key linearizability check of simulated and real runs |
//! | [`oplog_agreement`] | the world check of the replica set: committed oplog entries agree across members and stay on a majority |
//! | [`twopc_agreement`] | the world check of 2PL+Paxos and OCC+Paxos: a shard's replicas apply the same record in every slot |
//! | [`tapir_agreement`] | the world check of Tapir: every replica of every shard decides each transaction attempt alike (commit timestamp or abort) |
//! | [`wire_calibration`] | what one message costs the TCP host, measured over loopback (`kairos bench net`): the simulator's per-message cost |
//! | [`error`] | the one error of every simulated deployment ([`DeployError`]) |
//!
//! Every simulated runner lives here, so no protocol crate depends on the simulator, the
//! checker, the TCP host or tokio (`crates/kairos/tests/dependencies.rs` checks it).

pub mod calvin_agreement;
pub mod causal;
pub mod deployment;
pub mod error;
pub mod janus_agreement;
pub mod micro;
pub mod oplog_agreement;
pub mod register;
pub mod swarm;
pub mod tapir_agreement;
pub mod tiga;
pub mod twopc_agreement;
pub mod wire_calibration;

pub use deployment::{window_throughput, TxnDeployment};
pub use error::DeployError;
