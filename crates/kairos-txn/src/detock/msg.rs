//! Detock's messages: submissions to the home of every involved shard and the replies, the
//! replication of each home's log batches to its shard's followers, the log exchange between
//! homes, and the pulls that repair loss.

use kairos_workload::tpcc::{PreReadAnswer, PreReadRequest};
use std::sync::Arc;

use kairos_workload::txn::{Key, ShardId, TxnId, Value};
use kairos_workload::Pieces;
use serde::{Deserialize, Serialize};

/// A transaction as a home logged it: its id, *all* its keys (every home that reads the
/// entry learns the transaction's other shards from them, and can log it itself) and all its
/// pieces (TPC-C).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedTxn {
    pub txn: TxnId,
    pub keys: Vec<Key>,
    pub pieces: Pieces,
}

/// One batch of a home's log: what it logged in one batch interval, in log order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub shard: ShardId,
    /// 1, 2, … per shard (only non-empty batches are numbered).
    pub number: u64,
    pub txns: Vec<LoggedTxn>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DetockMsg {
    /// Coordinator → the home of each involved shard: log this transaction (all its keys and
    /// pieces).
    Submit { txn: TxnId, keys: Vec<Key>, pieces: Pieces },
    /// Home of `shard` → coordinator: `txn` executed there; the value each of its keys on
    /// `shard` held before the increment.
    Reply { txn: TxnId, shard: ShardId, reads: Vec<(Key, Value)> },
    /// Home → its shard's followers: store this batch (synchronous geo-replication).
    Append(Arc<Batch>),
    /// Follower → home: batch `number` of `shard` is stored.
    AppendAck { shard: ShardId, number: u64 },
    /// Home → every home (itself included): a replicated batch of its log, to order by.
    LogSync(Arc<Batch>),
    /// A home missing `shard`'s batches from `from` on asks that shard's home for them again.
    SyncFetch { shard: ShardId, from: u64 },
    /// Coordinator → a replica of the customer's shard: a by-name TPC-C transaction's
    /// pre-read (`kairos_workload::tpcc::pre_read`).
    PreRead(PreReadRequest),
    /// Replica → coordinator: the pre-read's answer.
    PreReadAnswer(PreReadAnswer),
}

kairos_workload::impl_pre_read_msg!(DetockMsg);
