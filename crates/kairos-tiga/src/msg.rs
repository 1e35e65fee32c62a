//! Tiga's wire vocabulary: transactions, shard pieces, and every message between
//! coordinators, servers (leaders and followers) and leaders.
//!
//! Every message between servers and coordinators carries the sender's view number; a role
//! handles only messages of the view it is in (see [`crate::view`]).

use crate::ops::{distinct_keys, key_id, Op, OpOutput};
use crate::server::Checkpoint;
use crate::view::{ServerState, View};
use kairos_consensus::paxos::PaxosMsg;
use kairos_core::LocalTime;
use kairos_workload::tpcc::{PreReadAnswer, PreReadRequest};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The transactional vocabulary Tiga shares with its peers (`kairos-workload`).
pub use kairos_workload::txn::{Key, ShardId, Ts, TxnId, Value};
pub use kairos_workload::Pieces;

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
    /// A multi-shard transaction's operations on every shard, in transaction order (empty for
    /// a single-shard one): after a view change a shard that lost its piece takes it from a
    /// shard that has the transaction in its log ([`Piece::sibling`]).
    pub txn_ops: Vec<Op>,
    /// A TPC-C transaction's pieces, one per warehouse, the whole transaction's in every
    /// shard's piece (each shard runs those of its warehouses: [`crate::tpcc`]); empty
    /// otherwise.
    pub tpcc: Pieces,
}

impl Piece {
    /// The piece running `ops` (all on `shard`), with its read and write sets derived from them.
    pub fn new(txn: TxnId, shard: ShardId, shards: Vec<ShardId>, ops: Vec<Op>) -> Self {
        let (reads, writes) = Self::sets(&ops);
        Piece { txn, shard, shards, reads, writes, ops, txn_ops: Vec::new(), tpcc: Pieces::default() }
    }

    /// This piece, carrying a TPC-C transaction's pieces.
    pub fn with_tpcc(mut self, tpcc: Pieces) -> Self {
        self.tpcc = tpcc;
        self
    }

    /// This piece, carrying the whole transaction's operations (multi-shard transactions).
    pub fn with_txn_ops(mut self, txn_ops: Vec<Op>) -> Self {
        self.txn_ops = txn_ops;
        self
    }

    /// The piece of the same transaction on `shard`, rebuilt from `txn_ops` with `shard_of`
    /// giving each key's shard; `None` if this piece does not carry the transaction's
    /// operations or `shard` is not involved.
    pub fn sibling(&self, shard: ShardId, shard_of: impl Fn(&[u8]) -> ShardId) -> Option<Piece> {
        if self.txn_ops.is_empty() || !self.shards.contains(&shard) {
            return None;
        }
        let ops: Vec<Op> = self.txn_ops.iter().filter(|op| shard_of(&op.key) == shard).cloned().collect();
        (!ops.is_empty()).then(|| {
            Piece::new(self.txn, shard, self.shards.clone(), ops)
                .with_txn_ops(self.txn_ops.clone())
                .with_tpcc(self.tpcc.clone())
        })
    }

