//! The paper's Figure 5: why timestamp agreement needs a second round.
//!
//! Two shards with one replica each (leaders L1 for key x, L2 for key y). T1 touches both;
//! L1 had to bump it (T0 had just been released on x), so L1 holds T1 at 102 while L2 holds it
//! at 90; the agreed timestamp is 102. L2 revokes T1 and re-queues it at 102, but L2's clock is
//! slow. T2 (x only) arrives at L1; T3 (y only) comes from a coordinator whose clock is behind
//! and gets timestamp 95 at L2, below T1's 102.
//!
//! - With the second round, L1 keeps x locked until L2 confirms it adopted 102, which L2 can do
//!   only after its clock passes 102 and it re-executes T1. T2 therefore commits after T3 was
//!   invoked, and the history is strictly serializable.
//! - Without it (a test-only switch), L1 releases T2 at once; T2 commits before T3 starts, yet
//!   T3 precedes T1 (it read y before T1's write) and T1 precedes T2 (T2 read T1's x): a
//!   cycle through real time — timestamp inversion — which the checker must report.
//!
//! Every clock reading and every delivery is chosen by the test: nothing is left to chance.

use kairos_check::{check, Model};
use kairos_core::history::{HistoryRecord, OpType};
use kairos_core::{Ctx, Effect, LocalTime, NodeId, Process, Timer};
use kairos_tiga::coordinator::Coordinator;
use kairos_tiga::server::{Server, ServerTimer};
use kairos_tiga::{TigaConfig, TigaMsg, Topology};
use kairos_workload::FixedKeys;
use rand::SeedableRng;
use std::time::Duration;

const L1: NodeId = NodeId(0);
const L2: NodeId = NodeId(1);
/// Key x and key y: the first MicroBench (integer) keys on shard 0 and shard 1 (a key's
/// shard is the xxh3 of its decimal digits mod 2).
fn key_on(shard: u64) -> u64 {
    (0..).find(|k: &u64| kairos_tiga::ops::key_id(k.to_string().as_bytes()) % 2 == shard).unwrap()
}
fn x() -> u64 {
    key_on(0)
}
fn y() -> u64 {
    key_on(1)
}

fn ms(t: u64) -> LocalTime {
    LocalTime::from_millis(t)
}

/// Holds the roles, the messages in flight (delivered only when the script says), and the
/// history stamped with the script's true time.
struct World {
    servers: Vec<Server>,
    coordinators: Vec<Coordinator>,
    in_flight: Vec<(NodeId, NodeId, TigaMsg)>,
    history: Vec<HistoryRecord>,
    true_ms: u64,
    rng: kairos_core::Rng,
    log: Vec<String>,
}

impl World {
    fn new(skip_second_round: bool) -> Self {
        let topology = Topology { shards: vec![vec![L1], vec![L2]], leader: vec![0, 0] };
        let config =
            TigaConfig { margin: Duration::ZERO, unsafe_skip_second_round: skip_second_round, ..TigaConfig::default() };
        let servers = (0..2).map(|s| Server::new(topology.clone(), config.clone(), s, 0)).collect();
        let coordinators = (0..4)
            .map(|c| {
                let zero = vec![vec![Duration::ZERO]; 2];
                Coordinator::new(topology.clone(), config.clone(), Box::new(FixedKeys::new(vec![])), zero, c * 100)
            })
            .collect();
        World {
            servers,
            coordinators,
            in_flight: Vec::new(),
            history: Vec::new(),
            true_ms: 0,
            rng: kairos_core::Rng::seed_from_u64(5),
            log: Vec::new(),
        }
    }

    fn coordinator_node(c: usize) -> NodeId {
        NodeId(2 + c as u32)
    }

    fn effects(&mut self, from: NodeId, effects: Vec<Effect<TigaMsg>>) {
        for e in effects {
            match e {
                Effect::Send { to, msg } => self.in_flight.push((from, to, msg)),
                Effect::History(event) => {
                    let index = self.history.len() as u64;
                    self.history.push(HistoryRecord { index, time: self.true_ms * 1_000_000, event });
                }
                _ => {}
            }
        }
    }

