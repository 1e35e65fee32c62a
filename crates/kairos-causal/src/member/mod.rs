//! A replica-set member: primary or secondary (or candidate during an election).
//!
//! See the crate docs for the protocol. The durable part (term, vote, oplog) is journaled
//! through the host ([`kairos_core::Ctx::persist`]: every change of a handler is durable before
//! any reply or message of that handler leaves) and handed back on restart
//! ([`kairos_core::Process::on_recover`]); everything else (commit point, document store, keys,
//! clock) is rebuilt from the oplog.

mod amnesia;
mod election;
mod mongo_exec;

pub use mongo_exec::MongoSetConfig;

use crate::msg::{
    codes, CausalMsg, ClientOp, Entry, ErrorReply, Op, OpPos, PeerBody, PeerMsg, ReadConcern, Reply, ReplyBody,
    Request, WriteConcern, WriteOrigin,
};
use kairos_clock::SigningKey;
use kairos_clock::{
    gossip_in, sign_reply, ClusterTime, ClusterTimeValidator, KeyRing, LogicalClock, SignedClusterTime,
    TimeProofService, DEFAULT_KEY_ROTATION_SECS, DEFAULT_MAX_ACCEPTABLE_DRIFT_SECS,
};
use kairos_core::{Ctx, LocalTime, NodeId, Process, Stored, Timer, TimerId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

kairos_core::timers! {
    /// A member's timers.
    enum MemberTimer {
        /// No word from a primary for the election timeout: a dry run, then perhaps an election.
        Election = 1,
        /// Heartbeats, replication and the periodic checks.
        Tick = 2,
    }
}

/// Longest `maxTimeMS` a member honours (longer requests are capped).
pub const MAX_TIME_MS_CAP: u32 = 60_000;

/// Configuration shared by every member of a set.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberConfig {
    /// The members, in member-index order.
    pub members: Vec<NodeId>,
    /// Primary heartbeats, secondaries' pull retries, deadline checks.
    pub heartbeat: Duration,
    /// Base election timeout; each arming adds a random jitter in `[0, election_timeout)`. A
    /// primary that has not heard from a majority for this long steps down.
    pub election_timeout: Duration,
    /// A secondary re-sends an unanswered pull after this long.
    pub pull_timeout: Duration,
    /// The idle primary writes a no-op this often (MongoDB: 10 s).
    pub noop_interval: Duration,
    /// Key rotation period in seconds of cluster time (MongoDB: 90 days).
    pub key_rotation_secs: u32,
    /// Whether the primary generates signing keys at all (off: every reply to an untrusted
    /// client omits `$clusterTime` and `operationTime`).
    pub generate_keys: bool,
    /// Whether clients hold the `advanceClusterTime` privilege (dummy signatures, no checks).
    pub trusted_clients: bool,
    /// Per-reply signing (one HMAC per reply) instead of range signing with a one-entry cache.
    pub per_reply_signing: bool,
    /// Largest number of oplog entries in one batch.
    pub batch_max: usize,
    /// A batch stops growing past this many bytes of entries (it holds at least one entry).
    pub batch_max_bytes: usize,
    /// Largest number of reads waiting for afterClusterTime, and of writes waiting for majority.
    pub max_waiters: usize,
    /// `maxAcceptableLogicalClockDriftSecs`.
    pub max_drift_secs: u64,
    /// The MongoDB wire-protocol surface (`hello`'s set name and hosts); `None`: the member
    /// still executes MongoDB commands, and `hello` names no set.
    pub mongo: Option<MongoSetConfig>,
    /// Largest oplog entry a MongoDB write produces, in bytes of its documents: a write that
    /// changes more is split into several entries, and one document larger than this gets
    /// BSONObjectTooLarge. An entry must fit a frame between members, with a batch's other
    /// entries (`batch_max_bytes`).
    pub max_docs_entry_bytes: usize,
    /// Test-only, for the negative control of the harness's oplog world check: the primary
    /// advances its commit point over what it applied alone, without a majority.
    pub unsafe_commit_alone: bool,
    /// Test-only, for the negative control of the sessions' guarantee invariant: reads do not
    /// wait for their afterClusterTime (a lagging member answers with what it has).
    pub unsafe_ignore_after_cluster_time: bool,
    /// Test-only, for the negative control of amnesia: a member restarted without its disk
    /// votes at once, as if it were new.
    pub unsafe_forget_amnesia: bool,
}

impl MemberConfig {
    pub fn new(members: Vec<NodeId>) -> Self {
        MemberConfig {
            members,
            heartbeat: Duration::from_millis(250),
            election_timeout: Duration::from_millis(1_500),
            pull_timeout: Duration::from_millis(1_000),
            noop_interval: Duration::from_secs(10),
            key_rotation_secs: DEFAULT_KEY_ROTATION_SECS,
            generate_keys: true,
            trusted_clients: false,
            per_reply_signing: false,
            batch_max: 1_000,
            batch_max_bytes: 1024 * 1024,
            max_waiters: 10_000,
            max_drift_secs: DEFAULT_MAX_ACCEPTABLE_DRIFT_SECS,
            mongo: None,
            max_docs_entry_bytes: 3 * 1024 * 1024,
            unsafe_commit_alone: false,
            unsafe_ignore_after_cluster_time: false,
            unsafe_forget_amnesia: false,
        }
    }

    pub fn majority(&self) -> usize {
        self.members.len() / 2 + 1
    }
}

/// What survives a crash: the Raft term and vote and the oplog (MongoDB journals both).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Durable {
    pub term: u64,
    pub voted_for: Option<u32>,
    pub oplog: Vec<Entry>,
    /// Per client, the newest write request this member refused: a copy of it (or of an
    /// older one) that reaches this member again later, even once it is primary, is refused
    /// too, so a write its client saw fail never runs.
    pub refused_writes: BTreeMap<u32, u64>,
    /// Restarted without its disk and not yet allowed to vote (`amnesia`).
    pub amnesiac: bool,
}

/// One change of the durable part, as journaled. A snapshot is a whole [`Durable`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Change {
    Vote {
        term: u64,
        voted_for: Option<u32>,
    },
    Append(Entry),
    /// Keep the first `keep` oplog entries (rollback).
    Truncate {
        keep: u64,
    },
    /// This member refused write request `request` of `client`.
    RefusedWrite {
        client: u32,
        request: u64,
    },
    /// Entered (`true`) or left amnesia.
    Amnesiac(bool),
}

/// The first 8 bytes of every snapshot and journal record: the layout of what follows. postcard
/// is not self-describing, so a record of another layout could decode into wrong fields rather
/// than fail (an oplog entry's retry record gained a field on 2026-12-08); a record without
/// this tag is unreadable, and the member comes back amnesiac (see `amnesia`).
const DURABLE_FORMAT: [u8; 8] = *b"KCSL0002";

