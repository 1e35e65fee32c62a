//! 2PL+Paxos (Spanner-style): two-phase locking with **wound-wait** at the shard leaders, and
//! two-phase commit whose prepare, commit and abort records are replicated through each
//! shard's Multi-Paxos group ([`kairos_consensus::paxos`]). The protocol, its latency formula and its
//! simplifications are in [`crate::twopc`]; this module is the [`Peer`] binding.
//!
//! Locks: a `Read` takes every key's lock, exclusively (MicroBench increments read and write
//! each key), or shared when the transaction only reads (TPC-C's order-status and stock-level,
//! [`kairos_workload::reads_only`]); two locks conflict unless both are shared. A requester
//! **wounds** (aborts) every conflicting holder younger than itself that has not yet prepared,
//! and **waits** for older or prepared holders; waiters are granted in age order, several
//! compatible ones at once, and a requester is granted at once only when nobody waits (so a
//! stream of readers cannot pass an older waiting writer). Holders that a requester must wait
//! for are older or prepared, and the waiters ahead of it are older, so waits only point from
//! younger to older (or to prepared transactions, which wait for nothing): no deadlocks. A wounded attempt's
//! coordinator hears `Refused`, aborts the attempt everywhere and retries it under the same
//! transaction id — so it keeps its age and eventually becomes the oldest.
//!
//! Cost with no contention (coordinator in region c, leaders L_s): execute/lock 1 WRTT + prepare
//! 1 WRTT + one Paxos round at each leader before the client's answer:
//! `max_s RTT(c, L_s) + max_s (RTT(c, L_s) + P_s)` (see [`crate::twopc::analytic_latency`]);
//! a key's lock is held from its grant until the commit record is applied: 2 RTT(c, L) + 2
//! Paxos rounds (reply, prepare, Paxos, vote, decide, Paxos), the last one-way trip and Paxos
//! round after the client already has its answer. That hold time, not CPU, bounds the
//! throughput of a hot key.
//!
//! Test-only bug: [`ClassicConfig::unsafe_early_release`] releases the locks once the prepare
//! record is durable, before the commit applies the writes: a waiter then reads the old value
//! and the two increments collapse into one (a lost update the checker reports).

use crate::peer::Peer;
use crate::shell::TxnShell;
use crate::store::Store;
use crate::twopc::coordinator::TxnCoordinator;
use crate::twopc::server::TxnServer;
pub use crate::twopc::ClassicConfig;
use crate::twopc::{Cc, TxnMsg};
use kairos_workload::txn::ShardId;
use kairos_workload::Topology;

/// The configuration of 2PL+Paxos (the shared [`ClassicConfig`]; `unsafe_skip_validation`
/// does not apply).
pub type TwoPlConfig = ClassicConfig;

/// 2PL+Paxos as a [`Peer`] of the deployment.
pub struct TwoPlPaxos;

impl Peer for TwoPlPaxos {
    type Msg = TxnMsg;
    type Server = TxnServer;
    type Coordinator = TxnCoordinator;
    type Config = ClassicConfig;

    fn server(topology: &Topology, config: &ClassicConfig, shard: ShardId, replica: u32) -> TxnServer {
        TxnServer::new(Cc::Locking, topology, config, shard, replica)
    }

    fn coordinator(topology: &Topology, config: &ClassicConfig, shell: TxnShell) -> TxnCoordinator {
        TxnCoordinator::new(topology, config, shell)
    }

    fn shell(c: &TxnCoordinator) -> &TxnShell {
        c.shell()
    }

    fn store(server: &TxnServer) -> Option<&Store> {
        Some(server.store())
    }

    fn store_mut(server: &mut TxnServer) -> Option<&mut Store> {
        Some(server.store_mut())
    }

    fn in_doubt(server: &TxnServer) -> usize {
        server.prepared_count()
    }

    /// The Multi-Paxos log applied: a read-only commit or an abort writes nothing.
    fn applied(server: &TxnServer) -> u64 {
        server.paxos().applied()
    }

    fn coordinator_settled(c: &TxnCoordinator) -> bool {
        c.settled()
    }
}
