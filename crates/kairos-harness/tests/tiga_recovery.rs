//! A Tiga follower that crashes and restarts recovers its synchronized log from what it made
//! durable, catches up through the leader's resend, and keeps the history strictly
//! serializable. One whose disk was wiped is told so (`on_amnesia`): it rejoins from nothing
//! and catches up too, without a vote until it serves in a newer view.

use kairos_check::{check, Model};
use kairos_core::{NodeId, Process, SimTime, Stored};
use kairos_harness::tiga::Deployment;
use kairos_harness::TxnDeployment;
use kairos_sim::Fault;
use kairos_tiga::server::Server;
use std::time::Duration;

/// Runs MicroBench with a follower of every shard crashed at 1 s and restarted at 2 s;
/// returns (leader log length, follower log length, follower stats) per shard, and whether the
/// history is strictly serializable.
fn run(wipe: bool) -> (Vec<(u64, u64, kairos_tiga::server::ServerStats)>, bool) {
    let d = Deployment {
        base: TxnDeployment { load_txn_per_s: 600.0, duration: Duration::from_secs(4), ..Default::default() },
        ..Deployment::default()
    };
    let mut world = d.build().unwrap();
    let mut followers = Vec::new();
    for (s, replicas) in world.topology.shards.iter().enumerate() {
        let leader = world.topology.leader[s] as usize;
        let follower = replicas[(leader + 1) % replicas.len()];
        followers.push((replicas[leader], follower));
        world.sim.schedule(SimTime::from_secs(1), Fault::Crash(follower));
        if wipe {
            world.sim.schedule(SimTime::from_millis(1_001), Fault::WipeDisk(follower));
        }
        world.sim.schedule(SimTime::from_secs(2), Fault::Restart(follower));
    }
    world.sim.run_until(SimTime::from_secs(12));
    assert!(world.sim.violation().is_none(), "{:?}", world.sim.violation());
    let report = check(world.sim.history(), Model::StrictSerializable).unwrap();
    let role = |n: NodeId| world.sim.role::<Server>(n).expect("up");
    let logs =
        followers.iter().map(|(l, f)| (role(*l).log().len(), role(*f).log().len(), role(*f).stats().clone())).collect();
    (logs, report.valid)
}

#[test]
fn a_restarted_follower_recovers_its_log_and_catches_up() {
    let (logs, valid) = run(false);
    assert!(valid, "the history is strictly serializable");
    for (leader, follower, stats) in &logs {
        assert!(*leader > 500, "the shard did work: {leader}");
        assert_eq!(follower, leader, "the follower caught up: {stats:?}");
        assert!(stats.recovered_entries > 50, "it recovered its log from disk: {stats:?}");
        assert_eq!(stats.journal_unreadable, 0);
    }
}

#[test]
fn a_follower_that_lost_its_disk_rejoins_from_nothing_and_catches_up() {
    let (logs, valid) = run(true);
    assert!(valid, "the history is strictly serializable");
    for (leader, follower, stats) in &logs {
        assert!(stats.disk_lost, "told it lost its disk: {stats:?}");
        assert_eq!(stats.recovered_entries, 0);
        assert_eq!(follower, leader, "the follower caught up from nothing: {stats:?}");
    }
}

/// Servers keep their log only from their latest checkpoint on (a leader: at most one more
/// interval, for lagging followers) and forget the transactions of dropped entries once no
/// coordinator can resend them: what each server retains stays bounded as the log grows.
#[test]
fn what_a_server_retains_stays_bounded_as_the_log_grows() {
    let mut d = Deployment {
        base: TxnDeployment { load_txn_per_s: 1_000.0, duration: Duration::from_secs(20), ..Default::default() },
        ..Deployment::default()
    };
    d.config.checkpoint_interval = 1_000;
    d.config.checkpoint_positions_per_key = 0;
    let mut world = d.build().unwrap();
    let servers: Vec<NodeId> = world.topology.shards.iter().flatten().copied().collect();
    let mut peak = (0, 0);
    for s in (2..=20).step_by(2) {
        world.sim.run_until(SimTime::from_secs(s));
        let retained: Vec<(usize, usize)> =
            servers.iter().map(|n| world.sim.role::<Server>(*n).expect("up").retained()).collect();
        let log_len = world.sim.role::<Server>(servers[0]).unwrap().log().len();
        eprintln!("{s:>3} s: log length {log_len:>6}; retained (entries, transactions) per server {retained:?}");
        if s >= 10 {
            peak.0 = peak.0.max(retained.iter().map(|r| r.0).max().unwrap());
            peak.1 = peak.1.max(retained.iter().map(|r| r.1).max().unwrap());
        }
    }
    assert!(world.sim.violation().is_none(), "{:?}", world.sim.violation());
    let log_len = world.sim.role::<Server>(servers[0]).unwrap().log().len();
    assert!(log_len > 12_000, "the log grew: {log_len}");
    // Two checkpoint intervals of log, and the transactions of the last ~8 s (the resend
    // horizon) at about 700 log entries per shard per second.
    assert!(peak.0 <= 2 * 1_000 + 500, "retained log entries: {}", peak.0);
    assert!(peak.1 <= 8_000, "retained transactions: {}", peak.1);
}

