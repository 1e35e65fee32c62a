//! How a peer protocol plugs into a deployment: its message, server and coordinator roles and
//! its knobs. `kairos_harness::micro::Bench` builds and runs any [`Peer`] on the same
//! MicroBench deployment as Tiga, with the checks over all its nodes.

use kairos_core::{Message, Process};
use kairos_workload::txn::ShardId;
use kairos_workload::Topology;

use crate::shell::{TxnShell, TxnStats};

/// How a peer protocol plugs into the deployment.
pub trait Peer: 'static {
    type Msg: Message;
    type Server: Process<Msg = Self::Msg> + 'static;
    type Coordinator: Process<Msg = Self::Msg> + 'static;
    /// The protocol's knobs (timeouts, test-only switches), shared by all its roles.
    type Config: Clone + 'static;
    fn server(topology: &Topology, config: &Self::Config, shard: ShardId, replica: u32) -> Self::Server;
    fn coordinator(topology: &Topology, config: &Self::Config, shell: TxnShell) -> Self::Coordinator;
    /// The coordinator's counters (usually its shell's).
    fn coordinator_stats(c: &Self::Coordinator) -> TxnStats;
}
