//! A TPC-C transaction's input ([`TpccTxn`]) and the terminal that draws them
//! ([`TpccTerminal`], TPC-C clauses 2.4–2.8 at the scale of [`TpccScale`]).
//!
//! Left out of the standard: new-order's 1 % of rollbacks (an unused item id that aborts the
//! transaction) — an abort that only the home warehouse can see, which one-shot protocols
//! cannot apply to the other warehouses' stock pieces; and keying and think times (load is
//! open-loop, as in the paper's harness).

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::db::{nurand, NURAND_CUSTOMER, NURAND_ITEM, NURAND_LAST_NAME};
use super::piece::split;
use super::scale::{DeliveryScope, TpccMix, TpccScale};
use super::TxnType;
use crate::micro::{TxnSource, TxnWork};
use crate::txn::Key;

/// Share of payments made by a customer of another warehouse (TPC-C: 15 %).
pub const REMOTE_PAYMENT_PERCENT: u32 = 15;
/// Share of new-order lines supplied by another warehouse (TPC-C: 1 %).
pub const REMOTE_LINE_PERCENT: u32 = 1;
/// Share of payments and order-status that name the customer by last name (TPC-C: 60 %).
pub const BY_LAST_NAME_PERCENT: u32 = 60;

/// How a transaction names its customer.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CustomerRef {
    Id(u32),
    /// By last name (index), resolved by a pre-read before the transaction runs.
    LastName(u32),
}

/// One new-order line.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewOrderLine {
    pub item: u32,
    pub supply_w: u32,
    pub quantity: u32,
}

/// A TPC-C transaction's input. Dates are the terminal's clock reading when it drew the
/// transaction, so every replica that runs it writes the same rows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TpccTxn {
    NewOrder {
        w: u32,
        d: u32,
        customer: u32,
        lines: Vec<NewOrderLine>,
        date: u64,
    },
    /// Paid at district `(w, d)` by a customer of district `(customer_w, customer_d)`.
    Payment {
        w: u32,
        d: u32,
        customer_w: u32,
        customer_d: u32,
        customer: CustomerRef,
        amount_cents: i64,
        date: u64,
    },
    OrderStatus {
        w: u32,
        d: u32,
        customer: CustomerRef,
    },
    /// Delivers the oldest undelivered order of `district` of warehouse `w`, or of each of its
    /// districts when `None` ([`DeliveryScope`]).
    Delivery {
        w: u32,
        district: Option<u32>,
        carrier: u32,
        date: u64,
    },
    StockLevel {
        w: u32,
        d: u32,
        threshold: u32,
    },
}

impl TpccTxn {
    pub fn txn_type(&self) -> TxnType {
        match self {
            TpccTxn::NewOrder { .. } => TxnType::NewOrder,
            TpccTxn::Payment { .. } => TxnType::Payment,
            TpccTxn::OrderStatus { .. } => TxnType::OrderStatus,
            TpccTxn::Delivery { .. } => TxnType::Delivery,
            TpccTxn::StockLevel { .. } => TxnType::StockLevel,
        }
    }

    /// The pre-read a transaction needs before it can run as a one-shot transaction: the
    /// district `(w, d)` and last name to look a customer up by (see [`super::piece`]).
    pub fn pre_read(&self) -> Option<(u32, u32, u32)> {
        match *self {
            TpccTxn::Payment { customer_w, customer_d, customer: CustomerRef::LastName(n), .. } => {
                Some((customer_w, customer_d, n))
            }
            TpccTxn::OrderStatus { w, d, customer: CustomerRef::LastName(n) } => Some((w, d, n)),
            _ => None,
        }
    }

    /// The transaction with its by-name customer replaced by the id a pre-read found.
    pub fn resolved(mut self, id: u32) -> TpccTxn {
        if let TpccTxn::Payment { customer, .. } | TpccTxn::OrderStatus { customer, .. } = &mut self {
            *customer = CustomerRef::Id(id);
        }
        self
    }
}

