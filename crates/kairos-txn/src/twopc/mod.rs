//! Two-phase commit over per-shard Multi-Paxos groups: what 2PL+Paxos ([`crate::tpl`]),
//! OCC+Paxos ([`crate::occ`]) and NCC+ ([`crate::ncc`]) share. They differ only in how a shard
//! leader executes and validates ([`Cc`]); the messages, the log records, the coordinator and
//! the server skeleton are one implementation. (NCC+ merges the execute and prepare phases
//! below into one `Execute` request; its rules and latency are in [`crate::ncc`].)
//!
//! # The protocol (per attempt of a transaction)
//! 1. **Execute** — the coordinator sends `Read` to the leader of every shard the transaction
//!    touches. 2PL: the leader takes the keys' locks under wound-wait and answers with the
//!    values once it holds them all. OCC: the leader answers at once with values and versions.
//! 2. **Prepare** — with every shard's values, the coordinator computes the writes (`v + 1`) and
//!    sends `Prepare` (writes and the versions read) to every leader. 2PL: a leader still
//!    holding the attempt's locks whose versions are the ones read (the coordinator may have
//!    taken a deposed leader's late answer), OCC: a leader whose validation passes (the
//!    versions read are still the latest and no other prepared transaction holds the keys),
//!    replicates a *prepare record* through its shard's Multi-Paxos group and votes yes once it
//!    is committed in the log — if it is then still the ready leader of the ballot it proposed
//!    the record in; otherwise it votes no.
//! 3. **Decide** — all yes: the transaction is committed; the coordinator answers the client
//!    at once (every prepare record is durable in a majority of each shard, so the decision
//!    cannot be lost) and sends `Decide(commit)`; each leader replicates a *commit record*,
//!    applies the writes when it is committed and releases the keys. Any no (or a wound): the
//!    coordinator sends `Decide(abort)` (an abort record where a prepare record exists), and the
//!    shell retries the transaction under the same id after a backoff.
//!
//! # One-phase commit (a transaction on one shard)
//! A transaction whose keys all live on one shard needs no vote of other shards, so the leader
//! decides it alone (`ClassicConfig::one_phase_commit`, on by default): the coordinator sends
//! `Prepare { one_phase: true }` and the leader, after the same locking or validation, logs one
//! *one-phase record* holding the versions read and the writes. Applying that record commits
//! the transaction — **if**, at its position in the log, every version read is still the
//! latest and no prepared attempt holds one of its keys; otherwise it aborts. Every replica
//! evaluates the rule on the same log, so they agree; it makes the log order a serialization
//! order even for a record a deposed leader proposed against stale state and a later leader
//! recovered (the rule that only the proposing leader's vote counts, which protects prepare
//! records, cannot apply: nobody else votes). The leader answers `Vote` with the outcome once the
//! record is applied; no decision, commit record or acknowledgement follows. It saves the commit
//! record's Paxos round and two messages per transaction, and 2PL holds the keys one WRTT and one
//! Paxos round less. The client-visible latency is unchanged (the client was answered after the
//! prepare record anyway).
//!
//! The outcome is now the shard's, not the coordinator's: the coordinator never aborts a
//! one-phase attempt it has asked to commit (no timeout, no `Refused`), only a `Vote` ends it; and
//! once the shard has changed leaders, a leader answers *no* to a one-phase request only after
//! logging an abort record for it — an earlier leader may have proposed the attempt's record,
//! and a later election could still recover it; applied after the abort record it is skipped,
//! applied before, the vote is *yes*.
//!
//! # Latency
//! Execute is one wide-area round trip (WRTT) from the coordinator to the farthest involved
//! leader; prepare is one more plus the leader's Paxos round (leader → nearest majority and
//! back). With no contention the client-visible latency from region c is
//!
//! `max_s RTT(c, L_s) + max_s (RTT(c, L_s) + P_s)`,  `P_s = RTT(L_s, nearest follower of s)`
//!
//! (n = 3: the nearest follower completes the majority). The commit record's replication is
//! off the client's path but holds the keys: 2PL holds a lock for 2 RTT(c, L) + 2 Paxos rounds
//! from its grant; OCC holds its keys from validation to the commit for 1 RTT(c, L) + 2 rounds.
//! [`analytic_latency`] evaluates the formula; `tests/classic.rs` asserts it.
//!
//! # Simplifications (honest list)
//! - Each shard's log sends its records to the followers in batches, every 2 ms or when a
//!   follower acknowledges the last batch (`PaxosConfig::batch_interval`, the interval of
//!   Tiga's log sync), so a record waits up to 2 ms before its Paxos round starts.
//! - Reads and locks live on the leader only; they are volatile. A new leader rebuilds the
//!   locks of prepared transactions from its log before serving (it is *ready* only once its
//!   recovered log is committed); non-prepared attempts lose their locks and vote no.
//! - No leader leases: a deposed leader that does not know it yet may still lock, read and
//!   propose a prepare record, which a later election can recover into the log. So a leader
//!   votes yes only for a prepare record it proposed and saw committed in its own ballot; for
//!   one it found in the log it votes no (the attempt aborts and retries). A commit decision
//!   therefore always rests on records whose leader held the majority when it committed them,
//!   i.e. no newer leader had committed anything its reads missed. The price: attempts in
//!   flight across a leader change abort.
//! - The coordinator is the sole decider and keeps no durable state: it decides abort for an
//!   attempt that has no decision after `attempt_timeout`. A coordinator crash after prepare
//!   leaves prepared transactions holding keys (no cooperative termination). It keeps every
//!   decision until all participants acknowledged it; when runs plus pending decisions reach
//!   its bound it starts no new attempt (the shell retries later) rather than forget one.
//! - Aborts a leader decides alone (refusals, no votes, wounds) are remembered outside the log,
//!   in a bounded per-replica memory (`done_max`); they answer requests but never decide how a
//!   replica applies the log. Logged outcomes are forgotten oldest first beyond `done_max`,
//!   deterministically (in log order) on every replica.
//! - Wound-wait ages are the coordinator's local clock at the first attempt (ties: txn id):
//!   skewed clocks change who is older, never safety.

pub mod coordinator;
pub mod server;

use kairos_consensus::paxos::{PaxosConfig, PaxosMsg};
use kairos_core::LatencyMatrix;
use kairos_workload::tpcc::{PreReadAnswer, PreReadRequest};
use kairos_workload::txn::{Key, ShardId, TxnId, Value};
use kairos_workload::Pieces;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// One attempt of a transaction: the unit the servers lock, validate, prepare and decide.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TxnKey {
    pub txn: TxnId,
    pub attempt: u32,
}

