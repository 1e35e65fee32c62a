//! Tapir's wire vocabulary: the unlogged read, IR's consensus operation (prepare) with its
//! finalize round, IR's inconsistent operations (commit, abort), and a ping that lets a
//! coordinator find the closest replica of every shard.

use kairos_workload::tpcc::{PreReadAnswer, PreReadRequest};
use kairos_workload::txn::{Key, ShardId, Ts, TxnId, Value};
use kairos_workload::Pieces;
use serde::{Deserialize, Serialize};

/// Identifies one IR consensus operation (one prepare) of a transaction: the shell's attempt
/// (a retry after an abort) and the prepare round within it (a re-prepare at a later
/// timestamp after RETRY). Ordered: a replica ignores operations older than the newest it has
/// seen for the transaction.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OpId {
    pub txn: TxnId,
    pub attempt: u32,
    pub round: u32,
}

/// A replica's TAPIR-OCC-CHECK result (paper, Figure 8).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PrepareResult {
    /// Validated; the transaction is in the replica's prepared list at its timestamp.
    Ok,
    /// A read is stale (a newer version is committed): the transaction cannot commit.
    Abort,
    /// A conflicting transaction is prepared here; this replica cannot vote yes.
    Abstain,
    /// The proposed timestamp is too small for a write; a timestamp ≥ the one given would pass.
    Retry(Ts),
}

/// A value read in the execution phase and the version (commit timestamp) that wrote it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadResult {
    pub key: Key,
    pub value: Value,
    pub version: Ts,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TapirMsg {
    /// Coordinator → any replica: how far are you (answered with `Pong`, same `nonce`).
    Ping {
        nonce: u64,
    },
    Pong {
        nonce: u64,
        shard: ShardId,
        replica: u32,
    },
    /// Coordinator → the closest replica of a shard: IR unlogged operation, the execution
    /// phase's reads (latest committed value and version of each key).
    Read {
        txn: TxnId,
        attempt: u32,
        keys: Vec<Key>,
    },
    ReadReply {
        txn: TxnId,
        attempt: u32,
        shard: ShardId,
        replica: u32,
        values: Vec<ReadResult>,
    },
    /// Coordinator → every replica of a shard: IR consensus operation, TAPIR-OCC-CHECK of the
    /// shard's read set (with the versions read) and write set at timestamp `ts`.
    Prepare {
        op: OpId,
        shard: ShardId,
        ts: Ts,
        reads: Vec<(Key, Ts)>,
        writes: Vec<Key>,
    },
    PrepareReply {
        op: OpId,
        shard: ShardId,
        replica: u32,
        result: PrepareResult,
    },
    /// Coordinator → every replica of a shard: IR slow path, the consensus result the
    /// coordinator decided from f + 1 replies (only PREPARE-OK needs to be made durable).
    Finalize {
        op: OpId,
        shard: ShardId,
        ts: Ts,
        reads: Vec<(Key, Ts)>,
        writes: Vec<Key>,
        result: PrepareResult,
    },
    FinalizeReply {
        op: OpId,
        shard: ShardId,
        replica: u32,
    },
    /// Coordinator → every replica of a shard: IR inconsistent operation, apply the writes at
    /// the commit timestamp `ts` (which becomes their version) and drop the prepared entry.
    /// `reads` are the shard's keys with the versions the execution phase read, `pieces` the
    /// transaction's TPC-C pieces for the shard's warehouses (none for MicroBench): a replica
    /// runs them once its store holds exactly the versions read (see [`super::replica`]).
    Commit {
        op: OpId,
        shard: ShardId,
        ts: Ts,
        reads: Vec<(Key, Ts)>,
        writes: Vec<(Key, Value)>,
        pieces: Pieces,
    },
    /// IR inconsistent operation: drop the prepared entry of `op` (or older) of the transaction.
    Abort {
        op: OpId,
        shard: ShardId,
    },
    /// Replica → coordinator: the commit or abort of `op` is applied here.
    Done {
        op: OpId,
        shard: ShardId,
        replica: u32,
    },
    /// Coordinator → a replica of the customer's shard: a by-name TPC-C transaction's
    /// pre-read (`kairos_workload::tpcc::pre_read`).
    PreRead(PreReadRequest),
    /// Replica → coordinator: the pre-read's answer.
    PreReadAnswer(PreReadAnswer),
}

kairos_workload::impl_pre_read_msg!(TapirMsg);
