use crate::{majority, Life, RegisterMsg, Tag, Versioned};
use kairos_core::{Ctx, NodeId, Process, Stored, Timer, TimerId};
use rand::Rng as _;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

kairos_core::timers! {
    /// A replica's timers.
    enum ReplicaTimer {
        /// Ask the peers that have not answered the current round (recovery, or the
        /// announcement of this replica's life) again.
        RecoveryRetry = 1,
    }
}
/// At most this many keys travel in one recovery reply (a limit on message size); a larger
/// store travels in several.
pub const RECOVERY_KEYS_MAX: usize = 65_536;
/// After this many stored records the replica persists a snapshot of its whole store instead.
const RECORDS_PER_SNAPSHOT: u64 = 4_096;
/// The first 8 bytes of a snapshot: the layout of what follows. postcard is not
/// self-describing, so a snapshot of another layout could decode into wrong fields rather than
/// fail; one without this tag leaves the replica amnesiac (it recovers from the others).
const SNAPSHOT_FORMAT: [u8; 8] = *b"KREG0003";

/// What a snapshot holds: the replica's life, the other replicas' lives as it learned them,
/// and its whole store (records after it hold single keys).
#[derive(serde::Serialize, serde::Deserialize)]
struct Snapshot {
    life: Life,
    lives: Vec<(NodeId, Life)>,
    store: Vec<(u64, Versioned)>,
}

/// Where this replica's recovery (or the announcement of its life) stands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Round {
    /// Serving, every peer told of its life.
    Idle,
    /// Recovering, first round: the newest life of this replica each peer knows of.
    Numbering { nonce: u64, known: BTreeMap<NodeId, Life> },
    /// Recovering, second round (`want_state`), or recovered and announcing its life to the
    /// peers that have not answered yet. `pages`: per peer, the last key of the pages of its
    /// state received so far (a peer has answered once its last page is in).
    Telling { life: Life, want_state: bool, answered: BTreeSet<NodeId>, pages: BTreeMap<NodeId, u64> },
}

/// Holds the highest-tagged value of every key; serves queries and stores once recovered.
pub struct Replica {
    me: NodeId,
    peers: Vec<NodeId>,
    replica_count: usize,
    store: BTreeMap<u64, Versioned>,
    recovered: bool,
    round: Round,
    retry: Duration,
    /// Records persisted since the last snapshot.
    records_since_snapshot: u64,
    /// The tag of every key as last handed to the disk (a record, a snapshot, or what
    /// [`Process::on_recover`] read back): the invariant compares it with the store.
    durable: BTreeMap<u64, Tag>,
    /// Keys whose state changed in the current handler (cleared when the next one begins).
    changed: Vec<u64>,
    /// The current handler completed recovery (cleared when the next one begins).
    just_recovered: bool,
    /// Test-only: a completed recovery does not persist what it adopted ([`Self::unpersisted_recovery_unsafe`]).
    unpersisted_recovery: bool,
    /// This replica's life: the number of the recovery that gave it its state (crate docs).
    life: Life,
    /// Each other replica's newest life this one learned (when answering its recovery or
    /// announcement, or from a peer's state): it only grows.
    lives: BTreeMap<NodeId, Life>,
}

impl Replica {
    /// `replicas` lists every replica of the register, this one included.
    pub fn new(me: NodeId, replicas: &[NodeId]) -> Self {
        Replica {
            me,
            peers: replicas.iter().copied().filter(|r| *r != me).collect(),
            replica_count: replicas.len(),
            store: BTreeMap::new(),
            recovered: replicas.len() <= 1,
            round: Round::Idle,
            retry: Duration::from_millis(500),
            records_since_snapshot: 0,
            durable: BTreeMap::new(),
            changed: Vec::new(),
            just_recovered: false,
            unpersisted_recovery: false,
            life: Life::default(),
            lives: BTreeMap::new(),
        }
    }

    /// Test-only switch: a replica that completes recovery does not persist what it adopted.
    /// Unsafe: after a later crash that keeps its disk it serves at once without it, so a
    /// completed write may be held by fewer than a majority. Tests use it to show the
    /// replica's invariant catching it at the handler that completed recovery.
    pub fn unpersisted_recovery_unsafe(mut self) -> Self {
        self.unpersisted_recovery = true;
        self
    }

    /// Test-only switch: serve at once after a (re)start, skipping recovery. Unsafe: a replica
    /// that lost its state then answers with stale values. Tests use it to show the checker
    /// catching the bug.
    pub fn skip_recovery_unsafe(mut self) -> Self {
        self.recovered = true;
        self
    }

    pub fn is_recovered(&self) -> bool {
        self.recovered
    }

    /// This replica's life (crate docs, "Lives").
    pub fn life(&self) -> Life {
        self.life
    }

