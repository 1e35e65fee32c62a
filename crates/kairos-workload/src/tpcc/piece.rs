//! How a TPC-C transaction runs as a one-shot transaction: split into one [`Piece`] per
//! warehouse it touches, each a stored procedure that warehouse's shard runs on its
//! [`WarehouseDb`] with [`execute`], given the [conflict keys](super::keys) it declares
//! ([`Piece::keys`]) before anything runs.
//!
//! # One-shot, multi-shot
//! New-order, delivery and stock-level are one-shot, as in the Tiga paper: what they read
//! decides only rows of the warehouse that reads it (new-order's order id comes from its
//! district and names rows of that district; delivery's customers are those of its districts'
//! oldest orders; stock-level reads its own warehouse's stock), and those rows lie under keys
//! the piece declares. The paper runs payment and order-status by last name (60 % of them) as
//! multi-shot: a **pre-read** at the shard leader of the customer's warehouse
//! ([`look_up_customer`]) finds the customer id, then the transaction runs one-shot with that
//! id ([`TpccTxn::resolved`]); every protocol here does so, as a round trip of its own before
//! the first attempt ([`super::pre_read`]). A piece may still carry the name (a deployment
//! without pre-reads, or a name no customer has) and then resolves it where the customer
//! lives; TPC-C never adds a customer or changes a name, so both ways pick the same customer
//! and a lookup can never go stale (the one-shot part has nothing to validate).
//!
//! # What a piece may read without declaring it
//! The warehouse's and districts' tax rates, item prices and customers' discounts never
//! change. Stock-level reads the stock rows of the items of its district's last 20 orders,
//! which it cannot name beforehand; TPC-C (clause 3.4.0.1) lets stock-level read them at a
//! weaker isolation level (committed data only), which every protocol here gives, so those
//! reads are neither declared nor recorded in the history.
//!
//! # Bad input
//! A piece that names a district, customer or item the warehouse does not have, or a quantity,
//! carrier or amount outside TPC-C's ranges, is refused with a [`PieceError`] before any row
//! changes, on every replica alike.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::db::{Customer, Stock, WarehouseDb};
use super::input::{CustomerRef, NewOrderLine, TpccTxn};
use super::keys::ConflictKey;
use super::scale::TpccScale;

/// Orders a stock-level transaction looks back over (TPC-C: 20).
pub const STOCK_LEVEL_ORDERS: u32 = 20;
/// Largest payment, cents (TPC-C: 5,000.00).
pub const PAYMENT_CENTS_MAX: i64 = 500_000;
/// Largest quantity of a new-order line (TPC-C: 10).
pub const LINE_QUANTITY_MAX: u32 = 10;

#[derive(Debug, Error, PartialEq, Eq, Clone, Serialize, Deserialize)]
pub enum PieceError {
    #[error("a piece for warehouse {piece} reached warehouse {db}")]
    WrongWarehouse { piece: u32, db: u32 },
    #[error("warehouse {w} has no {what} {id}")]
    NoSuch { w: u32, what: &'static str, id: u32 },
    #[error("{what} {got} is outside TPC-C's range")]
    OutOfRange { what: &'static str, got: i64 },
    #[error("district {w}/{d} has no customer named {last_name}")]
    NoSuchName { w: u32, d: u32, last_name: u32 },
}

/// Whether a piece only reads a key or also writes it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Access {
    Read,
    Write,
}

/// One step of a piece, run by the warehouse the piece is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    /// New-order at its home warehouse: take the district's next order id and insert the
    /// order, its new-order row and its lines (amounts from the item prices).
    NewOrder {
        d: u32,
        customer: u32,
        lines: Vec<NewOrderLine>,
        date: u64,
    },
    /// New-order's stock update for one of its lines, at the supplying warehouse.
    Stock {
        item: u32,
        quantity: u32,
        remote: bool,
    },
    /// Payment at its home warehouse: the warehouse's and district's year-to-date and the
    /// history row.
    PaymentAt {
        d: u32,
        customer_w: u32,
        customer_d: u32,
        customer: CustomerRef,
        amount_cents: i64,
        date: u64,
    },
    /// Payment at the customer's warehouse: the customer's balance.
    PaymentBy {
        d: u32,
        customer: CustomerRef,
        amount_cents: i64,
    },
    OrderStatus {
        d: u32,
        customer: CustomerRef,
    },
    /// Deliver the oldest undelivered order of `district`, or of every district when `None`
    /// (see [`crate::tpcc::DeliveryScope`]).
    Delivery {
        district: Option<u32>,
        carrier: u32,
        date: u64,
    },
    StockLevel {
        d: u32,
        threshold: u32,
    },
}

