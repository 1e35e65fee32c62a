//! The replica-location index: which slot holds a key.
//!
//! The shared part lives in memory nodes (the directory of [`crate::layout`]): a key's
//! fingerprint picks a window of [`DIR_PROBE`] buckets, and its `fingerprint:40 | slot:24`
//! entry sits in any free entry of that window. Entries are shared by all writers, so the
//! directory is sized for the keys (two entries per key), not for every writer: a writer
//! **claims** an entry with `CAS(0 → entry)` on each node, where the window it read last shows
//! it free. A claim lost to a concurrent insert on some node is retried there with another free
//! entry until a majority of nodes holds the entry, so every lookup (which reads a majority)
//! finds it. Each writer allocates slots from its own residue class (`slot % writers ==
//! writer`). Clients cache `key → slot` ([`IndexCache`], the paper's ~24-byte-per-key index),
//! so gets and updates of known keys go straight to the replicas.
//!
//! An insert of a key the client does not know looks it up first (an existing key is updated in
//! place); a key nobody has is created with its directory entry and first value in one round
//! trip (two when a claim was lost), and the lowest slot named for a key wins. A lookup that
//! finds a key's entry on fewer than a majority of the nodes it read (a create still under
//! way: its claims stalled, or its client crashed) claims it on the others before it uses the
//! slot, so once any operation has used a key, every later lookup finds it.
//! Simplifications: two distinct keys with the same 40-bit fingerprint are not supported (the
//! later insert would alias the earlier key), and two clients *concurrently* creating the same
//! new key may each keep using their own slot if only one of them sees the other's entry.
//!
//! Why the second is not a small fix (for whoever takes it on): choosing one slot among
//! concurrent creators is consensus, and the directory's base objects are memory nodes that
//! fail by hanging, not by answering wrongly; no wait-free consensus tolerates even one such
//! object (Jayanti, Chandra and Toueg, "Fault-tolerant wait-free shared objects", JACM 1998),
//! however strong its verbs (CAS included). So a fix either agrees on the entry with an
//! obstruction-free protocol over the nodes (Disk Paxos or CASPaxos on the directory words,
//! ballots and all, with the suspicion of crashed nodes for progress), or avoids agreement: a
//! key is then the *union* of every slot named for it, each operation reads the key's directory
//! window in the same chain as its metadata (a read verb, no extra round trip), and gets and
//! updates take the newest tuple over all slots named (which only registers need, as Safe-Guess
//! already does per slot; a second slot costs a round trip only when it exists). Neither is
//! built, and the campaigns do not exercise the race: each fresh key has one creator, its
//! owner (`sim::client_node`), while every client reads and updates it.

use crate::engine::Protocol;
use crate::layout::{Layout, DIR_ENTRIES, DIR_PROBE};
use crate::meta;
use crate::verbs::MemoryImage;
use std::collections::BTreeSet;
use xxhash_rust::xxh3::xxh3_64;

/// A key's 40-bit fingerprint (never 0).
pub fn fingerprint(key: &[u8]) -> u64 {
    (xxh3_64(key) >> 24).max(1)
}

pub fn entry(fp: u64, slot: u64) -> u64 {
    (fp << 24) | (slot & 0xFF_FFFF)
}
pub fn entry_fp(e: u64) -> u64 {
    e >> 24
}
pub fn entry_slot(e: u64) -> u64 {
    e & 0xFF_FFFF
}

/// The first bucket of a key's window and the window's length.
pub fn window(layout: &Layout, fp: u64) -> (u64, u64) {
    let probe = DIR_PROBE.min(layout.buckets);
    (fp % (layout.buckets - probe + 1), probe)
}

