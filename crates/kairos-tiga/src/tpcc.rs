//! TPC-C on Tiga: a shard's warehouses, and how a transaction's pieces run on them.
//!
//! A TPC-C transaction reaches Tiga as a general one-shot transaction — an increment of each
//! of its conflict keys ([`kairos_workload::tpcc::keys`], whose decimal digits are the keys'
//! bytes: the [`Partitioner::Integer`](kairos_workload::Partitioner) places each on its
//! warehouse's shard) — plus its TPC-C pieces, one per warehouse, which every shard's piece
//! carries whole ([`crate::Piece::tpcc`]). A server runs, in the same step as the increments,
//! those pieces whose warehouse it holds, exactly as the peers do, so the history the checker
//! reads (the keys' counters) and the rows change together.
//!
//! A leader executes speculatively and revokes on a timestamp revision, so a speculative run
//! keeps an undo record per piece ([`piece::execute_undoable`]); the committed state runs
//! pieces for good. A piece that touches a key its transaction did not declare, or that is bad
//! input, changes nothing on any replica and is counted ([`TpccShard::pieces_refused`]).
//!
//! Warehouses are shared ([`Arc`]) between the live state and its copies (the leader's
//! committed state, checkpoints): a copy costs nothing until the next write, which then copies
//! that warehouse once.

use crate::ops::Op;
use kairos_workload::decimal_key;
use kairos_workload::tpcc::piece::Access;
use kairos_workload::tpcc::{piece, pre_read, Piece, PieceUndo, PreReadAnswer, PreReadRequest, TpccScale, WarehouseDb};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What reverts a [`TpccShard::run`]: each piece's undo record (warehouse index, record), and
/// the pieces it refused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TpccUndo {
    pieces: Vec<(usize, PieceUndo)>,
    refused: u64,
}

/// The warehouses of one shard (those `w` with `w mod shards = shard`), in warehouse order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TpccShard {
    pub scale: TpccScale,
    pub warehouses: Vec<Arc<WarehouseDb>>,
    /// Pieces refused (undeclared keys or bad input): none from Kairos's own coordinators.
    pub pieces_refused: u64,
}

impl TpccShard {
    /// Answers a by-name transaction's pre-read, if this shard holds the warehouse (names
    /// never change, so the committed tables answer as well as the speculative ones).
    pub fn answer_pre_read(&self, request: PreReadRequest) -> Option<PreReadAnswer> {
        pre_read::answer(self.warehouses.iter().map(|db| &**db), request)
    }

    /// Shard `shard`'s (of `shards`) warehouses, populated from `seed` as every replica does.
    pub fn populate(scale: &TpccScale, seed: u64, shard: u32, shards: u32) -> TpccShard {
        let warehouses = (0..scale.warehouses)
            .filter(|w| w % shards.max(1) == shard)
            .map(|w| Arc::new(WarehouseDb::populate(scale, seed, w)))
            .collect();
        TpccShard { scale: *scale, warehouses, pieces_refused: 0 }
    }

    /// Runs those of `pieces` whose warehouse is here, for a transaction whose operations on
    /// this shard are `ops`; with `keep_undo`, returns what reverts them ([`TpccShard::undo`]).
    pub fn run(&mut self, pieces: &[Piece], ops: &[Op], keep_undo: bool) -> TpccUndo {
        let mut undo = TpccUndo::default();
        // The integer keys the transaction reads or writes here, and those it writes (TPC-C's
        // keys are their decimal digits, one spelling per integer: "007" is not key 7, and
        // conflicts with nothing of it). A piece runs only if every key it writes is written
        // and every key it reads is at least read.
        let touched: Vec<u64> = ops.iter().filter_map(|op| decimal_key(&op.key)).collect();
        let written: Vec<u64> =
            ops.iter().filter(|op| op.kind.writes()).filter_map(|op| decimal_key(&op.key)).collect();
        for p in pieces {
            let Some(i) = self.warehouses.iter().position(|db| db.w == p.w) else { continue };
            let declared = p.keys(&self.scale).iter().all(|(k, access)| match access {
                Access::Read => touched.contains(&k.encode(&self.scale)),
                Access::Write => written.contains(&k.encode(&self.scale)),
            });
            // (A warehouse shared with a copy is copied only when a piece is about to run.)
            let ran = match (declared, keep_undo) {
                (false, _) => Err(()),
                (true, true) => piece::execute_undoable(Arc::make_mut(&mut self.warehouses[i]), p)
                    .map(|(_, u)| undo.pieces.push((i, u)))
                    .map_err(|_| ()),
                (true, false) => piece::execute(Arc::make_mut(&mut self.warehouses[i]), p).map(|_| ()).map_err(|_| ()),
            };
            if ran.is_err() {
                self.pieces_refused += 1;
                undo.refused += 1;
            }
        }
        if keep_undo {
            undo
        } else {
            TpccUndo::default()
        }
    }

    /// Reverts what a [`TpccShard::run`] with `keep_undo` did (its refusals included).
    pub fn undo(&mut self, undo: TpccUndo) {
        self.pieces_refused = self.pieces_refused.saturating_sub(undo.refused);
        for (i, u) in undo.pieces.into_iter().rev() {
            if let Some(db) = self.warehouses.get_mut(i) {
                piece::undo(Arc::make_mut(db), u);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{Op, OpKind};
    use kairos_workload::tpcc::piece::split;
    use kairos_workload::tpcc::{CustomerRef, TpccTxn};

    #[test]
    fn a_shard_runs_its_warehouses_pieces_on_declared_keys_only_and_undoes_them() {
        let scale = TpccScale::small(2, 100);
        let mut shard1 = TpccShard::populate(&scale, 3, 1, 2);
        let populated = shard1.clone();
        // A remote payment: its home warehouse 0 is on shard 0, the customer's (1) here.
        let pay = TpccTxn::Payment {
            w: 0,
            d: 2,
            customer_w: 1,
            customer_d: 4,
            customer: CustomerRef::Id(5),
            amount_cents: 700,
            date: 1,
        };
        let pieces = split(&pay);
        let keys: Vec<u64> = pieces.iter().flat_map(|p| p.keys(&scale)).map(|(k, _)| k.encode(&scale)).collect();
        let ops = |spell: &dyn Fn(u64) -> String| -> Vec<Op> {
            keys.iter().map(|k| Op::new(spell(*k).into_bytes(), OpKind::IncrBy(1))).collect()
        };
        let undo = shard1.run(&pieces, &ops(&|k| k.to_string()), true);
        assert_eq!(undo.pieces.len(), 1, "only warehouse 1's piece runs here");
        let balance = |s: &TpccShard| s.warehouses[0].districts[4].customers[5].balance_cents;
        assert_eq!(balance(&shard1), balance(&populated) - 700);
        shard1.undo(undo);
        assert_eq!(shard1, populated);
        // Keys spelled otherwise ("007" is not key 7) or only read are not declared.
        shard1.run(&pieces, &ops(&|k| format!("0{k}")), false);
        let reads: Vec<Op> = keys.iter().map(|k| Op::new(k.to_string().into_bytes(), OpKind::Get)).collect();
        shard1.run(&pieces, &reads, false);
        assert_eq!(shard1.pieces_refused, 2);
        assert_eq!(shard1.warehouses, populated.warehouses, "refused pieces change nothing");
        // A speculative refusal is undone with the rest.
        let undo = shard1.run(&pieces, &reads, true);
        assert_eq!(shard1.pieces_refused, 3);
        shard1.undo(undo);
        assert_eq!(shard1.pieces_refused, 2);
    }
}
