//! The memory-node interface: verbs, chains of verbs, and their outcomes.
//!
//! A memory node is a byte array of `len` bytes. A client submits a [`Chain`] of verbs to one
//! node over one ordered connection; the node applies them **in order but not atomically as a
//! group** (other clients' verbs may land between two verbs of a chain). Only aligned 8-byte
//! reads and writes and [`Verb::Cas`] are atomic; a larger read or write may tear (a concurrent
//! reader may see part of it). A crashed node completes no verb; a crashed client may leave any
//! prefix of its chain applied.
//!
//! [`MemoryImage`] applies verbs to a byte array with exactly these checks (bounds, alignment,
//! sizes); backends use it so that every backend refuses the same bad verbs the same way.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Index of a memory node (0-based, dense).
pub type MemNodeId = u32;
/// A byte offset in a memory node.
pub type Addr = u64;

/// Largest payload a single read or write may move (bounds every frame and buffer).
pub const VERB_BYTES_MAX: u32 = 1 << 20;
/// Most verbs in one chain.
pub const CHAIN_VERBS_MAX: usize = 64;

/// One one-sided operation on a memory node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verb {
    /// Read `len` bytes at `addr`. Atomic only when `len == 8` and `addr` is 8-aligned.
    Read { addr: Addr, len: u32 },
    /// Write `data` at `addr`. Atomic only when it is 8 bytes at an 8-aligned address.
    Write { addr: Addr, data: Vec<u8> },
    /// Atomically: if the 8-byte little-endian word at `addr` (8-aligned) equals `expected`,
    /// replace it with `new`. Always returns the word found.
    Cas { addr: Addr, expected: u64, new: u64 },
}

/// What one verb returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VerbOutcome {
    Read(Vec<u8>),
    Written,
    /// The word found before the CAS; the CAS succeeded iff it equals `expected`.
    Cas {
        previous: u64,
    },
}

/// Ordered verbs for one node, submitted together on one connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    pub node: MemNodeId,
    pub verbs: Vec<Verb>,
}

/// A verb the node refuses (the verbs before it in the chain have been applied; the chain
/// stops there).
#[derive(Clone, Debug, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum VerbError {
    #[error("verb touches bytes {addr}..{addr}+{len}, beyond the node's {node_len} bytes")]
    OutOfBounds { addr: Addr, len: u64, node_len: u64 },
    #[error("CAS and 8-byte atomics need an 8-aligned address, not {0}")]
    Misaligned(Addr),
    #[error("a verb may move at most {VERB_BYTES_MAX} bytes, not {0}")]
    TooLarge(u64),
    #[error("a chain may hold at most {CHAIN_VERBS_MAX} verbs, not {0}")]
    ChainTooLong(usize),
    #[error("memory node {0} has crashed")]
    NodeCrashed(MemNodeId),
}

/// Checks that `len` bytes at `addr` fit a node of `node_len` bytes and are not too many.
pub fn check_range(node_len: u64, addr: Addr, len: u64) -> Result<(), VerbError> {
    if len > u64::from(VERB_BYTES_MAX) {
        return Err(VerbError::TooLarge(len));
    }
    match addr.checked_add(len) {
        Some(end) if end <= node_len => Ok(()),
        _ => Err(VerbError::OutOfBounds { addr, len, node_len }),
    }
}

/// Checks `verb` against a node of `node_len` bytes (every backend refuses the same verbs).
pub fn check_verb(node_len: u64, verb: &Verb) -> Result<(), VerbError> {
    match verb {
        Verb::Read { addr, len } => check_range(node_len, *addr, u64::from(*len)),
        Verb::Write { addr, data } => check_range(node_len, *addr, data.len() as u64),
        Verb::Cas { addr, .. } => {
            if addr % 8 != 0 {
                return Err(VerbError::Misaligned(*addr));
            }
            check_range(node_len, *addr, 8)
        }
    }
}

/// Page size for [`MemoryImage::written_bytes`], as the OS allocates zeroed memory.
pub const PAGE_BYTES: u64 = 4096;

/// A node's bytes as 8-byte little-endian words, with the verb semantics above (applied
/// whole: the single-threaded backends decide themselves where tearing may happen).
#[derive(Clone, Debug)]
pub struct MemoryImage {
    words: Vec<u64>,
    /// One bit per [`PAGE_BYTES`] page ever written: the memory the node really uses, since
    /// zeroed memory is allocated lazily, page by page, on first write.
    pages_written: Vec<u64>,
}

impl MemoryImage {
    /// A zeroed node of `len` bytes (rounded up to whole words).
    pub fn new(len: u64) -> Self {
        let pages = len.div_ceil(PAGE_BYTES);
        MemoryImage { words: vec![0; len.div_ceil(8) as usize], pages_written: vec![0; pages.div_ceil(64) as usize] }
    }

    /// Bytes of the pages ever written (by a verb or by [`MemoryImage::write`]).
    pub fn written_bytes(&self) -> u64 {
        self.pages_written.iter().map(|w| u64::from(w.count_ones())).sum::<u64>() * PAGE_BYTES
    }

    /// Bytes of the pages ever written that start in `start..end` (regions of a layout: a
    /// page two regions share counts for the one it starts in).
    pub fn written_bytes_in(&self, start: Addr, end: Addr) -> u64 {
        let pages = start.div_ceil(PAGE_BYTES)..end.div_ceil(PAGE_BYTES);
        let written = |p: u64| self.pages_written.get((p / 64) as usize).is_some_and(|w| w & (1 << (p % 64)) != 0);
        pages.filter(|p| written(*p)).count() as u64 * PAGE_BYTES
    }

