//! # Janus (Mu et al., OSDI 2016): concurrency control and consensus in one protocol
//!
//! Janus orders conflicting transactions by the dependencies replicas observe, instead of by
//! locks or timestamps, and replicates that order in the same round trip:
//!
//! - **Pre-accept** ([`coordinator`]): the coordinator sends each shard's piece to **every**
//!   replica of every shard the transaction touches. Each replica answers with the
//!   transactions it has seen that conflict with it (its dependencies there; [`server`] says
//!   which).
//! - **Fast path**: if on every shard all replicas reported the same dependencies, the
//!   coordinator commits their union at once — one wide-area round trip to the farthest
//!   replica. **Slow path**: once some shard's replies differ (or a replica is overdue) and a
//!   majority of every shard answered, the coordinator accepts the union of all replies at a
//!   majority of every shard, then commits it.
//! - **Commit**: every replica of every shard learns the transaction's final dependencies and
//!   executes it once its ancestors can be ordered ([`graph`]; what waits between walks:
//!   [`waits`]): each strongly connected component of the committed dependency graph runs
//!   as a unit, components dependencies first, members in transaction-id order. An
//!   ancestor on other shards is learned by asking one of its servers (*inquire*). The
//!   closest replica of each shard sends the values read.
//!
//! ## Strict serializability
//! Take two conflicting transactions on shard s. Their pre-accept quorums on s (all replicas
//! on the fast path, a majority on the slow one) share a replica, which saw one of them, T1,
//! before the other, T2. It reported to T2 either T1 itself (T1 not executed there yet) or the
//! last transaction it had executed on the key, whose committed ancestry reaches T1 (that
//! replica executed them in an order every server shares, by induction). T2's committed
//! dependencies hold every reply of its quorum, so the committed graph has a path from T2 to
//! T1. Every server waits until all of a transaction's ancestors are committed and knows their
//! dependencies, so every server sees the same ancestry, the same components and the same
//! order for T1 and T2. Real time: T2 can only depend on T1 through a replica that saw T1
//! first; if T1 was answered before T2 began, no replica can see T2 before T1's commit is
//! decided, so T1 cannot depend on T2 and the order follows real time.
//!
//! ## Round trips ([`analytic_latency`])
//! Without conflicts: the pre-accept round to the farthest replica of any involved shard, then
//! the commit and execution reply from the closest replica of each shard. From a region with
//! replicas that is one wide-area round trip (the closest replica is local); Hong Kong pays a
//! second one to its closest replicas (the paper: "at least 2 WRTTs"). The slow path adds a
//! round trip to a majority.
//!
//! ## What the Tiga paper's Janus is, and how this one differs (stated)
//! The Tiga paper ran the Janus authors' code (NYU-NEWS/janus, `deptran/brq` on `deptran/rcc`;
//! read for this module, no code taken from it). Kairos keeps its rules — fast quorum all
//! replicas, slow quorum a majority, commit with dependencies tagged by their shards, inquiry
//! for foreign ancestors, execution by components — and differs where that code is unsafe or
//! slower than the paper:
//! - **Dependencies:** every unexecuted conflicting transaction plus the last executed one,
//!   not only the last accessor: with a majority slow path, the last accessor alone can leave
//!   two conflicting transactions with no path between them (a replica outside one's quorum
//!   orders them).
//! - **The slow path unions every reply** (the code kept one reply's set) and waits for a
//!   majority of accept replies on every shard (the code moved on after the first); it starts
//!   once replies differ and a majority is in, or when a replica is overdue (the code waited
//!   for all replies, forever if one was lost).
//! - **Component members execute in id order** everywhere (the code used Tarjan's pop order,
//!   which can differ between servers), and a component runs only after every ancestor outside
//!   it executed here.
//! - **No dispatch round:** the pre-accept carries the pieces (the paper's one-shot protocol;
//!   the code first dispatched to one replica per shard, a round trip more for remote
//!   coordinators). The values read come from execution after the commit, not from dispatch.
//! - **No recovery**, as in the code (its recovery paths fail an assertion): no ballots, no
//!   coordinator-failure recovery, and nothing durable, so a crashed server comes back empty.
//!   Campaigns run Janus under message loss, duplication, partitions and clock steps, not
//!   crashes (`kairos sim janus`). A coordinator resends every round until it is answered.
//! - **Garbage collection** the code lacks: executed records are dropped after
//!   `forget_after` ([`server`] says what that bounds).

