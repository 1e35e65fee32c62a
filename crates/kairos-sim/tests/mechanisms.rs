//! One test per simulator mechanism: delay, crash, partitions, clock steps, CPU queueing,
//! loss and duplication, pauses, slow nodes, determinism.

use kairos_clock::SimClock;
use kairos_core::{Ctx, LatencyMatrix, LocalTime, NodeId, Process, RegionId, SimTime, TimerId};
use kairos_sim::{CpuModel, Fault, Sim, SimConfig, TraceKind, WireCost};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Clone, Debug, Serialize, Deserialize)]
enum Msg {
    Ping(u64),
}

/// Sends a ping to each peer every `period`, counts what it receives, remembers its clock.
struct Chatter {
    peers: Vec<NodeId>,
    period: Duration,
    sent: u64,
    received: BTreeMap<NodeId, u64>,
    /// The highest ping number from each peer, and how many pings came after a higher one.
    last_seq: BTreeMap<NodeId, u64>,
    out_of_order: u64,
    last_local: LocalTime,
}

impl Chatter {
    fn new(peers: Vec<NodeId>, period: Duration) -> Self {
        Chatter {
            peers,
            period,
            sent: 0,
            received: BTreeMap::new(),
            last_seq: BTreeMap::new(),
            out_of_order: 0,
            last_local: LocalTime::ZERO,
        }
    }
}

impl Process for Chatter {
    type Msg = Msg;
    fn on_start(&mut self, ctx: &mut Ctx<'_, Msg>) {
        self.last_local = ctx.now();
        if !self.period.is_zero() {
            ctx.set_timer(TimerId(0), self.period);
        }
    }
    fn on_message(&mut self, ctx: &mut Ctx<'_, Msg>, from: NodeId, msg: Msg) {
        self.last_local = ctx.now();
        *self.received.entry(from).or_default() += 1;
        let Msg::Ping(seq) = msg;
        let last = self.last_seq.entry(from).or_default();
        self.out_of_order += u64::from(seq <= *last);
        *last = seq.max(*last);
    }
    fn on_timer(&mut self, ctx: &mut Ctx<'_, Msg>, _timer: TimerId) {
        self.last_local = ctx.now();
        self.sent += 1;
        let seq = self.sent;
        ctx.send_all(self.peers.clone(), &Msg::Ping(seq));
        ctx.set_timer(TimerId(0), self.period);
    }
}

fn chatter_world(seed: u64, regions: &[&str], period: Duration) -> Sim<Msg> {
    let mut config = SimConfig::new(seed);
    config.keep_trace_log = true;
    let matrix = LatencyMatrix::gcp();
    let mut sim = Sim::new(config, matrix.clone());
    let n = regions.len() as u32;
    for r in regions {
        let region = matrix.region(r).unwrap();
        sim.add_node(region, SimClock::perfect(), move |me| {
            let peers = (0..n).map(NodeId).filter(|p| *p != me).collect();
            Box::new(Chatter::new(peers, period))
        });
    }
    sim
}

fn received(sim: &Sim<Msg>, at: u32, from: u32) -> u64 {
    sim.role::<Chatter>(NodeId(at)).map_or(0, |c| c.received.get(&NodeId(from)).copied().unwrap_or(0))
}

#[test]
fn a_message_between_regions_arrives_after_the_matrix_delay_within_jitter() {
    let mut sim = chatter_world(1, &["sc", "hk"], Duration::from_millis(1000));
    sim.run_until(SimTime::from_millis(1500));
    let arrival = sim
        .trace_log()
        .iter()
        .find(|e| e.node == NodeId(1) && e.kind == TraceKind::Message { from: NodeId(0) })
        .expect("the ping arrived")
        .time;
    // Sent at 1000 ms; sc→hk one-way = 196.7 / 2 = 98.35 ms; default jitter ±2 %.
    let delay_ms = arrival.as_millis_f64() - 1000.0;
    assert!((delay_ms - 98.35).abs() <= 98.35 * 0.02 + 1e-6, "delay {delay_ms} ms");
    // With jitter off, exactly the matrix delay.
    let mut config = SimConfig::new(1);
    config.network.jitter_ratio = 0.0;
    config.keep_trace_log = true;
    let m = LatencyMatrix::gcp();
    let mut sim = Sim::new(config, m.clone());
    sim.add_node(m.region("sc").unwrap(), SimClock::perfect(), |_| {
        Box::new(Chatter::new(vec![NodeId(1)], Duration::from_millis(1000)))
    });
    sim.add_node(m.region("hk").unwrap(), SimClock::perfect(), |_| Box::new(Chatter::new(vec![], Duration::ZERO)));
    sim.run_until(SimTime::from_millis(1200));
    let arrival = sim.trace_log().iter().find(|e| e.node == NodeId(1) && e.kind != TraceKind::Start).unwrap().time;
    assert_eq!(arrival, SimTime::from_micros(1_098_350));
}

