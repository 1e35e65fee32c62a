//! Janus's messages: the pre-accept round that collects dependencies from every replica of
//! every involved shard, the accept round of the slow path, the commit with the decided
//! dependencies and the execution replies, and the inquiry a server sends for a dependency
//! whose commit it has not seen.

use kairos_workload::tpcc::{PreReadAnswer, PreReadRequest};
use kairos_workload::txn::{Key, ShardId, TxnId, Value};
use kairos_workload::Pieces;
use serde::{Deserialize, Serialize};

/// A set of shards as a bit mask (bit s = shard s; at most 64 shards).
pub type ShardSet = u64;

/// The shards of a set, lowest first.
pub fn shards_of(set: ShardSet) -> impl Iterator<Item = ShardId> {
    (0..64u32).filter(move |s| set & (1 << s) != 0)
}

/// A dependency: a conflicting transaction and the shards it touches (so that a server that
/// does not serve any of them knows whom to ask about it).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Dep {
    pub txn: TxnId,
    pub shards: ShardSet,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JanusMsg {
    /// Coordinator → every replica of each involved shard: `txn` touches `shards`; `keys` are
    /// its keys on the receiver's shard, `pieces` what it runs there besides (TPC-C). Collect
    /// its dependencies there.
    PreAccept {
        txn: TxnId,
        shards: ShardSet,
        keys: Vec<Key>,
        pieces: Pieces,
    },
    /// Replica `replica` of `shard` → coordinator: the transactions `txn` depends on there.
    PreAcceptOk {
        txn: TxnId,
        shard: ShardId,
        replica: u32,
        deps: Vec<Dep>,
    },
    /// Coordinator → every replica of each involved shard (the slow path): record `deps`.
    Accept {
        txn: TxnId,
        shards: ShardSet,
        deps: Vec<Dep>,
    },
    AcceptOk {
        txn: TxnId,
        shard: ShardId,
        replica: u32,
    },
    /// Coordinator → every replica of each involved shard: `txn` is committed with `deps`;
    /// `keys` are its keys on the receiver's shard. `reply`: send the values read once executed.
    Commit {
        txn: TxnId,
        shards: ShardSet,
        keys: Vec<Key>,
        pieces: Pieces,
        deps: Vec<Dep>,
        reply: bool,
    },
    /// A replica of `shard` → coordinator: `txn` executed there; the value each of its keys on
    /// that shard held before the increment.
    Executed {
        txn: TxnId,
        shard: ShardId,
        reads: Vec<(Key, Value)>,
    },
    /// A server → a server of one of `txn`'s shards: tell me `txn`'s commit once you know it.
    Inquire {
        txn: TxnId,
    },
    /// The answer to an inquiry.
    InquireReply(Answer),
    /// Coordinator → a replica of the customer's shard: a by-name TPC-C transaction's
    /// pre-read (`kairos_workload::tpcc::pre_read`).
    PreRead(PreReadRequest),
    /// Replica → coordinator: the pre-read's answer.
    PreReadAnswer(PreReadAnswer),
}

kairos_workload::impl_pre_read_msg!(JanusMsg);

/// A server's answer to an inquiry: `txn`'s shards and committed dependencies, and its keys
/// on `shard` (the answering server's shard), so that a lagging replica of that shard can
/// execute it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub txn: TxnId,
    pub shards: ShardSet,
    pub deps: Vec<Dep>,
    pub shard: ShardId,
    pub keys: Vec<Key>,
    pub pieces: Pieces,
}
