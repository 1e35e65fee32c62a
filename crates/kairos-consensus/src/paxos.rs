//! Multi-Paxos for one shard: a replicated log embedded in the shard's server processes (it is
//! a component, not a node). The embedding server routes [`PaxosMsg`]s and its tick timer to
//! [`MultiPaxos`], proposes entries on the leader with [`MultiPaxos::propose`], and applies what
//! [`MultiPaxos::take_committed`] hands back, in slot order, on every replica.
//!
//! # Protocol
//! - **Ballots** `(round, replica)`, totally ordered. In the initial configuration replica
//!   `initial_leader` leads ballot `(0, initial_leader)` without an election (all logs are
//!   empty, so there is nothing to recover).
//! - **Steady state** (phase 2): the leader appends an entry and sends `Accept` (the new
//!   slots, its commit index and log length) to every follower at once; a follower that has not
//!   promised a higher ballot stores them and answers `Accepted` with its *ballot prefix*: the
//!   longest prefix of its log whose slots are committed or were accepted in the leader's
//!   ballot. The leader's commit index is the largest prefix held by a majority (itself
//!   included): **one round trip from the leader to the nearest majority** commits an entry.
//!   Followers learn the commit index from the next `Accept` or heartbeat (every
//!   `heartbeat_interval`) and apply up to it within their ballot prefix.
//! - **Election** (phase 1): a follower that has heard nothing from a leader for
//!   `election_timeout` (+ a random share of `election_jitter`) picks a higher round and sends
//!   `Prepare(ballot, from = its applied prefix)`. Acceptors with a lower promise promise and
//!   return every slot they hold from `from` on, with the ballot it was accepted in. With a
//!   majority of promises the candidate takes, per slot, the value of the highest ballot (a
//!   no-op where no promiser holds the slot), re-stamps all of them with its ballot and becomes
//!   leader; it is *ready* (serves its embedding server's clients) once everything it recovered
//!   is committed, so the server never acts on state the log has not settled.
//! - **Leader stickiness**: an acceptor ignores a `Prepare` while it has a live leader (a
//!   follower heard one within `election_timeout`; a leader heard from a majority within it),
//!   and a candidate that receives an `Accept` from a leader whose ballot is not below anything
//!   it promised or accepted from others gives its candidacy up and follows (its own candidacy
//!   is the only promise above that ballot, and it never sent an `Accept` in it). A replica
//!   back from a partition with a higher round therefore does not depose a healthy leader. A
//!   replica that steps down restarts its election timeout.
//! - **Catch-up**: a follower whose prefix is behind (lost messages, a gap, a restart) says so
//!   in `Accepted`; the leader resends from that prefix (once per reported gap) in batches of at
//!   most `batch_max` entries, with at most `window_max` unacknowledged entries per follower; a
//!   follower whose progress stalls for `resend_after` is re-sent from its acknowledged prefix.
//!   A replica's prefix never shrinks within a ballot and an incarnation; a restarted replica
//!   reports its new incarnation (it forgot which slots it applied), and the leader then starts
//!   over from the prefix it reports.
//! - **Check-quorum**: a leader that has heard from no majority for `election_timeout` steps
//!   down (it keeps its ballot; a later `Accept` or election settles who leads). A leader cut
//!   off from its followers thus stops serving its embedding server's clients within about an
//!   election timeout instead of for as long as the partition lasts.
//!
//! # Durable state
//! Every acceptor state a correct Paxos needs to survive a crash is persisted through the
//! host ([`Ctx::persist`]) before the handler's messages leave: the promised ballot, the
//! highest ballot granted to another replica, the highest round campaigned with, and every
//! slot with the ballot it was accepted in (a journal of `Change`s, compacted into one
//! snapshot after `max(1024, log length)` records). A restarted replica
//! ([`MultiPaxos::recover`]) is a voter at once, as it was: it keeps its promises and its
//! acknowledged slots, and forgets only what is volatile (its role, the commit index, which
//! slots it applied). It applies its log again from slot 0 as a leader's commit index reaches
//! it, so the embedding server rebuilds its state from the log. A restarted leader comes back
//! as a follower. A wiped disk is not detected: a replica that lost its promises and slots
//! could help choose a second value for a slot (`tests/classic.rs` shows the checker catching
//! it).
//!
//! # Simplifications (honest list)
//! - All replicas of a shard run with the same [`PaxosConfig`]: a new leader bounds how far
//!   apart the slots of a promise may be by `window_max + batch_max + 1`, the most an acceptor
//!   with the same config lets its log grow past its end (bogus promises cannot make it huge).
//! - No log compaction: the log is kept whole (journal snapshots include it), and a restarted
//!   replica re-applies it from slot 0. Runs are seconds long.
//! - A `Promise` carries every slot from the candidate's applied prefix on (unbatched).
//! - Ballots whose round is `u64::MAX` are treated as bogus and ignored (no election could
//!   follow them); a replica whose rounds run out stops campaigning instead of wrapping.
//! - No leader leases: a deposed leader that has not heard of its successor may still answer
//!   the embedding server's reads. The transaction protocols use what they read only after a
//!   prepare record is committed by the current leader, which checks the versions read
//!   against its own store (OCC validation; 2PL, which also holds the locks), so a stale read
//!   can only cause an abort.

use kairos_core::{Ctx, LocalTime, NodeId, Stored, TimerId};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// A Paxos ballot: rounds are ordered first, the proposing replica breaks ties.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Ballot {
    pub round: u64,
    pub replica: u32,
}

/// Leader → follower: slots `first ..` accepted in `ballot` (empty: a heartbeat), the
/// leader's commit index and log length.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Accept<E> {
    pub ballot: Ballot,
    pub first: u64,
    pub entries: Vec<Option<E>>,
    pub commit: u64,
    pub log_len: u64,
}

/// The Multi-Paxos messages among the replicas of one shard. `E` is the embedding protocol's
/// log entry; a slot holding `None` is a no-op (filled in by a new leader).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum PaxosMsg<E> {
    /// Leader → follower (see [`Accept`]).
    Accept(Accept<E>),
    /// Follower → leader: its ballot prefix; `gap`: the last `Accept` started beyond it;
    /// `incarnation`: how many times the follower restarted (its prefix restarts with it).
    Accepted { ballot: Ballot, prefix: u64, gap: bool, incarnation: u64 },
    /// The receiver has promised `promised`, higher than the sender's ballot.
    Reject { promised: Ballot },
    /// Candidate → acceptors: promise `ballot`, return your slots from `from` on.
    Prepare { ballot: Ballot, from: u64 },
    /// Acceptor → candidate: every slot it holds from `from` on, with its accepted ballot, and
    /// its applied (committed) prefix.
    Promise { ballot: Ballot, slots: Vec<(u64, Ballot, Option<E>)>, applied: u64 },
}

