//! The shard store every peer executes on: per key, the latest committed value and the
//! version (a protocol-chosen, increasing number: a log position, a commit timestamp) that
//! wrote it. Never-written keys read value 0 at version 0, as in Tiga's store.
//!
//! Only the latest version is kept: 2PL reads under locks, OCC and Tapir validate the version
//! they read against the latest, so none of them reads an older snapshot.
//!
//! In a TPC-C deployment the store also holds the shard's warehouses (those `w` with
//! `w mod shards = shard`), and a protocol runs a transaction's [pieces](kairos_workload::tpcc)
//! for them ([`Store::run_pieces`]) in the same step as it writes the transaction's keys, so
//! the rows change exactly when and where the keys' counters do.

use kairos_workload::tpcc::{piece, pre_read, Piece, PreReadAnswer, PreReadRequest, TpccScale, WarehouseDb};
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
    /// The TPC-C database's scale, and the shard's warehouses in warehouse order (none
    /// outside TPC-C).
    scale: Option<TpccScale>,
    warehouses: Vec<WarehouseDb>,
    writes_applied: u64,
    /// Pieces refused as bad input ([`kairos_workload::tpcc::PieceError`]): none in a run
    /// whose coordinators are Kairos's own.
    pieces_refused: u64,
}

impl Store {
    /// The store of `shard` (of `shards`) in a TPC-C deployment: its warehouses populated from
    /// `seed`.
    pub fn tpcc(scale: &TpccScale, seed: u64, shard: u32, shards: u32) -> Store {
        let warehouses = (0..scale.warehouses)
            .filter(|w| w % shards.max(1) == shard)
            .map(|w| WarehouseDb::populate(scale, seed, w))
            .collect();
        Store { scale: Some(*scale), warehouses, ..Store::default() }
    }

    /// The store of a MicroBench shard loaded with `keys` (each 0 at version 0, as a key never
    /// written reads), so that the run's writes find their keys in place.
    pub fn loaded(keys: impl IntoIterator<Item = Key>) -> Store {
        Store { keys: keys.into_iter().map(|k| (k, Versioned::default())).collect(), ..Store::default() }
    }

    /// Answers a by-name TPC-C transaction's pre-read, if this store holds the warehouse
    /// (`kairos_workload::tpcc::pre_read`: names never change, so any replica may answer).
    pub fn answer_pre_read(&self, request: PreReadRequest) -> Option<PreReadAnswer> {
        pre_read::answer(&self.warehouses, request)
    }

    /// Runs those of `pieces` that are for this store's warehouses (a transaction's pieces for
    /// other shards are skipped), for a transaction that declared `keys`. A piece that touches
    /// a key the transaction did not declare, or is refused as bad input, changes nothing and
    /// is counted.
    pub fn run_pieces(&mut self, pieces: &[Piece], keys: &[Key]) {
        let Some(scale) = self.scale else {
            self.pieces_refused += pieces.len() as u64;
            return;
        };
        for p in pieces {
            let Some(db) = self.warehouses.iter_mut().find(|db| db.w == p.w) else { continue };
            let declared = p.keys(&scale).iter().all(|(k, _)| keys.contains(&k.encode(&scale)));
            if !declared || piece::execute(db, p).is_err() {
                self.pieces_refused += 1;
            }
        }
    }

    /// The shard's TPC-C warehouses, in warehouse order.
    pub fn warehouses(&self) -> &[WarehouseDb] {
        &self.warehouses
    }

    /// Writes installed so far ([`Store::put`]): of two replicas of a shard, the one that
    /// applied more of the shard's order.
    pub fn writes_applied(&self) -> u64 {
        self.writes_applied
    }

    /// Whether both hold the same values and rows (replicas that applied the same order must;
    /// versions are a protocol's own and may differ between replicas, e.g. Janus's).
    pub fn same_data(&self, other: &Store) -> bool {
        self.keys.len() == other.keys.len()
            && self.keys.iter().zip(&other.keys).all(|((k, a), (l, b))| k == l && a.value == b.value)
            && self.warehouses == other.warehouses
    }

    pub fn pieces_refused(&self) -> u64 {
        self.pieces_refused
    }

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
        self.writes_applied += 1;
        true
    }

    /// Keys ever written or loaded.
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

    #[test]
    fn a_shard_runs_only_its_warehouses_pieces_and_only_on_declared_keys() {
        use kairos_workload::tpcc::piece::split;
        use kairos_workload::tpcc::{CustomerRef, TpccTxn};
        let scale = TpccScale::small(2, 100);
        let mut shard1 = Store::tpcc(&scale, 3, 1, 2);
        assert_eq!(shard1.warehouses().iter().map(|w| w.w).collect::<Vec<_>>(), [1]);
        let pay = TpccTxn::Payment {
            w: 0,
            d: 2,
            customer_w: 1,
            customer_d: 4,
            customer: CustomerRef::Id(7),
            amount_cents: 900,
            date: 1,
        };
        let pieces = split(&pay);
        let keys: Vec<Key> = pieces.iter().flat_map(|p| p.keys(&scale)).map(|(k, _)| k.encode(&scale)).collect();
        let before = shard1.warehouses()[0].districts[4].customers[7].balance_cents;
        // Warehouse 0's piece is not this shard's; warehouse 1's runs.
        shard1.run_pieces(&pieces, &keys);
        assert_eq!(shard1.warehouses()[0].districts[4].customers[7].balance_cents, before - 900);
        // Without its district's customers key declared, the piece is refused and changes nothing.
        let undeclared: Vec<Key> = keys.iter().copied().filter(|k| k % 2 == 0).collect();
        let kept = shard1.clone();
        shard1.run_pieces(&pieces, &undeclared);
        assert!(shard1.same_data(&kept) && shard1.pieces_refused() == 1);
        // A MicroBench store has no warehouses: any piece is refused.
        let mut micro = Store::default();
        micro.run_pieces(&pieces, &keys);
        assert_eq!(micro.pieces_refused(), 2);
    }
}
