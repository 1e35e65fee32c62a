//! The client core shared by SWARM-KV, DM-ABD and RAW: operation bookkeeping, rounds of chains
//! to replicas, timeouts and membership, the index, buffer pools and this writer's word cache.
//! The protocol decisions live in [`crate::safe_guess`] (SWARM-KV), [`crate::dm_abd`] and
//! [`crate::raw`]; this file only moves operations from round to round.

use crate::client::{ChainTag, KvClient, KvError, KvOp, Membership, OpId, Outbox, CHAIN_TIMEOUT_DEFAULT};
use crate::hedge::RttFloor;
use crate::index::{self, IndexCache};
use crate::layout::Layout;
use crate::meta;
use crate::node_words::NodeWords;
use crate::pool::Pool;
use crate::verbs::{Chain, MemNodeId, Verb, VerbError, VerbOutcome};
use kairos_core::LocalTime;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

/// Directory claims a create tries before it fails with [`KvError::IndexFull`] (a claim is
/// lost only to a concurrent insert into the same entry of the same window).
pub const DIR_CLAIMS_MAX: u32 = 8;

/// Finished operations a client keeps to reuse their buffers.
const SPARE_OPS_MAX: usize = 64;

/// Every replied node's 8-byte words read by the verb `at` picks from its shape.
fn words_read_by(op: &Op, at: impl Fn(&Shape) -> Option<usize>) -> NodeMap<Vec<u64>> {
    let mut m = NodeMap::new();
    for (node, outs) in &op.replies {
        let Some(i) = op.shapes.get(node).and_then(&at) else { continue };
        if let Some(VerbOutcome::Read(bytes)) = outs.get(i) {
            m.insert(*node, meta::words(bytes));
        }
    }
    m
}

/// Every replied node's directory window, read by the verb at `shape.window`.
pub(crate) fn window_words(op: &Op) -> NodeMap<Vec<u64>> {
    words_read_by(op, |s| s.window)
}

/// Every replied node's metadata words, read by the verb at `shape.words`.
pub(crate) fn words_by_node(op: &Op) -> NodeMap<Vec<u64>> {
    words_read_by(op, |s| s.words)
}

/// Per-node state of one operation: a few replicas, iterated in node order (a `BTreeMap`'s
/// order, so decisions never depend on hashing), one allocation that survives `clear`.
pub(crate) type NodeMap<V> = litemap::LiteMap<MemNodeId, V>;

/// Which protocol a [`Client`] runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Protocol {
    /// SWARM-KV: Safe-Guess + timestamp locks + In-n-Out; 1 round trip in the common case.
    SwarmKv,
    /// ABD with out-of-place updates: 2 round trips for get and update.
    DmAbd,
    /// One node, no replication, no concurrency control: 1 round trip (a lower bound).
    Raw,
    /// FUSEE's SNAPSHOT replication (FAST 2023): 3 round trips per update, 1 per get on a
    /// cache hit (see [`crate::fusee`]).
    Fusee,
}

impl Protocol {
    pub const ALL: [Protocol; 4] = [Protocol::SwarmKv, Protocol::DmAbd, Protocol::Raw, Protocol::Fusee];
    pub fn name(self) -> &'static str {
        match self {
            Protocol::SwarmKv => "swarm-kv",
            Protocol::DmAbd => "dm-abd",
            Protocol::Raw => "raw",
            Protocol::Fusee => "fusee",
        }
    }
    pub fn parse(s: &str) -> Option<Protocol> {
        Protocol::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// Test-only switches that break SWARM-KV on purpose, to show that the checker catches it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum UnsafeSwitch {
    #[default]
    Off,
    /// A writer trusts every guessed timestamp (no verification, no lock, no rewrite).
    TrustGuess,
    /// A reader returns GUESSED tuples as if they were VERIFIED (no lock).
    ReadGuessed,
    /// FUSEE: a writer that lost the SNAPSHOT race returns at once, without waiting for the
    /// winner to change the primary slot.
    FuseeLoserReturnsAtOnce,
}

/// Everything a client needs besides its memory nodes.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub protocol: Protocol,
    /// This client's writer id (`0..layout.config.writers`).
    pub writer: u32,
    pub layout: Layout,
    /// A chain unanswered this long gets its node suspected.
    pub chain_timeout: Duration,
    /// An operation unfinished this long completes with [`KvError::Timeout`].
    pub op_timeout: Duration,
    /// A suspected node is tried again after this long (a slow node is not lost for good; a
    /// crashed one costs one chain timeout per period).
    pub retry_suspected_after: Duration,
    /// How long a retired buffer waits before reuse (see [`crate::pool`]).
    pub grace: Duration,
    /// Local time that timestamp 0 stands for.
    pub ts_epoch: LocalTime,
    pub inflight_max: usize,
    pub unsafe_switch: UnsafeSwitch,
}

impl ClientConfig {
    pub fn new(protocol: Protocol, writer: u32, layout: Layout, ts_epoch: LocalTime) -> Self {
        ClientConfig {
            protocol,
            writer,
            layout,
            chain_timeout: CHAIN_TIMEOUT_DEFAULT,
            op_timeout: Duration::from_millis(50),
            retry_suspected_after: Duration::from_millis(100),
            grace: Duration::from_millis(1),
            ts_epoch,
            inflight_max: 64,
            unsafe_switch: UnsafeSwitch::Off,
        }
    }
}

