//! A world check for Janus: the replicas of a shard apply conflicting transactions in the
//! same order. Janus does not order non-conflicting transactions, so replicas may execute in
//! different overall orders; what must agree is each key's sequence of writers. Per shard, for
//! the keys each live replica wrote last, any two replicas that applied the same number of
//! writes to a key must hold the same writer chain for it.

use kairos_sim::{Sim, WorldCheck};
use kairos_txn::janus::{JanusMsg, Server};
use kairos_workload::Topology;

/// See the module docs.
pub fn key_orders_agree(topology: Topology) -> WorldCheck<JanusMsg> {
    Box::new(move |sim: &Sim<JanusMsg>| {
        for (shard, replicas) in topology.shards.iter().enumerate() {
            let live: Vec<(kairos_core::NodeId, &Server)> = replicas
                .iter()
                .filter(|n| sim.is_up(**n))
                .filter_map(|n| sim.role::<Server>(*n).map(|s| (*n, s)))
                .collect();
            for (node, server) in &live {
                for key in server.recent_writes() {
                    let mine = server.key_chain(key);
                    for (other, o) in &live {
                        let theirs = o.key_chain(key);
                        if theirs.writes == mine.writes && theirs.hash != mine.hash {
                            return Err(format!(
                                "shard {shard}: replicas {node} and {other} applied the first {} writes of key {key} in different orders (or different writers)",
                                mine.writes
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    })
}
