//! Session guarantees under faults: majority is clean, w:1 shows the anomaly; elections.

use kairos_causal::msg::codes;
use kairos_causal::{Member, ReadConcern, ReadPref, WriteConcern};
use kairos_check::{check, Model};
use kairos_core::{NodeId, SimTime};
use kairos_harness::causal::{acknowledged_appends, collect, Deployment, Faults, World};
use kairos_sim::{Fault, FaultRates};
use std::time::Duration;

fn majority(seed: u64) -> Deployment {
    Deployment {
        seed,
        write_concern: WriteConcern::Majority,
        read_concern: ReadConcern::Majority,
        read_pref: ReadPref::Nearest,
        causal: true,
        duration: Duration::from_secs(20),
        ..Deployment::default()
    }
}

fn primary_of(w: &World) -> Option<NodeId> {
    w.members.iter().copied().find(|&m| w.sim.role::<Member>(m).is_some_and(|r| r.is_primary()))
}

#[test]
fn majority_causal_sessions_without_faults_are_clean() {
    let out = majority(1).run().unwrap();
    let report = check(&out.history, Model::Causal).unwrap();
    assert!(report.valid, "{:?}", report.anomalies);
    assert!(out.sessions.reads_ok > 100 && out.sessions.writes_ok > 100, "{:?}", out.sessions);
    assert_eq!(out.sessions.dummy_signatures, 0);
    assert_eq!(out.sessions.replies_without_cluster_time, 0);
    assert_eq!(out.sessions.writes_unknown, 0);
}

#[test]
fn majority_causal_sessions_survive_crashes_and_partitions_across_seeds() {
    let rates = FaultRates {
        mean_interval: Duration::from_secs(3),
        episode: Duration::from_millis(2_500),
        clock_step_max: Duration::from_millis(20),
        loss: 0.05,
        max_crashed: 1,
        ..FaultRates::default()
    };
    let mut faults_seen = 0;
    for seed in 1..=5 {
        let mut d = majority(seed).with_members(if seed % 2 == 0 { 5 } else { 3 });
        d.duration = Duration::from_secs(24);
        d.faults = Faults::Random { rates: rates.clone(), start: d.warmup, quiet: Duration::from_secs(12) };
        let World { mut sim, members, sessions } = d.build().unwrap();
        sim.run_until(SimTime::ZERO + d.warmup + d.duration + Duration::from_secs(5));
        let rolled_back_committed: u64 =
            members.iter().filter_map(|&m| sim.role::<Member>(m)).map(|m| m.stats().rolled_back_committed).sum();
        let out = collect(&mut sim, &members, &sessions, d.duration, Duration::ZERO);
        faults_seen += out.metrics.get("causal.elections_won").copied().unwrap_or(0);
        let report = check(&out.history, Model::Causal).unwrap();
        assert!(report.valid, "seed {seed}: {:?}", report.anomalies);
        assert_eq!(rolled_back_committed, 0, "seed {seed}");
        // Liveness: faults stop halfway; every session completes operations afterwards.
        assert!(out.sessions.ok_in_second_half >= 20 * d.sessions as u64, "seed {seed}: {:?}", out.sessions);
    }
    assert!(faults_seen > 5, "the fault plans must cause elections ({faults_seen} won)");
}

/// Jepsen (MongoDB 3.6.4): with w:1 and local reads, a failover loses acknowledged writes and
/// a causal session observes it. The checker must report it.
#[test]
fn w1_local_reads_with_failover_show_the_anomaly() {
    let d = Deployment {
        seed: 3,
        write_concern: WriteConcern::W1,
        read_concern: ReadConcern::Local,
        read_pref: ReadPref::Primary,
        causal: true,
        sessions: 2,
        session_regions: vec!["sc".into()],
        read_fraction: 0.5,
        keys: 1,
        duration: Duration::from_secs(20),
        ..Deployment::default()
    };
    let mut w = d.build().unwrap();
    w.sim.run_until(SimTime::ZERO + d.warmup + Duration::from_secs(2));
    let old = primary_of(&w).expect("a primary after warm-up");
    let others: Vec<NodeId> = w.members.iter().copied().filter(|&m| m != old).collect();
    let at = w.sim.now();
    w.sim.schedule(at, Fault::Partition(vec![vec![old], others.clone()]));
    w.sim.schedule(at + Duration::from_secs(8), Fault::HealAll);
    w.sim.run_until(SimTime::ZERO + d.warmup + d.duration + Duration::from_secs(5));
    let new = primary_of(&w).expect("a primary after healing");
    assert_ne!(new, old, "a new primary was elected");
    let rolled_back = w.sim.role::<Member>(old).unwrap().stats().rolled_back_entries;
    assert!(rolled_back > 0, "the old primary rolled back its unreplicated w:1 writes");
    assert_eq!(w.sim.role::<Member>(old).unwrap().stats().rolled_back_committed, 0);
    let out = collect(&mut w.sim, &w.members, &w.sessions, d.duration, Duration::ZERO);
    let report = check(&out.history, Model::Causal).unwrap();
    assert!(!report.valid, "the lost w:1 writes must be reported");
    let names: Vec<&str> = report.anomalies.iter().map(|a| a.name.as_str()).collect();
    assert!(
        names.iter().any(|n| *n == "read-your-writes" || *n == "monotonic-reads"),
        "expected read-your-writes or monotonic-reads, got {names:?}"
    );
}

