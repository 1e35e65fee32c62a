//! No handler panics on any message the wire format can carry: runs whose simulator changes
//! the encoding of a share of the messages in flight and delivers whatever still decodes
//! (`Sim::corrupt_messages`), for every protocol's roles: Tiga, the transaction peers, the
//! causal replica set, the register, and SWARM-KV with its peers (whose chains of verbs reach
//! the memory nodes changed, and whose clients then read what those wrote). Such a peer is
//! Byzantine, so neither the histories nor the invariants are checked; what is checked is that
//! every role takes every message without panicking, and that the runs were not idle
//! (corrupted messages were delivered). A panic anywhere fails the test with its message.
//!
//! A few seeds each, and the seeds sweeps found failing; `kairos sim <protocol> --corrupt 0.1`
//! runs long sweeps (with the fault plans on top).

use kairos_core::{Message, SimTime};
use kairos_harness::micro::{Bench, PeerProtocol, PeerWorld, TpccBench};
use kairos_harness::tiga::World;
use kairos_harness::TxnDeployment;
use kairos_sim::{Fault, Sim};
use kairos_txn::calvin::CalvinPlus;
use kairos_txn::detock::Detock;
use kairos_txn::janus::Janus;
use kairos_txn::ncc::NccPaxos;
use kairos_txn::occ::OccPaxos;
use kairos_txn::tapir::Tapir;
use kairos_txn::tpl::TwoPlPaxos;
use kairos_workload::tpcc::TpccScale;
use std::time::Duration;

/// A tenth of the messages changed (about half of those still decode).
const SHARE: f64 = 0.1;

fn corrupted_run<M: Message>(what: &str, mut sim: Sim<M>, until: Duration) {
    // Shown with a panic's message: which run it was.
    eprintln!("{what}");
    sim.corrupt_messages(SHARE);
    sim.run_until(SimTime::ZERO + until);
    let stats = sim.stats();
    assert!(
        stats.corrupted > 20 && stats.messages_delivered > 500,
        "{what}: an idle run: {stats:?}, {:?} at {:?}",
        sim.violation(),
        sim.now()
    );
}

/// Seeds `default` and the `regressions` (seeds a sweep found failing).
fn seeds(default: std::ops::Range<u64>, regressions: &[u64]) -> Vec<u64> {
    default.chain(regressions.iter().copied()).collect()
}

fn txn_base(seed: u64) -> TxnDeployment {
    TxnDeployment { seed, load_txn_per_s: 300.0, duration: Duration::from_secs(2), ..Default::default() }
}

#[test]
fn tiga_takes_corrupted_messages_without_panicking() {
    // Seed 103: a leader in a view change looked up the leader of a shard that a corrupted
    // Verify item named (105 of 3) and panicked; items naming no shard of the deployment are
    // now dropped.
    for seed in seeds(1..5, &[103]) {
        let mut d = kairos_harness::tiga::Deployment { base: txn_base(seed), ..Default::default() };
        corrupted_run(&format!("tiga seed {seed}"), d.build().unwrap().sim, Duration::from_secs(5));
        // A view change: shard 0's leader crashes and comes back.
        let World { mut sim, topology, .. } = d.build().unwrap();
        let leader = topology.leader_node(0);
        sim.schedule(SimTime::from_millis(800), Fault::Crash(leader));
        sim.schedule(SimTime::from_millis(3_000), Fault::Restart(leader));
        corrupted_run(&format!("tiga view change seed {seed}"), sim, Duration::from_secs(8));
        // TPC-C's pieces and pre-reads too.
        d.tpcc = Some(TpccBench { scale: TpccScale::small(6, 100), ..TpccBench::default() });
        corrupted_run(&format!("tiga tpcc seed {seed}"), d.build().unwrap().sim, Duration::from_secs(5));
    }
}

fn peer<P: PeerProtocol>(name: &str)
where
    P::Config: Default,
{
    for seed in seeds(1..4, &[]) {
        let bench = Bench { base: txn_base(seed), ..Bench::default() };
        let PeerWorld { sim, .. } = bench.build::<P>(&Default::default()).unwrap();
        corrupted_run(&format!("{name} seed {seed}"), sim, Duration::from_secs(5));
        let tpcc = Bench { tpcc: Some(TpccBench { scale: TpccScale::small(6, 100), ..TpccBench::default() }), ..bench };
        let PeerWorld { sim, .. } = tpcc.build::<P>(&Default::default()).unwrap();
        corrupted_run(&format!("{name} tpcc seed {seed}"), sim, Duration::from_secs(5));
    }
}

#[test]
fn the_peers_take_corrupted_messages_without_panicking() {
    peer::<TwoPlPaxos>("2pl-paxos");
    peer::<OccPaxos>("occ-paxos");
    peer::<Tapir>("tapir");
    peer::<Janus>("janus");
    peer::<CalvinPlus>("calvin+");
    peer::<Detock>("detock");
    peer::<NccPaxos>("ncc+");
}

#[test]
fn the_causal_replica_set_takes_corrupted_messages_without_panicking() {
    for seed in seeds(1..7, &[]) {
        let d = kairos_harness::causal::Deployment {
            seed,
            sessions: 16,
            duration: Duration::from_secs(20),
            ..Default::default()
        };
        corrupted_run(&format!("causal seed {seed}"), d.build().unwrap().sim, Duration::from_secs(25));
    }
}

#[test]
fn the_register_takes_corrupted_messages_without_panicking() {
    for seed in seeds(1..7, &[]) {
        let r = kairos_harness::register::RegisterRun { seed, ..Default::default() };
        corrupted_run(&format!("register seed {seed}"), r.build().unwrap().sim, r.duration);
    }
}

#[test]
fn swarm_kv_and_its_peers_take_corrupted_messages_without_panicking() {
    use kairos_harness::swarm::sim::SwarmRun;
    use kairos_swarm::engine::Protocol;
    for protocol in [Protocol::SwarmKv, Protocol::DmAbd, Protocol::Fusee, Protocol::Raw] {
        for seed in seeds(1..4, &[]) {
            let run = SwarmRun {
                protocol,
                seed,
                ops: 2_000,
                keys: 1_000,
                warmup: 1_000,
                check: false,
                corrupt_messages: SHARE,
                ..SwarmRun::default()
            };
            let out = run.run().unwrap();
            let corrupted = out.metrics.get("sim.messages_corrupted").copied().unwrap_or(0);
            assert!(
                corrupted > 50 && out.completed > 1_000,
                "{protocol:?} seed {seed}: {corrupted}, {}",
                out.completed
            );
        }
    }
}

/// `kairos sim fusee --seeds 6 --corrupt 0.1`: changed verbs left garbage that later operations
/// spun on until their timeouts, 137 of them after 50 ms each, and the seed took 50 s of wall
/// time (1,000 seeds had not finished in an hour). Under corruption operations now give up
/// after 2 ms and a run ends after 1 s of virtual time.
#[test]
fn a_corrupted_swarm_run_ends_in_bounded_virtual_time() {
    use kairos_harness::swarm::sim::SwarmRun;
    use kairos_swarm::engine::Protocol;
    let mut run = SwarmRun::draw(6, false, Some(Protocol::Fusee));
    (run.crash_node_at, run.crash_client_after, run.adversary.crash_client_at_chain) = (None, None, None);
    run.corrupt_messages = 0.1;
    let out = run.run().unwrap();
    assert!(out.metrics.get("sim.messages_corrupted").copied().unwrap_or(0) > 0);
    assert!(out.duration < std::time::Duration::from_millis(500), "{:?}", out.duration);
}
