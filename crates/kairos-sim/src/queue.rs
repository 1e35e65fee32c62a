//! The event queue: a binary heap of small keys `(time, sequence, slot)` over a slab that holds
//! the payloads, so sifting moves 24 bytes however large a message is. Ties in time are broken
//! by the sequence number (insertion order), which makes the simulation deterministic.

use kairos_core::SimTime;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

pub(crate) struct EventQueue<E> {
    heap: BinaryHeap<Reverse<(SimTime, u64, u32)>>,
    slab: Vec<Option<E>>,
    free: Vec<u32>,
    next_seq: u64,
}

impl<E> EventQueue<E> {
    pub fn new() -> Self {
        EventQueue { heap: BinaryHeap::new(), slab: Vec::new(), free: Vec::new(), next_seq: 0 }
    }

    pub fn push(&mut self, at: SimTime, event: E) {
        let slot = match self.free.pop() {
            Some(s) => {
                self.slab[s as usize] = Some(event);
                s
            }
            None => {
                self.slab.push(Some(event));
                u32::try_from(self.slab.len() - 1).expect("fewer than 2^32 pending events")
            }
        };
        self.heap.push(Reverse((at, self.next_seq, slot)));
        self.next_seq += 1;
    }

    pub fn peek_time(&self) -> Option<SimTime> {
        self.heap.peek().map(|Reverse((t, _, _))| *t)
    }

    pub fn pop(&mut self) -> Option<(SimTime, E)> {
        let Reverse((at, _, slot)) = self.heap.pop()?;
        let event = self.slab[slot as usize].take().expect("a queued slot holds its event");
        self.free.push(slot);
        Some((at, event))
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_by_time_then_insertion_order() {
        let mut q = EventQueue::new();
        q.push(SimTime(5), "b");
        q.push(SimTime(1), "a");
        q.push(SimTime(5), "c");
        q.push(SimTime(3), "x");
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).map(|(_, e)| e).collect();
        assert_eq!(order, ["a", "x", "b", "c"]);
        assert_eq!(q.len(), 0);
    }
}