fn encode_durable<T: serde::Serialize>(value: &T) -> postcard::Result<Vec<u8>> {
    postcard::to_extend(value, DURABLE_FORMAT.to_vec())
}

fn decode_durable<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> postcard::Result<T> {
    match bytes.strip_prefix(&DURABLE_FORMAT) {
        Some(body) => postcard::from_bytes(body),
        None => Err(postcard::Error::DeserializeBadEncoding),
    }
}

/// Journal records between two snapshots: beyond this many (and more than the oplog holds),
/// the member writes its whole durable part as a snapshot instead.
const CHANGES_PER_SNAPSHOT: u64 = 4_096;

impl Durable {
    fn apply(&mut self, c: Change) {
        match c {
            Change::Vote { term, voted_for } => (self.term, self.voted_for) = (term, voted_for),
            Change::Append(e) => self.oplog.push(e),
            Change::Truncate { keep } => self.oplog.truncate(keep as usize),
            Change::RefusedWrite { client, request } => {
                let r = self.refused_writes.entry(client).or_default();
                *r = (*r).max(request);
            }
            Change::Amnesiac(a) => self.amnesiac = a,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberState {
    Secondary,
    Candidate { votes: BTreeSet<u32> },
    Primary,
}

/// Counters a test or benchmark can read with `sim.role::<Member>()`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberStats {
    pub client_requests: u64,
    pub replies: u64,
    pub replies_without_cluster_time: u64,
    pub errors: BTreeMap<i32, u64>,
    pub elections_won: u64,
    pub step_downs: u64,
    pub rollbacks: u64,
    pub rolled_back_entries: u64,
    /// Entries at or below this member's commit point that a rollback removed (must stay 0).
    pub rolled_back_committed: u64,
    pub noops_written: u64,
    /// Journal records a restart could not read (see `on_recover`).
    pub journal_unreadable: u64,
    pub keys_generated: u64,
    pub ignored_messages: u64,
    /// Client writes that reached the primary again after they ran (answered, not re-run).
    pub retried_writes: u64,
    /// Restarted without its disk (`amnesia`).
    pub disk_lost: bool,
    /// Vote requests refused because this member was amnesiac.
    pub votes_refused_amnesiac: u64,
    /// Dry runs refused to a member with the same oplog while this one ran its own (the
    /// lower-numbered member goes first, see `election`).
    pub dry_runs_refused_contending: u64,
    /// Heartbeats and batches older than one already taken from the same primary (replayed
    /// or overtaken copies), not taken as a sign of its life.
    pub stale_primary_messages: u64,
    /// Write requests refused while amnesiac, answered as of unknown outcome.
    pub writes_refused_amnesiac: u64,
    /// Write requests refused because they named another term than this primary's
    /// ([`crate::msg::Request::term`]).
    pub writes_refused_other_term: u64,
}

/// A read waiting for `after` (applied, or committed when `majority`).
struct Waiter {
    client: NodeId,
    deadline: LocalTime,
    after: Option<ClusterTime>,
    majority: bool,
    what: Waiting,
}

enum Waiting {
    Kv(Request),
    Mongo(Box<mongo_exec::ParkedRead>),
}

struct PendingWrite {
    client: NodeId,
    id: u64,
    deadline: LocalTime,
    /// A MongoDB write: the reply body to send once the write is majority-committed.
    mongo: Option<bson::Document>,
}

/// One member of the replica set.
pub struct Member {
    cfg: Arc<MemberConfig>,
    me: u32,
    d: Durable,
    /// Changes of `d` made by the current handler, persisted when it ends.
    journal: Vec<Change>,
    /// Records persisted since the last snapshot.
    journaled: u64,
    state: MemberState,
    primary: Option<u32>,
    commit_point: ClusterTime,
    store: BTreeMap<u64, Vec<(u64, ClusterTime)>>,
    /// Per client, its latest write in the oplog: (request id, optime). Rebuilt from the oplog
    /// like the store (see [`WriteOrigin`]).
    writes_by_client: BTreeMap<u32, (u64, ClusterTime)>,
    /// MongoDB documents (from [`Op::Docs`]) and retryable-write records.
    docs: mongo_exec::DocStore,
    clock: LogicalClock,
    validator: ClusterTimeValidator,
    /// Every key this member has applied: validates client times.
    keys: KeyRing,
    /// Keys whose oplog entry is majority-committed: only these sign replies, so a client never
    /// holds a time signed with a key another member may not have (or that may roll back).
    signing_keys: KeyRing,
    /// Applied keys not yet committed, by the optime of their entry.
    pending_keys: Vec<(ClusterTime, SigningKey)>,
    /// Cursors, waiting `hello`s, topology version (not replicated).
    mongo: mongo_exec::MongoState,
    proofs: TimeProofService,
    hmac_reported: u64,
    // Primary.
    progress: BTreeMap<u32, OpPos>,
    contact: BTreeMap<u32, LocalTime>,
    held_pulls: BTreeSet<u32>,
    /// The commit point last sent to each secondary (in a batch).
    commit_sent: BTreeMap<u32, ClusterTime>,
    /// Writes waiting for the commit point, by (optime, arrival number): a retried write may
    /// wait for the same optime as the original.
    pending_writes: BTreeMap<(ClusterTime, u64), PendingWrite>,
    pending_seq: u64,
    last_write_at: LocalTime,
    // Secondary.
    /// The outstanding pull: when it was sent, and the oplog position it pulls after. Only a
    /// batch answering it moves the secondary on (and makes it pull again), so a duplicated or
    /// replayed batch cannot start a second pull chain.
    pull_sent: Option<(LocalTime, OpPos)>,
    noop_requested: ClusterTime,
    waiters: Vec<Waiter>,
    stats: MemberStats,
    /// The term probe while amnesiac ([`amnesia`]).
    amnesia: Option<amnesia::Amnesia>,
    /// The dry run this member is running before it stands ([`election`]).
    dry_run: Option<election::DryRun>,
    /// Peer messages sent in this life ([`PeerMsg::seq`]).
    peer_msgs_sent: std::cell::Cell<u64>,
    /// The newest heartbeat or batch taken from a primary: `(term, primary, seq)`.
    primary_heard: Option<(u64, u32, u64)>,
}

impl Member {
    /// Member number `me` (index into `cfg.members`), with nothing durable yet (a restarted
    /// member gets its durable part in `on_recover`).
    pub fn new(cfg: Arc<MemberConfig>, me: u32) -> Self {
        let mut proofs = TimeProofService::new();
        proofs.set_per_reply(cfg.per_reply_signing);
        let keys = KeyRing::new().with_retention_secs(cfg.key_rotation_secs);
        let signing_keys = keys.clone();
        let clock = LogicalClock::new().with_max_acceptable_drift_secs(cfg.max_drift_secs);
        let mut m = Member {
            cfg,
            me,
            d: Durable::default(),
            journal: Vec::new(),
            journaled: 0,
            state: MemberState::Secondary,
            primary: None,
            commit_point: ClusterTime::ZERO,
            store: BTreeMap::new(),
            writes_by_client: BTreeMap::new(),
            docs: mongo_exec::DocStore::default(),
            clock,
            validator: ClusterTimeValidator::new(),
            keys,
            signing_keys,
            pending_keys: Vec::new(),
            mongo: mongo_exec::MongoState::default(),
            proofs,
            hmac_reported: 0,
            progress: BTreeMap::new(),
            contact: BTreeMap::new(),
            held_pulls: BTreeSet::new(),
            commit_sent: BTreeMap::new(),
            pending_writes: BTreeMap::new(),
            pending_seq: 0,
            last_write_at: LocalTime::ZERO,
            pull_sent: None,
            noop_requested: ClusterTime::ZERO,
            waiters: Vec::new(),
            stats: MemberStats::default(),
            amnesia: None,
            dry_run: None,
            peer_msgs_sent: std::cell::Cell::new(0),
            primary_heard: None,
        };
        m.restore(Durable::default());
        m
    }

    /// Takes `d` as the durable part and rebuilds the document store from its oplog.
    fn restore(&mut self, d: Durable) {
        self.store.clear();
        self.writes_by_client.clear();
        self.docs = mongo_exec::DocStore::default();
        self.pending_keys.clear();
        for e in &d.oplog {
            self.apply(e);
        }
        self.d = d;
    }

    /// Sets the term and vote, journaling the change.
    fn set_vote(&mut self, term: u64, voted_for: Option<u32>) {
        (self.d.term, self.d.voted_for) = (term, voted_for);
        self.journal.push(Change::Vote { term, voted_for });
    }

    /// Appends an (applied) entry to the oplog, journaling it.
    fn log_push(&mut self, e: Entry) {
        self.journal.push(Change::Append(e.clone()));
        self.d.oplog.push(e);
    }

    /// Persists the handler's changes (a snapshot when the journal has grown long).
    fn flush_journal(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        if self.journal.is_empty() {
            return;
        }
        let changes = std::mem::take(&mut self.journal);
        self.journaled += changes.len() as u64;
        if self.journaled > CHANGES_PER_SNAPSHOT.max(self.d.oplog.len() as u64) {
            if let Ok(bytes) = encode_durable(&self.d) {
                ctx.persist_snapshot(bytes);
                self.journaled = 0;
                return;
            }
        }
        for c in changes {
            if let Ok(bytes) = encode_durable(&c) {
                ctx.persist(bytes);
            }
        }
    }

    // ----- observation -----

    pub fn state(&self) -> &MemberState {
        &self.state
    }
    pub fn is_primary(&self) -> bool {
        self.state == MemberState::Primary
    }
    pub fn term(&self) -> u64 {
        self.d.term
    }
    pub fn oplog(&self) -> &[Entry] {
        &self.d.oplog
    }
    pub fn last_applied(&self) -> ClusterTime {
        self.last_pos().optime
    }
    pub fn commit_point(&self) -> ClusterTime {
        self.commit_point
    }
    pub fn cluster_time(&self) -> ClusterTime {
        self.clock.current()
    }
    pub fn keys(&self) -> &KeyRing {
        &self.keys
    }
    pub fn hmac_computations(&self) -> u64 {
        self.proofs.hmac_computations()
    }
    pub fn stats(&self) -> &MemberStats {
        &self.stats
    }
    /// The list at `key` as of the last applied entry.
    pub fn read_local(&self, key: u64) -> Vec<u64> {
        self.read_at(key, ClusterTime::MAX)
    }

    fn read_at(&self, key: u64, upto: ClusterTime) -> Vec<u64> {
        self.store
            .get(&key)
            .map(|l| l.iter().take_while(|(_, t)| *t <= upto).map(|(v, _)| *v).collect())
            .unwrap_or_default()
    }

    fn last_pos(&self) -> OpPos {
        self.d.oplog.last().map(|e| OpPos { optime: e.optime, term: e.term }).unwrap_or_default()
    }

    fn index_of(&self, t: ClusterTime) -> Result<usize, usize> {
        self.d.oplog.binary_search_by(|e| e.optime.cmp(&t))
    }

    fn apply(&mut self, e: &Entry) {
        if let Some(o) = e.origin {
            self.writes_by_client.insert(o.client, (o.request, e.optime));
        }
        match &e.op {
            Op::Append { key, value } => self.store.entry(*key).or_default().push((*value, e.optime)),
            Op::Keys(keys) => {
                for k in keys {
                    self.keys.insert(k.clone());
                    self.pending_keys.push((e.optime, k.clone()));
                }
            }
            Op::Noop => {}
            Op::Docs { ns, writes, retry } => self.docs.apply(ns, writes, retry.as_ref(), e.optime, self.commit_point),
        }
        let _ = self.clock.advance_trusted(e.optime);
    }

    fn peer_time(&self) -> Option<SignedClusterTime> {
        Some(SignedClusterTime::dummy(self.clock.current()))
    }

    fn send_peer(&self, ctx: &mut Ctx<'_, CausalMsg>, to: u32, body: PeerBody) {
        if let Some(&node) = self.cfg.members.get(to as usize) {
            let seq = self.peer_msgs_sent.get() + 1;
            self.peer_msgs_sent.set(seq);
            let msg = PeerMsg { term: self.d.term, cluster_time: self.peer_time(), body, seq };
            ctx.send(node, CausalMsg::Peer(msg));
        }
    }

    fn others(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.cfg.members.len() as u32).filter(move |&i| i != self.me)
    }

    fn flush_metrics(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        let h = self.proofs.hmac_computations();
        if h > self.hmac_reported {
            ctx.metric("causal.hmac_computations", h - self.hmac_reported);
            self.hmac_reported = h;
        }
    }

    // ----- replies to clients -----

    /// The commit point moved: keys become signing keys, deleted documents are forgotten.
    fn commit_advanced(&mut self) {
        self.promote_keys();
        self.docs.compact(self.commit_point);
    }

    /// Moves keys whose entry the commit point has reached into the signing ring.
    fn promote_keys(&mut self) {
        if self.pending_keys.first().is_none_or(|(t, _)| *t > self.commit_point) {
            return;
        }
        let cp = self.commit_point;
        let (ready, wait): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.pending_keys).into_iter().partition(|(t, _)| *t <= cp);
        self.pending_keys = wait;
        for (_, k) in ready {
            self.signing_keys.insert(k);
        }
    }

