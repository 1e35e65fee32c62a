//! Who serves which shard, and where the leaders sit.

use crate::txn::{key_id, Key, ShardId};
use kairos_core::NodeId;

/// The shard of key id `key` among `shard_count` shards (at least one): id mod shards. Tiga's
/// keys are byte strings whose id is [`key_id`] (xxh3); the peers' integer MicroBench keys are
/// their own ids. Every role that places or checks a key uses this one rule.
pub fn shard_of(key: Key, shard_count: usize) -> ShardId {
    (key % shard_count.max(1) as u64) as ShardId
}

/// How a byte-string key (Tiga's) finds its shard.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Partitioner {
    /// By the key's id ([`key_id`], xxh3) mod shards: any key, spread evenly.
    #[default]
    Hash,
    /// A key whose bytes are a decimal integer (no sign, no leading zero) by that integer mod
    /// shards, as the peers place their integer keys; any other key by hash. A workload that
    /// lays its data out by number (TPC-C's conflict keys put a warehouse's keys on the
    /// warehouse's shard) keeps its layout on Tiga.
    Integer,
}

impl Partitioner {
    /// The shard of `key` among `shard_count` shards.
    pub fn shard_of(self, key: &[u8], shard_count: usize) -> ShardId {
        match self {
            Partitioner::Integer => match decimal_key(key) {
                Some(n) => shard_of(n, shard_count),
                None => shard_of(key_id(key), shard_count),
            },
            Partitioner::Hash => shard_of(key_id(key), shard_count),
        }
    }
}

/// The integer a key's bytes spell in decimal, if they spell one the way `u64::to_string`
/// writes it (so that one integer has one key).
pub fn decimal_key(key: &[u8]) -> Option<u64> {
    if key.is_empty() || (key.len() > 1 && key[0] == b'0') || !key.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(key).ok()?.parse().ok()
}

/// The shards and their replicas. Replica `r` of shard `s` is `shards[s][r]`; in view 0 the
/// leader of every shard is replica `leader[s]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    pub shards: Vec<Vec<NodeId>>,
    pub leader: Vec<u32>,
}

impl Topology {
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }
    /// Replicas per shard (2f + 1).
    pub fn replicas_per_shard(&self) -> usize {
        self.shards.first().map_or(0, Vec::len)
    }
    /// Failures tolerated per shard.
    pub fn f(&self) -> usize {
        self.replicas_per_shard().saturating_sub(1) / 2
    }
    /// Super quorum: 1 + f + ⌈f/2⌉ replicas (3 of 3 when f = 1).
    pub fn super_quorum(&self) -> usize {
        let f = self.f();
        1 + f + f.div_ceil(2)
    }
    pub fn leader_node(&self, shard: ShardId) -> NodeId {
        self.shards[shard as usize][self.leader[shard as usize] as usize]
    }
    /// The shard of a key id ([`shard_of`]).
    pub fn shard_of_key(&self, key: Key) -> ShardId {
        shard_of(key, self.shards.len())
    }
    /// The shard of a byte-string key.
    pub fn shard_of_bytes(&self, key: &[u8]) -> ShardId {
        self.shard_of_key(key_id(key))
    }
    /// (shard, replica index) of a server node, if it is one.
    pub fn locate(&self, node: NodeId) -> Option<(ShardId, u32)> {
        self.shards
            .iter()
            .enumerate()
            .find_map(|(s, rs)| rs.iter().position(|n| *n == node).map(|r| (s as ShardId, r as u32)))
    }
}

/// Where each shard's replicas live, over the server regions in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Replica r of every shard in region r: every leader (replica 0) in the first region.
    CoLocated,
    /// Shard s's replica list rotated by s: leaders in different regions.
    Separated,
}

impl Placement {
    /// The region index (into the server regions, `regions` of them) of `replica` of `shard`.
    pub fn region_index(self, shard: usize, replica: usize, regions: usize) -> usize {
        match self {
            Placement::CoLocated => replica % regions,
            Placement::Separated => (replica + shard) % regions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three_by_three() -> Topology {
        Topology { shards: (0..3).map(|s| (0..3).map(|r| NodeId(3 * s + r)).collect()).collect(), leader: vec![0; 3] }
    }

    #[test]
    fn quorums_and_lookups() {
        let t = three_by_three();
        assert_eq!((t.shard_count(), t.replicas_per_shard(), t.f(), t.super_quorum()), (3, 3, 1, 3));
        assert_eq!(t.leader_node(2), NodeId(6));
        assert_eq!(t.locate(NodeId(5)), Some((1, 2)));
        assert_eq!(t.locate(NodeId(9)), None);
        assert_eq!(t.shard_of_key(7), 1);
        assert_eq!(t.shard_of_bytes(b"k"), (key_id(b"k") % 3) as ShardId);
    }

    #[test]
    fn integer_keys_land_by_value_and_others_by_hash() {
        let int = Partitioner::Integer;
        assert_eq!(int.shard_of(b"7", 3), 1);
        assert_eq!(int.shard_of(b"18446744073709551615", 6), (u64::MAX % 6) as ShardId);
        for odd in [&b"07"[..], b"-7", b"+7", b"7 ", b"", b"18446744073709551616", b"k"] {
            assert_eq!(int.shard_of(odd, 3), Partitioner::Hash.shard_of(odd, 3), "{odd:?}");
        }
        assert_eq!(Partitioner::Hash.shard_of(b"k", 3), three_by_three().shard_of_bytes(b"k"));
    }

    #[test]
    fn separated_leaders_sit_in_different_regions() {
        let leaders: Vec<usize> = (0..3).map(|s| Placement::Separated.region_index(s, 0, 3)).collect();
        assert_eq!(leaders, vec![0, 1, 2]);
        assert!((0..3).all(|s| Placement::CoLocated.region_index(s, 0, 3) == 0));
    }
}
