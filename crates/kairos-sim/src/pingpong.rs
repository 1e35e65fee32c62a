//! A ping-pong world for measuring the bare simulator: two nodes bounce `tokens` messages
//! back and forth, so about `tokens` events are always pending. Used by `kairos bench des`
//! and the criterion benchmark.

use crate::{Sim, SimConfig};
use kairos_clock::SimClock;
use kairos_core::{Ctx, LatencyMatrix, NodeId, Process, TimerId};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ball(pub u32);

/// Returns every ball it receives; node 0 serves `tokens` balls at start.
pub struct Paddle {
    serve: u32,
}

impl Process for Paddle {
    type Msg = Ball;
    fn on_start(&mut self, ctx: &mut Ctx<'_, Ball>) {
        for i in 0..self.serve {
            ctx.send(NodeId(1), Ball(i));
        }
    }
    fn on_message(&mut self, ctx: &mut Ctx<'_, Ball>, from: NodeId, ball: Ball) {
        ctx.send(from, ball);
    }
    fn on_timer(&mut self, _: &mut Ctx<'_, Ball>, _: TimerId) {}
}

/// Two nodes in two regions of the reference matrix with `tokens` balls in flight.
pub fn world(seed: u64, tokens: u32) -> Sim<Ball> {
    let matrix = LatencyMatrix::gcp();
    let mut sim = Sim::new(SimConfig::new(seed), matrix.clone());
    let (a, b) = (matrix.region("sc").expect("gcp has sc"), matrix.region("fi").expect("gcp has fi"));
    sim.add_node(a, SimClock::perfect(), move |_| Box::new(Paddle { serve: tokens }));
    sim.add_node(b, SimClock::perfect(), |_| Box::new(Paddle { serve: 0 }));
    // Let the serve happen so that `tokens` deliveries are pending.
    sim.step();
    sim.step();
    sim
}