/// Knobs of the replicated log.
#[derive(Clone, Debug, PartialEq)]
pub struct PaxosConfig {
    /// Leader heartbeats (carrying the commit index) and everyone's tick, this often.
    pub heartbeat_interval: Duration,
    /// A follower that heard no leader for this long (+ jitter) starts an election; a
    /// candidate that has no majority of promises after this long retries with a higher round.
    pub election_timeout: Duration,
    /// Uniform random extra added to each election timeout, so candidates rarely collide.
    pub election_jitter: Duration,
    /// Most entries in one `Accept`.
    pub batch_max: usize,
    /// The leader sends what it proposed at most this often (one `Accept` per follower for
    /// everything proposed in between), if the embedding server gave the log a batch timer
    /// ([`MultiPaxos::with_batch_timer`]); zero sends every proposal at once. Batching trades up
    /// to this much latency per round for fewer messages, as Tiga's log sync does.
    pub batch_interval: Duration,
    /// Most entries sent to one follower and not yet acknowledged.
    pub window_max: u64,
    /// Most uncommitted entries at the leader; proposals beyond it are refused.
    pub uncommitted_max: u64,
    /// Entries sent to a follower and not acknowledged for this long are sent again.
    pub resend_after: Duration,
    /// TEST ONLY: the leader commits what it proposes without waiting for a majority. Breaks
    /// agreement once a partitioned leader is replaced (the negative control of the world
    /// check `kairos_harness::twopc_agreement`).
    pub unsafe_commit_alone: bool,
}

impl Default for PaxosConfig {
    fn default() -> Self {
        PaxosConfig {
            heartbeat_interval: Duration::from_millis(50),
            election_timeout: Duration::from_millis(800),
            election_jitter: Duration::from_millis(600),
            batch_max: 512,
            batch_interval: Duration::ZERO,
            window_max: 8192,
            uncommitted_max: 100_000,
            resend_after: Duration::from_millis(600),
            unsafe_commit_alone: false,
        }
    }
}

/// Why a proposal was refused.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ProposeError {
    /// This replica does not lead (`leader`: the replica it believes does).
    NotLeader { leader: Option<u32> },
    /// `uncommitted_max` entries are waiting for a majority.
    Busy,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Slot<E> {
    ballot: Ballot,
    entry: Option<E>,
}

/// One change of a replica's durable state, as journaled (see the module docs).
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Change<E> {
    /// The promise, the highest ballot granted to another replica, the highest round used.
    Promise { promised: Ballot, granted: Ballot, round_used: u64 },
    /// Slots `first ..` now hold `entries`, accepted in `ballot`.
    Accept { ballot: Ballot, first: u64, entries: Vec<Option<E>> },
    /// Only the first `keep` slots remain (a new leader rewrites its log from there).
    Truncate { keep: u64 },
    /// The replica restarted for the `n`-th time.
    Incarnation(u64),
}

/// A replica's whole durable state, as a journal snapshot.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct DurableLog<E> {
    promised: Ballot,
    granted: Ballot,
    round_used: u64,
    incarnation: u64,
    log: Vec<Option<Slot<E>>>,
}

impl<E> DurableLog<E> {
    fn apply(&mut self, change: Change<E>) {
        match change {
            Change::Promise { promised, granted, round_used } => {
                (self.promised, self.granted, self.round_used) = (promised, granted, round_used)
            }
            Change::Accept { ballot, first, entries } => {
                for (i, entry) in entries.into_iter().enumerate() {
                    // Slots were journaled as stored, so they are within reach of the log.
                    let Some(index) = usize::try_from(first).ok().and_then(|f| f.checked_add(i)) else { break };
                    if self.log.len() <= index {
                        self.log.resize_with(index + 1, || None);
                    }
                    self.log[index] = Some(Slot { ballot, entry });
                }
            }
            Change::Truncate { keep } => self.log.truncate(usize::try_from(keep).unwrap_or(usize::MAX)),
            Change::Incarnation(n) => self.incarnation = n,
        }
    }
}

/// Journal records between two snapshots: beyond this many (and more than the log holds), the
/// replica writes its whole durable state as one snapshot instead.
const CHANGES_PER_SNAPSHOT: u64 = 1_024;

/// A promise's slots (slot, accepted ballot, entry) and the promiser's applied prefix.
type Promised<E> = (Vec<(u64, Ballot, Option<E>)>, u64);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Role {
    Follower,
    Candidate { since: LocalTime },
    Leader,
}

#[derive(Clone, Debug, Default)]
struct FollowerProgress {
    /// Next slot to send.
    next: u64,
    /// Acknowledged ballot prefix.
    matched: u64,
    /// The follower's incarnation its prefix refers to.
    incarnation: u64,
    /// When `matched` last advanced (or nothing was outstanding): a stall re-sends from it.
    progressed_at: LocalTime,
    /// The prefix last re-sent from because of a reported gap.
    rewound_to: Option<u64>,
    /// When this follower last answered (check-quorum).
    replied_at: LocalTime,
}

/// Counters of one replica's log.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PaxosStats {
    pub elections_started: u64,
    pub elected: u64,
    pub accepts_sent: u64,
    pub entries_resent: u64,
    /// Journal records a restart could not decode (written by another version of Kairos).
    pub journal_unreadable: u64,
}

/// One replica of a shard's Multi-Paxos log (see the module docs).
pub struct MultiPaxos<E> {
    config: PaxosConfig,
    replicas: Vec<NodeId>,
    me: u32,
    timer: TimerId,
    /// The timer that sends batched proposals (see [`PaxosConfig::batch_interval`]).
    batch_timer: Option<TimerId>,
    /// Leader: proposals wait for the batch timer, which is armed.
    batch_armed: bool,
    role: Role,
    promised: Ballot,
    /// The ballot whose leader this follower last accepted from (its prefix refers to it).
    leader_ballot: Option<Ballot>,
    /// The highest ballot this replica promised to, or accepted from, another replica (its own
    /// candidacies excluded): a candidate may give its candidacy up for any leader not below it.
    granted: Ballot,
    /// The highest round this replica campaigned with (never reused).
    round_used: u64,
    log: Vec<Option<Slot<E>>>,
    /// Slots below are committed and handed to the embedding server (or queued for it).
    applied: u64,
    /// Follower: slots `applied .. prefix` were accepted in `leader_ballot`.
    prefix: u64,
    /// Commit index: slots below are chosen (leader: computed; follower: as last told).
    commit: u64,
    /// Leader: the log length at its election; ready once `commit` reaches it.
    recovered_len: u64,
    /// How many times this replica restarted (durable).
    incarnation: u64,
    /// Restarted from durable state and not started since: `start` journals the incarnation.
    recovered: bool,
    /// Changes of the durable state made by the current call, persisted when it ends.
    journal: Vec<Change<E>>,
    /// The promise state last journaled: a change of it is journaled at the end of the call.
    journaled_promise: (Ballot, Ballot, u64),
    /// Records persisted since the last snapshot.
    journaled: u64,
    last_heard: LocalTime,
    election_after: Duration,
    progress: BTreeMap<u32, FollowerProgress>,
    /// Candidate: promises (replica → slots, applied) received for `promised`.
    promises: BTreeMap<u32, Promised<E>>,
    committed_out: Vec<(u64, E)>,
    stats: PaxosStats,
}

impl<E: Clone + Serialize + DeserializeOwned> MultiPaxos<E> {
    /// Replica `me` of a shard replicated on `replicas`, in the initial configuration
    /// (`initial_leader` leads ballot `(0, initial_leader)`). A restarted replica is built the
    /// same way, then given its durable state with [`MultiPaxos::recover`]. `timer`: the tick
    /// timer id the embedding server reserves for the log.
    pub fn new(config: PaxosConfig, replicas: Vec<NodeId>, me: u32, initial_leader: u32, timer: TimerId) -> Self {
        let initial = Ballot { round: 0, replica: initial_leader };
        let lead = me == initial_leader;
        let mut p = MultiPaxos {
            config,
            replicas,
            me,
            timer,
            batch_timer: None,
            batch_armed: false,
            role: if lead { Role::Leader } else { Role::Follower },
            promised: initial,
            leader_ballot: Some(initial),
            granted: initial,
            round_used: 0,
            log: Vec::new(),
            applied: 0,
            prefix: 0,
            commit: 0,
            recovered_len: 0,
            incarnation: 0,
            recovered: false,
            journal: Vec::new(),
            journaled_promise: (initial, initial, 0),
            journaled: 0,
            last_heard: LocalTime::ZERO,
            election_after: Duration::ZERO,
            progress: BTreeMap::new(),
            promises: BTreeMap::new(),
            committed_out: Vec::new(),
            stats: PaxosStats::default(),
        };
        if lead {
            p.become_leader_progress(LocalTime::ZERO);
        }
        p
    }

