//! A synchronous in-process backend: chains are applied whole, one at a time, to node images.
//! Used for the cheap warm-up phase of simulated runs and for unit tests of the protocols.

use crate::client::{Completion, KvClient, KvOp, OpId, Outbox};
use crate::verbs::{MemoryImage, VerbError};
use kairos_core::LocalTime;
use std::time::Duration;

pub struct DirectMemory {
    pub images: Vec<MemoryImage>,
    pub crashed: Vec<bool>,
    /// Local time that passes per round of chains.
    pub round_time: Duration,
}

impl DirectMemory {
    pub fn new(images: Vec<MemoryImage>) -> Self {
        let n = images.len();
        DirectMemory { images, crashed: vec![false; n], round_time: Duration::from_nanos(100) }
    }

    /// Runs one operation to completion (chains to crashed nodes are never answered; time then
    /// passes in ticks until the client times them out).
    pub fn run_op(&mut self, client: &mut dyn KvClient, op_id: OpId, op: KvOp, now: &mut LocalTime) -> Completion {
        let mut out = Outbox::new();
        client.invoke(op_id, op, *now, &mut out);
        let mut done = None;
        for _ in 0..100_000 {
            if let Some(i) = out.completions.iter().position(|c| c.op_id == op_id) {
                done = Some(out.completions.swap_remove(i));
            }
            out.completions.clear();
            let issues = std::mem::take(&mut out.issues);
            *now = *now + self.round_time;
            if issues.is_empty() {
                if let Some(d) = done.take() {
                    // Background chains (verification, in-place refresh) are done too.
                    return d;
                }
            }
            if issues.is_empty() {
                *now = *now + client.tick_interval();
                client.on_tick(*now, &mut out);
                continue;
            }
            for issue in issues {
                let node = issue.chain.node as usize;
                if self.crashed.get(node).copied().unwrap_or(true) {
                    continue;
                }
                let img = &mut self.images[node];
                let mut outcomes = Vec::new();
                let mut err: Option<VerbError> = None;
                for v in &issue.chain.verbs {
                    match img.apply(v) {
                        Ok(o) => outcomes.push(o),
                        Err(e) => {
                            err = Some(e);
                            break;
                        }
                    }
                }
                let reply = match err {
                    Some(e) => Err(e),
                    None => Ok(outcomes),
                };
                client.on_reply(issue.tag, reply, *now, &mut out);
            }
        }
        done.unwrap_or(Completion { op_id, result: Err(crate::client::KvError::Timeout), round_trips: 0 })
    }
}
