//! The Calvin+ coordinator: submits each transaction to the closest sequencer (the first to
//! answer a ping round; every `ping_interval` a new round), waits for the sequencer's reply
//! with the values read, and resubmits to the same sequencer when the reply is late (it
//! answers a transaction it already batched without batching it again). Calvin+
//! never aborts: every attempt is the first, and a transaction is given up (`info`) only after
//! `max_sends` submissions went unanswered.

use std::collections::BTreeMap;

use kairos_core::{Ctx, NodeId, Process, Timer, TimerId};
use kairos_workload::txn::{Key, TxnId, Value};
use kairos_workload::{Pieces, Topology};

use super::msg::CalvinMsg;
use super::{designated, CalvinConfig};
use crate::shell::{Attempt, ShellTimer, TxnShell, TXN_TIMER_BASE};

/// A Calvin+ coordinator's timers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorTimer {
    Shell(ShellTimer),
    /// A new ping round.
    Ping,
    /// A transaction's (its sequence number) reply is overdue: resubmit it.
    Txn(u32),
}

impl Timer for CoordinatorTimer {
    fn id(self) -> TimerId {
        match self {
            CoordinatorTimer::Shell(t) => t.id(),
            CoordinatorTimer::Ping => TimerId(1),
            CoordinatorTimer::Txn(seq) => TimerId(TXN_TIMER_BASE + u64::from(seq)),
        }
    }
    fn from_id(id: TimerId) -> Option<Self> {
        if id.0 == 1 {
            Some(CoordinatorTimer::Ping)
        } else if let Some(seq) = id.0.checked_sub(TXN_TIMER_BASE).and_then(|n| u32::try_from(n).ok()) {
            Some(CoordinatorTimer::Txn(seq))
        } else {
            ShellTimer::from_id(id).map(CoordinatorTimer::Shell)
        }
    }
}

#[derive(Clone, Debug)]
struct Pending {
    keys: Vec<Key>,
    pieces: Pieces,
    /// The sequencer of the first submission: resubmissions go there too, since only it
    /// knows whether it already batched the transaction (another would batch it again).
    sequencer: NodeId,
    sends: u32,
}

/// See the module docs.
pub struct Coordinator {
    topology: Topology,
    config: CalvinConfig,
    shell: TxnShell,
    /// The sequencer submissions go to: the first to answer the latest ping round (shard 0's
    /// before any answer).
    sequencer: Option<NodeId>,
    ping_round: u64,
    ping_answered: bool,
    txns: BTreeMap<TxnId, Pending>,
}

impl Coordinator {
    pub fn new(topology: &Topology, config: &CalvinConfig, shell: TxnShell) -> Self {
        Coordinator {
            topology: topology.clone(),
            config: config.clone(),
            shell,
            sequencer: None,
            ping_round: 0,
            ping_answered: false,
            txns: BTreeMap::new(),
        }
    }

    pub fn shell(&self) -> &TxnShell {
        &self.shell
    }

    /// Invokes a transaction on `keys` now (tests drive coordinators this way).
    pub fn invoke(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, keys: Vec<Key>) -> bool {
        match self.shell.invoke(ctx, keys) {
            Some(a) => {
                self.begin(ctx, a);
                true
            }
            None => false,
        }
    }

    fn sequencers(&self) -> Vec<NodeId> {
        let n = self.topology.replicas_per_shard();
        (0..self.topology.shard_count())
            .filter_map(|s| self.topology.shards[s].get(designated(s as u32, n) as usize).copied())
            .collect()
    }

    fn target(&self) -> Option<NodeId> {
        self.sequencer.or_else(|| self.sequencers().first().copied())
    }

    fn ping(&mut self, ctx: &mut Ctx<'_, CalvinMsg>) {
        self.ping_round += 1;
        self.ping_answered = false;
        ctx.send_all(self.sequencers(), &CalvinMsg::Ping { nonce: self.ping_round });
        ctx.set_timer(CoordinatorTimer::Ping, self.config.ping_interval);
    }

    fn begin(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, a: Attempt) {
        let mut keys: Vec<Key> = Vec::with_capacity(a.keys.len());
        for k in a.keys {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let Some(sequencer) = self.target() else { return };
        self.txns.insert(a.txn, Pending { keys, pieces: a.pieces, sequencer, sends: 0 });
        self.send(ctx, a.txn);
    }

    fn send(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, txn: TxnId) {
        let Some(p) = self.txns.get_mut(&txn) else { return };
        let to = p.sequencer;
        p.sends += 1;
        if p.sends > 1 {
            ctx.metric("calvin.resubmits", 1);
        }
        ctx.send(to, CalvinMsg::Submit { txn, keys: p.keys.clone(), pieces: p.pieces.clone() });
        ctx.set_timer(CoordinatorTimer::Txn(txn.seq()), self.config.resubmit_after);
    }

    fn on_reply(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, txn: TxnId, reads: &[(Key, Value)], fast: bool) {
        if self.txns.remove(&txn).is_none() {
            return;
        }
        ctx.cancel_timer(CoordinatorTimer::Txn(txn.seq()));
        self.shell.committed(ctx, txn, reads, fast);
    }

    fn on_txn_timer(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, seq: u32) {
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
    type Msg = CalvinMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, CalvinMsg>) {
        self.ping(ctx);
        self.shell.start(ctx);
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, from: NodeId, msg: CalvinMsg) {
        match msg {
            CalvinMsg::Reply { txn, reads, fast } => self.on_reply(ctx, txn, &reads, fast),
            CalvinMsg::PreReadAnswer(answer) => {
                if let Some(a) = self.shell.on_pre_read_answer(ctx, from, answer) {
                    self.begin(ctx, a);
                }
            }

            CalvinMsg::Pong { nonce }
                if nonce == self.ping_round && !self.ping_answered && self.sequencers().contains(&from) =>
            {
                self.ping_answered = true;
                self.sequencer = Some(from);
            }
            _ => {}
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, timer: TimerId) {
        match CoordinatorTimer::from_id(timer) {
            Some(CoordinatorTimer::Shell(t)) => {
                if let Some(a) = self.shell.on_timer(ctx, t) {
                    self.begin(ctx, a);
                }
            }
            Some(CoordinatorTimer::Ping) => self.ping(ctx),
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
