//! TPC-C's consistency conditions (clause 3.3.2), checked over a whole database (one
//! [`WarehouseDb`] per warehouse, from one replica each) at the end of a run: they catch
//! what a protocol that lost, doubled or half-applied a transaction leaves behind, which a
//! history over conflict keys alone might not show.
//!
//! Checked: 1 (warehouse year-to-date = sum of its districts'), 2 (next order id − 1 = the
//! highest order id = the highest new-order id), 3 (new-order ids are contiguous), 5 (an order
//! has a carrier exactly when it has no new-order row), 7 (its lines have a delivery date
//! exactly when it has a carrier), 8 and 9 (warehouse and district year-to-date = sum of their
//! history rows), 10 and 12 (a customer's balance = delivered amounts − payments, and its
//! balance plus year-to-date payment = delivered amounts, payments counted across every
//! warehouse's history), and one of Kairos's own: a customer's payment count equals its history rows.
//!
//! Conditions 4 and 6 (order-line counts) hold by construction here: an order holds its lines.

use super::db::WarehouseDb;
use super::input::CustomerRef;
use super::scale::TpccScale;

/// Violations reported in full at most (the count is always exact).
pub const VIOLATIONS_SHOWN_MAX: usize = 20;

/// The outcome of [`check`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsistencyReport {
    /// Conditions evaluated (one per condition and warehouse, district, order or customer).
    pub checked: u64,
    pub violations: u64,
    /// The first [`VIOLATIONS_SHOWN_MAX`] violations, described.
    pub shown: Vec<String>,
}

impl ConsistencyReport {
    pub fn holds(&self) -> bool {
        self.violations == 0
    }

    fn expect(&mut self, ok: bool, what: impl FnOnce() -> String) {
        self.checked += 1;
        if !ok {
            self.violations += 1;
            if self.shown.len() < VIOLATIONS_SHOWN_MAX {
                self.shown.push(what());
            }
        }
    }
}

