//! Transactions, keys and shards: the words every transactional protocol uses.

use kairos_core::{duration_nanos, LocalTime, NodeId};
use serde::{Deserialize, Serialize};
use std::time::Duration;

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

/// A transaction timestamp: a position in the serialization order, counted in nanoseconds of
/// the (loosely synchronized) node clocks. Tiga's future timestamps are a coordinator's send
/// time plus headroom, raised by the leaders' agreement; Tapir's are a client's proposal. Ties
/// are broken by transaction id.
///
/// Not a clock reading: a timestamp is compared with one only through [`Ts::at`] (the
/// timestamp a reading stands for), so the two are never mixed up by accident. On the wire it
/// is the bare `u64`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Ts(u64);

impl Ts {
    pub const ZERO: Ts = Ts(0);
    /// Later than every real timestamp (a sentinel: "never", "cannot be placed").
    pub const MAX: Ts = Ts(u64::MAX);
    pub const fn from_nanos(ns: u64) -> Ts {
        Ts(ns)
    }
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// The timestamp a clock reading stands for.
    pub const fn at(reading: LocalTime) -> Ts {
        Ts(reading.as_nanos())
    }
    /// The smallest timestamp after this one.
    pub const fn next(self) -> Ts {
        Ts(self.0.saturating_add(1))
    }
    pub fn saturating_add(self, d: Duration) -> Ts {
        Ts(self.0.saturating_add(duration_nanos(d)))
    }
    pub fn saturating_sub(self, d: Duration) -> Ts {
        Ts(self.0.saturating_sub(duration_nanos(d)))
    }
    /// `self - earlier`, or zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Ts) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl std::ops::Add<Duration> for Ts {
    type Output = Ts;
    fn add(self, d: Duration) -> Ts {
        self.saturating_add(d)
    }
}

impl std::fmt::Display for Ts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ns", self.0)
    }
}
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
