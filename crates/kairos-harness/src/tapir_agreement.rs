//! A world check for Tapir: every replica of every shard that a transaction attempt touched
//! decides it alike — committed at one timestamp, or aborted. Tapir keeps no log for replicas
//! to agree on (IR's record is unordered), so this is its cross-replica property: the client
//! decides each attempt once (after the prepares of every shard), and a replica that commits
//! what another aborted, or at another timestamp, has broken atomicity whether or not a later
//! read shows it.

use kairos_core::NodeId;
use kairos_sim::{Sim, WorldCheck};
use kairos_txn::tapir::{Decision, Replica, TapirMsg};
use kairos_workload::txn::TxnId;
use kairos_workload::Topology;
use std::cell::RefCell;
use std::collections::BTreeMap;

/// Per (transaction, attempt), the first decision seen and the replica that took it; per node,
/// how many of its decisions were compared.
struct Seen {
    decided: BTreeMap<(TxnId, u32), (Decision, NodeId)>,
    compared: BTreeMap<NodeId, u64>,
}

/// See the module docs. Checks incrementally: each decision is compared once (again after its
/// replica restarts and replays its journal).
pub fn decisions_agree(topology: Topology) -> WorldCheck<TapirMsg> {
    let seen = RefCell::new(Seen { decided: BTreeMap::new(), compared: BTreeMap::new() });
    Box::new(move |sim: &Sim<TapirMsg>| {
        let mut seen = seen.borrow_mut();
        let Seen { decided, compared } = &mut *seen;
        for &node in topology.shards.iter().flatten() {
            let cursor = compared.entry(node).or_insert(0);
            // A restarted replica counts from 0 again (and replays its journal): seen down, or
            // counting less than before, it is compared from its first decision.
            let replica = sim.role::<Replica>(node).filter(|_| sim.is_up(node));
            let Some(replica) = replica else {
                *cursor = 0;
                continue;
            };
            if replica.decisions_taken() < *cursor {
                *cursor = 0;
            }
            let (new, taken) = replica.decisions_since(*cursor);
            for (op, decision) in new {
                match decided.get(&(op.txn, op.attempt)) {
                    Some((first, by)) if first != decision => {
                        return Err(format!(
                            "transaction {:?} attempt {}: replica {node} decided {decision:?}, replica {by} {first:?}",
                            op.txn, op.attempt
                        ))
                    }
                    Some(_) => {}
                    None => {
                        decided.insert((op.txn, op.attempt), (*decision, node));
                    }
                }
            }
            *cursor = taken;
        }
        Ok(())
    })
}