/// How a shard leader executes and validates.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cc {
    /// Two-phase locking with wound-wait (2PL+Paxos).
    Locking,
    /// Optimistic: read without locks, validate versions at prepare (OCC+Paxos).
    Optimistic,
    /// NCC's timestamp rules with response timing control, executed at the leader (NCC+,
    /// [`crate::ncc`]).
    Ncc,
}

/// A shard's log entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Record {
    /// The attempt is prepared here: it holds `keys` until decided, and writes `writes` (and
    /// runs `pieces`, TPC-C's, when committed).
    Prepare {
        tk: TxnKey,
        keys: Vec<Key>,
        writes: Vec<(Key, Value)>,
        pieces: Pieces,
        /// NCC: the attempt's timestamp, which its writes commit at (0 for 2PL and OCC).
        ts: u64,
    },
    /// One-phase commit of a single-shard attempt: applied, it commits `writes` if every
    /// `(key, version)` read is still the latest and no prepared attempt holds one of the keys,
    /// and aborts otherwise (see the module docs).
    CommitOnePhase {
        tk: TxnKey,
        reads: Vec<(Key, u64)>,
        writes: Vec<(Key, Value)>,
        pieces: Pieces,
    },
    Commit {
        tk: TxnKey,
    },
    Abort {
        tk: TxnKey,
    },
}

/// Everything on the wire of 2PL+Paxos and OCC+Paxos.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TxnMsg {
    /// Among the replicas of a shard.
    Paxos(PaxosMsg<Record>),
    /// Coordinator → leader: read `keys` (2PL: lock them first, exclusively — a MicroBench
    /// transaction increments, i.e. reads and writes, every key it touches — or, with
    /// `shared`, in shared mode: the attempt only reads, [`kairos_workload::reads_only`]).
    /// `age_ns`: the transaction's age for wound-wait (smaller is older).
    Read {
        tk: TxnKey,
        age_ns: u64,
        keys: Vec<Key>,
        shared: bool,
    },
    /// Leader → coordinator: (key, value, version) of every key read.
    ReadReply {
        tk: TxnKey,
        shard: ShardId,
        values: Vec<(Key, Value, u64)>,
    },
    /// Leader → coordinator: this attempt is aborted here (wounded, refused, already decided).
    Refused {
        tk: TxnKey,
        shard: ShardId,
    },
    /// Leader → coordinator, answering a resent `Read` (2PL): still waiting for locks (so the
    /// coordinator knows the leader is alive and does not look for another).
    Waiting {
        tk: TxnKey,
        shard: ShardId,
    },
    /// Coordinator → leader: prepare `writes` (and `pieces`, the attempt's TPC-C pieces on
    /// this shard, run when it commits); OCC validates the `(key, version)`s read. With
    /// `one_phase` (the attempt touches this shard only) the leader commits or aborts it alone
    /// and its `Vote` is the outcome.
    Prepare {
        tk: TxnKey,
        reads: Vec<(Key, u64)>,
        writes: Vec<(Key, Value)>,
        pieces: Pieces,
        one_phase: bool,
    },
    Vote {
        tk: TxnKey,
        shard: ShardId,
        yes: bool,
    },
    /// NCC, coordinator → leader: execute the attempt's increments of `keys` at timestamp `ts`
    /// (the coordinator's clock plus its predicted one-way delay, ns) and prepare them.
    Execute {
        tk: TxnKey,
        ts: u64,
        keys: Vec<Key>,
        pieces: Pieces,
    },
    /// NCC, leader → coordinator: executed at the attempt's timestamp and its prepare record is
    /// durable (the *yes*; a *no* is `Refused` or `Vote { yes: false }`). `values`: the values
    /// read; `arrival_ns`: the leader's clock when the `Execute` arrived (the coordinator's
    /// one-way-delay sample).
    Executed {
        tk: TxnKey,
        shard: ShardId,
        values: Vec<(Key, Value)>,
        arrival_ns: u64,
    },
    /// Coordinator → leader: the decision.
    Decide {
        tk: TxnKey,
        commit: bool,
    },
    /// Leader → coordinator: the decision is applied (its record committed) here.
    DecideAck {
        tk: TxnKey,
        shard: ShardId,
    },
    /// A replica that does not lead its shard; `leader`: the replica it believes does.
    NotLeader {
        shard: ShardId,
        leader: Option<u32>,
    },
    /// Coordinator → a replica of the customer's shard: a by-name TPC-C transaction's
    /// pre-read (`kairos_workload::tpcc::pre_read`).
    PreRead(PreReadRequest),
    /// Replica → coordinator: the pre-read's answer.
    PreReadAnswer(PreReadAnswer),
}

kairos_workload::impl_pre_read_msg!(TxnMsg);

impl From<PaxosMsg<Record>> for TxnMsg {
    fn from(m: PaxosMsg<Record>) -> Self {
        TxnMsg::Paxos(m)
    }
}

/// The knobs of 2PL+Paxos and OCC+Paxos (one struct; the `unsafe_…` switches say which
/// protocol they apply to). The defaults are the correct protocols.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassicConfig {
    pub paxos: PaxosConfig,
    /// The coordinator resends a request unanswered for this long; when the shard's presumed
    /// leader has said nothing at all for twice this long while requests are outstanding, it
    /// tries the next replica (a live 2PL leader may be silent a while under lock contention).
    pub retry_timeout: Duration,
    /// The coordinator aborts an attempt that has no decision after this long.
    pub attempt_timeout: Duration,
    /// Commit single-shard transactions with one log record at their shard (module docs).
    pub one_phase_commit: bool,
    /// Most keys in one request (longer requests are refused).
    pub keys_per_request_max: usize,
    /// Most attempts a leader tracks at once; beyond it new ones are refused.
    pub active_max: usize,
    /// Decided attempts a replica remembers (for at-most-once); the oldest are forgotten.
    pub done_max: usize,
    /// TEST ONLY, 2PL: release an attempt's locks as soon as its prepare record is durable
    /// (before the commit applies its writes). Breaks strict serializability.
    pub unsafe_early_release: bool,
    /// TEST ONLY, OCC: skip validation at prepare. Breaks strict serializability.
    pub unsafe_skip_validation: bool,
    /// TEST ONLY, NCC: no response timing control — a piece executes on a key whose undecided
    /// version has a smaller timestamp instead of waiting for its decision (it reads the
    /// committed value under it). Breaks strict serializability (lost updates).
    pub unsafe_ncc_skip_wait: bool,
}

