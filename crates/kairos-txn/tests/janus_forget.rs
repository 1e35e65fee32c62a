//! A review's schedule (2026-12-07; it failed before its fix): a Janus server dropped an
//! executed transaction's record `forget_after` after it ran, but kept reporting it as its
//! key's `last_executed` dependency. A later multi-shard transaction then depended on a
//! transaction no server could describe any more, and the other shard, which must learn its
//! commit, asked forever: no fault needed, only a key idle for `forget_after` (10 s). Now a
//! record is kept while a key here names it as its last executed accessor.

use std::collections::VecDeque;
use std::time::Duration;

use kairos_core::harness::{sent, RoleHarness};
use kairos_core::NodeId;
use kairos_txn::janus::{JanusConfig, JanusMsg, Server};
use kairos_workload::txn::TxnId;
use kairos_workload::Topology;

const A: NodeId = NodeId(0); // shard 0, its only replica
const B: NodeId = NodeId(1); // shard 1, its only replica
const CLIENT: NodeId = NodeId(9);

/// Delivers `queue` (to A or B) until quiet; returns what was sent to the client.
fn pump(
    a: &mut RoleHarness<Server>,
    b: &mut RoleHarness<Server>,
    mut queue: VecDeque<(NodeId, NodeId, JanusMsg)>,
) -> Vec<JanusMsg> {
    let mut to_client = Vec::new();
    while let Some((from, to, msg)) = queue.pop_front() {
        let effects = match to {
            t if t == A => a.deliver(from, msg),
            t if t == B => b.deliver(from, msg),
            _ => {
                to_client.push(msg);
                continue;
            }
        };
        for (dest, m) in sent(&effects) {
            queue.push_back((to, dest, m.clone()));
        }
    }
    to_client
}

#[test]
fn a_multi_shard_transaction_after_an_idle_key_executes_on_every_shard() {
    let topology = Topology { shards: vec![vec![A], vec![B]], leader: vec![0, 0] };
    let config = JanusConfig::default();
    let mut a = RoleHarness::new(A, Server::new(&topology, &config, 0, 0), 1);
    let mut b = RoleHarness::new(B, Server::new(&topology, &config, 1, 0), 2);
    a.start();
    b.start();
    let (ka, kb) = (10u64, 11u64); // 10 % 2 = shard 0, 11 % 2 = shard 1

    // T1: shard 1 only, on key kb. Pre-accept (no deps), commit, executes at B.
    let t1 = TxnId::new(CLIENT, 1);
    let out = pump(
        &mut a,
        &mut b,
        VecDeque::from([(
            CLIENT,
            B,
            JanusMsg::PreAccept { txn: t1, shards: 0b10, keys: vec![kb], pieces: Default::default() },
        )]),
    );
    let JanusMsg::PreAcceptOk { deps, .. } = &out[0] else { panic!("{out:?}") };
    assert!(deps.is_empty());
    let commit = JanusMsg::Commit {
        txn: t1,
        shards: 0b10,
        keys: vec![kb],
        pieces: Default::default(),
        deps: vec![],
        reply: true,
    };
    let out = pump(&mut a, &mut b, VecDeque::from([(CLIENT, B, commit)]));
    assert!(matches!(out[..], [JanusMsg::Executed { .. }]), "{out:?}");

    // The key stays idle for longer than forget_after: B drops T1's record.
    a.advance(config.forget_after + Duration::from_secs(1));
    b.advance(config.forget_after + Duration::from_secs(1));
    assert_eq!(b.role().stats().forgotten, 0, "T1's record is kept: it is kb's last executed accessor");

    // T2: shards 0 and 1, keys ka (shard 0) and kb (shard 1). B reports T1 (last executed on kb).
    let t2 = TxnId::new(CLIENT, 2);
    let out = pump(
        &mut a,
        &mut b,
        VecDeque::from([
            (CLIENT, A, JanusMsg::PreAccept { txn: t2, shards: 0b11, keys: vec![ka], pieces: Default::default() }),
            (CLIENT, B, JanusMsg::PreAccept { txn: t2, shards: 0b11, keys: vec![kb], pieces: Default::default() }),
        ]),
    );
    let mut deps = Vec::new();
    for m in &out {
        let JanusMsg::PreAcceptOk { deps: d, .. } = m else { panic!("{m:?}") };
        deps.extend(d.iter().copied());
    }
    assert!(deps.iter().any(|d| d.txn == t1), "B reports its last executed accessor: {deps:?}");
    // Fast path (each shard's only replica answered): commit the union at both shards.
    let commit = |to, keys| {
        (
            CLIENT,
            to,
            JanusMsg::Commit {
                txn: t2,
                shards: 0b11,
                keys,
                pieces: Default::default(),
                deps: deps.clone(),
                reply: true,
            },
        )
    };
    let mut executed = pump(&mut a, &mut b, VecDeque::from([commit(A, vec![ka]), commit(B, vec![kb])]));
    // Give the servers a minute of repair rounds (inquiries resent), routing everything.
    for _ in 0..600 {
        let mut q = VecDeque::new();
        for (d, m) in sent(&a.advance(Duration::from_millis(100))) {
            q.push_back((A, d, m.clone()));
        }
        for (d, m) in sent(&b.advance(Duration::from_millis(100))) {
            q.push_back((B, d, m.clone()));
        }
        executed.extend(pump(&mut a, &mut b, q));
    }
    let shards_executed: Vec<u32> = executed
        .iter()
        .filter_map(
            |m| if let JanusMsg::Executed { txn, shard, .. } = m { (*txn == t2).then_some(*shard) } else { None },
        )
        .collect();
    eprintln!("A waits for: {:?}; B: {:?}", a.role().waiting_for(), b.role().stats());
    assert!(shards_executed.contains(&1), "B executed T2: {shards_executed:?}");
    assert!(shards_executed.contains(&0), "shard 0 never executes T2 (waits for forgotten T1): {shards_executed:?}");
}