#[test]
fn links_are_fifo_unless_reordering_is_on() {
    for reorder in [false, true] {
        let mut config = SimConfig::new(3);
        config.network.jitter_ratio = 0.5;
        config.network.reorder = reorder;
        let m = LatencyMatrix::gcp();
        let mut sim: Sim<Msg> = Sim::new(config, m.clone());
        sim.add_node(m.region("sc").unwrap(), SimClock::perfect(), |_| Box::new(Burst { to: NodeId(1), count: 200 }));
        sim.add_node(m.region("fi").unwrap(), SimClock::perfect(), |_| Box::new(Order::default()));
        sim.run_until(SimTime::from_secs(2));
        let seen = &sim.role::<Order>(NodeId(1)).unwrap().seen;
        assert_eq!(seen.len(), 200);
        let in_order = seen.windows(2).all(|w| w[0] < w[1]);
        assert_eq!(in_order, !reorder, "reorder = {reorder}");
    }
}

struct Burst {
    to: NodeId,
    count: u64,
}
impl Process for Burst {
    type Msg = Msg;
    fn on_start(&mut self, ctx: &mut Ctx<'_, Msg>) {
        for i in 0..self.count {
            ctx.send(self.to, Msg::Ping(i));
        }
    }
    fn on_message(&mut self, _: &mut Ctx<'_, Msg>, _: NodeId, _: Msg) {}
    fn on_timer(&mut self, _: &mut Ctx<'_, Msg>, _: TimerId) {}
}

#[derive(Default)]
struct Order {
    seen: Vec<u64>,
}
impl Process for Order {
    type Msg = Msg;
    fn on_start(&mut self, _: &mut Ctx<'_, Msg>) {}
    fn on_message(&mut self, _: &mut Ctx<'_, Msg>, _: NodeId, Msg::Ping(i): Msg) {
        self.seen.push(i);
    }
    fn on_timer(&mut self, _: &mut Ctx<'_, Msg>, _: TimerId) {}
}

#[test]
fn a_crashed_node_receives_nothing_and_restarts_with_fresh_state() {
    let mut sim = chatter_world(2, &["sc", "sc"], Duration::from_millis(10));
    sim.run_until(SimTime::from_millis(100));
    assert!(received(&sim, 1, 0) >= 8);
    sim.schedule(SimTime::from_millis(100), Fault::Crash(NodeId(1)));
    sim.run_until(SimTime::from_millis(300));
    assert!(!sim.is_up(NodeId(1)));
    assert!(sim.role::<Chatter>(NodeId(1)).is_none());
    let crash = SimTime::from_millis(100);
    let handled_while_down = sim.trace_log().iter().filter(|e| e.node == NodeId(1) && e.time > crash).count();
    assert_eq!(handled_while_down, 0, "a crashed node handles no message and no timer");
    assert!(sim.stats().dropped_crashed >= 15, "messages to it are dropped");
    sim.schedule(SimTime::from_millis(300), Fault::Restart(NodeId(1)));
    sim.run_until(SimTime::from_millis(305));
    let fresh = sim.role::<Chatter>(NodeId(1)).unwrap();
    assert_eq!(fresh.sent, 0, "volatile state was lost");
    assert!(fresh.received.values().sum::<u64>() <= 1);
    sim.run_until(SimTime::from_millis(400));
    assert!(sim.role::<Chatter>(NodeId(1)).unwrap().sent >= 9, "the restarted node runs its timers again");
}

/// A paused node runs nothing and loses nothing: messages to it wait (none dropped), its timer
/// waits, and at the resume it takes all of them at once, its clock having run on. A timer falls
/// due once however many periods the pause spanned.
#[test]
fn a_paused_node_handles_nothing_then_takes_everything_that_waited_at_the_resume() {
    let mut sim = chatter_world(2, &["sc", "sc"], Duration::from_millis(10));
    sim.run_until(SimTime::from_millis(100));
    let chatter = |sim: &Sim<Msg>| {
        let c = sim.role::<Chatter>(NodeId(1)).unwrap();
        (c.sent, c.received.get(&NodeId(0)).copied().unwrap_or(0), c.last_local)
    };
    let (sent, got, _) = chatter(&sim);
    assert!(got >= 8);
    sim.schedule(SimTime::from_millis(100), Fault::Pause(NodeId(1)));
    sim.run_until(SimTime::from_millis(300));
    let pause = SimTime::from_millis(100);
    let handled_while_paused = sim.trace_log().iter().filter(|e| e.node == NodeId(1) && e.time > pause).count();
    assert_eq!(handled_while_paused, 0, "a paused node handles no message and no timer");
    assert_eq!(chatter(&sim), (sent, got, chatter(&sim).2));
    assert!(received(&sim, 0, 1) <= sent + 1, "it sends nothing either");
    sim.schedule(SimTime::from_millis(300), Fault::Resume(NodeId(1)));
    sim.run_until(SimTime::from_millis(300));
    let (sent_after, got_after, local) = chatter(&sim);
    assert!(got_after >= got + 19, "the pings of the pause all wait for it: {got} then {got_after}");
    assert_eq!(sent_after, sent + 1, "its timer fires once, at the resume");
    assert!(local >= LocalTime::from_millis(299), "its clock ran on: {local:?}");
    assert_eq!(sim.stats().dropped_crashed, 0);
    sim.run_until(SimTime::from_millis(400));
    assert!(chatter(&sim).0 >= sent_after + 9, "and it runs on as before");
}

/// A slow node's messages arrive late by the extra delay while its episode lasts, and those it
/// sends after the episode wait behind them (links stay FIFO); it still hears everyone on time.
#[test]
fn a_slow_node_is_heard_late_and_in_order_and_hears_everyone_on_time() {
    let mut sim = chatter_world(3, &["sc", "sc"], Duration::from_millis(10));
    sim.run_until(SimTime::from_millis(100));
    let (from_1, to_1) = (received(&sim, 0, 1), received(&sim, 1, 0));
    assert!(from_1 >= 8);
    sim.schedule(SimTime::from_millis(100), Fault::Slow { node: NodeId(1), extra_ns: 200_000_000 });
    sim.schedule(SimTime::from_millis(150), Fault::Slow { node: NodeId(1), extra_ns: 0 });
    sim.run_until(SimTime::from_millis(295));
    assert!(received(&sim, 0, 1) <= from_1 + 1, "nothing sent since the start of the episode arrived yet");
    assert!(received(&sim, 1, 0) >= to_1 + 18, "the slow node hears the other on time");
    sim.run_until(SimTime::from_millis(600));
    let arrivals: Vec<SimTime> = sim
        .trace_log()
        .iter()
        .filter(|e| e.node == NodeId(0) && e.kind == TraceKind::Message { from: NodeId(1) })
        .map(|e| e.time)
        .filter(|t| *t > SimTime::from_millis(101))
        .collect();
    assert!(arrivals[0] >= SimTime::from_millis(300), "sent in the episode, 200 ms late: {:?}", arrivals[0]);
    let bunched = arrivals.iter().filter(|t| **t <= SimTime::from_millis(350)).count();
    assert!(bunched >= 20, "sent after the episode, behind it: {bunched} by 350 ms");
    assert!(received(&sim, 0, 1) >= from_1 + 48, "then everything arrives");
    assert_eq!(sim.role::<Chatter>(NodeId(0)).unwrap().out_of_order, 0, "the link stayed FIFO");
}

/// Sends node 1 one ping `after` its start.
struct PingOnce {
    after: Duration,
}

impl Process for PingOnce {
    type Msg = Msg;
    fn on_start(&mut self, ctx: &mut Ctx<'_, Msg>) {
        ctx.set_timer(TimerId(0), self.after);
    }
    fn on_message(&mut self, _: &mut Ctx<'_, Msg>, _: NodeId, _: Msg) {}
    fn on_timer(&mut self, ctx: &mut Ctx<'_, Msg>, _: TimerId) {
        ctx.send(NodeId(1), Msg::Ping(0));
    }
}

/// Arms a timer at its start and cancels it when a message comes; counts the timer's fires.
#[derive(Default)]
struct CancelOnMessage {
    fired: u64,
}

impl Process for CancelOnMessage {
    type Msg = Msg;
    fn on_start(&mut self, ctx: &mut Ctx<'_, Msg>) {
        ctx.set_timer(TimerId(0), Duration::from_millis(50));
    }
    fn on_message(&mut self, ctx: &mut Ctx<'_, Msg>, _: NodeId, _: Msg) {
        ctx.cancel_timer(TimerId(0));
    }
    fn on_timer(&mut self, _: &mut Ctx<'_, Msg>, _: TimerId) {
        self.fired += 1;
    }
}

/// A timer that fell due during a pause, behind a message that cancels it, does not fire:
/// as on the real host, a cancelled or re-armed deadline never fires, however late the node
/// gets to it.
#[test]
fn a_timer_cancelled_by_the_backlog_of_a_pause_does_not_fire() {
    let cancelled = |pause: bool| {
        let mut sim = Sim::new(SimConfig::new(3), LatencyMatrix::gcp());
        sim.add_node(RegionId(0), SimClock::perfect(), |_| Box::new(PingOnce { after: Duration::from_millis(20) }));
        sim.add_node(RegionId(0), SimClock::perfect(), |_| Box::new(CancelOnMessage::default()));
        if pause {
            sim.schedule(SimTime::from_millis(10), Fault::Pause(NodeId(1)));
            sim.schedule(SimTime::from_millis(100), Fault::Resume(NodeId(1)));
        }
        sim.run_until(SimTime::from_millis(200));
        sim.role::<CancelOnMessage>(NodeId(1)).unwrap().fired
    };
    assert_eq!(cancelled(false), 0, "the ping comes at about 20 ms and cancels the 50 ms timer");
    assert_eq!(cancelled(true), 0, "the ping waited, the timer fell due, and the ping still cancels it");
}

#[test]
fn partitions_drop_exactly_the_cut_links() {
    let mut sim = chatter_world(3, &["sc", "sc", "sc", "sc"], Duration::from_millis(10));
    sim.schedule(SimTime::ZERO, Fault::Partition(vec![vec![NodeId(0), NodeId(1)], vec![NodeId(2)]]));
    sim.schedule(SimTime::ZERO, Fault::CutLink { from: NodeId(3), to: NodeId(0) });
    sim.run_until(SimTime::from_millis(500));
    for at in 0..4u32 {
        for from in 0..4u32 {
            if at == from {
                continue;
            }
            let cut = matches!((from, at), (0, 2) | (1, 2) | (2, 0) | (2, 1) | (3, 0));
            let got = received(&sim, at, from);
            if cut {
                assert_eq!(got, 0, "{from}->{at} is cut");
            } else {
                assert!(got >= 45, "{from}->{at} is open, got {got}");
            }
        }
    }
    sim.schedule(SimTime::from_millis(500), Fault::HealAll);
    sim.run_until(SimTime::from_millis(600));
    assert!(received(&sim, 2, 0) >= 9 && received(&sim, 0, 3) >= 9, "healing reopens every link");
}

#[test]
fn a_clock_step_shows_in_that_nodes_local_clock_only() {
    let mut sim = chatter_world(4, &["sc", "sc"], Duration::from_millis(10));
    sim.run_until(SimTime::from_millis(100));
    let before: Vec<u64> = (0..2).map(|n| sim.role::<Chatter>(NodeId(n)).unwrap().last_local.as_nanos()).collect();
    sim.schedule(SimTime::from_millis(100), Fault::ClockStep { node: NodeId(0), delta_ns: -5_000_000_000 });
    sim.run_until(SimTime::from_millis(200));
    let after: Vec<u64> = (0..2).map(|n| sim.role::<Chatter>(NodeId(n)).unwrap().last_local.as_nanos()).collect();
    let advanced = |n: usize| after[n] as i64 - before[n] as i64;
    // Node 1 moved forward by about 100 ms; node 0 by 100 ms minus the 5 s backward step.
    assert!((advanced(1) - 100_000_000).abs() < 10_000_000, "{}", advanced(1));
    assert!((advanced(0) + 4_900_000_000).abs() < 10_000_000, "{}", advanced(0));
}

/// Sends `per_tick` pings to node 1 every millisecond.
struct Load {
    per_tick: u64,
}
impl Process for Load {
    type Msg = Msg;
    fn on_start(&mut self, ctx: &mut Ctx<'_, Msg>) {
        ctx.set_timer(TimerId(0), Duration::from_millis(1));
    }
    fn on_message(&mut self, _: &mut Ctx<'_, Msg>, _: NodeId, _: Msg) {}
    fn on_timer(&mut self, ctx: &mut Ctx<'_, Msg>, _: TimerId) {
        for i in 0..self.per_tick {
            ctx.send(NodeId(1), Msg::Ping(i));
        }
        ctx.set_timer(TimerId(0), Duration::from_millis(1));
    }
}

fn loaded_server(per_tick: u64) -> Sim<Msg> {
    let mut config = SimConfig::new(5);
    config.cpu = CpuModel::Fixed(Duration::from_micros(100)); // capacity: 10 messages per ms
    let m = LatencyMatrix::gcp();
    let mut sim = Sim::new(config, m.clone());
    let sc = RegionId(0);
    sim.add_node(sc, SimClock::perfect(), move |_| Box::new(Load { per_tick }));
    sim.add_node(sc, SimClock::perfect(), |_| Box::new(Order::default()));
    sim.run_until(SimTime::from_millis(200));
    sim
}

#[test]
fn the_cpu_model_queues_work_beyond_a_nodes_capacity() {
    let under = loaded_server(5);
    let over = loaded_server(20);
    assert!(
        under.inbox_len_max(NodeId(1)) <= 5,
        "below capacity the queue stays short: {}",
        under.inbox_len_max(NodeId(1))
    );
    // Offered 20/ms, served 10/ms: after ~200 ms about 2,000 messages wait.
    assert!(
        over.inbox_len_max(NodeId(1)) >= 1_500,
        "beyond capacity a queue builds: {}",
        over.inbox_len_max(NodeId(1))
    );
    let served = over.role::<Order>(NodeId(1)).unwrap().seen.len();
    assert!((1_900..=2_000).contains(&served), "the server works at its capacity of 10/ms: {served}");
    assert!(over.busy_time(NodeId(1)) >= Duration::from_millis(190));
    // Every handler costs the same fixed 100 µs: the longest is that, however long the queue.
    assert_eq!(over.longest_handler(NodeId(1)), Duration::from_micros(100));
}

#[test]
fn loss_and_duplication_happen_at_their_configured_rates() {
    let mut config = SimConfig::new(6);
    config.network.loss = 0.2;
    config.network.duplicate = 0.1;
    let m = LatencyMatrix::gcp();
    let mut sim: Sim<Msg> = Sim::new(config, m);
    sim.add_node(RegionId(0), SimClock::perfect(), |_| Box::new(Burst { to: NodeId(1), count: 10_000 }));
    sim.add_node(RegionId(1), SimClock::perfect(), |_| Box::new(Order::default()));
    sim.run_until(SimTime::from_secs(1));
    let s = sim.stats().clone();
    assert!((1_800..=2_200).contains(&s.dropped_loss), "{s:?}");
    assert!((650..=950).contains(&s.duplicated), "{s:?}");
    assert_eq!(sim.role::<Order>(NodeId(1)).unwrap().seen.len() as u64, 10_000 - s.dropped_loss + s.duplicated);
}

/// A replay delivers old messages again, after everything newer: the receiver sees sequence
/// numbers go backwards. A duplication episode delivers copies only while it lasts.
#[test]
fn replays_deliver_old_messages_again_and_duplication_episodes_end() {
    let m = LatencyMatrix::gcp();
    let mut sim: Sim<Msg> = Sim::new(SimConfig::new(3), m);
    sim.add_node(RegionId(0), SimClock::perfect(), |_| Box::new(Burst { to: NodeId(1), count: 1_000 }));
    sim.add_node(RegionId(1), SimClock::perfect(), |_| Box::new(Order::default()));
    sim.schedule(SimTime::from_secs(1), Fault::Replay(50));
    sim.run_until(SimTime::from_secs(2));
    let seen = &sim.role::<Order>(NodeId(1)).unwrap().seen;
    assert_eq!((seen.len(), sim.stats().replayed), (1_050, 50));
    assert!(seen[..1_000].windows(2).all(|w| w[0] < w[1]), "the originals arrive in order");
    assert!(seen[1_000..].iter().all(|i| *i < 1_000), "then 50 old ones again");

    let mut sim: Sim<Msg> = Sim::new(SimConfig::new(4), LatencyMatrix::gcp());
    sim.add_node(RegionId(0), SimClock::perfect(), |_| {
        Box::new(Chatter::new(vec![NodeId(1)], Duration::from_millis(1)))
    });
    sim.add_node(RegionId(0), SimClock::perfect(), |_| Box::new(Order::default()));
    sim.schedule(SimTime::from_secs(1), Fault::SetDuplicate(0.5));
    sim.schedule(SimTime::from_secs(2), Fault::SetDuplicate(0.0));
    sim.run_until(SimTime::from_secs(3));
    let seen = &sim.role::<Order>(NodeId(1)).unwrap().seen;
    let copies = |lo: u64, hi: u64| seen.iter().filter(|i| (lo..hi).contains(*i)).count() as i64 - (hi - lo) as i64;
    assert_eq!(copies(1, 990), 0, "before the episode");
    assert!((350..=650).contains(&copies(1_010, 1_990)), "during it: {}", copies(1_010, 1_990));
    assert_eq!(copies(2_010, 2_990), 0, "after it");
}

#[test]
fn the_same_seed_gives_the_same_trace_hash_and_another_seed_another() {
    let run = |seed: u64| {
        let mut sim = chatter_world(seed, &["sc", "fi", "br", "hk"], Duration::from_millis(7));
        sim.schedule_all(kairos_sim::fault::random_plan(
            seed,
            &[NodeId(0), NodeId(1), NodeId(2), NodeId(3)],
            SimTime::ZERO,
            SimTime::from_secs(5),
            &Default::default(),
        ));
        sim.run_until(SimTime::from_secs(5));
        (sim.trace_hash(), sim.stats().events_handled)
    };
    let a = run(11);
    assert_eq!(a, run(11));
    assert!(a.1 > 5_000);
    assert_ne!(a.0, run(12).0);
}

/// Counts the pings it receives; its invariant ("fewer than `limit`") breaks on the
/// `limit`-th, which stands for a bug that corrupts state at one event.
struct Counter {
    received: u64,
    limit: u64,
}

impl Process for Counter {
    type Msg = Msg;
    fn on_start(&mut self, _: &mut Ctx<'_, Msg>) {}
    fn on_message(&mut self, _: &mut Ctx<'_, Msg>, _: NodeId, _: Msg) {
        self.received += 1;
    }
    fn on_timer(&mut self, _: &mut Ctx<'_, Msg>, _: TimerId) {}
    fn invariants(&self) -> Result<(), String> {
        if self.received >= self.limit {
            Err(format!("received {} pings, the limit is {}", self.received, self.limit))
        } else {
            Ok(())
        }
    }
}

#[test]
fn a_broken_invariant_stops_the_run_at_the_event_that_broke_it() {
    let matrix = LatencyMatrix::gcp();
    let world = |check: bool| {
        let mut config = SimConfig::new(9);
        config.check_invariants = check;
        let mut sim: Sim<Msg> = Sim::new(config, matrix.clone());
        let r = matrix.region("sc").unwrap();
        sim.add_node(r, SimClock::perfect(), |_| Box::new(Counter { received: 0, limit: 5 }));
        sim.add_node(r, SimClock::perfect(), |_| Box::new(Chatter::new(vec![NodeId(0)], Duration::from_millis(10))));
        sim
    };
    let mut sim = world(true);
    sim.run_until(SimTime::from_millis(1_000));
    let v = sim.violation().expect("the fifth ping breaks the invariant").clone();
    assert_eq!(v.node, Some(NodeId(0)));
    assert_eq!(v.seed, 9);
    assert!(v.what.contains("received 5 pings"), "{v}");
    // Stopped there: no event after it was handled, and time did not run on to the end.
    assert_eq!(sim.stats().events_handled, v.event);
    assert!(sim.now() < SimTime::from_millis(100), "{v}");
    assert!(!sim.step());
    // Off, the same run goes to its end.
    let mut off = world(false);
    off.run_until(SimTime::from_millis(1_000));
    assert!(off.violation().is_none());
    assert!(off.stats().events_handled > 50);

    // A world check is called every so many events and stops the run the same way.
    let mut sim = world(false);
    sim.add_world_check(
        1,
        Box::new(|s: &Sim<Msg>| if s.now() >= SimTime::from_millis(30) { Err("too late".into()) } else { Ok(()) }),
    );
    sim.run_until(SimTime::from_millis(1_000));
    assert!(sim.violation().is_none(), "world checks are off with check_invariants off");
    let mut sim = world(true);
    sim.add_world_check(
        1,
        Box::new(|s: &Sim<Msg>| if s.now() >= SimTime::from_millis(30) { Err("too late".into()) } else { Ok(()) }),
    );
    sim.run_until(SimTime::from_millis(1_000));
    let v = sim.violation().expect("the world check fires");
    assert_eq!(v.node, None);
    assert!(v.time >= SimTime::from_millis(30) && v.time < SimTime::from_millis(50), "{v}");
}

/// Every 100 ms writes three records, then pings node 1 (if `writes`); otherwise only pings.
struct Journaler {
    writes: bool,
    ticks: u64,
}

impl Process for Journaler {
    type Msg = Msg;
    fn on_start(&mut self, ctx: &mut Ctx<'_, Msg>) {
        ctx.set_timer(TimerId(0), Duration::from_millis(100));
    }
    fn on_message(&mut self, _: &mut Ctx<'_, Msg>, _: NodeId, _: Msg) {}
    fn on_timer(&mut self, ctx: &mut Ctx<'_, Msg>, _: TimerId) {
        self.ticks += 1;
        if self.writes {
            for i in 0..3u8 {
                ctx.persist(vec![self.ticks as u8, i]);
            }
        }
        ctx.send(NodeId(1), Msg::Ping(self.ticks));
        ctx.set_timer(TimerId(0), Duration::from_millis(100));
    }
}

fn journal_world(seed: u64, writes: bool) -> Sim<Msg> {
    let matrix = LatencyMatrix::gcp();
    let mut sim = Sim::new(SimConfig::new(seed), matrix.clone());
    let sc = matrix.region("sc").unwrap();
    sim.add_node(sc, SimClock::perfect(), move |_| Box::new(Journaler { writes, ticks: 0 }));
    sim.add_node(sc, SimClock::perfect(), |_| Box::new(Chatter::new(Vec::new(), Duration::ZERO)));
    sim
}

#[test]
fn a_crash_mid_write_keeps_a_strict_prefix_of_that_handlers_records_and_sends_nothing() {
    let mut prefixes = std::collections::BTreeSet::new();
    for seed in 1..=20 {
        let mut sim = journal_world(seed, true);
        // Armed between the 5th and 6th ticks: the 6th handler dies writing.
        sim.schedule(SimTime::from_millis(550), Fault::CrashMidWrite(NodeId(0)));
        sim.run_until(SimTime::from_secs(2));
        assert!(!sim.is_up(NodeId(0)), "seed {seed}: the writer crashed");
        assert_eq!(sim.stats().torn_writes, 1);
        let records = &sim.stored(NodeId(0)).records;
        let whole: Vec<Vec<u8>> = (1..=5u8).flat_map(|t| (0..3u8).map(move |i| vec![t, i])).collect();
        assert_eq!(records[..15], whole[..], "seed {seed}: every earlier handler's records are whole");
        let torn = &records[15..];
        assert!(torn.len() < 3, "seed {seed}: the last handler's records are cut short: {torn:?}");
        assert!(torn.iter().enumerate().all(|(i, r)| *r == vec![6, i as u8]), "seed {seed}: a prefix, in order");
        prefixes.insert(torn.len());
        assert_eq!(received(&sim, 1, 0), 5, "seed {seed}: the torn handler's ping never left");
    }
    assert_eq!(prefixes.len(), 3, "every prefix (0, 1 or 2 records) occurs across seeds: {prefixes:?}");
}

#[test]
fn a_crash_mid_write_waits_for_a_write_and_a_restart_first_disarms_it() {
    let mut sim = journal_world(1, false);
    sim.schedule(SimTime::from_millis(550), Fault::CrashMidWrite(NodeId(0)));
    sim.schedule(SimTime::from_millis(900), Fault::Restart(NodeId(0)));
    sim.run_until(SimTime::from_secs(2));
    assert!(sim.is_up(NodeId(0)), "a node that wrote nothing never crashed");
    assert_eq!(sim.stats().torn_writes, 0);
    assert_eq!(received(&sim, 1, 0), 19, "it pinged on every tick");
}

/// The measured-CPU model charges each message its wire cost by encoded size: the sender for
/// what it sent, the receiver for what it received. Handler CPU is measured (not exact), so
/// the test bounds it: every charge is at least the wire cost, and the wire cost dominates.
#[test]
fn the_measured_model_charges_each_message_its_wire_cost_at_both_ends() {
    let wire = WireCost {
        send_ns_base: 100_000.0,
        send_ns_per_byte: 0.0,
        receive_ns_base: 300_000.0,
        receive_ns_per_byte: 1_000.0,
    };
    let mut config = SimConfig::new(5);
    config.cpu = CpuModel::Measured { scale: 1.0, floor: Duration::ZERO, wire };
    let mut sim = Sim::new(config, LatencyMatrix::gcp());
    let sc = RegionId(0);
    sim.add_node(sc, SimClock::perfect(), |_| Box::new(Load { per_tick: 2 }));
    sim.add_node(sc, SimClock::perfect(), |_| Box::new(Order::default()));
    sim.run_until(SimTime::from_millis(100));
    let received = sim.role::<Order>(NodeId(1)).unwrap().seen.len() as u64;
    assert!(received >= 150, "{received}");
    // Each message is a `Ping(i)`: 2 bytes of postcard (variant, varint i < 128).
    let receive = Duration::from_nanos(300_000 + 2 * 1_000);
    let (sender, receiver) = (sim.busy_time(NodeId(0)), sim.busy_time(NodeId(1)));
    assert!(receiver >= receive * received as u32, "{receiver:?} for {received} messages");
    assert!(receiver < receive * received as u32 + Duration::from_millis(20), "{receiver:?}");
    // The sender sent two per tick, some still in flight.
    let sent = sim.stats().messages_sent;
    assert!(
        sender >= Duration::from_micros(100) * sent as u32
            && sender < Duration::from_micros(100) * sent as u32 + Duration::from_millis(20),
        "{sender:?} for {sent}"
    );
    // A flat cost splits evenly.
    let flat = WireCost::flat(Duration::from_micros(10));
    assert_eq!((flat.send(1_000), flat.receive(0)), (Duration::from_micros(5), Duration::from_micros(5)));
}

#[test]
fn a_recorded_node_replays_alone_every_input_it_handled() {
    let mut sim = chatter_world(3, &["sc", "fi", "br"], Duration::from_millis(10));
    sim.record_inputs(NodeId(1));
    sim.run_until(SimTime::from_millis(200));
    let handled = sim.trace_log().iter().filter(|e| e.node == NodeId(1)).count() as u64;
    assert!(handled > 40, "its start, its timers and the others' pings: {handled}");
    let alone = sim.replay_alone(NodeId(1)).expect("recorded from its start");
    assert_eq!(alone.handlers, handled);
    assert!(alone.handler_max <= alone.cpu);
    assert_eq!(sim.replay_alone(NodeId(1)), None, "a recording replays once");
    // A fresh instance cannot follow a recording that began after the node's start.
    sim.record_inputs(NodeId(2));
    sim.run_until(SimTime::from_millis(300));
    assert_eq!(sim.replay_alone(NodeId(2)), None);
}