impl Default for ClassicConfig {
    fn default() -> Self {
        ClassicConfig {
            // Records go to the followers in batches every 2 ms, as Tiga's log sync does.
            paxos: PaxosConfig { batch_interval: Duration::from_millis(2), ..PaxosConfig::default() },
            retry_timeout: Duration::from_secs(1),
            attempt_timeout: Duration::from_secs(5),
            one_phase_commit: true,
            keys_per_request_max: 64,
            active_max: 200_000,
            done_max: 1_000_000,
            unsafe_early_release: false,
            unsafe_skip_validation: false,
            unsafe_ncc_skip_wait: false,
        }
    }
}

/// The module docs' no-contention latency of a transaction from `region` touching every shard
/// of a co-located deployment whose leaders are in `leader_region` and replicas in `replicas`
/// (region names of [`LatencyMatrix::gcp`]).
pub fn analytic_latency(region: &str, leader_region: &str, replicas: &[&str]) -> Option<Duration> {
    let (to_leader, paxos) = legs(region, leader_region, replicas)?;
    Some(to_leader * 2 + paxos)
}

/// NCC+'s no-contention latency ([`crate::ncc`]) in the same deployment: one round trip to the
/// leaders, each of which replicates its prepare record (one Paxos round) before it answers.
pub fn ncc_analytic_latency(region: &str, leader_region: &str, replicas: &[&str]) -> Option<Duration> {
    let (to_leader, paxos) = legs(region, leader_region, replicas)?;
    Some(to_leader + paxos)
}

/// (RTT from `region` to the leaders, the leaders' Paxos round: RTT to the follower that
/// completes a majority).
fn legs(region: &str, leader_region: &str, replicas: &[&str]) -> Option<(Duration, Duration)> {
    let m = LatencyMatrix::gcp();
    let (c, l) = (m.region(region).ok()?, m.region(leader_region).ok()?);
    let rtt = |a, b| m.one_way(a, b) + m.one_way(b, a);
    let mut follower_rtts: Vec<Duration> =
        replicas.iter().filter_map(|r| m.region(r).ok()).map(|f| rtt(l, f)).collect::<Vec<_>>();
    follower_rtts.sort();
    // The leader is one of the replicas (its own RTT is the smallest, 0 or local); the
    // majority needs n/2 more (none for a single replica, which commits as it proposes).
    let need = replicas.len() / 2;
    let paxos = if need == 0 { Duration::ZERO } else { follower_rtts.get(need).copied()? };
    Some((rtt(c, l), paxos))
}

#[cfg(test)]
mod tests {
    use super::coordinator::TxnCoordinator;
    use super::server::TxnServer;
    use super::*;
    use crate::shell::{ShellConfig, TxnShell};
    use kairos_consensus::paxos::Ballot;
    use kairos_core::{Ctx, LocalTime, NodeId, Process, Rng, Timer, TimerId};
    use kairos_workload::tpcc::PreRead;
    use kairos_workload::FixedKeys;
    use kairos_workload::OpenLoop;
    use kairos_workload::Topology;
    use rand::SeedableRng;

    fn topology() -> Topology {
        Topology { shards: (0..2).map(|s| (0..3).map(|r| NodeId(s * 3 + r)).collect()).collect(), leader: vec![0, 0] }
    }

    fn garbage() -> Vec<TxnMsg> {
        let tk = TxnKey { txn: TxnId::new(NodeId(6), 0), attempt: u32::MAX };
        let tk0 = TxnKey { txn: TxnId::new(NodeId(99), 1), attempt: 0 };
        let b = Ballot { round: u64::MAX, replica: u32::MAX };
        let read = PreRead { w: u32::MAX, d: u32::MAX, last_name: u32::MAX };
        vec![
            TxnMsg::PreRead(PreReadRequest { txn: tk.txn, read }),
            TxnMsg::PreReadAnswer(PreReadAnswer { txn: tk0.txn, read, customer: Some(u32::MAX) }),
            TxnMsg::Read { tk, age_ns: 0, keys: vec![], shared: false },
            TxnMsg::Read { tk: tk0, age_ns: u64::MAX, keys: vec![0; 1000], shared: true },
            TxnMsg::Read { tk: tk0, age_ns: 1, keys: vec![1, 0, 1], shared: false },
            TxnMsg::Prepare {
                tk: tk0,
                reads: vec![(u64::MAX, u64::MAX)],
                writes: vec![(0, u64::MAX)],
                pieces: Default::default(),
                one_phase: false,
            },
            TxnMsg::Prepare { tk, reads: vec![], writes: vec![(2, 1)], pieces: Default::default(), one_phase: false },
            TxnMsg::Prepare {
                tk: tk0,
                reads: vec![(1, 0)],
                writes: vec![(1, 1)],
                pieces: Default::default(),
                one_phase: true,
            },
            TxnMsg::Prepare {
                tk,
                reads: vec![(u64::MAX, 3)],
                writes: vec![],
                pieces: Default::default(),
                one_phase: true,
            },
            TxnMsg::Decide { tk: tk0, commit: true },
            TxnMsg::Execute { tk: tk0, ts: u64::MAX, keys: vec![0, 0, 1], pieces: Default::default() },
            TxnMsg::Execute { tk, ts: 0, keys: vec![], pieces: Default::default() },
            TxnMsg::Executed { tk: tk0, shard: 0, values: vec![(1, 1)], arrival_ns: u64::MAX },
            TxnMsg::Executed { tk, shard: u32::MAX, values: vec![], arrival_ns: 0 },
            TxnMsg::Decide { tk, commit: false },
            TxnMsg::ReadReply { tk, shard: u32::MAX, values: vec![(0, 0, 0)] },
            TxnMsg::ReadReply { tk: tk0, shard: 0, values: vec![] },
            TxnMsg::Refused { tk, shard: 7 },
            TxnMsg::Waiting { tk, shard: 1 },
            TxnMsg::Vote { tk, shard: 1, yes: true },
            TxnMsg::DecideAck { tk, shard: 0 },
            TxnMsg::NotLeader { shard: 0, leader: Some(u32::MAX) },
            TxnMsg::NotLeader { shard: u32::MAX, leader: None },
            TxnMsg::Paxos(PaxosMsg::Prepare { ballot: b, from: u64::MAX }),
            TxnMsg::Paxos(PaxosMsg::Promise { ballot: b, slots: vec![(u64::MAX, b, None)], applied: 3 }),
            TxnMsg::Paxos(PaxosMsg::Accept(kairos_consensus::paxos::Accept {
                ballot: b,
                first: u64::MAX,
                entries: vec![None],
                commit: 9,
                log_len: 1,
            })),
        ]
    }

