//! A Tiga server: leader or follower of one shard.
//!
//! **Arrival.** A transaction T arrives with a proposed future timestamp `T.ts`. It is
//! accepted into the priority queue (ordered by `(ts, id)`) if `T.ts` is later than the last
//! *released* timestamp of every key it conflicts with (rMap / wMap). Otherwise a leader bumps
//! it to `max(local clock, last released + 1)`, and a follower *holds* it: it reaches the
//! follower's log only through the leader's log synchronization (the slow path).
//!
//! **Release.** When the local clock passes the head's timestamp, the transaction is released:
//! rMap / wMap take its timestamp, the per-key log hashes take `SHA-1(ts ‖ id)`, and the server
//! replies *fast* to the coordinator: a follower with `(ts, hash)`, a leader also with the
//! values read, after executing the stored procedure (revocably). A follower holds the fast
//! reply of a transaction that read from a multi-shard one not yet in its log until it is
//! (`reply_gate`: what makes a view change keep that multi-shard transaction).
//!
//! **Timestamp agreement** (transactions over several shards, leaders only; detective mode:
//! execute, then agree). The leader sends its timestamp to the other involved leaders and
//! takes the maximum. While T is not agreed, it *holds its keys*: at most one speculative
//! transaction per key, so no conflicting successor is released. Then:
//! 1. every leader had the same timestamp: T is final;
//! 2. this leader had the maximum, another did not: T stays speculative until every lower
//!    leader *confirms* (round 2) that it has adopted the agreed timestamp — this second round
//!    is what prevents timestamp inversion (the paper's Figure 5);
//! 3. this leader was lower: it revokes T's execution, re-queues T at the agreed timestamp,
//!    re-executes it when its clock passes it, re-sends its reply, and confirms.
//!
//! **Log synchronization.** A leader appends final transactions to its log and sends new
//! entries to its followers every `sync_interval`. A follower adopts the leader's timestamp for
//! each entry (fixing its hashes), answers the coordinator with a *slow* reply, and
//! acknowledges its sync-point. The commit-point is the highest position f + 1 replicas have
//! synchronized; followers execute up to it.
//!
//! **Durable state.** Every replica journals each entry joining its log and each transaction
//! it releases ([`Ctx::persist`]: durable before the reply or `SyncAck` leaves; an entry whose
//! piece the journal holds as released names it instead of writing it again), and writes
//! one snapshot of its view, log and released transactions once a checkpoint is on disk, at
//! every view it starts serving in, and after `max(4096, 4 × the log it holds)` records. Its
//! checkpoints go to disk apart, a few pages at a time (see `durable.rs`), so no snapshot carries
//! the state. A restarted replica rebuilds its log, maps and hashes from them
//! ([`Process::on_recover`]) and comes back *recovering*; see [`view_change`] for the view
//! change and the rejoin.
//!
//! **Checkpoints and truncation.** Every `checkpoint_interval` executed positions, or every
//! `checkpoint_positions_per_key` per key of the state when that is more (so that writing whole
//! checkpoints costs each position the same however large the state grows), a replica
//! keeps the committed state and the key maps of the log up to there ([`Checkpoint`]) and drops
//! the log below once that checkpoint is on disk (a leader keeps what its slowest follower
//! still needs, up to one more interval). A follower whose next entry the leader's log no
//! longer holds gets the checkpoint (`InstallCheckpoint`) and continues from it. The
//! transactions of dropped entries are forgotten once older than any coordinator resends
//! (`retry_timeout × max_sends`). No step of this costs time in proportion to the state: the
//! state and maps are [`CowMap`]s (a checkpoint shares their buckets), replaced maps are freed a
//! few buckets per position (`Retired`), and the recent transactions a checkpoint carries are
//! segments filled as positions execute and shared by consecutive checkpoints ([`Recent`]).
//!
//! **Log hash.** Per key, the XOR of `SHA-1(ts ‖ id)` of every released transaction touching
//! it (incremental on release, revocation and timestamp fixes). A reply's hash is SHA-1 over
//! the accumulators of the transaction's keys, so commuting transactions on other keys need not
//! agree on order, while every replica of a fast quorum has released the same conflicting
//! transactions at the same timestamps before T.

use crate::cow_map::{Bucket, CowMap};
use crate::msg::{
    Agreement, Key, LogEntry, Piece, PieceResult, ReplyKind, ServerReply, ShardId, Submit, TigaMsg, Ts, TxnId,
};
use crate::ops::{self, Entry, Store, StoreKey};
use crate::release_queue::ReleaseQueue;
use crate::topology::{TigaConfig, Topology};
use crate::tpcc::{TpccShard, TpccUndo};
use crate::view::{ServerState, View};
use kairos_core::{duration_nanos, Ctx, LocalTime, NodeId, Process, Stored, Timer, TimerId};
use serde::{Deserialize, Serialize};
use sha1::{Digest, Sha1};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

mod durable;
mod log;
mod reply_gate;
pub mod view_change;

pub use log::Log;
use reply_gate::ReplyGate;

/// Pieces whose table entries [`warm`] looks up at a time: enough for the processor to overlap
/// their cache misses, few enough that what they bring in is still cached when they run.
const WARM_AHEAD: usize = 16;

kairos_core::timers! {
    /// A server's timers.
    pub enum ServerTimer {
        /// The next queued timestamp falls due (tests drive it directly).
        Release = 1,
        /// Leader: the next log synchronization to the followers.
        Sync = 2,
        /// Leader: resend timestamp agreements that went unanswered.
        AgreeRetry = 3,
        /// Report to the view managers.
        Heartbeat = 4,
        /// A view change that has not completed: ask again.
        ViewChangeRetry = 5,
    }
}
/// Most log entries one LogSync carries.
const SYNC_BATCH_MAX: usize = 1024;
/// Most payload bytes (keys and values) one LogSync carries beyond its first entry: well
/// inside the hosts' default 4 MiB frame.
const SYNC_BATCH_BYTES_MAX: usize = 1 << 20;
/// Agreement messages buffered for transactions that have not arrived yet.
const EARLY_AGREE_MAX: usize = 100_000;
/// Transactions remembered as refused (declared absent).
const ABSENT_MAX: usize = 1_000_000;
/// Results of the latest executed log positions kept (see `apply_committed`).
const RESULTS_KEPT: usize = 65_536;
/// Journal records between snapshots of the durable state, at least (module docs).
const JOURNAL_RECORDS_PER_SNAPSHOT: u64 = 4_096;

/// One journal record: a change of the durable state.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Record {
    /// The entry joined the log.
    Logged(LogEntry),
    /// The transaction was released at this timestamp (and answered on the fast path).
    Released(LogEntry),
    /// The entry of a transaction whose piece this journal holds as released (a `Released`
    /// record, or its snapshot's released list) joined the log at `ts`: the piece is not
    /// written a second time (serializing it was about 5 % of a replica's handler time).
    LoggedReleased { txn: TxnId, ts: Ts },
}

impl Record {
    /// The record of `entry` joining the log: by reference when its piece is durable as
    /// released, whole otherwise.
    fn logged(entry: &LogEntry, by_reference: bool) -> Record {
        if by_reference {
            Record::LoggedReleased { txn: entry.piece.txn, ts: entry.ts }
        } else {
            Record::Logged(entry.clone())
        }
    }
}

/// The whole durable state: the view, the last view served in, the log, and what was released
/// and is not in the log.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Snapshot {
    view: View,
    last_normal: u64,
    /// Whether the replica may vote in a view change (see [`view_change`]): a replica that
    /// lost its journal, or part of it, stays without a vote across restarts until it has
    /// served in a newer view.
    voter: bool,
    /// It lost its disk and has not voted since, and the view floor the view managers gave it
    /// if known (see [`view_change`]): amnesia outlasts a restart with the journal it wrote
    /// since.
    amnesiac: bool,
    view_floor: Option<u64>,
    /// The position of `log`'s first entry: at or below the checkpoint on disk (its pages are
    /// apart, see [`durable`]), 0 without one.
    log_from: u64,
    log: Vec<LogEntry>,
    released: Vec<LogEntry>,
}

pub type Hash = [u8; 20];

/// A hash map with a fixed seed (deterministic, like everything here), for the maps looked up
/// per transaction whose iteration order reaches no output.
type FixedMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::FixedState>;

/// Transactions by id, each boxed: a `Txn` is 288 bytes, and the table moves its
/// entries whenever it grows or sweeps the tombstones its steady inserts and removals leave
/// (a profile at 40,000 txn/s found 8 % of the servers' handler time in those moves).
type TxnMap = FixedMap<TxnId, Box<Txn>>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    /// In the priority queue at `ts`.
    Queued,
    /// Follower: could not accept the proposed timestamp; waits for the leader's log.
    Held,
    /// Released (follower) / executed speculatively and waiting for agreement (leader).
    Released,
    /// Leader: agreed and appended to the log. Follower: in the synchronized log.
    Final,
    /// Leader: another involved leader never received it and refuses it; dropped (revoked).
    Abandoned,
}

struct Txn {
    piece: Arc<Piece>,
    ts: Ts,
    status: Status,
    owd_ns: u64,
    /// The last reply sent to the coordinator (re-sent on retransmission).
    last_reply: Option<TigaMsg>,
    /// Leader: the entries the current execution's writes replaced, and what reverts its
    /// TPC-C pieces (warehouse index, undo record).
    undo: Vec<(StoreKey, Option<Entry>)>,
    tpcc_undo: TpccUndo,
    /// Leader: other involved leaders' round-1 timestamps, and round-2 confirmations.
    peer_ts: BTreeMap<ShardId, Ts>,
    confirms: BTreeSet<ShardId>,
    /// Leader: the agreed timestamp, once known.
    agreed: Option<Ts>,
    /// Leader: the current execution's effects are in the store (revocable until final).
    executed: bool,
    /// Leader: this leader's own timestamp for the transaction (round 1).
    original_ts: Ts,
    /// Leader: the agreed timestamp was above this leader's: it confirms after executing.
    lowered: bool,
    /// Leader: when this leader last sent agreement messages for it (local ns); they are
    /// retried only once `agree_retry` has passed since. Before it announced: when it arrived.
    agree_sent_at: LocalTime,
    /// Leader: its round-1 timestamp went to the other involved leaders (at arrival, or at
    /// release with `TigaConfig::announce_at_release`); agreement is evaluated only after.
    announced: bool,
    /// Its piece is durable as released ([`Record::Released`], or in a snapshot written while
    /// it was released) since its last release: its log entry may be journaled by reference.
    released_journaled: bool,
}

impl Txn {
    fn new(piece: Arc<Piece>, ts: Ts, status: Status, owd_ns: u64) -> Box<Self> {
        Box::new(Txn {
            piece,
            ts,
            status,
            owd_ns,
            last_reply: None,
            undo: Vec::new(),
            tpcc_undo: TpccUndo::default(),
            peer_ts: BTreeMap::new(),
            confirms: BTreeSet::new(),
            agreed: None,
            executed: false,
            original_ts: ts,
            lowered: false,
            agree_sent_at: LocalTime::ZERO,
            announced: false,
            released_journaled: false,
        })
    }
}

