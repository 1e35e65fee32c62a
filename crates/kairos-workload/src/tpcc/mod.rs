//! TPC-C: the transaction mix shared by every system, and the transactional database the Tiga
//! paper's TPC-C runs on.
//!
//! - This module: the five transaction types, the session kinds and their weights (read-write
//!   sessions run new-order / payment / delivery, read-only ones order-status / stock-level, or
//!   every session the full 44/44/4/4/4 mix), and the documents (keys) of the scaled-down
//!   database the MongoDB paper's causal evaluation runs (`kairos_causal::tpcc` turns a
//!   transaction into short sequences of list-append session operations).
//! - The transactional TPC-C of the Tiga paper, for Tiga and every peer alike: its size and mix
//!   ([`scale`]), its conflict keys ([`keys`]), one warehouse's tables populated from the seed
//!   ([`db`]), the transactions' inputs and the terminal that draws them ([`input`]), how a
//!   transaction runs as one-shot pieces, one per warehouse, with the by-name pre-read that
//!   makes payment and order-status multi-shot ([`piece`]), and the consistency conditions
//!   checked at the end of a run ([`consistency`]).
//!
//! ## Documents (keys) of the session workload
//! * warehouse `w`: `W_YTD` — payments against the warehouse (its year-to-date);
//! * district `(w, d)`: `D_ORDERS` — the district's orders (its `next_o_id`);
//! * customer `(w, d, c)`: `C_ORDERS` — the customer's orders; `C_HISTORY` — payments and
//!   deliveries (the balance);
//! * stock `(w, i)`: `S_STOCK` — quantity updates of item `i`.

pub mod consistency;
pub mod db;
pub mod input;
pub mod keys;
pub mod piece;
pub mod pre_read;
pub mod scale;

pub use consistency::ConsistencyReport;
pub use db::WarehouseDb;
pub use input::{CustomerRef, TpccSource, TpccTerminal, TpccTxn};
pub use keys::ConflictKey;
pub use piece::{Piece, PieceError, PieceUndo, StepOutput};
pub use pre_read::{PreRead, PreReadAnswer, PreReadMsg, PreReadRequest};
pub use scale::{DeliveryScope, TpccError, TpccMix, TpccScale};

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
    /// Warehouses (at least 1).
    pub fn wh(&self) -> u64 {
        self.warehouses.max(1)
    }
    /// Districts per warehouse (at least 1).
    pub fn dists(&self) -> u64 {
        self.districts_per_warehouse.max(1)
    }
    /// Customers per district (at least 1).
    pub fn custs(&self) -> u64 {
        self.customers_per_district.max(1)
    }
    /// Items (at least 1).
    pub fn item_count(&self) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
