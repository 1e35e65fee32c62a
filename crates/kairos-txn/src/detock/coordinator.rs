//! The Detock coordinator: submits each transaction, with all its keys, to the home of every
//! shard it touches, and commits it once every one of them answered with the values read on
//! its shard. A home that has not answered after `resubmit_after` gets the submission again
//! (it answers a transaction it executed without logging it twice). Detock never aborts:
//! every attempt is the first, and a transaction is given up (`info`) only after `max_sends`
//! rounds went unanswered.

use std::collections::BTreeMap;

use kairos_core::{Ctx, NodeId, Process, Timer, TimerId};
use kairos_workload::txn::{Key, ShardId, TxnId, Value};
use kairos_workload::{Pieces, Topology};

use super::msg::DetockMsg;
use super::{home, DetockConfig};
use crate::shell::{Attempt, TxnShell};

/// A Detock coordinator's timers: the shell's, and one per transaction (its round is
/// overdue).
pub use crate::shell::TxnTimer as CoordinatorTimer;

/// The values a home read on its shard (before the increments).
type Reads = Vec<(Key, Value)>;

#[derive(Clone, Debug)]
struct Pending {
    keys: Vec<Key>,
    pieces: Pieces,
    /// The involved shards' homes, and each one's answer once it came.
    homes: BTreeMap<ShardId, (NodeId, Option<Reads>)>,
    sends: u32,
}

/// See the module docs.
pub struct Coordinator {
    topology: Topology,
    config: DetockConfig,
    shell: TxnShell,
    txns: BTreeMap<TxnId, Pending>,
}

impl Coordinator {
    pub fn new(topology: &Topology, config: &DetockConfig, shell: TxnShell) -> Self {
        Coordinator { topology: topology.clone(), config: config.clone(), shell, txns: BTreeMap::new() }
    }

    pub fn shell(&self) -> &TxnShell {
        &self.shell
    }

    /// Invokes a transaction on `keys` now (tests drive coordinators this way).
    pub fn invoke(&mut self, ctx: &mut Ctx<'_, DetockMsg>, keys: Vec<Key>) -> bool {
        match self.shell.invoke(ctx, keys) {
            Some(a) => {
                self.begin(ctx, a);
                true
            }
            None => false,
        }
    }

    fn begin(&mut self, ctx: &mut Ctx<'_, DetockMsg>, a: Attempt) {
        let mut keys: Vec<Key> = Vec::with_capacity(a.keys.len());
        for k in a.keys {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let n = self.topology.replicas_per_shard();
        let mut homes = BTreeMap::new();
        for &k in &keys {
            let s = self.topology.shard_of_key(k);
            if let Some(node) = self.topology.shards.get(s as usize).and_then(|r| r.get(home(s, n) as usize)) {
                homes.insert(s, (*node, None));
            }
        }
        if homes.is_empty() {
            self.shell.unknown(ctx, a.txn);
            return;
        }
        self.txns.insert(a.txn, Pending { keys, pieces: a.pieces, homes, sends: 0 });
        self.send(ctx, a.txn);
    }

    /// Sends `txn` to every home that has not answered yet.
    fn send(&mut self, ctx: &mut Ctx<'_, DetockMsg>, txn: TxnId) {
        let Some(p) = self.txns.get_mut(&txn) else { return };
        p.sends += 1;
        if p.sends > 1 {
            ctx.metric("detock.resubmits", 1);
        }
        for (node, answer) in p.homes.values() {
            if answer.is_none() {
                ctx.send(*node, DetockMsg::Submit { txn, keys: p.keys.clone(), pieces: p.pieces.clone() });
            }
        }
        ctx.set_timer(CoordinatorTimer::Txn(txn.seq()), self.config.resubmit_after);
    }

    fn on_reply(
        &mut self,
        ctx: &mut Ctx<'_, DetockMsg>,
        from: NodeId,
        txn: TxnId,
        shard: ShardId,
        reads: Vec<(Key, Value)>,
    ) {
        let Some(p) = self.txns.get_mut(&txn) else { return };
        let Some((node, answer)) = p.homes.get_mut(&shard) else { return };
        if *node != from || answer.is_some() {
            return;
        }
        *answer = Some(reads);
        if p.homes.values().any(|(_, a)| a.is_none()) {
            return;
        }
        let Some(p) = self.txns.remove(&txn) else { return };
        ctx.cancel_timer(CoordinatorTimer::Txn(txn.seq()));
        let reads: Vec<(Key, Value)> = p.homes.into_values().flat_map(|(_, a)| a.unwrap_or_default()).collect();
        self.shell.committed(ctx, txn, &reads, false);
    }

    fn on_txn_timer(&mut self, ctx: &mut Ctx<'_, DetockMsg>, seq: u32) {
        let txn = TxnId::new(ctx.me(), seq);
        let Some(p) = self.txns.get(&txn) else { return };
        if p.sends >= self.config.max_sends {
            self.txns.remove(&txn);
            self.shell.unknown(ctx, txn);
            return;
        }
        self.send(ctx, txn);
    }
}

impl Process for Coordinator {
    type Msg = DetockMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, DetockMsg>) {
        self.shell.start(ctx);
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, DetockMsg>, from: NodeId, msg: DetockMsg) {
        match msg {
            DetockMsg::Reply { txn, shard, reads } => self.on_reply(ctx, from, txn, shard, reads),
            DetockMsg::PreReadAnswer(answer) => {
                if let Some(a) = self.shell.on_pre_read_answer(ctx, from, answer) {
                    self.begin(ctx, a);
                }
            }
            _ => {}
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, DetockMsg>, timer: TimerId) {
        match CoordinatorTimer::from_id(timer) {
            Some(CoordinatorTimer::Shell(t)) => {
                if let Some(a) = self.shell.on_timer(ctx, t) {
                    self.begin(ctx, a);
                }
            }
            Some(CoordinatorTimer::Txn(seq)) => self.on_txn_timer(ctx, seq),
            None => {}
        }
    }

    fn invariants(&self) -> Result<(), String> {
        self.shell.invariants()
    }

    fn on_recover(&mut self, stored: &kairos_core::Stored) {
        self.shell.recover(stored);
    }
}
