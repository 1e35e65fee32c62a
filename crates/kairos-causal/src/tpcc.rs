//! A session workload derived from TPC-C, as in the paper's evaluation: read-write sessions
//! run new-order / payment / delivery, read-only sessions run order-status / stock-level (or
//! every session runs the full 44/44/4/4/4 mix). As in the paper there are no multi-document
//! transactions: each TPC-C transaction is a short sequence of single-document session
//! operations on the list-append document model, so the history stays checkable by the causal
//! checker (one micro-op per operation, appended values unique per key).
//!
//! ## Documents (keys)
//! * warehouse `w`: `W_YTD` — payments against the warehouse (its year-to-date);
//! * district `(w, d)`: `D_ORDERS` — the district's orders (its `next_o_id`);
//! * customer `(w, d, c)`: `C_ORDERS` — the customer's orders; `C_HISTORY` — payments and
//!   deliveries (the balance);
//! * stock `(w, i)`: `S_STOCK` — quantity updates of item `i`.
//!
//! ## Transactions
//! * **new-order** (read-write): read the stock of 1..=`max_items_per_order` distinct items,
//!   append an order id to the district's orders and to the customer's orders, append a
//!   quantity update to each item's stock;
//! * **payment** (read-write): read the customer's history, append a payment id to the
//!   customer's history and to the warehouse's ytd;
//! * **delivery** (read-write): read a district's orders, append a delivery id to the history
//!   of one of its customers;
//! * **order-status** (read-only): read the customer's orders and history;
//! * **stock-level** (read-only): read the district's orders and the stock of a few items.
//!
//! Sizes are scaled down from TPC-C (10 districts per warehouse as in TPC-C; customers and
//! items are parameters) so that lists, and the checker's work, stay small.

use crate::msg::ClientOp;
use rand::Rng;

/// One TPC-C transaction type.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TxnType {
    NewOrder,
    Payment,
    Delivery,
    OrderStatus,
    StockLevel,
}

impl TxnType {
    pub const ALL: [TxnType; 5] =
        [TxnType::NewOrder, TxnType::Payment, TxnType::Delivery, TxnType::OrderStatus, TxnType::StockLevel];

    pub fn name(self) -> &'static str {
        match self {
            TxnType::NewOrder => "new-order",
            TxnType::Payment => "payment",
            TxnType::Delivery => "delivery",
            TxnType::OrderStatus => "order-status",
            TxnType::StockLevel => "stock-level",
        }
    }

    /// Whether the transaction only reads.
    pub fn read_only(self) -> bool {
        matches!(self, TxnType::OrderStatus | TxnType::StockLevel)
    }
}

/// Which transactions a session runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TpccSessionKind {
    /// new-order / payment / delivery in the TPC-C proportions 44 : 44 : 4.
    ReadWrite,
    /// order-status / stock-level, half each.
    ReadOnly,
    /// The full mix: new-order 44 %, payment 44 %, delivery 4 %, order-status 4 %, stock-level 4 %.
    Mixed,
}

impl TpccSessionKind {
    /// Relative weights of [`TxnType::ALL`] for this kind.
    pub fn weights(self) -> [u32; 5] {
        match self {
            TpccSessionKind::ReadWrite => [44, 44, 4, 0, 0],
            TpccSessionKind::ReadOnly => [0, 0, 0, 1, 1],
            TpccSessionKind::Mixed => [44, 44, 4, 4, 4],
        }
    }
}

/// How the sessions of a deployment are split between kinds.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum TpccSessions {
    /// Every session runs the full mix.
    Mixed,
    /// This share of the sessions (spread evenly over the session list) is read-only, the rest
    /// read-write.
    Split { read_only_share: f64 },
}

/// The scaled TPC-C database and the session split.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct TpccConfig {
    pub warehouses: u64,
    /// TPC-C: 10.
    pub districts_per_warehouse: u64,
    /// TPC-C: 3,000 (scaled down).
    pub customers_per_district: u64,
    /// TPC-C: 100,000 (scaled down).
    pub items: u64,
    /// TPC-C: 5..=15 order lines (scaled down); at least 1.
    pub max_items_per_order: u64,
    /// Items a stock-level transaction reads (TPC-C: those of the last 20 orders; scaled).
    pub stock_level_items: u64,
    pub sessions: TpccSessions,
}

