//! The conflict keys of the transactional TPC-C database: what a protocol locks, validates,
//! orders by, and what a history records.
//!
//! Three kinds, each owned by one warehouse:
//! * [`ConflictKey::Warehouse`] — the warehouse's year-to-date (payments write it);
//! * [`ConflictKey::District`] — everything of one district: its row (next order id,
//!   year-to-date), its customers, orders, new-orders, order lines and history rows;
//! * [`ConflictKey::Stock`] — one item's stock row in one warehouse.
//!
//! A district key covers its customers and orders because two transactions touch rows of
//! them that they cannot name before running: delivery updates the customer of each
//! district's oldest undelivered order, and new-order inserts rows under the order id it
//! takes from the district. One-shot protocols (Tiga, Janus, Calvin+, Detock) need every key a
//! transaction touches before it runs; with the district as the key they have it, and every
//! access to a district's rows happens under that district's key, so a history that is
//! strictly serializable over these keys is so over the rows. (New-order and payment write
//! the district row in TPC-C anyway, so they conflict per district whatever the grain.)
//! What the warehouse row and the items hold besides year-to-date (tax rates, prices, names)
//! never changes and needs no key.
//!
//! # Encoding and placement
//! A key is the 64-bit integer `local × warehouses + w`, with `local` 0 for the warehouse,
//! `1 + d` for district `d` and `1 + DISTRICTS_MAX + i` for item `i`'s stock. So `key mod
//! shards` is `w mod shards` whenever the shards divide the warehouses
//! ([`super::TpccScale::validate`]), which is the peers' placement rule (`key mod shards`):
//! each warehouse's keys live on its shard. Keys stay below 2^63 (the checkers read keys as
//! i64).

use super::scale::{TpccScale, DISTRICTS_MAX};
use crate::txn::Key;

/// See the module docs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum ConflictKey {
    Warehouse { w: u32 },
    District { w: u32, d: u32 },
    Stock { w: u32, i: u32 },
}

impl ConflictKey {
    /// The warehouse that owns the key.
    pub fn warehouse(self) -> u32 {
        match self {
            ConflictKey::Warehouse { w } | ConflictKey::District { w, .. } | ConflictKey::Stock { w, .. } => w,
        }
    }

    /// The key as an integer (module docs).
    pub fn encode(self, scale: &TpccScale) -> Key {
        let local = match self {
            ConflictKey::Warehouse { .. } => 0,
            ConflictKey::District { d, .. } => 1 + u64::from(d),
            ConflictKey::Stock { i, .. } => 1 + u64::from(DISTRICTS_MAX) + u64::from(i),
        };
        local * u64::from(scale.warehouses) + u64::from(self.warehouse())
    }

    /// The key an integer names, if it names one of this scale.
    pub fn decode(key: Key, scale: &TpccScale) -> Option<ConflictKey> {
        let whs = u64::from(scale.warehouses.max(1));
        let w = u32::try_from(key % whs).ok()?;
        let local = key / whs;
        let k = match local {
            0 => ConflictKey::Warehouse { w },
            l if l <= u64::from(DISTRICTS_MAX) => ConflictKey::District { w, d: u32::try_from(l - 1).ok()? },
            l => ConflictKey::Stock { w, i: u32::try_from(l - 1 - u64::from(DISTRICTS_MAX)).ok()? },
        };
        let valid = w < scale.warehouses
            && match k {
                ConflictKey::Warehouse { .. } => true,
                ConflictKey::District { d, .. } => d < scale.districts_per_warehouse,
                ConflictKey::Stock { i, .. } => i < scale.items,
            };
        valid.then_some(k)
    }
}

impl std::fmt::Display for ConflictKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConflictKey::Warehouse { w } => write!(f, "warehouse {w}"),
            ConflictKey::District { w, d } => write!(f, "district {w}/{d}"),
            ConflictKey::Stock { w, i } => write!(f, "stock {w}/{i}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tpcc::scale::ITEMS_MAX;

    #[test]
    fn keys_round_trip_and_land_on_their_warehouse_shard() {
        let scale = TpccScale { warehouses: 6, ..TpccScale::default() };
        let mut seen = std::collections::BTreeSet::new();
        for w in 0..6 {
            let mut keys = vec![ConflictKey::Warehouse { w }];
            keys.extend((0..scale.districts_per_warehouse).map(|d| ConflictKey::District { w, d }));
            keys.extend([0, 1, scale.items - 1].map(|i| ConflictKey::Stock { w, i }));
            for k in keys {
                let n = k.encode(&scale);
                assert_eq!(ConflictKey::decode(n, &scale), Some(k));
                for shards in [1, 2, 3, 6] {
                    assert_eq!(n % shards, u64::from(w) % shards, "{k} on the wrong shard");
                }
                assert!(seen.insert(n), "{k} collides");
            }
        }
        let big = TpccScale { warehouses: 1 << 20, items: ITEMS_MAX, ..TpccScale::default() };
        let top = ConflictKey::Stock { w: (1 << 20) - 1, i: ITEMS_MAX - 1 }.encode(&big);
        assert!(i64::try_from(top).is_ok());
        assert_eq!(ConflictKey::decode(ConflictKey::Stock { w: 0, i: scale.items }.encode(&scale), &scale), None);
        assert_eq!(ConflictKey::decode(ConflictKey::District { w: 0, d: 10 }.encode(&scale), &scale), None);
    }
}
