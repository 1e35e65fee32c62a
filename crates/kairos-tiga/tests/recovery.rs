//! A Tiga follower that crashes and restarts recovers its synchronized log from what it made
//! durable, catches up through the leader's resend, and keeps the history strictly
//! serializable. Negative control: with its disk wiped it can never catch up (the leader
//! resends only from the sync-point the follower acknowledged).

use kairos_check::{check, Model};
use kairos_core::{NodeId, SimTime};
use kairos_sim::Fault;
use kairos_tiga::server::Server;
use kairos_tiga::sim::Deployment;
use std::time::Duration;

/// Runs MicroBench with a follower of every shard crashed at 1 s and restarted at 2 s;
/// returns (leader log length, follower log length, follower stats) per shard, and whether the
/// history is strictly serializable.
fn run(wipe: bool) -> (Vec<(u64, u64, kairos_tiga::server::ServerStats)>, bool) {
    let d = Deployment { load_txn_per_s: 600.0, duration: Duration::from_secs(4), ..Deployment::default() };
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
fn a_follower_that_lost_its_disk_never_catches_up() {
    let (logs, _) = run(true);
    for (leader, follower, stats) in &logs {
        assert_eq!(stats.recovered_entries, 0);
        assert!(follower < leader, "without its log it cannot rejoin: {follower} of {leader}");
    }
}
