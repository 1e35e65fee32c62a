//! The trace: a running hash of every handled event (so that two runs can be compared bit for
//! bit) and, on request, a log of them.

use crate::fault::Fault;
use kairos_core::{NodeId, SimTime, TimerId};
use serde::Serialize;
use xxhash_rust::xxh3::Xxh3;

/// What a node handled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceKind {
    Start,
    Message { from: NodeId },
    Timer(TimerId),
}

/// One handled event, for tests and `kairos sim --trace`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    pub time: SimTime,
    pub node: NodeId,
    pub kind: TraceKind,
}

pub(crate) struct Tracer {
    hasher: Xxh3,
    buf: Vec<u8>,
    log: Option<Vec<TraceEntry>>,
}

impl Tracer {
    pub fn new(keep_log: bool) -> Self {
        Tracer { hasher: Xxh3::new(), buf: Vec::with_capacity(256), log: keep_log.then(Vec::new) }
    }

    pub fn record<M: Serialize>(&mut self, entry: TraceEntry, msg: Option<&M>) {
        let (tag, arg) = match entry.kind {
            TraceKind::Start => (0u8, 0u64),
            TraceKind::Message { from } => (1, from.0 as u64),
            TraceKind::Timer(id) => (2, id.0),
        };
        self.hasher.update(&entry.time.as_nanos().to_le_bytes());
        self.hasher.update(&entry.node.0.to_le_bytes());
        self.hasher.update(&[tag]);
        self.hasher.update(&arg.to_le_bytes());
        if let Some(m) = msg {
            self.buf.clear();
            // Serializing a protocol message into a Vec cannot fail for serde-derived types;
            // if a hand-written impl does fail, the message still counts through its header.
            if let Ok(bytes) = postcard::to_extend(m, std::mem::take(&mut self.buf)) {
                self.hasher.update(&bytes);
                self.buf = bytes;
            }
        }
        if let Some(log) = &mut self.log {
            log.push(entry);
        }
    }

    pub fn fault(&mut self, time: SimTime, fault: &Fault) {
        self.hasher.update(&time.as_nanos().to_le_bytes());
        self.hasher.update(fault.to_string().as_bytes());
    }

    pub fn digest(&self) -> u64 {
        self.hasher.digest()
    }

    pub fn log(&self) -> &[TraceEntry] {
        self.log.as_deref().unwrap_or(&[])
    }
}
