use crate::{majority, RegisterMsg, Tag, Versioned};
use kairos_core::{Ctx, NodeId, Process, Stored, Timer, TimerId};
use rand::Rng as _;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

kairos_core::timers! {
    /// A replica's timers.
    enum ReplicaTimer {
        /// Recovering: ask the replicas that have not answered again.
        RecoveryRetry = 1,
    }
}
/// At most this many keys travel in one recovery reply (a limit on message size).
pub const RECOVERY_KEYS_MAX: usize = 65_536;
/// After this many stored records the replica persists a snapshot of its whole store instead.
const RECORDS_PER_SNAPSHOT: u64 = 4_096;
/// Recovery nonces remembered per peer, so that a replayed request of an earlier recovery is
/// not taken for a new life.
const NONCES_KEPT: usize = 64;

/// What a snapshot holds: the replica's life, the other replicas' lives as it learned them
/// and the recovery nonces they sent (so that a replayed request of an earlier recovery is
/// not taken for a new life after a restart either: a review's schedule), and its whole
/// store (records after it hold single keys).
#[derive(serde::Serialize, serde::Deserialize)]
struct Snapshot {
    life: u64,
    lives: Vec<(NodeId, u64)>,
    nonces_seen: Vec<(NodeId, Vec<u64>)>,
    store: Vec<(u64, Versioned)>,
}

/// Holds the highest-tagged value of every key; serves queries and stores once recovered.
pub struct Replica {
    me: NodeId,
    peers: Vec<NodeId>,
    replica_count: usize,
    store: BTreeMap<u64, Versioned>,
    recovered: bool,
    recovery_replies: BTreeSet<NodeId>,
    /// This recovery's nonce (drawn when it starts).
    recovery_nonce: Option<u64>,
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
    /// This replica's life: the nonce of the recovery that gave it its state (crate docs).
    life: u64,
    /// Each other replica's life, as learned when answering its recovery.
    lives: BTreeMap<NodeId, u64>,
    /// The recovery nonces each other replica sent, latest last (at most [`NONCES_KEPT`]).
    nonces_seen: BTreeMap<NodeId, std::collections::VecDeque<u64>>,
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
            recovery_replies: BTreeSet::new(),
            recovery_nonce: None,
            retry: Duration::from_millis(500),
            records_since_snapshot: 0,
            durable: BTreeMap::new(),
            changed: Vec::new(),
            just_recovered: false,
            unpersisted_recovery: false,
            life: 0,
            lives: BTreeMap::new(),
            nonces_seen: BTreeMap::new(),
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
            nonces_seen: self.nonces_seen.iter().map(|(n, seen)| (*n, seen.iter().copied().collect())).collect(),
            store: self.store.iter().map(|(k, v)| (*k, *v)).collect(),
        };
        let Ok(bytes) = postcard::to_allocvec(&snapshot) else { return false };
        ctx.persist_snapshot(bytes);
        self.records_since_snapshot = 0;
        self.durable = self.store.iter().map(|(k, v)| (*k, v.tag)).collect();
        true
    }

    fn ask_for_recovery(&mut self, ctx: &mut Ctx<'_, RegisterMsg>) {
        let nonce = *self.recovery_nonce.get_or_insert_with(|| ctx.rng().random());
        let missing = self.peers.iter().copied().filter(|p| !self.recovery_replies.contains(p));
        ctx.send_all(missing, &RegisterMsg::RecoverRequest { nonce });
        ctx.set_timer(ReplicaTimer::RecoveryRetry, self.retry);
    }
}