/// Checks the conditions over `dbs`, where `dbs[w]` is warehouse `w`.
pub fn check(scale: &TpccScale, dbs: &[&WarehouseDb]) -> ConsistencyReport {
    let mut r = ConsistencyReport::default();
    r.expect(dbs.len() == scale.warehouses as usize, || {
        format!("{} warehouses given, the scale has {}", dbs.len(), scale.warehouses)
    });
    let (districts, customers) = (scale.districts_per_warehouse as usize, scale.customers_per_district as usize);
    let customer_index = |w: u32, d: u32, c: u32| (w as usize * districts + d as usize) * customers + c as usize;
    // Payments per customer (sum, count), over every warehouse's history.
    let mut paid = vec![(0i64, 0u32); dbs.len() * districts * customers];
    for db in dbs {
        for h in db.districts.iter().flat_map(|d| &d.history) {
            let district = dbs.get(h.customer_w as usize).and_then(|cw| cw.districts.get(h.customer_d as usize));
            let customer = district.and_then(|dist| match h.customer {
                CustomerRef::Id(c) => ((c as usize) < dist.customers.len()).then_some(c),
                CustomerRef::LastName(n) => dist.customer_by_last_name(n),
            });
            r.expect(customer.is_some(), || format!("warehouse {}: a history row names no customer: {h:?}", db.w));
            if let Some(c) = customer {
                let p = &mut paid[customer_index(h.customer_w, h.customer_d, c)];
                p.0 += h.amount_cents;
                p.1 += 1;
            }
        }
    }
    for (w, db) in dbs.iter().enumerate() {
        let w = w as u32;
        r.expect(db.w == w, || format!("warehouse {} given in place of {w}", db.w));
        let district_ytd: i64 = db.districts.iter().map(|d| d.ytd_cents).sum();
        r.expect(db.ytd_cents == district_ytd, || {
            format!("1: warehouse {w} year-to-date {} ≠ its districts' {district_ytd}", db.ytd_cents)
        });
        let history: i64 = db.districts.iter().flat_map(|d| &d.history).map(|h| h.amount_cents).sum();
        r.expect(db.ytd_cents == history, || {
            format!("8: warehouse {w} year-to-date {} ≠ its history's {history}", db.ytd_cents)
        });
        for (d, dist) in db.districts.iter().enumerate() {
            let at = || format!("district {w}/{d}");
            let max_order = dist.orders.len() as u32;
            r.expect(dist.next_order == max_order + 1, || {
                format!("2: {} next order {} but highest order {max_order}", at(), dist.next_order)
            });
            if let (Some(&first), Some(&last)) = (dist.new_orders.front(), dist.new_orders.back()) {
                r.expect(last == max_order, || {
                    format!("2: {} highest new-order {last} ≠ highest order {max_order}", at())
                });
                let contiguous = dist.new_orders.iter().zip(first..).all(|(&o, expected)| o == expected);
                r.expect(contiguous && last + 1 - first == dist.new_orders.len() as u32, || {
                    format!("3: {} new-orders {first}..={last} are not {} contiguous ids", at(), dist.new_orders.len())
                });
            }
            let history: i64 = dist.history.iter().map(|h| h.amount_cents).sum();
            r.expect(dist.ytd_cents == history, || {
                format!("9: {} year-to-date {} ≠ its history's {history}", at(), dist.ytd_cents)
            });
            let undelivered_from = dist.new_orders.front().copied().unwrap_or(max_order + 1);
            let mut delivered = vec![0i64; customers];
            for (i, order) in dist.orders.iter().enumerate() {
                let o = i as u32 + 1;
                let has_new_order = o >= undelivered_from;
                r.expect(order.carrier.is_none() == has_new_order, || {
                    format!("5: {} order {o}: carrier {:?}, new-order row {has_new_order}", at(), order.carrier)
                });
                let dated = order.lines.iter().filter(|l| l.delivery_date.is_some()).count();
                let want = if order.carrier.is_some() { order.lines.len() } else { 0 };
                r.expect(dated == want, || {
                    format!(
                        "7: {} order {o}: {dated} of {} lines dated, carrier {:?}",
                        at(),
                        order.lines.len(),
                        order.carrier
                    )
                });
                if order.carrier.is_some() {
                    if let Some(sum) = delivered.get_mut(order.customer as usize) {
                        *sum += order.lines.iter().map(|l| l.amount_cents).sum::<i64>();
                    }
                }
            }
            for (c, cust) in dist.customers.iter().enumerate() {
                let (payments, count) = paid.get(customer_index(w, d as u32, c as u32)).copied().unwrap_or_default();
                let who = || format!("customer {w}/{d}/{c}");
                r.expect(cust.balance_cents == delivered[c] - payments, || {
                    format!(
                        "10: {} balance {} ≠ delivered {} − paid {payments}",
                        who(),
                        cust.balance_cents,
                        delivered[c]
                    )
                });
                r.expect(cust.balance_cents + cust.ytd_payment_cents == delivered[c], || {
                    format!(
                        "12: {} balance {} + year-to-date payment {} ≠ delivered {}",
                        who(),
                        cust.balance_cents,
                        cust.ytd_payment_cents,
                        delivered[c]
                    )
                });
                r.expect(cust.payment_cnt == count, || {
                    format!("{} counts {} payments, the history {count}", who(), cust.payment_cnt)
                });
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tpcc::input::{TpccTerminal, TpccTxn};
    use crate::tpcc::piece::{execute, look_up_customer, split, Step};
    use crate::tpcc::scale::TpccMix;
    use kairos_core::Rng;
    use rand::SeedableRng;

    fn small() -> TpccScale {
        TpccScale::small(3, 200)
    }

    /// Runs `n` transactions one after another (pre-reads resolved), as a serial reference.
    fn run_serially(scale: &TpccScale, dbs: &mut [WarehouseDb], n: u64, seed: u64) {
        let rng = &mut Rng::seed_from_u64(seed);
        let terminal = TpccTerminal::new(*scale, TpccMix::default(), rng);
        for t in 0..n {
            let mut txn = terminal.next(rng, t + 1);
            // Half of the by-name customers are looked up first (the pre-read of a
            // multi-shot transaction), half resolved by the piece itself.
            if let Some((w, d, name)) = txn.pre_read().filter(|_| t % 2 == 0) {
                txn = txn.resolved(look_up_customer(&dbs[w as usize], d, name).unwrap());
            }
            for piece in split(&txn) {
                execute(&mut dbs[piece.w as usize], &piece).unwrap();
            }
        }
    }

    fn refs(dbs: &[WarehouseDb]) -> Vec<&WarehouseDb> {
        dbs.iter().collect()
    }

    #[test]
    fn a_fresh_database_and_a_serial_run_are_consistent() {
        let scale = small();
        let mut dbs: Vec<WarehouseDb> = (0..3).map(|w| WarehouseDb::populate(&scale, 4, w)).collect();
        let fresh = check(&scale, &refs(&dbs));
        assert!(fresh.holds(), "{:?}", fresh.shown);
        run_serially(&scale, &mut dbs, 3_000, 4);
        let after = check(&scale, &refs(&dbs));
        assert!(after.holds(), "{:?}", after.shown);
        assert!(after.checked > 3 * 10 * 30 * 3, "every customer's conditions were evaluated");
        assert!(dbs.iter().all(|db| db.districts.iter().any(|d| d.orders.len() > 30)), "new orders were placed");
    }

    #[test]
    fn lost_doubled_and_half_applied_transactions_are_caught() {
        let scale = small();
        let base: Vec<WarehouseDb> = (0..3).map(|w| WarehouseDb::populate(&scale, 4, w)).collect();
        let pay = |cw| TpccTxn::Payment {
            w: 0,
            d: 1,
            customer_w: cw,
            customer_d: 2,
            customer: crate::tpcc::input::CustomerRef::Id(5),
            amount_cents: 700,
            date: 1,
        };
        // A remote payment whose customer piece was lost (condition 10 and the count).
        let mut dbs = base.clone();
        let pieces = split(&pay(1));
        execute(&mut dbs[0], &pieces[0]).unwrap();
        let r = check(&scale, &refs(&dbs));
        assert_eq!(r.violations, 2, "{:?}", r.shown);
        assert!(r.shown[0].starts_with("10: customer 1/2/5"));
        assert!(r.shown[1].contains("counts 1 payments, the history 2"));
        // A payment applied twice at its home warehouse only.
        let mut dbs = base.clone();
        let pieces = split(&pay(1));
        for p in [&pieces[0], &pieces[0], &pieces[1]] {
            execute(&mut dbs[p.w as usize], p).unwrap();
        }
        assert!(!check(&scale, &refs(&dbs)).holds());
        // A district year-to-date updated without its history row (conditions 1, 9).
        let mut dbs = base.clone();
        dbs[2].districts[3].ytd_cents += 1;
        let r = check(&scale, &refs(&dbs));
        assert_eq!(r.violations, 2, "{:?}", r.shown);
        // A delivery replayed on one district by hand: a delivered order back in new-orders.
        let mut dbs = base.clone();
        let oldest = dbs[1].districts[0].new_orders[0];
        execute(
            &mut dbs[1],
            &crate::tpcc::piece::Piece { w: 1, steps: vec![Step::Delivery { district: None, carrier: 2, date: 3 }] },
        )
        .unwrap();
        dbs[1].districts[0].new_orders.push_front(oldest);
        assert!(check(&scale, &refs(&dbs)).shown.iter().any(|v| v.starts_with("5: district 1/0")));
        // An order id skipped.
        let mut dbs = base;
        dbs[0].districts[0].next_order += 1;
        assert!(check(&scale, &refs(&dbs)).shown.iter().any(|v| v.starts_with("2: district 0/0")));
    }
}
