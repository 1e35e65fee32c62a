//! Transactions, keys and shards: the words every transactional protocol uses.

use kairos_core::NodeId;
use serde::{Deserialize, Serialize};

/// Globally unique transaction id: the coordinator's node id in the high 32 bits, its
/// sequence number in the low 32. A retransmission keeps the id (at-most-once execution).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TxnId(pub u64);

impl TxnId {
    pub fn new(coordinator: NodeId, seq: u32) -> Self {
        TxnId(((coordinator.0 as u64) << 32) | seq as u64)
    }
    /// The coordinator that owns this transaction (replies go there).
    pub fn coordinator(self) -> NodeId {
        NodeId((self.0 >> 32) as u32)
    }
    pub fn seq(self) -> u32 {
        self.0 as u32
    }
}

/// A timestamp: nanoseconds of a node's local clock (Tiga's future timestamps are send time +
/// headroom; Tapir's are a client's proposal). Ties are broken by transaction id.
pub type Ts = u64;
/// A key's protocol identity: [`key_id`] of a byte-string key (Tiga), or the integer
/// MicroBench key itself (the peers).
pub type Key = u64;
/// An integer value (the peers' increment-only store; the version of a key in Tiga's history).
pub type Value = u64;
pub type ShardId = u32;

/// The identity of a byte-string key: xxh3-64 of its bytes. Conflict detection, log hashes and
/// shard placement (`key_id % shards`) use it; two distinct keys with the same id would only
/// conflict more than needed (Tiga's coordinator refuses a transaction naming two of them).
pub fn key_id(key: &[u8]) -> Key {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// The key a history records for `key`: its id folded below 2^63 (adya reads keys as i64).
pub fn history_key(key: &[u8]) -> Key {
    key_id(key) & (u64::MAX >> 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_txn_id_names_its_coordinator_and_sequence() {
        let t = TxnId::new(NodeId(7), 42);
        assert_eq!((t.coordinator(), t.seq()), (NodeId(7), 42));
        assert!(TxnId::new(NodeId(7), 43) > t && TxnId::new(NodeId(8), 0) > TxnId::new(NodeId(7), u32::MAX));
    }

    #[test]
    fn history_keys_fit_an_i64() {
        for k in [&b""[..], b"a", b"key:1", &[0xff; 40]] {
            assert!(i64::try_from(history_key(k)).is_ok());
            assert_eq!(history_key(k), key_id(k) & (u64::MAX >> 1));
        }
    }
}