    #[test]
    fn coordinator_timer_ids_decode_to_the_timer_that_set_them() {
        use super::coordinator::CoordinatorTimer::{self, *};
        use crate::shell::ShellTimer;
        kairos_core::check_timer_encoding(&[RetryTick, Shell(ShellTimer::Arrival), Shell(ShellTimer::Backoff(7))])
            .unwrap();
        assert_eq!(CoordinatorTimer::from_id(TimerId(2)), None);
    }
    #[test]
    fn servers_and_coordinators_survive_garbage_from_anyone() {
        let t = topology();
        let config = ClassicConfig::default();
        for cc in [Cc::Locking, Cc::Optimistic, Cc::Ncc] {
            for (node, replica) in [(0u32, 0u32), (1, 1)] {
                let mut s = TxnServer::new(cc, &t, &config, 0, replica);
                let mut rng = Rng::seed_from_u64(1);
                let mut fx = Vec::new();
                s.on_start(&mut Ctx::new(NodeId(node), LocalTime::ZERO, &mut rng, &mut fx));
                for from in [0, 1, 3, 6, 99] {
                    for m in garbage() {
                        s.on_message(&mut Ctx::new(NodeId(node), LocalTime::ZERO, &mut rng, &mut fx), NodeId(from), m);
                    }
                }
                s.on_timer(&mut Ctx::new(NodeId(node), LocalTime::ZERO, &mut rng, &mut fx), TimerId(77));
            }
        }
        for ncc in [false, true] {
            let shell = TxnShell::new(
                Box::new(FixedKeys::new(vec![vec![0, 1]])),
                OpenLoop::default(),
                ShellConfig::default(),
                0,
            );
            let mut c =
                if ncc { TxnCoordinator::ncc(&t, &config, shell) } else { TxnCoordinator::new(&t, &config, shell) };
            let mut rng = Rng::seed_from_u64(2);
            let mut fx = Vec::new();
            c.on_start(&mut Ctx::new(NodeId(6), LocalTime::ZERO, &mut rng, &mut fx));
            for from in [0, 1, 3, 6, 99] {
                for m in garbage() {
                    c.on_message(&mut Ctx::new(NodeId(6), LocalTime::ZERO, &mut rng, &mut fx), NodeId(from), m);
                }
            }
            assert_eq!(c.txn_stats().committed, 0);
        }
    }

