//! The sans-IO role interface: three inputs in, effects out.

use crate::history::HistoryEvent;
use crate::ids::{NodeId, Timer, TimerId};
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
    /// The role's cheap local invariants (O(log n) at most: this runs after every handler in
    /// the simulator's tests and campaigns). `Err` names the broken property and the values
    /// that break it, so a bug stops the run at the event that caused it instead of showing up
    /// thousands of events later as a history anomaly.
    fn invariants(&self) -> Result<(), String> {
        Ok(())
    }
    /// A fresh instance of a node that has durable state (see [`Ctx::persist`]) is given it
    /// once, before `on_start`: the last snapshot, every record appended since, in order, and
    /// its pages.
    fn on_recover(&mut self, stored: &Stored) {
        let _ = stored;
    }
    /// A fresh instance of a node that ran before but has nothing durable — its disk was lost
    /// or wiped — is told so once, before `on_start`, instead of starting as if for the first
    /// time. A role whose promises rest on its durable state must not make them again from
    /// nothing (Paxos's amnesia: a vote given, forgotten, given again). The simulator knows a
    /// restart from a first start; a real host cannot tell a wiped data directory from a new
    /// one, so it never calls this.
    fn on_amnesia(&mut self) {}
}

/// A request to make state durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Persist {
    /// Append a record to the node's durable log.
    Append(Vec<u8>),
    /// Replace the snapshot and the records by one snapshot (compaction: records before it are
    /// dropped). Pages are not touched.
    Snapshot(Vec<u8>),
    /// Store `bytes` as page number `page`, replacing any page of that number. Pages outlive
    /// snapshots: a role keeps large, slowly changing state in them (a checkpoint of its data,
    /// written a few pages at a time), so that its snapshots stay small.
    Page { page: u64, bytes: Vec<u8> },
    /// Drop the pages numbered `from..to`.
    DropPages { from: u64, to: u64 },
}

/// What a node has made durable: its last snapshot, the records appended since, and its pages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    pub snapshot: Option<Vec<u8>>,
    pub records: Vec<Vec<u8>>,
    pub pages: std::collections::BTreeMap<u64, Vec<u8>>,
}

impl Stored {
    pub fn is_empty(&self) -> bool {
        self.snapshot.is_none() && self.records.is_empty() && self.pages.is_empty()
    }

    /// Applies one request, as a host does once it is durable.
    pub fn apply(&mut self, p: Persist) {
        match p {
            Persist::Append(r) => self.records.push(r),
            Persist::Snapshot(s) => {
                self.snapshot = Some(s);
                self.records.clear();
            }
            Persist::Page { page, bytes } => {
                self.pages.insert(page, bytes);
            }
            Persist::DropPages { from, to } => {
                if from < to {
                    let dropped: Vec<u64> = self.pages.range(from..to).map(|(p, _)| *p).collect();
                    for p in dropped {
                        self.pages.remove(&p);
                    }
                }
            }
        }
    }
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
    fn invariants(&self) -> Result<(), String> {
        (**self).invariants()
    }
    fn on_recover(&mut self, stored: &Stored) {
        (**self).on_recover(stored)
    }
    fn on_amnesia(&mut self) {
        (**self).on_amnesia()
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
    /// Make state durable. Write-ahead: a host makes every `Persist` of a handler durable
    /// before it carries out any other effect of that handler, so a message or history event
    /// never leaves before the state it reports survives a crash. A crashed node's next
    /// instance gets everything made durable in [`Process::on_recover`].
    Persist(Persist),
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
    pub fn set_timer(&mut self, timer: impl Timer, after: Duration) {
        self.effects.push(Effect::SetTimer { id: timer.id(), after });
    }
    pub fn cancel_timer(&mut self, timer: impl Timer) {
        self.effects.push(Effect::CancelTimer { id: timer.id() });
    }
    pub fn record(&mut self, event: HistoryEvent) {
        self.effects.push(Effect::History(event));
    }
    pub fn metric(&mut self, name: &'static str, value: u64) {
        self.effects.push(Effect::Metric { name, value });
    }
    /// Appends `record` to this node's durable log (see [`Effect::Persist`]).
    pub fn persist(&mut self, record: Vec<u8>) {
        self.effects.push(Effect::Persist(Persist::Append(record)));
    }
    /// Replaces this node's snapshot and records by `snapshot` (see [`Effect::Persist`]).
    pub fn persist_snapshot(&mut self, snapshot: Vec<u8>) {
        self.effects.push(Effect::Persist(Persist::Snapshot(snapshot)));
    }
    /// Stores page `page` of this node's durable state (see [`Persist::Page`]).
    pub fn persist_page(&mut self, page: u64, bytes: Vec<u8>) {
        self.effects.push(Effect::Persist(Persist::Page { page, bytes }));
    }
    /// Drops pages `from..to` of this node's durable state.
    pub fn drop_pages(&mut self, from: u64, to: u64) {
        self.effects.push(Effect::Persist(Persist::DropPages { from, to }));
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