    /// Whether `txn_ops` is consistent with this piece: empty for a single-shard transaction,
    /// else exactly `ops` once restricted to this shard.
    pub fn txn_ops_match(&self, shard_of: impl Fn(&[u8]) -> ShardId) -> bool {
        if self.shards.len() == 1 {
            return self.txn_ops.is_empty();
        }
        let mine = self.txn_ops.iter().filter(|op| shard_of(&op.key) == self.shard);
        mine.eq(self.ops.iter()) && self.txn_ops.iter().all(|op| self.shards.contains(&shard_of(&op.key)))
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

    /// Bytes of keys and arguments (and TPC-C pieces, about), for size limits.
    pub fn payload_bytes(&self) -> usize {
        let tpcc: usize = self.tpcc.iter().map(|p| (1 + p.weight()) * 16).sum();
        self.ops.iter().chain(&self.txn_ops).map(Op::payload_bytes).sum::<usize>() + tpcc
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

/// A coordinator's submit of one piece to a replica of its shard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Submit {
    pub view: u64,
    /// Shared by the submits to every replica of the shard (on the wire, the piece itself).
    pub piece: Arc<Piece>,
    pub ts: Ts,
    /// The coordinator's clock when it sent the submit (one-way delay samples).
    pub send_time: LocalTime,
    /// The coordinator's clock when it sent the transaction's first submit: a server refuses
    /// a submit whose transaction is older than the horizon after which it forgets executed
    /// ids (it may have run it already; `Server::forget_truncated`).
    pub first_send_time: LocalTime,
}

/// A server's reply to a coordinator about one piece.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServerReply {
    pub view: u64,
    pub txn: TxnId,
    pub shard: ShardId,
    pub replica: u32,
    pub kind: ReplyKind,
    pub ts: Ts,
    pub hash: [u8; 20],
    /// The execution's result (leaders only; followers send none).
    pub result: Option<PieceResult>,
    /// One-way delay the server measured for the submit: arrival − send time, ns.
    pub owd_ns: u64,
}

/// Timestamp agreement between the leaders of a multi-shard transaction's shards: round 1
/// (my timestamp) and round 2 (`confirm`: I have adopted the agreed timestamp). `resend`: a
/// retry after a possible loss; the receiver answers with its round-1 timestamp (and its
/// confirmation, if given).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Agreement {
    pub view: u64,
    pub txn: TxnId,
    pub shard: ShardId,
    pub ts: Ts,
    pub confirm: bool,
    pub resend: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TigaMsg {
    /// Coordinator → every replica of every involved shard.
    Submit(Submit),
    /// Server → coordinator.
    Reply(ServerReply),
    /// Leader → leaders of the other involved shards (timestamp agreement).
    Agree(Agreement),
    /// Leader → leader: I do not have `txn`, it is older than any coordinator keeps trying, and
    /// I will refuse it from now on: drop it (answer to a `resend` probe).
    Absent { view: u64, txn: TxnId, shard: ShardId },
    /// Leader → follower: log entries from `from` on, and the commit point.
    LogSync { view: u64, from: u64, entries: Vec<LogEntry>, commit_point: u64 },
    /// Follower → leader: my log matches yours up to `sync_point` (exclusive).
    SyncAck { view: u64, replica: u32, sync_point: u64 },

    // ---- Views (see `crate::view` and `crate::server::view_change`) ----
    /// Server → every view-manager node, every `heartbeat_interval`. `leader_contact`: a
    /// serving follower says whether its leader's log synchronization reached it within
    /// `leader_timeout` (none from leaders and replicas not serving). `may_lead`: it has not
    /// lost its journal since it last served past its view floor (`server::view_change`).
    Heartbeat { view: u64, state: ServerState, leader_contact: Option<bool>, may_lead: bool },
    /// View manager → servers, server → server or coordinator: the view now in force.
    NewView { view: View },
    /// New leader → the replicas of its shard: send me your state for the view change, with
    /// your log from `from` on (the new leader holds the log before it).
    CollectLog { view: View, from: u64 },
    /// Replica → its shard's new leader: its state for the view change.
    LogState { view: u64, replica: u32, report: LogReport },
    /// New leader → new leader of another shard, during the view change: the state of
    /// multi-shard transactions on the sender's shard.
    Verify { view: u64, shard: ShardId, kind: VerifyKind, items: Vec<VerifyItem> },
    /// New leader → replica: the new view's log from `from` (the replica drops what its log
    /// holds from there), and the commit point.
    StartView { view: u64, from: u64, entries: Vec<LogEntry>, commit_point: u64 },
    /// Leader → follower whose next entry the leader's log no longer holds (state transfer):
    /// the committed state and key maps up to `checkpoint.position`; log synchronization goes
    /// on from there.
    InstallCheckpoint { view: u64, checkpoint: Arc<Checkpoint>, commit_point: u64 },
    /// Among view-manager nodes: their replicated log of views.
    Paxos(PaxosMsg<View>),
    /// Server that lost its disk → every view-manager node: the highest view you know of?
    /// (`nonce` tells this probe's answers from replayed ones.)
    ViewProbe { nonce: u64 },
    /// View-manager node → server: the highest view number it holds (applied or accepted).
    ViewFloor { nonce: u64, view: u64 },

    // ---- TPC-C ----
    /// Coordinator → a replica of the customer's shard: a by-name transaction's pre-read
    /// (`kairos_workload::tpcc::pre_read`).
    PreRead(PreReadRequest),
    /// Replica → coordinator: the pre-read's answer.
    PreReadAnswer(PreReadAnswer),
}

kairos_workload::impl_pre_read_msg!(TigaMsg);

impl TigaMsg {
    /// A short name of the message's kind (traces, tests).
    pub fn kind(&self) -> &'static str {
        match self {
            TigaMsg::Submit(_) => "submit",
            TigaMsg::Reply(_) => "reply",
            TigaMsg::Agree(Agreement { confirm: false, .. }) => "agree",
            TigaMsg::Agree(Agreement { confirm: true, .. }) => "confirm",
            TigaMsg::Absent { .. } => "absent",
            TigaMsg::LogSync { .. } => "logsync",
            TigaMsg::SyncAck { .. } => "syncack",
            TigaMsg::Heartbeat { .. } => "heartbeat",
            TigaMsg::NewView { .. } => "newview",
            TigaMsg::CollectLog { .. } => "collectlog",
            TigaMsg::LogState { .. } => "logstate",
            TigaMsg::Verify { .. } => "verify",
            TigaMsg::StartView { .. } => "startview",
            TigaMsg::InstallCheckpoint { .. } => "checkpoint",
            TigaMsg::Paxos(_) => "paxos",
            TigaMsg::ViewProbe { .. } => "viewprobe",
            TigaMsg::ViewFloor { .. } => "viewfloor",
            TigaMsg::PreRead(_) => "preread",
            TigaMsg::PreReadAnswer(_) => "prereadanswer",
        }
    }
}

