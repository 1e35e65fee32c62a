//! A world check for Calvin+: the schedulers of one shard (one per row) execute the same
//! positions (epoch, shard) in the same order. Calvin's replicas agree because they execute one
//! deterministic order, not because they vote, so this is the property its correctness rests
//! on: two rows that executed the same number of positions must have the same order hash.

use kairos_sim::{Sim, WorldCheck};
use kairos_txn::calvin::{CalvinMsg, Server};
use kairos_workload::Topology;

/// See the module docs. Per shard, compares every live row with the row that executed the
/// fewest positions, at that count (a row that ran more than the remembered window ahead is
/// skipped until the others catch up).
pub fn executions_agree(topology: Topology) -> WorldCheck<CalvinMsg> {
    Box::new(move |sim: &Sim<CalvinMsg>| {
        for (shard, rows) in topology.shards.iter().enumerate() {
            let live: Vec<(kairos_core::NodeId, &Server)> = rows
                .iter()
                .filter(|n| sim.is_up(**n))
                .filter_map(|n| sim.role::<Server>(*n).map(|s| (*n, s)))
                .collect();
            let Some(count) = live.iter().map(|(_, s)| s.positions_executed()).min() else { continue };
            let mut first: Option<(kairos_core::NodeId, u64)> = None;
            for (node, server) in &live {
                let Some(hash) = server.execution_hash_at(count) else { continue };
                match first {
                    Some((by, h)) if h != hash => {
                        return Err(format!(
                            "shard {shard}: schedulers {by} and {node} executed their first {count} positions in different orders"
                        ))
                    }
                    Some(_) => {}
                    None => first = Some((*node, hash)),
                }
            }
        }
        Ok(())
    })
}