/// Draws TPC-C transactions for terminals spread over all warehouses (the paper's
/// coordinators are not bound to a warehouse: each transaction's home warehouse is uniform).
#[derive(Clone, Debug)]
pub struct TpccTerminal {
    pub scale: TpccScale,
    pub mix: TpccMix,
    /// How much a delivery delivers ([`TpccTerminal::new`]: one district, the paper's).
    pub delivery: DeliveryScope,
    /// NURand's run constants for customer ids, items and last names (clause 2.1.6).
    constants: (u32, u32, u32),
}

impl TpccTerminal {
    /// A terminal whose NURand constants are drawn from `rng` (draw them from the run's seed
    /// so that every terminal of a run uses the same ones).
    pub fn new(scale: TpccScale, mix: TpccMix, rng: &mut impl Rng) -> TpccTerminal {
        let constants = (
            rng.random_range(0..=NURAND_CUSTOMER.0),
            rng.random_range(0..=NURAND_ITEM.0),
            rng.random_range(0..=NURAND_LAST_NAME.0),
        );
        TpccTerminal { scale, mix, delivery: DeliveryScope::default(), constants }
    }

    fn customer(&self, rng: &mut impl Rng) -> u32 {
        nurand(rng, NURAND_CUSTOMER.0, NURAND_CUSTOMER.1, self.scale.customers_per_district, self.constants.0)
    }

    fn customer_ref(&self, rng: &mut impl Rng) -> CustomerRef {
        if rng.random_range(0..100) < BY_LAST_NAME_PERCENT {
            let n = nurand(rng, NURAND_LAST_NAME.0, NURAND_LAST_NAME.1, self.scale.last_names(), self.constants.2);
            CustomerRef::LastName(n)
        } else {
            CustomerRef::Id(self.customer(rng))
        }
    }

    /// A warehouse other than `w`, if there is one.
    fn other_warehouse(&self, w: u32, rng: &mut impl Rng) -> Option<u32> {
        (self.scale.warehouses > 1).then(|| (w + rng.random_range(1..self.scale.warehouses)) % self.scale.warehouses)
    }

    /// The next transaction, drawn at terminal clock reading `date`.
    pub fn next(&self, rng: &mut impl Rng, date: u64) -> TpccTxn {
        let s = &self.scale;
        let w = rng.random_range(0..s.warehouses);
        let d = rng.random_range(0..s.districts_per_warehouse);
        match self.mix.pick(rng) {
            TxnType::NewOrder => {
                let customer = self.customer(rng);
                let count = rng.random_range(5..=15usize).min(s.items as usize);
                let mut lines: Vec<NewOrderLine> = Vec::with_capacity(count);
                while lines.len() < count {
                    let item = nurand(rng, NURAND_ITEM.0, NURAND_ITEM.1, s.items, self.constants.1);
                    if lines.iter().any(|l| l.item == item) {
                        continue;
                    }
                    let remote = rng.random_range(0..100) < REMOTE_LINE_PERCENT;
                    let supply_w = if remote { self.other_warehouse(w, rng).unwrap_or(w) } else { w };
                    lines.push(NewOrderLine { item, supply_w, quantity: rng.random_range(1..=10) });
                }
                TpccTxn::NewOrder { w, d, customer, lines, date }
            }
            TxnType::Payment => {
                let remote = rng.random_range(0..100) < REMOTE_PAYMENT_PERCENT;
                let (customer_w, customer_d) = match self.other_warehouse(w, rng).filter(|_| remote) {
                    Some(cw) => (cw, rng.random_range(0..s.districts_per_warehouse)),
                    None => (w, d),
                };
                let customer = self.customer_ref(rng);
                TpccTxn::Payment {
                    w,
                    d,
                    customer_w,
                    customer_d,
                    customer,
                    amount_cents: rng.random_range(100..=500_000),
                    date,
                }
            }
            TxnType::OrderStatus => TpccTxn::OrderStatus { w, d, customer: self.customer_ref(rng) },
            TxnType::Delivery => {
                let district = (self.delivery == DeliveryScope::District).then_some(d);
                TpccTxn::Delivery { w, district, carrier: rng.random_range(1..=10), date }
            }
            TxnType::StockLevel => TpccTxn::StockLevel { w, d, threshold: rng.random_range(10..=20) },
        }
    }
}

