//! A session workload derived from TPC-C, as in the paper's evaluation: the mix, session kinds
//! and documents are `kairos_workload::tpcc`'s; here each transaction becomes session
//! operations. As in the paper there are no multi-document transactions: each TPC-C
//! transaction is a short sequence of single-document session operations on the list-append
//! document model, so the history stays checkable by the causal checker (one micro-op per
//! operation, appended values unique per key).
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

pub use kairos_workload::tpcc::{pick_txn, Doc, TpccConfig, TpccSessionKind, TpccSessions, TxnType};

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