/// Where the interesting outcomes of a chain sit.
#[derive(Clone, Debug, Default)]
pub(crate) struct Shape {
    pub cas_my: Option<(usize, u64)>,
    pub cas_other: Option<(usize, u64)>,
    pub words: Option<usize>,
    pub inplace: Option<usize>,
    pub window: Option<usize>,
    /// The CAS claiming the new key's directory entry.
    pub dir_claim: Option<usize>,
    pub copy: Option<usize>,
    /// A read of a buffer's lock word (8 bytes), or of the whole buffer (lock word, then copy).
    pub lock: Option<usize>,
    /// The timestamp-lock CAS: (verb index, expected, new).
    pub lock_cas: Option<(usize, u64, u64)>,
    /// A read's chain to a node that showed the read's maximum: the round waits for one such
    /// reply (unless every such chain failed), since only those nodes are sure to hold the
    /// maximum's value.
    pub holder: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    Queued,
    Lookup,
    Create,
    /// A directory claim lost on some nodes is retried there (see [`crate::index`]).
    DirRetry,
    /// A lookup found the key's entry on fewer than a directory quorum of the nodes it read
    /// (a create still under way): it claims the entry on the others before using the slot.
    DirHelp,
    Write,
    WriterPrepare,
    WriterLock,
    Read,
    ReaderLock,
    Fetch {
        then_read: bool,
    },
    /// An operation that met a deletion writes it back before it reports it (see
    /// [`crate::deletion`]).
    DeleteBack,
    AbdRead,
    AbdWrite,
    AbdBack,
    RawRead,
    RawWrite,
    FuseeRead,
    FuseeFetch,
    FuseeWrite,
    FuseeBackups,
    FuseeRecheck,
    FuseeFix,
    FuseePrimary,
    FuseeWait,
    /// A loser finishing a stalled winner's write: its backups, then the primary.
    FuseeHelp,
    FuseeHelpPrimary,
}

/// A round's replies and the shapes of its chains, per node.
pub(crate) type RoundReplies = (NodeMap<Vec<VerbOutcome>>, NodeMap<Shape>);

pub(crate) struct Op {
    pub id: OpId,
    pub op: KvOp,
    pub slot: Option<u64>,
    pub started: LocalTime,
    pub rtt: u32,
    pub round: u32,
    pub stage: Stage,
    pub nodes: Vec<MemNodeId>,
    pub need: usize,
    pub replies: NodeMap<Vec<VerbOutcome>>,
    pub failed: usize,
    pub failed_nodes: Vec<MemNodeId>,
    pub shapes: NodeMap<Shape>,
    pub tuple: u64,
    pub buf: Option<u32>,
    pub seen: BTreeMap<u32, u64>,
    pub prev_max: u64,
    /// A read: the highest tuple seen since it (re)started — it never goes down (see
    /// [`crate::safe_guess`]) — and the nodes whose words showed it in the latest iteration.
    pub read_max: u64,
    pub max_from: NodeSet,
    pub iterations: u32,
    pub observed: NodeMap<Vec<u64>>,
    pub target: u64,
    pub value: Option<Vec<u8>>,
    /// Lock word of `lock_for`'s buffer per node, as last read (see [`crate::safe_guess`]).
    pub locks: NodeMap<u64>,
    pub lock_for: u64,
    /// A stale write: nodes known to hold another writer's tuple above the guess.
    pub above: NodeSet,
    /// The tuple's timestamp is above everything read after the op began: no staleness check.
    pub fresh: bool,
    /// A created key's directory entry, the nodes that hold it, the claims tried, and the
    /// create round's replies and shapes while a lost claim is retried.
    pub dir_word: u64,
    pub dir_holders: std::collections::BTreeSet<MemNodeId>,
    pub dir_claims: u32,
    pub dir_stash: Option<RoundReplies>,
    /// A majority-first round's chains not sent yet, and when the round began (see
    /// [`crate::hedge`]).
    pub spare: Vec<(MemNodeId, Vec<Verb>, Shape)>,
    pub round_started: LocalTime,
    /// A FUSEE loser: since when it has waited for the winner (see [`crate::fusee`]).
    pub waiting_since: Option<LocalTime>,
    pub done: bool,
}

impl Op {
    fn new(id: OpId, op: KvOp, now: LocalTime) -> Op {
        Op {
            id,
            op,
            slot: None,
            started: now,
            rtt: 0,
            round: 0,
            stage: Stage::Queued,
            nodes: Vec::new(),
            need: 0,
            replies: NodeMap::new(),
            failed: 0,
            failed_nodes: Vec::new(),
            shapes: NodeMap::new(),
            tuple: 0,
            buf: None,
            seen: BTreeMap::new(),
            prev_max: 0,
            read_max: 0,
            max_from: NodeSet::default(),
            iterations: 0,
            observed: NodeMap::new(),
            target: 0,
            value: None,
            locks: NodeMap::new(),
            lock_for: 0,
            above: NodeSet::default(),
            fresh: false,
            dir_word: 0,
            dir_holders: std::collections::BTreeSet::new(),
            dir_claims: 0,
            dir_stash: None,
            spare: Vec::new(),
            round_started: now,
            waiting_since: None,
            done: false,
        }
    }

    /// Makes a finished operation a new one, keeping its buffers' capacity (an operation
    /// would otherwise allocate a dozen small buffers and free them again). The same state as
    /// [`Op::new`]: the destructuring names every field, so a new one cannot be forgotten.
    fn reuse(&mut self, new_id: OpId, kv: KvOp, now: LocalTime) {
        let Op {
            id,
            op,
            slot,
            started,
            rtt,
            round,
            stage,
            nodes,
            need,
            replies,
            failed,
            failed_nodes,
            shapes,
            tuple,
            buf,
            seen,
            prev_max,
            read_max,
            max_from,
            iterations,
            observed,
            target,
            value,
            locks,
            lock_for,
            above,
            fresh,
            dir_word,
            dir_holders,
            dir_claims,
            dir_stash,
            spare,
            round_started,
            waiting_since,
            done,
        } = self;
        (*id, *op, *slot, *started, *rtt, *round, *stage) = (new_id, kv, None, now, 0, 0, Stage::Queued);
        (*need, *failed, *tuple, *buf, *prev_max, *read_max, *iterations) = (0, 0, 0, None, 0, 0, 0);
        (*target, *value, *lock_for, *fresh, *dir_word, *dir_claims, *dir_stash) = (0, None, 0, false, 0, 0, None);
        (*round_started, *waiting_since, *done) = (now, None, false);
        nodes.clear();
        replies.clear();
        failed_nodes.clear();
        shapes.clear();
        seen.clear();
        max_from.clear();
        observed.clear();
        locks.clear();
        above.clear();
        dir_holders.clear();
        spare.clear();
    }
}

