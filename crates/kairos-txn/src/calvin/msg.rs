//! Calvin+'s messages: submissions and replies between coordinators and sequencers, the
//! deadline-ordered multicast of each shard's epochs and its quorum replies, the epoch reports
//! to the schedulers, their results back to the sequencer, and the pulls that repair loss.

use kairos_workload::tpcc::{PreReadAnswer, PreReadRequest};
use std::sync::Arc;

use kairos_workload::txn::{Key, ShardId, TxnId, Value};
use kairos_workload::Pieces;
use serde::{Deserialize, Serialize};

/// A transaction as a sequencer batched it: its id, its (distinct) keys and its pieces (TPC-C).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchedTxn {
    pub txn: TxnId,
    pub keys: Vec<Key>,
    pub pieces: Pieces,
}

/// One epoch of one shard's sequencer: every transaction it batched in one epoch interval, in
/// batch order (possibly none), stamped with the sequencer's send time and deadline (both on
/// the sequencer's clock, nanoseconds).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochBody {
    pub shard: ShardId,
    /// 1, 2, … per shard.
    pub epoch: u64,
    pub sent_ns: u64,
    pub deadline_ns: u64,
    pub txns: Vec<BatchedTxn>,
}

/// How a replica vouches for an epoch of its shard (Nezha's two kinds of reply).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplyKind {
    /// Released at its deadline, having arrived before it (counts toward the fast quorum).
    Fast,
    /// Released, and the sequencer's own reply with the same log hash received: the replica's
    /// log is the sequencer's up to this epoch (counts toward the slow quorum).
    Synced,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CalvinMsg {
    /// Coordinator → the sequencer of its choice: order this transaction.
    Submit {
        txn: TxnId,
        keys: Vec<Key>,
        pieces: Pieces,
    },
    /// Sequencer → coordinator: `txn` executed; the value read (before the increment) of each
    /// of its keys. `fast`: its epoch committed on the fast path.
    Reply {
        txn: TxnId,
        reads: Vec<(Key, Value)>,
        fast: bool,
    },
    /// Coordinator → every sequencer: which answers first (the closest one)?
    Ping {
        nonce: u64,
    },
    Pong {
        nonce: u64,
    },
    /// Sequencer → every replica of its shard (the deadline-ordered multicast), and any
    /// replica → a replica that asked for it ([`CalvinMsg::FetchEpoch`]).
    Epoch(Arc<EpochBody>),
    /// Replica → every replica of its shard: how it vouches for `epoch`, with the hash of its
    /// log up to it. `owd_ns`: the epoch's arrival time minus its send time on the sequencer's
    /// clock (the sequencer's one-way-delay sample; 0 from the sequencer itself).
    EpochReply {
        shard: ShardId,
        epoch: u64,
        replica: u32,
        kind: ReplyKind,
        log_hash: u64,
        owd_ns: u64,
    },
    /// A replica missing `epoch` of `shard` asks a replica of the shard for it.
    FetchEpoch {
        shard: ShardId,
        epoch: u64,
    },
    /// A replica that has not seen `replica`'s reply for `epoch` asks for it again.
    Inquire {
        shard: ShardId,
        epoch: u64,
    },
    /// A shard's replica in row r → the scheduler of every shard in row r: `epoch` of `shard`
    /// committed; execute it in its place in the global order.
    Report(Arc<EpochBody>),
    /// A scheduler stuck waiting for `shard`'s epochs from `from_epoch` on asks that shard's
    /// replica in its row to report them again.
    ReportFetch {
        shard: ShardId,
        from_epoch: u64,
    },
    /// A scheduler of shard `from` → the sequencer of `shard` (in the sequencer's row): the
    /// values read by each transaction of `epoch` that touched shard `from`.
    Results {
        shard: ShardId,
        epoch: u64,
        from: ShardId,
        reads: Vec<(TxnId, Vec<(Key, Value)>)>,
    },
    /// Coordinator → a replica of the customer's shard: a by-name TPC-C transaction's
    /// pre-read (`kairos_workload::tpcc::pre_read`).
    PreRead(PreReadRequest),
    /// Replica → coordinator: the pre-read's answer.
    PreReadAnswer(PreReadAnswer),
}

kairos_workload::impl_pre_read_msg!(CalvinMsg);
