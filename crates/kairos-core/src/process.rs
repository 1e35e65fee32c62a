//! The sans-IO role interface: three inputs in, effects out.

use crate::history::HistoryEvent;
use crate::ids::{NodeId, TimerId};
use crate::time::LocalTime;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use std::time::Duration;

/// The deterministic random generator every role draws from. Hosts seed one per node from
/// the run's printed seed and the node id.
pub type Rng = rand_chacha::ChaCha8Rng;

/// What a protocol puts on the wire. Serde so the TCP host can frame it (postcard) and the
/// simulator can fold it into the trace hash; `Clone` so the simulator can duplicate it.
pub trait Message: Clone + Debug + Serialize + DeserializeOwned + Send + 'static {}
impl<T: Clone + Debug + Serialize + DeserializeOwned + Send + 'static> Message for T {}

/// A protocol role as a sans-IO state machine.
///
/// A role must not read the wall clock, spawn threads, touch sockets, draw from `thread_rng`,
/// or let the iteration order of a `std::collections::HashMap` reach its output: time comes
/// from [`Ctx::now`], randomness from [`Ctx::rng`], and everything it wants done goes out as an
/// [`Effect`]. Handlers must not panic on any message a peer could send: a malformed or
/// unexpected message is ignored (and may be counted with [`Ctx::metric`]).
pub trait Process {
    type Msg: Message;
    /// Called once when the node starts (and again after a crash, on a fresh instance).
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self::Msg>);
    /// A message from `from` arrived.
    fn on_message(&mut self, ctx: &mut Ctx<'_, Self::Msg>, from: NodeId, msg: Self::Msg);
    /// A timer set with [`Ctx::set_timer`] fired.
    fn on_timer(&mut self, ctx: &mut Ctx<'_, Self::Msg>, timer: TimerId);
}

impl<P: Process + ?Sized> Process for Box<P> {
    type Msg = P::Msg;
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self::Msg>) {
        (**self).on_start(ctx)
    }
    fn on_message(&mut self, ctx: &mut Ctx<'_, Self::Msg>, from: NodeId, msg: Self::Msg) {
        (**self).on_message(ctx, from, msg)
    }
    fn on_timer(&mut self, ctx: &mut Ctx<'_, Self::Msg>, timer: TimerId) {
        (**self).on_timer(ctx, timer)
    }
}

/// Something a role asks its host to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect<M> {
    /// Deliver `msg` to `to` (best effort: the network may delay, drop or duplicate it).
    Send { to: NodeId, msg: M },
    /// Fire `on_timer(id)` after `after` of this node's local time. Re-arms an armed id.
    SetTimer { id: TimerId, after: Duration },
    /// Disarm `id` (no-op if it is not armed).
    CancelTimer { id: TimerId },
    /// Append a client-visible event to the run's history; the host stamps index and time.
    History(HistoryEvent),
    /// Add `value` to the run-wide counter `name`.
    Metric { name: &'static str, value: u64 },
}

/// What a handler sees of the world: who it is, its local clock, its random generator, and
/// the outbox its effects go to.
pub struct Ctx<'a, M> {
    me: NodeId,
    now: LocalTime,
    rng: &'a mut Rng,
    effects: &'a mut Vec<Effect<M>>,
}

impl<'a, M> Ctx<'a, M> {
    /// For hosts (and unit tests of a single role): a context for one handler call.
    pub fn new(me: NodeId, now: LocalTime, rng: &'a mut Rng, effects: &'a mut Vec<Effect<M>>) -> Self {
        Ctx { me, now, rng, effects }
    }
    /// This node's id.
    pub fn me(&self) -> NodeId {
        self.me
    }
    /// This node's local clock reading at the start of the handler (may be skewed).
    pub fn now(&self) -> LocalTime {
        self.now
    }
    /// The node's seeded random generator.
    pub fn rng(&mut self) -> &mut Rng {
        self.rng
    }
    pub fn send(&mut self, to: NodeId, msg: M) {
        self.effects.push(Effect::Send { to, msg });
    }
    pub fn set_timer(&mut self, id: TimerId, after: Duration) {
        self.effects.push(Effect::SetTimer { id, after });
    }
    pub fn cancel_timer(&mut self, id: TimerId) {
        self.effects.push(Effect::CancelTimer { id });
    }
    pub fn record(&mut self, event: HistoryEvent) {
        self.effects.push(Effect::History(event));
    }
    pub fn metric(&mut self, name: &'static str, value: u64) {
        self.effects.push(Effect::Metric { name, value });
    }
}

impl<M: Clone> Ctx<'_, M> {
    /// Send the same message to each of `to`.
    pub fn send_all(&mut self, to: impl IntoIterator<Item = NodeId>, msg: &M) {
        for n in to {
            self.effects.push(Effect::Send { to: n, msg: msg.clone() });
        }
    }
}