/// A few memory nodes, in node order: a sorted vector (an operation's sets hold at most its
/// replicas, and a `BTreeSet` allocates on its first insert after every `clear`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NodeSet(Vec<MemNodeId>);

impl NodeSet {
    pub fn insert(&mut self, node: MemNodeId) -> bool {
        match self.0.binary_search(&node) {
            Ok(_) => false,
            Err(i) => {
                self.0.insert(i, node);
                true
            }
        }
    }
    pub fn contains(&self, node: &MemNodeId) -> bool {
        self.0.binary_search(node).is_ok()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn clear(&mut self) {
        self.0.clear();
    }
    pub fn iter(&self) -> impl Iterator<Item = &MemNodeId> {
        self.0.iter()
    }
}

struct ChainInfo {
    op: Option<OpId>,
    round: u32,
    node: MemNodeId,
    issued: LocalTime,
    deadline: LocalTime,
    /// CASes of this writer's own metadata words: (verb index, slot, expected, new).
    cas_my: Option<(usize, u64, u64, u64)>,
    /// This writer's own buffer lock word: the buffer, and the verb that reads it.
    own_lock: Option<(u32, usize)>,
}

/// A SWARM-side key-value client (SWARM-KV, DM-ABD or RAW, per [`ClientConfig::protocol`]).
pub struct Client {
    pub(crate) cfg: ClientConfig,
    pub(crate) members: Membership,
    pub(crate) index: IndexCache,
    pub(crate) pool: Pool,
    /// Boxed: an operation is several hundred bytes, and it leaves the map and comes back on
    /// every reply (see [`Client::with_op`]).
    ops: BTreeMap<OpId, Box<Op>>,
    /// Finished operations kept for [`Op::reuse`] (at most [`SPARE_OPS_MAX`]); boxed like
    /// `ops`, so that moving one between the two is a pointer copy.
    #[allow(clippy::vec_box)]
    spare_ops: Vec<Box<Op>>,
    /// Chains in flight (hashed: one insert and one removal per chain; iterated only in tag
    /// order, after sorting).
    chains: HashMap<ChainTag, ChainInfo, index::FixedHash>,
    next_tag: ChainTag,
    /// This writer's metadata word per (slot, node), as last seen (hashed: looked up on every
    /// write; never iterated).
    pub(crate) my_words: NodeWords<u64>,
    /// The lock word of this writer's buffers per (buffer, node), as last read (a stale write
    /// CASes it from there; see [`crate::safe_guess`]).
    pub(crate) my_locks: NodeWords<u32>,
    /// Operations per key, the running one first (one operation per key at a time per client).
    key_queue: index::KeyMap<VecDeque<OpId>>,
    pub(crate) ts_adjust: u64,
    pub(crate) last_ts: u64,
    /// Named counters (hashed: bumped several times per operation; sorted when reported).
    pub(crate) counters: HashMap<&'static str, u64, index::FixedHash>,
    suspected_at: BTreeMap<MemNodeId, LocalTime>,
    /// FUSEE: the primary index slot's value per slot, as last seen (its adaptive cache).
    pub(crate) fusee_seen: BTreeMap<u64, u64>,
    /// The lowest recent chain round trip: when a majority-first round widens.
    rtt_floor: RttFloor,
    /// SWARM-KV: the slots on which one of this client's operations reported a deletion (it
    /// writes nothing there again: [`crate::safe_guess`], rule 6).
    pub(crate) deleted_slots: BTreeSet<u64>,
    /// SWARM-KV: the slots on which one of this client's operations completed with a definite
    /// outcome (a value, or `Deleted`). Until then its tuples there carry [`meta::REWRITE`],
    /// so that read rule c does not take them for evidence about an earlier instance's
    /// operations ([`crate::safe_guess`], rule 6).
    pub(crate) settled_slots: BTreeSet<u64>,
}

impl Client {
    pub fn new(cfg: ClientConfig) -> Self {
        let members = Membership::new(cfg.layout.config.memory_nodes);
        let pool = Pool::new(cfg.layout.config.buffers_per_writer, cfg.grace);
        Client {
            cfg,
            members,
            index: IndexCache::default(),
            pool,
            ops: BTreeMap::new(),
            spare_ops: Vec::new(),
            chains: HashMap::default(),
            next_tag: 1,
            my_words: NodeWords::default(),
            my_locks: NodeWords::default(),
            key_queue: index::KeyMap::default(),
            ts_adjust: 0,
            last_ts: 0,
            counters: HashMap::default(),
            suspected_at: BTreeMap::new(),
            fusee_seen: BTreeMap::new(),
            rtt_floor: RttFloor::default(),
            deleted_slots: BTreeSet::new(),
            settled_slots: BTreeSet::new(),
        }
    }

    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }
    pub fn membership(&self) -> &Membership {
        &self.members
    }

    /// Takes over this writer's part of a bulk load (index cache, loaded buffers and words).
    pub fn absorb_load(&mut self, load: &index::BulkLoad) {
        let w = self.cfg.writer as usize;
        if let Some(cache) = load.caches.get(w) {
            self.index = cache.clone();
        }
        for &(slot, tuple) in load.tuples.get(w).map(|v| v.as_slice()).unwrap_or(&[]) {
            self.pool.absorb(slot, meta::buf(tuple));
            for node in self.cfg.layout.replicas_of(slot) {
                self.set_my_word(slot, node, tuple);
            }
            self.last_ts = self.last_ts.max(meta::ts(tuple));
        }
    }

    /// Takes `node` for crashed until [`ClientConfig::retry_suspected_after`] — unless that
    /// would leave fewer than a majority of the memory nodes unsuspected: a suspicion is only a
    /// guess (a stalled connection looks like a crashed node), and with a majority suspected
    /// every operation would fail at once. The longest-suspected other node is then tried again
    /// instead (if it did crash, it costs a chain timeout and is suspected again).
    fn suspect(&mut self, node: MemNodeId, now: LocalTime) {
        if !self.members.is_alive(node) {
            return;
        }
        self.members.suspect(node);
        self.suspected_at.insert(node, now);
        self.bump("suspicions");
        if self.alive_nodes().len() < self.dir_quorum() {
            let oldest =
                self.suspected_at.iter().filter(|(n, _)| **n != node).min_by_key(|(_, at)| **at).map(|(n, _)| *n);
            if let Some(n) = oldest {
                self.suspected_at.remove(&n);
                self.members.restore(n);
                self.bump("suspects_retried");
            }
        }
    }

