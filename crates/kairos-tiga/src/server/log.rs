//! A shard's log as one replica holds it: absolute positions from 0, with the entries below
//! `base` dropped once a checkpoint covers them (log truncation).
//!
//! Beside each entry the log keeps its piece's encoding when the journal made one
//! ([`super::journal_codec`]), so that a journal snapshot copies those bytes instead of
//! encoding every piece again.

use super::journal_codec::PieceBytes;
use crate::msg::LogEntry;
use std::collections::VecDeque;

#[derive(Clone, Debug, Default)]
pub struct Log {
    /// The position of the first entry held.
    base: u64,
    entries: VecDeque<(LogEntry, Option<PieceBytes>)>,
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
        self.entries.get(usize::try_from(pos.checked_sub(self.base)?).ok()?).map(|(e, _)| e)
    }
    /// Copies of positions `from .. to` (clamped to what is held).
    pub fn range(&self, from: u64, to: u64) -> Vec<LogEntry> {
        self.range_with_bytes(from, to).map(|(e, _)| e.clone()).collect()
    }
    /// Positions `from .. to` (clamped to what is held), each with its piece's encoding if
    /// the log keeps it.
    pub fn range_with_bytes(
        &self,
        from: u64,
        to: u64,
    ) -> impl ExactSizeIterator<Item = (&LogEntry, Option<&[u8]>)> + Clone {
        let from = from.max(self.base).min(self.len());
        let to = to.min(self.len()).max(from);
        self.entries.range((from - self.base) as usize..(to - self.base) as usize).map(|(e, b)| (e, b.as_deref()))
    }
    pub fn push(&mut self, e: LogEntry) {
        self.entries.push_back((e, None));
    }
    /// Appends `e`, keeping `piece_bytes`, the encoding of its piece.
    pub fn push_encoded(&mut self, e: LogEntry, piece_bytes: Option<PieceBytes>) {
        self.entries.push_back((e, piece_bytes));
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
        self.entries.iter().map(|(e, _)| e)
    }
    /// Takes the held entries out, leaving an empty log at the same base.
    pub fn take(&mut self) -> Vec<LogEntry> {
        std::mem::take(&mut self.entries).into_iter().map(|(e, _)| e).collect()
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
