//! Timers fire after their delay, re-arming replaces the deadline, cancelled timers never fire.

mod common;

use common::{local_cluster, opts, recv_n};
use kairos_core::history::HistoryRecord;
use kairos_core::{Ctx, HistoryEvent, LocalTime, MicroOp, NodeId, OpType, Process, TimerId};
use kairos_net::{metric, spawn_node};
use std::time::Duration;

const T_A: TimerId = TimerId(1);
const T_CANCELLED: TimerId = TimerId(2);
const T_REARMED: TimerId = TimerId(3);
const T_DONE: TimerId = TimerId(4);
const T_TICK: TimerId = TimerId(5);
const T_CANCELLED_IN_HANDLER: TimerId = TimerId(6);
const TICKS: u64 = 10;

struct Timed {
    start: LocalTime,
    ticks: u64,
}

fn event(f: &str, timer: TimerId, value: u64) -> HistoryEvent {
    let op = MicroOp::Write { key: timer.0, value };
    HistoryEvent::new(OpType::Ok, timer.0, f, vec![op])
}

impl Process for Timed {
    type Msg = ();
    fn on_start(&mut self, ctx: &mut Ctx<'_, ()>) {
        self.start = ctx.now();
        ctx.set_timer(T_A, Duration::from_millis(50));
        ctx.set_timer(T_CANCELLED, Duration::from_millis(30));
        ctx.cancel_timer(T_CANCELLED);
        ctx.set_timer(T_REARMED, Duration::from_millis(20));
        ctx.set_timer(T_REARMED, Duration::from_millis(100));
        ctx.set_timer(T_DONE, Duration::from_millis(200));
        ctx.set_timer(T_TICK, Duration::from_millis(2));
        ctx.cancel_timer(TimerId(99)); // not armed: a no-op
    }
    fn on_message(&mut self, _: &mut Ctx<'_, ()>, _: NodeId, _: ()) {}
    fn on_timer(&mut self, ctx: &mut Ctx<'_, ()>, timer: TimerId) {
        if timer == T_TICK {
            self.ticks += 1;
            if self.ticks < TICKS {
                ctx.set_timer(T_TICK, Duration::from_millis(2));
            } else {
                ctx.record(event("ticks", timer, self.ticks));
            }
            return;
        }
        if timer == T_A {
            ctx.set_timer(T_CANCELLED_IN_HANDLER, Duration::from_millis(1));
            ctx.cancel_timer(T_CANCELLED_IN_HANDLER);
        }
        let elapsed_ms = ctx.now().saturating_since(self.start).as_millis() as u64;
        ctx.record(event("timer", timer, elapsed_ms));
    }
}

fn value(r: &HistoryRecord) -> u64 {
    match r.event.value[0] {
        MicroOp::Write { value, .. } => value,
        _ => unreachable!(),
    }
}

#[tokio::test]
async fn timers_fire_rearm_and_cancel() {
    let (cfg, mut listeners) = local_cluster("timers", 1);
    let role = Timed { start: LocalTime::ZERO, ticks: 0 };
    let l = listeners.pop().unwrap();
    let mut node = spawn_node(cfg, NodeId(0), role, opts(l)).await.unwrap();
    let mut history = node.take_history().unwrap();
    let all = recv_n(&mut history, 4).await;
    // The self-re-arming tick chain ran exactly TICKS times (when it ends relative to the
    // other timers depends on scheduling, so it is checked apart).
    let ticks: Vec<u64> = all.iter().filter(|r| r.event.f == "ticks").map(value).collect();
    assert_eq!(ticks, vec![TICKS], "{all:?}");
    let recs: Vec<_> = all.into_iter().filter(|r| r.event.f == "timer").collect();
    let order: Vec<u64> = recs.iter().map(|r| r.event.process).collect();
    let expected = vec![T_A.0, T_REARMED.0, T_DONE.0];
    assert_eq!(order, expected, "deadline order, cancelled ones absent: {recs:?}");
    // Lower bounds only: a timer never fires early (1 ms of slack for the system clock).
    assert!(value(&recs[0]) >= 49, "{recs:?}");
    assert!(value(&recs[1]) >= 99, "re-arming replaced the 20 ms deadline: {recs:?}");
    assert!(value(&recs[2]) >= 199, "{recs:?}");
    // Nothing else is armed: no further record appears.
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(history.try_recv().is_err(), "a cancelled timer fired");
    assert_eq!(node.metric(metric::TIMERS_FIRED), 3 + TICKS);
    node.shutdown().await.unwrap();
}