    pub(crate) fn bump(&mut self, name: &'static str) {
        *self.counters.entry(name).or_insert(0) += 1;
    }
    pub(crate) fn note_max(&mut self, name: &'static str, v: u64) {
        let e = self.counters.entry(name).or_insert(0);
        *e = (*e).max(v);
    }

    // ----- timestamps -----

    fn clock_ts(&self, now: LocalTime) -> u64 {
        now.as_nanos().saturating_sub(self.cfg.ts_epoch.as_nanos()) / meta::TS_UNIT_NS
    }
    /// A guessed timestamp from the local clock (strictly above this client's previous one).
    pub(crate) fn guess_ts(&mut self, now: LocalTime) -> Result<u64, KvError> {
        let t = (self.clock_ts(now) + self.ts_adjust).max(self.last_ts + 1);
        if t >= meta::DELETED_TS {
            return Err(KvError::TimestampExhausted);
        }
        self.last_ts = t;
        Ok(t)
    }
    /// After a stale guess: move the clock's reading above `seen_ts`. The writer of `seen_ts`
    /// guessed it up to `lag` ago (the age of our operation), so its clock is now about `lag`
    /// further: adding it keeps this client from trailing by one operation after every resync.
    pub(crate) fn resync(&mut self, seen_ts: u64, lag: Duration, now: LocalTime) {
        if seen_ts >= meta::DELETED_TS {
            return;
        }
        let clock = self.clock_ts(now);
        let target = seen_ts + 1 + kairos_core::duration_nanos(lag) / meta::TS_UNIT_NS;
        if target > clock + self.ts_adjust {
            self.ts_adjust = target - clock;
            self.bump("resyncs");
        }
        self.last_ts = self.last_ts.max(seen_ts);
    }

    // ----- nodes -----

    pub(crate) fn majority(&self) -> usize {
        self.cfg.layout.majority()
    }
    pub(crate) fn dir_quorum(&self) -> usize {
        self.cfg.layout.config.memory_nodes as usize / 2 + 1
    }
    pub(crate) fn alive_replicas(&self, slot: u64) -> Vec<MemNodeId> {
        self.cfg.layout.replicas_of(slot).into_iter().filter(|n| self.members.is_alive(*n)).collect()
    }
    pub(crate) fn alive_nodes(&self) -> Vec<MemNodeId> {
        (0..self.cfg.layout.config.memory_nodes).filter(|n| self.members.is_alive(*n)).collect()
    }
    /// The replica that keeps the in-place copy: the first alive one.
    pub(crate) fn primary(&self, slot: u64) -> Option<MemNodeId> {
        self.alive_replicas(slot).first().copied()
    }
    /// One chain per live replica of `slot` reading its metadata words, and on the primary
    /// also the in-place copy when `with_inplace` (the read round of SWARM-KV and DM-ABD).
    pub(crate) fn meta_read_chains(&self, slot: u64, with_inplace: bool) -> Vec<(MemNodeId, Vec<Verb>, Shape)> {
        let alive = self.alive_replicas(slot);
        let primary = alive.first().copied();
        let l = &self.cfg.layout;
        alive
            .into_iter()
            .map(|node| {
                let mut verbs = vec![Verb::Read { addr: l.meta_words(slot), len: l.meta_words_bytes() }];
                let mut shape = Shape { words: Some(0), ..Shape::default() };
                if with_inplace && Some(node) == primary {
                    verbs.push(Verb::Read { addr: l.inplace(node, slot), len: l.copy_bytes_max() });
                    shape.inplace = Some(1);
                }
                (node, verbs, shape)
            })
            .collect()
    }
    pub(crate) fn my_word(&self, slot: u64, node: MemNodeId) -> u64 {
        self.my_words.get(slot, self.rank(slot, node)).unwrap_or(0)
    }
    fn set_my_word(&mut self, slot: u64, node: MemNodeId, word: u64) {
        self.my_words.set(slot, self.rank(slot, node), word);
    }
    /// `node`'s place among `slot`'s replicas (they are consecutive from `slot % nodes`), so
    /// that a key's replicas are the first lanes of its [`NodeWords`] entry.
    fn rank(&self, slot: u64, node: MemNodeId) -> u32 {
        let m = u64::from(self.cfg.layout.config.memory_nodes.max(1));
        ((u64::from(node) + m - slot % m) % m) as u32
    }

    // ----- rounds -----

    /// Sends one chain per node as the op's next round; the op advances when `need` replied.
    pub(crate) fn send_round(
        &mut self,
        op: &mut Op,
        stage: Stage,
        chains: Vec<(MemNodeId, Vec<Verb>, Shape)>,
        need: usize,
        now: LocalTime,
        out: &mut Outbox,
    ) {
        op.round += 1;
        op.rtt += 1;
        op.stage = stage;
        op.replies.clear();
        op.failed = 0;
        op.failed_nodes.clear();
        op.shapes.clear();
        op.nodes.clear();
        op.spare.clear();
        op.round_started = now;
        op.need = need;
        if chains.len() < need {
            let alive = chains.len();
            self.finish(op, Err(KvError::Unavailable { alive, needed: need }), now, out);
            return;
        }
        for (node, verbs, shape) in chains {
            self.send_in_round(op, node, verbs, shape, now, out);
        }
    }

    /// Like [`Client::send_round`], but to a majority first (a read, or a write's first try):
    /// the chain that reads the in-place copy (the primary's) and the next ones, rotated by slot
    /// so that every client picks the same majority for a key and the other replicas share the
    /// load; the rest wait in `op.spare` until the round widens (see [`crate::hedge`]).
    pub(crate) fn send_round_majority_first(
        &mut self,
        op: &mut Op,
        stage: Stage,
        mut chains: Vec<(MemNodeId, Vec<Verb>, Shape)>,
        need: usize,
        now: LocalTime,
        out: &mut Outbox,
    ) {
        if let Some(p) = chains.iter().position(|(_, _, s)| s.inplace.is_some()) {
            chains[..=p].rotate_right(1);
        }
        let others = chains.len().saturating_sub(1);
        if others > 0 {
            let turn = (op.slot.unwrap_or(0) % others as u64) as usize;
            chains[1..].rotate_left(turn);
        }
        let spare = if chains.len() > need { chains.split_off(need) } else { Vec::new() };
        self.send_round(op, stage, chains, need, now, out);
        if !op.done {
            op.spare = spare;
        }
    }

