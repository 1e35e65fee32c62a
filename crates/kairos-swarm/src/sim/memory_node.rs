//! A memory node in the simulator: a byte array that executes chains verb by verb.
//!
//! Adversarial but seeded: at each step the node picks a random connection (client) with work
//! and executes the next *piece* of its head chain — a whole 8-byte-or-smaller read/write or a
//! CAS, or the next aligned 8-byte piece of a larger read or write — so pieces of different
//! chains interleave and large reads tear. Chains on one connection run in FIFO order. A crashed
//! node (`Fault::Crash`) completes nothing. A chain marked `prefix` (a client crashing mid-chain)
//! applies only that many verbs and gets no reply. A chain marked `pause` (the adversarial
//! scheduler, `kairos_harness::swarm::sim::Adversary`) stalls its connection between two of its verbs for the given
//! time while other connections go on — what a descheduled client thread or a slow NIC does.

use super::SwarmMsg;
use crate::verbs::{MemoryImage, Verb, VerbOutcome, CHAIN_VERBS_MAX};
use kairos_core::{Ctx, LocalTime, NodeId, Process, Timer, TimerId};
use rand::Rng as _;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

struct Running {
    tag: u64,
    verbs: Vec<Verb>,
    prefix: Option<usize>,
    /// The adversary's stall: after this many verbs, the connection waits this many ns.
    pause: Option<(usize, u64)>,
    next: usize,
    /// Bytes of the current large verb already done.
    done_bytes: u64,
    partial: Vec<u8>,
    outcomes: Vec<VerbOutcome>,
}

pub struct MemoryNode {
    pub image: MemoryImage,
    queues: BTreeMap<NodeId, VecDeque<Running>>,
    /// Connections stalled by the adversary, until this local time.
    stalled: BTreeMap<NodeId, LocalTime>,
    next_wake: u64,
    armed: bool,
    /// Longest pause between two pieces (ns); each pause is uniform in `0..=piece_ns_max`.
    pub piece_ns_max: u64,
    pub pieces: u64,
}

/// A memory node's timers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum MemoryNodeTimer {
    /// Serve the next piece of some connection's chain.
    Step,
    /// The n-th adversarial stall of a connection (n ≥ 1) is over.
    StallEnd(u64),
}

impl Timer for MemoryNodeTimer {
    fn id(self) -> TimerId {
        match self {
            MemoryNodeTimer::Step => TimerId(1),
            MemoryNodeTimer::StallEnd(n) => TimerId(1 + n),
        }
    }
    fn from_id(id: TimerId) -> Option<Self> {
        match id.0 {
            0 => None,
            1 => Some(MemoryNodeTimer::Step),
            n => Some(MemoryNodeTimer::StallEnd(n - 1)),
        }
    }
}

impl MemoryNode {
    pub fn new(image: MemoryImage, piece_ns_max: u64) -> Self {
        MemoryNode {
            image,
            queues: BTreeMap::new(),
            stalled: BTreeMap::new(),
            next_wake: 0,
            armed: false,
            piece_ns_max,
            pieces: 0,
        }
    }

    /// Connections with a chain to run now (not stalled).
    fn busy(&self) -> Vec<NodeId> {
        self.queues.iter().filter(|(n, q)| !q.is_empty() && !self.stalled.contains_key(n)).map(|(n, _)| *n).collect()
    }

    fn arm(&mut self, ctx: &mut Ctx<'_, SwarmMsg>) {
        if !self.armed && !self.busy().is_empty() {
            self.armed = true;
            let ns = ctx.rng().random_range(0..=self.piece_ns_max);
            ctx.set_timer(MemoryNodeTimer::Step, Duration::from_nanos(ns));
        }
    }

