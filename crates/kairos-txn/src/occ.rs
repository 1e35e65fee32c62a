//! OCC+Paxos: optimistic execution at the shard leaders (reads return values and versions,
//! take nothing), validation at prepare, and two-phase commit whose prepare, commit and abort
//! records are replicated through each shard's Multi-Paxos group ([`kairos_consensus::paxos`]). The
//! protocol, its latency formula and its simplifications are in [`crate::twopc`]; this module
//! is the [`Peer`] binding.
//!
//! Validation (at the leader, on `Prepare`): every key read still has the version read, and no
//! other attempt is prepared (or preparing) on any key the attempt reads or writes. A valid
//! attempt holds its keys ("prepare locks") from validation until its commit or abort record is
//! applied; an invalid one votes no, and its coordinator aborts and retries it after a backoff.
//!
//! Cost with no contention: read 1 WRTT + prepare 1 WRTT + one Paxos round at each leader —
//! the same formula as 2PL+Paxos ([`crate::twopc::analytic_latency`]); under contention OCC
//! never waits but aborts instead.
//!
//! Test-only bug: [`ClassicConfig::unsafe_skip_validation`] prepares without validating: two
//! increments that read the same version both commit (a lost update the checker reports).

use crate::peer::Peer;
use crate::shell::TxnShell;
use crate::store::Store;
use crate::twopc::coordinator::TxnCoordinator;
use crate::twopc::server::TxnServer;
pub use crate::twopc::ClassicConfig;
use crate::twopc::{Cc, TxnMsg};
use kairos_workload::txn::ShardId;
use kairos_workload::Topology;

/// The configuration of OCC+Paxos (the shared [`ClassicConfig`]; `unsafe_early_release` does
/// not apply).
pub type OccConfig = ClassicConfig;

/// OCC+Paxos as a [`Peer`] of the deployment.
pub struct OccPaxos;

impl Peer for OccPaxos {
    type Msg = TxnMsg;
    type Server = TxnServer;
    type Coordinator = TxnCoordinator;
    type Config = ClassicConfig;

    fn server(topology: &Topology, config: &ClassicConfig, shard: ShardId, replica: u32) -> TxnServer {
        TxnServer::new(Cc::Optimistic, topology, config, shard, replica)
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
