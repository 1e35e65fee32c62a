//! TPC-C on Tiga's peers in the paper's simulated deployment (6 shards × 3 replicas, one
//! warehouse per shard): every run's history strictly serializable over the conflict keys,
//! TPC-C's consistency conditions holding at the end, and every replica of a shard holding
//! the same rows — under contention and under message loss.

use std::time::Duration;

use kairos_check::{check, Model};
use kairos_harness::micro::{Bench, Protocol, TpccBench};
use kairos_harness::TxnDeployment;
use kairos_workload::tpcc::TpccScale;

/// A short TPC-C run at `load` transactions per second with `loss`, on a small database
/// (30 customers per district, 1,000 items: the contention of the paper's, on the same 6
/// warehouses and 60 districts, with less to populate).
fn bench(load: f64, loss: f64) -> Bench {
    let base = TxnDeployment {
        shards: 6,
        load_txn_per_s: load,
        duration: Duration::from_secs(2),
        loss,
        ..TxnDeployment::default()
    };
    let scale =
        TpccScale { customers_per_district: 30, initial_orders_per_district: 30, items: 1_000, ..TpccScale::default() };
    Bench { base, tpcc: Some(TpccBench { scale, ..TpccBench::default() }), ..Bench::default() }
}

/// Runs `protocol` on TPC-C with and without message loss and checks everything.
fn runs_tpcc_strictly_serializably_and_consistently(protocol: Protocol) {
    for loss in [0.0, 0.02] {
        let out = bench(400.0, loss).run(protocol, |_| {}).unwrap();
        let report = check(&out.history, Model::StrictSerializable).unwrap();
        let t = out.totals();
        let tpcc = out.tpcc.as_ref().expect("a TPC-C run checks its databases");
        eprintln!("{protocol}, loss {loss}: {t:?}\n{report}\n{tpcc:?}");
        assert!(report.valid, "{protocol}, loss {loss}: {report}");
        assert!(t.committed > 500 && t.committed == t.invoked, "{protocol}: {t:?}");
        assert!(tpcc.holds(), "{protocol}, loss {loss}: {tpcc:?}");
        assert!(tpcc.consistency.checked > 6 * 10 * 30 * 3, "{tpcc:?}");
    }
}

#[test]
fn calvin_plus_runs_tpcc() {
    runs_tpcc_strictly_serializably_and_consistently(Protocol::CalvinPlus);
}

#[test]
fn janus_runs_tpcc() {
    runs_tpcc_strictly_serializably_and_consistently(Protocol::Janus);
}

#[test]
fn detock_runs_tpcc() {
    runs_tpcc_strictly_serializably_and_consistently(Protocol::Detock);
}

#[test]
fn protocols_that_do_not_run_tpcc_yet_and_bad_databases_are_refused_clearly() {
    let err = bench(100.0, 0.0).run(Protocol::TwoPlPaxos, |_| {}).err().expect("2PL does not run TPC-C yet");
    assert!(
        err.to_string().contains("2pl-paxos does not run TPC-C yet; run it with --protocols janus,calvin+,detock"),
        "{err}"
    );
    assert!(bench(100.0, 0.0).run(Protocol::Tiga, |_| {}).is_err());
    let mut no_warehouses = bench(100.0, 0.0);
    no_warehouses.tpcc.as_mut().unwrap().scale.warehouses = 0;
    let err = no_warehouses.run(Protocol::CalvinPlus, |_| {}).err().unwrap();
    assert!(err.to_string().contains("at least one warehouse"), "{err}");
    let mut uneven = bench(100.0, 0.0);
    uneven.tpcc.as_mut().unwrap().scale.warehouses = 4;
    let err = uneven.run(Protocol::CalvinPlus, |_| {}).err().unwrap();
    assert!(err.to_string().contains("4 warehouses cannot be spread over 6 shards"), "{err}");
}
