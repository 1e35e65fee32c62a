//! Where everything lives in a memory node, sized from a [`LayoutConfig`], so that a backend can
//! allocate node memory of the right size ([`Layout::node_bytes`]) and every protocol computes the
//! same addresses.
//!
//! Every memory node holds the same regions (a key's replicas are [`LayoutConfig::replicas`]
//! consecutive nodes starting at `slot % memory_nodes`; with `memory_nodes == replicas`, every
//! node holds every key):
//!
//! ```text
//! directory   buckets × DIR_ENTRIES words   (fingerprint 40 bits | slot 24 bits) — the shared part
//!             of the replica-location index; writers claim entries with CAS (see `index`)
//! slots       keys × writers words: one 8-byte In-n-Out metadata word per writer (see `meta`)
//! in-place    replicas × ⌈keys / memory_nodes⌉ entries, grouped by the node's rank among the
//!             key's replicas (rank 0 first):
//!               key area      8-byte length + key bytes (padded to 8)
//!               in-place copy [meta][hash][len][value padded] — refreshed in the background
//! buffers     writers × buffers_per_writer × buffer_bytes:
//!               [lock word][meta][hash][len][value padded] — out-of-place values; the lock word is
//!               the tuple's timestamp lock
//! ```
//!
//! Only the primary (the first live replica) keeps a key's in-place copy and its key, so a node
//! touches only the entries of the keys it is primary for: the rank-0 group while every node is
//! up, and the rank-r group of a key only after its r earlier replicas crashed. Memory nodes
//! allocate zeroed memory lazily (calloc'd pages in the simulator, tmpfs pages for shm), so an
//! untouched group costs address space, not memory. The paper keeps the in-place copy on one
//! replica too.
//!
//! All offsets are 8-aligned so that metadata and lock words can be read, written and CASed
//! atomically.

use crate::verbs::{Addr, MemNodeId, PAGE_BYTES};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Directory entries per bucket (one 64-byte line), shared by all writers.
pub const DIR_ENTRIES: u64 = 8;
/// Consecutive buckets a key may land in (its home bucket and the next ones): a window of 128
/// entries (1 KiB), read with one verb when a client looks up a key it does not know.
pub const DIR_PROBE: u64 = 16;
/// Directory entries per key of capacity. At this load (one half), a full directory of 10⁶
/// keys placed first-free in their windows needs about 7 of a window's buckets, each further
/// bucket about a tenth as often as the one before
/// (`index::tests::a_full_directory_leaves_every_window_room`).
pub const DIR_ENTRIES_PER_KEY: u64 = 2;
/// Bytes of a buffer's or in-place copy's header: `[meta][hash][len]` (+ the lock word for buffers).
pub const COPY_HEADER_BYTES: u64 = 24;
/// Most writers the metadata word can name (7 bits).
pub const WRITERS_MAX: u32 = 127;
/// Most buffers per writer the metadata word can name (20 bits).
pub const BUFFERS_PER_WRITER_MAX: u32 = 1 << 20;
/// Most slots the directory can name (24 bits).
pub const SLOTS_MAX: u64 = 1 << 24;

/// What a deployment stores.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutConfig {
    /// Key capacity (slots).
    pub keys: u64,
    /// Largest key, in bytes.
    pub key_size: u32,
    /// Largest value, in bytes.
    pub value_size: u32,
    /// Copies of every key.
    pub replicas: u32,
    /// Memory nodes (≥ replicas).
    pub memory_nodes: u32,
    /// Clients that may write (each gets a metadata word per key and a pool).
    pub writers: u32,
    /// Out-of-place buffers per writer per node (recycled; see the crate docs).
    pub buffers_per_writer: u32,
}

impl LayoutConfig {
    /// The paper's defaults: 100 000 keys of 24 B, 64 B values, 3 replicas on 3 nodes, 4 clients.
    pub fn paper() -> Self {
        LayoutConfig {
            keys: 100_000,
            key_size: 24,
            value_size: 64,
            replicas: 3,
            memory_nodes: 3,
            writers: 4,
            buffers_per_writer: 0,
        }
        .with_default_buffers()
    }