    fn sign_for_client(&mut self) -> Option<SignedClusterTime> {
        let t = self.clock.current();
        let signed = sign_reply(t, self.cfg.trusted_clients, &self.signing_keys, &mut self.proofs);
        if signed.is_some() && !self.cfg.trusted_clients {
            // We produced that signature ourselves: a client echoing it needs no HMAC check.
            self.validator.note_valid(t);
        }
        signed
    }

    fn reply(
        &mut self,
        ctx: &mut Ctx<'_, CausalMsg>,
        to: NodeId,
        id: u64,
        result: Result<ReplyBody, ErrorReply>,
        operation_time: ClusterTime,
    ) {
        let cluster_time = self.sign_for_client();
        let operation_time = cluster_time.map(|_| operation_time);
        self.stats.replies += 1;
        if cluster_time.is_none() {
            self.stats.replies_without_cluster_time += 1;
        }
        if let Err(e) = &result {
            *self.stats.errors.entry(e.code).or_default() += 1;
        }
        ctx.metric("causal.replies", 1);
        let term = self.primary_term();
        let msg = Reply { id, result, operation_time, cluster_time, primary_hint: self.primary, term };
        ctx.send(to, CausalMsg::Reply(msg));
    }

    fn reply_err(&mut self, ctx: &mut Ctx<'_, CausalMsg>, to: NodeId, id: u64, e: ErrorReply) {
        let t = self.last_applied();
        self.reply(ctx, to, id, Err(e), t);
    }