    /// Sends the chains a majority-first round held back.
    fn widen(&mut self, op: &mut Op, now: LocalTime, out: &mut Outbox) {
        if op.spare.is_empty() {
            return;
        }
        self.bump("rounds_widened");
        for (node, verbs, shape) in std::mem::take(&mut op.spare) {
            self.send_in_round(op, node, verbs, shape, now, out);
        }
    }

    fn send_in_round(
        &mut self,
        op: &mut Op,
        node: MemNodeId,
        verbs: Vec<Verb>,
        shape: Shape,
        now: LocalTime,
        out: &mut Outbox,
    ) {
        let slot = op.slot.unwrap_or(0);
        let cas_my = shape.cas_my.map(|(i, expected)| match &verbs[i] {
            Verb::Cas { new, .. } => (i, slot, expected, *new),
            _ => (i, slot, expected, expected),
        });
        // Rounds that read this writer's own buffer lock word keep `my_locks` current.
        let own = matches!(op.stage, Stage::Write | Stage::Create | Stage::WriterPrepare | Stage::WriterLock);
        let own_lock = match (own, op.buf, shape.lock) {
            (true, Some(b), Some(i)) => Some((b, i)),
            _ => None,
        };
        op.nodes.push(node);
        op.shapes.insert(node, shape);
        self.issue(Some(op.id), op.round, node, verbs, cas_my, now, out);
        if let Some(info) = self.chains.get_mut(&(self.next_tag - 1)) {
            info.own_lock = own_lock;
        }
    }

    /// How long a majority-first round waits before it widens.
    fn widen_after(&self) -> Duration {
        self.rtt_floor.widen_after(self.cfg.chain_timeout / 4)
    }

    /// Background chain (no operation waits for it).
    pub(crate) fn send_background(
        &mut self,
        node: MemNodeId,
        verbs: Vec<Verb>,
        cas_my: Option<(usize, u64, u64, u64)>,
        now: LocalTime,
        out: &mut Outbox,
    ) {
        self.issue(None, 0, node, verbs, cas_my, now, out);
    }

    #[allow(clippy::too_many_arguments)]
    fn issue(
        &mut self,
        op: Option<OpId>,
        round: u32,
        node: MemNodeId,
        verbs: Vec<Verb>,
        cas_my: Option<(usize, u64, u64, u64)>,
        now: LocalTime,
        out: &mut Outbox,
    ) {
        let tag = self.next_tag;
        self.next_tag += 1;
        let deadline = now + self.cfg.chain_timeout;
        if let Some((_, slot, _, new)) = cas_my {
            // Chains on one connection run in order: predict that this CAS succeeds; a failure
            // reply corrects the prediction.
            self.set_my_word(slot, node, new);
        }
        self.chains.insert(tag, ChainInfo { op, round, node, issued: now, deadline, cas_my, own_lock: None });
        self.bump("chains");
        out.issue(tag, Chain { node, verbs });
    }

    /// Completes `op` (and starts the next queued operation on its key).
    pub(crate) fn finish(
        &mut self,
        op: &mut Op,
        result: Result<Option<Vec<u8>>, KvError>,
        now: LocalTime,
        out: &mut Outbox,
    ) {
        if op.done {
            return;
        }
        op.done = true;
        if let (Some(slot), Protocol::SwarmKv) = (op.slot, self.cfg.protocol) {
            match &result {
                Ok(_) => {
                    self.settled_slots.insert(slot);
                }
                Err(KvError::Deleted) => {
                    self.settled_slots.insert(slot);
                    self.deleted_slots.insert(slot);
                }
                Err(_) => {}
            }
        }
        if let Some(buf) = op.buf.take() {
            match (&result, op.slot) {
                // Its chains may still land, its tuple become the maximum: keep its value.
                (Err(e), Some(slot)) if e.is_unknown_outcome() => self.pool.pin(slot, buf),
                // A write that did not commit its buffer gives it back (after the grace period).
                _ => self.pool.abandon(buf, now),
            }
        }
        self.bump(if result.is_ok() { "ops_ok" } else { "ops_err" });
        out.complete(op.id, result, op.rtt);
        let Some(q) = self.key_queue.get_mut(op.op.key()) else { return };
        q.retain(|id| *id != op.id);
        match q.front().copied() {
            Some(next) => {
                if let Some(mut next_op) = self.ops.remove(&next) {
                    self.start(&mut next_op, now, out);
                    self.keep_or_recycle(next_op);
                }
            }
            None => {
                self.key_queue.remove(op.op.key());
            }
        }
    }

    /// Starts an operation whose key is free.
    fn start(&mut self, op: &mut Op, now: LocalTime, out: &mut Outbox) {
        match self.index.get(op.op.key()) {
            Some(slot) => {
                op.slot = Some(slot);
                self.begin(op, now, out);
            }
            None => {
                let fp = index::fingerprint(op.op.key());
                let l = &self.cfg.layout;
                let (first, probe) = index::window(l, fp);
                let len = (probe * l.bucket_bytes()) as u32;
                let chains = self
                    .alive_nodes()
                    .into_iter()
                    .map(|n| {
                        let verbs = vec![Verb::Read { addr: l.dir_entry(first, 0), len }];
                        (n, verbs, Shape { window: Some(0), ..Shape::default() })
                    })
                    .collect();
                let need = self.dir_quorum();
                self.send_round(op, Stage::Lookup, chains, need, now, out);
            }
        }
    }