    /// Sizes the pools so that recycling never starves: each writer can hold the current value of
    /// every key plus a margin for buffers waiting out their grace period.
    pub fn with_default_buffers(mut self) -> Self {
        self.buffers_per_writer = (self.keys.min(u64::from(BUFFERS_PER_WRITER_MAX) - 4096) as u32) + 4096;
        self
    }
}

/// A layout that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum LayoutError {
    #[error("need at least one key, one replica and one writer")]
    Empty,
    #[error("{replicas} replicas need at least as many memory nodes, not {memory_nodes}")]
    TooFewNodes { replicas: u32, memory_nodes: u32 },
    #[error("at most {WRITERS_MAX} writers fit in a metadata word, not {0}")]
    TooManyWriters(u32),
    #[error("at most {BUFFERS_PER_WRITER_MAX} buffers per writer fit in a metadata word, not {0}")]
    TooManyBuffers(u32),
    #[error("at most {SLOTS_MAX} keys fit in the directory, not {0}")]
    TooManyKeys(u64),
    #[error("keys and values must be at least one byte and at most 1 MiB (key {key_size} B, value {value_size} B)")]
    BadSize { key_size: u32, value_size: u32 },
    #[error("the layout needs {0} bytes per node, more than a node can address")]
    TooBig(u128),
}

fn pad8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}
fn pad_page(n: u64) -> u64 {
    n.div_ceil(PAGE_BYTES) * PAGE_BYTES
}

/// Addresses of everything in a node, computed from a checked [`LayoutConfig`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub config: LayoutConfig,
    pub buckets: u64,
    pub directory_base: Addr,
    pub slots_base: Addr,
    pub slot_bytes: u64,
    pub key_area_bytes: u64,
    pub inplace_base: Addr,
    /// Bytes of one in-place entry: the key area, then the copy.
    pub inplace_entry_bytes: u64,
    /// In-place entries per rank group: `⌈keys / memory_nodes⌉`.
    pub inplace_per_rank: u64,
    pub buffers_base: Addr,
    pub buffer_bytes: u64,
    pub node_bytes: u64,
}

impl Layout {
    pub fn new(config: LayoutConfig) -> Result<Layout, LayoutError> {
        let c = &config;
        if c.keys == 0 || c.replicas == 0 || c.writers == 0 || c.buffers_per_writer == 0 {
            return Err(LayoutError::Empty);
        }
        if c.memory_nodes < c.replicas {
            return Err(LayoutError::TooFewNodes { replicas: c.replicas, memory_nodes: c.memory_nodes });
        }
        if c.writers > WRITERS_MAX {
            return Err(LayoutError::TooManyWriters(c.writers));
        }
        if c.buffers_per_writer > BUFFERS_PER_WRITER_MAX {
            return Err(LayoutError::TooManyBuffers(c.buffers_per_writer));
        }
        if c.keys > SLOTS_MAX {
            return Err(LayoutError::TooManyKeys(c.keys));
        }
        let limit = 1 << 20;
        if c.key_size == 0 || c.value_size == 0 || c.key_size > limit || c.value_size > limit {
            return Err(LayoutError::BadSize { key_size: c.key_size, value_size: c.value_size });
        }
        let w = u64::from(c.writers);
        // The directory is sized for the keys, not for the writers: entries are shared.
        let buckets = (c.keys * DIR_ENTRIES_PER_KEY).div_ceil(DIR_ENTRIES).max(DIR_PROBE);
        let directory_base = 0;
        let directory_bytes = buckets * DIR_ENTRIES * 8;
        let key_area_bytes = 8 + pad8(u64::from(c.key_size));
        let value_padded = pad8(u64::from(c.value_size));
        let slot_bytes = w * 8;
        // Regions start on page boundaries, so pages written are counted per region exactly.
        let slots_base = pad_page(directory_base + directory_bytes);
        let inplace_base = pad_page(slots_base + c.keys * slot_bytes);
        let inplace_entry_bytes = key_area_bytes + COPY_HEADER_BYTES + value_padded;
        let inplace_per_rank = c.keys.div_ceil(u64::from(c.memory_nodes));
        let buffers_base = pad_page(inplace_base + u64::from(c.replicas) * inplace_per_rank * inplace_entry_bytes);
        let buffer_bytes = 8 + COPY_HEADER_BYTES + value_padded;
        let total =
            u128::from(buffers_base) + u128::from(w * u64::from(c.buffers_per_writer)) * u128::from(buffer_bytes);
        let node_bytes = u64::try_from(total).map_err(|_| LayoutError::TooBig(total))?;
        Ok(Layout {
            config,
            buckets,
            directory_base,
            slots_base,
            slot_bytes,
            key_area_bytes,
            inplace_base,
            inplace_entry_bytes,
            inplace_per_rank,
            buffers_base,
            buffer_bytes,
            node_bytes,
        })
    }

