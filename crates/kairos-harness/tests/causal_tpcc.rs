//! The TPC-C-derived session workload: the mix, read-only sessions, checkable histories; and
//! read throughput from secondaries growing with the number of members.

use kairos_causal::tpcc::{pick_txn, TpccConfig, TpccSessionKind, TpccSessions, TxnType};
use kairos_causal::{ReadConcern, ReadPref, Session, WriteConcern};
use kairos_check::{check, Model};
use kairos_core::{MicroOp, OpType, SimTime};
use kairos_harness::causal::{Deployment, WorkloadKind, World};
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::time::Duration;

fn tpcc(seed: u64, sessions: TpccSessions) -> Deployment {
    Deployment {
        seed,
        sessions: 8,
        write_concern: WriteConcern::Majority,
        read_concern: ReadConcern::Majority,
        read_pref: ReadPref::Nearest,
        causal: true,
        duration: Duration::from_secs(15),
        workload: WorkloadKind::Tpcc(TpccConfig { sessions, ..TpccConfig::default() }),
        ..Deployment::default()
    }
}

#[test]
fn the_generator_draws_the_tpcc_mix() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let n = 100_000;
    for (kind, want) in [
        (TpccSessionKind::Mixed, [0.44, 0.44, 0.04, 0.04, 0.04]),
        (TpccSessionKind::ReadWrite, [44.0 / 92.0, 44.0 / 92.0, 4.0 / 92.0, 0.0, 0.0]),
        (TpccSessionKind::ReadOnly, [0.0, 0.0, 0.0, 0.5, 0.5]),
    ] {
        let mut count: BTreeMap<TxnType, u64> = BTreeMap::new();
        for _ in 0..n {
            *count.entry(pick_txn(kind, &mut rng)).or_default() += 1;
        }
        for (t, w) in TxnType::ALL.iter().zip(want) {
            let got = count.get(t).copied().unwrap_or(0) as f64 / n as f64;
            assert!((got - w).abs() < 0.01, "{kind:?} {t:?}: {got} vs {w}");
        }
    }
}

#[test]
fn a_mixed_majority_causal_run_has_the_mix_and_is_clean() {
    let d = Deployment { sessions: 16, duration: Duration::from_secs(40), ..tpcc(2, TpccSessions::Mixed) };
    let out = d.run().unwrap();
    let report = check(&out.history, Model::Causal).unwrap();
    assert!(report.valid, "{:?}", report.anomalies);
    let total: u64 = out.sessions.txns.values().sum();
    assert!(total > 500, "{:?}", out.sessions.txns);
    for (t, want) in TxnType::ALL.iter().zip([0.44, 0.44, 0.04, 0.04, 0.04]) {
        let got = out.sessions.txns.get(t.name()).copied().unwrap_or(0) as f64 / total as f64;
        // A few hundred transactions: a binomial spread of a few points.
        assert!((got - want).abs() < 0.08, "{t:?}: {got:.3} vs {want} ({:?})", out.sessions.txns);
    }
    assert_eq!(out.sessions.writes_unknown, 0);
    assert_eq!(out.sessions.dummy_signatures, 0);
}

#[test]
fn split_sessions_are_clean_and_read_only_sessions_never_write() {
    let d = tpcc(3, TpccSessions::Split { read_only_share: 0.5 });
    let World { mut sim, members, sessions } = d.build().unwrap();
    sim.run_until(SimTime::ZERO + d.warmup + d.duration + Duration::from_secs(5));
    let cfg = TpccConfig::default();
    let mut read_only = Vec::new();
    for (i, &s) in sessions.iter().enumerate() {
        let st = sim.role::<Session>(s).unwrap().stats().clone();
        match cfg.session_kind(i) {
            TpccSessionKind::ReadOnly => {
                read_only.push(i as u64);
                assert_eq!(st.writes_ok + st.writes_failed + st.writes_unknown, 0, "session {i}: {st:?}");
                assert!(st.reads_ok > 50, "session {i}: {st:?}");
                assert!(st.txns.keys().all(|t| *t == "order-status" || *t == "stock-level"), "{:?}", st.txns);
            }
            _ => {
                assert!(st.writes_ok > 20, "session {i}: {st:?}");
                assert!(st.txns.keys().all(|t| *t != "order-status" && *t != "stock-level"), "{:?}", st.txns);
            }
        }
    }
    assert_eq!(read_only.len(), 4);
    // The history agrees: no append by a read-only session, ever (invoked or not).
    let out = kairos_harness::causal::collect(&mut sim, &members, &sessions, d.duration, Duration::ZERO);
    for r in &out.history {
        if read_only.contains(&r.event.process) {
            assert!(r.event.value.iter().all(|m| matches!(m, MicroOp::Read { .. })), "{r:?}");
        }
    }
    // Read-only sessions see the read-write sessions' orders.
    assert!(out.history.iter().any(|r| read_only.contains(&r.event.process)
        && r.event.op_type == OpType::Ok
        && r.event.value.iter().any(
            |m| matches!(m, MicroOp::Read { value: Some(kairos_core::ReadValue::List(l)), .. } if !l.is_empty())
        )));
    let report = check(&out.history, Model::Causal).unwrap();
    assert!(report.valid, "{:?}", report.anomalies);
}

/// The paper: read throughput from secondaries under causal consistency grows almost linearly
/// with the members. Every handler costs a fixed 2 ms of a member's CPU (machine-independent),
/// and 600 closed-loop sessions reading from secondaries (majority, causal on) saturate them.
fn secondary_read_throughput(members: usize) -> (f64, kairos_harness::causal::Outcome) {
    let d = Deployment {
        seed: 5,
        sessions: 600,
        write_concern: WriteConcern::Majority,
        read_concern: ReadConcern::Majority,
        read_pref: ReadPref::Secondary,
        causal: true,
        read_fraction: 0.95,
        keys: 64,
        think_time: Duration::ZERO,
        duration: Duration::from_secs(10),
        cpu: kairos_sim::CpuModel::Fixed(Duration::from_millis(2)),
        ..Deployment::default()
    }
    .with_members(members);
    let out = d.run().unwrap();
    (out.sessions.reads_from_secondary as f64 / d.duration.as_secs_f64(), out)
}

#[test]
fn five_members_serve_more_secondary_reads_than_three() {
    let (three, o3) = secondary_read_throughput(3);
    let (five, o5) = secondary_read_throughput(5);
    eprintln!(
        "secondary reads/s under CpuModel::Fixed(2 ms): 3 members {three:.0}, 5 members {five:.0} (×{:.2}); \
         writes/s {:.0} vs {:.0}",
        five / three,
        o3.sessions.writes_ok as f64 / 10.0,
        o5.sessions.writes_ok as f64 / 10.0
    );
    // 2 secondaries against 4: close to twice the reads (each secondary saturated; ×1.9 seen).
    assert!(five > 1.7 * three, "3 members: {three:.0}/s, 5 members: {five:.0}/s");
    for o in [&o3, &o5] {
        assert!(check(&o.history, Model::Causal).unwrap().valid);
    }
}