/// The slots a directory window names for `fp` (lowest first).
pub fn slots_in_window(layout: &Layout, window_words: &[u64], fp: u64) -> Vec<u64> {
    let mut out: Vec<u64> = window_words
        .iter()
        .filter(|e| **e != 0 && entry_fp(**e) == fp && entry_slot(**e) < layout.config.keys)
        .map(|e| entry_slot(*e))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The first entry of `fp`'s window that is free in every window read in `windows` (the
/// words of one window read per node) and not in `skip`: `(bucket, entry)`.
pub fn free_entry(layout: &Layout, fp: u64, windows: &[&[u64]], skip: &BTreeSet<(u64, u64)>) -> Option<(u64, u64)> {
    let (first, probe) = window(layout, fp);
    (0..probe * DIR_ENTRIES).map(|i| (i, (first + i / DIR_ENTRIES, i % DIR_ENTRIES))).find_map(|(i, be)| {
        let free = windows.iter().all(|w| w.get(i as usize).is_none_or(|e| *e == 0));
        (free && !skip.contains(&be)).then_some(be)
    })
}

/// A map keyed by a key's bytes, looked up on every operation: hashed (an ordered map
/// compared 24-byte keys about 17 times per lookup at 10⁵ keys, the largest cost of a client
/// on shared memory) with a fixed-seed hasher, so runs stay deterministic. Never iterated to
/// make a decision. Keys of up to 32 bytes are stored in the table itself ([`InlineKey`]), so
/// comparing the key a lookup found costs no second cache miss behind a pointer (at 10⁵ keys
/// that miss was most of a lookup's time).
pub type KeyMap<V> = std::collections::HashMap<InlineKey, V, FixedHash>;

/// A key's bytes, inline up to 32 bytes (the SWARM paper's keys are 24).
pub type InlineKey = smallvec::SmallVec<[u8; 32]>;

/// The hasher of a client's hot maps: foldhash's fast variant with a fixed seed (about 1 ns for
/// a 24-byte key, against 7 for xxHash3's streaming hasher); the maps are the client's own, so
/// hash flooding is no concern.
pub type FixedHash = foldhash::fast::FixedState;

/// A client's cache of `key → slot`, and its own allocations (slots, and the directory entries
/// it claimed, so that its concurrent inserts do not race each other for one entry).
#[derive(Clone, Debug, Default)]
pub struct IndexCache {
    slots: KeyMap<u64>,
    next_slot: u64,
    used_slots: BTreeSet<u64>,
    claimed_entries: BTreeSet<(u64, u64)>,
}

impl IndexCache {
    pub fn get(&self, key: &[u8]) -> Option<u64> {
        self.slots.get(key).copied()
    }
    pub fn insert(&mut self, key: &[u8], slot: u64) {
        self.slots.insert(InlineKey::from_slice(key), slot);
    }
    pub fn len(&self) -> usize {
        self.slots.len()
    }
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
    /// A fresh slot of `writer`'s residue class.
    pub fn allocate_slot(&mut self, layout: &Layout, writer: u32) -> Option<u64> {
        let w = u64::from(layout.config.writers);
        loop {
            let slot = self.next_slot * w + u64::from(writer);
            if slot >= layout.config.keys {
                return None;
            }
            self.next_slot += 1;
            if self.used_slots.insert(slot) {
                return Some(slot);
            }
        }
    }
    /// An entry of the key's window to claim: free in every window read in `windows` and not
    /// claimed by this client before. `(bucket, entry)`.
    pub fn claim_entry(&mut self, layout: &Layout, fp: u64, windows: &[&[u64]]) -> Option<(u64, u64)> {
        let be = free_entry(layout, fp, windows, &self.claimed_entries)?;
        self.claimed_entries.insert(be);
        Some(be)
    }
}

/// Loads keys straight into node images (the benchmark's load phase, before any client runs):
/// writer `slot % writers` owns each key, as if it had inserted it. Returns each writer's
/// cache and the `(slot, buffer)` it holds, for [`crate::engine::Client::absorb_load`].
pub struct BulkLoad {
    pub caches: Vec<IndexCache>,
    /// Per writer: `(slot, tuple word)` of the loaded values.
    pub tuples: Vec<Vec<(u64, u64)>>,
}

/// Writes `keys` (each with `value`) into every node image of `layout`, as `protocol` stores
/// them (RAW: only the primary's key and in-place copy, and the directory). `ts` is the
/// timestamp of the loaded tuples (below any guess a client will make).
pub fn bulk_load(
    layout: &Layout,
    protocol: Protocol,
    images: &mut [MemoryImage],
    keys: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
    ts: u64,
) -> Result<BulkLoad, crate::client::KvError> {
    use crate::client::KvError;
    let writers = layout.config.writers;
    let mut caches = vec![IndexCache::default(); writers as usize];
    let mut tuples = vec![Vec::new(); writers as usize];
    let mut next_writer = 0u32;
    // The directory as written so far (the same on every node).
    let mut taken = BTreeSet::new();
    for (key, value) in keys {
        if key.len() > layout.config.key_size as usize {
            return Err(KvError::KeyTooLong { len: key.len(), max: layout.config.key_size as usize });
        }
        if value.len() > layout.config.value_size as usize {
            return Err(KvError::ValueTooLong { len: value.len(), max: layout.config.value_size as usize });
        }
        let w = next_writer;
        next_writer = (next_writer + 1) % writers;
        let slot = caches[w as usize].allocate_slot(layout, w).ok_or(KvError::IndexFull)?;
        let fp = fingerprint(&key);
        let (bucket, e) = free_entry(layout, fp, &[], &taken).ok_or(KvError::IndexFull)?;
        taken.insert((bucket, e));
        let buf = tuples[w as usize].len() as u32;
        if buf >= layout.config.buffers_per_writer {
            return Err(KvError::OutOfBuffers);
        }
        let tuple = meta::pack(ts, buf, w, true);
        let copy = meta::encode_copy(tuple, &value);
        let mut key_area = (key.len() as u64).to_le_bytes().to_vec();
        key_area.extend_from_slice(&key);
        let replicas = layout.replicas_of(slot);
        // FUSEE keeps one index slot per key (word 0); the others one word per writer.
        let word_of = if protocol == Protocol::Fusee { 0 } else { w };
        for node in replicas.iter().copied().filter(|_| protocol != Protocol::Raw) {
            let Some(img) = images.get_mut(node as usize) else { continue };
            img.write(layout.meta_word(slot, word_of), &tuple.to_le_bytes());
            img.write(layout.buffer_lock(w, buf), &meta::lock(tuple, meta::LOCK_FREE).to_le_bytes());
            img.write(layout.buffer_copy(w, buf), &copy);
        }
        // The key and the in-place copy only on the primary (see `layout`). FUSEE has no
        // in-place copy, and its key would live in its KV blocks (see `crate::fusee`).
        if let Some(img) = images.get_mut(replicas[0] as usize).filter(|_| protocol != Protocol::Fusee) {
            img.write(layout.key_area(replicas[0], slot), &key_area);
            img.write(layout.inplace(replicas[0], slot), &copy);
        }
        // The directory is on every node.
        for img in images.iter_mut() {
            img.write(layout.dir_entry(bucket, e), &entry(fp, slot).to_le_bytes());
        }
        caches[w as usize].insert(&key, slot);
        tuples[w as usize].push((slot, tuple));
    }
    // Every client knows every loaded key (the index cache is warm after the load phase).
    let all: Vec<(InlineKey, u64)> = caches.iter().flat_map(|c| c.slots.iter().map(|(k, s)| (k.clone(), *s))).collect();
    for c in &mut caches {
        for (k, s) in &all {
            c.slots.insert(k.clone(), *s);
        }
    }
    Ok(BulkLoad { caches, tuples })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{LayoutConfig, DIR_PROBE};

    /// The sizing of `layout::DIR_ENTRIES_PER_KEY`: a directory filled to its key capacity,
    /// each key placed in the first free entry of its window, leaves every window room.
    #[test]
    fn a_full_directory_leaves_every_window_room() {
        let keys = 1_000_000;
        let layout = Layout::new(LayoutConfig { keys, ..LayoutConfig::paper() }.with_default_buffers()).unwrap();
        let mut used = vec![0u8; layout.buckets as usize];
        let mut probes_max = 0;
        for k in 0..keys {
            let (first, probe) = window(&layout, fingerprint(&k.to_le_bytes()));
            let b = (first..first + probe).find(|b| u64::from(used[*b as usize]) < DIR_ENTRIES);
            let b = b.unwrap_or_else(|| panic!("key {k}: window full"));
            used[b as usize] += 1;
            probes_max = probes_max.max(b - first + 1);
        }
        // Each further bucket is needed about a tenth as often as the one before; 10⁶ keys
        // reach about the seventh.
        assert!(probes_max <= 10, "a window needed {probes_max} of its {DIR_PROBE} buckets");
    }
}