    /// Executes one piece of `r`'s current verb; returns `Err` if the verb is refused.
    fn piece(&mut self, r: &mut Running) -> Result<(), crate::verbs::VerbError> {
        let verb = &r.verbs[r.next];
        self.image.check(verb)?;
        let finished = match verb {
            Verb::Cas { .. } => {
                let out = self.image.apply(verb)?;
                r.outcomes.push(out);
                true
            }
            Verb::Read { addr, len } => {
                let (start, end) = (addr + r.done_bytes, addr + u64::from(*len));
                let stop = ((start / 8 + 1) * 8).min(end);
                r.partial.extend(self.image.read(start, (stop - start) as usize));
                r.done_bytes += stop - start;
                if start + (stop - start) >= end {
                    r.outcomes.push(VerbOutcome::Read(std::mem::take(&mut r.partial)));
                    true
                } else {
                    false
                }
            }
            Verb::Write { addr, data } => {
                let end = addr + data.len() as u64;
                let start = addr + r.done_bytes;
                let stop = ((start / 8 + 1) * 8).min(end);
                let from = r.done_bytes as usize;
                let to = from + (stop - start) as usize;
                self.image.write(start, &data[from..to]);
                r.done_bytes = to as u64;
                if stop >= end {
                    r.outcomes.push(VerbOutcome::Written);
                    true
                } else {
                    false
                }
            }
        };
        if finished {
            r.next += 1;
            r.done_bytes = 0;
        }
        Ok(())
    }
}

impl Process for MemoryNode {
    type Msg = SwarmMsg;

    fn on_start(&mut self, _ctx: &mut Ctx<'_, SwarmMsg>) {}

    fn on_message(&mut self, ctx: &mut Ctx<'_, SwarmMsg>, from: NodeId, msg: SwarmMsg) {
        let SwarmMsg::Chain { tag, chain, prefix, pause } = msg else { return };
        if chain.verbs.len() > CHAIN_VERBS_MAX {
            let e = crate::verbs::VerbError::ChainTooLong(chain.verbs.len());
            ctx.send(from, SwarmMsg::Reply { tag, reply: Err(e) });
            return;
        }
        let r = Running {
            tag,
            verbs: chain.verbs,
            prefix,
            pause,
            next: 0,
            done_bytes: 0,
            partial: Vec::new(),
            outcomes: Vec::new(),
        };
        self.queues.entry(from).or_default().push_back(r);
        self.arm(ctx);
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, SwarmMsg>, timer: TimerId) {
        match MemoryNodeTimer::from_id(timer) {
            Some(MemoryNodeTimer::Step) => {}
            Some(MemoryNodeTimer::StallEnd(_)) => {
                let now = ctx.now();
                self.stalled.retain(|_, until| *until > now);
                return self.arm(ctx);
            }
            None => return,
        }
        self.armed = false;
        let busy = self.busy();
        if !busy.is_empty() {
            let who = busy[ctx.rng().random_range(0..busy.len())];
            let Some(mut r) = self.queues.get_mut(&who).and_then(|q| q.pop_front()) else { return self.arm(ctx) };
            if let Some((k, ns)) = r.pause {
                if r.next >= k && r.done_bytes == 0 {
                    // The adversary stalls this connection between two verbs of the chain.
                    r.pause = None;
                    self.stalled.insert(who, ctx.now() + Duration::from_nanos(ns));
                    self.next_wake += 1;
                    ctx.set_timer(MemoryNodeTimer::StallEnd(self.next_wake), Duration::from_nanos(ns));
                    self.queues.entry(who).or_default().push_front(r);
                    return self.arm(ctx);
                }
            }
            self.pieces += 1;
            let limit = r.prefix.unwrap_or(usize::MAX).min(r.verbs.len());
            let result = if r.next < limit { self.piece(&mut r) } else { Ok(()) };
            match result {
                Err(e) => ctx.send(who, SwarmMsg::Reply { tag: r.tag, reply: Err(e) }),
                Ok(()) if r.next >= limit => {
                    if r.prefix.is_none() {
                        ctx.send(who, SwarmMsg::Reply { tag: r.tag, reply: Ok(r.outcomes) });
                    }
                }
                Ok(()) => self.queues.entry(who).or_default().push_front(r),
            }
        }
        self.arm(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_ids_decode_to_the_timer_that_set_them() {
        use MemoryNodeTimer::*;
        kairos_core::check_timer_encoding(&[Step, StallEnd(1), StallEnd(2), StallEnd(u64::MAX - 1)]).unwrap();
        assert_eq!(MemoryNodeTimer::from_id(TimerId(0)), None);
    }
}