    /// Refuses write request `id` of `to`, remembering it durably (see
    /// [`Durable::refused_writes`]).
    fn refuse_write(&mut self, ctx: &mut Ctx<'_, CausalMsg>, to: NodeId, id: u64, mut e: ErrorReply) {
        let r = self.d.refused_writes.entry(to.0).or_default();
        if id > *r {
            *r = id;
            self.journal.push(Change::RefusedWrite { client: to.0, request: id });
        }
        if self.d.amnesiac {
            // This may be a copy of a request its life before the lost disk ran, whose entry
            // can still commit: the session must not take the refusal as certain.
            self.stats.writes_refused_amnesiac += 1;
            e = ErrorReply::new(
                codes::INTERRUPTED_DUE_TO_REPL_STATE_CHANGE,
                format!("{} (this member lost its disk and cannot tell whether it ran this write before)", e.errmsg),
            );
        }
        self.reply_err(ctx, to, id, e);
    }

    /// Refuses request `req` with `e`: as a write (remembered) or a read.
    fn refuse(&mut self, ctx: &mut Ctx<'_, CausalMsg>, to: NodeId, req: &Request, e: ErrorReply) {
        match req.op {
            ClientOp::Append { .. } => self.refuse_write(ctx, to, req.id, e),
            ClientOp::Read { .. } => self.reply_err(ctx, to, req.id, e),
        }
    }

    fn on_request(&mut self, ctx: &mut Ctx<'_, CausalMsg>, from: NodeId, mut req: Request) {
        self.stats.client_requests += 1;
        req.max_time_ms = req.max_time_ms.min(MAX_TIME_MS_CAP);
        if let Some(ct) = &req.cluster_time {
            let trusted = self.cfg.trusted_clients;
            let now = ctx.now();
            if let Err(e) =
                gossip_in(&mut self.clock, &mut self.validator, &self.keys, &mut self.proofs, ct, trusted, now)
            {
                return self.refuse(ctx, from, &req, ErrorReply::from_clock(&e));
            }
        }
        if let Some(t) = req.after_cluster_time {
            if let Err(e) = self.clock.check_after_cluster_time(t) {
                return self.refuse(ctx, from, &req, ErrorReply::from_clock(&e));
            }
        }
        match req.op {
            ClientOp::Append { key, value } => self.client_write(ctx, from, &req, key, value),
            ClientOp::Read { .. } if !req.secondary_ok && !self.is_primary() => {
                let e = ErrorReply::new(
                    codes::NOT_PRIMARY_NO_SECONDARY_OK,
                    "not primary: send primary reads to the primary",
                );
                self.reply_err(ctx, from, req.id, e);
            }
            ClientOp::Read { .. } => {
                if self.read_ready(&req) {
                    self.answer_read(ctx, from, &req);
                } else if self.waiters.len() >= self.cfg.max_waiters {
                    let e = ErrorReply::new(codes::EXCEEDED_LIMIT, "too many reads waiting for afterClusterTime");
                    self.reply_err(ctx, from, req.id, e);
                } else {
                    let t = req.after_cluster_time.unwrap_or_default();
                    let deadline = ctx.now() + Duration::from_millis(u64::from(req.max_time_ms));
                    let (after, majority) = (req.after_cluster_time, req.read_concern == ReadConcern::Majority);
                    self.waiters.push(Waiter { client: from, deadline, after, majority, what: Waiting::Kv(req) });
                    self.want_noop(ctx, t);
                }
            }
        }
    }

    fn client_write(&mut self, ctx: &mut Ctx<'_, CausalMsg>, from: NodeId, req: &Request, key: u64, value: u64) {
        let origin = WriteOrigin { client: from.0, request: req.id };
        let executed = self.writes_by_client.get(&origin.client).copied();
        if let Some((_, optime)) = executed.filter(|(request, _)| *request == req.id) {
            // This request already ran (a retransmission, a duplicated or replayed message):
            // answer with its optime, once the write concern holds for it.
            self.stats.retried_writes += 1;
            if !self.is_primary() {
                // Only the primary follows an entry to its end: here it may still be rolled
                // back, and a waiter parked on a secondary was answered `Written` once a later
                // primary's commit point passed the rolled-back optime (a review's schedule,
                // now `a_parked_copy_of_a_rolled_back_majority_write_is_never_acknowledged`).
                // The outcome is unknown, not failed: the entry may still commit.
                let e = ErrorReply::new(
                    codes::INTERRUPTED_DUE_TO_REPL_STATE_CHANGE,
                    "not primary: this write ran, but its outcome is unknown here; retry it with the primary",
                );
                return self.reply_err(ctx, from, req.id, e);
            }
            if req.write_concern == WriteConcern::Majority {
                // A copy takes the place of its request's waiter, if one waits: copies cannot
                // grow the queue past `max_waiters` (a replaying network once did).
                let (client, id) = (from, req.id);
                self.pending_writes.retain(|_, p| !(p.client == client && p.id == id && p.mongo.is_none()));
                if self.pending_writes.len() >= self.cfg.max_waiters {
                    let e = ErrorReply::new(codes::EXCEEDED_LIMIT, "too many writes waiting for majority");
                    return self.reply_err(ctx, from, req.id, e);
                }
            }
            return self.acknowledge_write(ctx, from, req, optime);
        }
        let refused = self.d.refused_writes.get(&origin.client).copied();
        if executed.map(|(r, _)| r).max(refused).is_some_and(|newest| req.id <= newest) {
            // A copy of a request this member refused, or older than one it handled: the
            // client has moved on (it saw this one fail, or never waits for it any more).
            self.stats.retried_writes += 1;
            let e = ErrorReply::new(codes::TRANSACTION_TOO_OLD, "this write request was refused or superseded");
            return self.reply_err(ctx, from, req.id, e);
        }
        if !self.is_primary() {
            let e = ErrorReply::new(codes::NOT_WRITABLE_PRIMARY, "not primary: send writes to the primary");
            return self.refuse_write(ctx, from, req.id, e);
        }
        if req.term.is_some_and(|t| t != self.d.term) {
            // Meant for the primary of another term: it runs in none but that one, and this
            // member is never primary in it, so there is nothing to remember (`Request::term`).
            // The reply carries this primary's term for the session to send it again with.
            self.stats.writes_refused_other_term += 1;
            let e = ErrorReply::new(codes::PRIMARY_STEPPED_DOWN, "the write named another term than this primary's");
            return self.reply_err(ctx, from, req.id, e);
        }
        if req.write_concern == WriteConcern::Majority && self.pending_writes.len() >= self.cfg.max_waiters {
            let e = ErrorReply::new(codes::EXCEEDED_LIMIT, "too many writes waiting for majority");
            return self.refuse_write(ctx, from, req.id, e);
        }
        let optime = match self.write_from(ctx, Op::Append { key, value }, Some(origin)) {
            Ok(t) => t,
            Err(e) => return self.refuse_write(ctx, from, req.id, ErrorReply::from_clock(&e)),
        };
        self.acknowledge_write(ctx, from, req, optime);
    }