    /// Batches proposals with `timer` (another id than the tick's, reserved by the embedding
    /// server, which routes it to [`MultiPaxos::on_timer`]) when the config's
    /// `batch_interval` is not zero.
    pub fn with_batch_timer(mut self, timer: TimerId) -> Self {
        if timer != self.timer {
            self.batch_timer = Some(timer);
        }
        self
    }

    pub fn is_leader(&self) -> bool {
        self.role == Role::Leader
    }

    /// Leader, and everything recovered at its election is committed (and handed out).
    pub fn is_ready(&self) -> bool {
        self.is_leader() && self.applied >= self.recovered_len
    }

    /// The replica believed to lead (this one included).
    pub fn leader_hint(&self) -> Option<u32> {
        match self.role {
            Role::Leader => Some(self.me),
            _ => self.leader_ballot.map(|b| b.replica),
        }
    }

    pub fn ballot(&self) -> Ballot {
        self.promised
    }

    /// Slots committed and handed out so far.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    pub fn commit_index(&self) -> u64 {
        self.commit
    }

    pub fn log_len(&self) -> u64 {
        self.log.len() as u64
    }

    /// How many times this replica restarted.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    pub fn stats(&self) -> PaxosStats {
        self.stats
    }

    /// The entry in `slot`, if this replica holds one (a no-op reads `None`).
    pub fn entry(&self, slot: u64) -> Option<&E> {
        self.log.get(usize::try_from(slot).ok()?)?.as_ref()?.entry.as_ref()
    }

    /// Newly committed entries, in slot order (no-ops skipped). Call after every other call.
    pub fn take_committed(&mut self) -> Vec<(u64, E)> {
        std::mem::take(&mut self.committed_out)
    }

    /// Restores what this replica made durable before a crash (call from the embedding
    /// server's [`kairos_core::Process::on_recover`], before `start`): the last snapshot, then
    /// every change since, up to the first record that does not decode (counted in
    /// `journal_unreadable`; the host has already checked every record's checksum). The
    /// replica comes back as a follower of no leader, with nothing applied.
    pub fn recover(&mut self, stored: &Stored) {
        // Without a snapshot, the journal starts from the initial configuration.
        let initial = DurableLog {
            promised: self.promised,
            granted: self.granted,
            round_used: self.round_used,
            incarnation: 0,
            log: Vec::new(),
        };
        let mut d = match stored.snapshot.as_deref().map(postcard::from_bytes::<DurableLog<E>>) {
            Some(Ok(d)) => d,
            Some(Err(_)) => {
                self.stats.journal_unreadable += 1;
                initial
            }
            None => initial,
        };
        for record in &stored.records {
            let Ok(change) = postcard::from_bytes::<Change<E>>(record) else {
                self.stats.journal_unreadable += 1;
                break;
            };
            d.apply(change);
        }
        self.promised = d.promised;
        self.granted = d.granted;
        self.round_used = d.round_used;
        self.incarnation = d.incarnation;
        self.log = d.log;
        self.journaled_promise = (d.promised, d.granted, d.round_used);
        self.journaled = stored.records.len() as u64;
        self.role = Role::Follower;
        self.leader_ballot = None;
        (self.applied, self.prefix, self.commit, self.recovered_len) = (0, 0, 0, 0);
        self.progress.clear();
        self.promises.clear();
        self.recovered = true;
    }

    /// Persists the durable changes of the current call (write-ahead: the host makes them
    /// durable before the call's messages leave). Every public entry point ends with it.
    fn flush<M>(&mut self, ctx: &mut Ctx<'_, M>) {
        let promise = (self.promised, self.granted, self.round_used);
        if promise != self.journaled_promise {
            self.journaled_promise = promise;
            self.journal.push(Change::Promise { promised: promise.0, granted: promise.1, round_used: promise.2 });
        }
        if self.journal.is_empty() {
            return;
        }
        let changes = std::mem::take(&mut self.journal);
        self.journaled += changes.len() as u64;
        if self.journaled > CHANGES_PER_SNAPSHOT.max(self.log_len()) {
            let snapshot = DurableLog {
                promised: self.promised,
                granted: self.granted,
                round_used: self.round_used,
                incarnation: self.incarnation,
                log: self.log.clone(),
            };
            if let Ok(bytes) = postcard::to_allocvec(&snapshot) {
                ctx.persist_snapshot(bytes);
                self.journaled = 0;
                return;
            }
        }
        for change in changes {
            if let Ok(bytes) = postcard::to_allocvec(&change) {
                ctx.persist(bytes);
            }
        }
    }

    /// Journals that slots `first .. first + entries.len()` now hold `entries`, in `ballot`.
    fn journal_slots(&mut self, ballot: Ballot, first: u64, entries: Vec<Option<E>>) {
        if !entries.is_empty() {
            self.journal.push(Change::Accept { ballot, first, entries });
        }
    }

    /// The log's cheap invariants, for the embedding role's
    /// [`kairos_core::Process::invariants`]: entries are applied only once committed, and a
    /// leader's commit index lies within its log.
    pub fn invariants(&self) -> Result<(), String> {
        if self.applied > self.commit {
            return Err(format!("replica {}: applied {} > commit index {}", self.me, self.applied, self.commit));
        }
        if self.is_leader() && self.commit > self.log_len() {
            return Err(format!("leader {}: commit index {} > log length {}", self.me, self.commit, self.log_len()));
        }
        if self.leader_ballot.is_some_and(|b| b > self.promised) {
            return Err(format!(
                "replica {}: follows ballot {:?} above its promise {:?}",
                self.me, self.leader_ballot, self.promised
            ));
        }
        Ok(())
    }

    fn majority(&self) -> usize {
        self.replicas.len() / 2 + 1
    }

    fn others(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.replicas.len() as u32).filter(move |r| *r != self.me)
    }

    fn node(&self, replica: u32) -> NodeId {
        self.replicas[replica as usize]
    }

    /// A ballot a correct replica can send: a known replica's, and a round that can still be
    /// exceeded (a ballot with round `u64::MAX` would stop every later election).
    fn plausible(&self, b: Ballot) -> bool {
        b.round < u64::MAX && (b.replica as usize) < self.replicas.len()
    }

    /// Leader: a majority (itself included) answered within the last election timeout.
    fn has_quorum(&self, now: LocalTime) -> bool {
        let heard = self
            .progress
            .values()
            .filter(|p| now.saturating_since(p.replied_at) < self.config.election_timeout)
            .count();
        heard + 1 >= self.majority()
    }

    fn replica_of(&self, node: NodeId) -> Option<u32> {
        self.replicas.iter().position(|n| *n == node).map(|r| r as u32)
    }

    /// Call from the embedding server's `on_start`.
    pub fn start<M: From<PaxosMsg<E>>>(&mut self, ctx: &mut Ctx<'_, M>) {
        self.last_heard = ctx.now();
        self.draw_election_timeout(ctx);
        if self.is_leader() {
            self.become_leader_progress(ctx.now());
        }
        if std::mem::take(&mut self.recovered) {
            self.incarnation += 1;
            self.journal.push(Change::Incarnation(self.incarnation));
            ctx.metric("paxos.recovered", 1);
        }
        ctx.set_timer(self.timer, self.config.heartbeat_interval);
        self.flush(ctx);
    }

    fn draw_election_timeout<M>(&mut self, ctx: &mut Ctx<'_, M>) {
        use rand::Rng as _;
        let jitter = self.config.election_jitter.as_nanos() as u64;
        let extra = if jitter == 0 { 0 } else { ctx.rng().random_range(0..=jitter) };
        self.election_after = self.config.election_timeout + Duration::from_nanos(extra);
    }

    /// Proposes `entry` (leader only). Returns its slot; it is committed once
    /// [`MultiPaxos::take_committed`] hands it back.
    pub fn propose<M: From<PaxosMsg<E>>>(&mut self, ctx: &mut Ctx<'_, M>, entry: E) -> Result<u64, ProposeError> {
        if !self.is_leader() {
            return Err(ProposeError::NotLeader { leader: self.leader_hint() });
        }
        if self.log_len().saturating_sub(self.commit) >= self.config.uncommitted_max {
            return Err(ProposeError::Busy);
        }
        let slot = self.log_len();
        self.journal_slots(self.promised, slot, vec![Some(entry.clone())]);
        self.log.push(Some(Slot { ballot: self.promised, entry: Some(entry) }));
        match self.batch_timer.filter(|_| !self.config.batch_interval.is_zero()) {
            Some(timer) => {
                if !self.batch_armed {
                    self.batch_armed = true;
                    ctx.set_timer(timer, self.config.batch_interval);
                }
            }
            None => self.send_all(ctx),
        }
        self.advance_leader_commit();
        self.flush(ctx);
        Ok(slot)
    }

    /// A tick timer fired; returns false if `timer` is not the log's.
    pub fn on_timer<M: From<PaxosMsg<E>>>(&mut self, ctx: &mut Ctx<'_, M>, timer: TimerId) -> bool {
        if Some(timer) == self.batch_timer {
            self.batch_armed = false;
            if self.is_leader() {
                self.send_all(ctx);
            }
            self.flush(ctx);
            return true;
        }
        if timer != self.timer {
            return false;
        }
        self.on_tick(ctx);
        self.flush(ctx);
        true
    }

    fn on_tick<M: From<PaxosMsg<E>>>(&mut self, ctx: &mut Ctx<'_, M>) {
        ctx.set_timer(self.timer, self.config.heartbeat_interval);
        let now = ctx.now();
        match self.role.clone() {
            Role::Leader => {
                // Check-quorum: a leader that has not heard from a majority for an election
                // timeout has probably been replaced; it stops acting as leader (so its
                // embedding server stops serving) rather than serve from a minority.
                if !self.has_quorum(now) {
                    ctx.metric("paxos.leader_stepped_down", 1);
                    self.role = Role::Follower;
                    self.leader_ballot = None;
                    self.progress.clear();
                    self.last_heard = now;
                    return;
                }
                for r in self.others().collect::<Vec<_>>() {
                    let p = self.progress.entry(r).or_default();
                    if p.next <= p.matched {
                        p.progressed_at = now;
                    } else if now.saturating_since(p.progressed_at) >= self.config.resend_after {
                        // Entries outstanding and no progress for a while: a batch was lost.
                        self.stats.entries_resent += p.next - p.matched;
                        ctx.metric("paxos.entries_resent", p.next - p.matched);
                        p.next = p.matched;
                        p.progressed_at = now;
                        p.rewound_to = None;
                    }
                    self.send_to(ctx, r, true);
                }
            }
            Role::Follower => {
                if now.saturating_since(self.last_heard) >= self.election_after {
                    self.start_election(ctx);
                }
            }
            Role::Candidate { since } => {
                if now.saturating_since(since) >= self.election_after {
                    self.start_election(ctx);
                }
            }
        }
    }

    fn start_election<M: From<PaxosMsg<E>>>(&mut self, ctx: &mut Ctx<'_, M>) {
        let round = self.promised.round.max(self.round_used).checked_add(1).filter(|r| *r < u64::MAX);
        let Some(round) = round else {
            // Only bogus ballots get here (see `plausible`); never overflow.
            ctx.metric("paxos.rounds_exhausted", 1);
            return;
        };
        self.stats.elections_started += 1;
        ctx.metric("paxos.elections_started", 1);
        self.round_used = round;
        self.promised = Ballot { round, replica: self.me };
        self.role = Role::Candidate { since: ctx.now() };
        self.leader_ballot = None;
        self.draw_election_timeout(ctx);
        self.promises.clear();
        let own = self.slots_from(self.applied);
        self.promises.insert(self.me, (own, self.applied));
        let msg = PaxosMsg::Prepare { ballot: self.promised, from: self.applied };
        for r in self.others().collect::<Vec<_>>() {
            ctx.send(self.node(r), msg.clone().into());
        }
        self.try_win(ctx);
    }

    fn slots_from(&self, from: u64) -> Vec<(u64, Ballot, Option<E>)> {
        let from = usize::try_from(from).unwrap_or(usize::MAX).min(self.log.len());
        self.log[from..]
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| ((from + i) as u64, s.ballot, s.entry.clone())))
            .collect()
    }

    /// A message from another replica of this shard (others are ignored).
    pub fn on_message<M: From<PaxosMsg<E>>>(&mut self, ctx: &mut Ctx<'_, M>, from: NodeId, msg: PaxosMsg<E>) {
        self.handle(ctx, from, msg);
        self.flush(ctx);
    }

    fn handle<M: From<PaxosMsg<E>>>(&mut self, ctx: &mut Ctx<'_, M>, from: NodeId, msg: PaxosMsg<E>) {
        let Some(sender) = self.replica_of(from) else {
            ctx.metric("paxos.ignored_foreign", 1);
            return;
        };
        if sender == self.me {
            return;
        }
        match msg {
            PaxosMsg::Accept(accept) => self.on_accept(ctx, sender, accept),
            PaxosMsg::Accepted { ballot, prefix, gap, incarnation } => {
                if self.is_leader() && ballot == self.promised {
                    self.on_accepted(ctx, sender, prefix, gap, incarnation);
                }
            }
            PaxosMsg::Reject { promised } => {
                // Only a replica that promised a (plausible) higher ballot says so; a leader
                // or candidate learns it and steps down.
                if self.plausible(promised) && promised > self.promised {
                    self.step_down(promised, ctx.now());
                }
            }
            PaxosMsg::Prepare { ballot, from } => self.on_prepare(ctx, sender, ballot, from),
            PaxosMsg::Promise { ballot, slots, applied } => {
                if matches!(self.role, Role::Candidate { .. }) && ballot == self.promised {
                    self.promises.insert(sender, (slots, applied));
                    self.try_win(ctx);
                }
            }
        }
    }

    /// Becomes a follower of `promised`. The election timeout restarts: a leader or candidate
    /// that just learned of a higher ballot gives its holder time to show up instead of
    /// campaigning again at once.
    fn step_down(&mut self, promised: Ballot, now: LocalTime) {
        self.promised = promised;
        self.last_heard = now;
        self.role = Role::Follower;
        self.leader_ballot = None;
        self.progress.clear();
        self.promises.clear();
    }

    fn on_accept<M: From<PaxosMsg<E>>>(&mut self, ctx: &mut Ctx<'_, M>, sender: u32, accept: Accept<E>) {
        let Accept { ballot, first, entries, commit, log_len } = accept;
        if !self.plausible(ballot) || ballot.replica != sender {
            ctx.metric("paxos.ignored_bogus", 1);
            return;
        }
        if ballot < self.promised && matches!(self.role, Role::Candidate { .. }) && ballot >= self.granted {
            // A live leader this candidate has promised nothing against (its own candidacy
            // is the only promise above it, and it never sent an Accept in that ballot): give the
            // candidacy up and follow, rather than reject and depose a healthy leader (a
            // replica rejoining from a partition, with a higher round, would otherwise).
            ctx.metric("paxos.candidacy_abandoned", 1);
            self.step_down(ballot, ctx.now());
        }
        if ballot < self.promised {
            ctx.send(self.node(sender), PaxosMsg::Reject { promised: self.promised }.into());
            return;
        }
        if ballot > self.promised || self.role != Role::Follower {
            self.step_down(ballot, ctx.now());
        }
        self.granted = self.granted.max(ballot);
        self.promised = ballot;
        self.last_heard = ctx.now();
        if self.leader_ballot != Some(ballot) {
            self.leader_ballot = Some(ballot);
            self.prefix = self.applied;
        }
        let gap = !entries.is_empty() && first > self.prefix;
        let mut stored: Option<(u64, Vec<Option<E>>)> = None;
        for (i, entry) in entries.into_iter().enumerate() {
            let Some(slot) = first.checked_add(i as u64) else { break };
            if slot < self.applied {
                continue;
            }
            let Ok(index) = usize::try_from(slot) else { break };
            // A leader never sends beyond its log; refuse absurd slot numbers from a faulty one.
            if index > self.log.len() + self.config.window_max as usize + self.config.batch_max {
                break;
            }
            if self.log.len() <= index {
                self.log.resize_with(index + 1, || None);
            }
            stored.get_or_insert_with(|| (slot, Vec::new())).1.push(entry.clone());
            self.log[index] = Some(Slot { ballot, entry });
        }
        if let Some((first, entries)) = stored {
            self.journal_slots(ballot, first, entries);
        }
        self.prefix = self.prefix.max(self.applied);
        while let Some(Some(s)) = self.log.get(self.prefix as usize) {
            if s.ballot != ballot {
                break;
            }
            self.prefix += 1;
        }
        // A leader's commit index never exceeds its log (a bogus one would make this follower
        // apply entries of its prefix that are not chosen).
        self.commit = self.commit.max(commit.min(log_len));
        self.apply_up_to(self.commit.min(self.prefix));
        let reply = PaxosMsg::Accepted { ballot, prefix: self.prefix, gap, incarnation: self.incarnation };
        ctx.send(self.node(sender), reply.into());
    }

    fn on_accepted<M: From<PaxosMsg<E>>>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        sender: u32,
        prefix: u64,
        gap: bool,
        incarnation: u64,
    ) {
        let len = self.log_len();
        let now = ctx.now();
        let p = self.progress.entry(sender).or_default();
        if incarnation < p.incarnation {
            return; // sent before the follower's last restart
        }
        p.replied_at = now;
        let prefix = prefix.min(len);
        if incarnation > p.incarnation {
            // The follower restarted: its slots are durable, but it forgot which it applied, so
            // its prefix starts over. Start over from what it reports.
            p.incarnation = incarnation;
            p.matched = prefix;
            p.next = prefix;
            p.progressed_at = now;
            p.rewound_to = None;
        } else if prefix > p.matched {
            p.matched = prefix;
            p.progressed_at = now;
        }
        // A gap: something sent before was lost. Resend from its prefix, once per prefix (later
        // replies to messages already in flight report the same gap).
        if gap && prefix < p.next && p.rewound_to != Some(prefix) {
            p.next = prefix;
            p.rewound_to = Some(prefix);
        }
        p.next = p.next.max(p.matched);
        self.advance_leader_commit();
        self.send_to(ctx, sender, false);
    }

    fn on_prepare<M: From<PaxosMsg<E>>>(&mut self, ctx: &mut Ctx<'_, M>, sender: u32, ballot: Ballot, from: u64) {
        if !self.plausible(ballot) || ballot.replica != sender {
            ctx.metric("paxos.ignored_bogus", 1);
            return;
        }
        let repeat = ballot == self.promised;
        if ballot <= self.promised && !repeat {
            ctx.send(self.node(sender), PaxosMsg::Reject { promised: self.promised }.into());
            return;
        }
        // Leader stickiness: while a live leader is heard from (a follower heard it within an
        // election timeout; a leader heard from a majority), a candidate is ignored; it retries
        // later. A replica back from a partition thus cannot depose a healthy leader.
        let now = ctx.now();
        let live = match self.role {
            Role::Leader => self.has_quorum(now),
            Role::Follower => {
                self.leader_ballot.is_some() && now.saturating_since(self.last_heard) < self.config.election_timeout
            }
            Role::Candidate { .. } => false,
        };
        if live && !repeat {
            ctx.metric("paxos.prepare_ignored_live_leader", 1);
            return;
        }
        self.step_down(ballot, now);
        self.granted = self.granted.max(ballot);
        let reply = PaxosMsg::Promise { ballot, slots: self.slots_from(from), applied: self.applied };
        ctx.send(self.node(sender), reply.into());
    }

    fn try_win<M: From<PaxosMsg<E>>>(&mut self, ctx: &mut Ctx<'_, M>) {
        if self.promises.len() < self.majority() {
            return;
        }
        let ballot = self.promised;
        let from = self.applied;
        // Per slot, the value accepted in the highest ballot among the promises.
        // A correct acceptor's held slots (ascending) are never more than `window_max +
        // batch_max + 1` apart, the first at most that far beyond `from` (it refuses `Accept`s
        // further beyond its log): a promise's slots are taken while they keep to that, so a
        // bogus one cannot make this log huge, and a correct one is taken whole.
        let gap_max = self.config.window_max.saturating_add(self.config.batch_max as u64).saturating_add(1);
        let mut best: BTreeMap<u64, (Ballot, Option<E>)> = BTreeMap::new();
        for (slots, _) in self.promises.values() {
            let mut reach = from;
            for (slot, b, e) in slots {
                if *slot < from {
                    continue;
                }
                if slot.saturating_sub(reach) > gap_max || !self.plausible(*b) {
                    ctx.metric("paxos.promise_slots_refused", 1);
                    break;
                }
                reach = reach.max(slot.saturating_add(1));
                if best.get(slot).is_none_or(|(bb, _)| b > bb) {
                    best.insert(*slot, (*b, e.clone()));
                }
            }
        }
        let end = best.keys().next_back().map_or(from, |s| s + 1);
        let (Ok(from_i), Ok(end_i)) = (usize::try_from(from), usize::try_from(end)) else { return };
        self.log.truncate(from_i);
        self.log.resize_with(end_i, || None);
        let mut rewritten = Vec::with_capacity(end_i - from_i);
        for i in from_i..end_i {
            let entry = best.remove(&(i as u64)).and_then(|(_, e)| e);
            rewritten.push(entry.clone());
            self.log[i] = Some(Slot { ballot, entry });
        }
        self.journal.push(Change::Truncate { keep: from });
        self.journal_slots(ballot, from, rewritten);
        self.recovered_len = end;
        self.commit = from;
        self.role = Role::Leader;
        self.leader_ballot = Some(ballot);
        self.stats.elected += 1;
        ctx.metric("paxos.elected", 1);
        let promises = std::mem::take(&mut self.promises);
        self.become_leader_progress(ctx.now());
        for (r, (_, applied)) in promises {
            if let Some(p) = self.progress.get_mut(&r) {
                p.matched = applied.min(end);
                p.next = p.matched;
            }
        }
        self.advance_leader_commit();
        for r in self.others().collect::<Vec<_>>() {
            self.send_to(ctx, r, true);
        }
    }

    fn become_leader_progress(&mut self, now: LocalTime) {
        let len = self.log_len();
        let others: Vec<u32> = self.others().collect();
        self.progress = others
            .into_iter()
            .map(|r| {
                let next = len.min(self.applied);
                let p = FollowerProgress {
                    next,
                    matched: 0,
                    incarnation: 0,
                    progressed_at: now,
                    rewound_to: None,
                    replied_at: now,
                };
                (r, p)
            })
            .collect();
    }

    /// Sends every follower its next batch, if any is due and the window allows.
    fn send_all<M: From<PaxosMsg<E>>>(&mut self, ctx: &mut Ctx<'_, M>) {
        for r in self.others().collect::<Vec<_>>() {
            self.send_to(ctx, r, false);
        }
    }

    /// Sends follower `r` its next batch, if any is due and the window allows; with
    /// `heartbeat`, sends an empty `Accept` when there is nothing else.
    fn send_to<M: From<PaxosMsg<E>>>(&mut self, ctx: &mut Ctx<'_, M>, r: u32, heartbeat: bool) {
        let len = self.log_len();
        let (batch_max, window_max) = (self.config.batch_max.max(1) as u64, self.config.window_max.max(1));
        let Some(p) = self.progress.get_mut(&r) else { return };
        let (first, end) = if p.next < len && p.next - p.matched.min(p.next) < window_max {
            (p.next, len.min(p.next + batch_max))
        } else if heartbeat {
            (len, len)
        } else {
            return;
        };
        if end > first {
            p.next = end;
        }
        let entries: Vec<Option<E>> =
            self.log[first as usize..end as usize].iter().map(|s| s.as_ref().and_then(|s| s.entry.clone())).collect();
        let msg = PaxosMsg::Accept(Accept { ballot: self.promised, first, entries, commit: self.commit, log_len: len });
        self.stats.accepts_sent += 1;
        ctx.send(self.node(r), msg.into());
    }

    fn advance_leader_commit(&mut self) {
        if !self.is_leader() {
            return;
        }
        let mut held: Vec<u64> = self.progress.values().map(|p| p.matched).collect();
        held.push(self.log_len());
        held.sort_unstable_by(|a, b| b.cmp(a));
        if let Some(&c) = held.get(self.majority() - 1) {
            self.commit = self.commit.max(c);
        }
        if self.config.unsafe_commit_alone {
            self.commit = self.log_len();
        }
        self.apply_up_to(self.commit);
    }

    fn apply_up_to(&mut self, upto: u64) {
        while self.applied < upto {
            let Some(Some(slot)) = self.log.get(self.applied as usize) else { break };
            if let Some(e) = &slot.entry {
                self.committed_out.push((self.applied, e.clone()));
            }
            self.applied += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kairos_core::{Effect, Rng};
    use rand::SeedableRng;

    type M = PaxosMsg<u32>;

    fn replicas() -> Vec<NodeId> {
        vec![NodeId(0), NodeId(1), NodeId(2)]
    }

    fn call<R>(me: u32, f: impl FnOnce(&mut Ctx<'_, M>) -> R) -> (R, Vec<(NodeId, M)>) {
        let mut rng = Rng::seed_from_u64(u64::from(me));
        let mut effects = Vec::new();
        let r = f(&mut Ctx::new(NodeId(me), LocalTime::ZERO, &mut rng, &mut effects));
        let sends =
            effects.into_iter().filter_map(|e| if let Effect::Send { to, msg } = e { Some((to, msg)) } else { None });
        (r, sends.collect())
    }

    #[test]
    fn leader_commits_with_one_follower_and_followers_learn_the_commit() {
        let mut p: Vec<_> =
            (0..3).map(|r| MultiPaxos::<u32>::new(PaxosConfig::default(), replicas(), r, 0, TimerId(1))).collect();
        let (slot, out) = call(0, |ctx| p[0].propose(ctx, 7));
        assert_eq!(slot, Ok(0));
        assert_eq!(out.len(), 2);
        let (_, replies) = call(1, |ctx| p[1].on_message(ctx, NodeId(0), out[0].1.clone()));
        assert!(p[0].take_committed().is_empty());
        call(0, |ctx| p[0].on_message(ctx, NodeId(1), replies[0].1.clone()));
        assert_eq!(p[0].take_committed(), vec![(0, 7)]);
        // The follower learns the commit from the next heartbeat.
        let (_, hb) = call(0, |ctx| p[0].on_timer(ctx, TimerId(1)));
        call(1, |ctx| p[1].on_message(ctx, NodeId(0), hb[0].1.clone()));
        assert_eq!(p[1].take_committed(), vec![(0, 7)]);
        let (refused, _) = call(1, |ctx| p[1].propose(ctx, 1));
        assert_eq!(refused, Err(ProposeError::NotLeader { leader: Some(0) }));
    }

    /// With a batch interval and a batch timer, proposals wait for the timer (armed once), and
    /// then one `Accept` per follower carries all of them; the commit needs a majority as ever.
    #[test]
    fn batched_proposals_leave_together_when_the_batch_timer_fires() {
        let config = PaxosConfig { batch_interval: Duration::from_millis(2), ..PaxosConfig::default() };
        let batch = TimerId(2);
        let mut p: Vec<_> = (0..3)
            .map(|r| MultiPaxos::<u32>::new(config.clone(), replicas(), r, 0, TimerId(1)).with_batch_timer(batch))
            .collect();
        let mut rng = Rng::seed_from_u64(0);
        let mut effects: Vec<Effect<M>> = Vec::new();
        for v in [7, 8, 9] {
            p[0].propose(&mut Ctx::new(NodeId(0), LocalTime::ZERO, &mut rng, &mut effects), v).unwrap();
        }
        let timers = effects.iter().filter(|e| matches!(e, Effect::SetTimer { id, .. } if *id == batch)).count();
        let sends = effects.iter().filter(|e| matches!(e, Effect::Send { .. })).count();
        assert_eq!((timers, sends), (1, 0), "{effects:?}");
        let (handled, out) = call(0, |ctx| p[0].on_timer(ctx, batch));
        assert!(handled);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(
            matches!(&out[0].1, PaxosMsg::Accept(Accept { first: 0, entries, .. }) if entries.len() == 3),
            "{out:?}"
        );
        assert!(p[0].take_committed().is_empty());
        let (_, replies) = call(1, |ctx| p[1].on_message(ctx, NodeId(0), out[0].1.clone()));
        call(0, |ctx| p[0].on_message(ctx, NodeId(1), replies[0].1.clone()));
        assert_eq!(p[0].take_committed(), vec![(0, 7), (1, 8), (2, 9)]);
        // The batch timer must not be the tick's.
        let same = MultiPaxos::<u32>::new(config, replicas(), 0, 0, TimerId(1)).with_batch_timer(TimerId(1));
        assert!(same.batch_timer.is_none());
    }

    fn call_at<R>(me: u32, at: LocalTime, f: impl FnOnce(&mut Ctx<'_, M>) -> R) -> (R, Vec<(NodeId, M)>) {
        let mut rng = Rng::seed_from_u64(u64::from(me));
        let mut effects = Vec::new();
        let r = f(&mut Ctx::new(NodeId(me), at, &mut rng, &mut effects));
        let sends =
            effects.into_iter().filter_map(|e| if let Effect::Send { to, msg } = e { Some((to, msg)) } else { None });
        (r, sends.collect())
    }

    /// Three started replicas, replica 0 leading ballot (0, 0).
    fn three() -> Vec<MultiPaxos<u32>> {
        (0..3)
            .map(|r| {
                let mut p = MultiPaxos::<u32>::new(PaxosConfig::default(), replicas(), r, 0, TimerId(1));
                call(r, |ctx| p.start(ctx));
                p
            })
            .collect()
    }

    /// Ballots with the largest round (from any replica, in any message) neither panic nor
    /// wrap when the election timer then fires, again and again.
    #[test]
    fn ballot_rounds_from_the_network_never_overflow() {
        let top = |replica| Ballot { round: u64::MAX, replica };
        let near = |replica| Ballot { round: u64::MAX - 1, replica };
        for me in [0, 1] {
            let mut p = MultiPaxos::<u32>::new(PaxosConfig::default(), replicas(), me, 0, TimerId(1));
            for (from, msg) in [
                (2, PaxosMsg::Prepare { ballot: top(2), from: 0 }),
                (2, PaxosMsg::Reject { promised: top(0) }),
                (0, PaxosMsg::Accept(Accept { ballot: top(0), first: 0, entries: vec![], commit: 0, log_len: 0 })),
                (2, PaxosMsg::Reject { promised: near(2) }),
                (2, PaxosMsg::Prepare { ballot: near(2), from: 0 }),
            ] {
                call_at(me, LocalTime::from_secs(1), |ctx| p.on_message(ctx, NodeId(from), msg));
                for t in 2..6 {
                    call_at(me, LocalTime::from_secs(t * 10), |ctx| p.on_timer(ctx, TimerId(1)));
                }
            }
            assert!(p.ballot().round < u64::MAX);
        }
    }

    /// A bogus promise naming a far slot does not make the new leader's log huge.
    #[test]
    fn a_bogus_promise_cannot_blow_up_the_recovered_log() {
        let mut p = three();
        call_at(1, LocalTime::from_secs(3), |ctx| p[1].on_timer(ctx, TimerId(1)));
        let ballot = p[1].ballot();
        assert_eq!(ballot, Ballot { round: 1, replica: 1 });
        let slots = vec![(0, Ballot::default(), Some(4)), (100_000, Ballot::default(), Some(5))];
        call_at(1, LocalTime::from_secs(3), |ctx| {
            p[1].on_message(ctx, NodeId(2), PaxosMsg::Promise { ballot, slots, applied: 0 })
        });
        assert!(p[1].is_leader());
        assert_eq!(p[1].log_len(), 1, "slot 0 recovered, the far slot refused");
    }

    /// A commit index beyond the sender's log is not believed (it would apply unchosen slots).
    #[test]
    fn a_commit_index_beyond_the_leaders_log_is_clamped() {
        let mut p = three();
        let b = Ballot { round: 0, replica: 0 };
        let bogus =
            PaxosMsg::Accept(Accept { ballot: b, first: 0, entries: vec![Some(7)], commit: u64::MAX, log_len: 0 });
        call(1, |ctx| p[1].on_message(ctx, NodeId(0), bogus));
        assert!(p[1].take_committed().is_empty());
        assert_eq!(p[1].commit_index(), 0);
        let honest = PaxosMsg::Accept(Accept { ballot: b, first: 1, entries: vec![], commit: 1, log_len: 1 });
        call(1, |ctx| p[1].on_message(ctx, NodeId(0), honest));
        assert_eq!(p[1].take_committed(), vec![(0, 7)]);
    }

    /// A leader that learns of a higher ballot (a `Reject`) restarts its election timeout
    /// instead of campaigning at the next tick.
    #[test]
    fn stepping_down_restarts_the_election_timeout() {
        let mut p = three();
        let t = LocalTime::from_secs(10);
        call_at(0, t, |ctx| {
            p[0].on_message(ctx, NodeId(1), PaxosMsg::Reject { promised: Ballot { round: 3, replica: 1 } })
        });
        assert!(!p[0].is_leader());
        call_at(0, LocalTime::from_millis(10_050), |ctx| p[0].on_timer(ctx, TimerId(1)));
        assert_eq!(p[0].stats().elections_started, 0);
        call_at(0, LocalTime::from_secs(12), |ctx| p[0].on_timer(ctx, TimerId(1)));
        assert_eq!(p[0].stats().elections_started, 1, "it campaigns once the timeout passed");
    }

    /// Leader stickiness: while the leader is live, its followers and the leader itself ignore
    /// a candidate's `Prepare`; a candidate that hears the live leader gives its candidacy up
    /// and follows instead of rejecting (and deposing) it.
    #[test]
    fn a_candidate_back_from_a_partition_does_not_depose_a_live_leader() {
        let mut p = three();
        // Replica 2 was cut off: it campaigned (nobody heard it) and holds a higher round.
        let (_, prepares) = call_at(2, LocalTime::from_secs(3), |ctx| p[2].on_timer(ctx, TimerId(1)));
        let ballot = p[2].ballot();
        assert!(ballot > p[0].ballot() && prepares.len() == 2);
        // Meanwhile the leader heartbeats replica 1 and hears back.
        let now = LocalTime::from_millis(3_100);
        let ack = PaxosMsg::Accepted { ballot: p[0].ballot(), prefix: 0, gap: false, incarnation: 0 };
        call_at(0, now, |ctx| p[0].on_message(ctx, NodeId(1), ack));
        let (_, hb) = call_at(0, now, |ctx| p[0].on_timer(ctx, TimerId(1)));
        for (to, m) in hb {
            let (_, back) = call_at(to.0, now, |ctx| p[to.0 as usize].on_message(ctx, NodeId(0), m.clone()));
            if to == NodeId(1) {
                call_at(0, now, |ctx| p[0].on_message(ctx, NodeId(1), back[0].1.clone()));
            } else {
                // The candidate follows the live leader: it accepts, does not reject.
                assert!(matches!(&back[..], [(_, PaxosMsg::Accepted { .. })]), "{back:?}");
            }
        }
        assert_eq!(p[2].leader_hint(), Some(0));
        // The candidate's Prepare, arriving late, is ignored by the live leader and follower.
        for (to, m) in prepares {
            let (_, out) = call_at(to.0, now, |ctx| p[to.0 as usize].on_message(ctx, NodeId(2), m.clone()));
            assert!(out.is_empty(), "{to:?}: {out:?}");
        }
        assert!(p[0].is_leader() && p[0].is_ready());
        // Without a leader for an election timeout, a Prepare is granted as before.
        let later = LocalTime::from_secs(5);
        let (_, out) = call_at(1, later, |ctx| {
            p[1].on_message(ctx, NodeId(2), PaxosMsg::Prepare { ballot: Ballot { round: 9, replica: 2 }, from: 0 })
        });
        assert!(matches!(&out[..], [(_, PaxosMsg::Promise { .. })]), "{out:?}");
    }

    /// Persist effects of a call, as the host would store them.
    /// (Each call is 10 s after the last: no leader is live, so a `Prepare` is never ignored.)
    fn call_stored<R>(me: u32, stored: &mut Stored, f: impl FnOnce(&mut Ctx<'_, M>) -> R) -> Vec<(NodeId, M)> {
        let mut rng = Rng::seed_from_u64(u64::from(me));
        let mut effects = Vec::new();
        let at = LocalTime::from_secs(10 * (stored.records.len() as u64 + 1));
        f(&mut Ctx::new(NodeId(me), at, &mut rng, &mut effects));
        let mut sends = Vec::new();
        for e in effects {
            match e {
                Effect::Persist(p) => stored.apply(p),
                Effect::Send { to, msg } => sends.push((to, msg)),
                _ => {}
            }
        }
        sends
    }

    /// A replica that promised a ballot and accepted slots keeps both across a crash: it
    /// rejects a lower ballot's `Prepare`, and a candidate it promises gets its slots back.
    #[test]
    fn promises_and_accepted_slots_survive_a_restart() {
        let mut stored = Stored::default();
        let mut p = MultiPaxos::<u32>::new(PaxosConfig::default(), replicas(), 2, 0, TimerId(1));
        call_stored(2, &mut stored, |ctx| p.start(ctx));
        let b0 = Ballot { round: 0, replica: 0 };
        let accept =
            PaxosMsg::Accept(Accept { ballot: b0, first: 0, entries: vec![Some(7), Some(8)], commit: 0, log_len: 2 });
        call_stored(2, &mut stored, |ctx| p.on_message(ctx, NodeId(0), accept));
        let b3 = Ballot { round: 3, replica: 1 };
        let promise =
            call_stored(2, &mut stored, |ctx| p.on_message(ctx, NodeId(1), PaxosMsg::Prepare { ballot: b3, from: 0 }));
        assert!(matches!(&promise[..], [(_, PaxosMsg::Promise { .. })]), "{promise:?}");

        // Crash: a fresh instance given only what was stored.
        let mut q = MultiPaxos::<u32>::new(PaxosConfig::default(), replicas(), 2, 0, TimerId(1));
        q.recover(&stored);
        call_stored(2, &mut stored, |ctx| q.start(ctx));
        assert_eq!((q.ballot(), q.log_len(), q.applied(), q.incarnation()), (b3, 2, 0, 1));
        let lower = Ballot { round: 2, replica: 0 };
        let out = call_stored(2, &mut stored, |ctx| {
            q.on_message(ctx, NodeId(0), PaxosMsg::Prepare { ballot: lower, from: 0 })
        });
        assert!(matches!(&out[..], [(_, PaxosMsg::Reject { promised })] if *promised == b3), "{out:?}");
        // Negative control: with its disk wiped, the same replica promises the lower ballot
        // and returns no slots, so a candidate could choose a second value for slot 0.
        let mut wiped = MultiPaxos::<u32>::new(PaxosConfig::default(), replicas(), 2, 0, TimerId(1));
        let mut blank = Stored::default();
        let prepare = PaxosMsg::Prepare { ballot: lower, from: 0 };
        let out = call_stored(2, &mut blank, |ctx| wiped.on_message(ctx, NodeId(0), prepare));
        assert!(matches!(&out[..], [(_, PaxosMsg::Promise { slots, .. })] if slots.is_empty()), "{out:?}");
        let b4 = Ballot { round: 4, replica: 0 };
        let out =
            call_stored(2, &mut stored, |ctx| q.on_message(ctx, NodeId(0), PaxosMsg::Prepare { ballot: b4, from: 0 }));
        let [(_, PaxosMsg::Promise { slots, .. })] = &out[..] else { panic!("{out:?}") };
        assert_eq!(slots, &vec![(0, b0, Some(7)), (1, b0, Some(8))]);
        // Its acknowledgements carry the new incarnation, so a leader starts over from them.
        let hb = PaxosMsg::Accept(Accept { ballot: b4, first: 2, entries: vec![], commit: 0, log_len: 2 });
        let out = call_stored(2, &mut stored, |ctx| q.on_message(ctx, NodeId(0), hb));
        assert!(matches!(&out[..], [(_, PaxosMsg::Accepted { incarnation: 1, .. })]), "{out:?}");

        // Snapshots: after many records the journal is compacted, and recovery still agrees.
        for i in 0..3_000u32 {
            let accept = PaxosMsg::Accept(Accept {
                ballot: b4,
                first: 2 + u64::from(i),
                entries: vec![Some(i)],
                commit: 0,
                log_len: 0,
            });
            call_stored(2, &mut stored, |ctx| q.on_message(ctx, NodeId(0), accept));
        }
        assert!(stored.snapshot.is_some() && stored.records.len() < 3_000);
        let mut r = MultiPaxos::<u32>::new(PaxosConfig::default(), replicas(), 2, 0, TimerId(1));
        r.recover(&stored);
        assert_eq!((r.ballot(), r.log_len(), r.incarnation(), r.stats().journal_unreadable), (b4, 3_002, 1, 0));
        assert_eq!(r.entry(3_001), Some(&2_999));
    }

    /// A journal record that does not decode stops replay there (a prefix is kept).
    #[test]
    fn an_unreadable_journal_record_keeps_the_prefix_before_it() {
        let mut stored = Stored::default();
        let mut p = MultiPaxos::<u32>::new(PaxosConfig::default(), replicas(), 1, 0, TimerId(1));
        let b0 = Ballot { round: 0, replica: 0 };
        for i in 0..3u32 {
            let accept = PaxosMsg::Accept(Accept {
                ballot: b0,
                first: u64::from(i),
                entries: vec![Some(i)],
                commit: 0,
                log_len: 0,
            });
            call_stored(1, &mut stored, |ctx| p.on_message(ctx, NodeId(0), accept));
        }
        stored.records[1] = vec![0xff; 3];
        let mut q = MultiPaxos::<u32>::new(PaxosConfig::default(), replicas(), 1, 0, TimerId(1));
        q.recover(&stored);
        assert_eq!((q.log_len(), q.stats().journal_unreadable), (1, 1));
    }

    #[test]
    fn garbage_never_panics() {
        let mut p = MultiPaxos::<u32>::new(PaxosConfig::default(), replicas(), 1, 0, TimerId(1));
        let b = Ballot { round: 0, replica: 0 };
        for msg in [
            PaxosMsg::Accept(Accept {
                ballot: b,
                first: u64::MAX,
                entries: vec![Some(1)],
                commit: u64::MAX,
                log_len: 0,
            }),
            PaxosMsg::Accept(Accept { ballot: b, first: 1 << 40, entries: vec![Some(1)], commit: 3, log_len: 0 }),
            PaxosMsg::Accepted { ballot: b, prefix: u64::MAX, gap: true, incarnation: u64::MAX },
            PaxosMsg::Promise { ballot: b, slots: vec![(u64::MAX, b, None)], applied: u64::MAX },
            PaxosMsg::Prepare { ballot: Ballot { round: u64::MAX, replica: 9 }, from: u64::MAX },
        ] {
            call(1, |ctx| p.on_message(ctx, NodeId(0), msg.clone()));
            call(1, |ctx| p.on_message(ctx, NodeId(2), msg.clone()));
            call(1, |ctx| p.on_message(ctx, NodeId(99), msg));
        }
        assert!(p.take_committed().is_empty());
    }
}
