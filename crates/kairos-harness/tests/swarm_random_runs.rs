//! Swarm testing: every seed draws its own deployment (clients, keys, value size, in-flight
//! operations, clock skew, a memory-node crash or a client crash, and the adversarial
//! scheduler: chains stalled between their verbs for up to ~1 000 round trips, a client paused,
//! a client crashed mid-chain in any round) and its history must be linearizable.
//! `SWARM_SEEDS=N` runs more seeds of the first test, `SWARM_HARD=1` harder ones;
//! `SWARM_ADV_SEEDS=a..b` runs seeds `a..b` of the adversarial campaign (the `#[ignore]`d one
//! is the same campaign for long runs: `cargo test --release -p kairos-harness --test swarm_random_runs
//! -- --ignored`).

use kairos_harness::swarm;
use kairos_harness::swarm::sim::{Adversary, SwarmRun};
use kairos_swarm::engine::Protocol;
use kairos_workload::ycsb::Workload;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// A regression seed's deployment as the campaign drew it when the seed failed: before key
/// creation joined the draw ([`SwarmRun::draw`] draws it last, so only `fresh_keys` differs).
fn as_found(run: SwarmRun) -> SwarmRun {
    SwarmRun { fresh_keys: 0, ..run }
}

fn draw(seed: u64) -> SwarmRun {
    // SWARM_HARD=1: more writers on fewer keys (the lock and repair paths), shorter runs.
    SwarmRun::draw(seed, std::env::var("SWARM_HARD").is_ok(), None)
}

/// A deployment for the adversarial campaign: SWARM-KV, 3–6 clients on 1–3 keys (the lock and
/// repair paths), skewed clocks, the adversary always on, and a memory-node crash a third of
/// the time.
fn draw_adversarial(seed: u64) -> SwarmRun {
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0xad7e_5a21);
    let clients = r.random_range(3..=6);
    let ops = r.random_range(20..=60);
    let mut adversary = Adversary::draw(&mut r, clients, ops * 3);
    if adversary.stall_client.is_none() {
        adversary.stall_client = Some(r.random_range(0..clients));
    }
    SwarmRun {
        protocol: Protocol::SwarmKv,
        workload: if r.random_bool(0.5) { Workload::YcsbA } else { Workload::YcsbB },
        clients,
        ops,
        inflight: r.random_range(1..=2),
        keys: r.random_range(1..=3),
        value_size: [8, 64][r.random_range(0..2)],
        warmup: r.random_range(0..100),
        clock_offset_max: Duration::from_nanos(r.random_range(1_000..=1_000_000)),
        clock_drift_ppm_max: r.random_range(0..=100),
        crash_node_at: r
            .random_bool(0.3)
            .then(|| (r.random_range(0..3), Duration::from_micros(r.random_range(5..300)))),
        piece_ns_max: r.random_range(1..=100),
        adversary,
        seed,
        ..SwarmRun::default()
    }
}

fn seed_range(var: &str, default: std::ops::Range<u64>) -> std::ops::Range<u64> {
    let Ok(v) = std::env::var(var) else { return default };
    let parse = |s: &str| s.trim().parse::<u64>().unwrap_or_else(|_| panic!("{var}={v}: expected a..b"));
    match v.split_once("..") {
        Some((a, b)) => parse(a)..parse(b),
        None => 1..parse(&v) + 1,
    }
}