    pub fn get(&self, key: u64) -> Versioned {
        self.store.get(&key).copied().unwrap_or_default()
    }

    /// Takes `state` for `key` if it is newer. Returns whether it was.
    fn adopt(&mut self, key: u64, state: Versioned) -> bool {
        let slot = self.store.entry(key).or_default();
        let newer = state.tag > slot.tag;
        if newer {
            *slot = state;
            self.changed.push(key);
        }
        newer
    }

    /// Makes the newer state of `key` durable (before the acknowledgement leaves: see
    /// [`kairos_core::Effect::Persist`]); every so often, the whole store as a snapshot.
    fn persist(&mut self, ctx: &mut Ctx<'_, RegisterMsg>, key: u64) {
        self.records_since_snapshot += 1;
        if self.records_since_snapshot >= RECORDS_PER_SNAPSHOT && self.persist_store(ctx) {
            return;
        }
        let state = self.get(key);
        if let Ok(bytes) = postcard::to_allocvec(&(key, state)) {
            ctx.persist(bytes);
            self.durable.insert(key, state.tag);
        }
    }

    /// Persists the whole store as a snapshot. Returns whether it could.
    fn persist_store(&mut self, ctx: &mut Ctx<'_, RegisterMsg>) -> bool {
        let snapshot = Snapshot {
            life: self.life,
            lives: self.lives.iter().map(|(n, l)| (*n, *l)).collect(),
            store: self.store.iter().map(|(k, v)| (*k, *v)).collect(),
        };
        let Ok(bytes) = postcard::to_extend(&snapshot, SNAPSHOT_FORMAT.to_vec()) else { return false };
        ctx.persist_snapshot(bytes);
        self.records_since_snapshot = 0;
        self.durable = self.store.iter().map(|(k, v)| (*k, v.tag)).collect();
        true
    }

    /// Records `life` for peer `from` if it is newer than what this replica knows (durably
    /// before any answer leaves, once recovered: a restart must still report it). Returns the
    /// life recorded for `from` afterwards.
    fn learn_life(&mut self, ctx: &mut Ctx<'_, RegisterMsg>, from: NodeId, life: Life) -> Life {
        let known = self.lives.entry(from).or_default();
        if life > *known {
            *known = life;
            if self.recovered {
                self.persist_store(ctx);
            }
        }
        self.lives.get(&from).copied().unwrap_or_default()
    }

    /// Starts a recovery: its first round asks every peer for the newest life of this replica
    /// it knows of.
    fn start_recovery(&mut self, ctx: &mut Ctx<'_, RegisterMsg>) {
        let nonce = ctx.rng().random();
        self.round = Round::Numbering { nonce, known: BTreeMap::new() };
        self.send_round(ctx);
    }

    /// Tells every peer of `life` (a recovery's second round when `want_state`).
    fn tell(&mut self, ctx: &mut Ctx<'_, RegisterMsg>, life: Life, want_state: bool) {
        self.round = Round::Telling { life, want_state, answered: BTreeSet::new(), pages: BTreeMap::new() };
        self.send_round(ctx);
    }

    /// (Re)sends the current round to the peers that have not answered it, and arms the retry.
    fn send_round(&mut self, ctx: &mut Ctx<'_, RegisterMsg>) {
        match &self.round {
            Round::Idle => return,
            Round::Numbering { nonce, known } => {
                let missing = self.peers.iter().copied().filter(|p| !known.contains_key(p));
                ctx.send_all(missing, &RegisterMsg::LifeQuery { nonce: *nonce });
            }
            Round::Telling { life, want_state, answered, pages } => {
                for peer in self.peers.iter().copied().filter(|p| !answered.contains(p)) {
                    let after = pages.get(&peer).copied().filter(|_| *want_state);
                    ctx.send(peer, RegisterMsg::RecoverRequest { life: *life, want_state: *want_state, after });
                }
            }
        }
        ctx.set_timer(ReplicaTimer::RecoveryRetry, self.retry);
    }

    /// A peer's answer to the first round of a recovery.
    fn on_life_reply(&mut self, ctx: &mut Ctx<'_, RegisterMsg>, from: NodeId, nonce: u64, life: Life) {
        let needed = majority(self.replica_count - 1);
        let Round::Numbering { nonce: mine, known } = &mut self.round else { return };
        if *mine != nonce {
            return;
        }
        known.insert(from, life);
        if known.len() >= needed {
            // Above every life a majority of the peers knows of: every earlier recovery that
            // completed told a majority of them (crate docs, "Lives").
            let epoch = known.values().map(|l| l.epoch).max().unwrap_or(0) + 1;
            self.tell(ctx, Life { epoch, nonce }, true);
        }
    }

