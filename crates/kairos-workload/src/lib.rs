//! # kairos-workload — the work the protocols run
//!
//! Tiga and its peers (`kairos-txn`) are compared on identical work, and so are SWARM-KV and its
//! peers, so what defines that work lives here, outside every protocol crate; no protocol crate
//! depends on another.
//!
//! - [`txn`]: the vocabulary — transaction ids, timestamps, keys, values, shards, and a byte
//!   key's 64-bit identity.
//! - [`shards`]: who serves which shard ([`Topology`]) and where leaders sit ([`Placement`]).
//! - [`micro`]: the Tiga paper's MicroBench ([`MicroBench`]: Zipf over all keys, 3 keys per
//!   transaction) and a fixed replay for tests, behind one [`TxnSource`] trait.
//! - [`open_loop`]: Poisson arrivals on their own schedule ([`OpenLoop`]).
//! - [`admission`]: the adaptive in-flight limit that refuses open-loop arrivals the servers
//!   cannot take ([`AdmissionLimit`]), so that throughput does not collapse past saturation.
//! - [`history`]: how an increment transaction is recorded for the history checkers.
//! - [`tpcc`]: the TPC-C transaction mix (types, session kinds and weights, 44/44/4/4/4), the
//!   documents of the causal evaluation's scaled-down database, and the Tiga paper's
//!   transactional TPC-C: warehouses' tables, conflict keys, one-shot pieces and pre-reads, and
//!   the consistency conditions.
//! - [`ycsb`]: YCSB A and B over a fixed key set with scrambled Zipf 0.99 (the SWARM paper's
//!   workloads), and the key and value bytes whose value ids a key-value history records.
//!
//! Every random draw takes the caller's generator (a node's seeded `ctx.rng()`), so a run is
//! reproducible from its seed.

pub mod admission;
pub mod history;
pub mod micro;
pub mod open_loop;
pub mod shards;
pub mod tpcc;
pub mod txn;
pub mod ycsb;

pub use admission::{path_of_shards, AdmissionLimit, Finish, Path};
pub use micro::{
    reads_only, FixedKeys, KindSample, MicroBench, Pieces, TxnSource, TxnWork, WorkloadError, KIND_SAMPLES_MAX,
};
pub use open_loop::OpenLoop;
pub use shards::{decimal_key, shard_of, Partitioner, Placement, Topology};
pub use txn::{history_key, key_id, Key, ShardId, Ts, TxnId, Value};
