//! The shard store every peer executes on: per key, the latest committed value and the
//! version (a protocol-chosen, increasing number: a log position, a commit timestamp) that
//! wrote it. Never-written keys read value 0 at version 0, as in Tiga's store.
//!
//! Only the latest version is kept: 2PL reads under locks, OCC and Tapir validate the version
//! they read against the latest, so none of them reads an older snapshot.

use kairos_workload::txn::{Key, Value};
use std::collections::BTreeMap;

/// A value and the version that wrote it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Versioned {
    pub value: Value,
    pub version: u64,
}

/// See the module docs.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Store {
    keys: BTreeMap<Key, Versioned>,
}

impl Store {
    pub fn get(&self, key: Key) -> Versioned {
        self.keys.get(&key).copied().unwrap_or_default()
    }

    /// Installs `value` at `version` unless the key already holds a newer version (so a
    /// replayed or reordered apply cannot roll a key back). Returns whether it was installed.
    pub fn put(&mut self, key: Key, value: Value, version: u64) -> bool {
        let slot = self.keys.entry(key).or_default();
        if version < slot.version {
            return false;
        }
        *slot = Versioned { value, version };
        true
    }

    /// Keys ever written.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_versions_win() {
        let mut s = Store::default();
        assert_eq!(s.get(9), Versioned { value: 0, version: 0 });
        assert!(s.put(9, 5, 3));
        assert!(!s.put(9, 4, 2), "an older version must not roll the key back");
        assert_eq!(s.get(9), Versioned { value: 5, version: 3 });
        assert!(s.put(9, 6, 3) && s.len() == 1);
    }
}