/// What a replica reports to its shard's new leader in a view change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogReport {
    /// The replica's journal is whole: it may count towards the f + 1.
    pub voter: bool,
    /// The last view it served in.
    pub last_normal: u64,
    /// Its log's length (every entry in it came from a leader's log).
    pub sync_point: u64,
    /// Log positions it executed.
    pub executed: u64,
    /// Its log from `from` up to `sync_point`.
    pub from: u64,
    pub entries: Vec<LogEntry>,
    /// Transactions it released and has not seen in the log, at the timestamps it released them.
    pub released: Vec<LogEntry>,
    /// When its log no longer holds the `from` asked for: the checkpoint `entries` continue
    /// from (`from` is its position).
    pub checkpoint: Option<Arc<Checkpoint>>,
}

/// Where a multi-shard transaction stands on one shard after that shard's log merge.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnState {
    /// Not in the merged log. `latest_conflict`: the latest timestamp among this shard's
    /// merged (and executed) entries that conflict with the transaction's piece here —
    /// `Ts::MAX` when the shard cannot take the piece (it lacks the transaction's operations,
    /// or its view already started without it).
    Absent { latest_conflict: Ts },
    /// In the part of the merged log that came from an old leader's log (agreed, possibly
    /// executed), at `ts`. `view`: the last view that log served in, the view whose word on
    /// the transaction this is. A later view's word supersedes an earlier one: a transaction
    /// settled in view v and placed elsewhere (or dropped and resent) in a later view cannot
    /// have committed in v (the later view's merge would have kept it).
    Settled { ts: Ts, view: u64 },
    /// Among the released transactions enough replicas had (not final anywhere known).
    Tentative(Ts),
}

impl TxnState {
    /// Absent, and no timestamp would let this shard take the transaction.
    pub const UNPLACEABLE: TxnState = TxnState::Absent { latest_conflict: Ts::MAX };
}

/// What a [`TigaMsg::Verify`] is.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VerifyKind {
    /// The sender's recent multi-shard transactions that involve the receiver (one per view
    /// change and pair of shards; answered).
    Listing,
    /// A leader already serving the view repeats its listing to one whose own listing arrived
    /// (that one still waits for it). Counts as a listing; never answered by a listing, so two
    /// leaders never trade listings forever.
    ListingAgain,
    /// Transactions whose state on the receiver's shard the sender lacks (answered).
    Question,
    Answer,
}

/// One multi-shard transaction in a [`TigaMsg::Verify`]: its state on the sender's shard and,
/// when the sender has it, its piece there (which carries the whole transaction's operations).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyItem {
    pub txn: TxnId,
    pub shards: Vec<ShardId>,
    pub state: TxnState,
    pub piece: Option<Arc<Piece>>,
}

/// One entry of a shard's log: a transaction's piece at its final timestamp.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub ts: Ts,
    pub piece: Arc<Piece>,
}