    /// Bytes every memory node must have.
    pub fn node_bytes(&self) -> u64 {
        self.node_bytes
    }
    /// The regions of a node, in address order: `(name, start, end)`.
    pub fn regions(&self) -> [(&'static str, Addr, Addr); 4] {
        [
            ("directory", self.directory_base, self.slots_base),
            ("metadata", self.slots_base, self.inplace_base),
            ("in_place", self.inplace_base, self.buffers_base),
            ("buffers", self.buffers_base, self.node_bytes),
        ]
    }
    pub fn majority(&self) -> usize {
        self.config.replicas as usize / 2 + 1
    }
    /// The nodes holding `slot`, in preference order (the first alive one keeps the in-place copy).
    pub fn replicas_of(&self, slot: u64) -> Vec<MemNodeId> {
        let m = u64::from(self.config.memory_nodes);
        (0..u64::from(self.config.replicas)).map(|i| ((slot + i) % m) as MemNodeId).collect()
    }
    /// Address of directory entry `entry` of `bucket`.
    pub fn dir_entry(&self, bucket: u64, entry: u64) -> Addr {
        self.directory_base + ((bucket % self.buckets) * DIR_ENTRIES + entry % DIR_ENTRIES) * 8
    }
    /// Bytes of one bucket.
    pub fn bucket_bytes(&self) -> u64 {
        DIR_ENTRIES * 8
    }
    pub fn slot_base(&self, slot: u64) -> Addr {
        self.slots_base + slot * self.slot_bytes
    }
    /// Address of `writer`'s metadata word of `slot`.
    pub fn meta_word(&self, slot: u64, writer: u32) -> Addr {
        self.slot_base(slot) + u64::from(writer) * 8
    }
    /// Address of all metadata words of `slot` (`writers × 8` bytes).
    pub fn meta_words(&self, slot: u64) -> Addr {
        self.meta_word(slot, 0)
    }
    pub fn meta_words_bytes(&self) -> u32 {
        self.config.writers * 8
    }
    /// `node`'s rank among the replicas of `slot` (0 for its first replica). `node` must be one
    /// of [`Layout::replicas_of`]`(slot)`; for another node the answer is past the last rank.
    pub fn rank_of(&self, node: MemNodeId, slot: u64) -> u64 {
        let m = u64::from(self.config.memory_nodes);
        (u64::from(node) + m - slot % m) % m
    }
    /// Address of `slot`'s in-place entry on `node`, one of its replicas.
    fn inplace_entry(&self, node: MemNodeId, slot: u64) -> Addr {
        let rank = self.rank_of(node, slot);
        debug_assert!(rank < u64::from(self.config.replicas), "node {node} holds no replica of slot {slot}");
        let m = u64::from(self.config.memory_nodes);
        self.inplace_base + (rank * self.inplace_per_rank + slot / m) * self.inplace_entry_bytes
    }
    /// Address of `slot`'s key area (8-byte length, then the key) on `node`, one of its replicas.
    pub fn key_area(&self, node: MemNodeId, slot: u64) -> Addr {
        self.inplace_entry(node, slot)
    }
    /// Address of `slot`'s in-place copy (header then value) on `node`, one of its replicas.
    pub fn inplace(&self, node: MemNodeId, slot: u64) -> Addr {
        self.inplace_entry(node, slot) + self.key_area_bytes
    }
    /// Bytes of a copy with its header (`[meta][hash][len][value]`) for `value_len` bytes of value.
    pub fn copy_bytes(&self, value_len: usize) -> u32 {
        (COPY_HEADER_BYTES + pad8(value_len as u64)) as u32
    }
    pub fn copy_bytes_max(&self) -> u32 {
        self.copy_bytes(self.config.value_size as usize)
    }
    /// Address of buffer `buf` of `writer`: its lock word, followed by the copy.
    pub fn buffer(&self, writer: u32, buf: u32) -> Addr {
        let index = u64::from(writer) * u64::from(self.config.buffers_per_writer) + u64::from(buf);
        self.buffers_base + index * self.buffer_bytes
    }
    pub fn buffer_lock(&self, writer: u32, buf: u32) -> Addr {
        self.buffer(writer, buf)
    }
    pub fn buffer_copy(&self, writer: u32, buf: u32) -> Addr {
        self.buffer(writer, buf) + 8
    }
    /// Node bytes per key, everything included (directory, slot, the pools' share).
    pub fn bytes_per_key(&self) -> f64 {
        self.node_bytes as f64 * f64::from(self.config.memory_nodes) / self.config.keys as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap_and_words_are_aligned() {
        let l = Layout::new(LayoutConfig { keys: 10, ..LayoutConfig::paper() }.with_default_buffers()).unwrap();
        assert!(l.dir_entry(l.buckets - 1, DIR_ENTRIES - 1) + 8 <= l.slots_base);
        assert!(l.slot_base(9) + l.slot_bytes <= l.inplace_base);
        assert_eq!(l.buffer(3, l.config.buffers_per_writer - 1) + l.buffer_bytes, l.node_bytes());
        for a in [
            l.meta_word(7, 3),
            l.inplace(1, 7),
            l.key_area(2, 7),
            l.buffer_lock(2, 5),
            l.buffer_copy(2, 5),
            l.dir_entry(3, 1),
        ] {
            assert_eq!(a % 8, 0);
        }
        assert_eq!(l.replicas_of(0), vec![0, 1, 2]);
        assert_eq!(l.majority(), 2);
    }

    #[test]
    fn every_replica_has_its_own_in_place_entry_and_primaries_are_packed() {
        for (keys, nodes) in [(23, 5), (10, 3), (1, 3)] {
            let c = LayoutConfig { keys, memory_nodes: nodes, ..LayoutConfig::paper() }.with_default_buffers();
            let l = Layout::new(c).unwrap();
            for node in 0..nodes {
                let mut entries: Vec<(u64, u64)> = (0..keys)
                    .filter(|s| l.replicas_of(*s).contains(&node))
                    .map(|s| (l.key_area(node, s), l.rank_of(node, s)))
                    .collect();
                entries.sort_unstable();
                for pair in entries.windows(2) {
                    assert!(pair[0].0 + l.inplace_entry_bytes <= pair[1].0, "entries overlap on node {node}");
                }
                for (addr, _) in &entries {
                    assert!(*addr >= l.inplace_base && addr + l.inplace_entry_bytes <= l.buffers_base);
                }
                // The keys a node is primary for come first, with no gaps: only they are touched
                // while every node is up.
                let primaries: Vec<u64> = entries.iter().filter(|e| e.1 == 0).map(|e| e.0).collect();
                for (i, addr) in primaries.iter().enumerate() {
                    assert_eq!(*addr, l.inplace_base + i as u64 * l.inplace_entry_bytes);
                }
            }
        }
    }

    #[test]
    fn impossible_layouts_are_errors() {
        let ok = LayoutConfig::paper();
        assert_eq!(Layout::new(LayoutConfig { writers: 200, ..ok.clone() }), Err(LayoutError::TooManyWriters(200)));
        assert!(Layout::new(LayoutConfig { memory_nodes: 2, ..ok.clone() }).is_err());
        assert!(Layout::new(LayoutConfig { keys: 0, ..ok.clone() }).is_err());
        assert!(Layout::new(LayoutConfig { value_size: 0, ..ok }).is_err());
    }
}