/// A key's stamps: the timestamps of the last transactions that read it and that wrote it, and
/// its log hash (the XOR of `SHA-1(ts ‖ id)` of the transactions touching it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyStamp {
    pub read_ts: Ts,
    pub write_ts: Ts,
    pub hash: Hash,
}

impl KeyStamp {
    /// Raises the read and/or write timestamp to `ts` (they never go down).
    fn stamp(&mut self, ts: Ts, read: bool, written: bool) {
        if read {
            self.read_ts = self.read_ts.max(ts);
        }
        if written {
            self.write_ts = self.write_ts.max(ts);
        }
    }

    /// XORs a transaction's `SHA-1(ts ‖ id)` into the log hash (adding and removing it are
    /// the same toggle).
    fn toggle(&mut self, h: &Hash) {
        for (a, b) in self.hash.iter_mut().zip(h) {
            *a ^= b;
        }
    }
}

/// The [`KeyStamp`] of every key touched (rMap, wMap and the log hashes in one map: one lookup
/// per key instead of three). A [`CowMap`], so a checkpoint or a view change copies it cheaply.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyMaps(CowMap<Key, KeyStamp>);

impl KeyMaps {
    /// The stamps of `k` (all zero for a key never touched).
    pub fn get(&self, k: &Key) -> KeyStamp {
        self.0.get(k).copied().unwrap_or_default()
    }

    /// Keys with stamps.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Takes `piece` at `ts` into the maps: its read and write timestamps and its hash, one
    /// lookup per key.
    fn add(&mut self, piece: &Piece, ts: Ts) {
        let h = Server::entry_hash(ts, piece.txn);
        self.each_key(piece, |e, read, written| {
            e.stamp(ts, read, written);
            e.toggle(&h);
        });
    }

    /// Raises the read timestamps of `piece`'s reads and the write timestamps of its writes
    /// to `ts` (they never go down).
    fn stamp(&mut self, piece: &Piece, ts: Ts) {
        self.each_key(piece, |e, read, written| e.stamp(ts, read, written));
    }

    /// Toggles `SHA-1(ts ‖ id)` of `piece` in the hash of each of its keys (adding and
    /// removing are the same XOR).
    fn xor_hash(&mut self, piece: &Piece, ts: Ts) {
        let h = Server::entry_hash(ts, piece.txn);
        self.each_key(piece, |e, _, _| e.toggle(&h));
    }

    /// Calls `f` with the stamps of each of `piece`'s keys (inserted if absent), whether the
    /// piece reads it and whether it writes it.
    fn each_key(&mut self, piece: &Piece, mut f: impl FnMut(&mut KeyStamp, bool, bool)) {
        for k in &piece.reads {
            f(self.0.get_or_insert_with(*k, KeyStamp::default), true, piece.writes.contains(k));
        }
        for k in piece.writes.iter().filter(|k| !piece.reads.contains(k)) {
            f(self.0.get_or_insert_with(*k, KeyStamp::default), false, true);
        }
    }

    /// The timestamp of the last transaction `piece` conflicts with: the last write of any of
    /// its keys, the last read of any key it writes.
    fn conflict_ts(&self, piece: &Piece) -> Ts {
        Server::keys(piece)
            .filter_map(|k| self.0.get(k).map(|e| (k, e)))
            .map(|(k, e)| if piece.writes.contains(k) { e.write_ts.max(e.read_ts) } else { e.write_ts })
            .max()
            .unwrap_or(Ts::ZERO)
    }
}

/// Looks up the entries of `maps` and `state` that `pieces` touch, before any of them runs.
/// At a million keys per shard most of those entries are not in the processor's caches; run
/// one after the other, each piece waits for its misses in turn, while these lookups do not
/// depend on one another, so the processor overlaps their misses and the pieces then find
/// their entries cached (at a million keys, a leader's CPU per piece fell by about a quarter).
/// Reads only: what a handler does and sends is unchanged.
fn warm<'a>(maps: &KeyMaps, state: &Store, pieces: impl Iterator<Item = &'a Piece>) {
    for piece in pieces {
        for k in Server::keys(piece) {
            std::hint::black_box(maps.0.get(k));
        }
        for op in &piece.ops {
            std::hint::black_box(state.keys.get(op.key.as_slice()));
        }
    }
}

/// Buckets of replaced maps (a replaced checkpoint's, the store a checkpoint or view change
/// replaced), freed a few per executed position: freeing a whole state at once stops a replica
/// as long as copying it would (100 ms at 90,000 keys), which is what [`CowMap`] avoids.
#[derive(Default)]
struct Retired {
    stores: Vec<Arc<Bucket<StoreKey, Entry>>>,
    stamps: Vec<Arc<Bucket<Key, KeyStamp>>>,
    segments: Vec<Arc<Recent>>,
}

impl Retired {
    /// Buckets of each kind freed per executed position: a replaced checkpoint's maps (4,096
    /// buckets each) are gone 1,024 positions later, well within a checkpoint interval.
    const FREED_PER_POSITION: usize = 4;

    fn store(&mut self, old: Store) {
        self.stores.extend(old.keys.into_buckets());
    }

    fn maps(&mut self, old: KeyMaps) {
        self.stamps.extend(old.0.into_buckets());
    }

    /// A checkpoint no longer the latest: its maps, unless something still holds it.
    fn checkpoint(&mut self, old: Option<Arc<Checkpoint>>) {
        if let Some(Ok(c)) = old.map(Arc::try_unwrap) {
            self.store(c.state);
            self.maps(c.maps);
            self.segments.extend(c.recent);
        }
    }

    fn free_some(&mut self) {
        let keep = |n: usize| n.saturating_sub(Self::FREED_PER_POSITION);
        self.stores.truncate(keep(self.stores.len()));
        self.stamps.truncate(keep(self.stamps.len()));
        self.segments.pop();
    }
}

/// Transactions of truncated entries forgotten per release pass, at most. A log compaction
/// truncates a checkpoint interval of entries at once, most of them already past the resend
/// horizon, so forgetting all that are due in one handler stopped a replica for 130 ms at
/// 100,000 keys per shard (`kairos bench tiga --load 40000 --keys-per-shard 100000`); a pass
/// runs on every message and timer, far more often than entries are truncated.
const FORGOTTEN_PER_CALL: usize = 64;

/// A log entry dropped below a checkpoint whose transaction is still remembered (a resend of
/// it is answered, never run again).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncated {
    pub ts: Ts,
    pub txn: TxnId,
    pub position: u64,
}

/// The committed state of a shard after the first `position` log entries, with the key maps of
/// those entries: what a lagging or restarted replica installs (state transfer), after which
/// the log below `position` may be dropped. Every replica takes one every
/// `checkpoint_interval` positions, or more when the state is large ([`TigaConfig`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub position: u64,
    pub state: Store,
    pub maps: KeyMaps,
    /// The transactions of the positions below, of the last few seconds, in segments of up to
    /// [`Recent::POSITIONS_MAX`] positions, oldest first: a replica that installs the
    /// checkpoint still knows them (at-most-once). Consecutive checkpoints share their
    /// segments, so taking one costs an interval's worth of work, not the whole window's.
    pub recent: Vec<Arc<Recent>>,
}

/// The transactions of positions `from..from + entries.len()`, kept in checkpoints while a
/// coordinator could still resend them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recent {
    pub from: u64,
    pub entries: Vec<Truncated>,
    /// What the executions of the last `results.len()` of `entries` returned (all of them,
    /// unless the replica that took the checkpoint had not kept them): a replica that installs
    /// the checkpoint and then leads answers a resend of one of them with its result, which the
    /// coordinator needs to finish it (a reply without one would leave it waiting for good).
    /// Shared with the replica's own latest results (one copy per executed position).
    pub results: Vec<Arc<PieceResult>>,
    /// The pieces of the multi-shard transactions among `entries` (each carries the whole
    /// transaction's operations): a replica that installs the checkpoint lists them to the
    /// other shards' leaders in a view change, so a shard that lacks one of them takes it from
    /// here instead of running the coordinator's resend as a new transaction.
    pub multi_shard: Vec<Arc<Piece>>,
}

impl Recent {
    fn starting_at(from: u64) -> Self {
        Recent { from, entries: Vec::new(), results: Vec::new(), multi_shard: Vec::new() }
    }

    /// Positions per segment at most: a checkpoint interval makes several (each is a page on
    /// disk, written once and kept while a checkpoint carries it).
    pub const POSITIONS_MAX: usize = 1_024;

    /// The last position it covers, plus one.
    fn end(&self) -> u64 {
        self.from + self.entries.len() as u64
    }
}

/// Counters for tests and reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub released: u64,
    pub bumped: u64,
    pub held: u64,
    pub revoked: u64,
    pub finalized: u64,
    pub executed: u64,
    pub rejected: u64,
    /// Announcing at release: timestamps announced at the timeout, before their release.
    pub announce_timeouts: u64,
    /// Log entries a restarted follower recovered from its journal.
    pub recovered_entries: u64,
    /// The position of the checkpoint on disk a restart recovered from (0: none).
    pub recovered_checkpoint: u64,
    /// Journal records a restart could not decode (written by another version of Kairos).
    pub journal_unreadable: u64,
    /// Restarted with nothing on disk ([`Process::on_amnesia`]).
    pub disk_lost: bool,
}