    /// A key no directory entry names yet (`op.replies` hold the lookup's window reads):
    /// allocate a slot, claim its directory entry (and, for SWARM-KV, write its first value) and
    /// read the key's window in one round trip.
    fn create(&mut self, op: &mut Op, now: LocalTime, out: &mut Outbox) {
        let key = op.op.key().to_vec();
        let fp = index::fingerprint(&key);
        let windows = window_words(op);
        let windows: Vec<&[u64]> = windows.values().map(|w| w.as_slice()).collect();
        let Some((bucket, e)) = self.index.claim_entry(&self.cfg.layout, fp, &windows) else {
            return self.finish(op, Err(KvError::IndexFull), now, out);
        };
        let Some(slot) = self.index.allocate_slot(&self.cfg.layout, self.cfg.writer) else {
            return self.finish(op, Err(KvError::IndexFull), now, out);
        };
        op.slot = Some(slot);
        op.dir_word = index::entry(fp, slot);
        op.dir_claims = 1;
        // SWARM-KV writes the value in the same round trip as the directory entry.
        let swarm = self.cfg.protocol == Protocol::SwarmKv;
        if swarm {
            if let Err(e) = crate::safe_guess::prepare_write(self, op, now) {
                return self.finish(op, Err(e), now, out);
            }
        }
        let (first, probe) = index::window(&self.cfg.layout, fp);
        let replicas = self.cfg.layout.replicas_of(slot);
        let mut key_area = (key.len() as u64).to_le_bytes().to_vec();
        key_area.extend_from_slice(&key);
        // The key is stored once, with the in-place copy on the primary (FUSEE: nowhere, see
        // `crate::fusee`).
        let primary = self.primary(slot).filter(|_| self.cfg.protocol != Protocol::Fusee);
        let mut chains = Vec::new();
        for node in self.alive_nodes() {
            let l = &self.cfg.layout;
            let mut verbs = Vec::new();
            if Some(node) == primary {
                verbs.push(Verb::Write { addr: l.key_area(node, slot), data: key_area.clone() });
            }
            let dir_claim = verbs.len();
            verbs.push(Verb::Cas { addr: l.dir_entry(bucket, e), expected: 0, new: op.dir_word });
            verbs.push(Verb::Read { addr: l.dir_entry(first, 0), len: (probe * l.bucket_bytes()) as u32 });
            let mut shape = Shape { window: Some(dir_claim + 1), dir_claim: Some(dir_claim), ..Shape::default() };
            if swarm && replicas.contains(&node) {
                let (more, s) = crate::safe_guess::write_verbs(self, op, node);
                let base = verbs.len();
                verbs.extend(more);
                shape.cas_my = s.cas_my.map(|(i, e)| (i + base, e));
                shape.words = s.words.map(|i| i + base);
                shape.lock = s.lock.map(|i| i + base);
            }
            chains.push((node, verbs, shape));
        }
        let need = self.dir_quorum();
        self.send_round(op, Stage::Create, chains, need, now, out);
    }

    /// The slot is known: run the protocol.
    fn begin(&mut self, op: &mut Op, now: LocalTime, out: &mut Outbox) {
        match self.cfg.protocol {
            Protocol::SwarmKv => crate::safe_guess::begin(self, op, now, out),
            Protocol::DmAbd => crate::dm_abd::begin(self, op, now, out),
            Protocol::Raw => crate::raw::begin(self, op, now, out),
            Protocol::Fusee => crate::fusee::begin(self, op, now, out),
        }
    }

    /// After a create round or a claim retry: whether the new key's directory entry is on a
    /// directory quorum (then the create round's replies are back in `op`). If not, retries
    /// the lost claims with other free entries, or fails the operation after
    /// [`DIR_CLAIMS_MAX`] tries.
    fn directory_entry_installed(&mut self, op: &mut Op, now: LocalTime, out: &mut Outbox) -> bool {
        let windows = window_words(op);
        let mut lost = Vec::new();
        for (node, outs) in &op.replies {
            // A node holds the entry if its claim took, or if its window (read after the claim,
            // or alone where this client had not read it yet) shows it.
            let shape = op.shapes.get(node);
            let claimed = match shape.and_then(|s| s.dir_claim).map(|i| outs.get(i)) {
                Some(Some(VerbOutcome::Cas { previous })) => *previous == 0 || *previous == op.dir_word,
                Some(_) => continue,
                None if shape.and_then(|s| s.window).is_none() => continue,
                None => false,
            };
            if claimed || windows.get(node).is_some_and(|w| w.contains(&op.dir_word)) {
                op.dir_holders.insert(*node);
            } else {
                lost.push(*node);
            }
        }
        let need = self.dir_quorum();
        if op.dir_holders.len() >= need {
            if let Some((replies, shapes)) = op.dir_stash.take() {
                (op.replies, op.shapes, op.stage) = (replies, shapes, Stage::Create);
            }
            return true;
        }
        self.bump("directory_claims_lost");
        if op.dir_claims >= DIR_CLAIMS_MAX {
            self.finish(op, Err(KvError::IndexFull), now, out);
            return false;
        }
        op.dir_claims += 1;
        // A create keeps its round's replies for when the entry is in (a lookup's help needs none).
        if op.dir_stash.is_none() && op.stage != Stage::DirHelp {
            op.dir_stash = Some((std::mem::take(&mut op.replies), std::mem::take(&mut op.shapes)));
        }
        let fp = index::entry_fp(op.dir_word);
        let (first, probe) = index::window(&self.cfg.layout, fp);
        let mut chains = Vec::new();
        for node in lost {
            let window = windows.get(&node).map_or(&[][..], |w| w.as_slice());
            let Some((bucket, e)) = self.index.claim_entry(&self.cfg.layout, fp, &[window]) else { continue };
            let l = &self.cfg.layout;
            let verbs = vec![
                Verb::Cas { addr: l.dir_entry(bucket, e), expected: 0, new: op.dir_word },
                Verb::Read { addr: l.dir_entry(first, 0), len: (probe * l.bucket_bytes()) as u32 },
            ];
            chains.push((node, verbs, Shape { dir_claim: Some(0), window: Some(1), ..Shape::default() }));
        }
        let more = need - op.dir_holders.len();
        let stage = if op.stage == Stage::DirHelp { Stage::DirHelp } else { Stage::DirRetry };
        self.send_round(op, stage, chains, more, now, out);
        false
    }