pub mod coordinator;
pub mod graph;
pub mod msg;
pub mod server;
pub mod waits;

use crate::store::Store;
use std::time::Duration;

use kairos_core::LatencyMatrix;
use kairos_workload::txn::ShardId;
use kairos_workload::{Placement, Topology};

pub use coordinator::Coordinator;
pub use msg::JanusMsg;
pub use server::Server;

use crate::peer::Peer;
use crate::shell::TxnShell;

/// Janus's knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct JanusConfig {
    /// A coordinator resends a round not answered after this long (and goes to the slow path
    /// when a majority of every shard pre-accepted but a replica did not).
    pub resend_after: Duration,
    /// A server asks another replica of its shard for a local ancestor's commit that has not
    /// arrived this long after it began to wait, and asks again about any ancestor this long
    /// after its last inquiry.
    pub inquire_after: Duration,
    /// How often a server repairs (inquires again, forgets old records).
    pub repair_interval: Duration,
    /// Inquiries a server sends per repair round, at most.
    pub inquiries_per_repair: usize,
    /// How long a server keeps an executed transaction's record.
    pub forget_after: Duration,
    /// Inquiries a server holds unanswered at most.
    pub inquirers_max: usize,
    /// Keys per piece and dependencies per message, at most (larger messages are ignored).
    pub keys_max: usize,
    pub deps_max: usize,
    /// **Test only — a bug**: servers execute a committed transaction at once, without
    /// waiting for its dependencies, so shards may order two transactions differently.
    pub unsafe_execute_without_deps: bool,
}

impl Default for JanusConfig {
    fn default() -> Self {
        JanusConfig {
            resend_after: Duration::from_secs(1),
            inquire_after: Duration::from_millis(500),
            repair_interval: Duration::from_millis(100),
            inquiries_per_repair: 1_000,
            forget_after: Duration::from_secs(10),
            inquirers_max: 100_000,
            keys_max: 1_024,
            deps_max: 100_000,
            unsafe_execute_without_deps: false,
        }
    }
}

/// Janus as a [`Peer`].
pub struct Janus;

impl Peer for Janus {
    type Msg = JanusMsg;
    type Server = Server;
    type Coordinator = Coordinator;
    type Config = JanusConfig;

    fn server(topology: &Topology, config: &JanusConfig, shard: ShardId, replica: u32) -> Server {
        Server::new(topology, config, shard, replica)
    }

    fn coordinator(topology: &Topology, config: &JanusConfig, shell: TxnShell) -> Coordinator {
        Coordinator::new(topology, config, shell)
    }

    fn shell(c: &Coordinator) -> &TxnShell {
        c.shell()
    }

    fn store(server: &Server) -> Option<&Store> {
        Some(server.store())
    }

    fn store_mut(server: &mut Server) -> Option<&mut Store> {
        Some(server.store_mut())
    }
}