    /// Runs `f` on node `node` with its clock reading `local_ms`, at true time `true_ms`.
    fn at(
        &mut self,
        true_ms: u64,
        node: NodeId,
        local_ms: u64,
        f: impl FnOnce(&mut dyn Process<Msg = TigaMsg>, &mut Ctx<'_, TigaMsg>),
    ) {
        assert!(true_ms >= self.true_ms, "the script runs forward in true time");
        self.true_ms = true_ms;
        let mut effects = Vec::new();
        {
            let mut ctx = Ctx::new(node, ms(local_ms), &mut self.rng, &mut effects);
            let role: &mut dyn Process<Msg = TigaMsg> =
                if node.0 < 2 { &mut self.servers[node.index()] } else { &mut self.coordinators[node.index() - 2] };
            f(role, &mut ctx);
        }
        self.effects(node, effects);
    }

    fn submit(&mut self, true_ms: u64, c: usize, local_ms: u64, keys: Vec<u64>) {
        self.true_ms = true_ms;
        let node = Self::coordinator_node(c);
        let mut effects = Vec::new();
        {
            let mut ctx = Ctx::new(node, ms(local_ms), &mut self.rng, &mut effects);
            self.coordinators[c].submit_increments(&mut ctx, &keys).unwrap();
        }
        self.effects(node, effects);
    }

    /// Delivers every in-flight message matching `pick` (in send order) at the receiver's
    /// clock `local_ms`, and returns how many were delivered.
    fn deliver(&mut self, true_ms: u64, local_ms: u64, pick: impl Fn(NodeId, NodeId, &TigaMsg) -> bool) -> usize {
        let (now, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.in_flight).into_iter().partition(|(f, t, m)| pick(*f, *t, m));
        self.in_flight = later;
        let n = now.len();
        for (from, to, msg) in now {
            self.log.push(format!("{true_ms}ms: {from}->{to} {}", msg.kind()));
            self.at(true_ms, to, local_ms, |role, ctx| role.on_message(ctx, from, msg));
        }
        n
    }

    fn release(&mut self, true_ms: u64, server: NodeId, local_ms: u64) {
        self.at(true_ms, server, local_ms, |role, ctx| role.on_timer(ctx, ServerTimer::Release.id()));
    }

    fn completion_time(&self, process: u64) -> Option<u64> {
        self.history
            .iter()
            .find(|r| r.event.process == process && r.event.op_type == OpType::Ok)
            .map(|r| r.time / 1_000_000)
    }
}

/// The submit of coordinator `c`'s transaction to server `to`.
fn submit_to(to: NodeId, c: usize) -> impl Fn(NodeId, NodeId, &TigaMsg) -> bool {
    move |f, t, m| f == World::coordinator_node(c) && t == to && matches!(m, TigaMsg::Submit(_))
}
fn replies_to(c: usize) -> impl Fn(NodeId, NodeId, &TigaMsg) -> bool {
    move |_, t, m| t == World::coordinator_node(c) && matches!(m, TigaMsg::Reply(_))
}
fn agree_to(to: NodeId, confirm: bool) -> impl Fn(NodeId, NodeId, &TigaMsg) -> bool {
    move |_, t, m| t == to && matches!(m, TigaMsg::Agree(a) if a.confirm == confirm)
}

/// Plays the scenario; returns the world afterwards. Coordinators: C0 runs T0, C1 T1,
/// C2 T2, C3 T3 (Jepsen processes 0, 100, 200, 300).
fn play(skip_second_round: bool) -> World {
    let mut w = World::new(skip_second_round);
    // T1 (x, y) is proposed at 90. L2 receives it in time and executes it at 90.
    w.submit(80, 1, 90, vec![x(), y()]);
    w.deliver(81, 91, submit_to(L2, 1));
    // T0 (x) at 100 reaches L1 first and is released there.
    w.submit(95, 0, 100, vec![x()]);
    w.deliver(96, 101, submit_to(L1, 0));
    w.deliver(97, 101, replies_to(0)); // T0 commits (one replica per shard: fast quorum of 1).
                                       // T1 reaches L1 late: 90 ≤ last released 100 on x, so L1 bumps it to its clock, 102.
    w.deliver(98, 102, submit_to(L1, 1));
    w.release(99, L1, 103);
    // Round 1: L1 learns 90 from L2 (case 2 for L1), L2 learns 102 (case 3: revoke, re-queue).
    w.deliver(100, 103, agree_to(L1, false));
    w.deliver(100, 92, agree_to(L2, false));
    // T2 (x) at 104 reaches L1 when its clock passes 104.
    w.submit(101, 2, 104, vec![x()]);
    w.deliver(102, 105, submit_to(L1, 2));
    w.deliver(103, 0, replies_to(2)); // without round 2 T2 was released: T2 commits now.
                                      // T3 (y) from a coordinator whose clock is behind: timestamp 95 at L2, whose clock reads 96.
    w.submit(104, 3, 95, vec![y()]);
    w.deliver(105, 96, submit_to(L2, 3));
    w.deliver(106, 0, replies_to(3)); // T3 commits, having read y before T1's write.
                                      // L2's clock passes 102: it re-executes T1 and confirms to L1 (round 2).
    w.release(110, L2, 103);
    w.deliver(111, 0, replies_to(1));
    w.deliver(112, 106, agree_to(L1, true));
    w.deliver(113, 0, replies_to(2)); // with round 2, T2 is released only now.
    w.deliver(114, 0, replies_to(1)); // T1 commits at 102 on both shards.
    w
}

#[test]
fn with_the_second_round_t2_waits_for_l2s_confirmation_and_the_history_is_strictly_serializable() {
    let w = play(false);
    let t2 = w.completion_time(200).expect("T2 commits");
    let t3_invoked = w.history.iter().find(|r| r.event.process == 300).unwrap().time / 1_000_000;
    assert!(t2 >= 113, "T2 committed at {t2} ms, before L2's confirmation for T1 (112 ms):\n{}", w.log.join("\n"));
    assert!(t3_invoked < t2);
    for p in [0, 100, 200, 300] {
        assert!(w.completion_time(p).is_some(), "process {p} committed:\n{}", w.log.join("\n"));
    }
    let report = check(&w.history, Model::StrictSerializable).unwrap();
    assert!(report.valid, "{report}\n{}", w.log.join("\n"));
}

#[test]
fn without_the_second_round_the_checker_finds_the_timestamp_inversion() {
    let w = play(true);
    let t2 = w.completion_time(200).expect("T2 commits");
    let t3_invoked = w.history.iter().find(|r| r.event.process == 300).unwrap().time / 1_000_000;
    assert!(t2 < t3_invoked, "T2 ({t2} ms) completes before T3 starts ({t3_invoked} ms):\n{}", w.log.join("\n"));
    for p in [0, 100, 200, 300] {
        assert!(w.completion_time(p).is_some(), "process {p} committed:\n{}", w.log.join("\n"));
    }
    let serializable = check(&w.history, Model::Serializable).unwrap();
    assert!(serializable.valid, "it is still serializable: {serializable}");
    let report = check(&w.history, Model::StrictSerializable).unwrap();
    assert!(!report.valid, "the inversion went unnoticed:\n{report}\n{}", w.log.join("\n"));
    assert!(report.disagreement.is_none(), "{report}");
    let names: Vec<&str> = report.anomalies.iter().map(|a| a.name.as_str()).collect();
    assert!(
        names.iter().all(|n| n.ends_with("realtime")),
        "a cycle through real time, not another anomaly: {names:?}\n{report}"
    );
    eprintln!("{report}");
}
