//! Verbs applied to memory shared between threads (and processes): the executor both real
//! backends use.
//!
//! A node is a slice of [`AtomicU64`] words. Every byte moves inside an 8-byte atomic access,
//! so there is never a plain copy racing another thread (undefined behaviour in Rust), yet a
//! read or write of more than one word is **not** atomic: it is a sequence of word accesses and
//! a concurrent reader may see part of it (a torn read, the thing In-n-Out's hash catches).
//!
//! Ordering: data words move with `Relaxed` accesses. A write verb starts with a `Release`
//! fence and a read verb ends with an `Acquire` fence, and CAS is `SeqCst`, so the verbs of a
//! chain are observed by other clients in chain order (write the data, then CAS the metadata:
//! whoever reads the new metadata and then the data sees the data).
//!
//! The checks (bounds, alignment, sizes) are exactly those of [`MemoryImage`]
//! (`tests/backend_verbs.rs` compares both on random verbs).
//!
//! [`MemoryImage`]: kairos_swarm::verbs::MemoryImage

use std::sync::atomic::{fence, AtomicU64, Ordering};

use kairos_swarm::verbs::{Addr, Verb, VerbError, VerbOutcome};

/// A node's bytes as shared 8-byte words, little-endian within a word.
#[derive(Clone, Copy, Debug)]
pub struct AtomicWords<'a> {
    words: &'a [AtomicU64],
}

impl<'a> AtomicWords<'a> {
    pub fn new(words: &'a [AtomicU64]) -> Self {
        AtomicWords { words }
    }

    pub fn len_bytes(&self) -> u64 {
        self.words.len() as u64 * 8
    }

    /// Checks that `len` bytes at `addr` are inside the node and not too many.
    pub fn check_range(&self, addr: Addr, len: u64) -> Result<(), VerbError> {
        kairos_swarm::verbs::check_range(self.len_bytes(), addr, len)
    }

    /// Checks a verb without applying it.
    pub fn check(&self, verb: &Verb) -> Result<(), VerbError> {
        kairos_swarm::verbs::check_verb(self.len_bytes(), verb)
    }

    /// Applies one verb (atomically only if it is a CAS or an aligned 8-byte access).
    pub fn apply(&self, verb: &Verb) -> Result<VerbOutcome, VerbError> {
        self.check(verb)?;
        Ok(match verb {
            Verb::Read { addr, len } => VerbOutcome::Read(self.read(*addr, *len as usize)),
            Verb::Write { addr, data } => {
                self.write(*addr, data);
                VerbOutcome::Written
            }
            Verb::Cas { addr, expected, new } => {
                let w = &self.words[(*addr / 8) as usize];
                let previous = match w.compare_exchange(*expected, *new, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(p) | Err(p) => p,
                };
                VerbOutcome::Cas { previous }
            }
        })
    }

    /// The bytes at `addr..addr+len`, one relaxed word load at a time (caller checked the range).
    fn read(&self, addr: Addr, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        let mut a = addr as usize;
        while out.len() < len {
            let bytes = self.words[a / 8].load(Ordering::Relaxed).to_le_bytes();
            let take = (8 - a % 8).min(len - out.len());
            out.extend_from_slice(&bytes[a % 8..a % 8 + take]);
            a += take;
        }
        fence(Ordering::Acquire);
        out
    }

    /// Writes `data` at `addr` (caller checked the range). Whole words are stored; a partly
    /// covered word is updated with a CAS loop so that concurrent writes to its other bytes
    /// are never lost.
    fn write(&self, addr: Addr, data: &[u8]) {
        fence(Ordering::Release);
        let mut a = addr as usize;
        let mut i = 0;
        while i < data.len() {
            let w = &self.words[a / 8];
            let take = (8 - a % 8).min(data.len() - i);
            let chunk = &data[i..i + take];
            if take == 8 {
                let mut bytes = [0u8; 8];
                bytes.copy_from_slice(chunk);
                w.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
            } else {
                let offset = a % 8;
                // The closure always returns Some, so fetch_update cannot fail.
                let _ = w.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                    let mut bytes = old.to_le_bytes();
                    bytes[offset..offset + take].copy_from_slice(chunk);
                    Some(u64::from_le_bytes(bytes))
                });
            }
            a += take;
            i += take;
        }
    }
}

/// Zeroed words owned by one process (the TCP memory server's node), allocated with
/// `alloc_zeroed` so that the operating system hands out zero pages lazily (a large node costs
/// memory only where it is written). `None` if the allocation fails.
pub fn zeroed_words(len_bytes: u64) -> Option<Box<[AtomicU64]>> {
    let n = usize::try_from(len_bytes.div_ceil(8)).ok()?;
    if n == 0 {
        return Some(Box::new([]));
    }
    let layout = std::alloc::Layout::array::<AtomicU64>(n).ok()?;
    // SAFETY: `layout` has a non-zero size. A zeroed AtomicU64 is a valid AtomicU64 (it has the
    // in-memory representation of u64). The pointer comes from the global allocator with
    // exactly the layout of `[AtomicU64; n]`, as `Box<[AtomicU64]>` will free it.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout) as *mut AtomicU64;
        if ptr.is_null() {
            return None;
        }
        Some(Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unaligned_write_keeps_neighbouring_bytes() {
        let words = zeroed_words(24).unwrap();
        let m = AtomicWords::new(&words);
        m.apply(&Verb::Write { addr: 0, data: vec![0xaa; 24] }).unwrap();
        m.apply(&Verb::Write { addr: 5, data: vec![1, 2, 3, 4, 5, 6] }).unwrap();
        let got = m.apply(&Verb::Read { addr: 0, len: 24 }).unwrap();
        let mut want = vec![0xaa; 24];
        want[5..11].copy_from_slice(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(got, VerbOutcome::Read(want));
    }
}
