//! How a peer protocol plugs into a deployment: its message, server and coordinator roles and
//! its knobs. `kairos_harness::micro::Bench` builds and runs any [`Peer`] on the same
//! MicroBench deployment as Tiga, with the checks over all its nodes.

use kairos_core::{Message, Process};
use kairos_workload::txn::ShardId;
use kairos_workload::Topology;

use crate::shell::{TxnShell, TxnStats};
use crate::store::Store;

/// How a peer protocol plugs into the deployment. Its servers run a transaction's TPC-C
/// pieces ([`Store::run_pieces`]) in the step that writes the transaction's keys there, so
/// that every peer runs TPC-C.
pub trait Peer: 'static {
    type Msg: Message;
    type Server: Process<Msg = Self::Msg> + 'static;
    type Coordinator: Process<Msg = Self::Msg> + 'static;
    /// The protocol's knobs (timeouts, test-only switches), shared by all its roles.
    type Config: Clone + 'static;
    fn server(topology: &Topology, config: &Self::Config, shard: ShardId, replica: u32) -> Self::Server;
    fn coordinator(topology: &Topology, config: &Self::Config, shell: TxnShell) -> Self::Coordinator;
    /// The coordinator's shell (its counters and per-type samples).
    fn shell(c: &Self::Coordinator) -> &TxnShell;
    /// The coordinator's counters.
    fn coordinator_stats(c: &Self::Coordinator) -> TxnStats {
        Self::shell(c).stats()
    }
    /// A server's store, if it keeps one (a Detock follower only logs): a TPC-C deployment
    /// puts the shard's warehouses in it before the server starts, and checks their
    /// consistency at the end of the run.
    fn store(server: &Self::Server) -> Option<&Store>;
    fn store_mut(server: &mut Self::Server) -> Option<&mut Store>;
    /// Attempts the server holds prepared with no decision applied yet (two-phase commit's
    /// in-doubt window). While one remains, a participant has not run its part of a decided
    /// transaction, so the shards' rows need not agree with each other; at the end of a run
    /// after the faults were repaired, every decision should have arrived.
    fn in_doubt(_server: &Self::Server) -> usize {
        0
    }
    /// How much of its shard's order the server has applied: of a shard's live replicas, the
    /// one with the most is the one whose [`Peer::in_doubt`] counts (a follower that has not
    /// learned the last decisions yet would count decided attempts). It must grow with every
    /// record applied, including those that write nothing (a read-only commit, an abort); by
    /// default the writes the store applied.
    fn applied(server: &Self::Server) -> u64 {
        Self::store(server).map_or(0, Store::writes_applied)
    }
    /// Whether the coordinator has nothing in flight: no transaction pending and nothing it
    /// still owes the servers (a decision they have not acknowledged).
    fn coordinator_settled(c: &Self::Coordinator) -> bool {
        Self::shell(c).inflight() == 0
    }
}

/// Test support the peers' modules share.
#[cfg(test)]
pub(crate) mod fuzz {
    use kairos_core::{Ctx, LocalTime, NodeId, Process, Rng, TimerId};
    use kairos_workload::tpcc::{PreRead, PreReadAnswer, PreReadMsg, PreReadRequest};
    use kairos_workload::txn::Key;
    use kairos_workload::{FixedKeys, OpenLoop, Topology};
    use rand::{Rng as _, SeedableRng};

    use super::Peer;
    use crate::shell::TxnShell;

    /// 3 shards × 3 replicas on nodes 0–8 (the coordinator of [`no_message_or_timer_panics`]
    /// is node 9).
    pub fn three_by_three() -> Topology {
        Topology { shards: (0..3).map(|s| (0..3).map(|r| NodeId(s * 3 + r)).collect()).collect(), leader: vec![0; 3] }
    }

