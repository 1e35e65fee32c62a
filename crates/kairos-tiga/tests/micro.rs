//! Tiga on MicroBench in the paper's simulated deployment: every history strictly
//! serializable, and the protocol facts of the common case.

use kairos_check::{check, Model};
use kairos_tiga::sim::{Deployment, Placement};
use std::time::Duration;

fn run(d: &Deployment) -> (kairos_tiga::sim::Outcome, kairos_check::CheckReport) {
    let out = d.run(|_| {}).unwrap();
    let report = check(&out.history, Model::StrictSerializable).unwrap();
    (out, report)
}

#[test]
fn colocated_leaders_commit_strictly_serializably_mostly_on_the_fast_path() {
    let d = Deployment { load_txn_per_s: 2_000.0, duration: Duration::from_secs(3), ..Deployment::default() };
    let (out, report) = run(&d);
    let m = |k: &str| out.metrics.get(k).copied().unwrap_or(0);
    eprintln!("{:?}\n{report}", out.metrics);
    assert!(report.valid, "{report}");
    assert!(m("tiga.committed") > 5_000, "{:?}", out.metrics);
    assert_eq!(m("tiga.info"), 0);
    assert_eq!(m("tiga.retransmissions"), 0, "every transaction commits with its first send");
    // Coordinators commit on whichever rule completes first. In sc and hk the third fast reply
    // arrives before a follower's slow reply could; in fi and br the local follower's slow
    // reply (leader → follower sync, then 0.25 ms) beats the fast reply from the far region.
    for (region, s) in out.stats_by_region() {
        let fast_share = s.committed_fast as f64 / s.committed as f64;
        eprintln!("{region}: {s:?} fast share {fast_share:.3}");
        match region.as_str() {
            "sc" | "hk" => assert!(fast_share > 0.95, "{region}: {s:?}"),
            _ => assert!(fast_share < 0.5, "{region}: {s:?}"),
        }
    }
}

#[test]
fn separated_leaders_stay_strictly_serializable() {
    let d = Deployment {
        placement: Placement::Separated,
        load_txn_per_s: 1_000.0,
        duration: Duration::from_secs(3),
        skew: 0.9,
        ..Deployment::default()
    };
    let (out, report) = run(&d);
    eprintln!("{:?}\n{report}", out.metrics);
    assert!(report.valid, "{report}");
    assert!(out.metrics.get("tiga.committed").copied().unwrap_or(0) > 2_000);
}
