//! One warehouse's tables ([`WarehouseDb`]), populated deterministically from the seed as
//! TPC-C's clause 4.3.3 describes, at the scale of [`TpccScale`].
//!
//! Only the columns a transaction or a consistency condition reads are kept; names, addresses,
//! `c_data` and `s_dist_xx` strings are left out (no condition or result depends on them).
//! Money is in cents, rates in basis points. Ids are 0-based except order ids, which are
//! TPC-C's (1-based, dense per district: order `o` is `orders[o - 1]`).
//!
//! The initial state satisfies every consistency condition: TPC-C's initial year-to-date
//! amounts (300,000.00 per warehouse, 30,000.00 per district) are exactly the sums of the
//! initial history rows (10.00 per customer), so at a scaled customer count they are those
//! sums.

use std::collections::VecDeque;

use rand::{Rng as _, SeedableRng};
use serde::{Deserialize, Serialize};

use super::input::CustomerRef;
use super::scale::TpccScale;
use kairos_core::Rng;

/// Per-customer opening payment, cents (TPC-C: H_AMOUNT = 10.00, C_YTD_PAYMENT = 10.00,
/// C_BALANCE = -10.00).
pub const OPENING_PAYMENT_CENTS: i64 = 1_000;
/// Share of the initial orders not yet delivered (TPC-C: the last 900 of 3,000).
pub const UNDELIVERED_INITIAL_PERCENT: u32 = 30;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Customer {
    /// Index of the last name (TPC-C's syllable string for this number).
    pub last_name: u32,
    /// Orders customers of one last name (TPC-C sorts by C_FIRST; a random key stands for it).
    pub first_name: u32,
    pub credit_bad: bool,
    pub discount_bp: u32,
    pub balance_cents: i64,
    pub ytd_payment_cents: i64,
    pub payment_cnt: u32,
    pub delivery_cnt: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderLine {
    pub item: u32,
    pub supply_w: u32,
    pub quantity: u32,
    pub amount_cents: i64,
    pub delivery_date: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub customer: u32,
    pub entry_date: u64,
    /// Set by delivery (1..=10).
    pub carrier: Option<u32>,
    pub all_local: bool,
    pub lines: Vec<OrderLine>,
}

/// A payment's history row. The customer may be named by last name: a payment by name at a
/// remote customer's warehouse is resolved there, not at the warehouse that keeps this row
/// (names never change, so the name always stands for the same customer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRow {
    pub customer_w: u32,
    pub customer_d: u32,
    pub customer: CustomerRef,
    pub amount_cents: i64,
    pub date: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct District {
    pub tax_bp: u32,
    pub ytd_cents: i64,
    pub next_order: u32,
    pub customers: Vec<Customer>,
    /// Per last name, its customers ordered by first name (fixed after population: TPC-C
    /// never adds customers or changes names).
    pub by_last_name: Vec<Vec<u32>>,
    /// Order `o` is `orders[o - 1]`.
    pub orders: Vec<Order>,
    /// Undelivered orders, oldest first.
    pub new_orders: VecDeque<u32>,
    /// Each customer's most recent order, 0 when none (with the orders, under the district's
    /// orders key: new-order sets it without touching the customer's row).
    pub last_order_of: Vec<u32>,
    /// Payments made at this district (H_W_ID, H_D_ID are this district's).
    pub history: Vec<HistoryRow>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stock {
    pub quantity: u32,
    pub ytd: u64,
    pub order_cnt: u32,
    pub remote_cnt: u32,
}

/// One warehouse's tables.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarehouseDb {
    pub w: u32,
    pub tax_bp: u32,
    pub ytd_cents: i64,
    pub districts: Vec<District>,
    /// Item `i`'s price (the item table is read-only and the same in every warehouse).
    pub item_price_cents: Vec<u32>,
    pub stock: Vec<Stock>,
}

/// TPC-C's NURand(A, x, y) with the run constant `c` (clause 2.1.6), over `0..n`, with `A`
/// scaled with the range as the tables are (module docs of [`super::scale`]).
pub fn nurand(rng: &mut impl rand::Rng, a_standard: u32, standard_range: u32, n: u32, c: u32) -> u32 {
    let n = n.max(1);
    let a = ((u64::from(a_standard) * u64::from(n) / u64::from(standard_range)).max(1) as u32).next_power_of_two() - 1;
    let a = a.min(a_standard);
    ((rng.random_range(0..=a) | rng.random_range(0..n)).wrapping_add(c)) % n
}

/// NURand's A and standard range for customer ids, items and last names.
pub const NURAND_CUSTOMER: (u32, u32) = (1023, 3000);
pub const NURAND_ITEM: (u32, u32) = (8191, 100_000);
pub const NURAND_LAST_NAME: (u32, u32) = (255, 1000);

fn seeded(seed: u64, what: u64, w: u32) -> Rng {
    Rng::seed_from_u64(
        seed ^ what.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(w).wrapping_mul(0xD1B5_4A32_D192_ED03),
    )
}

impl WarehouseDb {
    /// Warehouse `w` of a database populated from `seed` (the same seed and scale always give
    /// the same tables).
    pub fn populate(scale: &TpccScale, seed: u64, w: u32) -> WarehouseDb {
        let mut items_rng = seeded(seed, 1, 0);
        let item_price_cents = (0..scale.items).map(|_| items_rng.random_range(100..=10_000)).collect();
        let rng = &mut seeded(seed, 2, w);
        let names = scale.last_names();
        let name_constant = rng.random_range(0..=NURAND_LAST_NAME.0);
        let customers_per_warehouse =
            i64::from(scale.districts_per_warehouse) * i64::from(scale.customers_per_district);
        let districts = (0..scale.districts_per_warehouse)
            .map(|d| {
                let customers: Vec<Customer> = (0..scale.customers_per_district)
                    .map(|c| Customer {
                        last_name: if c < names {
                            c
                        } else {
                            nurand(rng, NURAND_LAST_NAME.0, NURAND_LAST_NAME.1, names, name_constant)
                        },
                        first_name: rng.random(),
                        credit_bad: rng.random_range(0..10) == 0,
                        discount_bp: rng.random_range(0..=5_000),
                        balance_cents: -OPENING_PAYMENT_CENTS,
                        ytd_payment_cents: OPENING_PAYMENT_CENTS,
                        payment_cnt: 1,
                        delivery_cnt: 0,
                    })
                    .collect();
                let history = (0..scale.customers_per_district)
                    .map(|c| HistoryRow {
                        customer_w: w,
                        customer_d: d,
                        customer: CustomerRef::Id(c),
                        amount_cents: OPENING_PAYMENT_CENTS,
                        date: 0,
                    })
                    .collect();
                let mut district = District {
                    tax_bp: rng.random_range(0..=2_000),
                    ytd_cents: i64::from(scale.customers_per_district) * OPENING_PAYMENT_CENTS,
                    next_order: 1,
                    by_last_name: Vec::new(),
                    customers,
                    orders: Vec::new(),
                    new_orders: VecDeque::new(),
                    last_order_of: vec![0; scale.customers_per_district as usize],
                    history,
                };
                district.index_last_names(names);
                district.populate_orders(scale, w, rng);
                district
            })
            .collect();
        WarehouseDb {
            w,
            tax_bp: rng.random_range(0..=2_000),
            ytd_cents: customers_per_warehouse * OPENING_PAYMENT_CENTS,
            districts,
            item_price_cents,
            stock: (0..scale.items)
                .map(|_| Stock { quantity: rng.random_range(10..=100), ytd: 0, order_cnt: 0, remote_cnt: 0 })
                .collect(),
        }
    }
}

impl District {
    fn index_last_names(&mut self, names: u32) {
        let mut by_name: Vec<Vec<u32>> = vec![Vec::new(); names as usize];
        for (c, customer) in self.customers.iter().enumerate() {
            by_name[customer.last_name as usize].push(c as u32);
        }
        for ids in &mut by_name {
            ids.sort_by_key(|&c| (self.customers[c as usize].first_name, c));
        }
        self.by_last_name = by_name;
    }

    /// The customer a by-name lookup picks (TPC-C 2.5.2.2: the one at position ⌈n / 2⌉ of
    /// those with the name, sorted by first name), if any has it.
    pub fn customer_by_last_name(&self, last_name: u32) -> Option<u32> {
        let ids = self.by_last_name.get(last_name as usize)?;
        (!ids.is_empty()).then(|| ids[(ids.len() - 1) / 2])
    }

    fn populate_orders(&mut self, scale: &TpccScale, w: u32, rng: &mut Rng) {
        let n = scale.initial_orders_per_district;
        let undelivered_from = n - n * UNDELIVERED_INITIAL_PERCENT / 100 + 1;
        let mut permutation: Vec<u32> = Vec::new();
        for o in 1..=n {
            if permutation.is_empty() {
                permutation = (0..scale.customers_per_district).collect();
                for k in (1..permutation.len()).rev() {
                    permutation.swap(k, rng.random_range(0..=k));
                }
            }
            let customer = permutation.pop().expect("refilled above");
            let delivered = o < undelivered_from;
            let lines = (0..rng.random_range(5..=15))
                .map(|_| OrderLine {
                    item: rng.random_range(0..scale.items),
                    supply_w: w,
                    quantity: 5,
                    amount_cents: if delivered { 0 } else { rng.random_range(1..=999_999) },
                    delivery_date: delivered.then_some(0),
                })
                .collect();
            self.orders.push(Order {
                customer,
                entry_date: 0,
                carrier: delivered.then(|| rng.random_range(1..=10)),
                all_local: true,
                lines,
            });
            if !delivered {
                self.new_orders.push_back(o);
            }
            self.last_order_of[customer as usize] = o;
        }
        self.next_order = n + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn population_is_deterministic_and_shaped_like_tpcc() {
        let scale = TpccScale::small(2, 100);
        let a = WarehouseDb::populate(&scale, 7, 1);
        assert_eq!(a, WarehouseDb::populate(&scale, 7, 1));
        assert_ne!(a, WarehouseDb::populate(&scale, 8, 1));
        assert_eq!(a.item_price_cents, WarehouseDb::populate(&scale, 7, 0).item_price_cents, "one item table");
        assert_eq!(a.districts.len(), 10);
        let d = &a.districts[3];
        assert_eq!((d.orders.len(), d.next_order), (30, 31));
        assert_eq!(d.new_orders.iter().copied().collect::<Vec<_>>(), (22..=30).collect::<Vec<_>>());
        assert!(d.orders.iter().all(|o| (5..=15).contains(&o.lines.len())));
        // Every last name exists, and a lookup picks the middle one by first name.
        assert!((0..scale.last_names()).all(|n| d.customer_by_last_name(n).is_some()));
        assert_eq!(d.customer_by_last_name(scale.last_names()), None);
        let ids = &d.by_last_name[0];
        let picked = d.customer_by_last_name(0).unwrap();
        assert_eq!(picked, ids[(ids.len() - 1) / 2]);
        // Each customer has exactly one initial order (30 orders, 30 customers).
        assert!(d.last_order_of.iter().all(|o| *o > 0));
    }

    #[test]
    fn nurand_stays_in_range_and_skews() {
        let mut rng = Rng::seed_from_u64(1);
        let mut hits = vec![0u32; 300];
        for _ in 0..30_000 {
            hits[nurand(&mut rng, NURAND_CUSTOMER.0, NURAND_CUSTOMER.1, 300, 17) as usize] += 1;
        }
        let (min, max) = (hits.iter().min().unwrap(), hits.iter().max().unwrap());
        assert!(*max > 3 * min.max(&1), "NURand should be non-uniform: {min}..{max}");
        assert_eq!(nurand(&mut rng, 255, 1000, 1, 5), 0);
    }
}
