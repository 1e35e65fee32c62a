//! A host for one role in a unit test: feed it messages and timers, read back its effects.
//!
//! The simulator runs whole deployments; a unit test of one role wants less: build the role,
//! hand it exactly the inputs a schedule calls for (a message from a chosen peer, a timer,
//! time passing, a crash and a restart from what it made durable) and inspect each handler's
//! effects. [`RoleHarness`] does that the way a host would: it keeps the armed timers and
//! fires them in deadline order when time advances, applies [`Persist`](crate::Persist) requests to a
//! [`Stored`] (so a recovery test sees exactly what was made durable), and checks the role's
//! [`Process::invariants`] after every handler, panicking with the handler that broke them.
//!
//! ```
//! use kairos_core::harness::{sent, RoleHarness};
//! use kairos_core::{Ctx, NodeId, Process, TimerId};
//! use std::time::Duration;
//!
//! /// Echoes every message back, and pings node 1 every second.
//! struct Echo;
//! impl Process for Echo {
//!     type Msg = u32;
//!     fn on_start(&mut self, ctx: &mut Ctx<'_, u32>) {
//!         ctx.set_timer(TimerId(1), Duration::from_secs(1));
//!     }
//!     fn on_message(&mut self, ctx: &mut Ctx<'_, u32>, from: NodeId, msg: u32) {
//!         ctx.send(from, msg);
//!     }
//!     fn on_timer(&mut self, ctx: &mut Ctx<'_, u32>, _: TimerId) {
//!         ctx.send(NodeId(1), 0);
//!         ctx.set_timer(TimerId(1), Duration::from_secs(1));
//!     }
//! }
//!
//! let mut h = RoleHarness::new(NodeId(0), Echo, 7);
//! h.start();
//! assert_eq!(sent(&h.deliver(NodeId(2), 5)), vec![(NodeId(2), &5)]);
//! // Two and a half seconds later the timer has fired twice.
//! assert_eq!(h.advance(Duration::from_millis(2_500)).len(), 4);
//! ```

use crate::ids::{NodeId, Timer, TimerId};
use crate::process::{Ctx, Effect, Process, Rng, Stored};
use crate::time::LocalTime;
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::time::Duration;

/// One role under test, with its clock, random generator, armed timers and durable state.
pub struct RoleHarness<P: Process> {
    pub role: P,
    me: NodeId,
    now: LocalTime,
    rng: Rng,
    /// Armed timers: id → local deadline.
    timers: BTreeMap<TimerId, LocalTime>,
    stored: Stored,
}

impl<P: Process> RoleHarness<P> {
    /// Node `me` running `role`, its clock at 1,000 s (so no deadline underflows), its
    /// generator seeded with `seed`.
    pub fn new(me: NodeId, role: P, seed: u64) -> Self {
        RoleHarness {
            role,
            me,
            now: LocalTime::from_secs(1_000),
            rng: Rng::seed_from_u64(seed),
            timers: BTreeMap::new(),
            stored: Stored::default(),
        }
    }

    /// The role, to inspect its state between handlers.
    pub fn role(&self) -> &P {
        &self.role
    }

    /// The node the role runs at.
    pub fn me(&self) -> NodeId {
        self.me
    }

    /// The role's local clock.
    pub fn now(&self) -> LocalTime {
        self.now
    }

    /// When timer `id` fires, if it is armed.
    pub fn armed(&self, timer: impl Timer) -> Option<LocalTime> {
        self.timers.get(&timer.id()).copied()
    }

    /// Everything the role has made durable.
    pub fn stored(&self) -> &Stored {
        &self.stored
    }