    /// Whether the `len` bytes at `addr` (8-aligned, inside the node) are all zero.
    pub fn is_zero(&self, addr: Addr, len: u64) -> bool {
        let (first, last) = ((addr / 8) as usize, (addr + len).div_ceil(8) as usize);
        self.words.get(first..last.min(self.words.len())).is_none_or(|w| w.iter().all(|x| *x == 0))
    }

    fn mark_written(&mut self, addr: Addr, len: u64) {
        if len == 0 {
            return;
        }
        for page in addr / PAGE_BYTES..=(addr + len - 1) / PAGE_BYTES {
            if let Some(w) = self.pages_written.get_mut((page / 64) as usize) {
                *w |= 1 << (page % 64);
            }
        }
    }

    pub fn len_bytes(&self) -> u64 {
        self.words.len() as u64 * 8
    }

    /// Checks that `len` bytes at `addr` are inside the node and not too many.
    pub fn check_range(&self, addr: Addr, len: u64) -> Result<(), VerbError> {
        check_range(self.len_bytes(), addr, len)
    }

    /// Checks a verb without applying it.
    pub fn check(&self, verb: &Verb) -> Result<(), VerbError> {
        check_verb(self.len_bytes(), verb)
    }

    /// Applies one verb whole.
    pub fn apply(&mut self, verb: &Verb) -> Result<VerbOutcome, VerbError> {
        self.check(verb)?;
        Ok(match verb {
            Verb::Read { addr, len } => VerbOutcome::Read(self.read(*addr, *len as usize)),
            Verb::Write { addr, data } => {
                self.write(*addr, data);
                VerbOutcome::Written
            }
            Verb::Cas { addr, expected, new } => {
                let w = &mut self.words[(*addr / 8) as usize];
                let previous = *w;
                if previous == *expected {
                    *w = *new;
                    self.mark_written(*addr, 8);
                }
                VerbOutcome::Cas { previous }
            }
        })
    }

    /// The bytes at `addr..addr+len` (caller has checked the range).
    pub fn read(&self, addr: Addr, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        let mut a = addr as usize;
        while out.len() < len {
            let bytes = self.words[a / 8].to_le_bytes();
            let take = (8 - a % 8).min(len - out.len());
            out.extend_from_slice(&bytes[a % 8..a % 8 + take]);
            a += take;
        }
        out
    }

    /// Writes `data` at `addr` (caller has checked the range).
    pub fn write(&mut self, addr: Addr, data: &[u8]) {
        self.mark_written(addr, data.len() as u64);
        let mut a = addr as usize;
        let mut i = 0;
        while i < data.len() {
            let w = &mut self.words[a / 8];
            let mut bytes = w.to_le_bytes();
            let take = (8 - a % 8).min(data.len() - i);
            bytes[a % 8..a % 8 + take].copy_from_slice(&data[i..i + take]);
            *w = u64::from_le_bytes(bytes);
            a += take;
            i += take;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_apply_with_their_checks() {
        let mut m = MemoryImage::new(64);
        assert_eq!(m.apply(&Verb::Write { addr: 3, data: vec![1, 2, 3, 4, 5, 6, 7, 8, 9] }), Ok(VerbOutcome::Written));
        assert_eq!(m.apply(&Verb::Read { addr: 3, len: 9 }), Ok(VerbOutcome::Read(vec![1, 2, 3, 4, 5, 6, 7, 8, 9])));
        assert_eq!(m.apply(&Verb::Cas { addr: 16, expected: 0, new: 7 }), Ok(VerbOutcome::Cas { previous: 0 }));
        assert_eq!(m.apply(&Verb::Cas { addr: 16, expected: 0, new: 9 }), Ok(VerbOutcome::Cas { previous: 7 }));
        assert_eq!(m.apply(&Verb::Read { addr: 16, len: 8 }), Ok(VerbOutcome::Read(7u64.to_le_bytes().to_vec())));
        assert_eq!(m.apply(&Verb::Cas { addr: 4, expected: 0, new: 1 }), Err(VerbError::Misaligned(4)));
        assert!(matches!(m.apply(&Verb::Read { addr: 60, len: 8 }), Err(VerbError::OutOfBounds { .. })));
        assert!(matches!(m.apply(&Verb::Read { addr: u64::MAX, len: 8 }), Err(VerbError::OutOfBounds { .. })));
        assert!(matches!(m.apply(&Verb::Read { addr: 0, len: VERB_BYTES_MAX + 1 }), Err(VerbError::TooLarge(_))));
    }

    #[test]
    fn written_pages_count_writes_and_successful_cas_only() {
        let mut m = MemoryImage::new(5 * PAGE_BYTES);
        assert_eq!(m.written_bytes(), 0);
        m.apply(&Verb::Read { addr: 0, len: 64 }).unwrap();
        m.apply(&Verb::Cas { addr: PAGE_BYTES, expected: 1, new: 2 }).unwrap();
        assert_eq!(m.written_bytes(), 0, "reads and failed CAS touch nothing");
        m.apply(&Verb::Write { addr: 2 * PAGE_BYTES - 4, data: vec![1; 8] }).unwrap();
        assert_eq!(m.written_bytes(), 2 * PAGE_BYTES, "a write across a page boundary touches both");
        m.apply(&Verb::Cas { addr: 4 * PAGE_BYTES, expected: 0, new: 2 }).unwrap();
        assert_eq!(m.written_bytes(), 3 * PAGE_BYTES);
    }
}
