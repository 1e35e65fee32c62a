//! A replica-set member that restarts without its disk (Raft's amnesia): it grants no vote
//! until a primary elected without it has brought it up to date, so a stale member cannot be
//! elected with its help and committed writes survive. Without that (a test-only switch) the
//! oplog world check stops the run at the event the forgetful member comes back.

use kairos_causal::Member;
use kairos_check::{check, Model};
use kairos_core::{NodeId, SimTime};
use kairos_harness::causal::{acknowledged_appends, collect, Deployment, World};
use kairos_sim::Fault;
use std::time::Duration;

fn primary_of(w: &World) -> Option<NodeId> {
    w.members.iter().copied().find(|&m| w.sim.role::<Member>(m).is_some_and(|r| r.is_primary()))
}

struct Scenario {
    w: World,
    d: Deployment,
    /// The first primary, crashed with its disk and restarted later.
    primary: NodeId,
    /// The member that loses its disk.
    amnesiac: NodeId,
    /// The member cut off while the others commit: it lacks their writes.
    stale: NodeId,
    /// When the primary and the amnesiac crash.
    crash_at: SimTime,
}

/// Three members. The stale member is cut off while the primary and the victim commit writes;
/// then both crash, the victim's disk is wiped, it restarts and the partition heals: only the
/// victim (empty) and the stale member are up. Were the victim to vote, the stale member would
/// be elected without the committed writes. Four seconds later the old primary returns with
/// its disk.
fn scenario(forget_amnesia: bool) -> Scenario {
    let mut d = Deployment { seed: 11, duration: Duration::from_secs(20), ..Deployment::default() };
    d.member.unsafe_forget_amnesia = forget_amnesia;
    let mut w = d.build().unwrap();
    w.sim.run_until(SimTime::ZERO + d.warmup + Duration::from_secs(1));
    let primary = primary_of(&w).expect("a primary after warm-up");
    let others: Vec<NodeId> = w.members.iter().copied().filter(|&m| m != primary).collect();
    let (amnesiac, stale) = (others[0], others[1]);
    let cut_at = w.sim.now();
    w.sim.schedule(cut_at, Fault::Partition(vec![vec![stale], vec![primary, amnesiac]]));
    let crash_at = cut_at + Duration::from_secs(3);
    w.sim.schedule(crash_at, Fault::Crash(primary));
    w.sim.schedule(crash_at, Fault::Crash(amnesiac));
    w.sim.schedule(crash_at, Fault::WipeDisk(amnesiac));
    w.sim.schedule(crash_at + Duration::from_millis(100), Fault::Restart(amnesiac));
    w.sim.schedule(crash_at + Duration::from_millis(200), Fault::HealAll);
    w.sim.schedule(crash_at + Duration::from_secs(4), Fault::Restart(primary));
    Scenario { w, d, primary, amnesiac, stale, crash_at }
}

#[test]
fn an_amnesiac_member_votes_only_after_a_primary_elected_without_it_caught_it_up() {
    let Scenario { mut w, d, primary, amnesiac, stale, crash_at } = scenario(false);
    // While only the amnesiac and the stale member are up, nobody is elected.
    w.sim.run_until(crash_at + Duration::from_secs(4));
    assert_eq!(w.sim.violation(), None);
    assert_eq!(primary_of(&w), None, "the stale member must not be elected with the amnesiac's vote");
    let m = w.sim.role::<Member>(amnesiac).unwrap();
    assert!(m.is_amnesiac() && m.stats().disk_lost);
    assert!(m.stats().votes_refused_amnesiac > 0, "the stale member asked for votes: {:?}", m.stats());
    w.sim.run_until(SimTime::ZERO + d.warmup + d.duration + Duration::from_secs(5));
    assert_eq!(w.sim.violation(), None);
    let m = w.sim.role::<Member>(amnesiac).unwrap();
    assert!(!m.is_amnesiac(), "a primary elected without it caught it up: it votes again");
    // Every acknowledged append is on every member now, the stale one included.
    let acked = acknowledged_appends(w.sim.history());
    assert!(acked.len() > 50, "{} acked appends", acked.len());
    for node in [primary, amnesiac, stale] {
        let member = w.sim.role::<Member>(node).unwrap();
        for (k, v) in &acked {
            assert!(member.read_local(*k).contains(v), "{node}: acked append {v} to key {k} lost");
        }
    }
    let out = collect(&mut w.sim, &w.members, &w.sessions, d.duration, Duration::ZERO);
    assert_eq!(out.metrics.get("causal.amnesia_ended"), Some(&1));
    let report = check(&out.history, Model::Causal).unwrap();
    assert!(report.valid, "{:?}", report.anomalies);
}

#[test]
fn a_member_that_forgets_it_lost_its_disk_is_caught_when_it_comes_back() {
    let Scenario { mut w, crash_at, .. } = scenario(true);
    w.sim.run_until(crash_at + Duration::from_secs(4));
    let v = w.sim.violation().expect("a forgetful member must be caught by the oplog world check");
    eprintln!("{v}");
    assert_eq!(v.node, None, "{v}");
    assert!(v.what.contains("fewer than a majority"), "{v}");
    assert!(v.time >= crash_at + Duration::from_millis(100) && v.time < crash_at + Duration::from_millis(200), "{v}");
}

/// Amnesia is durable: an amnesiac member that crashes and restarts with its (new) disk is
/// still amnesiac, and still leaves amnesia the same way.
#[test]
fn an_amnesiac_member_restarted_with_its_disk_stays_amnesiac() {
    let Scenario { mut w, d, amnesiac, crash_at, .. } = scenario(false);
    w.sim.schedule(crash_at + Duration::from_secs(1), Fault::Crash(amnesiac));
    w.sim.schedule(crash_at + Duration::from_millis(1_200), Fault::Restart(amnesiac));
    w.sim.run_until(crash_at + Duration::from_secs(2));
    let m = w.sim.role::<Member>(amnesiac).unwrap();
    assert!(m.is_amnesiac() && !m.stats().disk_lost, "recovered from its disk, still amnesiac");
    assert_eq!(primary_of(&w), None);
    w.sim.run_until(SimTime::ZERO + d.warmup + d.duration + Duration::from_secs(5));
    assert_eq!(w.sim.violation(), None);
    assert!(!w.sim.role::<Member>(amnesiac).unwrap().is_amnesiac());
}

/// A journal the member cannot read whole (written by another version) is partial amnesia:
/// the member keeps the prefix it read and comes back amnesiac.
#[test]
fn a_journal_that_does_not_decode_leaves_the_member_amnesiac() {
    use kairos_core::{Process, Stored};
    let cfg = std::sync::Arc::new(kairos_causal::MemberConfig::new((0..3).map(NodeId).collect()));
    for stored in [
        Stored { snapshot: Some(vec![0xff; 4]), ..Stored::default() },
        Stored { records: vec![vec![0xff; 4]], ..Stored::default() },
    ] {
        let mut m = Member::new(cfg.clone(), 0);
        m.on_recover(&stored);
        assert!(m.is_amnesiac() && !m.stats().disk_lost, "{stored:?}");
        assert_eq!(m.stats().journal_unreadable, 1);
    }
    let mut readable = Member::new(cfg, 0);
    readable.on_recover(&Stored { records: Vec::new(), snapshot: None, ..Stored::default() });
    assert!(!readable.is_amnesiac());
}