/// Runs the adversarial campaign over `seeds`; every history must be linearizable, every read
/// within the wait-free bound. Returns (runs, chains stalled, client crashes, node crashes).
fn adversarial_campaign(seeds: std::ops::Range<u64>) -> (u64, u64, u64, u64) {
    let (mut runs, mut stalls, mut client_crashes, mut node_crashes) = (0, 0, 0, 0);
    for seed in seeds {
        if seed % 1000 == 0 {
            eprintln!("adversarial campaign: seed {seed}");
        }
        let run = draw_adversarial(seed);
        let o = swarm::run(&run).unwrap();
        assert_eq!(o.linearizable, Some(true), "adversarial seed {seed} ({run:?}):\n{}", o.check_report);
        let bound = 2 * u64::from(run.clients) + 1;
        let iterations = o.metrics.get("read_iterations_max").copied().unwrap_or(0);
        assert!(iterations <= bound, "adversarial seed {seed}: a read took {iterations} iterations > {bound}");
        runs += 1;
        stalls += o.metrics.get("stalled_chains").copied().unwrap_or(0);
        client_crashes += o.metrics.get("client_crashes").copied().unwrap_or(0);
        node_crashes += u64::from(run.crash_node_at.is_some());
    }
    (runs, stalls, client_crashes, node_crashes)
}

#[test]
fn adversarial_schedules_stay_linearizable_and_reads_wait_free() {
    let (runs, stalls, crashes, nodes) = adversarial_campaign(seed_range("SWARM_ADV_SEEDS", 1..301));
    println!("{runs} adversarial runs: {stalls} chains stalled, {crashes} client crashes, {nodes} node crashes");
    assert!(stalls > runs && crashes > 0 && nodes > 0, "the campaign exercises every fault");
}

#[test]
#[ignore = "long campaign: SWARM_ADV_SEEDS=a..b (default 1..5001), run with --release"]
fn adversarial_schedules_long_campaign() {
    let (runs, stalls, crashes, nodes) = adversarial_campaign(seed_range("SWARM_ADV_SEEDS", 1..5001));
    println!("{runs} adversarial runs: {stalls} chains stalled, {crashes} client crashes, {nodes} node crashes");
    assert!(runs > 0);
}