/// A replica of one shard; the leader of view 0 is `topology.leader[shard]`.
pub struct Server {
    topology: Topology,
    config: TigaConfig,
    shard: ShardId,
    replica: u32,
    /// The view this server is in (serving in it when `state` is normal).
    view: View,
    state: ServerState,
    /// The last view this server served in (normal), as journaled.
    last_normal: u64,
    /// Whether this server may count towards the f + 1 of a view change: its journal is whole.
    voter: bool,
    /// The view-manager nodes (heartbeats go to each).
    view_managers: Vec<NodeId>,
    /// The view change under way (see [`view_change`]).
    vc: view_change::Progress,
    /// Every transaction this server knows and has not forgotten: a hash map, since it holds
    /// the last few seconds' (up to ~100,000) and is looked up several times per message; no
    /// output depends on its iteration order.
    txns: TxnMap,
    /// Queued transactions, released incrementally (see [`crate::release_queue`]).
    pq: ReleaseQueue,
    /// rMap, wMap and the log hashes of every transaction released or in the log.
    maps: KeyMaps,
    store: Store,
    log: Log,
    /// Leader: keys held by a speculative (not yet agreed) transaction (never iterated).
    locked: FixedMap<Key, TxnId>,
    /// Leader: each replica's acknowledged sync-point and the next position to send it.
    sync_point: Vec<u64>,
    next_send: Vec<u64>,
    /// Leader: when each follower's sync-point last advanced (local ns).
    ack_progress_at: Vec<LocalTime>,
    /// Leader: per follower, the `sync_resend_after` periods in a row its acknowledgements
    /// stalled although entries were outstanding. After the first (a lost batch, most often)
    /// the leader streams again from the follower's sync-point; after the second (crashed or
    /// cut off) it only probes with its heartbeats until the follower answers one (Raft's
    /// probe state): a dead follower would otherwise cost its leader the whole log again
    /// every `sync_resend_after`.
    stalls: Vec<u32>,
    /// Leader: the checkpoint (position) last sent to each replica, and when (local ns).
    checkpoint_sent: Vec<Option<(u64, LocalTime)>>,
    commit_point: u64,
    commit_point_sent: Vec<u64>,
    /// Log positions executed on the committed state.
    executed: u64,
    /// Leader: the committed state (log entries up to the commit point), apart from the live
    /// store that also holds speculative executions.
    committed: Store,
    /// The latest checkpoint of the committed state.
    checkpoint: Option<Arc<Checkpoint>>,
    /// The key maps of the log up to `executed` (what a checkpoint carries).
    committed_maps: KeyMaps,
    retired: Retired,
    /// The checkpoint on disk and the one being written (see [`durable`]).
    durable: durable::DurableCheckpoint,
    /// The segments of recent transactions the next checkpoint carries (see [`Recent`]), and
    /// the one being filled as positions execute (it ends at `executed`).
    recent: std::collections::VecDeque<Arc<Recent>>,
    segment: Recent,
    /// Transactions whose entries were truncated, oldest first: forgotten once no coordinator
    /// can still resend them.
    truncated: std::collections::VecDeque<Truncated>,
    /// Agreement messages that arrived before their transaction.
    early_agree: BTreeMap<TxnId, BTreeMap<(ShardId, bool), Ts>>,
    /// Leader: multi-shard transactions not yet final (their agreement messages are retried).
    awaiting: BTreeSet<TxnId>,
    /// Follower: fast replies held until the multi-shard transactions they read from are logged.
    gate: ReplyGate,
    /// Leader: transactions declared absent here (too old to arrive); a late submit is refused.
    absent: BTreeSet<TxnId>,
    release_timer_at: Option<Ts>,
    /// Journal records written since the last snapshot.
    journaled: u64,
    /// Where a journal record is encoded before it is copied out at its size (kept between
    /// records: see [`Server::journal`]).
    record_buf: Vec<u8>,
    /// Leader: its synchronization and agreement-retry timers run.
    leader_timers_armed: bool,
    /// Follower: when its leader's log synchronization last arrived (local ns).
    leader_heard_at: LocalTime,
    /// Leader: when it last sent each follower log synchronization (local ns).
    sync_sent_at: Vec<LocalTime>,
    /// The results of the log positions just below `executed`, oldest first.
    results: std::collections::VecDeque<Arc<PieceResult>>,
    /// A release pass's buffer for the keys of the entry it examines (no allocation per entry).
    key_scratch: Vec<Key>,
    stats: ServerStats,
}

impl Server {
    pub fn new(topology: Topology, config: TigaConfig, shard: ShardId, replica: u32) -> Self {
        let n = topology.replicas_per_shard();
        let view = View::initial(&topology, config.preventive);
        Server {
            topology,
            config,
            shard,
            replica,
            view,
            state: ServerState::Normal,
            last_normal: 0,
            voter: true,
            view_managers: Vec::new(),
            vc: view_change::Progress::default(),
            txns: TxnMap::default(),
            pq: ReleaseQueue::default(),
            maps: KeyMaps::default(),
            store: Store::new(),
            log: Log::default(),
            locked: FixedMap::default(),
            sync_point: vec![0; n],
            next_send: vec![0; n],
            ack_progress_at: vec![LocalTime::ZERO; n],
            stalls: vec![0; n],
            checkpoint_sent: vec![None; n],
            commit_point: 0,
            commit_point_sent: vec![0; n],
            executed: 0,
            committed: Store::new(),
            checkpoint: None,
            committed_maps: KeyMaps::default(),
            retired: Retired::default(),
            durable: durable::DurableCheckpoint::default(),
            recent: std::collections::VecDeque::new(),
            segment: Recent::starting_at(0),
            truncated: Default::default(),
            early_agree: BTreeMap::new(),
            awaiting: BTreeSet::new(),
            gate: ReplyGate::default(),
            absent: BTreeSet::new(),
            release_timer_at: None,
            journaled: 0,
            record_buf: Vec::new(),
            leader_timers_armed: false,
            leader_heard_at: LocalTime::ZERO,
            sync_sent_at: vec![LocalTime::ZERO; n],
            results: Default::default(),
            key_scratch: Vec::new(),
            stats: ServerStats::default(),
        }
    }

    /// A replica of a TPC-C deployment: its shard's warehouses, as populated (every replica
    /// of the shard starts from the same).
    pub fn with_tpcc(mut self, warehouses: TpccShard) -> Self {
        self.committed.tpcc = Some(warehouses.clone());
        self.store.tpcc = Some(warehouses);
        self
    }

    /// A replica whose shard starts with `keys` in its store (every replica of the shard starts
    /// from the same), as its own copies: sharing the buckets with the other replicas, or the
    /// live store with the committed one, would make the run's first write to each bucket copy
    /// it, a cost a replica that loaded its keys itself does not pay.
    pub fn with_loaded_keys(mut self, keys: &CowMap<StoreKey, Entry>) -> Self {
        self.committed.keys = keys.unshared();
        self.store.keys = keys.unshared();
        self
    }

    /// The live state: a leader's includes its speculative executions (once every released
    /// transaction is final and executed, it equals [`Server::executed_state`]).
    pub fn live_state(&self) -> &Store {
        &self.store
    }

    /// The state the executed log positions produced ([`Server::executed`] of them): a
    /// follower's store, a leader's committed copy (its live store also holds speculative
    /// executions).
    pub fn executed_state(&self) -> &Store {
        // Only a leader serving its view keeps the committed copy apart (a view change or a
        // restart puts the executed state in the live store).
        if self.is_leader() && self.state == ServerState::Normal {
            &self.committed
        } else {
            &self.store
        }
    }

    /// Whether nothing is speculative here: every log entry executed on the committed state
    /// and no transaction executed ahead of its agreement (a leader's live state then equals
    /// [`Server::executed_state`]).
    pub fn settled(&self) -> bool {
        self.executed == self.log.len() && !self.txns.values().any(|t| t.status == Status::Released)
    }

    /// Whether this replica has nothing left to do for the transactions it knows: it is
    /// [`Server::settled`] and its priority queue is empty (nothing waits for its timestamp
    /// or for a key). Once every replica and coordinator is quiescent, each shard's executed
    /// state holds exactly the transactions committed there, so conditions across shards
    /// can be checked on it.
    pub fn quiescent(&self) -> bool {
        self.settled() && self.pq.is_empty()
    }

    /// Sends heartbeats to these view-manager nodes (without them, views never change).
    pub fn with_view_managers(mut self, nodes: Vec<NodeId>) -> Self {
        self.view_managers = nodes;
        self
    }

    /// The view this server is in, and whether it serves in it.
    pub fn view(&self) -> (&View, ServerState) {
        (&self.view, self.state)
    }