    /// Runs any handler (or any method taking a context) as the host would.
    pub fn call<R>(&mut self, f: impl FnOnce(&mut P, &mut Ctx<'_, P::Msg>) -> R) -> (R, Vec<Effect<P::Msg>>) {
        let mut effects = Vec::new();
        let r = {
            let mut ctx = Ctx::new(self.me, self.now, &mut self.rng, &mut effects);
            f(&mut self.role, &mut ctx)
        };
        for e in &effects {
            match e {
                Effect::SetTimer { id, after } => {
                    self.timers.insert(*id, self.now.saturating_add(*after));
                }
                Effect::CancelTimer { id } => {
                    self.timers.remove(id);
                }
                Effect::Persist(p) => self.stored.apply(p.clone()),
                _ => {}
            }
        }
        if let Err(broken) = self.role.invariants() {
            panic!("node {:?} at {:?}: invariant broken: {broken}", self.me, self.now);
        }
        (r, effects)
    }

    pub fn start(&mut self) -> Vec<Effect<P::Msg>> {
        self.call(|r, ctx| r.on_start(ctx)).1
    }

    pub fn deliver(&mut self, from: NodeId, msg: P::Msg) -> Vec<Effect<P::Msg>> {
        self.call(|r, ctx| r.on_message(ctx, from, msg)).1
    }

    /// Fires timer `id` now, armed or not (a host may deliver a stale timer).
    pub fn fire(&mut self, timer: impl Timer) -> Vec<Effect<P::Msg>> {
        let id = timer.id();
        self.timers.remove(&id);
        self.call(|r, ctx| r.on_timer(ctx, id)).1
    }

    /// Lets `d` of local time pass, firing every timer that falls due on the way in deadline
    /// order (ties by id); returns all their effects.
    pub fn advance(&mut self, d: Duration) -> Vec<Effect<P::Msg>> {
        let until = self.now.saturating_add(d);
        let mut all = Vec::new();
        loop {
            let next = self.timers.iter().filter(|(_, at)| **at <= until).min_by_key(|(id, at)| (**at, **id));
            let Some((&id, &at)) = next else { break };
            self.timers.remove(&id);
            self.now = self.now.max(at);
            all.extend(self.call(|r, ctx| r.on_timer(ctx, id)).1);
        }
        self.now = until;
        all
    }

    /// A crash and restart: the role's memory and timers are lost; `fresh` is the new
    /// instance, given what was made durable ([`Process::on_recover`]) and then started.
    pub fn restart(&mut self, fresh: P) -> Vec<Effect<P::Msg>> {
        self.role = fresh;
        self.timers.clear();
        if self.stored.is_empty() {
            self.role.on_amnesia();
        } else {
            self.role.on_recover(&self.stored);
        }
        self.start()
    }
}

/// The messages among `effects`, with their destinations.
pub fn sent<M>(effects: &[Effect<M>]) -> Vec<(NodeId, &M)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send { to, msg } => Some((*to, msg)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts messages, persists the count, and claims an invariant that the count stays
    /// below 3.
    #[derive(Default)]
    struct Counter {
        count: u8,
    }
    impl Process for Counter {
        type Msg = u8;
        fn on_start(&mut self, ctx: &mut Ctx<'_, u8>) {
            ctx.set_timer(TimerId(2), Duration::from_secs(2));
            ctx.set_timer(TimerId(1), Duration::from_secs(1));
        }
        fn on_message(&mut self, ctx: &mut Ctx<'_, u8>, _: NodeId, _: u8) {
            self.count += 1;
            ctx.persist(vec![self.count]);
        }
        fn on_timer(&mut self, ctx: &mut Ctx<'_, u8>, id: TimerId) {
            ctx.send(NodeId(9), id.0 as u8);
        }
        fn invariants(&self) -> Result<(), String> {
            if self.count < 3 {
                Ok(())
            } else {
                Err(format!("count {}", self.count))
            }
        }
        fn on_recover(&mut self, stored: &Stored) {
            self.count = stored.records.last().map_or(0, |r| r[0]);
        }
    }

    #[test]
    fn timers_fire_in_deadline_order_and_durable_state_survives_a_restart() {
        let mut h = RoleHarness::new(NodeId(0), Counter::default(), 1);
        h.start();
        let fired = h.advance(Duration::from_secs(5));
        assert_eq!(sent(&fired), vec![(NodeId(9), &1), (NodeId(9), &2)]);
        assert_eq!(h.armed(TimerId(1)), None);
        h.deliver(NodeId(3), 0);
        h.deliver(NodeId(3), 0);
        h.restart(Counter::default());
        assert_eq!(h.role.count, 2);
        assert_eq!(h.armed(TimerId(1)), Some(h.now() + Duration::from_secs(1)));
    }

    #[test]
    #[should_panic(expected = "invariant broken: count 3")]
    fn a_broken_invariant_stops_the_test_at_the_handler() {
        let mut h = RoleHarness::new(NodeId(0), Counter::default(), 1);
        for _ in 0..3 {
            h.deliver(NodeId(3), 0);
        }
    }
}
