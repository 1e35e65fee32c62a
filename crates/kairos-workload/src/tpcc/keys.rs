//! The conflict keys of the transactional TPC-C database: what a protocol locks, validates,
//! orders by, and what a history records.
//!
//! Four kinds, each owned by one warehouse:
//! * [`ConflictKey::DistrictOrders`] — a district's next order id and its orders, new-orders,
//!   order lines and each customer's latest order (new-order and delivery write it,
//!   order-status and stock-level read it);
//! * [`ConflictKey::DistrictYtd`] — a district's year-to-date and its history rows (a payment
//!   made there writes it);
//! * [`ConflictKey::Customers`] — the balances and counters of a district's customers (a
//!   payment by one of them, and delivery, write it; order-status reads it);
//! * [`ConflictKey::Stock`] — one item's stock row in one warehouse.
//!
//! A district's orders and its customers are keys of their own, not one per row, because two
//! transactions touch rows they cannot name before running: delivery updates the customer of
//! each district's oldest undelivered order, and new-order inserts rows under the order id it
//! takes from the district. One-shot protocols (Tiga, Janus, Calvin+, Detock) need every key a
//! transaction touches before it runs; with these keys they have them, and every access to a
//! row happens under its key, so a history that is strictly serializable over these keys is
//! so over the rows. The district's row is split as TPC-C's columns are used: new-order takes
//! the next order id, payment adds to the year-to-date, so the two do not conflict (the usual
//! grain of TPC-C implementations). What the warehouse, district and item rows hold besides
//! (tax rates, prices, names, discounts) never changes and needs no key.
//!
//! **The warehouse's year-to-date has no key.** Every payment adds its amount to it (TPC-C
//! clause 2.5.2.2), but no transaction reads it and no output shows it: it is only ever
//! incremented, increments commute, so every order of the same payments leaves it the same
//! and no transaction can tell. A key on it would serialize all payments of a warehouse (with
//! 2PL, across wide-area round trips: 2PL+Paxos reached 59 txn/s with it in this simulator
//! and 104 without), which the Tiga paper's peers do not do: its code and Janus's read the
//! warehouse row's static columns unlocked and never write the year-to-date, and lock
//! payments per district (D_YTD) as here. Kairos still adds to it (so TPC-C's first
//! consistency condition, the warehouse's year-to-date equal to the sum of its districts', is
//! checked at the end of every run), and an undo subtracts the amount instead of restoring an
//! earlier value, so a revoked payment never takes back another's increment.
//!
//! # Encoding and placement
//! A key is the 64-bit integer `local × warehouses + w`, with `local` `d`, `D + d` and `2D + d`
//! for district `d`'s orders, year-to-date and customers (D = [`DISTRICTS_MAX`]) and `3D + i`
//! for item `i`'s stock. So `key mod shards` is `w mod shards` whenever the shards divide the
//! warehouses ([`super::TpccScale::validate`]), which is the peers' placement rule (`key mod
//! shards`): each warehouse's keys live on its shard. Keys stay below 2^63 (the checkers read
//! keys as i64).

use super::scale::{TpccScale, DISTRICTS_MAX};
use crate::txn::Key;

/// See the module docs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum ConflictKey {
    DistrictOrders { w: u32, d: u32 },
    DistrictYtd { w: u32, d: u32 },
    Customers { w: u32, d: u32 },
    Stock { w: u32, i: u32 },
}

impl ConflictKey {
    /// The warehouse that owns the key.
    pub fn warehouse(self) -> u32 {
        match self {
            ConflictKey::DistrictOrders { w, .. }
            | ConflictKey::DistrictYtd { w, .. }
            | ConflictKey::Customers { w, .. }
            | ConflictKey::Stock { w, .. } => w,
        }
    }

    /// The key as an integer (module docs).
    pub fn encode(self, scale: &TpccScale) -> Key {
        let dmax = u64::from(DISTRICTS_MAX);
        let local = match self {
            ConflictKey::DistrictOrders { d, .. } => u64::from(d),
            ConflictKey::DistrictYtd { d, .. } => dmax + u64::from(d),
            ConflictKey::Customers { d, .. } => 2 * dmax + u64::from(d),
            ConflictKey::Stock { i, .. } => 3 * dmax + u64::from(i),
        };
        local * u64::from(scale.warehouses) + u64::from(self.warehouse())
    }

    /// The key an integer names, if it names one of this scale.
    pub fn decode(key: Key, scale: &TpccScale) -> Option<ConflictKey> {
        let whs = u64::from(scale.warehouses.max(1));
        let w = u32::try_from(key % whs).ok()?;
        let local = key / whs;
        let dmax = u64::from(DISTRICTS_MAX);
        let d = |l: u64, from: u64| u32::try_from(l - from).ok();
        let k = match local {
            l if l < dmax => ConflictKey::DistrictOrders { w, d: d(l, 0)? },
            l if l < 2 * dmax => ConflictKey::DistrictYtd { w, d: d(l, dmax)? },
            l if l < 3 * dmax => ConflictKey::Customers { w, d: d(l, 2 * dmax)? },
            l => ConflictKey::Stock { w, i: d(l, 3 * dmax)? },
        };
        let valid = w < scale.warehouses
            && match k {
                ConflictKey::DistrictOrders { d, .. }
                | ConflictKey::DistrictYtd { d, .. }
                | ConflictKey::Customers { d, .. } => d < scale.districts_per_warehouse,
                ConflictKey::Stock { i, .. } => i < scale.items,
            };
        valid.then_some(k)
    }
}

impl std::fmt::Display for ConflictKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConflictKey::DistrictOrders { w, d } => write!(f, "district {w}/{d} orders"),
            ConflictKey::DistrictYtd { w, d } => write!(f, "district {w}/{d} year-to-date"),
            ConflictKey::Customers { w, d } => write!(f, "district {w}/{d} customers"),
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
            let mut keys = Vec::new();
            for d in 0..scale.districts_per_warehouse {
                keys.extend([
                    ConflictKey::DistrictOrders { w, d },
                    ConflictKey::DistrictYtd { w, d },
                    ConflictKey::Customers { w, d },
                ]);
            }
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
        assert_eq!(ConflictKey::decode(ConflictKey::DistrictOrders { w: 0, d: 10 }.encode(&scale), &scale), None);
        assert_eq!(ConflictKey::decode(ConflictKey::Customers { w: 0, d: 10 }.encode(&scale), &scale), None);
    }
}