/// Janus's fast-path commit latency without conflicts or queueing for a coordinator in
/// `region`, a transaction touching every shard: the round trip to the farthest replica of
/// any shard, then the round trip to the farthest of the shards' closest replicas.
///
/// `None` if a region is unknown or there are no servers.
pub fn analytic_latency(region: &str, server_regions: &[&str], placement: Placement, shards: u32) -> Option<Duration> {
    let m = LatencyMatrix::gcp();
    let x = m.region(region).ok()?;
    let regions: Vec<_> = server_regions.iter().map(|r| m.region(r)).collect::<Result<_, _>>().ok()?;
    let n = regions.len();
    if n == 0 || shards == 0 {
        return None;
    }
    let rtt = |s: usize, r: usize| {
        let y = regions[placement.region_index(s, r, n)];
        (m.one_way(x, y) + m.one_way(y, x)).as_secs_f64()
    };
    let shards = shards as usize;
    let farthest = (0..shards).flat_map(|s| (0..n).map(move |r| (s, r))).map(|(s, r)| rtt(s, r)).fold(0.0, f64::max);
    let closest = (0..shards).map(|s| (0..n).map(|r| rtt(s, r)).fold(f64::INFINITY, f64::min)).fold(0.0, f64::max);
    Some(Duration::from_secs_f64(farthest + closest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::fuzz::{no_message_or_timer_panics, Garbage};
    use kairos_core::{NodeId, Rng};
    use kairos_workload::txn::TxnId;
    use msg::Dep;
    use rand::Rng as _;

    fn random_msg(rng: &mut Rng) -> JanusMsg {
        let txn = TxnId::new(NodeId(rng.random_range(8..12)), rng.random_range(0..6));
        let keys: Vec<u64> = (0..rng.random_range(0..4)).map(|_| rng.random_range(0..9)).collect();
        let shards = rng.random_range(0..9);
        let deps: Vec<Dep> = (0..rng.random_range(0..4))
            .map(|_| Dep {
                txn: TxnId::new(NodeId(rng.random_range(8..12)), rng.random_range(0..6)),
                shards: rng.random_range(0..9),
            })
            .collect();
        let (shard, replica) = (rng.random_range(0..4), rng.random_range(0..4));
        let reads: Vec<(u64, u64)> = keys.iter().map(|k| (*k, *k)).collect();
        match rng.random_range(0..8) {
            0 => JanusMsg::PreAccept { txn, shards, keys, pieces: Default::default() },
            1 => JanusMsg::PreAcceptOk { txn, shard, replica, deps },
            2 => JanusMsg::Accept { txn, shards, deps },
            3 => JanusMsg::AcceptOk { txn, shard, replica },
            4 => JanusMsg::Commit { txn, shards, keys, pieces: Default::default(), deps, reply: rng.random_bool(0.5) },
            5 => JanusMsg::Executed { txn, shard, reads },
            6 => JanusMsg::Inquire { txn },
            _ => JanusMsg::InquireReply(msg::Answer { txn, shards, deps, shard, keys, pieces: Default::default() }),
        }
    }

    /// No message a peer could send makes a role panic or breaks its invariants.
    #[test]
    fn random_messages_and_timers_never_panic() {
        let garbage = Garbage {
            random_msg,
            invoke: Coordinator::invoke,
            coordinator_timer_bases: &[1 << 32, 0, 1 << 40],
            server_timers: 3,
            // From the transaction's coordinator half of the time, so that rounds get through.
            sender: |msg, from, rng| match msg {
                JanusMsg::PreAccept { txn, .. } | JanusMsg::Accept { txn, .. } | JanusMsg::Commit { txn, .. }
                    if rng.random_bool(0.5) =>
                {
                    txn.coordinator()
                }
                _ => from,
            },
        };
        let servers = no_message_or_timer_panics::<Janus>(&JanusConfig::default(), &garbage);
        assert!(servers.iter().map(|s| s.stats().pre_accepts).sum::<u64>() > 0);
        assert!(servers.iter().map(|s| s.stats().commits).sum::<u64>() > 0);
    }

    #[test]
    fn the_analytic_latency_follows_the_matrix() {
        let servers = ["sc", "fi", "br"];
        let ms = |r: &str, p| analytic_latency(r, &servers, p, 3).unwrap().as_secs_f64() * 1e3;
        let (sc, fi, br, hk) = (
            ms("sc", Placement::CoLocated),
            ms("fi", Placement::CoLocated),
            ms("br", Placement::CoLocated),
            ms("hk", Placement::CoLocated),
        );
        eprintln!("sc {sc:.1} fi {fi:.1} br {br:.1} hk {hk:.1}");
        // From a server region: one wide-area round trip (to the farthest replica) plus a
        // local one; the placement of the replicas does not matter (every shard has one in
        // every region).
        assert!(sc < hk && fi < hk && br < hk, "{sc} {fi} {br} {hk}");
        assert_eq!(sc, ms("sc", Placement::Separated));
        assert!(analytic_latency("nowhere", &servers, Placement::CoLocated, 3).is_none());
    }
}