    /// Answers write `req` (at `optime`) once its write concern holds.
    fn acknowledge_write(&mut self, ctx: &mut Ctx<'_, CausalMsg>, from: NodeId, req: &Request, optime: ClusterTime) {
        match req.write_concern {
            WriteConcern::W1 => self.reply(ctx, from, req.id, Ok(ReplyBody::Written), optime),
            WriteConcern::Majority => {
                let deadline = ctx.now() + Duration::from_millis(u64::from(req.max_time_ms));
                self.add_pending(optime, PendingWrite { client: from, id: req.id, deadline, mongo: None });
                self.advance_commit(ctx);
            }
        }
    }

    /// Parks a write until the commit point reaches `t`.
    fn add_pending(&mut self, t: ClusterTime, p: PendingWrite) {
        self.pending_seq += 1;
        self.pending_writes.insert((t, self.pending_seq), p);
    }

    fn read_ready(&self, req: &Request) -> bool {
        self.ready_at(req.after_cluster_time, req.read_concern == ReadConcern::Majority)
    }

    /// Whether a read waiting for `after` may run: applied up to it (or committed, `majority`).
    fn ready_at(&self, after: Option<ClusterTime>, majority: bool) -> bool {
        let Some(t) = after else { return true };
        if self.cfg.unsafe_ignore_after_cluster_time {
            return true;
        }
        if majority {
            self.commit_point >= t
        } else {
            self.last_applied() >= t
        }
    }

    fn answer_read(&mut self, ctx: &mut Ctx<'_, CausalMsg>, to: NodeId, req: &Request) {
        let ClientOp::Read { key } = req.op else { return };
        let (list, t) = match req.read_concern {
            ReadConcern::Local => (self.read_local(key), self.last_applied()),
            ReadConcern::Majority => (self.read_at(key, self.commit_point), self.commit_point),
        };
        self.reply(ctx, to, req.id, Ok(ReplyBody::Read(list)), t);
    }

    /// A reader waits for `t`: make sure the oplog gets there.
    fn want_noop(&mut self, ctx: &mut Ctx<'_, CausalMsg>, t: ClusterTime) {
        if self.last_applied() >= t {
            return;
        }
        if self.is_primary() {
            let _ = self.write(ctx, Op::Noop);
        } else if t > self.noop_requested {
            if let Some(p) = self.primary {
                self.noop_requested = t;
                self.send_peer(ctx, p, PeerBody::NoopRequest { at_least: t });
            }
        }
    }

    fn check_waiters(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        if self.waiters.is_empty() {
            return;
        }
        let waiters = std::mem::take(&mut self.waiters);
        for w in waiters {
            if self.ready_at(w.after, w.majority) {
                match w.what {
                    Waiting::Kv(req) => self.answer_read(ctx, w.client, &req),
                    Waiting::Mongo(p) => self.mongo_answer_parked(ctx, w.client, *p),
                }
            } else {
                self.waiters.push(w);
            }
        }
    }

    fn expire_deadlines(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        let now = ctx.now();
        let waiters = std::mem::take(&mut self.waiters);
        for w in waiters {
            if w.deadline <= now {
                let e = ErrorReply::new(
                    codes::MAX_TIME_MS_EXPIRED,
                    "operation exceeded time limit waiting for afterClusterTime",
                );
                match w.what {
                    Waiting::Kv(req) => self.reply_err(ctx, w.client, req.id, e),
                    Waiting::Mongo(p) => self.mongo_reply_error(ctx, w.client, p.id, e.code, &e.errmsg, false),
                }
            } else {
                self.waiters.push(w);
            }
        }
        let expired: Vec<(ClusterTime, u64)> =
            self.pending_writes.iter().filter(|(_, p)| p.deadline <= now).map(|(k, _)| *k).collect();
        for k in expired {
            let t = k.0;
            if let Some(p) = self.pending_writes.remove(&k) {
                let e = ErrorReply::new(codes::WRITE_CONCERN_FAILED, "waiting for replication timed out");
                match p.mongo {
                    Some(body) => self.mongo_write_concern_error(ctx, p.client, p.id, body, &e, t),
                    None => self.reply(ctx, p.client, p.id, Err(e), t),
                }
            }
        }
    }

    // ----- primary -----

    /// Appends one entry as primary: tick, log, apply, feed waiting pulls.
    fn write(&mut self, ctx: &mut Ctx<'_, CausalMsg>, op: Op) -> Result<ClusterTime, kairos_clock::ClusterTimeError> {
        self.write_from(ctx, op, None)
    }

    /// Writes `op` for the client request `origin` (if any).
    fn write_from(
        &mut self,
        ctx: &mut Ctx<'_, CausalMsg>,
        op: Op,
        origin: Option<WriteOrigin>,
    ) -> Result<ClusterTime, kairos_clock::ClusterTimeError> {
        let optime = self.clock.reserve_ticks(1, ctx.now())?;
        if matches!(op, Op::Noop) {
            self.stats.noops_written += 1;
        }
        self.append_written(ctx, Entry { optime, term: self.d.term, op, origin });
        self.check_waiters(ctx);
        Ok(optime)
    }