    /// A shard that already answered has nothing to say until the decision, however long
    /// another shard takes: its silence must not move the coordinator's leader guess (NCC+
    /// campaign seed 38: the guess moved to a follower while the other shard waited on locks,
    /// and the commit decision went there, so a payment was applied at one warehouse and stayed
    /// prepared at the other for seconds).
    #[test]
    fn a_shard_that_answered_keeps_its_leader_while_another_is_slow() {
        let t = topology();
        let config = ClassicConfig::default();
        let load = OpenLoop { rate_per_s: 100.0, stop_after: None, max_txns: Some(1) };
        let shell = TxnShell::new(Box::new(FixedKeys::new(vec![vec![0, 1]])), load, ShellConfig::default(), 0);
        let mut c = TxnCoordinator::ncc(&t, &config, shell);
        let mut rng = Rng::seed_from_u64(2);
        let mut at = |c: &mut TxnCoordinator, ms: u64, event: Result<(u32, TxnMsg), TimerId>| {
            let mut fx = Vec::new();
            let mut ctx = Ctx::new(NodeId(6), LocalTime::from_nanos(ms * 1_000_000), &mut rng, &mut fx);
            match event {
                Ok((from, msg)) => c.on_message(&mut ctx, NodeId(from), msg),
                Err(timer) => c.on_timer(&mut ctx, timer),
            }
            fx.into_iter()
                .filter_map(|e| match e {
                    kairos_core::Effect::Send { to, msg } => Some((to, msg)),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        c.on_start(&mut Ctx::new(NodeId(6), LocalTime::ZERO, &mut Rng::seed_from_u64(1), &mut Vec::new()));
        let arrival = crate::shell::ShellTimer::Arrival;
        let sent = at(&mut c, 10, Err(super::coordinator::CoordinatorTimer::Shell(arrival).id()));
        let tk = match &sent[..] {
            [(NodeId(0), TxnMsg::Execute { tk, .. }), (NodeId(3), TxnMsg::Execute { .. })] => *tk,
            other => panic!("one Execute per shard leader: {other:?}"),
        };
        let executed = |shard, key| TxnMsg::Executed { tk, shard, values: vec![(key, 0)], arrival_ns: 0 };
        at(&mut c, 20, Ok((0, executed(0, 0))));
        // Shard 1 stays silent for three retry timeouts (its leader is alive, behind locks).
        let tick = super::coordinator::CoordinatorTimer::RetryTick.id();
        let mut resent = Vec::new();
        for ms in (250..=3_000).step_by(250) {
            resent.extend(at(&mut c, ms, Err(tick)));
        }
        assert!(resent.iter().all(|(to, m)| matches!(m, TxnMsg::Execute { .. }) && to.0 >= 3), "{resent:?}");
        let decided = at(&mut c, 3_100, Ok((3, executed(1, 1))));
        let to_shard_0: Vec<NodeId> = decided
            .iter()
            .filter(|(to, m)| to.0 < 3 && matches!(m, TxnMsg::Decide { commit: true, .. }))
            .map(|(to, _)| *to)
            .collect();
        assert_eq!(to_shard_0, vec![NodeId(0)], "the decision goes to shard 0's leader: {decided:?}");
    }

    /// Sends `msg` to a one-shard leader and returns the messages it sends to coordinators.
    fn deliver(s: &mut TxnServer, msg: TxnMsg) -> Vec<(NodeId, TxnMsg)> {
        let mut rng = Rng::seed_from_u64(3);
        let mut fx = Vec::new();
        s.on_message(&mut Ctx::new(NodeId(0), LocalTime::ZERO, &mut rng, &mut fx), NodeId(10), msg);
        fx.into_iter()
            .filter_map(|e| match e {
                kairos_core::Effect::Send { to, msg: TxnMsg::Paxos(_) } if to.0 < 3 => None,
                kairos_core::Effect::Send { to, msg } => Some((to, msg)),
                _ => None,
            })
            .collect()
    }

    /// A started 2PL server, replica 0 of a one-shard, three-replica group.
    fn started_locking_leader() -> TxnServer {
        let t = Topology { shards: vec![vec![NodeId(0), NodeId(1), NodeId(2)]], leader: vec![0] };
        let mut s = TxnServer::new(Cc::Locking, &t, &ClassicConfig::default(), 0, 0);
        let mut rng = Rng::seed_from_u64(3);
        s.on_start(&mut Ctx::new(NodeId(0), LocalTime::ZERO, &mut rng, &mut Vec::new()));
        s
    }

    #[test]
    fn wound_wait_older_wounds_younger_holders_and_younger_waits() {
        let mut s = started_locking_leader();
        let tk = |c: u32, seq: u32| TxnKey { txn: TxnId::new(NodeId(c), seq), attempt: 1 };
        let read = |tk: TxnKey, age_ns: u64| TxnMsg::Read { tk, age_ns, keys: vec![7], shared: false };
        let (young, old, younger) = (tk(10, 1), tk(11, 1), tk(12, 1));
        // The young one gets the lock and its value.
        let out = deliver(&mut s, read(young, 10));
        assert!(matches!(&out[..], [(NodeId(10), TxnMsg::ReadReply { .. })]), "{out:?}");
        // An older one wounds it and takes the lock.
        let out = deliver(&mut s, read(old, 5));
        assert!(out.iter().any(|(to, m)| *to == NodeId(10) && matches!(m, TxnMsg::Refused { tk, .. } if *tk == young)));
        assert!(out.iter().any(|(to, m)| *to == NodeId(11) && matches!(m, TxnMsg::ReadReply { .. })));
        // A younger one waits (a resent Read says so) ...
        assert!(deliver(&mut s, read(younger, 20)).is_empty());
        assert!(matches!(&deliver(&mut s, read(younger, 20))[..], [(_, TxnMsg::Waiting { .. })]));
        // ... and gets the lock when the older one aborts; the wounded attempt stays refused.
        let out = deliver(&mut s, TxnMsg::Decide { tk: old, commit: false });
        assert!(out.iter().any(|(to, m)| *to == NodeId(12) && matches!(m, TxnMsg::ReadReply { .. })));
        assert!(out.iter().any(|(to, m)| *to == NodeId(11) && matches!(m, TxnMsg::DecideAck { .. })));
        let out = deliver(
            &mut s,
            TxnMsg::Prepare {
                tk: young,
                reads: vec![],
                writes: vec![(7, 1)],
                pieces: Default::default(),
                one_phase: false,
            },
        );
        assert!(matches!(&out[..], [(_, TxnMsg::Vote { yes: false, .. })]), "{out:?}");
        assert_eq!((s.stats().wounded, s.stats().lock_waits), (1, 1));
    }

    /// 2PL's shared locks: attempts that only read hold a key together; a writer waits for
    /// them, a reader that comes after a waiting writer queues behind it (readers cannot starve
    /// it), and an older writer wounds younger readers as it wounds writers.
    #[test]
    fn readers_share_a_lock_and_never_pass_a_waiting_writer() {
        let mut s = started_locking_leader();
        let tk = |c: u32| TxnKey { txn: TxnId::new(NodeId(c), 1), attempt: 1 };
        let read = |tk: TxnKey, age_ns: u64, shared: bool| TxnMsg::Read { tk, age_ns, keys: vec![7], shared };
        let got_values = |out: &[(NodeId, TxnMsg)], c: u32| {
            out.iter().any(|(to, m)| *to == NodeId(c) && matches!(m, TxnMsg::ReadReply { .. }))
        };
        let abort = |tk: TxnKey| TxnMsg::Decide { tk, commit: false };
        let (r1, r2, w, r3, w_old) = (tk(10), tk(11), tk(12), tk(13), tk(14));
        assert!(got_values(&deliver(&mut s, read(r1, 10, true)), 10));
        assert!(got_values(&deliver(&mut s, read(r2, 20, true)), 11), "two readers hold the key at once");
        assert!(deliver(&mut s, read(w, 30, false)).is_empty(), "a writer waits for the readers");
        assert!(deliver(&mut s, read(r3, 40, true)).is_empty(), "a reader behind a waiting writer waits");
        assert!(!got_values(&deliver(&mut s, abort(r1)), 12), "one reader still holds the key");
        let out = deliver(&mut s, abort(r2));
        assert!(got_values(&out, 12) && !got_values(&out, 13), "the writer first: {out:?}");
        assert!(got_values(&deliver(&mut s, abort(w)), 13), "then the reader");
        // An older writer wounds the younger reader that holds the key.
        let out = deliver(&mut s, read(w_old, 1, false));
        assert!(out.iter().any(|(to, m)| *to == NodeId(13) && matches!(m, TxnMsg::Refused { .. })), "{out:?}");
        assert!(got_values(&out, 14));
        assert_eq!((s.stats().wounded, s.stats().lock_waits), (1, 2));
    }

    /// Delivers `msg` from `from` to server `me` at local time `at`; returns every send.
    fn deliver_at(s: &mut TxnServer, me: u32, from: u32, at: LocalTime, msg: TxnMsg) -> Vec<(NodeId, TxnMsg)> {
        let mut rng = Rng::seed_from_u64(4);
        let mut fx = Vec::new();
        s.on_message(&mut Ctx::new(NodeId(me), at, &mut rng, &mut fx), NodeId(from), msg);
        sends(fx)
    }

    fn sends(fx: Vec<kairos_core::Effect<TxnMsg>>) -> Vec<(NodeId, TxnMsg)> {
        fx.into_iter()
            .filter_map(|e| if let kairos_core::Effect::Send { to, msg } = e { Some((to, msg)) } else { None })
            .collect()
    }

    /// The default knobs, but every record is sent to the followers as it is proposed (these
    /// tests count the `Accept`s a handler sends).
    fn unbatched() -> ClassicConfig {
        let mut config = ClassicConfig::default();
        config.paxos.batch_interval = Duration::ZERO;
        config
    }

    /// The ready leader (replica 0, ballot (0, 0)) of a one-shard, three-replica group.
    fn one_shard_leader(cc: Cc) -> TxnServer {
        let t = Topology { shards: vec![vec![NodeId(0), NodeId(1), NodeId(2)]], leader: vec![0] };
        let mut s = TxnServer::new(cc, &t, &unbatched(), 0, 0);
        let mut rng = Rng::seed_from_u64(3);
        s.on_start(&mut Ctx::new(NodeId(0), LocalTime::ZERO, &mut rng, &mut Vec::new()));
        assert!(s.paxos().is_ready());
        s
    }

    /// An `Accept` of replica 1's ballot (1, 1) carrying `entries` from slot 0, all committed.
    fn accept_from_new_leader(entries: Vec<Record>) -> TxnMsg {
        let n = entries.len() as u64;
        TxnMsg::Paxos(PaxosMsg::Accept(kairos_consensus::paxos::Accept {
            ballot: Ballot { round: 1, replica: 1 },
            first: 0,
            entries: entries.into_iter().map(Some).collect(),
            commit: n,
            log_len: n,
        }))
    }

    fn accepts_with_entries(out: &[(NodeId, TxnMsg)]) -> usize {
        out.iter()
            .filter(|(_, m)| matches!(m, TxnMsg::Paxos(PaxosMsg::Accept(kairos_consensus::paxos::Accept { entries, .. })) if !entries.is_empty()))
            .count()
    }

    /// A replica that, as leader, aborted an attempt alone (no vote for it) must still apply
    /// the attempt's prepare and commit records when a later leader commits them: applying
    /// depends on the log only, or the replicas' stores diverge.
    #[test]
    fn a_replica_applies_a_logged_commit_of_an_attempt_it_once_refused_alone() {
        for cc in [Cc::Locking, Cc::Optimistic] {
            let mut s = one_shard_leader(cc);
            let x = TxnKey { txn: TxnId::new(NodeId(10), 1), attempt: 1 };
            // 2PL: no locks; OCC: a stale version. Either way a no vote decided alone.
            let out = deliver(
                &mut s,
                TxnMsg::Prepare {
                    tk: x,
                    reads: vec![(3, 9)],
                    writes: vec![(3, 5)],
                    pieces: Default::default(),
                    one_phase: false,
                },
            );
            assert!(matches!(&out[..], [(_, TxnMsg::Vote { yes: false, .. })]), "{out:?}");
            // The vote was lost; a new leader locked, prepared and committed the attempt.
            let prepare =
                Record::Prepare { tk: x, keys: vec![3], writes: vec![(3, 5)], ts: 0, pieces: Default::default() };
            deliver_at(&mut s, 0, 1, LocalTime::ZERO, accept_from_new_leader(vec![prepare, Record::Commit { tk: x }]));
            assert_eq!(s.paxos().applied(), 2);
            assert_eq!((s.store().get(3).value, s.store().get(3).version), (5, 2), "{cc:?}: the commit applies");
            assert_eq!(s.prepared_count(), 0);
        }
    }

    /// 2PL: the coordinator may take a deposed leader's late `ReadReply` (older values) while
    /// the new leader holds the locks; the new leader must refuse a prepare whose reads are
    /// not its own versions instead of preparing writes computed from stale values.
    #[test]
    fn a_two_pl_leader_refuses_a_prepare_computed_from_other_versions() {
        let mut s = one_shard_leader(Cc::Locking);
        let x = TxnKey { txn: TxnId::new(NodeId(10), 1), attempt: 1 };
        let out = deliver(&mut s, TxnMsg::Read { tk: x, age_ns: 1, keys: vec![7], shared: false });
        assert!(matches!(&out[..], [(_, TxnMsg::ReadReply { values, .. })] if values[..] == [(7, 0, 0)]), "{out:?}");
        let mut rng = Rng::seed_from_u64(3);
        let mut fx = Vec::new();
        let stale = TxnMsg::Prepare {
            tk: x,
            reads: vec![(7, 4)],
            writes: vec![(7, 12)],
            pieces: Default::default(),
            one_phase: false,
        };
        s.on_message(&mut Ctx::new(NodeId(0), LocalTime::ZERO, &mut rng, &mut fx), NodeId(10), stale);
        let out = sends(fx);
        assert_eq!(accepts_with_entries(&out), 0, "nothing proposed: {out:?}");
        assert!(out.iter().any(|(_, m)| matches!(m, TxnMsg::Refused { tk, .. } if *tk == x)), "{out:?}");
        assert_eq!(s.stats().stale_reads, 1);
        // The same attempt with the leader's own versions prepares.
        let y = TxnKey { txn: TxnId::new(NodeId(10), 2), attempt: 1 };
        deliver(&mut s, TxnMsg::Read { tk: y, age_ns: 2, keys: vec![7], shared: false });
        let out = deliver_at(
            &mut s,
            0,
            10,
            LocalTime::ZERO,
            TxnMsg::Prepare {
                tk: y,
                reads: vec![(7, 0)],
                writes: vec![(7, 1)],
                pieces: Default::default(),
                one_phase: false,
            },
        );
        assert_eq!(accepts_with_entries(&out), 2, "{out:?}");
    }

    /// A message that deposes the leader can also commit its own prepare record (the new leader
    /// recovered it). The deposed leader must not vote yes for it: only a leader that saw the
    /// record committed in its own ballot may.
    #[test]
    fn a_leader_deposed_by_the_accept_that_commits_its_prepare_does_not_vote_yes() {
        for cc in [Cc::Locking, Cc::Optimistic] {
            let mut s = one_shard_leader(cc);
            let x = TxnKey { txn: TxnId::new(NodeId(10), 1), attempt: 1 };
            if cc == Cc::Locking {
                deliver(&mut s, TxnMsg::Read { tk: x, age_ns: 1, keys: vec![7], shared: false });
            }
            let out = deliver_at(
                &mut s,
                0,
                10,
                LocalTime::ZERO,
                TxnMsg::Prepare {
                    tk: x,
                    reads: vec![(7, 0)],
                    writes: vec![(7, 1)],
                    pieces: Default::default(),
                    one_phase: false,
                },
            );
            assert_eq!(accepts_with_entries(&out), 2, "the prepare record is proposed: {out:?}");
            let prepare =
                Record::Prepare { tk: x, keys: vec![7], writes: vec![(7, 1)], ts: 0, pieces: Default::default() };
            let out = deliver_at(&mut s, 0, 1, LocalTime::ZERO, accept_from_new_leader(vec![prepare]));
            assert_eq!(s.prepared_count(), 1, "the record is applied");
            assert!(!s.paxos().is_leader());
            assert!(!out.iter().any(|(_, m)| matches!(m, TxnMsg::Vote { yes: true, .. })), "{cc:?}: {out:?}");
        }
    }

    /// A resent `Prepare` while the decision's record is being logged is answered with the
    /// decision: no for an abort (it used to be yes whatever the decision).
    #[test]
    fn a_prepare_resent_while_an_abort_is_logged_gets_a_no() {
        let mut s = one_shard_leader(Cc::Optimistic);
        let x = TxnKey { txn: TxnId::new(NodeId(10), 1), attempt: 1 };
        let prepare = TxnMsg::Prepare {
            tk: x,
            reads: vec![(7, 0)],
            writes: vec![(7, 1)],
            pieces: Default::default(),
            one_phase: false,
        };
        deliver(&mut s, prepare.clone());
        let ack = PaxosMsg::Accepted { ballot: Ballot { round: 0, replica: 0 }, prefix: 1, gap: false, incarnation: 0 };
        let out = deliver_at(&mut s, 0, 1, LocalTime::ZERO, TxnMsg::Paxos(ack));
        assert!(out.iter().any(|(_, m)| matches!(m, TxnMsg::Vote { yes: true, .. })), "{out:?}");
        deliver(&mut s, TxnMsg::Decide { tk: x, commit: false });
        let out = deliver(&mut s, prepare);
        assert!(matches!(&out[..], [(_, TxnMsg::Vote { yes: false, .. })]), "{out:?}");
    }

    /// Replica 1 of a one-shard 2PL group after it timed out, campaigned and won with replica
    /// 0's promise: the ready leader of ballot (1, 1), at local time 2 s.
    fn second_leader() -> TxnServer {
        let t = Topology { shards: vec![vec![NodeId(0), NodeId(1), NodeId(2)]], leader: vec![0] };
        let mut s = TxnServer::new(Cc::Locking, &t, &unbatched(), 0, 1);
        let mut rng = Rng::seed_from_u64(3);
        s.on_start(&mut Ctx::new(NodeId(1), LocalTime::ZERO, &mut rng, &mut Vec::new()));
        let mut fx = Vec::new();
        s.on_timer(
            &mut Ctx::new(NodeId(1), LocalTime::from_secs(2), &mut rng, &mut fx),
            super::server::ServerTimer::PaxosTick.id(),
        );
        let ballot = s.paxos().ballot();
        assert_eq!(ballot, Ballot { round: 1, replica: 1 });
        let promise = TxnMsg::Paxos(PaxosMsg::Promise { ballot, slots: vec![], applied: 0 });
        deliver_at(&mut s, 1, 0, LocalTime::from_secs(2), promise);
        assert!(s.paxos().is_ready());
        s
    }

    /// After a leadership change an abort decided alone is logged; a resent `Decide(abort)`
    /// waits for the record already proposed instead of proposing another.
    #[test]
    fn a_resent_abort_decision_proposes_one_abort_record() {
        let mut s = second_leader();
        let x = TxnKey { txn: TxnId::new(NodeId(10), 1), attempt: 1 };
        let decide = TxnMsg::Decide { tk: x, commit: false };
        let first = deliver_at(&mut s, 1, 10, LocalTime::from_secs(2), decide.clone());
        assert_eq!(accepts_with_entries(&first), 2, "one abort record, sent to both followers: {first:?}");
        for _ in 0..3 {
            let again = deliver_at(&mut s, 1, 10, LocalTime::from_secs(2), decide.clone());
            assert_eq!(accepts_with_entries(&again), 0, "a resend waits: {again:?}");
        }
        assert_eq!(s.paxos().log_len(), 1);
    }

    /// The follower's acknowledgement of slots `..prefix` in ballot (0, 0).
    fn accepted(prefix: u64) -> TxnMsg {
        let ballot = Ballot { round: 0, replica: 0 };
        TxnMsg::Paxos(PaxosMsg::Accepted { ballot, prefix, gap: false, incarnation: 0 })
    }

    #[test]
    fn a_single_shard_attempt_commits_with_one_record_and_its_vote_is_the_outcome() {
        for cc in [Cc::Locking, Cc::Optimistic] {
            let mut s = one_shard_leader(cc);
            let x = TxnKey { txn: TxnId::new(NodeId(10), 1), attempt: 1 };
            if cc == Cc::Locking {
                deliver(&mut s, TxnMsg::Read { tk: x, age_ns: 1, keys: vec![7], shared: false });
            }
            let prepare = TxnMsg::Prepare {
                tk: x,
                reads: vec![(7, 0)],
                writes: vec![(7, 1)],
                pieces: Default::default(),
                one_phase: true,
            };
            let out = deliver(&mut s, prepare.clone());
            assert!(out.is_empty(), "{cc:?}: no vote before the record is durable: {out:?}");
            // A decision sent by mistake does not decide it: its record does.
            deliver(&mut s, TxnMsg::Decide { tk: x, commit: false });
            let out = deliver_at(&mut s, 0, 1, LocalTime::ZERO, accepted(1));
            assert!(out.iter().any(|(to, m)| *to == NodeId(10) && *m == TxnMsg::Vote { tk: x, shard: 0, yes: true }));
            assert!(!out.iter().any(|(_, m)| matches!(m, TxnMsg::DecideAck { .. })), "{out:?}");
            assert_eq!(s.paxos().log_len(), 1, "{cc:?}: one record, no commit record");
            assert_eq!((s.store().get(7).value, s.store().get(7).version), (1, 1));
            assert_eq!((s.prepared_count(), s.active_count(), s.locks_held()), (0, 0, 0), "{cc:?}: all released");
            // A resend is answered from the logged outcome.
            let out = deliver(&mut s, prepare);
            assert!(matches!(&out[..], [(_, TxnMsg::Vote { yes: true, .. })]), "{out:?}");
        }
    }

    /// The one-phase rule holds on every replica, whoever proposed the record: a record applied
    /// after a write to a key it read, or while a prepared attempt holds one of its keys, or
    /// after an abort record of its attempt, aborts.
    #[test]
    fn a_one_phase_record_applies_as_an_abort_where_its_reads_are_stale() {
        for cc in [Cc::Locking, Cc::Optimistic] {
            let mut s = one_shard_leader(cc);
            let tk = |seq| TxnKey { txn: TxnId::new(NodeId(10), seq), attempt: 1 };
            let one_phase = |seq, ver, value| Record::CommitOnePhase {
                tk: tk(seq),
                reads: vec![(7, ver)],
                writes: vec![(7, value)],
                pieces: Default::default(),
            };
            let records = vec![
                one_phase(1, 0, 1), // slot 0: commits
                one_phase(2, 0, 1), // read version 0: stale
                Record::Prepare { tk: tk(3), keys: vec![7], writes: vec![(7, 2)], ts: 0, pieces: Default::default() }, // holds key 7
                one_phase(4, 1, 2),           // key 7 is prepared
                Record::Commit { tk: tk(3) }, // slot 4: version 5
                Record::Abort { tk: tk(5) },
                one_phase(5, 5, 9), // its abort record came first
                one_phase(6, 5, 3), // commits
            ];
            deliver_at(&mut s, 0, 1, LocalTime::ZERO, accept_from_new_leader(records));
            assert_eq!(s.paxos().applied(), 8);
            assert_eq!((s.store().get(7).value, s.store().get(7).version), (3, 8), "{cc:?}");
            assert_eq!(s.stats().one_phase_invalid, 2, "{cc:?}");
            assert_eq!(s.stats().committed, 3, "{cc:?}");
            assert_eq!(s.prepared_count(), 0);
        }
    }

    /// After a leadership change an earlier leader may have proposed an attempt's one-phase
    /// record; a later election could still recover it. So the new leader logs an abort record
    /// before it answers no, and the answer is the log's.
    #[test]
    fn after_a_leadership_change_a_one_phase_no_is_logged_before_it_is_sent() {
        let mut s = second_leader();
        let ballot = s.paxos().ballot();
        // The attempt read at the old leader; its one-phase request reaches the new one.
        let x = TxnKey { txn: TxnId::new(NodeId(10), 1), attempt: 1 };
        let prepare = TxnMsg::Prepare {
            tk: x,
            reads: vec![(7, 0)],
            writes: vec![(7, 1)],
            pieces: Default::default(),
            one_phase: true,
        };
        let out = deliver_at(&mut s, 1, 10, LocalTime::from_secs(2), prepare.clone());
        assert!(!out.iter().any(|(_, m)| matches!(m, TxnMsg::Vote { .. })), "no unlogged no: {out:?}");
        assert_eq!(accepts_with_entries(&out), 2, "an abort record is proposed: {out:?}");
        let out = deliver_at(&mut s, 1, 10, LocalTime::from_secs(2), prepare);
        assert!(out.is_empty(), "a resend waits for the same record: {out:?}");
        let ack = PaxosMsg::Accepted { ballot, prefix: 1, gap: false, incarnation: 0 };
        let out = deliver_at(&mut s, 1, 0, LocalTime::from_secs(2), TxnMsg::Paxos(ack));
        assert!(out.iter().any(|(_, m)| *m == TxnMsg::Vote { tk: x, shard: 0, yes: false }), "{out:?}");
        assert_eq!(s.paxos().log_len(), 1);
    }

    /// NCC's rules at a leader, on one key: a piece behind an older undecided version waits
    /// for its decision, one behind a newer undecided version or a newer committed one aborts
    /// early, and the waiter executes on the committed value once the decision is logged.
    #[test]
    fn ncc_pieces_wait_for_older_undecided_versions_and_abort_early_behind_newer_ones() {
        let mut s = one_shard_leader(Cc::Ncc);
        let tk = |seq| TxnKey { txn: TxnId::new(NodeId(10), seq), attempt: 1 };
        let execute = |seq, ts| TxnMsg::Execute { tk: tk(seq), ts, keys: vec![7], pieces: Default::default() };
        let executed = |seq, value| TxnMsg::Executed { tk: tk(seq), shard: 0, values: vec![(7, value)], arrival_ns: 0 };
        // A (ts 100) executes; it answers once its prepare record (slot 0) is durable.
        let out = deliver(&mut s, execute(1, 100));
        assert!(out.is_empty(), "{out:?}");
        let out = deliver_at(&mut s, 0, 1, LocalTime::ZERO, accepted(1));
        assert!(out.contains(&(NodeId(10), executed(1, 0))), "{out:?}");
        // B (ts 200) waits for A; C (ts 50) is older than A's undecided version: early abort.
        assert!(deliver(&mut s, execute(2, 200)).is_empty());
        assert!(matches!(&deliver(&mut s, execute(2, 200))[..], [(_, TxnMsg::Waiting { .. })]));
        let out = deliver(&mut s, execute(3, 50));
        assert!(matches!(&out[..], [(_, TxnMsg::Refused { tk: refused, .. })] if *refused == tk(3)), "{out:?}");
        // A commits (slot 1): B executes on A's value and prepares (slot 2).
        deliver(&mut s, TxnMsg::Decide { tk: tk(1), commit: true });
        let out = deliver_at(&mut s, 0, 1, LocalTime::ZERO, accepted(2));
        assert!(out.iter().any(|(_, m)| matches!(m, TxnMsg::DecideAck { .. })), "{out:?}");
        assert_eq!(s.store().get(7).value, 1);
        let out = deliver_at(&mut s, 0, 1, LocalTime::ZERO, accepted(3));
        assert!(out.contains(&(NodeId(10), executed(2, 1))), "{out:?}");
        // D (ts 150) is older than B's undecided version: early abort. After B commits, E
        // (ts 190) is older than the committed version (200): early abort too.
        assert!(matches!(&deliver(&mut s, execute(4, 150))[..], [(_, TxnMsg::Refused { .. })]));
        deliver(&mut s, TxnMsg::Decide { tk: tk(2), commit: true });
        deliver_at(&mut s, 0, 1, LocalTime::ZERO, accepted(4));
        assert_eq!(s.store().get(7).value, 2);
        assert!(matches!(&deliver(&mut s, execute(5, 190))[..], [(_, TxnMsg::Refused { .. })]));
        assert_eq!(s.stats().early_aborts, 3);
        assert_eq!((s.prepared_count(), s.active_count(), s.locks_held()), (0, 0, 0));
        // F (ts 300) executes at once.
        deliver(&mut s, execute(6, 300));
        let out = deliver_at(&mut s, 0, 1, LocalTime::ZERO, accepted(5));
        assert!(out.contains(&(NodeId(10), executed(6, 2))), "{out:?}");
    }

    #[test]
    fn analytic_latency_is_two_round_trips_to_the_leader_plus_its_nearest_follower() {
        let m = LatencyMatrix::gcp();
        let rtt = |a: &str, b: &str| {
            let (a, b) = (m.region(a).unwrap(), m.region(b).unwrap());
            m.one_way(a, b) + m.one_way(b, a)
        };
        let paxos = rtt("sc", "fi").min(rtt("sc", "br"));
        let hk = analytic_latency("hk", "sc", &["sc", "fi", "br"]).unwrap();
        assert_eq!(hk, rtt("hk", "sc") * 2 + paxos);
        assert!(analytic_latency("nowhere", "sc", &["sc"]).is_none());
    }
}