    /// A lookup found `slot`'s entry: if fewer than a directory quorum of the nodes it read
    /// hold it, the key's create is still under way (its claims stalled or its client
    /// crashed), and a later lookup could miss the entry and answer that the key does not
    /// exist after this operation used it. So the entry is claimed on the nodes that lack it
    /// first (as ABD's reader writes back what it returns); returns whether that round was sent.
    fn help_install(&mut self, op: &mut Op, fp: u64, slot: u64, now: LocalTime, out: &mut Outbox) -> bool {
        let word = index::entry(fp, slot);
        let windows = window_words(op);
        let holders: std::collections::BTreeSet<MemNodeId> =
            windows.iter().filter(|(_, w)| w.contains(&word)).map(|(n, _)| *n).collect();
        let need = self.dir_quorum();
        if holders.len() >= need {
            return false;
        }
        self.bump("directory_entries_helped");
        let (first, probe) = index::window(&self.cfg.layout, fp);
        let l = &self.cfg.layout;
        let read_window = Verb::Read { addr: l.dir_entry(first, 0), len: (probe * l.bucket_bytes()) as u32 };
        // Every live node that does not show the entry, so that one slow node does not hold the
        // round: a claim where this client read the window, else a read of it (a claim follows
        // there if the entry is still missing, see `directory_entry_installed`).
        let mut chains = Vec::new();
        for node in self.alive_nodes().into_iter().filter(|n| !holders.contains(n)) {
            let claim = windows.get(&node).and_then(|w| self.index.claim_entry(l, fp, &[w.as_slice()]));
            chains.push(match claim {
                Some((bucket, e)) => (
                    node,
                    vec![Verb::Cas { addr: l.dir_entry(bucket, e), expected: 0, new: word }, read_window.clone()],
                    Shape { dir_claim: Some(0), window: Some(1), ..Shape::default() },
                ),
                None => (node, vec![read_window.clone()], Shape { window: Some(0), ..Shape::default() }),
            });
        }
        (op.dir_word, op.dir_holders, op.dir_claims) = (word, holders, 1);
        let more = need - op.dir_holders.len();
        self.send_round(op, Stage::DirHelp, chains, more, now, out);
        true
    }

    fn advance(&mut self, op: &mut Op, now: LocalTime, out: &mut Outbox) {
        if matches!(op.stage, Stage::Create | Stage::DirRetry | Stage::DirHelp)
            && !self.directory_entry_installed(op, now, out)
        {
            return;
        }
        if op.stage == Stage::DirHelp {
            let slot = index::entry_slot(op.dir_word);
            self.index.insert(op.op.key(), slot);
            return self.begin(op, now, out);
        }
        match op.stage {
            Stage::Create if self.cfg.protocol == Protocol::SwarmKv => crate::safe_guess::advance(self, op, now, out),
            Stage::Lookup | Stage::Create => {
                let fp = index::fingerprint(op.op.key());
                let mut slots: Vec<u64> =
                    window_words(op).values().flat_map(|w| index::slots_in_window(&self.cfg.layout, w, fp)).collect();
                slots.sort_unstable();
                if op.stage == Stage::Create {
                    // Another client's earlier slot for the same key wins.
                    if let (Some(&lowest), Some(mine)) = (slots.first(), op.slot) {
                        op.slot = Some(lowest.min(mine));
                    }
                } else {
                    op.slot = slots.first().copied();
                }
                match op.slot {
                    Some(slot) => {
                        if op.stage == Stage::Create || !self.help_install(op, fp, slot, now, out) {
                            self.index.insert(op.op.key(), slot);
                            self.begin(op, now, out);
                        }
                    }
                    // An insert of a key nobody has: create it.
                    None if op.stage == Stage::Lookup && matches!(op.op, KvOp::Insert { .. }) => {
                        self.create(op, now, out)
                    }
                    None => self.finish(op, Err(KvError::UnknownKey), now, out),
                }
            }
            Stage::DeleteBack => crate::deletion::after_confirm(self, op, now, out),
            _ => match self.cfg.protocol {
                Protocol::SwarmKv => crate::safe_guess::advance(self, op, now, out),
                Protocol::DmAbd => crate::dm_abd::advance(self, op, now, out),
                Protocol::Raw => crate::raw::advance(self, op, now, out),
                Protocol::Fusee => crate::fusee::advance(self, op, now, out),
            },
        }
    }

    fn with_op(
        &mut self,
        id: OpId,
        now: LocalTime,
        out: &mut Outbox,
        f: impl FnOnce(&mut Self, &mut Op, LocalTime, &mut Outbox),
    ) {
        if let Some(mut op) = self.ops.remove(&id) {
            f(self, &mut op, now, out);
            self.keep_or_recycle(op);
        }
    }

    /// Files an operation under its id while it runs; keeps a finished one for reuse.
    fn keep_or_recycle(&mut self, op: Box<Op>) {
        if !op.done {
            self.ops.insert(op.id, op);
        } else if self.spare_ops.len() < SPARE_OPS_MAX {
            self.spare_ops.push(op);
        }
    }

    fn check_round(&mut self, op: &mut Op, now: LocalTime, out: &mut Outbox) {
        if op.failed > 0 {
            self.widen(op, now, out);
        }
        // The node holding the in-place copy is waited for unless it failed, and so is one of
        // the holders of a read's maximum (`Shape::holder`) unless they all failed.
        let pending = |n: &MemNodeId| !op.replies.contains_key(n) && !op.failed_nodes.contains(n);
        let inplace_pending = op.shapes.iter().any(|(n, s)| s.inplace.is_some() && pending(n));
        let holder_replied = op.shapes.iter().any(|(n, s)| s.holder && op.replies.contains_key(n));
        let holder_pending = !holder_replied && op.shapes.iter().any(|(n, s)| s.holder && pending(n));
        let waiting = inplace_pending || holder_pending;
        if op.replies.len() >= op.need && !waiting {
            self.advance(op, now, out);
        } else if op.nodes.len() - op.failed < op.need {
            let alive = op.nodes.len() - op.failed;
            self.finish(op, Err(KvError::Unavailable { alive, needed: op.need }), now, out);
        }
    }