/// What a step returns to the client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepOutput {
    NewOrder { order: u32, total_cents: i64 },
    Stock { quantity: u32 },
    PaymentAt,
    PaymentBy { balance_cents: i64 },
    OrderStatus { balance_cents: i64, order: u32, carrier: Option<u32>, lines: u32 },
    Delivery { delivered: u32 },
    StockLevel { low: u32 },
}

/// What one warehouse runs of a transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    pub w: u32,
    pub steps: Vec<Step>,
}

/// The pre-read of a multi-shot transaction: the id of the customer of district `d` a by-name
/// lookup picks (TPC-C 2.5.2.2), run at the leader of the customer's warehouse's shard.
pub fn look_up_customer(db: &WarehouseDb, d: u32, last_name: u32) -> Option<u32> {
    db.districts.get(d as usize)?.customer_by_last_name(last_name)
}

/// The pieces of a transaction, in warehouse order.
pub fn split(txn: &TpccTxn) -> Vec<Piece> {
    let mut pieces: Vec<Piece> = Vec::new();
    let mut add = |w: u32, step: Step| match pieces.iter_mut().find(|p| p.w == w) {
        Some(p) => p.steps.push(step),
        None => pieces.push(Piece { w, steps: vec![step] }),
    };
    match txn {
        TpccTxn::NewOrder { w, d, customer, lines, date } => {
            add(*w, Step::NewOrder { d: *d, customer: *customer, lines: lines.clone(), date: *date });
            for l in lines {
                add(l.supply_w, Step::Stock { item: l.item, quantity: l.quantity, remote: l.supply_w != *w });
            }
        }
        TpccTxn::Payment { w, d, customer_w, customer_d, customer, amount_cents, date } => {
            let (customer, customer_w, customer_d, amount_cents) = (*customer, *customer_w, *customer_d, *amount_cents);
            add(*w, Step::PaymentAt { d: *d, customer_w, customer_d, customer, amount_cents, date: *date });
            add(customer_w, Step::PaymentBy { d: customer_d, customer, amount_cents });
        }
        TpccTxn::OrderStatus { w, d, customer } => add(*w, Step::OrderStatus { d: *d, customer: *customer }),
        TpccTxn::Delivery { w, district, carrier, date } => {
            add(*w, Step::Delivery { district: *district, carrier: *carrier, date: *date })
        }
        TpccTxn::StockLevel { w, d, threshold } => add(*w, Step::StockLevel { d: *d, threshold: *threshold }),
    }
    pieces.sort_by_key(|p| p.w);
    pieces
}

impl Piece {
    /// Whether every step only reads (order-status, stock-level): the piece declares its keys
    /// [`Access::Read`] and changes no row.
    pub fn reads_only(&self) -> bool {
        self.steps.iter().all(|s| matches!(s, Step::OrderStatus { .. } | Step::StockLevel { .. }))
    }

    /// Its steps and new-order lines (what its size grows with).
    pub fn weight(&self) -> usize {
        let lines = |s: &Step| if let Step::NewOrder { lines, .. } = s { lines.len() } else { 0 };
        self.steps.iter().map(|s| 1 + lines(s)).sum()
    }