/// A follower down long enough for its leader to drop the log it needs gets the leader's
/// checkpoint instead, and catches up from it.
#[test]
fn a_follower_behind_the_leaders_truncated_log_installs_its_checkpoint() {
    let mut d = Deployment {
        base: TxnDeployment { load_txn_per_s: 600.0, duration: Duration::from_secs(6), ..Default::default() },
        ..Deployment::default()
    };
    d.config.checkpoint_interval = 300;
    d.config.checkpoint_positions_per_key = 0;
    let mut world = d.build().unwrap();
    let (leader, follower) = (world.topology.shards[0][0], world.topology.shards[0][1]);
    world.sim.schedule(SimTime::from_secs(1), Fault::Crash(follower));
    world.sim.schedule(SimTime::from_secs(4), Fault::Restart(follower));
    world.sim.run_until(SimTime::from_secs(14));
    assert!(world.sim.violation().is_none(), "{:?}", world.sim.violation());
    assert!(world.sim.metric("tiga.checkpoints_installed") >= 1, "the follower installed a checkpoint");
    let (l, f) = (world.sim.role::<Server>(leader).unwrap(), world.sim.role::<Server>(follower).unwrap());
    assert_eq!(f.log().len(), l.log().len(), "the follower caught up");
    assert!(f.executed() + 300 >= l.executed(), "and executes with the others: {} of {}", f.executed(), l.executed());
    let report = check(world.sim.history(), Model::StrictSerializable).unwrap();
    assert!(report.valid, "{:?}", report.anomalies);
}

/// A leader whose follower stays down stops streaming its log to it after two stalled resend
/// periods and only probes it with heartbeats (Raft's probe state); the follower, back, is
/// streamed to again and catches up. Before, every `sync_resend_after` (400 ms) the leader
/// sent the dead follower the whole log from its sync-point again.
#[test]
fn a_leader_probes_a_dead_follower_instead_of_streaming_its_log_to_it() {
    let entries_sent = |crash: bool| {
        let d = Deployment {
            base: TxnDeployment { load_txn_per_s: 600.0, duration: Duration::from_secs(6), ..Default::default() },
            ..Deployment::default()
        };
        let mut world = d.build().unwrap();
        let (leader, follower) = (world.topology.shards[0][0], world.topology.shards[0][1]);
        if crash {
            world.sim.schedule(SimTime::from_secs(1), Fault::Crash(follower));
            world.sim.schedule(SimTime::from_secs(5), Fault::Restart(follower));
        }
        world.sim.run_until(SimTime::from_secs(10));
        assert!(world.sim.violation().is_none(), "{:?}", world.sim.violation());
        let (l, f) = (world.sim.role::<Server>(leader).unwrap(), world.sim.role::<Server>(follower).unwrap());
        assert_eq!(f.log().len(), l.log().len(), "the follower caught up");
        (world.sim.metric("tiga.sync_entries_sent"), world.sim.metric("tiga.sync_probing"))
    };
    let (alive, probes_alive) = entries_sent(false);
    let (down, probes_down) = entries_sent(true);
    assert_eq!(probes_alive, 0, "no follower stalls without a fault");
    assert!(probes_down >= 1, "the dead follower was probed");
    // Down for 4 s, the follower is sent its share of the log once, on its return (here 15,060
    // entries against 15,502 without the fault); resending the log every 400 ms, as before
    // the probe state, sent 24,993.
    assert!(down <= alive * 11 / 10, "log entries sent: {down} with a follower down, {alive} without");
}

/// A replica journals a log entry whose piece it already journaled as released by reference,
/// not by a second copy of the piece; a restart rebuilds the same log from those references,
/// and a journal missing the records they name is found not whole rather than recovered short.
#[test]
fn log_entries_journaled_by_reference_recover_and_a_missing_target_is_not_whole() {
    let d = Deployment {
        base: TxnDeployment { load_txn_per_s: 600.0, duration: Duration::from_secs(1), ..Default::default() },
        ..Deployment::default()
    };
    let mut world = d.build().unwrap();
    world.sim.run_until(SimTime::from_secs(4));
    assert!(world.sim.violation().is_none(), "{:?}", world.sim.violation());
    let topology = world.topology.clone();
    for node in [topology.shards[0][0], topology.shards[0][1]] {
        let replica = topology.shards[0].iter().position(|n| *n == node).unwrap() as u32;
        let log_len = world.sim.role::<Server>(node).unwrap().log().len();
        let stored = world.sim.stored(node).clone();
        // postcard writes an enum's variant index first: 0 Logged, 1 Released, 2 LoggedReleased.
        let count = |kind: u8| stored.records.iter().filter(|r| r.first() == Some(&kind)).count();
        let (released, by_reference) = (count(1), count(2));
        assert!(log_len > 100, "the shard did work: {log_len}");
        assert!(by_reference * 10 >= log_len as usize * 9, "{by_reference} of {log_len} entries by reference");
        assert!(released >= by_reference, "each reference names a released piece");

        let recover = |stored: &Stored| {
            let mut fresh = Server::new(topology.clone(), d.config.clone(), 0, replica);
            fresh.on_recover(stored);
            fresh.stats().clone()
        };
        let whole = recover(&stored);
        assert_eq!((whole.recovered_entries, whole.journal_unreadable), (log_len, 0), "{whole:?}");
        let mut torn = stored.clone();
        torn.records.retain(|r| r.first() != Some(&1));
        let torn = recover(&torn);
        assert!(torn.journal_unreadable > 0, "a reference to a missing record is noticed: {torn:?}");
    }
}