#[test]
fn a_crashed_primary_is_replaced_and_majority_writes_survive() {
    let d = Deployment { seed: 9, duration: Duration::from_secs(16), ..majority(9) };
    let mut w = d.build().unwrap();
    let crash_at = SimTime::ZERO + d.warmup + Duration::from_secs(5);
    w.sim.run_until(crash_at);
    let old = primary_of(&w).expect("a primary");
    w.sim.schedule(crash_at, Fault::Crash(old));
    w.sim.schedule(crash_at + Duration::from_secs(6), Fault::Restart(old));
    w.sim.run_until(SimTime::ZERO + d.warmup + d.duration + Duration::from_secs(5));
    let new = primary_of(&w).expect("a new primary");
    assert_ne!(new, old);
    // Every acknowledged append is on the new primary (and on the restarted old one).
    let acked = acknowledged_appends(w.sim.history());
    assert!(acked.len() > 50, "{} acked appends", acked.len());
    for m in [new, old] {
        let member = w.sim.role::<Member>(m).unwrap();
        for (k, v) in &acked {
            assert!(member.read_local(*k).contains(v), "{m}: acked append {v} to key {k} lost");
        }
    }
    let out = collect(&mut w.sim, &w.members, &w.sessions, d.duration, Duration::ZERO);
    assert!(check(&out.history, Model::Causal).unwrap().valid);
    assert!(out.metrics["causal.elections_won"] >= 2);
    // Writes named the term of their primary: those that reached a primary of another term
    // (a session's first, and after the failover) were sent again with its term, not failed.
    let refused_for_term = out.sessions.errors.get(&codes::PRIMARY_STEPPED_DOWN).copied().unwrap_or(0);
    assert!(refused_for_term > 0, "{:?}", out.sessions.errors);
    assert_eq!(out.sessions.writes_resent_in_new_term, refused_for_term);
}

/// Reads from lagging secondaries: without causal consistency a session misses its own
/// writes; with it (afterClusterTime, the secondary waits) it never does.
#[test]
fn causal_sessions_read_their_writes_from_secondaries() {
    let base = Deployment {
        seed: 4,
        write_concern: WriteConcern::W1,
        read_concern: ReadConcern::Local,
        read_pref: ReadPref::Secondary,
        keys: 2,
        duration: Duration::from_secs(10),
        ..Deployment::default()
    };
    let off = Deployment { causal: false, ..base.clone() }.run().unwrap();
    let report = check(&off.history, Model::Causal).unwrap();
    assert!(report.anomalies.iter().any(|a| a.name == "read-your-writes"), "{:?}", report.anomalies);
    let on = Deployment { causal: true, ..base }.run().unwrap();
    let report = check(&on.history, Model::Causal).unwrap();
    assert!(report.valid, "{:?}", report.anomalies);
    assert!(on.sessions.reads_ok > 100 && on.sessions.writes_ok > 100);
    // Waiting costs latency: causal reads from secondaries are slower at the median.
    assert!(on.read_latency_ms.p90 > off.read_latency_ms.p90, "{:?} vs {:?}", on.read_latency_ms, off.read_latency_ms);
}

#[test]
fn same_seed_same_trace() {
    let d = Deployment { duration: Duration::from_secs(5), ..majority(7) };
    let (a, b) = (d.run().unwrap(), d.run().unwrap());
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.history, b.history);
    let c = Deployment { seed: 8, ..d }.run().unwrap();
    assert_ne!(a.trace_hash, c.trace_hash);
}

/// The oplog world check can fail, at the event that broke it: a primary that commits what it
/// alone applied stops the run while a majority does not hold the entry yet. The same run
/// without the test-only switch passes, and nothing else would have flagged it early: every
/// member's own invariants hold.
#[test]
fn a_primary_that_commits_alone_is_stopped_by_the_oplog_world_check() {
    let mut d = Deployment { duration: Duration::from_secs(3), ..majority(3) };
    let o = d.run().expect("the same run without the switch breaks no invariant");
    assert!(o.sessions.writes_ok > 0);
    d.member.unsafe_commit_alone = true;
    let Err(kairos_harness::DeployError::Invariant(v)) = d.run() else {
        panic!("a primary that commits alone must be caught by the world check")
    };
    assert_eq!(v.node, None, "caught by the world check, not a member's own invariants: {v}");
    assert!(v.what.contains("fewer than a majority of 2"), "{v}");
    // Caught during the warm-up's first writes, long before the sessions' history ends.
    assert!(v.time < SimTime::ZERO + d.warmup + Duration::from_secs(1), "{v}");
}

/// The sessions' own invariant can fail, at the reply that broke it: members that answer a
/// causal read without waiting for its afterClusterTime let a lagging secondary return a list
/// without the session's acknowledged append. The same run without the test-only switch breaks
/// nothing.
#[test]
fn a_member_that_ignores_after_cluster_time_is_caught_by_the_session_invariant() {
    let mut d = Deployment {
        seed: 4,
        read_pref: ReadPref::Secondary,
        keys: 2,
        duration: Duration::from_secs(5),
        ..Deployment::default()
    };
    let o = d.run().expect("the same run without the switch breaks no invariant");
    assert!(o.sessions.reads_from_secondary > 20 && o.sessions.writes_ok > 20, "{:?}", o.sessions);
    d.member.unsafe_ignore_after_cluster_time = true;
    let Err(kairos_harness::DeployError::Invariant(v)) = d.run() else {
        panic!("a stale causal read must be caught by the session's invariant")
    };
    eprintln!("{v}");
    let sessions = 3..3 + d.sessions as u32;
    assert!(v.node.is_some_and(|n| sessions.contains(&n.0)), "caught by a session: {v}");
    assert!(v.what.contains("read-your-writes") || v.what.contains("monotonic reads"), "{v}");
}