    /// The conflict keys the piece declares, in key order, each once (written if any step
    /// writes it).
    pub fn keys(&self, scale: &TpccScale) -> Vec<(ConflictKey, Access)> {
        use Access::{Read, Write};
        let w = self.w;
        let orders = |d: u32| ConflictKey::DistrictOrders { w, d };
        let customers = |d: u32| ConflictKey::Customers { w, d };
        let mut keys: Vec<(ConflictKey, Access)> = Vec::new();
        for step in &self.steps {
            match *step {
                Step::NewOrder { d, .. } => keys.push((orders(d), Write)),
                Step::Stock { item, .. } => keys.push((ConflictKey::Stock { w, i: item }, Write)),
                // The warehouse's year-to-date is only ever added to: no key (see the keys).
                Step::PaymentAt { d, .. } => keys.push((ConflictKey::DistrictYtd { w, d }, Write)),
                Step::PaymentBy { d, .. } => keys.push((customers(d), Write)),
                Step::OrderStatus { d, .. } => keys.extend([(orders(d), Read), (customers(d), Read)]),
                Step::StockLevel { d, .. } => keys.push((orders(d), Read)),
                Step::Delivery { district, .. } => {
                    for d in delivered_districts(district, scale.districts_per_warehouse) {
                        keys.extend([(orders(d), Write), (customers(d), Write)]);
                    }
                }
            }
        }
        // Write sorts after Read: keep the last of each key's run.
        keys.sort_unstable();
        let mut out: Vec<(ConflictKey, Access)> = Vec::with_capacity(keys.len());
        for (k, a) in keys {
            match out.last_mut() {
                Some(last) if last.0 == k => last.1 = a,
                _ => out.push((k, a)),
            }
        }
        out
    }
}

fn check(db: &WarehouseDb, piece: &Piece) -> Result<(), PieceError> {
    let w = db.w;
    if piece.w != w {
        return Err(PieceError::WrongWarehouse { piece: piece.w, db: w });
    }
    let no = |what, id| PieceError::NoSuch { w, what, id };
    let district = |d: u32| db.districts.get(d as usize).ok_or_else(|| no("district", d));
    let customer = |d: u32, c: u32| district(d)?.customers.get(c as usize).map(|_| ()).ok_or_else(|| no("customer", c));
    let named = |d: u32, c: CustomerRef| resolve(db, d, c).map(|_| ());
    let item = |i: u32| if (i as usize) < db.stock.len() { Ok(()) } else { Err(no("item", i)) };
    let range = |what, got: i64, lo: i64, hi: i64| {
        if (lo..=hi).contains(&got) {
            Ok(())
        } else {
            Err(PieceError::OutOfRange { what, got })
        }
    };
    for step in &piece.steps {
        match step {
            Step::NewOrder { d, customer: c, lines, .. } => {
                customer(*d, *c)?;
                range("order lines", lines.len() as i64, 1, 15)?;
                for l in lines {
                    item(l.item)?;
                    range("quantity", l.quantity.into(), 1, LINE_QUANTITY_MAX.into())?;
                }
            }
            Step::Stock { item: i, quantity, .. } => {
                item(*i)?;
                range("quantity", i64::from(*quantity), 1, LINE_QUANTITY_MAX.into())?;
            }
            Step::PaymentAt { d, amount_cents, .. } => {
                district(*d)?;
                range("payment (cents)", *amount_cents, 1, PAYMENT_CENTS_MAX)?;
            }
            Step::PaymentBy { d, customer: c, amount_cents } => {
                named(*d, *c)?;
                range("payment (cents)", *amount_cents, 1, PAYMENT_CENTS_MAX)?;
            }
            Step::OrderStatus { d, customer: c } => named(*d, *c)?,
            Step::Delivery { district: d, carrier, .. } => {
                if let Some(d) = d {
                    district(*d)?;
                }
                range("carrier", i64::from(*carrier), 1, 10)?;
            }
            Step::StockLevel { d, .. } => district(*d).map(|_| ())?,
        }
    }
    Ok(())
}