    /// Primary: applies and logs an entry it wrote, feeds the secondaries' held pulls, and
    /// commits at once when it is the only member.
    fn append_written(&mut self, ctx: &mut Ctx<'_, CausalMsg>, entry: Entry) {
        self.apply(&entry);
        self.log_push(entry);
        self.last_write_at = ctx.now();
        self.feed_held_pulls(ctx);
        if self.cfg.members.len() == 1 {
            self.advance_commit(ctx);
        }
    }

    fn ensure_keys(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        if !self.is_primary() || !self.cfg.generate_keys {
            return;
        }
        let now = self.clock.current();
        self.keys.expire(now);
        // Decided on the keys of this oplog (signing, or pending their commit): `keys` also
        // validates with keys of rolled-back entries, which no member will ever sign with (a
        // review's schedule: a primary counted them as live and wrote no keys, so nothing could
        // sign for their 90 days).
        let mut held = self.signing_keys.clone();
        for (_, k) in &self.pending_keys {
            held.insert(k.clone());
        }
        held.expire(now);
        if !held.needs_new_keys(now) {
            return;
        }
        let Ok(optime) = self.clock.reserve_ticks(1, ctx.now()) else { return };
        let above = self.keys.keys().last().map_or(i64::MIN, |k| k.key_id.saturating_add(1));
        let created = held.generate_above(ctx.rng(), optime, self.cfg.key_rotation_secs, above);
        self.stats.keys_generated += created.len() as u64;
        self.append_written(ctx, Entry { optime, term: self.d.term, op: Op::Keys(created), origin: None });
    }

    fn entries_after(&self, last: OpPos) -> Option<Vec<Entry>> {
        let start = if last.optime == ClusterTime::ZERO {
            0
        } else {
            match self.index_of(last.optime) {
                Ok(i) if self.d.oplog[i].term == last.term => i + 1,
                _ => return None,
            }
        };
        // At most `batch_max` entries and about `batch_max_bytes` (always at least one entry),
        // so that a batch of large document writes still fits a frame.
        let mut end = start;
        let mut bytes = 0;
        while end < self.d.oplog.len() && end - start < self.cfg.batch_max {
            let b = self.d.oplog[end].op.approx_bytes();
            if end > start && bytes + b > self.cfg.batch_max_bytes {
                break;
            }
            bytes += b;
            end += 1;
        }
        Some(self.d.oplog[start..end].to_vec())
    }

    fn feed_held_pulls(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        let held = std::mem::take(&mut self.held_pulls);
        for m in held {
            let last = self.progress.get(&m).copied().unwrap_or_default();
            match self.entries_after(last) {
                Some(entries) if !entries.is_empty() => {
                    let body =
                        PeerBody::Batch { after: last, entries, commit_point: self.commit_point, rollback_to: None };
                    self.send_batch(ctx, m, body);
                }
                _ => {
                    self.held_pulls.insert(m);
                }
            }
        }
    }

    fn send_batch(&mut self, ctx: &mut Ctx<'_, CausalMsg>, to: u32, body: PeerBody) {
        if let PeerBody::Batch { commit_point, rollback_to: None, .. } = &body {
            self.commit_sent.insert(to, *commit_point);
        }
        self.send_peer(ctx, to, body);
    }

    fn on_pull(&mut self, ctx: &mut Ctx<'_, CausalMsg>, from: u32, last: OpPos) {
        if !self.is_primary() {
            return;
        }
        self.contact.insert(from, ctx.now());
        match self.entries_after(last) {
            None => {
                let to = match self.index_of(last.optime) {
                    Ok(i) | Err(i) => i.checked_sub(1).map(|j| self.d.oplog[j].optime).unwrap_or_default(),
                };
                let body = PeerBody::Batch {
                    after: last,
                    entries: Vec::new(),
                    commit_point: self.commit_point,
                    rollback_to: Some(to),
                };
                self.send_batch(ctx, from, body);
            }
            Some(entries) => {
                self.progress.insert(from, last);
                self.advance_commit(ctx);
                let knows_commit = self.commit_sent.get(&from).is_some_and(|&c| c >= self.commit_point);
                if entries.is_empty() && knows_commit {
                    self.held_pulls.insert(from);
                } else {
                    // New entries, or a commit point this secondary has not been told (e.g. the
                    // one its own pull just advanced): answer at once, or its majority readers
                    // would wait for the next write.
                    let body =
                        PeerBody::Batch { after: last, entries, commit_point: self.commit_point, rollback_to: None };
                    self.send_batch(ctx, from, body);
                }
            }
        }
    }

    fn advance_commit(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        if !self.is_primary() {
            return;
        }
        let mut applied: Vec<ClusterTime> = vec![self.last_applied()];
        applied.extend(self.progress.iter().filter(|(m, _)| **m != self.me).map(|(_, p)| p.optime));
        applied.sort_unstable_by(|a, b| b.cmp(a));
        let needed = if self.cfg.unsafe_commit_alone { 1 } else { self.cfg.majority() };
        let Some(&candidate) = applied.get(needed - 1) else { return };
        // Writes parked at or below the commit point are answered even when it did not move:
        // a one-member set commits a write as it appends it, before the write is parked (a
        // review's schedule waited for the next write, or the idle no-op 10 s later).
        self.answer_committed_writes(ctx);
        if candidate <= self.commit_point {
            return;
        }
        // Raft: only an entry of the current term commits by counting replicas.
        let Ok(i) = self.index_of(candidate) else { return };
        if self.d.oplog[i].term != self.d.term {
            return;
        }
        self.commit_point = candidate;
        self.commit_advanced();
        self.answer_committed_writes(ctx);
        // Tell the secondaries (their held pulls) the new commit point.
        let held = std::mem::take(&mut self.held_pulls);
        for m in held {
            let last = self.progress.get(&m).copied().unwrap_or_default();
            let body = PeerBody::Batch {
                after: last,
                entries: Vec::new(),
                commit_point: self.commit_point,
                rollback_to: None,
            };
            self.send_batch(ctx, m, body);
        }
        self.check_waiters(ctx);
    }

    /// Answers the majority writes the commit point has reached.
    fn answer_committed_writes(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        let done: Vec<(ClusterTime, u64)> =
            self.pending_writes.range(..=(self.commit_point, u64::MAX)).map(|(k, _)| *k).collect();
        for k in done {
            let t = k.0;
            if let Some(p) = self.pending_writes.remove(&k) {
                match p.mongo {
                    Some(body) => self.mongo_send(ctx, p.client, p.id, body, t),
                    None => self.reply(ctx, p.client, p.id, Ok(ReplyBody::Written), t),
                }
            }
        }
    }

