//! Tiga on TPC-C where it is hardest: detective mode with separated leaders and too little
//! headroom (leaders execute pieces speculatively, disagree on timestamps and revoke: the undo
//! records must put every row back), and a shard leader's crash and restart (a view change,
//! and a replica that rebuilds its warehouse from its checkpoint on disk and its journal).
//! Every run's history is checked strictly serializable, TPC-C's consistency conditions hold
//! on the most advanced replica of every shard, and every replica as advanced holds the same
//! rows.

use std::time::Duration;

use kairos_check::{check, Model};
use kairos_core::SimTime;
use kairos_harness::micro::{Bench, TpccBench};
use kairos_harness::tiga::{Deployment, Mode};
use kairos_harness::TxnDeployment;
use kairos_tiga::server::Server;
use kairos_workload::tpcc::TpccScale;
use kairos_workload::Placement;

/// TPC-C on 6 shards × 3 replicas (one warehouse each) at `load` txn/s for 3 s, on the small
/// database of `tpcc_peers.rs`.
fn deployment(load: f64, loss: f64) -> Deployment {
    let base = TxnDeployment {
        shards: 6,
        load_txn_per_s: load,
        duration: Duration::from_secs(3),
        loss,
        ..TxnDeployment::default()
    };
    let scale = TpccScale::small(6, 1_000);
    Bench { base, tpcc: Some(TpccBench { scale, ..TpccBench::default() }), ..Bench::default() }.tiga()
}

/// Every serving leader has nothing speculative left, so the end-of-run checks compared its
/// live state (its speculative executions, revoked and run again) with its executed one: what
/// revocation undid is exactly what ran.
fn every_leader_settled(world: &kairos_harness::tiga::World) {
    for s in 0..world.topology.shard_count() {
        let leader = world.sim.role::<Server>(world.topology.leader_node(s as u32)).unwrap();
        assert!(leader.settled() && leader.live_state().tpcc.is_some(), "shard {s}: the leader settled");
    }
}

#[test]
fn revoked_speculative_pieces_leave_no_trace() {
    let mut d = deployment(800.0, 0.02);
    d.base.placement = Placement::Separated;
    d.mode = Mode::Detective;
    // 60 ms less headroom than estimated: submits reach far replicas late, leaders bump
    // timestamps and the agreed one is often above what a leader executed at.
    d.config.headroom_shift_ns = -60_000_000;
    let mut world = d.build().unwrap();
    world.sim.run_until(SimTime::from_secs(12));
    assert!(world.sim.violation().is_none(), "{:?}", world.sim.violation());
    let report = check(world.sim.history(), Model::StrictSerializable).unwrap();
    let tpcc = d.tpcc_outcome(&world.sim, &world.topology).unwrap();
    let servers = world.topology.shard_count() * world.topology.replicas_per_shard();
    let revoked: u64 = (0..servers)
        .filter_map(|n| world.sim.role::<Server>(kairos_core::NodeId(n as u32)))
        .map(|s| s.stats().revoked)
        .sum();
    eprintln!("{report}\n{tpcc:?}\nrevoked {revoked}");
    assert!(report.valid && report.ops > 1_600, "{report}");
    assert!(revoked > 10, "leaders revoked speculative executions: {revoked}");
    assert!(tpcc.holds(), "{tpcc:?}");
    assert!(tpcc.orders_placed > 600 && tpcc.payments_made > 600, "{tpcc:?}");
    every_leader_settled(&world);
}

#[test]
fn a_crashed_shard_leader_comes_back_with_its_warehouse() {
    let mut d = deployment(300.0, 0.0);
    // A checkpoint (with the warehouse's page) every 20 positions, so the restarted leader
    // recovers from one on disk, not only from its journal.
    d.config.checkpoint_interval = 20;
    d.config.checkpoint_positions_per_key = 0;
    let mut world = d.build().unwrap();
    let victim = world.topology.leader_node(0);
    world.sim.schedule(SimTime::from_secs(1), kairos_sim::Fault::Crash(victim));
    world.sim.schedule(SimTime::from_secs(3), kairos_sim::Fault::Restart(victim));
    world.sim.run_until(SimTime::from_secs(12));
    assert!(world.sim.violation().is_none(), "{:?}", world.sim.violation());
    let report = check(world.sim.history(), Model::StrictSerializable).unwrap();
    let tpcc = d.tpcc_outcome(&world.sim, &world.topology).unwrap();
    let old_leader = world.sim.role::<Server>(victim).unwrap();
    let (view, _) = old_leader.view();
    eprintln!("{report}\n{tpcc:?}\nview {} recovered {:?}", view.number, old_leader.stats());
    assert!(view.number > 0, "a view change replaced the crashed leader");
    assert!(old_leader.stats().recovered_checkpoint > 0, "it recovered from its checkpoint on disk");
    assert!(report.valid && report.ops > 800, "{report}");
    assert!(tpcc.holds(), "{tpcc:?}");
    assert_eq!(tpcc.replicas_behind, 0, "the restarted replica caught up: {tpcc:?}");
}