/// The districts a delivery step delivers in, of a warehouse with `districts` (it was checked).
fn delivered_districts(district: Option<u32>, districts: u32) -> std::ops::Range<u32> {
    match district {
        Some(d) => d..d + 1,
        None => 0..districts,
    }
}

/// The id of a customer of district `d` of this warehouse, named by id or by last name.
fn resolve(db: &WarehouseDb, d: u32, customer: CustomerRef) -> Result<u32, PieceError> {
    let w = db.w;
    let district = db.districts.get(d as usize).ok_or(PieceError::NoSuch { w, what: "district", id: d })?;
    match customer {
        CustomerRef::Id(c) if (c as usize) < district.customers.len() => Ok(c),
        CustomerRef::Id(c) => Err(PieceError::NoSuch { w, what: "customer", id: c }),
        CustomerRef::LastName(n) => {
            district.customer_by_last_name(n).ok_or(PieceError::NoSuchName { w, d, last_name: n })
        }
    }
}

/// Runs a piece on its warehouse: checks every step first (a refused piece changes nothing),
/// then runs the steps in order.
pub fn execute(db: &mut WarehouseDb, piece: &Piece) -> Result<Vec<StepOutput>, PieceError> {
    check(db, piece)?;
    Ok(piece.steps.iter().map(|s| run(db, piece.w, s)).collect())
}

/// What one step changed, enough to put it back (see [`execute_undoable`]).
#[derive(Clone, Debug, PartialEq, Eq)]
enum StepUndo {
    /// Nothing changed (the read-only steps).
    Nothing,
    /// New-order appended order `next_order - 1` of district `d` and its new-order row, and
    /// made it customer `customer`'s latest order (it was `previous_last`).
    NewOrder {
        d: u32,
        customer: u32,
        previous_last: u32,
    },
    Stock {
        item: u32,
        before: Stock,
    },
    /// Payment added `amount_cents` to the year-to-dates and appended a history row.
    PaymentAt {
        d: u32,
        amount_cents: i64,
    },
    PaymentBy {
        d: u32,
        customer: u32,
        before: Customer,
    },
    /// Delivery delivered these orders (district, order id, customer row before).
    Delivery {
        delivered: Vec<(u32, u32, Customer)>,
    },
}

/// How to revert one [`execute_undoable`]: hand it to [`undo`] before any later piece that
/// shares a conflict key with this one runs (the caller's conflict detection sees to that).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PieceUndo {
    w: u32,
    /// In the order the steps ran.
    steps: Vec<StepUndo>,
}

impl PieceUndo {
    /// Whether reverting it changes nothing (a refused or read-only piece).
    pub fn is_empty(&self) -> bool {
        self.steps.iter().all(|s| *s == StepUndo::Nothing)
    }
}

/// [`execute`], also returning what reverts it (a speculative execution, which a
/// timestamp revision revokes). The rows a piece changes all lie under the keys it declares,
/// so reverting it touches nothing another piece without a shared key has changed since —
/// except the warehouse's year-to-date, which has no key and which any payment adds to: its
/// undo subtracts the amount again, which commutes with every other payment's addition.
pub fn execute_undoable(db: &mut WarehouseDb, piece: &Piece) -> Result<(Vec<StepOutput>, PieceUndo), PieceError> {
    check(db, piece)?;
    let mut undo = PieceUndo { w: piece.w, steps: Vec::with_capacity(piece.steps.len()) };
    let outputs = piece
        .steps
        .iter()
        .map(|step| {
            undo.steps.push(before(db, step));
            run(db, piece.w, step)
        })
        .collect();
    Ok((outputs, undo))
}