    /// A peer's answer to the second round of a recovery, or to an announcement.
    fn on_recover_reply(&mut self, ctx: &mut Ctx<'_, RegisterMsg>, from: NodeId, reply: RecoverReplyParts) {
        let RecoverReplyParts { life, known, entries, lives, more } = reply;
        let Round::Telling { life: mine, want_state, answered, pages } = &mut self.round else { return };
        if *mine != life {
            ctx.metric("register.ignored_recovery_replies", 1);
            return;
        }
        let want_state = *want_state;
        if known > life {
            // The peer knows a newer life of this replica: one of an earlier recovery that did
            // not complete, numbered alike. Number this one above it and tell every peer again
            // (a recovered replica keeps its state; acknowledgements of its previous number are
            // then dropped by clients, which costs only a retry).
            let life = Life { epoch: known.epoch + 1, nonce: life.nonce };
            ctx.metric("register.lives_renumbered", 1);
            if self.recovered {
                self.life = life;
                self.persist_store(ctx);
            }
            return self.tell(ctx, life, want_state);
        }
        let last_key = entries.last().map(|(k, _)| *k);
        let next_page = match (more && want_state && !self.recovered, last_key) {
            (true, Some(last)) if pages.get(&from).is_none_or(|seen| last > *seen) => {
                pages.insert(from, last);
                Some(last)
            }
            (true, _) => return, // a page already received, or an empty one that says more
            (false, _) => {
                answered.insert(from);
                None
            }
        };
        let answered_count = answered.len();
        if let Some(after) = next_page {
            // Adopt this page and ask for the next (the peer recorded this life at its first
            // page: whatever it acknowledges after that reports the new life).
            for (key, state) in entries {
                self.adopt(key, state);
            }
            ctx.send(from, RegisterMsg::RecoverRequest { life, want_state: true, after: Some(after) });
            return;
        }
        if self.recovered {
            if answered_count == self.peers.len() {
                self.round = Round::Idle;
                ctx.cancel_timer(ReplicaTimer::RecoveryRetry);
            }
            return;
        }
        // Nothing is persisted before recovery completes: a disk holding part of a recovery
        // would look whole to a restart, which serves at once.
        for (key, state) in entries {
            self.adopt(key, state);
        }
        for (node, l) in lives {
            if node != self.me && self.peers.contains(&node) {
                let known = self.lives.entry(node).or_default();
                *known = (*known).max(l);
            }
        }
        if answered_count >= majority(self.replica_count - 1) {
            self.life = life;
            if !self.unpersisted_recovery {
                self.persist_store(ctx);
            }
            self.recovered = true;
            self.just_recovered = true;
            ctx.metric("register.recoveries", 1);
            // The peers that did not answer may still hold an ended life of this replica, and
            // their acknowledgements would disagree with its own forever (clients count only
            // acknowledgements that agree): the round goes on, without state, until each has
            // answered (a review's schedule, five replicas of which one missed the recovery
            // and two were down).
            if let Round::Telling { want_state, .. } = &mut self.round {
                *want_state = false;
            }
            if answered_count == self.peers.len() {
                self.round = Round::Idle;
                ctx.cancel_timer(ReplicaTimer::RecoveryRetry);
            }
        }
    }
}

/// A [`RegisterMsg::RecoverReply`]'s fields.
struct RecoverReplyParts {
    life: Life,
    known: Life,
    entries: Vec<(u64, Versioned)>,
    lives: Vec<(NodeId, Life)>,
    more: bool,
}