    fn validate(&self, op: &KvOp) -> Result<(), KvError> {
        let c = &self.cfg.layout.config;
        let key = op.key();
        if key.is_empty() {
            return Err(KvError::EmptyKey);
        }
        if key.len() > c.key_size as usize {
            return Err(KvError::KeyTooLong { len: key.len(), max: c.key_size as usize });
        }
        if let KvOp::Update { value, .. } | KvOp::Insert { value, .. } = op {
            if value.len() > c.value_size as usize {
                return Err(KvError::ValueTooLong { len: value.len(), max: c.value_size as usize });
            }
        }
        Ok(())
    }
}

impl KvClient for Client {
    fn invoke(&mut self, op_id: OpId, kv: KvOp, now: LocalTime, out: &mut Outbox) {
        if let Err(e) = self.validate(&kv) {
            self.bump("ops_err");
            out.complete(op_id, Err(e), 0);
            return;
        }
        if self.ops.len() >= self.cfg.inflight_max {
            out.complete(op_id, Err(KvError::Busy(self.ops.len())), 0);
            return;
        }
        let key = index::InlineKey::from_slice(kv.key());
        let mut op = match self.spare_ops.pop() {
            Some(mut op) => {
                op.reuse(op_id, kv, now);
                op
            }
            None => Box::new(Op::new(op_id, kv, now)),
        };
        let q = self.key_queue.entry(key).or_default();
        q.push_back(op_id);
        if q.len() == 1 {
            self.start(&mut op, now, out);
        }
        self.keep_or_recycle(op);
    }

    fn on_reply(
        &mut self,
        tag: ChainTag,
        reply: Result<Vec<VerbOutcome>, VerbError>,
        now: LocalTime,
        out: &mut Outbox,
    ) {
        let Some(info) = self.chains.remove(&tag) else { return };
        if let (Some((i, slot, expected, _)), Ok(outs)) = (info.cas_my, &reply) {
            if let Some(VerbOutcome::Cas { previous }) = outs.get(i) {
                if *previous != expected {
                    self.set_my_word(slot, info.node, *previous);
                }
            }
        }
        if let (Some((buf, i)), Ok(outs)) = (info.own_lock, &reply) {
            if let Some(VerbOutcome::Read(bytes)) = outs.get(i) {
                if let Some(w) = meta::first_word(bytes) {
                    self.my_locks.set(buf, info.node, w);
                }
            }
        }
        match &reply {
            Err(VerbError::NodeCrashed(_)) => self.suspect(info.node, now),
            Ok(_) => {
                self.rtt_floor.sample(now.saturating_since(info.issued));
                self.members.restore(info.node);
                self.suspected_at.remove(&info.node);
            }
            Err(_) => {}
        }
        let Some(id) = info.op else { return };
        self.with_op(id, now, out, |c, op, now, out| {
            if op.round != info.round || op.nodes.is_empty() {
                return;
            }
            match reply {
                Ok(outs) => {
                    op.replies.insert(info.node, outs);
                }
                Err(_) => {
                    op.failed += 1;
                    op.failed_nodes.push(info.node);
                }
            }
            c.check_round(op, now, out);
        });
    }

    fn on_tick(&mut self, now: LocalTime, out: &mut Outbox) {
        // A late chain is taken for a crashed node and the round goes on with the others — but
        // FUSEE's rounds need every replica and it has no failover (see `crate::fusee`): its
        // operations wait for slow chains until their own deadline.
        let expires = self.cfg.protocol != Protocol::Fusee;
        let mut expired: Vec<ChainTag> =
            self.chains.iter().filter(|(_, c)| expires && c.deadline <= now).map(|(t, _)| *t).collect();
        expired.sort_unstable();
        for tag in expired {
            let Some(info) = self.chains.remove(&tag) else { continue };
            self.suspect(info.node, now);
            self.bump("chain_timeouts");
            if let Some(id) = info.op {
                self.with_op(id, now, out, |c, op, now, out| {
                    if op.round == info.round && !op.replies.contains_key(&info.node) {
                        op.failed += 1;
                        op.failed_nodes.push(info.node);
                        c.check_round(op, now, out);
                    }
                });
            }
        }
        let retry: Vec<MemNodeId> = self
            .suspected_at
            .iter()
            .filter(|(_, at)| now.saturating_since(**at) >= self.cfg.retry_suspected_after)
            .map(|(n, _)| *n)
            .collect();
        for n in retry {
            self.suspected_at.remove(&n);
            self.members.restore(n);
            self.bump("suspects_retried");
        }
        let widen_after = self.widen_after();
        let slow: Vec<OpId> = self
            .ops
            .values()
            .filter(|o| !o.spare.is_empty() && now.saturating_since(o.round_started) >= widen_after)
            .map(|o| o.id)
            .collect();
        for id in slow {
            self.with_op(id, now, out, |c, op, now, out| c.widen(op, now, out));
        }
        let late: Vec<OpId> = self
            .ops
            .values()
            .filter(|o| now.saturating_since(o.started) >= self.cfg.op_timeout)
            .map(|o| o.id)
            .collect();
        for id in late {
            self.bump("op_timeouts");
            self.with_op(id, now, out, |c, op, now, out| c.finish(op, Err(KvError::Timeout), now, out));
        }
    }

    fn tick_interval(&self) -> Duration {
        // Majority-first rounds (SWARM-KV, DM-ABD) widen within a few round trips.
        match self.cfg.protocol {
            Protocol::SwarmKv | Protocol::DmAbd => self.widen_after(),
            Protocol::Raw | Protocol::Fusee => self.cfg.chain_timeout / 4,
        }
    }

    fn in_flight(&self) -> usize {
        self.ops.len()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<(&'static str, u64)> = self.counters.iter().map(|(k, v)| (*k, *v)).collect();
        v.push(("buffers_in_use", u64::from(self.pool.in_use())));
        v.push(("buffers_in_use_max", u64::from(self.pool.in_use_max())));
        v.push(("buffers_touched", u64::from(self.pool.touched())));
        v.sort_unstable();
        v
    }
}