/// What `step` is about to change, read before it runs (the step was checked).
fn before(db: &WarehouseDb, step: &Step) -> StepUndo {
    match *step {
        Step::NewOrder { d, customer, .. } => {
            let previous_last = db.districts[d as usize].last_order_of[customer as usize];
            StepUndo::NewOrder { d, customer, previous_last }
        }
        Step::Stock { item, .. } => StepUndo::Stock { item, before: db.stock[item as usize] },
        Step::PaymentAt { d, amount_cents, .. } => StepUndo::PaymentAt { d, amount_cents },
        Step::PaymentBy { d, customer, .. } => {
            let c = resolve(db, d, customer).expect("checked before running");
            StepUndo::PaymentBy { d, customer: c, before: db.districts[d as usize].customers[c as usize].clone() }
        }
        Step::Delivery { district, .. } => StepUndo::Delivery {
            delivered: delivered_districts(district, db.districts.len() as u32)
                .filter_map(|d| {
                    let dist = &db.districts[d as usize];
                    let o = *dist.new_orders.front()?;
                    let c = dist.orders[o as usize - 1].customer;
                    Some((d, o, dist.customers[c as usize].clone()))
                })
                .collect(),
        },
        Step::OrderStatus { .. } | Step::StockLevel { .. } => StepUndo::Nothing,
    }
}

/// Reverts an [`execute_undoable`] of a piece on `db` (its steps, last first).
pub fn undo(db: &mut WarehouseDb, undo: PieceUndo) {
    debug_assert_eq!(undo.w, db.w, "an undo record goes back to its own warehouse");
    for step in undo.steps.into_iter().rev() {
        match step {
            StepUndo::Nothing => {}
            StepUndo::NewOrder { d, customer, previous_last } => {
                let dist = &mut db.districts[d as usize];
                dist.next_order -= 1;
                dist.orders.pop();
                dist.new_orders.pop_back();
                dist.last_order_of[customer as usize] = previous_last;
            }
            StepUndo::Stock { item, before } => db.stock[item as usize] = before,
            StepUndo::PaymentAt { d, amount_cents } => {
                db.ytd_cents -= amount_cents;
                let dist = &mut db.districts[d as usize];
                dist.ytd_cents -= amount_cents;
                dist.history.pop();
            }
            StepUndo::PaymentBy { d, customer, before } => {
                db.districts[d as usize].customers[customer as usize] = before;
            }
            StepUndo::Delivery { delivered } => {
                for (d, o, customer_before) in delivered.into_iter().rev() {
                    let dist = &mut db.districts[d as usize];
                    dist.new_orders.push_front(o);
                    let order = &mut dist.orders[o as usize - 1];
                    order.carrier = None;
                    order.lines.iter_mut().for_each(|l| l.delivery_date = None);
                    let c = order.customer as usize;
                    dist.customers[c] = customer_before;
                }
            }
        }
    }
}

/// `amount × (1 − discount) × (1 + taxes)`, rates in basis points, rounded down to a cent.
fn with_discount_and_taxes(amount_cents: i64, discount_bp: u32, taxes_bp: u32) -> i64 {
    let total = i128::from(amount_cents) * i128::from(10_000 - discount_bp.min(10_000)) * i128::from(10_000 + taxes_bp)
        / 100_000_000;
    total as i64
}