impl Process for Replica {
    type Msg = RegisterMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, RegisterMsg>) {
        if !self.recovered {
            self.start_recovery(ctx);
        } else if self.life != Life::default() {
            // Restarted with its disk: the peers that missed its recovery (before the crash
            // or while it was down) may still hold an ended life of this replica, so it
            // announces its life again until each peer has answered.
            self.tell(ctx, self.life, false);
        }
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, RegisterMsg>, from: NodeId, msg: RegisterMsg) {
        self.changed.clear();
        self.just_recovered = false;
        let peer = self.peers.contains(&from);
        match msg {
            RegisterMsg::LifeQuery { nonce } => {
                let known = self.lives.get(&from).copied().unwrap_or_default();
                ctx.send(from, RegisterMsg::LifeReply { nonce, known });
            }
            RegisterMsg::LifeReply { nonce, known } if peer => self.on_life_reply(ctx, from, nonce, known),
            RegisterMsg::RecoverRequest { life, want_state, after } => {
                // Only peers' lives are kept (a stranger's requests are answered, not
                // recorded). A life older than the one recorded is refused: it is an ended
                // one (a delayed or replayed request), or a recovery that lost the numbering
                // to another, which then numbers itself anew.
                let known = if peer { self.learn_life(ctx, from, life) } else { life };
                let (mut entries, mut lives, mut more) = (Vec::new(), Vec::new(), false);
                if want_state && known == life {
                    let from_key = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
                    let mut page = self.store.range((from_key, std::ops::Bound::Unbounded));
                    entries = page.by_ref().take(RECOVERY_KEYS_MAX).map(|(k, v)| (*k, *v)).collect();
                    more = page.next().is_some();
                    lives = self.lives.iter().map(|(n, l)| (*n, *l)).collect();
                }
                ctx.send(from, RegisterMsg::RecoverReply { life, known, entries, lives, more });
            }
            RegisterMsg::RecoverReply { life, known, entries, lives, more } if peer => {
                self.on_recover_reply(ctx, from, RecoverReplyParts { life, known, entries, lives, more })
            }
            RegisterMsg::LifeReply { .. } | RegisterMsg::RecoverReply { .. } => {
                ctx.metric("register.ignored_recovery_replies", 1)
            }
            _ if !self.recovered => ctx.metric("register.ignored_while_recovering", 1),
            RegisterMsg::Query { op, key } => {
                ctx.send(from, RegisterMsg::QueryAck { op, key, state: self.get(key) });
            }
            RegisterMsg::Store { op, key, state } => {
                if self.adopt(key, state) {
                    self.persist(ctx, key);
                }
                let lives = self.lives.iter().map(|(n, l)| (*n, *l)).collect();
                ctx.send(from, RegisterMsg::StoreAck { op, key, life: self.life, lives });
            }
            RegisterMsg::QueryAck { .. } | RegisterMsg::StoreAck { .. } => ctx.metric("register.unexpected_message", 1),
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, RegisterMsg>, timer: TimerId) {
        self.changed.clear();
        self.just_recovered = false;
        if ReplicaTimer::from_id(timer) == Some(ReplicaTimer::RecoveryRetry) {
            self.send_round(ctx);
        }
    }

    /// A restart with its disk: every store it acknowledged was persisted first, so it holds
    /// all it ever promised and serves at once, as if it had only paused. A record that does
    /// not decode leaves it amnesiac: it then recovers from the other replicas, as without a
    /// disk.
    fn on_recover(&mut self, stored: &Stored) {
        // A replica of a replicated register writes its first snapshot when its recovery
        // completes, so only a lone replica's disk can hold records without one (life 0). A
        // snapshot that does not decode (one of an older layout, say) leaves it amnesiac.
        let snapshot = match stored.snapshot.as_deref() {
            None => Ok(Snapshot { life: Life::default(), lives: Vec::new(), store: Vec::new() }),
            Some(bytes) => match bytes.strip_prefix(&SNAPSHOT_FORMAT) {
                Some(body) => postcard::from_bytes::<Snapshot>(body),
                None => Err(postcard::Error::DeserializeBadEncoding),
            },
        };
        let Ok(snapshot) = snapshot else { return };
        let records: Result<Vec<(u64, Versioned)>, _> =
            stored.records.iter().map(|r| postcard::from_bytes(r)).collect();
        let Ok(records) = records else { return };
        self.life = snapshot.life;
        self.lives = snapshot.lives.into_iter().collect();
        for (key, state) in snapshot.store.into_iter().chain(records) {
            self.adopt(key, state);
        }
        self.changed.clear();
        self.durable = self.store.iter().map(|(k, v)| (*k, v.tag)).collect();
        self.records_since_snapshot = stored.records.len() as u64;
        self.recovered = true;
    }

    /// Cheap invariants, after every handler: once recovered, every value the handler adopted
    /// was handed to the disk, and all of them after the handler that completed recovery (so a
    /// restart with the disk serves nothing older than what this replica answered or counted
    /// toward a majority); recovery ends exactly when a majority of the other replicas has
    /// answered its second round, and a recovered replica asks nobody for state.
    fn invariants(&self) -> Result<(), String> {
        let keys: Vec<u64> = match (self.recovered, self.just_recovered) {
            (false, _) => Vec::new(),
            (true, true) => self.store.keys().copied().collect(),
            (true, false) => self.changed.clone(),
        };
        for key in &keys {
            let held = self.get(*key).tag;
            let durable = self.durable.get(key).copied().unwrap_or_default();
            if durable != held {
                return Err(format!(
                    "replica {}: key {key} holds tag {held:?}, but the disk has only {durable:?}",
                    self.me
                ));
            }
        }
        let (answered, state_round) = match &self.round {
            Round::Telling { answered, want_state, .. } => (answered.len(), *want_state),
            Round::Numbering { known, .. } => (known.len(), false),
            Round::Idle => (0, false),
        };
        let needed = majority(self.replica_count - 1);
        if !self.recovered && state_round && answered >= needed {
            return Err(format!(
                "replica {}: {answered} recovery replies (a majority is {needed}) but still recovering",
                self.me
            ));
        }
        if self.recovered && state_round {
            return Err(format!("replica {}: recovered, but still asking its peers for their state", self.me));
        }
        Ok(())
    }
}
