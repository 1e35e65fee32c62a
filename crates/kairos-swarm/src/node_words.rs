//! A client's own words per (key, memory node) — its metadata word per (slot, node), its
//! buffers' lock words per (buffer, node) — looked up on every write and on every reply.
//!
//! A map of `(key, node)` pairs costs a cache miss per node, and a write touches every replica;
//! [`NodeWords`] keeps a key's first [`LANES`] lanes in one entry, so the replicas of one key
//! share a cache line. Lanes beyond go to a second map (correct for any number of nodes, fast for
//! the usual three to five). Both maps are hashed with a fixed seed and never iterated, so runs
//! stay deterministic.

use crate::index::FixedHash;
use std::collections::HashMap;
use std::hash::Hash;

/// Lanes kept inline per key.
pub const LANES: usize = 5;

/// See the module docs. A word never set reads 0.
#[derive(Clone, Debug)]
pub struct NodeWords<K> {
    inline: HashMap<K, [u64; LANES], FixedHash>,
    spill: HashMap<(K, u32), u64, FixedHash>,
}

impl<K> Default for NodeWords<K> {
    fn default() -> Self {
        NodeWords { inline: HashMap::default(), spill: HashMap::default() }
    }
}

impl<K: Hash + Eq + Copy> NodeWords<K> {
    pub fn get(&self, key: K, lane: u32) -> Option<u64> {
        match usize::try_from(lane).ok().filter(|l| *l < LANES) {
            Some(l) => self.inline.get(&key).map(|words| words[l]).filter(|w| *w != 0),
            None => self.spill.get(&(key, lane)).copied().filter(|w| *w != 0),
        }
    }

    pub fn set(&mut self, key: K, lane: u32, word: u64) {
        match usize::try_from(lane).ok().filter(|l| *l < LANES) {
            Some(l) => self.inline.entry(key).or_insert([0; LANES])[l] = word,
            None => {
                self.spill.insert((key, lane), word);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_and_spilled_lanes_keep_their_own_words() {
        let mut m = NodeWords::<u64>::default();
        assert_eq!(m.get(7, 0), None);
        m.set(7, 0, 11);
        m.set(7, 2, 13);
        m.set(7, LANES as u32 + 3, 17);
        m.set(8, 0, 19);
        assert_eq!((m.get(7, 0), m.get(7, 1), m.get(7, 2)), (Some(11), None, Some(13)));
        assert_eq!(m.get(7, LANES as u32 + 3), Some(17));
        assert_eq!(m.get(7, LANES as u32 + 4), None);
        assert_eq!(m.get(8, 0), Some(19));
        m.set(7, 0, 23);
        assert_eq!(m.get(7, 0), Some(23));
    }
}