fn run(db: &mut WarehouseDb, w: u32, step: &Step) -> StepOutput {
    match *step {
        Step::NewOrder { d, customer, ref lines, date } => {
            let prices = &db.item_price_cents;
            let order_lines: Vec<super::db::OrderLine> = lines
                .iter()
                .map(|l| super::db::OrderLine {
                    item: l.item,
                    supply_w: l.supply_w,
                    quantity: l.quantity,
                    amount_cents: i64::from(l.quantity) * i64::from(prices[l.item as usize]),
                    delivery_date: None,
                })
                .collect();
            let sum: i64 = order_lines.iter().map(|l| l.amount_cents).sum();
            let warehouse_tax = db.tax_bp;
            let dist = &mut db.districts[d as usize];
            let order = dist.next_order;
            dist.next_order += 1;
            dist.orders.push(super::db::Order {
                customer,
                entry_date: date,
                carrier: None,
                all_local: lines.iter().all(|l| l.supply_w == w),
                lines: order_lines,
            });
            dist.new_orders.push_back(order);
            dist.last_order_of[customer as usize] = order;
            let discount_bp = dist.customers[customer as usize].discount_bp;
            StepOutput::NewOrder {
                order,
                total_cents: with_discount_and_taxes(sum, discount_bp, warehouse_tax + dist.tax_bp),
            }
        }
        Step::Stock { item, quantity, remote } => {
            let s = &mut db.stock[item as usize];
            s.quantity = if s.quantity >= quantity + 10 { s.quantity - quantity } else { s.quantity + 91 - quantity };
            s.ytd += u64::from(quantity);
            s.order_cnt += 1;
            s.remote_cnt += u32::from(remote);
            StepOutput::Stock { quantity: s.quantity }
        }
        Step::PaymentAt { d, customer_w, customer_d, customer, amount_cents, date } => {
            db.ytd_cents += amount_cents;
            let dist = &mut db.districts[d as usize];
            dist.ytd_cents += amount_cents;
            dist.history.push(super::db::HistoryRow { customer_w, customer_d, customer, amount_cents, date });
            StepOutput::PaymentAt
        }
        Step::PaymentBy { d, customer, amount_cents } => {
            let customer = resolve(db, d, customer).expect("checked before running");
            let c = &mut db.districts[d as usize].customers[customer as usize];
            c.balance_cents -= amount_cents;
            c.ytd_payment_cents += amount_cents;
            c.payment_cnt += 1;
            StepOutput::PaymentBy { balance_cents: c.balance_cents }
        }
        Step::OrderStatus { d, customer } => {
            let customer = resolve(db, d, customer).expect("checked before running");
            let dist = &db.districts[d as usize];
            let c = &dist.customers[customer as usize];
            let order = dist.last_order_of[customer as usize];
            let (carrier, lines) = match order.checked_sub(1).and_then(|o| dist.orders.get(o as usize)) {
                Some(o) => (o.carrier, o.lines.len() as u32),
                None => (None, 0),
            };
            StepOutput::OrderStatus { balance_cents: c.balance_cents, order, carrier, lines }
        }
        Step::Delivery { district, carrier, date } => {
            let mut delivered = 0;
            for d in delivered_districts(district, db.districts.len() as u32) {
                let dist = &mut db.districts[d as usize];
                let Some(o) = dist.new_orders.pop_front() else { continue };
                let order = &mut dist.orders[o as usize - 1];
                order.carrier = Some(carrier);
                let mut sum = 0;
                for l in &mut order.lines {
                    l.delivery_date = Some(date);
                    sum += l.amount_cents;
                }
                let c = &mut dist.customers[order.customer as usize];
                c.balance_cents += sum;
                c.delivery_cnt += 1;
                delivered += 1;
            }
            StepOutput::Delivery { delivered }
        }
        Step::StockLevel { d, threshold } => {
            let dist = &db.districts[d as usize];
            let from = dist.next_order.saturating_sub(STOCK_LEVEL_ORDERS).max(1);
            let mut items: Vec<u32> = (from..dist.next_order)
                .flat_map(|o| dist.orders[o as usize - 1].lines.iter().map(|l| l.item))
                .collect();
            items.sort_unstable();
            items.dedup();
            let low = items.iter().filter(|&&i| db.stock[i as usize].quantity < threshold).count() as u32;
            StepOutput::StockLevel { low }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> TpccScale {
        TpccScale::small(2, 100)
    }

    #[test]
    fn a_remote_payment_splits_in_two_and_a_local_one_declares_each_key_once() {
        let txn = |cw| TpccTxn::Payment {
            w: 0,
            d: 1,
            customer_w: cw,
            customer_d: 1,
            customer: CustomerRef::Id(3),
            amount_cents: 500,
            date: 9,
        };
        let remote = split(&txn(1));
        assert_eq!(remote.iter().map(|p| p.w).collect::<Vec<_>>(), [0, 1]);
        let local = split(&txn(0));
        assert_eq!(local.len(), 1);
        let keys = local[0].keys(&small());
        assert_eq!(
            keys,
            [
                (ConflictKey::DistrictYtd { w: 0, d: 1 }, Access::Write),
                (ConflictKey::Customers { w: 0, d: 1 }, Access::Write)
            ]
        );
        let mut db = WarehouseDb::populate(&small(), 1, 0);
        let before = db.districts[1].customers[3].balance_cents;
        let r = execute(&mut db, &local[0]).unwrap();
        assert_eq!(r, [StepOutput::PaymentAt, StepOutput::PaymentBy { balance_cents: before - 500 }]);
        assert_eq!(db.districts[1].customers[3].balance_cents, before - 500);
        // By name: the customer's warehouse resolves it (names never change).
        let by_name = |n| TpccTxn::Payment {
            w: 0,
            d: 1,
            customer_w: 0,
            customer_d: 1,
            customer: CustomerRef::LastName(n),
            amount_cents: 5,
            date: 0,
        };
        let named = look_up_customer(&db, 1, 2).unwrap();
        let before = db.districts[1].customers[named as usize].balance_cents;
        execute(&mut db, &split(&by_name(2))[0]).unwrap();
        assert_eq!(db.districts[1].customers[named as usize].balance_cents, before - 5);
        let unknown = small().last_names();
        assert_eq!(
            execute(&mut db, &split(&by_name(unknown))[0]),
            Err(PieceError::NoSuchName { w: 0, d: 1, last_name: unknown })
        );
    }

    #[test]
    fn new_order_takes_the_next_id_and_delivery_delivers_the_oldest() {
        let scale = small();
        let mut db = WarehouseDb::populate(&scale, 1, 0);
        let lines = vec![
            NewOrderLine { item: 4, supply_w: 0, quantity: 3 },
            NewOrderLine { item: 5, supply_w: 1, quantity: 2 },
        ];
        let pieces = split(&TpccTxn::NewOrder { w: 0, d: 2, customer: 7, lines, date: 11 });
        assert_eq!(pieces.iter().map(|p| (p.w, p.steps.len())).collect::<Vec<_>>(), [(0, 2), (1, 1)]);
        let r = execute(&mut db, &pieces[0]).unwrap();
        assert!(matches!(r[0], StepOutput::NewOrder { order: 31, .. }));
        let order = &db.districts[2].orders[30];
        assert!(!order.all_local && order.lines[0].amount_cents == 3 * i64::from(db.item_price_cents[4]));
        assert_eq!(db.districts[2].last_order_of[7], 31);
        assert_eq!(db.stock[4].order_cnt, 1);
        assert_eq!(db.stock[5].order_cnt, 0, "line 2 is supplied by warehouse 1");
        let oldest = db.districts[2].new_orders[0];
        // The paper's delivery: one district's oldest order, under that district's two keys.
        let one = &split(&TpccTxn::Delivery { w: 0, district: Some(2), carrier: 4, date: 12 })[0];
        assert_eq!(
            one.keys(&scale),
            [
                (ConflictKey::DistrictOrders { w: 0, d: 2 }, Access::Write),
                (ConflictKey::Customers { w: 0, d: 2 }, Access::Write)
            ]
        );
        let oldest_elsewhere = db.districts[3].new_orders[0];
        assert_eq!(execute(&mut db, one).unwrap(), [StepOutput::Delivery { delivered: 1 }]);
        assert_eq!(db.districts[2].orders[oldest as usize - 1].carrier, Some(4));
        assert_eq!(db.districts[3].new_orders[0], oldest_elsewhere, "other districts wait");
        // TPC-C's in one database transaction: every district.
        let oldest = db.districts[2].new_orders[0];
        let delivery = &split(&TpccTxn::Delivery { w: 0, district: None, carrier: 3, date: 12 })[0];
        assert_eq!(delivery.keys(&scale).len(), 20, "every district's orders and customers");
        assert_eq!(execute(&mut db, delivery).unwrap(), [StepOutput::Delivery { delivered: 10 }]);
        assert_eq!(db.districts[2].orders[oldest as usize - 1].carrier, Some(3));
        assert_eq!(db.districts[3].orders[oldest_elsewhere as usize - 1].carrier, Some(3));
    }

    #[test]
    fn bad_pieces_are_refused_and_change_nothing() {
        let scale = small();
        let mut db = WarehouseDb::populate(&scale, 1, 0);
        let before = db.clone();
        let bad = [
            Piece { w: 1, steps: vec![Step::Delivery { district: None, carrier: 1, date: 0 }] },
            Piece { w: 0, steps: vec![Step::Delivery { district: Some(10), carrier: 1, date: 0 }] },
            Piece {
                w: 0,
                steps: vec![
                    Step::Delivery { district: Some(0), carrier: 1, date: 0 },
                    Step::OrderStatus { d: 10, customer: CustomerRef::Id(0) },
                ],
            },
            Piece { w: 0, steps: vec![Step::PaymentBy { d: 0, customer: CustomerRef::Id(30), amount_cents: 5 }] },
            Piece { w: 0, steps: vec![Step::Stock { item: 100, quantity: 1, remote: false }] },
            Piece { w: 0, steps: vec![Step::Stock { item: 1, quantity: 0, remote: false }] },
            Piece {
                w: 0,
                steps: vec![Step::PaymentAt {
                    d: 0,
                    customer_w: 0,
                    customer_d: 0,
                    customer: CustomerRef::Id(0),
                    amount_cents: -5,
                    date: 0,
                }],
            },
            Piece { w: 0, steps: vec![Step::NewOrder { d: 0, customer: 0, lines: vec![], date: 0 }] },
        ];
        for p in &bad {
            assert!(execute(&mut db, p).is_err(), "{p:?}");
        }
        assert_eq!(db, before);
    }

    #[test]
    fn an_undone_piece_leaves_the_warehouse_as_it_was() {
        use crate::tpcc::{TpccMix, TpccTerminal};
        use rand::SeedableRng;
        let scale = TpccScale { warehouses: 1, ..small() };
        let mut db = WarehouseDb::populate(&scale, 7, 0);
        let mut rng = kairos_core::Rng::seed_from_u64(7);
        let terminal = TpccTerminal::new(scale, TpccMix::default(), &mut rng);
        let mut kinds_undone = std::collections::BTreeSet::new();
        let kind = |s: &Step| format!("{s:?}").split([' ', '{']).next().map(str::to_owned);
        for i in 0..400u64 {
            let txn = terminal.next(&mut rng, i);
            let piece = &split(&txn)[0];
            let before = db.clone();
            let (outputs, undo_record) = execute_undoable(&mut db, piece).unwrap();
            let mut again = before.clone();
            assert_eq!(execute(&mut again, piece).unwrap(), outputs, "the same run as execute");
            assert_eq!(again, db);
            if i % 3 == 0 {
                // Stacked: two pieces, undone last first.
                let next = split(&terminal.next(&mut rng, i))[0].clone();
                let middle = db.clone();
                let (_, second) = execute_undoable(&mut db, &next).unwrap();
                undo(&mut db, second);
                assert_eq!(db, middle);
            }
            if !undo_record.is_empty() {
                kinds_undone.insert(kind(&piece.steps[0]));
            }
            undo(&mut db, undo_record);
            assert_eq!(db, before, "{txn:?}");
            // Keep the run going with the piece applied for good.
            execute(&mut db, piece).unwrap();
        }
        assert_eq!(kinds_undone.len(), 3, "new-order, payment and delivery were undone");
    }

    #[test]
    fn look_ups_find_a_customer_with_the_name() {
        let db = WarehouseDb::populate(&small(), 1, 0);
        for n in 0..small().last_names() {
            let c = look_up_customer(&db, 4, n).unwrap();
            assert_eq!(db.districts[4].customers[c as usize].last_name, n);
        }
        assert_eq!(look_up_customer(&db, 10, 0), None);
    }
}
