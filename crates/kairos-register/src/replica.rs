use crate::{majority, RegisterMsg, Versioned};
use kairos_core::{Ctx, NodeId, Process, TimerId};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const RECOVERY_RETRY: TimerId = TimerId(1);
/// At most this many keys travel in one recovery reply (a limit on message size).
pub const RECOVERY_KEYS_MAX: usize = 65_536;

/// Holds the highest-tagged value of every key; serves queries and stores once recovered.
pub struct Replica {
    peers: Vec<NodeId>,
    replica_count: usize,
    store: BTreeMap<u64, Versioned>,
    recovered: bool,
    recovery_replies: BTreeSet<NodeId>,
    retry: Duration,
}

impl Replica {
    /// `replicas` lists every replica of the register, this one included.
    pub fn new(me: NodeId, replicas: &[NodeId]) -> Self {
        Replica {
            peers: replicas.iter().copied().filter(|r| *r != me).collect(),
            replica_count: replicas.len(),
            store: BTreeMap::new(),
            recovered: replicas.len() <= 1,
            recovery_replies: BTreeSet::new(),
            retry: Duration::from_millis(500),
        }
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

    fn adopt(&mut self, key: u64, state: Versioned) {
        let slot = self.store.entry(key).or_default();
        if state.tag > slot.tag {
            *slot = state;
        }
    }

    fn ask_for_recovery(&self, ctx: &mut Ctx<'_, RegisterMsg>) {
        let missing = self.peers.iter().copied().filter(|p| !self.recovery_replies.contains(p));
        ctx.send_all(missing, &RegisterMsg::RecoverRequest);
        ctx.set_timer(RECOVERY_RETRY, self.retry);
    }
}

impl Process for Replica {
    type Msg = RegisterMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, RegisterMsg>) {
        if !self.recovered {
            self.ask_for_recovery(ctx);
        }
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, RegisterMsg>, from: NodeId, msg: RegisterMsg) {
        match msg {
            RegisterMsg::RecoverRequest => {
                let entries: Vec<_> = self.store.iter().take(RECOVERY_KEYS_MAX).map(|(k, v)| (*k, *v)).collect();
                ctx.send(from, RegisterMsg::RecoverReply { entries });
            }
            RegisterMsg::RecoverReply { entries } => {
                if self.recovered || !self.peers.contains(&from) {
                    return;
                }
                for (key, state) in entries {
                    self.adopt(key, state);
                }
                self.recovery_replies.insert(from);
                if self.recovery_replies.len() >= majority(self.replica_count - 1) {
                    self.recovered = true;
                    ctx.cancel_timer(RECOVERY_RETRY);
                    ctx.metric("register.recoveries", 1);
                }
            }
            _ if !self.recovered => ctx.metric("register.ignored_while_recovering", 1),
            RegisterMsg::Query { op, key } => {
                ctx.send(from, RegisterMsg::QueryAck { op, key, state: self.get(key) });
            }
            RegisterMsg::Store { op, key, state } => {
                self.adopt(key, state);
                ctx.send(from, RegisterMsg::StoreAck { op, key });
            }
            RegisterMsg::QueryAck { .. } | RegisterMsg::StoreAck { .. } => ctx.metric("register.unexpected_message", 1),
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, RegisterMsg>, timer: TimerId) {
        if timer == RECOVERY_RETRY && !self.recovered {
            self.ask_for_recovery(ctx);
        }
    }
}