    pub fn is_leader(&self) -> bool {
        self.topology.leader[self.shard as usize] == self.replica
    }
    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }
    /// The log: absolute positions, the part below its base dropped (checkpointed).
    pub fn log(&self) -> &Log {
        &self.log
    }
    /// Log positions executed on the committed state.
    pub fn executed(&self) -> u64 {
        self.executed
    }

    /// The latest checkpoint of the committed state.
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoint.as_deref()
    }

    /// The state of `key` (leader: including speculative writes; follower: executed log).
    pub fn entry(&self, key: &[u8]) -> Option<&Entry> {
        self.store.get(key)
    }

    fn conflicts_last_ts(&self, piece: &Piece) -> Ts {
        self.maps.conflict_ts(piece)
    }

    fn keys(piece: &Piece) -> impl Iterator<Item = &Key> {
        piece.reads.iter().chain(piece.writes.iter().filter(|k| !piece.reads.contains(k)))
    }

    fn entry_hash(ts: Ts, txn: TxnId) -> Hash {
        let mut h = Sha1::new();
        h.update(ts.as_nanos().to_le_bytes());
        h.update(txn.0.to_le_bytes());
        h.finalize().into()
    }

    fn xor_hash(&mut self, piece: &Piece, ts: Ts) {
        self.maps.xor_hash(piece, ts);
    }

    fn reply_hash(&self, piece: &Piece) -> Hash {
        let mut h = Sha1::new();
        for k in Self::keys(piece) {
            h.update(k.to_le_bytes());
            h.update(self.maps.get(k).hash);
        }
        h.finalize().into()
    }

    /// A transaction's shards as a message names them: strictly increasing (no duplicates, so
    /// at most `shard_count` of them), each a shard of the deployment.
    fn valid_shards(&self, shards: &[ShardId]) -> bool {
        shards.windows(2).all(|w| w[0] < w[1]) && shards.iter().all(|s| (*s as usize) < self.topology.shard_count())
    }

    fn validate(&self, piece: &Piece) -> bool {
        // Pairwise for the few keys of a usual piece (a set costs an allocation per piece).
        let unique = |keys: &[Key]| match keys.len() {
            0..=32 => keys.iter().enumerate().all(|(i, k)| !keys[..i].contains(k)),
            n => keys.iter().collect::<BTreeSet<_>>().len() == n,
        };
        piece.shard == self.shard
            && piece.shards.contains(&self.shard)
            && self.valid_shards(&piece.shards)
            && !piece.reads.is_empty() | !piece.writes.is_empty()
            && piece.reads.len() + piece.writes.len() <= 2 * self.config.keys_per_txn_max
            && piece.ops.len() <= self.config.ops_per_txn_max
            // Its own operations and (multi-shard) the whole transaction's, each within the limit.
            && piece.payload_bytes() <= 2 * self.config.txn_bytes_max
            && piece.ops.len() + piece.txn_ops.len() <= 2 * self.config.ops_per_txn_max
            && piece.sets_match_ops()
            // TPC-C pieces only where there are warehouses to run them on, at most one per
            // key (each declares one or more).
            && (piece.tpcc.is_empty() || self.store.tpcc.is_some())
            && piece.tpcc.len() <= self.config.keys_per_txn_max
            && piece.txn_ops_match(|k| self.config.shard_of(&self.topology, k))
            && unique(&piece.reads)
            && unique(&piece.writes)
            && piece.ops.iter().all(|op| self.config.shard_of(&self.topology, &op.key) == self.shard)
    }

    /// `arrived`: when the submit reached this server (earlier than now if it waited out a
    /// view change here); the one-way delay sample is measured to then, so that a coordinator's
    /// estimate does not take the view change's wait for a network delay.
    fn on_submit(&mut self, ctx: &mut Ctx<'_, TigaMsg>, from: NodeId, submit: Submit, arrived: LocalTime) {
        let Submit { piece, ts, send_time, first_send_time, .. } = submit;
        // Only the coordinator a transaction id names may submit it (or claim its at-most-once
        // slot), and a timestamp beyond any headroom a coordinator can choose is refused (it
        // would sit in the queue, and through agreement in other leaders' queues, forever).
        let horizon = self.config.owd_cap
            + self.config.margin
            + self.config.future_slack
            + Duration::from_nanos(self.config.headroom_shift_ns.unsigned_abs());
        // A transaction first sent before the forget horizon may have run here and been
        // forgotten (`forget_truncated`: its entry's timestamp is no earlier than its first
        // send): refused, whatever this submit's own timestamp. No coordinator sends one
        // (`Coordinator::resend_window`); a replayed or long-delayed message does.
        let forgotten = ctx.now().saturating_since(first_send_time) > self.forget_after();
        if from != piece.txn.coordinator()
            || ts > Ts::at(ctx.now()) + horizon
            || forgotten
            || Ts::at(first_send_time) > ts
        {
            self.stats.rejected += 1;
            ctx.metric("tiga.server_rejected", 1);
            return;
        }
        if let Some(t) = self.txns.get(&piece.txn) {
            // A retransmission: at-most-once; answer with what we answered last.
            if let Some(reply) = t.last_reply.clone() {
                ctx.send(piece.txn.coordinator(), reply);
            }
            return;
        }
        let early = self.early_agree.remove(&piece.txn);
        if self.absent.contains(&piece.txn) || !self.validate(&piece) {
            self.stats.rejected += 1;
            ctx.metric("tiga.server_rejected", 1);
            return;
        }
        let now = ctx.now();
        let owd_ns = duration_nanos(arrived.saturating_since(send_time).max(self.config.owd_floor));
        let last = self.conflicts_last_ts(&piece);
        let txn = piece.txn;
        let (ts, status) = if ts > last {
            (ts, Status::Queued)
        } else if self.is_leader() {
            self.stats.bumped += 1;
            (Ts::at(now).max(last.next()), Status::Queued)
        } else {
            self.stats.held += 1;
            (ts, Status::Held)
        };
        if status == Status::Queued {
            self.pq.insert((ts, txn));
        }
        self.txns.insert(txn, Txn::new(piece, ts, status, owd_ns));
        if self.is_leader() && self.txns[&txn].piece.shards.len() > 1 {
            // This leader's timestamp for the transaction is settled now: announce it at once,
            // so that no other leader ever waits on a lock for it (announcing at release could
            // deadlock two leaders that hold conflicting transactions in opposite orders) —
            // unless the measurement of that choice asks for the paper's rule.
            if self.config.announce_at_release.is_none() {
                self.announce(ctx, txn, false);
            } else if let Some(t) = self.txns.get_mut(&txn) {
                t.agree_sent_at = now;
            }
            self.awaiting.insert(txn);
            for ((shard, confirm), ts) in early.unwrap_or_default() {
                if self.txns[&txn].piece.shards.contains(&shard) {
                    self.record_agree(txn, shard, ts, confirm);
                }
            }
            self.evaluate_agreement(ctx, txn);
        }
    }

    /// Sends this leader's round-1 timestamp for `id` to the other involved leaders (`resend`:
    /// a retry that asks them to answer with theirs, and with their confirmation if given).
    fn announce(&mut self, ctx: &mut Ctx<'_, TigaMsg>, id: TxnId, resend: bool) {
        let now = ctx.now();
        let Some(t) = self.txns.get_mut(&id) else { return };
        t.agree_sent_at = now;
        t.announced = true;
        let ts = t.original_ts;
        let to: Vec<NodeId> = t
            .piece
            .shards
            .iter()
            .filter(|s| **s != self.shard && (!resend || !t.peer_ts.contains_key(s)))
            .map(|s| self.topology.leader_node(*s))
            .collect();
        for n in to {
            ctx.send(
                n,
                TigaMsg::Agree(Agreement {
                    view: self.view.number,
                    txn: id,
                    shard: self.shard,
                    ts,
                    confirm: false,
                    resend,
                }),
            );
        }
    }

    /// Releases every queued transaction whose timestamp the local clock has passed, in
    /// timestamp order, skipping (and holding back the keys of) those blocked by a
    /// speculative transaction.
    fn release_due(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        let now = Ts::at(ctx.now());
        self.forget_truncated(now);
        let leader = self.is_leader();
        let mut candidates = self.pq.candidates(now);
        if candidates.len() > 1 {
            let pieces = candidates.iter().take(WARM_AHEAD).filter_map(|(_, id)| self.txns.get(id));
            warm(&self.maps, &self.store, pieces.map(|t| &*t.piece));
        }
        // One buffer for every candidate's keys (a release reached from here may take it too:
        // it then finds it empty, and the pass keeps its own).
        let mut keys = std::mem::take(&mut self.key_scratch);
        loop {
            while let Some(entry) = candidates.pop_first() {
                let id = entry.1;
                let Some(t) = self.txns.get(&id) else {
                    self.pq.forget(entry);
                    continue;
                };
                keys.clear();
                keys.extend(Self::keys(&t.piece).copied());
                let held = leader && keys.iter().any(|k| self.locked.get(k).is_some_and(|o| *o != id));
                if held || keys.iter().any(|k| self.pq.waits_before(k, entry)) {
                    self.pq.block(entry, &keys);
                    continue;
                }
                candidates.extend(self.pq.take(entry, &keys));
                self.release(ctx, id);
            }
            // Announcing at release, a release may conclude an agreement that re-queues the
            // transaction (possibly already due) or frees keys: look again.
            if self.config.announce_at_release.is_none() {
                break;
            }
            candidates = self.pq.candidates(now);
            if candidates.is_empty() {
                break;
            }
        }
        self.key_scratch = keys;
        self.arm_release_timer(ctx);
    }

    fn arm_release_timer(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        let now = Ts::at(ctx.now());
        match self.pq.next_after(now) {
            Some((ts, _)) if self.release_timer_at != Some(ts) => {
                self.release_timer_at = Some(ts);
                ctx.set_timer(ServerTimer::Release, ts.saturating_since(now) + Duration::from_nanos(1));
            }
            _ => {}
        }
    }

    fn release(&mut self, ctx: &mut Ctx<'_, TigaMsg>, id: TxnId) {
        let Some(t) = self.txns.get(&id) else { return };
        let piece = t.piece.clone();
        let ts = t.ts;
        self.stats.released += 1;
        self.maps.add(&piece, ts);
        let leader = self.is_leader();
        let multi_shard = piece.shards.len() > 1;
        let t = self.txns.get_mut(&id).expect("released transaction exists");
        t.status = Status::Released;
        // Preventive mode: a multi-shard transaction's leaders agree first and execute after,
        // so nothing is ever revoked. Detective mode executes at once and may revoke.
        let defer = leader && multi_shard && self.config.preventive && t.agreed.is_none();
        // Durable before the fast reply leaves: a restarted replica still counts what it
        // released in a view change.
        self.journal_released(ctx, id);
        if !defer {
            self.execute_and_reply(ctx, id);
        }
        if !leader {
            return;
        }
        if !multi_shard {
            self.finalize(ctx, id);
            return;
        }
        // Hold the keys until the timestamp is agreed (and, if this leader had the highest,
        // until the lower leaders confirm): at most one unsettled transaction per key.
        for k in Self::keys(&piece) {
            self.locked.insert(*k, id);
        }
        if !self.txns[&id].announced {
            self.announce(ctx, id, false);
            self.evaluate_agreement(ctx, id);
            return;
        }
        self.settle(ctx, id);
    }

    /// Answers the coordinator on the fast path: a leader executes first and sends the values
    /// read. The hash covers the transaction's keys, which no conflicting transaction can
    /// change while this one holds them.
    fn execute_and_reply(&mut self, ctx: &mut Ctx<'_, TigaMsg>, id: TxnId) {
        let Some(t) = self.txns.get(&id) else { return };
        let hash = self.reply_hash(&t.piece);
        let result_is_leaders = self.is_leader();
        let result = if result_is_leaders { Some(self.execute(id)) } else { None };
        let t = self.txns.get_mut(&id).expect("exists");
        let reply = TigaMsg::Reply(ServerReply {
            view: self.view.number,
            txn: id,
            shard: self.shard,
            replica: self.replica,
            kind: ReplyKind::Fast,
            ts: t.ts,
            hash,
            result,
            owd_ns: t.owd_ns,
        });
        let reply = if result_is_leaders || self.config.unsafe_ungated_fast_replies {
            Some(reply)
        } else {
            self.gate.released(&t.piece, t.ts, reply)
        };
        if let Some(reply) = reply {
            t.last_reply = Some(reply.clone());
            ctx.send(id.coordinator(), reply);
        }
    }

    /// Runs the piece's operations on the current state, remembering what they overwrote.
    fn execute(&mut self, id: TxnId) -> PieceResult {
        let Some(t) = self.txns.get_mut(&id) else { return PieceResult { outputs: Vec::new(), versions: Vec::new() } };
        let ops::Execution { outputs, versions, undo } = ops::execute(&mut self.store, &t.piece.ops);
        if let Some(tpcc) = self.store.tpcc.as_mut().filter(|_| !t.piece.tpcc.is_empty()) {
            t.tpcc_undo = tpcc.run(&t.piece.tpcc, &t.piece.ops, true);
        }
        self.stats.executed += 1;
        t.undo = undo;
        t.executed = true;
        PieceResult { outputs, versions }
    }

    fn revoke(&mut self, id: TxnId) {
        let Some(t) = self.txns.get_mut(&id) else { return };
        let undo = std::mem::take(&mut t.undo);
        let tpcc_undo = std::mem::take(&mut t.tpcc_undo);
        if t.executed {
            self.stats.revoked += 1;
        }
        t.executed = false;
        t.released_journaled = false;
        let piece = t.piece.clone();
        let ts = t.ts;
        if let Some(tpcc) = self.store.tpcc.as_mut() {
            tpcc.undo(tpcc_undo);
        }
        ops::undo(&mut self.store, undo);
        self.xor_hash(&piece, ts);
        for k in Self::keys(&piece) {
            if self.locked.get(k) == Some(&id) {
                self.locked.remove(k);
                self.pq.unlocked(*k);
            }
        }
    }

    fn record_agree(&mut self, txn: TxnId, shard: ShardId, ts: Ts, confirm: bool) {
        if let Some(t) = self.txns.get_mut(&txn) {
            if confirm {
                t.confirms.insert(shard);
            } else {
                t.peer_ts.insert(shard, ts);
            }
        }
    }

    fn on_agree(&mut self, ctx: &mut Ctx<'_, TigaMsg>, from: NodeId, agree: Agreement) {
        let Agreement { txn, shard, ts, confirm, resend, .. } = agree;
        if !self.is_leader() || shard as usize >= self.topology.shard_count() {
            return;
        }
        let Some(t) = self.txns.get(&txn) else {
            let old = ts + self.config.agree_abandon_after < Ts::at(ctx.now());
            if resend && (old || self.absent.contains(&txn)) {
                // Every coordinator has given up on it by now: refuse it for good, and say so.
                if self.absent.len() < ABSENT_MAX {
                    self.absent.insert(txn);
                    self.early_agree.remove(&txn);
                    ctx.send(from, TigaMsg::Absent { view: self.view.number, txn, shard: self.shard });
                }
                return;
            }
            if self.early_agree.len() < EARLY_AGREE_MAX || self.early_agree.contains_key(&txn) {
                self.early_agree.entry(txn).or_default().insert((shard, confirm), ts);
            }
            return;
        };
        if !t.piece.shards.contains(&shard) {
            return;
        }
        if resend && !t.announced {
            // Announcing at release, not released yet: a peer's retry reveals it now to all.
            self.announce(ctx, txn, false);
        } else if resend {
            // A peer lost something: answer with our timestamp, and our confirmation if given.
            let (mine, confirmed) = (t.original_ts, t.lowered && t.status == Status::Final);
            ctx.send(
                from,
                TigaMsg::Agree(Agreement {
                    view: self.view.number,
                    txn,
                    shard: self.shard,
                    ts: mine,
                    confirm: false,
                    resend: false,
                }),
            );
            if confirmed {
                let agreed = t.ts;
                ctx.send(
                    from,
                    TigaMsg::Agree(Agreement {
                        view: self.view.number,
                        txn,
                        shard: self.shard,
                        ts: agreed,
                        confirm: true,
                        resend: false,
                    }),
                );
            }
        }
        self.record_agree(txn, shard, ts, confirm);
        self.evaluate_agreement(ctx, txn);
        self.release_due(ctx);
    }

    /// Another involved leader never received `id` and refuses it: revoke and drop it here
    /// too. Safe: the coordinator gave up before the probe could be answered "absent", so it
    /// never commits. (Followers keep it in their hashes for those keys, which costs the fast
    /// path on them; view changes will clean that up.)
    fn on_absent(&mut self, ctx: &mut Ctx<'_, TigaMsg>, from: NodeId, id: TxnId, shard: ShardId) {
        let Some(t) = self.txns.get(&id) else { return };
        if !self.is_leader()
            || !t.piece.shards.contains(&shard)
            || self.topology.leader_node(shard) != from
            || matches!(t.status, Status::Final | Status::Abandoned)
        {
            return;
        }
        let (status, ts) = (t.status, t.ts);
        match status {
            Status::Released => self.revoke(id),
            Status::Queued => {
                let t = &self.txns[&id];
                self.pq.remove((ts, id), Self::keys(&t.piece));
            }
            _ => {}
        }
        if let Some(t) = self.txns.get_mut(&id) {
            t.status = Status::Abandoned;
        }
        self.awaiting.remove(&id);
        ctx.metric("tiga.server_abandoned", 1);
        self.release_due(ctx);
    }

    /// Once every involved leader's timestamp is known: the agreed timestamp is the maximum.
    /// A lower leader moves the transaction there (revoking a speculative execution) and will
    /// confirm after executing it at the agreed timestamp (case 3); an equal leader settles it
    /// (case 1, or case 2 once the lower leaders confirm).
    fn evaluate_agreement(&mut self, ctx: &mut Ctx<'_, TigaMsg>, id: TxnId) {
        let Some(t) = self.txns.get(&id) else { return };
        if matches!(t.status, Status::Abandoned) || (!t.announced && t.agreed.is_none()) {
            return;
        }
        if t.agreed.is_some() || matches!(t.status, Status::Final | Status::Held) {
            self.settle(ctx, id);
            return;
        }
        let others: Vec<ShardId> = t.piece.shards.iter().copied().filter(|s| *s != self.shard).collect();
        if !others.iter().all(|s| t.peer_ts.contains_key(s)) {
            return;
        }
        let agreed = others.iter().map(|s| t.peer_ts[s]).max().unwrap_or(Ts::ZERO).max(t.ts);
        let (status, ts) = (t.status, t.ts);
        if ts < agreed {
            if status == Status::Released {
                self.revoke(id);
            }
            self.pq.remove((ts, id), Self::keys(&self.txns[&id].piece));
            let t = self.txns.get_mut(&id).expect("exists");
            t.ts = agreed;
            t.agreed = Some(agreed);
            t.lowered = true;
            t.status = Status::Queued;
            self.pq.insert((agreed, id));
            ctx.metric("tiga.server_revisions", 1);
            return;
        }
        self.txns.get_mut(&id).expect("exists").agreed = Some(agreed);
        self.settle(ctx, id);
    }

    /// Moves a released multi-shard transaction towards final: execute (if not yet), confirm
    /// (if this leader was lower), or finalize once every lower leader has confirmed.
    fn settle(&mut self, ctx: &mut Ctx<'_, TigaMsg>, id: TxnId) {
        let Some(t) = self.txns.get(&id) else { return };
        if t.status != Status::Released {
            return;
        }
        if t.agreed.is_none() {
            // Detective mode: execute speculatively while the agreement is under way.
            if !t.executed && !self.config.preventive {
                self.execute_and_reply(ctx, id);
            }
            return;
        }
        if !t.executed {
            self.execute_and_reply(ctx, id);
        }
        let t = &self.txns[&id];
        if t.lowered {
            let ts = t.ts;
            let to: Vec<NodeId> =
                t.piece.shards.iter().filter(|s| **s != self.shard).map(|s| self.topology.leader_node(*s)).collect();
            for n in to {
                ctx.send(
                    n,
                    TigaMsg::Agree(Agreement {
                        view: self.view.number,
                        txn: id,
                        shard: self.shard,
                        ts,
                        confirm: true,
                        resend: false,
                    }),
                );
            }
            self.finalize(ctx, id);
            return;
        }
        let agreed = t.ts;
        let lower_unconfirmed = t.peer_ts.iter().any(|(s, pts)| *pts < agreed && !t.confirms.contains(s));
        if !lower_unconfirmed || self.config.unsafe_skip_second_round {
            self.finalize(ctx, id);
        }
    }

    /// Retries agreement messages that may have been lost: round 1 to leaders not heard from,
    /// and a nudge to lower leaders whose confirmation is missing — for transactions whose
    /// last agreement messages went out at least `agree_retry` ago. (Retrying every waiting
    /// transaction at each tick resent the ones that started waiting just before it: under
    /// load, when answers queue behind other work, that doubled the agreement traffic and
    /// pushed throughput down further.)
    fn retry_agreements(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        let now = ctx.now();
        let retry_after = self.config.agree_retry;
        let ids: Vec<TxnId> = self.awaiting.iter().copied().collect();
        for id in ids {
            let Some(t) = self.txns.get_mut(&id) else {
                self.awaiting.remove(&id);
                continue;
            };
            if matches!(t.status, Status::Final | Status::Abandoned) {
                self.awaiting.remove(&id);
                continue;
            }
            if !t.announced {
                // Announcing at release: past the timeout, announce before the release.
                let timeout = self.config.announce_at_release.unwrap_or_default();
                if now.saturating_since(t.agree_sent_at) >= timeout {
                    self.stats.announce_timeouts += 1;
                    ctx.metric("tiga.server_announce_timeouts", 1);
                    self.announce(ctx, id, false);
                    self.evaluate_agreement(ctx, id);
                }
                continue;
            }
            if now.saturating_since(t.agree_sent_at) < retry_after {
                continue;
            }
            t.agree_sent_at = now;
            let t = &*t;
            let missing_ts = t.piece.shards.iter().any(|s| *s != self.shard && !t.peer_ts.contains_key(s));
            let unconfirmed: Vec<NodeId> = match t.agreed {
                Some(agreed) if !t.lowered => t
                    .peer_ts
                    .iter()
                    .filter(|(s, pts)| **pts < agreed && !t.confirms.contains(s))
                    .map(|(s, _)| self.topology.leader_node(*s))
                    .collect(),
                _ => Vec::new(),
            };
            let mine = t.original_ts;
            if missing_ts {
                self.announce(ctx, id, true);
            }
            for n in unconfirmed {
                ctx.send(
                    n,
                    TigaMsg::Agree(Agreement {
                        view: self.view.number,
                        txn: id,
                        shard: self.shard,
                        ts: mine,
                        confirm: false,
                        resend: true,
                    }),
                );
            }
        }
    }

    fn finalize(&mut self, ctx: &mut Ctx<'_, TigaMsg>, id: TxnId) {
        let Some(t) = self.txns.get_mut(&id) else { return };
        if t.status == Status::Final {
            return;
        }
        let by_reference = t.status == Status::Released && t.released_journaled;
        t.status = Status::Final;
        t.agreed = Some(t.ts);
        t.undo.clear();
        t.tpcc_undo = TpccUndo::default();
        let entry = LogEntry { ts: t.ts, piece: t.piece.clone() };
        for k in Self::keys(&entry.piece) {
            if self.locked.get(k) == Some(&id) {
                self.locked.remove(k);
                self.pq.unlocked(*k);
            }
        }
        let record = Record::logged(&entry, by_reference);
        self.log.push(entry);
        self.journal(ctx, record);
        self.stats.finalized += 1;
        let me = self.replica as usize;
        self.sync_point[me] = self.log.len();
        self.advance_commit_point(ctx);
    }

    /// Leader: arms log synchronization and agreement retries (once per leadership).
    fn arm_leader_timers(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        if !self.leader_timers_armed {
            self.leader_timers_armed = true;
            ctx.set_timer(ServerTimer::Sync, self.config.sync_interval);
            ctx.set_timer(ServerTimer::AgreeRetry, self.agree_tick());
        }
    }

    /// How often a leader looks at its waiting agreements: every `agree_retry`, or as often as
    /// the announce timeout when announcing at release.
    fn agree_tick(&self) -> std::time::Duration {
        self.config.announce_at_release.map_or(self.config.agree_retry, |t| t.min(self.config.agree_retry))
    }

    fn advance_commit_point(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        let mut points = self.sync_point.clone();
        points.sort_unstable_by(|a, b| b.cmp(a));
        let f = self.topology.f();
        self.commit_point = self.commit_point.max(points.get(f).copied().unwrap_or(0));
        self.apply_committed(ctx, self.commit_point);
    }

    /// Executes log entries up to `upto` (exclusive) on the committed state — a follower's
    /// store, a leader's separate copy (its live store also holds speculative writes) — and
    /// takes a checkpoint when one is due ([`Server::checkpoint_gap`]).
    fn apply_committed(&mut self, ctx: &mut Ctx<'_, TigaMsg>, upto: u64) {
        let leader = self.is_leader();
        let upto = upto.min(self.log.len());
        let mut warmed = self.executed;
        while self.executed < upto {
            if self.executed >= warmed && upto - self.executed > 1 {
                warmed = upto.min(self.executed + WARM_AHEAD as u64);
                let state = if leader { &self.committed } else { &self.store };
                let pieces = (self.executed..warmed).filter_map(|p| self.log.get(p)).map(|e| &*e.piece);
                warm(&self.committed_maps, state, pieces);
            }
            let Some(entry) = self.log.get(self.executed) else { break };
            let piece = &entry.piece;
            self.committed_maps.add(piece, entry.ts);
            let state = if leader { &mut self.committed } else { &mut self.store };
            let ops::Execution { outputs, versions, .. } = ops::execute_final(state, &piece.ops);
            if let Some(tpcc) = state.tpcc.as_mut().filter(|_| !piece.tpcc.is_empty()) {
                tpcc.run(&piece.tpcc, &piece.ops, false);
            }
            // What the execution returned, for a while: a new leader answers a coordinator's
            // resend of a transaction its log had already executed from it.
            let result = Arc::new(PieceResult { outputs, versions });
            let segment = &mut self.segment;
            segment.entries.push(Truncated { ts: entry.ts, txn: piece.txn, position: self.executed });
            segment.results.push(Arc::clone(&result));
            if piece.shards.len() > 1 && !piece.txn_ops.is_empty() {
                segment.multi_shard.push(Arc::clone(piece));
            }
            self.results.push_back(result);
            if self.results.len() > RESULTS_KEPT {
                self.results.pop_front();
            }
            self.executed += 1;
            if self.segment.entries.len() >= Recent::POSITIONS_MAX {
                self.seal_segment();
            }
            self.retired.free_some();
            self.write_durable_pages(ctx);
            let state = if leader { &self.committed } else { &self.store };
            let gap = self.checkpoint_gap(state.keys.len());
            let last = self.checkpoint.as_ref().map_or(0, |c| c.position);
            if self.executed.saturating_sub(last) >= gap {
                let position = self.executed;
                self.seal_segment();
                let state = if leader { &self.committed } else { &self.store };
                let c = Arc::new(Checkpoint {
                    position,
                    state: state.clone(),
                    maps: self.committed_maps.clone(),
                    recent: self.recent.iter().cloned().collect(),
                });
                self.durable.start(ctx, Arc::clone(&c), gap);
                self.write_durable_pages(ctx);
                ctx.metric("tiga.checkpoints_taken", 1);
                let old = self.checkpoint.replace(c);
                self.retired.checkpoint(old);
                self.compact_log();
            }
        }
    }

    /// Positions between two checkpoints of a state of `keys` keys (`TigaConfig`'s two rules).
    fn checkpoint_gap(&self, keys: usize) -> u64 {
        let per_key = (keys as u64).saturating_mul(self.config.checkpoint_positions_per_key);
        self.config.checkpoint_interval.max(per_key).max(1)
    }

    /// Writes the next pages of the checkpoint going to disk; once it is whole, the log below
    /// it goes, and a journal snapshot (now small: the log from there) replaces the records.
    fn write_durable_pages(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        if self.durable.step(ctx) {
            self.compact_log();
            self.write_snapshot(ctx);
        }
    }

    /// Closes the segment of recent transactions being filled (see [`Recent`]).
    fn seal_segment(&mut self) {
        let next = Recent::starting_at(self.executed);
        let segment = std::mem::replace(&mut self.segment, next);
        if !segment.entries.is_empty() {
            self.recent.push_back(Arc::new(segment));
        }
    }

    /// Drops the log below the latest checkpoint. A leader keeps what a lagging follower
    /// still needs, up to one more checkpoint interval; a follower further behind installs the
    /// checkpoint instead. The transactions of dropped entries are forgotten later
    /// ([`Server::forget_truncated`]).
    fn compact_log(&mut self) {
        let Some(upto) = self.checkpoint.as_ref().map(|c| c.position) else { return };
        let mut target = upto;
        if self.is_leader() {
            let me = self.replica as usize;
            let slowest = self.sync_point.iter().enumerate().filter(|(r, _)| *r != me).map(|(_, p)| *p).min();
            let floor = upto.saturating_sub(self.config.checkpoint_interval);
            target = slowest.map_or(upto, |p| p.clamp(floor, upto));
        }
        // The journal must still hold the log from the checkpoint on disk.
        let target = target.min(self.durable.position());
        for pos in self.log.base()..target.min(self.log.len()) {
            if let Some(e) = self.log.get(pos) {
                self.truncated.push_back(Truncated { ts: e.ts, txn: e.piece.txn, position: pos });
            }
        }
        self.log.compact(target);
    }

    /// How long a coordinator resends a transaction: it gives up after `max_sends` sends, one
    /// every `retry_timeout`.
    fn resend_horizon(&self) -> Duration {
        self.config.retry_timeout * self.config.max_sends
    }

    /// How long after its timestamp a truncated entry's transaction is remembered.
    fn forget_after(&self) -> Duration {
        self.resend_horizon() + self.config.future_slack
    }

    /// Forgets the transactions of truncated entries once no coordinator can resend them
    /// ([`Server::resend_horizon`]; their timestamps are in the past by then), with
    /// `future_slack` to spare for clock error; at most [`FORGOTTEN_PER_CALL`] per call.
    fn forget_truncated(&mut self, now: Ts) {
        let keep = self.forget_after();
        self.gate.forget_older(now.saturating_sub(keep));
        for _ in 0..FORGOTTEN_PER_CALL {
            let Some(&Truncated { ts, txn, .. }) = self.truncated.front() else { break };
            if ts + keep >= now {
                break;
            }
            self.truncated.pop_front();
            if self.txns.get(&txn).is_some_and(|t| t.status == Status::Final) {
                self.txns.remove(&txn);
            }
        }
        // A segment goes once its newest transaction is that old (the log is in timestamp order).
        while let Some(segment) = self.recent.front() {
            if segment.entries.last().is_some_and(|t| t.ts + keep >= now) {
                break;
            }
            if let Some(old) = self.recent.pop_front() {
                self.retired.segments.push(old);
            }
        }
    }

    /// Log entries and transactions this replica holds (bounded by the checkpoint interval
    /// and what is in flight).
    pub fn retained(&self) -> (usize, usize) {
        (self.log.held(), self.txns.len())
    }

    /// Leader: sends replica `r` the latest checkpoint (it needs entries below the log's base),
    /// unless it sent it the same one lately: a follower retrying its view-change report
    /// would otherwise get (and the leader copy) the whole state again on every retry.
    fn send_checkpoint(&mut self, ctx: &mut Ctx<'_, TigaMsg>, r: usize) -> Option<u64> {
        let position = self.checkpoint.as_ref()?.position;
        let now = ctx.now();
        let again_after = self.config.view_change_retry * 4;
        if let Some(Some((sent, at))) = self.checkpoint_sent.get(r) {
            if *sent == position && now < *at + again_after {
                self.next_send[r] = position;
                return Some(position);
            }
        }
        let c = self.checkpoint.clone()?;
        if let Some(slot) = self.checkpoint_sent.get_mut(r) {
            *slot = Some((position, now));
        }
        let node = self.topology.shards[self.shard as usize][r];
        ctx.metric("tiga.checkpoints_sent", 1);
        ctx.send(
            node,
            TigaMsg::InstallCheckpoint { view: self.view.number, checkpoint: c, commit_point: self.commit_point },
        );
        self.next_send[r] = position;
        self.ack_progress_at[r] = ctx.now();
        Some(position)
    }

    /// Follower: installs the leader's checkpoint when its own log cannot reach it.
    fn on_install_checkpoint(
        &mut self,
        ctx: &mut Ctx<'_, TigaMsg>,
        from_node: NodeId,
        c: Arc<Checkpoint>,
        commit_point: u64,
    ) {
        if self.is_leader() || from_node != self.topology.leader_node(self.shard) || c.position <= self.executed {
            return;
        }
        if c.position <= self.executed_or_synced() {
            // The log reaches it and matches the leader's there (it served in this view, or
            // executed that far): executing catches up without it. Installing would drop the
            // entries past it, which the leader's commit point may count — also on a follower
            // that restarted in this view and is still recovering (a review's schedule, the
            // test `a_replayed_checkpoint_never_drops_entries_a_restarted_follower_acknowledged`:
            // such a follower, then the leader's crash, lost two committed transactions).
            return;
        }
        self.install_checkpoint(ctx, c);
        self.rebuild_keeping_released();
        self.write_snapshot(ctx);
        if self.state == ServerState::Normal {
            self.apply_committed(ctx, commit_point.min(self.log.len()));
            let leader = self.topology.leader_node(self.shard);
            ctx.send(
                leader,
                TigaMsg::SyncAck { view: self.view.number, replica: self.replica, sync_point: self.log.len() },
            );
        }
    }

    fn send_log_sync(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        let now = ctx.now();
        let replicas = self.topology.shards[self.shard as usize].clone();
        let len = self.log.len();
        for (r, node) in replicas.iter().enumerate() {
            if r as u32 == self.replica {
                continue;
            }
            // A lost batch leaves the follower with a gap it cannot fill (it ignores batches that
            // start beyond its log). When its acknowledgements stop advancing although entries
            // are outstanding, probe from the acknowledged point.
            let stalled = now.saturating_since(self.ack_progress_at[r]) > self.config.sync_resend_after;
            if self.sync_point[r] < self.next_send[r].max(len) && stalled {
                self.next_send[r] = self.sync_point[r];
                self.ack_progress_at[r] = now;
                self.stalls[r] = self.stalls[r].saturating_add(1);
                if self.stalls[r] == 2 {
                    ctx.metric("tiga.sync_probing", 1);
                }
            }
            // Nothing new: still an empty synchronization every heartbeat interval, so that the
            // follower can tell the view manager it hears its leader.
            let idle = now.saturating_since(self.sync_sent_at[r]) < self.config.heartbeat_interval;
            if self.stalls[r] >= 2 {
                // Probing: the heartbeat is the probe; a live follower answers it with its log
                // length, and streaming resumes from there (`on_sync_ack`).
                if !idle {
                    self.sync_sent_at[r] = now;
                    self.commit_point_sent[r] = self.commit_point;
                    let (view, from, commit_point) = (self.view.number, self.sync_point[r], self.commit_point);
                    ctx.send(*node, TigaMsg::LogSync { view, from, entries: Vec::new(), commit_point });
                }
                continue;
            }
            if self.next_send[r] < self.log.base() && self.send_checkpoint(ctx, r).is_none() {
                continue;
            }
            let from = self.next_send[r];
            if from >= len && self.commit_point_sent[r] == self.commit_point && idle {
                continue;
            }
            self.sync_sent_at[r] = now;
            let mut end = from;
            let mut bytes = 0;
            while end < (from + SYNC_BATCH_MAX as u64).min(len) {
                let Some(e) = self.log.get(end) else { break };
                bytes += e.piece.payload_bytes();
                if end > from && bytes > SYNC_BATCH_BYTES_MAX {
                    break;
                }
                end += 1;
            }
            let entries = self.log.range(from, end);
            ctx.metric("tiga.sync_entries_sent", entries.len() as u64);
            self.next_send[r] = end;
            self.commit_point_sent[r] = self.commit_point;
            ctx.send(
                *node,
                TigaMsg::LogSync { view: self.view.number, from, entries, commit_point: self.commit_point },
            );
        }
    }

    fn on_log_sync(
        &mut self,
        ctx: &mut Ctx<'_, TigaMsg>,
        from_node: NodeId,
        from: u64,
        entries: Vec<LogEntry>,
        commit_point: u64,
    ) {
        if self.is_leader() || from_node != self.topology.leader_node(self.shard) {
            return;
        }
        self.leader_heard_at = ctx.now();
        let len = self.log.len();
        if from <= len {
            let mut entries = entries.into_iter();
            entries.by_ref().take((len - from) as usize).for_each(drop);
            for i in 0.. {
                let Some(entry) = entries.next() else { break };
                if i % WARM_AHEAD == 0 {
                    // As `warm` does: the transactions and key maps the next entries touch.
                    for e in std::iter::once(&entry).chain(entries.as_slice().iter().take(WARM_AHEAD - 1)) {
                        std::hint::black_box(self.txns.get(&e.piece.txn));
                        for k in Self::keys(&e.piece) {
                            std::hint::black_box(self.maps.0.get(k));
                        }
                    }
                }
                if !self.validate(&entry.piece) {
                    // The leader sent something this shard cannot hold: stop here rather than
                    // diverge; the sync-point tells the leader where we are.
                    ctx.metric("tiga.server_bad_log_entry", 1);
                    break;
                }
                self.adopt_entry(ctx, entry);
            }
        }
        self.apply_committed(ctx, commit_point.min(self.log.len()));
        let leader = self.topology.leader_node(self.shard);
        ctx.send(
            leader,
            TigaMsg::SyncAck { view: self.view.number, replica: self.replica, sync_point: self.log.len() },
        );
        self.release_due(ctx);
    }

    /// Follower: takes the leader's final timestamp for a transaction into the log, fixing
    /// this replica's hashes and maps, and answers the coordinator on the slow path.
    fn adopt_entry(&mut self, ctx: &mut Ctx<'_, TigaMsg>, entry: LogEntry) {
        let id = entry.piece.txn;
        let ts = entry.ts;
        for (waiter, reply) in self.gate.logged(id) {
            if let Some(t) = self.txns.get_mut(&waiter) {
                t.last_reply = Some(reply.clone());
                ctx.send(waiter.coordinator(), reply);
            }
        }
        // The maps take the entry at the leader's timestamp: its hash replaces the one released
        // here at another timestamp, and joins those of the keys if it was not released.
        match self.txns.get(&id).map(|t| (t.status, t.ts)) {
            Some((Status::Released, old)) if old == ts => self.maps.stamp(&entry.piece, ts),
            Some((Status::Released, old)) => {
                ctx.metric("tiga.follower_ts_fixed", 1);
                self.xor_hash(&entry.piece, old);
                self.maps.add(&entry.piece, ts);
            }
            Some((Status::Queued, old)) => {
                self.pq.remove((old, id), Self::keys(&entry.piece));
                self.maps.add(&entry.piece, ts);
            }
            Some((Status::Held, _)) | None => self.maps.add(&entry.piece, ts),
            // Final: already adopted. Abandoned is a leader's state (never on a follower).
            Some((Status::Final | Status::Abandoned, _)) => self.maps.stamp(&entry.piece, ts),
        }
        let owd_ns = self.txns.get(&id).map_or(0, |t| t.owd_ns);
        let reply = TigaMsg::Reply(ServerReply {
            view: self.view.number,
            txn: id,
            shard: self.shard,
            replica: self.replica,
            kind: ReplyKind::Slow,
            ts,
            hash: [0; 20],
            result: None,
            owd_ns,
        });
        ctx.send(id.coordinator(), reply.clone());
        let t = self.txns.entry(id).or_insert_with(|| Txn::new(entry.piece.clone(), ts, Status::Final, owd_ns));
        let released_at = t.ts;
        // By reference only if the piece journaled as released is the leader's (a coordinator
        // could have sent this replica another under the same id).
        let by_reference = t.status == Status::Released
            && t.released_journaled
            && (Arc::ptr_eq(&t.piece, &entry.piece) || t.piece == entry.piece);
        t.ts = ts;
        t.status = Status::Final;
        t.last_reply = Some(reply);
        let entry =
            if self.config.unsafe_follower_keeps_own_ts { LogEntry { ts: released_at, ..entry } } else { entry };
        let record = Record::logged(&entry, by_reference);
        self.log.push(entry);
        self.journal(ctx, record);
    }

    /// Makes a change (already applied in memory) durable, or the whole state once the journal
    /// is long (module docs). Returns whether it is durable (the record, or a snapshot holding
    /// what it says).
    fn journal(&mut self, ctx: &mut Ctx<'_, TigaMsg>, record: Record) -> bool {
        if self.journaled >= JOURNAL_RECORDS_PER_SNAPSHOT.max(4 * self.log.held() as u64) {
            return self.write_snapshot(ctx);
        }
        // Encoded into a buffer kept between records, then copied out at its exact size: one
        // allocation per record, where encoding into a fresh vector regrows it at every
        // doubling of its length.
        let mut buf = std::mem::take(&mut self.record_buf);
        buf.clear();
        match postcard::to_extend(&record, buf) {
            Ok(buf) => {
                ctx.persist(buf.clone());
                self.record_buf = buf;
                self.journaled += 1;
                true
            }
            Err(_) => false,
        }
    }

    /// A reply saying that `txn` is in this replica's log at `ts`, in the current view.
    fn slow_reply(&self, txn: TxnId, ts: Ts) -> TigaMsg {
        TigaMsg::Reply(ServerReply {
            view: self.view.number,
            txn,
            shard: self.shard,
            replica: self.replica,
            kind: ReplyKind::Slow,
            ts,
            hash: [0; 20],
            result: None,
            owd_ns: 0,
        })
    }

    /// Takes `c` as this replica's executed state: the log continues from its position (the
    /// caller rebuilds what depends on the log).
    fn install_checkpoint(&mut self, ctx: &mut Ctx<'_, TigaMsg>, c: Arc<Checkpoint>) {
        ctx.metric("tiga.checkpoints_installed", 1);
        // Durable at once: the log continues from it with nothing below.
        self.durable.write_now(ctx, Arc::clone(&c));
        self.adopt_checkpoint(c);
    }

    /// Takes `c` as the executed state, with an empty log from its position on (a checkpoint
    /// sent by the leader, or this replica's own journaled one after a restart).
    fn adopt_checkpoint(&mut self, c: Arc<Checkpoint>) {
        let store = std::mem::replace(&mut self.store, c.state.clone());
        self.retired.store(store);
        self.executed = c.position;
        let maps = std::mem::replace(&mut self.committed_maps, c.maps.clone());
        self.retired.maps(maps);
        // The results of the last positions below the checkpoint, as `apply_committed` keeps
        // them: back from its position for as long as the segments have them all.
        self.results.clear();
        let mut end = c.position;
        for segment in c.recent.iter().rev() {
            if segment.end() != end {
                break;
            }
            for r in segment.results.iter().rev().take(RESULTS_KEPT - self.results.len()) {
                self.results.push_front(Arc::clone(r));
            }
            if segment.results.len() < segment.entries.len() || self.results.len() == RESULTS_KEPT {
                break;
            }
            end = segment.from;
        }
        self.recent = c.recent.iter().cloned().collect();
        self.segment = Recent::starting_at(c.position);
        self.log = Log::starting_at(c.position);
        self.remember_recent(&c);
        let old = self.checkpoint.replace(c);
        self.retired.checkpoint(old);
    }

    /// The transactions released and not yet in the log, at the timestamps they were released.
    fn released_entries(&self) -> Vec<LogEntry> {
        let mut released: Vec<LogEntry> = self
            .txns
            .values()
            .filter(|t| t.status == Status::Released)
            .map(|t| LogEntry { ts: t.ts, piece: t.piece.clone() })
            .collect();
        released.sort_by_key(|e| (e.ts, e.piece.txn));
        released
    }

    /// Remembers the recent transactions a checkpoint being installed covers, so that their
    /// resends are answered, not run again (with the pieces of the multi-shard ones, which a
    /// view change lists to the other shards; the others' pieces this replica never needs).
    fn remember_recent(&mut self, c: &Checkpoint) {
        self.truncated = c.recent.iter().flat_map(|s| s.entries.iter().copied()).collect();
        let pieces: BTreeMap<TxnId, &Arc<Piece>> =
            c.recent.iter().flat_map(|s| &s.multi_shard).map(|p| (p.txn, p)).collect();
        for t in c.recent.iter().flat_map(|s| &s.entries) {
            let piece = match pieces.get(&t.txn) {
                Some(p) if self.validate(p) => Arc::clone(p),
                _ => Arc::new(Piece::new(t.txn, self.shard, vec![self.shard], Vec::new())),
            };
            let mut txn = Txn::new(piece, t.ts, Status::Final, 0);
            txn.last_reply = Some(self.slow_reply(t.txn, t.ts));
            self.txns.insert(t.txn, txn);
        }
    }

    /// `maps`: also take it into the maps and hashes (false for an executed entry, which the
    /// executed prefix's maps hold already).
    fn index_entry(&mut self, entry: LogEntry, maps: bool) {
        if maps {
            self.maps.add(&entry.piece, entry.ts);
        }
        let mut t = Txn::new(entry.piece.clone(), entry.ts, Status::Final, 0);
        // A resend is answered: the entry is in this replica's log (a leader replaces this
        // with its execution's result when it starts a view).
        t.last_reply = Some(self.slow_reply(entry.piece.txn, entry.ts));
        self.txns.insert(entry.piece.txn, t);
        self.log.push(entry);
    }

    fn on_sync_ack(&mut self, ctx: &mut Ctx<'_, TigaMsg>, replica: u32, sync_point: u64) {
        let r = replica as usize;
        if !self.is_leader() || r >= self.sync_point.len() {
            return;
        }
        let acked = sync_point.min(self.log.len());
        if self.stalls[r] >= 2 {
            // A probed follower is alive: stream to it from where its log ends.
            self.next_send[r] = acked.max(self.sync_point[r]);
            self.ack_progress_at[r] = ctx.now();
            self.stalls[r] = 0;
        }
        if acked > self.sync_point[r] {
            self.sync_point[r] = acked;
            self.ack_progress_at[r] = ctx.now();
            self.stalls[r] = 0;
        }
        self.advance_commit_point(ctx);
    }
}