    fn become_primary(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        self.state = MemberState::Primary;
        self.primary = Some(self.me);
        self.stats.elections_won += 1;
        self.progress.clear();
        self.held_pulls.clear();
        self.commit_sent.clear();
        let now = ctx.now();
        self.contact = self.others().map(|m| (m, now)).collect();
        ctx.cancel_timer(MemberTimer::Election);
        ctx.metric("causal.elections_won", 1);
        // A new primary writes a no-op in its term (MongoDB: "new primary"), then takes over keys.
        let _ = self.write(ctx, Op::Noop);
        self.ensure_keys(ctx);
        self.heartbeat(ctx);
    }

    fn step_down(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        if self.is_primary() {
            self.stats.step_downs += 1;
            let pending = std::mem::take(&mut self.pending_writes);
            for ((t, _), p) in pending {
                let e = ErrorReply::new(codes::INTERRUPTED_DUE_TO_REPL_STATE_CHANGE, "primary stepped down");
                match p.mongo {
                    Some(body) => self.mongo_write_concern_error(ctx, p.client, p.id, body, &e, t),
                    None => self.reply(ctx, p.client, p.id, Err(e), t),
                }
            }
            self.primary = None;
        }
        if !matches!(self.state, MemberState::Secondary) {
            self.state = MemberState::Secondary;
            self.arm_election(ctx);
        }
        self.held_pulls.clear();
        self.progress.clear();
    }

    fn heartbeat(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        let others: Vec<u32> = self.others().collect();
        for m in others {
            self.send_peer(ctx, m, PeerBody::Heartbeat { commit_point: self.commit_point });
        }
    }

    // ----- secondary -----

    fn maybe_pull(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        let Some(p) = self.primary else { return };
        if p == self.me || self.is_primary() {
            return;
        }
        let now = ctx.now();
        if let Some((at, _)) = self.pull_sent {
            if now.saturating_since(at) < self.cfg.pull_timeout {
                return;
            }
        }
        let last = self.last_pos();
        self.pull_sent = Some((now, last));
        self.send_peer(ctx, p, PeerBody::Pull { last });
    }

    fn on_batch(
        &mut self,
        ctx: &mut Ctx<'_, CausalMsg>,
        after: OpPos,
        entries: Vec<Entry>,
        commit_point: ClusterTime,
        rollback_to: Option<ClusterTime>,
    ) {
        if self.is_primary() {
            return;
        }
        if self.pull_sent.is_none_or(|(_, last)| last != after) {
            // Not the answer to the outstanding pull (a duplicate, a replay, an answer to a
            // pull that timed out): the outstanding pull or its timeout moves things on.
            ctx.metric("causal.unsolicited_batches", 1);
            return;
        }
        self.pull_sent = None;
        // A batch answers a pull made from `after`; if our oplog no longer ends there (a stale
        // batch for an older pull), it is dropped and we pull again.
        if after != self.last_pos() {
            ctx.metric("causal.stale_batches", 1);
        } else if let Some(to) = rollback_to {
            self.rollback(to);
        } else {
            {
                for e in entries {
                    if e.optime <= self.last_applied() {
                        continue;
                    }
                    self.apply(&e);
                    self.log_push(e);
                }
                let cp = commit_point.min(self.last_applied());
                if cp > self.commit_point {
                    self.commit_point = cp;
                    self.commit_advanced();
                }
                self.check_waiters(ctx);
            }
        }
        self.maybe_pull(ctx);
    }

    /// Truncates every entry after `to` and rebuilds the document store from what is left.
    fn rollback(&mut self, to: ClusterTime) {
        let keep = match self.index_of(to) {
            Ok(i) => i + 1,
            Err(i) => i,
        };
        if keep >= self.d.oplog.len() {
            // Our last entry sits at `to` with another term: drop it too.
            if let Some(last) = self.d.oplog.last() {
                if last.optime == to {
                    self.truncate(self.d.oplog.len() - 1);
                }
            }
            return;
        }
        self.truncate(keep);
    }

    fn truncate(&mut self, keep: usize) {
        let removed = self.d.oplog.split_off(keep);
        if removed.is_empty() {
            return;
        }
        self.journal.push(Change::Truncate { keep: keep as u64 });
        self.stats.rollbacks += 1;
        self.stats.rolled_back_entries += removed.len() as u64;
        self.stats.rolled_back_committed += removed.iter().filter(|e| e.optime <= self.commit_point).count() as u64;
        let first = removed[0].optime;
        for list in self.store.values_mut() {
            while list.last().is_some_and(|(_, t)| *t >= first) {
                list.pop();
            }
        }
        if removed.iter().any(|e| e.origin.is_some()) {
            // A client's latest surviving write may be older than the one rolled back.
            self.writes_by_client.clear();
            for e in &self.d.oplog {
                if let Some(o) = e.origin {
                    self.writes_by_client.insert(o.client, (o.request, e.optime));
                }
            }
        }
        self.pending_keys.retain(|(t, _)| *t < first);
        self.docs.truncate_from(first, &self.d.oplog);
        self.commit_point = self.commit_point.min(self.last_applied());
    }

    /// The term of the primary this member names ([`Reply::term`]): its own when primary, else
    /// the current term if it took a heartbeat or batch from that primary in it.
    fn primary_term(&self) -> Option<u64> {
        match (self.is_primary(), self.primary, self.primary_heard) {
            (true, _, _) => Some(self.d.term),
            (false, Some(p), Some((t, heard, _))) => (t == self.d.term && heard == p).then_some(t),
            _ => None,
        }
    }

    /// Whether a heartbeat or batch of `from`, numbered `seq`, in the current `term`, is newer
    /// than every one taken before from the primary of that term ([`PeerMsg::seq`]); if so it
    /// becomes the newest. (A member is primary in a term in one life only, so its numbers
    /// there only grow.)
    fn fresh_from_primary(&mut self, from: u32, term: u64, seq: u64) -> bool {
        if self.primary_heard.is_some_and(|(t, p, s)| t == term && p == from && seq <= s) {
            self.stats.stale_primary_messages += 1;
            return false;
        }
        self.primary_heard = Some((term, from, seq));
        true
    }

    /// Accepts `from` as the primary of the current term.
    fn follow(&mut self, ctx: &mut Ctx<'_, CausalMsg>, from: u32) {
        if matches!(self.state, MemberState::Candidate { .. }) {
            self.state = MemberState::Secondary;
        }
        if self.primary != Some(from) {
            self.pull_sent = None;
            self.noop_requested = ClusterTime::ZERO;
        }
        self.primary = Some(from);
        self.dry_run = None;
        self.arm_election(ctx);
    }