impl Default for TpccConfig {
    fn default() -> Self {
        TpccConfig {
            warehouses: 1,
            districts_per_warehouse: 10,
            customers_per_district: 10,
            items: 50,
            max_items_per_order: 3,
            stock_level_items: 3,
            sessions: TpccSessions::Split { read_only_share: 0.5 },
        }
    }
}

/// The document a key names.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Doc {
    WarehouseYtd { w: u64 },
    DistrictOrders { w: u64, d: u64 },
    CustomerOrders { w: u64, d: u64, c: u64 },
    CustomerHistory { w: u64, d: u64, c: u64 },
    Stock { w: u64, i: u64 },
}

impl TpccConfig {
    fn wh(&self) -> u64 {
        self.warehouses.max(1)
    }
    fn dists(&self) -> u64 {
        self.districts_per_warehouse.max(1)
    }
    fn custs(&self) -> u64 {
        self.customers_per_district.max(1)
    }
    fn item_count(&self) -> u64 {
        self.items.max(1)
    }
    fn customers(&self) -> u64 {
        self.wh() * self.dists() * self.custs()
    }

    /// The key of a document: the five document kinds in consecutive ranges.
    pub fn key(&self, doc: Doc) -> u64 {
        let (wh, ds, cs) = (self.wh(), self.dists(), self.custs());
        let cust = |w: u64, d: u64, c: u64| (w * ds + d) * cs + c;
        let base_d = wh;
        let base_co = base_d + wh * ds;
        let base_ch = base_co + self.customers();
        let base_s = base_ch + self.customers();
        match doc {
            Doc::WarehouseYtd { w } => w,
            Doc::DistrictOrders { w, d } => base_d + w * ds + d,
            Doc::CustomerOrders { w, d, c } => base_co + cust(w, d, c),
            Doc::CustomerHistory { w, d, c } => base_ch + cust(w, d, c),
            Doc::Stock { w, i } => base_s + w * self.item_count() + i,
        }
    }

    /// Number of keys (documents).
    pub fn keys(&self) -> u64 {
        self.wh() + self.wh() * self.dists() + 2 * self.customers() + self.wh() * self.item_count()
    }

    /// The kind of session number `index`.
    pub fn session_kind(&self, index: usize) -> TpccSessionKind {
        match self.sessions {
            TpccSessions::Mixed => TpccSessionKind::Mixed,
            TpccSessions::Split { read_only_share } => {
                let s = read_only_share.clamp(0.0, 1.0);
                // Bresenham spread: session i is read-only when the running count of
                // read-only sessions steps up at i.
                let before = (index as f64 * s).floor();
                let after = ((index + 1) as f64 * s).floor();
                if after > before {
                    TpccSessionKind::ReadOnly
                } else {
                    TpccSessionKind::ReadWrite
                }
            }
        }
    }
}

/// Draws a transaction type with the kind's weights.
pub fn pick_txn(kind: TpccSessionKind, rng: &mut impl Rng) -> TxnType {
    let w = kind.weights();
    let total: u32 = w.iter().sum();
    let mut x = rng.random_range(0..total.max(1));
    for (t, &wt) in TxnType::ALL.iter().zip(&w) {
        if x < wt {
            return *t;
        }
        x -= wt;
    }
    TxnType::NewOrder
}

