//! A review's schedule (2026-12-07; it failed before its fix): a Detock home whose log is
//! full (its followers unreachable, `batches_in_flight_max` batches in replication) refused a
//! multi-home transaction's submission *and* dropped the adoption of it when it read the
//! transaction in the other home's log (`log` returned false; the adoption was never tried
//! again). Once the coordinator had used its `max_sends` submissions, the transaction was in
//! one home's log only: incomplete at every executor for good, and so was every later
//! transaction on its keys — after the partition healed. Now an adoption is never refused.

use std::collections::VecDeque;
use std::time::Duration;

use kairos_core::harness::{sent, RoleHarness};
use kairos_core::NodeId;
use kairos_txn::detock::{DetockConfig, DetockMsg, Server};
use kairos_workload::txn::TxnId;
use kairos_workload::Topology;

const CLIENT: NodeId = NodeId(9);

struct World {
    servers: Vec<RoleHarness<Server>>,
    /// Links cut (both directions).
    cut: Vec<(NodeId, NodeId)>,
    replies: Vec<(TxnId, u32)>,
}

impl World {
    fn blocked(&self, a: NodeId, b: NodeId) -> bool {
        self.cut.iter().any(|&(x, y)| (x, y) == (a, b) || (x, y) == (b, a))
    }

    fn pump(&mut self, mut q: VecDeque<(NodeId, NodeId, DetockMsg)>) {
        while let Some((from, to, msg)) = q.pop_front() {
            if self.blocked(from, to) {
                continue;
            }
            if to == CLIENT {
                if let DetockMsg::Reply { txn, shard, .. } = msg {
                    self.replies.push((txn, shard));
                }
                continue;
            }
            let effects = self.servers[to.0 as usize].deliver(from, msg);
            for (d, m) in sent(&effects) {
                q.push_back((to, d, m.clone()));
            }
        }
    }

    /// Lets `d` pass on every server (timers fire), delivering what they send.
    fn tick(&mut self, d: Duration) {
        let mut q = VecDeque::new();
        for (i, s) in self.servers.iter_mut().enumerate() {
            for (to, m) in sent(&s.advance(d)) {
                q.push_back((NodeId(i as u32), to, m.clone()));
            }
        }
        self.pump(q);
    }

    fn submit(&mut self, to: NodeId, txn: TxnId, keys: Vec<u64>) {
        self.pump(VecDeque::from([(CLIENT, to, DetockMsg::Submit { txn, keys, pieces: Default::default() })]));
    }
}

#[test]
fn a_multi_home_transaction_refused_by_a_full_home_still_executes_after_the_partition_heals() {
    // Two shards of three replicas; the home of shard s is its replica s mod 3:
    // shard 0 = nodes 0,1,2 (home 0), shard 1 = nodes 3,4,5 (home 4).
    let topology = Topology {
        shards: vec![vec![NodeId(0), NodeId(1), NodeId(2)], vec![NodeId(3), NodeId(4), NodeId(5)]],
        leader: vec![0, 1],
    };
    let config = DetockConfig::default();
    let servers = (0..6u32)
        .map(|i| RoleHarness::new(NodeId(i), Server::new(&topology, &config, i / 3, i % 3), u64::from(i)))
        .collect();
    let mut w = World { servers, cut: Vec::new(), replies: Vec::new() };
    for s in &mut w.servers {
        s.start();
    }
    let (home_a, home_b) = (NodeId(0), NodeId(4));
    // Home A is cut off from both its followers (a partition).
    w.cut = vec![(home_a, NodeId(1)), (home_a, NodeId(2))];
    // Single-home traffic at A fills its replication window (one batch per 5 ms).
    let mut seq = 1;
    for i in 0..config.batches_in_flight_max as u64 {
        w.submit(home_a, TxnId::new(CLIENT, seq), vec![1_000 + 2 * i]);
        seq += 1;
        w.tick(config.batch_interval);
    }
    // T: keys 10 (shard 0) and 11 (shard 1), submitted to both homes, resubmitted every
    // `resubmit_after` for `max_sends` sends in all (as the Detock coordinator does).
    let t = TxnId::new(CLIENT, seq);
    for _ in 0..config.max_sends {
        w.submit(home_a, t, vec![10, 11]);
        w.submit(home_b, t, vec![10, 11]);
        for _ in 0..(config.resubmit_after.as_millis() / 5) {
            w.tick(Duration::from_millis(5));
        }
    }
    // The coordinator gives T up (`info`). The partition heals; A's log drains.
    w.cut.clear();
    for _ in 0..400 {
        w.tick(Duration::from_millis(5));
    }
    // A later single-home transaction on shard 1's key 11.
    let later = TxnId::new(CLIENT, seq + 1);
    w.submit(home_b, later, vec![11]);
    for _ in 0..2_000 {
        w.tick(Duration::from_millis(5));
    }
    eprintln!(
        "home A: {:?}, unexecuted {}; home B: {:?}, unexecuted {}",
        w.servers[0].role().stats(),
        w.servers[0].role().unexecuted(),
        w.servers[4].role().stats(),
        w.servers[4].role().unexecuted()
    );
    let answered = |txn| w.replies.iter().filter(|(t, _)| *t == txn).map(|(_, s)| *s).collect::<Vec<_>>();
    assert!(!answered(TxnId::new(CLIENT, 1)).is_empty(), "the single-home traffic ran after the heal");
    assert_eq!(answered(later), vec![1], "a later transaction on key 11 (shard 1 only) never runs: T blocks it");
}
