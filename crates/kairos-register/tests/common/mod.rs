//! Message-by-message fixtures shared by the register's review schedules: replicas and clients
//! in `RoleHarness`es, and a network that is a queue the schedule drains or filters.

#![allow(dead_code)] // each test file uses its own subset

use kairos_core::harness::{sent, RoleHarness};
use kairos_core::{Effect, NodeId};
use kairos_register::{Client, ClientConfig, RegisterMsg, Replica};
use std::collections::VecDeque;
use std::time::Duration;

/// A message on the wire: (from, to, message).
pub type Msg = (NodeId, NodeId, RegisterMsg);

/// The messages `from` sent among `effects`.
pub fn msgs(from: NodeId, effects: Vec<Effect<RegisterMsg>>) -> Vec<Msg> {
    sent(&effects).into_iter().map(|(to, m)| (from, to, m.clone())).collect()
}

/// Delivers every queued message among the replicas for which `keep` holds (the others are
/// lost), and every message those deliveries send.
pub fn drain_if(hs: &mut [RoleHarness<Replica>], q: &mut VecDeque<Msg>, keep: impl Fn(&Msg) -> bool) {
    while let Some(m) = q.pop_front() {
        if !keep(&m) {
            continue;
        }
        let (from, to, msg) = m;
        let out = hs[to.index()].deliver(from, msg);
        q.extend(msgs(to, out));
    }
}

/// Delivers every queued message among the replicas (a reliable, in-order network).
pub fn drain(hs: &mut [RoleHarness<Replica>], q: &mut VecDeque<Msg>) {
    drain_if(hs, q, |_| true)
}

/// `replicas` (node ids 0..n), started and recovered from one another's empty states; also
/// returns every message of the first start (for schedules that replay them).
pub fn boot(replicas: &[NodeId]) -> (Vec<RoleHarness<Replica>>, Vec<Msg>) {
    let mut hs: Vec<RoleHarness<Replica>> =
        replicas.iter().map(|&me| RoleHarness::new(me, Replica::new(me, replicas), u64::from(me.0))).collect();
    let mut q = VecDeque::new();
    for (i, h) in hs.iter_mut().enumerate() {
        q.extend(msgs(NodeId(i as u32), h.start()));
    }
    let mut all = Vec::new();
    while let Some(m) = q.pop_front() {
        all.push(m.clone());
        let (from, to, msg) = m;
        let out = hs[to.index()].deliver(from, msg);
        q.extend(msgs(to, out));
    }
    assert!(hs.iter().all(|h| h.role().is_recovered()));
    (hs, all)
}

/// A client at node `me` that runs one operation on key 0 (a write when `write`, else a read),
/// starting 1 ms after it starts, retrying every 60 s and never timing out in a test.
pub fn client(me: NodeId, replicas: &[NodeId], process: u64, write: bool) -> RoleHarness<Client> {
    let mut c = ClientConfig::new(replicas.to_vec(), process);
    c.keys = 1;
    c.write_ratio = if write { 1.0 } else { 0.0 };
    c.max_ops = Some(1);
    c.retry = Duration::from_secs(60);
    c.op_timeout = Duration::from_secs(6000);
    c.start_delay = Duration::from_millis(1);
    RoleHarness::new(me, Client::new(c), 42 + process)
}

/// Runs client `w`'s query round, answered by the replicas in `up`; returns the Store
/// messages it then sends.
pub fn query_round(w: &mut RoleHarness<Client>, hs: &mut [RoleHarness<Replica>], up: &[NodeId]) -> Vec<Msg> {
    let me = w.me();
    w.start();
    let mut stores = Vec::new();
    for (_, to, m) in msgs(me, w.advance(Duration::from_millis(1))) {
        if up.contains(&to) {
            for (_, _, ack) in msgs(to, hs[to.index()].deliver(me, m)) {
                stores.extend(msgs(me, w.deliver(to, ack)));
            }
        }
    }
    stores
}