    /// A pre-read request or answer for any warehouse, district and name.
    fn random_pre_read<M: PreReadMsg>(rng: &mut Rng) -> M {
        let txn = kairos_workload::txn::TxnId::new(NodeId(rng.random_range(0..12)), rng.random_range(0..6));
        let read = PreRead { w: rng.random(), d: rng.random(), last_name: rng.random() };
        if rng.random() {
            M::pre_read_request(PreReadRequest { txn, read })
        } else {
            M::pre_read_answer(PreReadAnswer { txn, read, customer: rng.random::<bool>().then(|| rng.random()) })
        }
    }

    /// What [`no_message_or_timer_panics`] needs to know of a protocol.
    pub struct Garbage<M, C> {
        pub random_msg: fn(&mut Rng) -> M,
        /// Starts a transaction on these keys at the coordinator.
        pub invoke: fn(&mut C, &mut Ctx<'_, M>, Vec<Key>) -> bool,
        /// The first id of each kind of the coordinator's timers (a few ids of each are fired).
        pub coordinator_timer_bases: &'static [u64],
        /// The servers' timer ids are below this.
        pub server_timers: u64,
        /// The sender a server sees for a message, given a random one (a protocol may pick the
        /// rightful sender now and then, so that its rounds get through).
        pub sender: fn(&M, NodeId, &mut Rng) -> NodeId,
    }

    /// Feeds 20,000 random messages (from random senders), timers and new transactions to the
    /// servers of [`three_by_three`] and a coordinator of peer `P`, checking every role's
    /// invariants after each: no message a peer could send makes a role panic or breaks its
    /// invariants. Returns the servers, for the caller to check that something got through.
    pub fn no_message_or_timer_panics<P: Peer>(
        config: &P::Config,
        g: &Garbage<P::Msg, P::Coordinator>,
    ) -> Vec<P::Server>
    where
        P::Msg: Clone + PreReadMsg,
    {
        let topology = three_by_three();
        let mut servers: Vec<P::Server> = (0..9).map(|i| P::server(&topology, config, i / 3, i % 3)).collect();
        let shell =
            TxnShell::new(Box::new(FixedKeys::new(vec![vec![1, 2, 3]])), OpenLoop::default(), Default::default(), 0);
        let coordinator = &mut P::coordinator(&topology, config, shell);
        let (mut rng, mut role_rng) = (Rng::seed_from_u64(7), Rng::seed_from_u64(8));
        let mut effects = Vec::new();
        let me = NodeId(9);
        coordinator.on_start(&mut Ctx::new(me, LocalTime::ZERO, &mut role_rng, &mut effects));
        for (i, s) in servers.iter_mut().enumerate() {
            s.on_start(&mut Ctx::new(NodeId(i as u32), LocalTime::ZERO, &mut role_rng, &mut effects));
        }
        for i in 0..20_000u64 {
            let now = LocalTime(i * 1_000_000);
            let from = NodeId(rng.random_range(0..12));
            let msg = if i % 13 == 0 { random_pre_read(&mut rng) } else { (g.random_msg)(&mut rng) };
            let mut ctx = Ctx::new(me, now, &mut role_rng, &mut effects);
            if i % 50 == 0 {
                (g.invoke)(coordinator, &mut ctx, vec![rng.random_range(0..9), rng.random_range(0..9)]);
            }
            if i % 7 == 0 {
                let base = g.coordinator_timer_bases[rng.random_range(0..g.coordinator_timer_bases.len())];
                coordinator.on_timer(&mut ctx, TimerId(base + rng.random_range(0..4)));
            }
            coordinator.on_message(&mut ctx, from, msg.clone());
            let r = rng.random_range(0..servers.len());
            let mut ctx = Ctx::new(NodeId(r as u32), now, &mut role_rng, &mut effects);
            if i % 5 == 0 {
                servers[r].on_timer(&mut ctx, TimerId(rng.random_range(0..g.server_timers)));
            }
            let from = (g.sender)(&msg, from, &mut rng);
            servers[r].on_message(&mut ctx, from, msg);
            servers[r].invariants().unwrap();
            coordinator.invariants().unwrap();
            effects.clear();
        }
        servers
    }
}