/// The session operations of one transaction of type `t` by a session whose home warehouse is
/// `home`. `fresh` yields a new value, unique for this session, for each written id (an order,
/// payment or delivery id; the same id goes to every document the transaction appends it to,
/// which keeps values unique per key).
pub fn txn_ops(
    cfg: &TpccConfig,
    t: TxnType,
    home: u64,
    rng: &mut impl Rng,
    mut fresh: impl FnMut() -> u64,
) -> Vec<ClientOp> {
    let w = home % cfg.wh();
    let d = rng.random_range(0..cfg.dists());
    let c = rng.random_range(0..cfg.custs());
    let items = |rng: &mut dyn rand::RngCore, n: u64| -> Vec<u64> {
        let n = n.clamp(1, cfg.item_count());
        let mut v: Vec<u64> = Vec::with_capacity(n as usize);
        while (v.len() as u64) < n {
            let i = rng.random_range(0..cfg.item_count());
            if !v.contains(&i) {
                v.push(i);
            }
        }
        v
    };
    let read = |doc| ClientOp::Read { key: cfg.key(doc) };
    match t {
        TxnType::NewOrder => {
            let n = rng.random_range(1..=cfg.max_items_per_order.max(1));
            let its = items(rng, n);
            let order = fresh();
            let mut ops: Vec<ClientOp> = its.iter().map(|&i| read(Doc::Stock { w, i })).collect();
            ops.push(ClientOp::Append { key: cfg.key(Doc::DistrictOrders { w, d }), value: order });
            ops.push(ClientOp::Append { key: cfg.key(Doc::CustomerOrders { w, d, c }), value: order });
            for &i in &its {
                ops.push(ClientOp::Append { key: cfg.key(Doc::Stock { w, i }), value: order });
            }
            ops
        }
        TxnType::Payment => {
            let p = fresh();
            vec![
                read(Doc::CustomerHistory { w, d, c }),
                ClientOp::Append { key: cfg.key(Doc::CustomerHistory { w, d, c }), value: p },
                ClientOp::Append { key: cfg.key(Doc::WarehouseYtd { w }), value: p },
            ]
        }
        TxnType::Delivery => {
            let x = fresh();
            vec![
                read(Doc::DistrictOrders { w, d }),
                ClientOp::Append { key: cfg.key(Doc::CustomerHistory { w, d, c }), value: x },
            ]
        }
        TxnType::OrderStatus => vec![read(Doc::CustomerOrders { w, d, c }), read(Doc::CustomerHistory { w, d, c })],
        TxnType::StockLevel => {
            let its = items(rng, cfg.stock_level_items);
            let mut ops = vec![read(Doc::DistrictOrders { w, d })];
            ops.extend(its.iter().map(|&i| read(Doc::Stock { w, i })));
            ops
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn keys_are_distinct_and_dense() {
        let cfg = TpccConfig { warehouses: 2, ..TpccConfig::default() };
        let mut all = Vec::new();
        for w in 0..2 {
            all.push(cfg.key(Doc::WarehouseYtd { w }));
            for d in 0..cfg.districts_per_warehouse {
                all.push(cfg.key(Doc::DistrictOrders { w, d }));
                for c in 0..cfg.customers_per_district {
                    all.push(cfg.key(Doc::CustomerOrders { w, d, c }));
                    all.push(cfg.key(Doc::CustomerHistory { w, d, c }));
                }
            }
            for i in 0..cfg.items {
                all.push(cfg.key(Doc::Stock { w, i }));
            }
        }
        all.sort_unstable();
        let n = all.len() as u64;
        all.dedup();
        assert_eq!(all.len() as u64, n);
        assert_eq!(n, cfg.keys());
        assert_eq!(*all.last().unwrap(), n - 1);
    }

    #[test]
    fn the_split_spreads_read_only_sessions() {
        let cfg = TpccConfig::default();
        let kinds: Vec<_> = (0..8).map(|i| cfg.session_kind(i)).collect();
        assert_eq!(kinds.iter().filter(|k| **k == TpccSessionKind::ReadOnly).count(), 4);
        assert_ne!(kinds[0], kinds[1]);
    }

    #[test]
    fn read_only_transactions_only_read_and_new_order_appends_one_id() {
        let cfg = TpccConfig::default();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut next = 0;
        for _ in 0..200 {
            for t in TxnType::ALL {
                let ops = txn_ops(&cfg, t, 0, &mut rng, || {
                    next += 1;
                    next
                });
                assert!(!ops.is_empty());
                let writes = ops.iter().filter(|o| matches!(o, ClientOp::Append { .. })).count();
                assert_eq!(writes == 0, t.read_only(), "{t:?}: {ops:?}");
                assert!(ops.iter().all(|o| match o {
                    ClientOp::Read { key } | ClientOp::Append { key, .. } => *key < cfg.keys(),
                }));
            }
        }
    }
}
