//! Tiga's wire vocabulary: transactions, shard pieces, and every message between
//! coordinators, servers (leaders and followers) and leaders.
//!
//! Every message carries the sender's view so that view changes (a later issue) can reject
//! messages from other views without changing the message shapes.

use crate::ops::{distinct_keys, key_id, Op, OpOutput};
use kairos_core::NodeId;
use serde::{Deserialize, Serialize};

/// Globally unique transaction id: the coordinator's node id in the high 32 bits, its
/// sequence number in the low 32. A retransmission keeps the id (at-most-once execution).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TxnId(pub u64);

impl TxnId {
    pub fn new(coordinator: NodeId, seq: u32) -> Self {
        TxnId(((coordinator.0 as u64) << 32) | seq as u64)
    }
    /// The coordinator that owns this transaction (replies go there).
    pub fn coordinator(self) -> NodeId {
        NodeId((self.0 >> 32) as u32)
    }
    pub fn seq(self) -> u32 {
        self.0 as u32
    }
}

/// A timestamp: nanoseconds of a node's local clock (future timestamps are send time +
/// headroom). Ties are broken by transaction id: the order is `(Ts, TxnId)`.
pub type Ts = u64;
/// A key's protocol identity ([`crate::ops::key_id`] of its bytes): what conflict detection
/// and log hashes work on. (Tiga's peers in `kairos-txn` use plain integer keys of this type.)
pub type Key = u64;
/// An integer value (the peers' increment-only store).
pub type Value = u64;
pub type ShardId = u32;

/// The part of a transaction one shard executes: its operations (in transaction order) and
/// their read and write sets as key ids, distinct, in order of first appearance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    pub txn: TxnId,
    pub shard: ShardId,
    /// Every shard the transaction touches (for timestamp agreement among their leaders).
    pub shards: Vec<ShardId>,
    pub reads: Vec<Key>,
    pub writes: Vec<Key>,
    pub ops: Vec<Op>,
}

impl Piece {
    /// The piece running `ops` (all on `shard`), with its read and write sets derived from them.
    pub fn new(txn: TxnId, shard: ShardId, shards: Vec<ShardId>, ops: Vec<Op>) -> Self {
        let (reads, writes) = Self::sets(&ops);
        Piece { txn, shard, shards, reads, writes, ops }
    }

    fn sets(ops: &[Op]) -> (Vec<Key>, Vec<Key>) {
        let keys = distinct_keys(ops);
        let reads = keys.iter().filter(|k| k.1 || !k.2).map(|k| key_id(k.0)).collect();
        let writes = keys.iter().filter(|k| k.2).map(|k| key_id(k.0)).collect();
        (reads, writes)
    }

    /// Whether the read and write sets are the ones its operations imply (a server checks
    /// this before trusting them for conflict detection).
    pub fn sets_match_ops(&self) -> bool {
        let (reads, writes) = Self::sets(&self.ops);
        reads == self.reads && writes == self.writes
    }

    /// Number of distinct keys (the length of a leader's `versions`).
    pub fn distinct_keys(&self) -> usize {
        distinct_keys(&self.ops).len()
    }

    /// Bytes of keys and arguments, for size limits.
    pub fn payload_bytes(&self) -> usize {
        self.ops.iter().map(Op::payload_bytes).sum()
    }
}

/// What a leader's execution of a piece returned: an output per operation, and the version
/// of each distinct key before it ran (in order of first appearance).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PieceResult {
    pub outputs: Vec<OpOutput>,
    pub versions: Vec<u64>,
}

/// How a server replied.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplyKind {
    /// Released (followers) or executed (leaders) at `ts`; `hash` is the log hash over the
    /// transaction's keys.
    Fast,
    /// A follower's log is synchronized with the leader's past this transaction at `ts`.
    Slow,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TigaMsg {
    /// Coordinator → every replica of every involved shard.
    Submit { view: u64, piece: Piece, ts: Ts, send_time: Ts },
    /// Server → coordinator.
    Reply {
        view: u64,
        txn: TxnId,
        shard: ShardId,
        replica: u32,
        kind: ReplyKind,
        ts: Ts,
        hash: [u8; 20],
        /// The execution's result (leaders only; followers send none).
        result: Option<PieceResult>,
        /// One-way delay the server measured for the submit: arrival − send time, ns.
        owd_ns: u64,
    },
    /// Leader → leaders of the other involved shards: round 1 (my timestamp) and round 2
    /// (I have adopted the agreed timestamp). `resend`: a retry after a possible loss; the
    /// receiver answers with its round-1 timestamp (and its confirmation, if given).
    Agree { view: u64, txn: TxnId, shard: ShardId, ts: Ts, confirm: bool, resend: bool },
    /// Leader → leader: I do not have `txn`, it is older than any coordinator keeps trying, and
    /// I will refuse it from now on: drop it (answer to a `resend` probe).
    Absent { view: u64, txn: TxnId, shard: ShardId },
    /// Leader → follower: log entries from `from` on, and the commit point.
    LogSync { view: u64, from: u64, entries: Vec<LogEntry>, commit_point: u64 },
    /// Follower → leader: my log matches yours up to `sync_point` (exclusive).
    SyncAck { view: u64, replica: u32, sync_point: u64 },
}

/// One entry of a shard's log: a transaction's piece at its final timestamp.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub ts: Ts,
    pub piece: Piece,
}