impl Process for Server {
    type Msg = TigaMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        if !self.voter {
            // Durable before anything else: a crash now must not give the vote back.
            self.write_snapshot(ctx);
        }
        if self.stats.recovered_entries > 0 {
            ctx.metric("tiga.server_recovered_entries", self.stats.recovered_entries);
        }
        if self.stats.disk_lost {
            ctx.metric("tiga.server_disk_lost", 1);
        }
        if !self.view_managers.is_empty() {
            self.heartbeat(ctx);
            ctx.set_timer(ServerTimer::Heartbeat, self.config.heartbeat_interval);
        }
        match self.state {
            ServerState::Normal if self.is_leader() => self.arm_leader_timers(ctx),
            // A restarted follower asks its leader for the log (the leader answers once it
            // serves in this view; a newer view reaches it through the view manager).
            ServerState::Recovering if !self.is_leader() => {
                self.send_log_state(ctx, self.log.len());
                ctx.set_timer(ServerTimer::ViewChangeRetry, self.config.view_change_retry);
            }
            _ => {}
        }
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, TigaMsg>, from: NodeId, msg: TigaMsg) {
        let normal = self.state == ServerState::Normal;
        let current = self.view.number;
        match msg {
            TigaMsg::Submit(Submit { view, .. }) if view < current => {
                // A coordinator behind: tell it the view (it resends in it).
                ctx.send(from, TigaMsg::NewView { view: self.view.clone() });
            }
            TigaMsg::Submit(Submit { view, .. }) if view == current && !normal => self.buffer_submit(ctx, from, msg),
            TigaMsg::Submit(submit) if submit.view == current => {
                let arrived = ctx.now();
                self.on_submit(ctx, from, submit, arrived);
                self.release_due(ctx);
            }
            TigaMsg::Agree(agree) if agree.view == current && normal => {
                if self.topology.leader_node(agree.shard.min(self.topology.shard_count() as u32 - 1)) == from {
                    self.on_agree(ctx, from, agree);
                }
            }
            TigaMsg::Absent { view, txn, shard } if view == current && normal => {
                if (shard as usize) < self.topology.shard_count() {
                    self.on_absent(ctx, from, txn, shard);
                }
            }
            TigaMsg::LogSync { view, from: start, entries, commit_point } if view == current && normal => {
                self.on_log_sync(ctx, from, start, entries, commit_point);
            }
            TigaMsg::SyncAck { view, replica, sync_point } if view == current && normal => {
                if self.topology.shards[self.shard as usize].get(replica as usize) == Some(&from) {
                    self.on_sync_ack(ctx, replica, sync_point);
                }
            }
            TigaMsg::NewView { view } if self.view_managers.contains(&from) || self.is_server(from) => {
                self.on_new_view(ctx, view)
            }
            TigaMsg::ViewFloor { nonce, view } if self.view_managers.contains(&from) => {
                self.on_view_floor(ctx, from, nonce, view)
            }
            TigaMsg::CollectLog { view, from: start } => self.on_collect_log(ctx, from, view, start),
            TigaMsg::LogState { view, replica, report } if view == current => {
                self.on_log_state(ctx, from, replica, report)
            }
            TigaMsg::Verify { view, shard, kind, items } if view == current => {
                self.on_verify(ctx, from, shard, kind, items)
            }
            TigaMsg::StartView { view, from: start, entries, commit_point } if view == current => {
                self.on_start_view(ctx, from, start, entries, commit_point)
            }
            TigaMsg::InstallCheckpoint { view, checkpoint, commit_point } if view == current => {
                self.on_install_checkpoint(ctx, from, checkpoint, commit_point)
            }
            TigaMsg::PreRead(request) => match self.committed.tpcc.as_ref().and_then(|t| t.answer_pre_read(request)) {
                Some(answer) => ctx.send(from, TigaMsg::PreReadAnswer(answer)),
                None => ctx.metric("tiga.server_ignored", 1),
            },
            _ => ctx.metric("tiga.server_ignored", 1),
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, TigaMsg>, timer: TimerId) {
        let Some(timer) = ServerTimer::from_id(timer) else { return };
        let leading = self.is_leader() && self.state == ServerState::Normal;
        match timer {
            ServerTimer::Release => {
                self.release_timer_at = None;
                if self.state == ServerState::Normal {
                    self.release_due(ctx);
                }
            }
            ServerTimer::Sync if leading => {
                self.send_log_sync(ctx);
                ctx.set_timer(ServerTimer::Sync, self.config.sync_interval);
            }
            ServerTimer::AgreeRetry if leading => {
                self.retry_agreements(ctx);
                self.release_due(ctx);
                ctx.set_timer(ServerTimer::AgreeRetry, self.agree_tick());
            }
            ServerTimer::Sync | ServerTimer::AgreeRetry => self.leader_timers_armed = false,
            ServerTimer::Heartbeat => {
                self.heartbeat(ctx);
                ctx.set_timer(ServerTimer::Heartbeat, self.config.heartbeat_interval);
            }
            ServerTimer::ViewChangeRetry => self.on_vc_retry(ctx),
        }
    }

    /// A restarted server whose disk was lost or wiped: it comes back recovering with an empty
    /// log, rejoins through its leader like any restarted follower, and does not vote until it
    /// serves in a view later than the first it hears of (its fast replies and acknowledged
    /// sync-points went with its disk; a view change counting it could drop a committed
    /// transaction).
    fn on_amnesia(&mut self) {
        self.on_recover(&Stored::default());
        self.stats.disk_lost = true;
        self.voter = false;
        self.vc.amnesia = true;
    }

    /// A restarted server's durable state: the last snapshot, then every change journaled
    /// since, up to the first record that does not decode. It comes back recovering (module
    /// docs of [`view_change`]); with a journal it cannot read whole, it does not vote.
    fn on_recover(&mut self, stored: &Stored) {
        self.state = ServerState::Recovering;
        let mut snapshot = Snapshot {
            view: self.view.clone(),
            last_normal: 0,
            voter: true,
            amnesiac: false,
            view_floor: None,
            log_from: 0,
            log: Vec::new(),
            released: Vec::new(),
        };
        match stored.snapshot.as_deref().map(postcard::from_bytes::<Snapshot>) {
            Some(Ok(s)) if s.view.fits(&self.topology) => snapshot = s,
            Some(_) => {
                // Without its snapshot it does not know its view: as after a lost disk.
                self.stats.journal_unreadable += 1;
                self.vc.amnesia = true;
            }
            None => {}
        }
        let mut released: BTreeMap<TxnId, LogEntry> = snapshot.released.into_iter().map(|e| (e.piece.txn, e)).collect();
        let mut log = snapshot.log;
        for r in &stored.records {
            match postcard::from_bytes::<Record>(r) {
                Ok(Record::Logged(e)) => {
                    released.remove(&e.piece.txn);
                    log.push(e);
                }
                Ok(Record::Released(e)) => {
                    released.insert(e.piece.txn, e);
                }
                Ok(Record::LoggedReleased { txn, ts }) => match released.remove(&txn) {
                    Some(e) => log.push(LogEntry { ts, piece: e.piece }),
                    // The record it names is not there: the journal is not whole.
                    None => {
                        self.stats.journal_unreadable += 1;
                        break;
                    }
                },
                Err(_) => {
                    self.stats.journal_unreadable += 1;
                    break;
                }
            }
        }
        self.view = snapshot.view;
        self.topology.leader = self.view.leaders.clone();
        self.config.preventive = self.view.preventive;
        self.last_normal = snapshot.last_normal;
        // The log continues from the checkpoint on disk, if any: install it (with the ids of
        // the recent transactions it covers, so that a resend of one is answered, not re-run).
        // Its pages may be newer than the snapshot: the entries below it are dropped.
        let checkpoint = self.durable.load(stored);
        let from = match checkpoint {
            Ok(Some(c)) if c.position >= snapshot.log_from => {
                let from = c.position;
                self.stats.recovered_checkpoint = from;
                self.adopt_checkpoint(Arc::new(c));
                from
            }
            Ok(None) if snapshot.log_from == 0 => {
                self.log = Log::starting_at(0);
                0
            }
            // Pages missing or unreadable, or a log that starts past them: not whole.
            _ => {
                self.stats.journal_unreadable += 1;
                self.log = Log::starting_at(snapshot.log_from);
                snapshot.log_from
            }
        };
        self.voter = snapshot.voter && self.stats.journal_unreadable == 0;
        if snapshot.amnesiac {
            (self.vc.amnesia, self.vc.view_floor) = (true, snapshot.view_floor);
        }
        self.stats.recovered_entries = log.len() as u64;
        let skip = from.saturating_sub(snapshot.log_from) as usize;
        for e in log.into_iter().skip(skip) {
            self.log.push(e);
        }
        self.rebuild_from_log();
        let in_log: BTreeSet<TxnId> = self.log.iter().map(|e| e.piece.txn).collect();
        let mut released: Vec<LogEntry> = released.into_values().filter(|e| !in_log.contains(&e.piece.txn)).collect();
        released.sort_by_key(|e| (e.ts, e.piece.txn));
        self.vc.released = released;
        self.journaled = stored.records.len() as u64;
    }

    fn invariants(&self) -> Result<(), String> {
        let len = self.log.len();
        if self.executed > len {
            return Err(format!(
                "shard {} replica {}: executed {} > log length {len}",
                self.shard, self.replica, self.executed
            ));
        }
        if let Some(c) = &self.checkpoint {
            if c.position > self.executed {
                return Err(format!("checkpoint at {} beyond the executed point {}", c.position, self.executed));
            }
        }
        if self.log.base() > self.durable.position() {
            return Err(format!(
                "shard {} replica {}: log dropped below {} though the checkpoint on disk is at {}",
                self.shard,
                self.replica,
                self.log.base(),
                self.durable.position()
            ));
        }
        if self.is_leader() && self.state == ServerState::Normal {
            if self.commit_point > len || self.executed > self.commit_point {
                return Err(format!(
                    "shard {} leader: executed {} ≤ commit point {} ≤ log length {len} does not hold",
                    self.shard, self.executed, self.commit_point
                ));
            }
            if self.sync_point[self.replica as usize] != len {
                return Err(format!(
                    "leader's own sync point {} is not its log length {len}",
                    self.sync_point[self.replica as usize]
                ));
            }
        }
        if self.pq.len() > self.txns.len() {
            return Err(format!("{} queued entries but {} transactions", self.pq.len(), self.txns.len()));
        }
        self.pq.check_sometimes()?;
        for &(ts, id) in self.pq.heads() {
            match self.txns.get(&id) {
                Some(t) if t.status == Status::Queued && t.ts == ts => {}
                Some(t) => {
                    return Err(format!(
                        "queue head {id:?} at {ts} is {:?} at {} in the transaction table",
                        t.status, t.ts
                    ))
                }
                None => return Err(format!("queue head {id:?} at {ts} is not in the transaction table")),
            }
        }
        Ok(())
    }
}