/// A coordinator's TPC-C transactions as a [`TxnSource`]: each drawn by a [`TpccTerminal`] and
/// split into its pieces, with the conflict keys of all of them as the transaction's keys.
#[derive(Clone, Debug)]
pub struct TpccSource {
    pub terminal: TpccTerminal,
}

impl TxnSource for TpccSource {
    fn next_keys(&mut self, rng: &mut kairos_core::Rng) -> Vec<Key> {
        self.next_txn(rng, 0).keys
    }

    fn next_txn(&mut self, rng: &mut kairos_core::Rng, date_ns: u64) -> TxnWork {
        let txn = self.terminal.next(rng, date_ns);
        let kind = TxnType::ALL.iter().position(|t| *t == txn.txn_type()).map(|i| i as u8);
        let pieces = split(&txn);
        let scale = &self.terminal.scale;
        let mut keys: Vec<Key> = pieces.iter().flat_map(|p| p.keys(scale)).map(|(k, _)| k.encode(scale)).collect();
        keys.sort_unstable();
        keys.dedup();
        TxnWork { keys, pieces: pieces.into(), kind }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kairos_core::Rng as SeededRng;
    use rand::SeedableRng;

    #[test]
    fn draws_have_tpccs_shape() {
        let rng = &mut SeededRng::seed_from_u64(5);
        let term = TpccTerminal::new(TpccScale::default(), TpccMix::default(), rng);
        let (mut payments, mut remote_payments, mut by_name, mut lines, mut remote_lines) = (0, 0, 0, 0, 0);
        for t in 0..20_000 {
            match term.next(rng, t) {
                TpccTxn::Payment { w, customer_w, customer, .. } => {
                    payments += 1;
                    remote_payments += u32::from(w != customer_w);
                    by_name += u32::from(matches!(customer, CustomerRef::LastName(_)));
                }
                TpccTxn::NewOrder { w, lines: ls, .. } => {
                    assert!((5..=15).contains(&ls.len()));
                    let mut items: Vec<u32> = ls.iter().map(|l| l.item).collect();
                    items.sort_unstable();
                    items.dedup();
                    assert_eq!(items.len(), ls.len(), "an order names an item once");
                    lines += ls.len();
                    remote_lines += ls.iter().filter(|l| l.supply_w != w).count();
                }
                _ => {}
            }
        }
        let pct = |a: u32, b: u32| f64::from(a) * 100.0 / f64::from(b);
        assert!((pct(remote_payments, payments) - 15.0).abs() < 1.5, "{remote_payments}/{payments}");
        assert!((pct(by_name, payments) - 60.0).abs() < 2.0);
        assert!((pct(remote_lines as u32, lines as u32) - 1.0).abs() < 0.3, "{remote_lines}/{lines}");
    }

    #[test]
    fn a_lone_warehouse_pays_and_supplies_itself() {
        let rng = &mut SeededRng::seed_from_u64(6);
        let scale = TpccScale { warehouses: 1, ..TpccScale::default() };
        let term = TpccTerminal::new(scale, TpccMix::default(), rng);
        for t in 0..2_000 {
            match term.next(rng, t) {
                TpccTxn::Payment { customer_w, .. } => assert_eq!(customer_w, 0),
                TpccTxn::NewOrder { lines, .. } => assert!(lines.iter().all(|l| l.supply_w == 0)),
                _ => {}
            }
        }
    }

    #[test]
    fn resolving_names_the_customer_by_id() {
        let t = TpccTxn::OrderStatus { w: 1, d: 2, customer: CustomerRef::LastName(9) };
        assert_eq!(t.pre_read(), Some((1, 2, 9)));
        let r = t.resolved(4);
        assert_eq!(r, TpccTxn::OrderStatus { w: 1, d: 2, customer: CustomerRef::Id(4) });
        assert_eq!(r.pre_read(), None);
    }
}