impl Process for Replica {
    type Msg = RegisterMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, RegisterMsg>) {
        if !self.recovered {
            self.ask_for_recovery(ctx);
        } else if self.life != 0 {
            // Restarted with its disk: the peers that missed its recovery (before the crash
            // or while it was down) may still hold an ended life of this replica, so it
            // announces its life again, with the nonce that gave it, until each peer has
            // answered. A peer that recorded it already only answers.
            self.recovery_nonce = Some(self.life);
            self.recovery_replies.clear();
            self.ask_for_recovery(ctx);
        }
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, RegisterMsg>, from: NodeId, msg: RegisterMsg) {
        self.changed.clear();
        self.just_recovered = false;
        match msg {
            RegisterMsg::RecoverRequest { nonce } => {
                // Only peers' lives are kept (a stranger's requests are answered, not recorded).
                let seen = self.peers.contains(&from).then(|| self.nonces_seen.entry(from).or_default());
                if let Some(seen) = seen.filter(|seen| !seen.contains(&nonce)) {
                    // A new recovery of `from`: its acknowledgements of earlier lives are void.
                    // Durable before the answer leaves (a restart must still report it).
                    if seen.len() >= NONCES_KEPT {
                        seen.pop_front();
                    }
                    seen.push_back(nonce);
                    self.lives.insert(from, nonce);
                    if self.recovered {
                        self.persist_store(ctx);
                    }
                }
                let entries: Vec<_> = self.store.iter().take(RECOVERY_KEYS_MAX).map(|(k, v)| (*k, *v)).collect();
                ctx.send(from, RegisterMsg::RecoverReply { nonce, entries });
            }
            RegisterMsg::RecoverReply { nonce, entries } => {
                if self.recovered && self.peers.contains(&from) && self.recovery_nonce == Some(nonce) {
                    // A peer that missed the recovery has now recorded this life (below).
                    self.recovery_replies.insert(from);
                    return;
                }
                if self.recovered || !self.peers.contains(&from) || self.recovery_nonce != Some(nonce) {
                    ctx.metric("register.ignored_recovery_replies", 1);
                    return;
                }
                // Nothing is persisted before recovery completes: a disk holding part of a
                // recovery would look whole to a restart, which serves at once.
                for (key, state) in entries {
                    self.adopt(key, state);
                }
                self.recovery_replies.insert(from);
                if self.recovery_replies.len() >= majority(self.replica_count - 1) {
                    self.life = nonce;
                    if !self.unpersisted_recovery {
                        self.persist_store(ctx);
                    }
                    self.recovered = true;
                    self.just_recovered = true;
                    ctx.metric("register.recoveries", 1);
                    // The peers that did not answer still hold this replica's ended life, and
                    // their acknowledgements would disagree with its own forever (the client
                    // counts only acknowledgements that agree): it keeps telling them, on the
                    // retry timer, until each has answered (a review's schedule, five replicas
                    // of which one missed the recovery and two were down).
                    if self.recovery_replies.len() == self.peers.len() {
                        ctx.cancel_timer(ReplicaTimer::RecoveryRetry);
                    }
                }
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
        if ReplicaTimer::from_id(timer) == Some(ReplicaTimer::RecoveryRetry)
            && (!self.recovered || self.recovery_replies.len() < self.peers.len())
        {
            self.ask_for_recovery(ctx);
        }
    }

    /// A restart with its disk: every store it acknowledged was persisted first, so it holds
    /// all it ever promised and serves at once, as if it had only paused. A record that does
    /// not decode leaves it amnesiac: it then recovers from the other replicas, as without a
    /// disk.
    fn on_recover(&mut self, stored: &Stored) {
        // A replica of a replicated register writes its first snapshot when its recovery
        // completes, so only a lone replica's disk can hold records without one (life 0). A
        // snapshot that does not decode (one written before lives existed, say) leaves it
        // amnesiac.
        let empty = Snapshot { life: 0, lives: Vec::new(), nonces_seen: Vec::new(), store: Vec::new() };
        let snapshot = stored.snapshot.as_deref().map_or(Ok(empty), postcard::from_bytes::<Snapshot>);
        let Ok(snapshot) = snapshot else { return };
        let records: Result<Vec<(u64, Versioned)>, _> =
            stored.records.iter().map(|r| postcard::from_bytes(r)).collect();
        let Ok(records) = records else { return };
        self.life = snapshot.life;
        self.lives = snapshot.lives.into_iter().collect();
        self.nonces_seen = snapshot.nonces_seen.into_iter().map(|(n, seen)| (n, seen.into_iter().collect())).collect();
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
    /// answered.
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
        if let Some(stranger) = self.recovery_replies.iter().find(|r| !self.peers.contains(r)) {
            return Err(format!("replica {}: a recovery reply counted from {stranger}, not a peer", self.me));
        }
        let needed = majority(self.replica_count - 1);
        if !self.recovered && self.recovery_replies.len() >= needed {
            return Err(format!(
                "replica {}: {} recovery replies (a majority is {needed}) but still recovering",
                self.me,
                self.recovery_replies.len()
            ));
        }
        Ok(())
    }
}