#[test]
fn random_deployments_are_linearizable() {
    let seeds: u64 = std::env::var("SWARM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(12);
    for seed in 1..=seeds {
        if seed % 500 == 0 {
            eprintln!("random deployments: seed {seed} of {seeds}");
        }
        let run = draw(seed);
        let o = swarm::run(&run).unwrap();
        assert_eq!(o.linearizable, Some(true), "seed {seed} ({run:?}):\n{}", o.check_report);
    }
}

/// Found by the general campaign once it drew the adversary (seed 2794 of `SWARM_SEEDS`):
/// DM-ABD — the baseline — returned an older value after a completed write when one client's
/// chains stalled. DM-ABD took `max ts read + 1`, so a tuple's identity (timestamp, buffer,
/// writer) could repeat across keys once a buffer was recycled, and a stale copy landing late
/// from a stalled chain passed for the new tuple's. Timestamps now also exceed the writer's own
/// previous ones, as SWARM-KV's do.
/// Keys created during the run, under the campaign's faults: their owners insert them while
/// every client reads and updates them. Gets before the creation read nil, later ones its
/// values, and every protocol's history stays linearizable (the checker's initial value of a
/// created key is nil).
#[test]
fn keys_created_during_adversarial_runs_stay_linearizable() {
    use kairos_core::history::{MicroOp, OpType};
    use kairos_swarm::client::OpKind;
    for protocol in [Protocol::SwarmKv, Protocol::DmAbd, Protocol::Fusee] {
        let (mut inserted, mut absent, mut present) = (0, 0, 0);
        for seed in 1..=12 {
            let mut run = SwarmRun::draw(seed, false, Some(protocol));
            run.fresh_keys = 2;
            if protocol == Protocol::Fusee {
                // No recovery in FUSEE (`kairos_swarm::fusee`): no crashes.
                (run.crash_node_at, run.crash_client_after, run.adversary.crash_client_at_chain) = (None, None, None);
            }
            let o = swarm::run(&run).unwrap();
            assert_eq!(o.linearizable, Some(true), "{protocol:?} seed {seed} ({run:?}):\n{}", o.check_report);
            inserted += o.round_trips.get(&OpKind::Insert).map_or(0, |h| h.values().sum::<u64>());
            for r in o.history.iter().filter(|r| r.event.op_type == OpType::Ok) {
                if let Some(MicroOp::Read { key, value }) = r.event.value.first() {
                    if *key >= run.keys {
                        *(if value.is_some() { &mut present } else { &mut absent }) += 1;
                    }
                }
            }
        }
        eprintln!("{protocol:?}: {inserted} inserts, {absent} gets of absent keys, {present} of created ones");
        assert!(
            inserted > 0 && absent > 0 && present > 0,
            "{protocol:?}: {inserted} inserts, {absent} gets of absent keys, {present} of created ones"
        );
    }
}

/// Keys created during the run are also deleted by any client, racing their creation, updates
/// and reads, under the campaign's faults. A delete is a write of `DELETED_VALUE_ID` and a get
/// that reports the deletion reads it, so the checker holds deletions to the register's rules
/// (a review found reads that reported a deletion seen on one node, then the old value).
#[test]
fn deletes_racing_creation_updates_and_reads_stay_linearizable() {
    use kairos_core::history::{MicroOp, OpType, ReadValue};
    use kairos_swarm::client::{OpKind, DELETED_VALUE_ID};
    for protocol in [Protocol::SwarmKv, Protocol::DmAbd, Protocol::Fusee] {
        let (mut deletes, mut deleted_reads) = (0, 0);
        for seed in 1..=12 {
            let mut run = SwarmRun::draw(seed, false, Some(protocol));
            (run.fresh_keys, run.deletes_per_mille) = (2, 150);
            if protocol == Protocol::Fusee {
                (run.crash_node_at, run.crash_client_after, run.adversary.crash_client_at_chain) = (None, None, None);
            }
            let o = swarm::run(&run).unwrap();
            assert_eq!(o.linearizable, Some(true), "{protocol:?} seed {seed} ({run:?}):\n{}", o.check_report);
            deletes += o.round_trips.get(&OpKind::Delete).map_or(0, |h| h.values().sum::<u64>());
            deleted_reads += o
                .history
                .iter()
                .filter(|r| r.event.op_type == OpType::Ok)
                .filter(|r| {
                    matches!(r.event.value.first(), Some(MicroOp::Read { value: Some(ReadValue::Int(v)), .. }) if *v == DELETED_VALUE_ID)
                })
                .count();
        }
        eprintln!("{protocol:?}: {deletes} deletes, {deleted_reads} gets that reported one");
        assert!(
            deletes > 0 && deleted_reads > 0,
            "{protocol:?}: {deletes} deletes, {deleted_reads} gets that reported one"
        );
    }
}

#[test]
fn dm_abd_under_a_stalled_chain_seed_2794() {
    let run = as_found(draw(2794));
    assert_eq!(run.protocol, Protocol::DmAbd);
    let o = swarm::run(&run).unwrap();
    assert_eq!(o.linearizable, Some(true), "{run:?}: {}", o.check_report);
}

/// Runs `seed` of the `kairos sim <protocol>` campaign and checks what the campaign checks:
/// linearizable, no get timed out, every read within `2 × writers + 1` iterations.
fn campaign_seed(seed: u64, protocol: Protocol) -> kairos_harness::swarm::sim::Outcome {
    campaign_seed_run(&as_found(SwarmRun::draw(seed, false, Some(protocol))))
}

/// Runs a campaign's deployment and checks what the campaign checks (see [`campaign_seed`]).
fn campaign_seed_run(run: &SwarmRun) -> kairos_harness::swarm::sim::Outcome {
    let seed = run.seed;
    let o = swarm::run(run).unwrap();
    assert_eq!(o.linearizable, Some(true), "seed {seed} ({run:?}):\n{}", o.check_report);
    let metric = |name: &str| o.metrics.get(name).copied().unwrap_or(0);
    let bound = 2 * u64::from(run.clients) + 1;
    assert_eq!(metric("get_timeouts"), 0, "seed {seed}: {:?}", o.metrics);
    assert!(metric("read_iterations_max") <= bound, "seed {seed}: {:?} (bound {bound})", o.metrics);
    o
}

/// Campaign seed 8350 (swarm-kv): a read returned a write that had barely begun, because its
/// maximum went down between two iterations (a majority that missed the only node holding the
/// write) and it took W's older tuple for W's next operation. The schedule test
/// `a_reader_does_not_take_an_older_tuple_of_a_writer_as_that_writers_next_operation` is the
/// same race, verb by verb.
#[test]
fn swarm_kv_campaign_seed_8350_a_read_maximum_never_goes_down() {
    campaign_seed(8350, Protocol::SwarmKv);
}

/// Campaign seed 20563 (swarm-kv): a stalled writer's tuple reached one node only, not the
/// primary; a read saw it there as its maximum, then that node's replies to the reader were
/// stalled for ten round trips. Each round ended with the other two nodes, which lack the
/// tuple's value, so the read went round 12 times (bound 9) until the node answered. A read
/// round now also waits for one node that showed its maximum, as it waits for the primary.
#[test]
fn swarm_kv_campaign_seed_20563_a_read_waits_for_a_holder_of_its_maximum() {
    let o = campaign_seed(20563, Protocol::SwarmKv);
    assert!(o.metrics.get("stalled_chains").copied().unwrap_or(0) > 0, "{:?}", o.metrics);
}

/// Campaign seed 22175 (swarm-kv): a stale writer fetched the value of the highest tuple it
/// had seen (M) for its lock round; the round showed a newer tuple of M's writer, which became
/// M, and the retried lock round wrote the newer tuple's metadata and buffer header over the
/// older tuple's value. Reads of the newer tuple then returned the older value after the newer
/// write had completed (not linearizable). A writer now fetches the new M's value first.
#[test]
fn swarm_kv_campaign_seed_22175_a_lock_round_writes_m_with_its_own_value() {
    let o = campaign_seed(22175, Protocol::SwarmKv);
    assert!(o.metrics.get("writer_lock_retries").copied().unwrap_or(0) > 0, "{:?}", o.metrics);
}

/// Campaign seed 2662 (swarm-kv): a write given up as unavailable (one chain stalled past the
/// chain timeout, a memory node crashed) returned its buffer to the pool; its chains landed
/// later, its tuple became the key's maximum, the buffer was reused, and every read of the key
/// looked for the tuple's value until it timed out (358 iterations). Buffers of writes with an
/// unknown outcome stay pinned to their key now.
#[test]
fn swarm_kv_campaign_seed_2662_reads_end_after_a_write_gave_up() {
    let o = campaign_seed(2662, Protocol::SwarmKv);
    assert!(o.metrics.get("client_crashes").copied().unwrap_or(0) > 0, "{:?}", o.metrics);
}

/// Campaign seed 3368 (dm-abd): the same cause as seed 2662 in the baseline — a write given up
/// while one of its chains was stalled returned its buffer to the pool, its tuple became the
/// key's maximum, and a get fetched the reused buffer until it timed out (58 fetch misses).
#[test]
fn dm_abd_campaign_seed_3368_gets_end_after_a_write_gave_up() {
    campaign_seed(3368, Protocol::DmAbd);
}

/// Campaign seed 353 (swarm-kv), with reads that contacted a majority first in every
/// iteration: a read's maximum came from a node outside the majority it asked next (a widened
/// round had reached it), so the lock round never found the tuple's value among the replies and
/// the read went round 209 times. Only a read's first iteration is majority-first now.
#[test]
fn swarm_kv_campaign_seed_353_a_reads_later_iterations_ask_every_replica() {
    let o = campaign_seed(353, Protocol::SwarmKv);
    assert!(o.metrics.get("rounds_widened").copied().unwrap_or(0) > 0, "{:?}", o.metrics);
}

/// Campaign seed 6083 (swarm-kv, once writes went to a majority first): a write's first try
/// reached the primary and, its chain to the other node of its majority stalled, nowhere else;
/// then the primary crashed (16 µs in). A reader had seen that tuple as its maximum on the
/// primary, kept it (a read's maximum never goes down) and, finding its value on no node that
/// answered, read again — 320 times, until its chains to the dead primary timed out and it
/// suspected it. A read round now waits for one node that showed its maximum (seed 20563's
/// rule), so it waits for the dead primary's chain to time out instead of going round, and
/// then starts over.
#[test]
fn swarm_kv_campaign_seed_6083_a_read_whose_maximum_sits_on_a_crashed_node_starts_over() {
    let o = campaign_seed_run(&SwarmRun::draw(6083, false, Some(Protocol::SwarmKv)));
    assert!(o.metrics.get("read_restarts").copied().unwrap_or(0) > 0, "{:?}", o.metrics);
}

/// Campaign seed 702 (swarm-kv, majority-first writes): a read that started over after two
/// rounds without an answer from its maximum's nodes (a rule tried for seed 6083 and dropped)
/// took 7 iterations against the bound of 5.
#[test]
fn swarm_kv_campaign_seed_702_reads_stay_within_the_bound_with_majority_first_writes() {
    campaign_seed_run(&SwarmRun::draw(702, false, Some(Protocol::SwarmKv)));
}

/// Campaign seed 3233 (swarm-kv): one memory node crashed, and a client whose chains stall for
/// up to 1.5 ms (FIFO behind each other) then suspected a second, live node — and failed 142
/// operations as unavailable before the seed ended. A client no longer suspects a majority:
/// it tries the longest-suspected node again instead.
#[test]
fn swarm_kv_campaign_seed_3233_a_client_never_suspects_a_majority() {
    let o = campaign_seed(3233, Protocol::SwarmKv);
    let metric = |name: &str| o.metrics.get(name).copied().unwrap_or(0);
    assert!(metric("suspects_retried") > 0, "{:?}", o.metrics);
    let unavailable: u64 = o.errors.iter().filter(|(e, _)| e.contains("majority")).map(|(_, n)| n).sum();
    assert!(unavailable < 20, "{unavailable} operations failed as unavailable: {:?}", o.errors);
}

/// Campaign seeds 1331 and 9574 (swarm-kv), with the first version of that help: gets timed
/// out. A help round that had to retry a claim kept its replies as a create does, and once the
/// entry was in, went on as a create: a get then ran the stale writer's lock race, round after
/// round (33,519 of them in seed 9574). A help round now goes on as the lookup it is, and asks
/// every live node that lacks the entry, so that one slow node does not hold it. Since writes
/// go to a majority first, those two seeds no longer take the help path; seeds 7, 37, 44 and
/// 68 do (found by scanning the campaign), so the path stays exercised.
#[test]
fn swarm_kv_campaign_seeds_1331_and_9574_a_lookups_help_goes_on_as_a_lookup() {
    let mut helped = Vec::new();
    for seed in [1331, 9574, 7, 37, 44, 68] {
        let run = SwarmRun::draw(seed, false, Some(Protocol::SwarmKv));
        let o = campaign_seed_run(&run);
        helped.push((seed, o.metrics.get("directory_entries_helped").copied().unwrap_or(0)));
    }
    assert!(helped.iter().filter(|(_, n)| *n > 0).count() >= 3, "help rounds per seed: {helped:?}");
}

/// Campaign seed 911 (dm-abd, once campaigns created keys): the owner's insert of a fresh key
/// stalled after its directory claim reached one node. Another client's update found the
/// entry there, used the slot and completed; a later get read a majority without that node,
/// found no entry and answered that the key did not exist. A lookup now claims a
/// half-installed entry on the nodes it read that lack it before it uses the slot.
#[test]
fn dm_abd_campaign_seed_911_a_lookup_finishes_a_stalled_create_before_using_the_key() {
    let run = SwarmRun::draw(911, false, Some(Protocol::DmAbd));
    assert!(run.fresh_keys > 0, "the seed creates keys: {run:?}");
    let o = campaign_seed_run(&run);
    assert!(o.metrics.get("directory_entries_helped").copied().unwrap_or(0) > 0, "{:?}", o.metrics);
}