    fn on_peer(&mut self, ctx: &mut Ctx<'_, CausalMsg>, from: u32, msg: PeerMsg) {
        if let Some(ct) = &msg.cluster_time {
            let now = ctx.now();
            let r = gossip_in(&mut self.clock, &mut self.validator, &self.keys, &mut self.proofs, ct, true, now);
            if r.is_err() {
                self.stats.ignored_messages += 1;
            }
        }
        if msg.term > self.d.term {
            self.set_vote(msg.term, None);
            self.step_down(ctx);
            if self.primary.is_some_and(|p| p != from) {
                self.primary = None;
            }
        }
        let current = msg.term == self.d.term;
        let from_primary = matches!(msg.body, PeerBody::Heartbeat { .. } | PeerBody::Batch { .. });
        let fresh = current && from_primary && self.fresh_from_primary(from, msg.term, msg.seq);
        match msg.body {
            PeerBody::RequestVote { last, dry_run } => self.on_request_vote(ctx, from, msg.term, last, dry_run),
            PeerBody::VoteReply { granted, dry_run } => self.on_vote_reply(ctx, from, msg.term, granted, dry_run),
            PeerBody::Heartbeat { .. } => {
                if fresh && !self.is_primary() {
                    self.follow(ctx, from);
                    self.send_peer(ctx, from, PeerBody::HeartbeatAck { applied: self.last_pos() });
                    self.maybe_pull(ctx);
                }
            }
            PeerBody::HeartbeatAck { .. } => {
                if current && self.is_primary() {
                    self.contact.insert(from, ctx.now());
                }
            }
            PeerBody::Pull { last } => {
                if current {
                    self.on_pull(ctx, from, last);
                }
            }
            PeerBody::Batch { after, entries, commit_point, rollback_to } => {
                if fresh && !self.is_primary() {
                    self.follow(ctx, from);
                }
                if current {
                    self.on_batch(ctx, after, entries, commit_point, rollback_to);
                }
            }
            PeerBody::TermProbe { nonce } => self.send_peer(ctx, from, PeerBody::TermAnswer { nonce }),
            PeerBody::TermAnswer { nonce } => self.on_term_answer(from, nonce, msg.term),
            PeerBody::NoopRequest { at_least } => {
                if self.is_primary() && self.last_applied() < at_least && self.clock.current() >= at_least {
                    let _ = self.write(ctx, Op::Noop);
                }
            }
        }
    }

    fn on_tick(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        ctx.set_timer(MemberTimer::Tick, self.cfg.heartbeat);
        let now = ctx.now();
        if self.is_primary() {
            let alive = 1 + self
                .contact
                .iter()
                .filter(|(m, t)| **m != self.me && now.saturating_since(**t) < self.cfg.election_timeout)
                .count();
            if alive < self.cfg.majority() {
                self.step_down(ctx);
            } else {
                if now.saturating_since(self.last_write_at) >= self.cfg.noop_interval {
                    let _ = self.write(ctx, Op::Noop);
                }
                self.ensure_keys(ctx);
                self.heartbeat(ctx);
            }
        } else {
            self.maybe_pull(ctx);
            self.keys.expire(self.clock.current());
            self.probe_terms(ctx);
        }
        self.signing_keys.expire(self.clock.current());
        self.expire_deadlines(ctx);
        self.mongo_tick(ctx);
    }
}

impl Process for Member {
    type Msg = CausalMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        self.last_write_at = ctx.now();
        self.mongo.started_at = ctx.now();
        ctx.set_timer(MemberTimer::Tick, self.cfg.heartbeat);
        self.arm_election(ctx);
        self.probe_terms(ctx);
        self.flush_journal(ctx);
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, CausalMsg>, from: NodeId, msg: CausalMsg) {
        let member = self.cfg.members.iter().position(|&n| n == from).map(|i| i as u32);
        match (msg, member) {
            (CausalMsg::Peer(p), Some(m)) if m != self.me => self.on_peer(ctx, m, p),
            (CausalMsg::Request(r), _) => self.on_request(ctx, from, r),
            (CausalMsg::MongoRequest(r), None) => self.on_mongo(ctx, from, r),
            _ => self.stats.ignored_messages += 1,
        }
        self.maybe_end_amnesia(ctx);
        self.mongo_topology_check(ctx);
        self.flush_journal(ctx);
        self.flush_metrics(ctx);
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, CausalMsg>, timer: TimerId) {
        match MemberTimer::from_id(timer) {
            Some(MemberTimer::Election) => self.on_election_timeout(ctx),
            Some(MemberTimer::Tick) => self.on_tick(ctx),
            None => {}
        }
        self.maybe_end_amnesia(ctx);
        self.mongo_topology_check(ctx);
        self.flush_journal(ctx);
        self.flush_metrics(ctx);
    }

    /// The durable part this member journaled before its crash: the last snapshot, then every
    /// change since. (The host verified every record's checksum; a snapshot or record that
    /// still does not decode was written by another version of Kairos: replay stops there,
    /// keeping a prefix of the journal, `journal_unreadable` counts it, and the member has
    /// forgotten what came after, so it comes back amnesiac: see `amnesia`.)
    fn on_recover(&mut self, stored: &Stored) {
        let snapshot = stored.snapshot.as_deref().map(decode_durable::<Durable>);
        let mut unreadable = matches!(snapshot, Some(Err(_)));
        let mut d = snapshot.and_then(Result::ok).unwrap_or_default();
        if !unreadable {
            for r in &stored.records {
                match decode_durable::<Change>(r) {
                    Ok(c) => d.apply(c),
                    Err(_) => {
                        unreadable = true;
                        break;
                    }
                }
            }
        }
        self.journaled = stored.records.len() as u64;
        self.restore(d);
        if unreadable {
            self.stats.journal_unreadable += 1;
            self.enter_amnesia();
        }
    }

    /// Restarted without its disk: see `amnesia`.
    fn on_amnesia(&mut self) {
        self.stats.disk_lost = true;
        self.enter_amnesia();
    }

    /// Cheap invariants: the commit point is within what this member applied; the oplog's
    /// newest entries are in optime order, in no term above the current one; an amnesiac
    /// member is neither primary nor candidate.
    fn invariants(&self) -> Result<(), String> {
        if self.d.amnesiac && self.state != MemberState::Secondary {
            return Err(format!("member {}: amnesiac, yet {:?}", self.me, self.state));
        }
        if self.commit_point > self.last_applied() {
            return Err(format!(
                "member {}: commit point {:?} beyond its last applied {:?}",
                self.me,
                self.commit_point,
                self.last_applied()
            ));
        }
        if let [.., a, b] = self.d.oplog.as_slice() {
            if a.optime >= b.optime || a.term > b.term {
                return Err(format!("member {}: oplog tail out of order: {:?} then {:?}", self.me, a, b));
            }
        }
        if let Some(last) = self.d.oplog.last() {
            if last.term > self.d.term {
                return Err(format!(
                    "member {}: oplog entry of term {} above the current term {}",
                    self.me, last.term, self.d.term
                ));
            }
        }
        Ok(())
    }
}
