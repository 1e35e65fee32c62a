//! A shard's log as one replica holds it: absolute positions from 0, with the entries below
//! `base` dropped once a checkpoint covers them (log truncation).

use crate::msg::LogEntry;
use std::collections::VecDeque;

#[derive(Clone, Debug, Default)]
pub struct Log {
    /// The position of the first entry held.
    base: u64,
    entries: VecDeque<LogEntry>,
}

impl Log {
    /// A log whose first `base` positions are covered by a checkpoint.
    pub fn starting_at(base: u64) -> Self {
        Log { base, entries: VecDeque::new() }
    }
    /// One past the last position.
    pub fn len(&self) -> u64 {
        self.base + self.entries.len() as u64
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The first position still held.
    pub fn base(&self) -> u64 {
        self.base
    }
    /// Entries held (from `base` on).
    pub fn held(&self) -> usize {
        self.entries.len()
    }
    pub fn get(&self, pos: u64) -> Option<&LogEntry> {
        self.entries.get(usize::try_from(pos.checked_sub(self.base)?).ok()?)
    }
    /// Copies of positions `from .. to` (clamped to what is held).
    pub fn range(&self, from: u64, to: u64) -> Vec<LogEntry> {
        let from = from.max(self.base);
        let to = to.min(self.len());
        (from..to).filter_map(|p| self.get(p).cloned()).collect()
    }
    pub fn push(&mut self, e: LogEntry) {
        self.entries.push_back(e);
    }
    /// Drops positions `pos ..` (`pos` at or above `base`).
    pub fn truncate(&mut self, pos: u64) {
        self.entries.truncate(pos.saturating_sub(self.base) as usize);
    }
    /// Drops the positions below `pos` (a checkpoint covers them).
    pub fn compact(&mut self, pos: u64) {
        let drop = pos.min(self.len()).saturating_sub(self.base) as usize;
        self.entries.drain(..drop);
        self.base += drop as u64;
    }
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &LogEntry> {
        self.entries.iter()
    }
    /// Takes the held entries out, leaving an empty log at the same base.
    pub fn take(&mut self) -> Vec<LogEntry> {
        let base = self.base;
        let entries = std::mem::take(&mut self.entries).into();
        self.base = base;
        entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{Piece, Ts, TxnId};
    use kairos_core::NodeId;

    fn e(i: u64) -> LogEntry {
        LogEntry {
            ts: Ts::from_nanos(i),
            piece: Piece::new(TxnId::new(NodeId(1), i as u32), 0, vec![0], Vec::new()).into(),
        }
    }

    #[test]
    fn positions_stay_absolute_across_compaction_and_truncation() {
        let mut log = Log::default();
        for i in 0..10 {
            log.push(e(i));
        }
        log.compact(4);
        assert_eq!((log.base(), log.len(), log.held()), (4, 10, 6));
        assert!(log.get(3).is_none());
        assert_eq!(log.get(4).unwrap().ts.as_nanos(), 4);
        assert_eq!(log.range(0, 6).iter().map(|x| x.ts.as_nanos()).collect::<Vec<_>>(), vec![4, 5]);
        log.truncate(7);
        assert_eq!(log.len(), 7);
        log.compact(100);
        assert_eq!((log.base(), log.len(), log.held()), (7, 7, 0));
        let mut fresh = Log::starting_at(20);
        fresh.push(e(20));
        assert_eq!(fresh.get(20).unwrap().ts.as_nanos(), 20);
    }
}
