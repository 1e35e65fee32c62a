//! Review schedules (2026-12-07): a transaction run again after its servers forgot its id.
//! Servers forget the transactions of truncated log entries once `retry_timeout × max_sends +
//! future_slack` (7 s) has passed since their timestamps (`Server::forget_truncated`),
//! assuming no submit of theirs arrives after that. Two ways one did, each failing before its
//! fix with an increment applied twice on every replica:
//! - A coordinator's view-change resends did not count against `max_sends`, so every view
//!   change extended an in-flight transaction's life by up to a `retry_timeout`: after two view
//!   changes it resent T past the horizon. Now a coordinator sends nothing later than its
//!   resend window after the first submit.
//! - A replayed (duplicated, long-delayed) `Submit` older than the horizon was taken as a new
//!   transaction: `on_submit` refused a timestamp too far in the future, never one too old.
//!   The simulator's `Fault::Replay` re-delivers any of the last 4,096 messages, which at low
//!   load spans more than 7 s. Now every submit carries its transaction's first send time, and
//!   a server refuses a transaction first sent before the horizon, whatever the submit's own
//!   timestamp.
//!
//! Shard 0 on nodes 0–2, replica 0 leading in every view; a checkpoint at every position, so
//! that T's entry is truncated (and its id forgettable) soon.

mod common;

use common::{Cluster, Queue, VM};
use kairos_core::NodeId;
use kairos_tiga::msg::{TigaMsg, TxnId};
use kairos_tiga::topology::TigaConfig;
use kairos_tiga::view::{ServerState, View};
use std::time::Duration;

fn cluster() -> Cluster {
    Cluster::new(TigaConfig { checkpoint_interval: 1, ..TigaConfig::default() })
}

fn all(_: NodeId, _: NodeId, _: &TigaMsg) -> bool {
    true
}

/// Replies to the coordinator are lost; everything else (NewView included) is delivered.
fn no_replies(_: NodeId, to: NodeId, m: &TigaMsg) -> bool {
    to != common::COORDINATOR || matches!(m, TigaMsg::NewView { .. })
}

/// T (INCRBY k0 1) commits on shard 0, and three more transactions (on k2) checkpoint and
/// truncate it. Returns T and its first submits.
fn commit_and_truncate_t(net: &mut Cluster, allow: fn(NodeId, NodeId, &TigaMsg) -> bool) -> (TxnId, Queue) {
    let (t, submits) = net.submit(0);
    net.pump(submits.clone(), allow);
    net.run_for(Duration::from_millis(300), allow);
    for _ in 0..3 {
        let (_, q) = net.submit(2);
        net.pump(q, allow);
        net.run_for(Duration::from_millis(100), allow);
    }
    for n in 0..3 {
        assert_eq!(net.version(n, 0), 1, "replica {n} executed T once");
    }
    assert!(net.s(0).log().base() >= 1, "T's entry is below the checkpoint");
    assert!(!net.logged(0, t));
    (t, submits)
}

fn new_view(net: &mut Cluster, number: u64, leader1: u32) {
    let v = View { number, leaders: vec![0, leader1], preventive: false };
    let q: Queue = (0..6u32).map(|n| (VM, NodeId(n), TigaMsg::NewView { view: v.clone() })).collect();
    net.pump(q, no_replies);
    for n in 0..6 {
        assert_eq!(net.s(n).view(), (&v, ServerState::Normal), "node {n} serves in view {number}");
    }
}

/// T's coordinator hears no reply and keeps retrying; view 1 comes at 5.9 s (shard 1's leader
/// changes; the coordinator resends T), and, if `second_view_change`, view 2 at 7.5 s, when
/// the servers have forgotten T. A new submit then meets view 2 and the coordinator resends
/// what is in flight. Returns k0's version per replica of shard 0.
fn resend_across_view_changes(second_view_change: bool) -> Vec<u64> {
    let mut net = cluster();
    commit_and_truncate_t(&mut net, no_replies);
    net.run_for(Duration::from_millis(5_300), no_replies);
    new_view(&mut net, 1, 1);
    assert_eq!(net.version(0, 0), 1);
    net.run_for(Duration::from_millis(1_600), no_replies);
    if second_view_change {
        new_view(&mut net, 2, 2);
    }
    net.run_for(Duration::from_millis(100), no_replies);
    let (_, q) = net.submit(2);
    net.pump(q, no_replies);
    net.run_for(Duration::from_millis(500), no_replies);
    (0..3).map(|n| net.version(n, 0)).collect()
}

/// Control: with one view change only, the coordinator gives T up before the servers forget it.
#[test]
fn with_one_view_change_t_runs_once() {
    assert_eq!(resend_across_view_changes(false), vec![1, 1, 1]);
}

#[test]
fn a_transaction_is_never_executed_twice_however_many_view_changes_its_coordinator_sees() {
    assert_eq!(resend_across_view_changes(true), vec![1, 1, 1], "each replica ran T (one INCRBY of k0) once");
}

/// T commits (the client is told) and is truncated; after `wait`, the network replays T's
/// first submits. Returns k0's version per replica of shard 0.
fn replay_after(wait: Duration) -> Vec<u64> {
    let mut net = cluster();
    let (_, submits) = commit_and_truncate_t(&mut net, all);
    assert!(net.coord.role().stats().committed >= 1, "the client is told T committed");
    net.run_for(wait, all);
    net.pump(submits, all);
    net.run_for(Duration::from_millis(500), all);
    (0..3).map(|n| net.version(n, 0)).collect()
}

/// Control: replayed within the horizon, the submit is answered from memory.
#[test]
fn a_replayed_submit_within_the_horizon_is_not_run_again() {
    assert_eq!(replay_after(Duration::from_secs(3)), vec![1, 1, 1]);
}

#[test]
fn a_replayed_submit_older_than_the_forget_horizon_is_not_run_again() {
    assert_eq!(replay_after(Duration::from_secs(8)), vec![1, 1, 1], "each replica ran T (one INCRBY of k0) once");
}
