//! Fixtures of the schedule tests that drive two shards of three real servers message by
//! message: shard 0 on nodes 0–2, shard 1 on nodes 3–5, replica 0 leading both in view 0.

#![allow(dead_code)] // each test file uses its own part

use kairos_core::harness::{sent, RoleHarness};
use kairos_core::{Effect, NodeId};
use kairos_tiga::coordinator::Coordinator;
use kairos_tiga::msg::{ShardId, TigaMsg, TxnId};
use kairos_tiga::ops::{key_id, Op, OpKind};
use kairos_tiga::server::Server;
use kairos_tiga::topology::{TigaConfig, Topology};
use kairos_workload::FixedKeys;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

pub const COORDINATOR: NodeId = NodeId(10);
pub const VM: NodeId = NodeId(20);

pub fn topology() -> Topology {
    Topology {
        shards: vec![vec![NodeId(0), NodeId(1), NodeId(2)], vec![NodeId(3), NodeId(4), NodeId(5)]],
        leader: vec![0, 0],
    }
}

pub fn server(shard: ShardId, replica: u32) -> Server {
    Server::new(topology(), TigaConfig::default(), shard, replica).with_view_managers(vec![VM])
}

/// Test key `k` as bytes: a key on shard `k mod 2`.
pub fn tk(k: u64) -> Vec<u8> {
    (0u32..).map(|j| format!("k{k}-{j}").into_bytes()).find(|b| key_id(b) % 2 == k % 2).expect("some suffix")
}

/// Messages in flight: `(from, to, message)`.
pub type Queue = VecDeque<(NodeId, NodeId, TigaMsg)>;

/// Both shards' six servers and one coordinator, driven message by message: each schedule
/// says which messages pass.
pub struct Cluster {
    pub servers: BTreeMap<NodeId, RoleHarness<Server>>,
    pub coord: RoleHarness<Coordinator>,
}

impl Cluster {
    pub fn new(config: TigaConfig) -> Self {
        let mut servers = BTreeMap::new();
        for (shard, nodes) in topology().shards.iter().enumerate() {
            for (replica, &node) in nodes.iter().enumerate() {
                let s = Server::new(topology(), config.clone(), shard as ShardId, replica as u32);
                let mut h = RoleHarness::new(node, s.with_view_managers(vec![VM]), 1 + u64::from(node.0));
                h.start();
                servers.insert(node, h);
            }
        }
        let owd = vec![vec![Duration::from_millis(5); 3]; 2];
        let c = Coordinator::new(topology(), config, Box::new(FixedKeys::new(vec![])), owd, 0);
        let mut coord = RoleHarness::new(COORDINATOR, c, 99);
        coord.start();
        Cluster { servers, coord }
    }

    pub fn s(&self, n: u32) -> &Server {
        self.servers[&NodeId(n)].role()
    }

    /// Delivers `queue` and whatever it causes, dropping what `allow` refuses.
    pub fn pump(&mut self, mut queue: Queue, allow: impl Fn(NodeId, NodeId, &TigaMsg) -> bool) {
        let mut steps = 0;
        while let Some((from, to, msg)) = queue.pop_front() {
            steps += 1;
            assert!(steps < 1_000_000, "message storm");
            if !allow(from, to, &msg) {
                continue;
            }
            let effects = if to == COORDINATOR {
                self.coord.deliver(from, msg)
            } else if let Some(h) = self.servers.get_mut(&to) {
                h.deliver(from, msg)
            } else {
                continue;
            };
            queue.extend(outgoing(to, &effects));
        }
    }

    /// Lets `d` pass on the servers `nodes` only, in ten steps.
    pub fn tick(&mut self, nodes: &[u32], d: Duration, allow: impl Fn(NodeId, NodeId, &TigaMsg) -> bool) {
        for _ in 0..10 {
            let mut q = Queue::new();
            for n in nodes {
                let e = self.servers.get_mut(&NodeId(*n)).expect("a server").advance(d / 10);
                q.extend(outgoing(NodeId(*n), &e));
            }
            self.pump(q, &allow);
        }
    }

    /// Lets `d` pass everywhere (all clocks in step), 10 ms at a time.
    pub fn run_for(&mut self, d: Duration, allow: impl Fn(NodeId, NodeId, &TigaMsg) -> bool) {
        let step = Duration::from_millis(10);
        let mut left = d;
        while !left.is_zero() {
            let dt = step.min(left);
            left -= dt;
            let mut q = Queue::new();
            for (node, h) in self.servers.iter_mut() {
                q.extend(outgoing(*node, &h.advance(dt)));
            }
            q.extend(outgoing(COORDINATOR, &self.coord.advance(dt)));
            self.pump(q, &allow);
        }
    }

    /// The coordinator invokes INCRBY `tk(k)` 1: its id, and the submits it sent (undelivered).
    pub fn submit(&mut self, k: u64) -> (TxnId, Queue) {
        let (t, e) = self.coord.call(|c, ctx| c.submit(ctx, vec![Op::new(tk(k), OpKind::IncrBy(1))]));
        (t.expect("submitted"), outgoing(COORDINATOR, &e).into())
    }

    /// How many times server `n` ran a write of `tk(k)`.
    pub fn version(&self, n: u32, k: u64) -> u64 {
        self.s(n).executed_state().get(&tk(k)).map_or(0, |e| e.version)
    }

    pub fn logged(&self, n: u32, txn: TxnId) -> bool {
        self.s(n).log().iter().any(|e| e.piece.txn == txn)
    }
}

pub fn outgoing(from: NodeId, effects: &[Effect<TigaMsg>]) -> Vec<(NodeId, NodeId, TigaMsg)> {
    sent(effects).into_iter().map(|(to, m)| (from, to, m.clone())).collect()
}
