//! A world check for 2PL+Paxos and OCC+Paxos: the replicas of a shard apply the same record
//! in every slot (Multi-Paxos's safety, seen from outside). Each slot a replica has applied is
//! compared with the first record any replica of the shard applied there; a replica that
//! restarted applies its log again from slot 0 and is compared again from there.

use kairos_core::NodeId;
use kairos_sim::{Sim, WorldCheck};
use kairos_txn::twopc::server::TxnServer;
use kairos_txn::twopc::{Record, TxnMsg};
use kairos_workload::Topology;
use std::cell::RefCell;

/// Per shard, the record applied in each slot (`None`: a no-op); per node, how far it was
/// compared and in which incarnation.
struct Seen {
    chosen: Vec<Vec<Option<Record>>>,
    compared: Vec<(u64, u64)>,
}

/// See the module docs. Checks incrementally: each applied slot is compared once per
/// incarnation of its replica.
pub fn applied_slots_agree(topology: Topology) -> WorldCheck<TxnMsg> {
    let nodes = topology.shards.iter().flatten().map(|n| n.index() + 1).max().unwrap_or(0);
    let seen = RefCell::new(Seen { chosen: vec![Vec::new(); topology.shards.len()], compared: vec![(0, 0); nodes] });
    Box::new(move |sim: &Sim<TxnMsg>| {
        let mut seen = seen.borrow_mut();
        let Seen { chosen, compared } = &mut *seen;
        for (s, replicas) in topology.shards.iter().enumerate() {
            for &node in replicas {
                let Some(server) = sim.role::<TxnServer>(node) else { continue };
                let paxos = server.paxos();
                let (from, incarnation) = &mut compared[node.index()];
                if *incarnation != paxos.incarnation() || paxos.applied() < *from {
                    (*from, *incarnation) = (0, paxos.incarnation());
                }
                for slot in *from..paxos.applied() {
                    let record = paxos.entry(slot).cloned();
                    match chosen[s].get(slot as usize) {
                        Some(first) if *first != record => return Err(disagreement(s, node, slot, first, &record)),
                        Some(_) => {}
                        None => chosen[s].push(record),
                    }
                }
                *from = (*from).max(paxos.applied());
            }
        }
        Ok(())
    })
}

fn disagreement(shard: usize, node: NodeId, slot: u64, first: &Option<Record>, now: &Option<Record>) -> String {
    format!("shard {shard}: replica {node} applied {now:?} in slot {slot}, where another replica applied {first:?}")
}
