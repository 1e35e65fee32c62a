//! `kairos demo`: the main job, in well under two minutes on two cores. Each system that
//! lands adds its section; every section's history is checked.

use super::bench::{print_register_table, register_result, run_and_check, verdict};
use crate::cli::{CausalBenchArgs, DemoArgs, OnOff, ReadConcernArg, ReadPrefArg, SigningArg, WriteConcernArg};
use crate::result;
use crate::CliError;
use kairos_harness::micro::{Bench, Protocol, TpccBench};
use kairos_harness::register::RegisterRun;
use kairos_harness::tiga::{Deployment, LeaderKill};
use kairos_harness::TxnDeployment;
use kairos_sim::CpuModel;
use kairos_workload::tpcc::TpccScale;
use std::time::Duration;

pub fn run(args: DemoArgs) -> Result<(), CliError> {
    println!("Kairos demo — seed {} (every random choice derives from it; rerun with --seed N)\n", args.seed);

    println!("━━ 1. Tiga: strictly serializable transactions in one wide-area round trip ━━");
    println!("MicroBench (3 keys per transaction, Zipf 0.5 over 3M keys), 3 shards × 3 replicas in sc / fi / br,");
    println!("leaders in sc, 2 coordinators in each of sc / fi / br / hk, chrony-grade clocks, 4,000 txn/s for");
    println!("5 virtual seconds. 'analytic' is the latency the paper's design implies for perfect clocks:");
    println!("headroom + the faster of the fast path and the slow path (see kairos-tiga's crate docs).\n");
    let tiga = Deployment {
        base: TxnDeployment {
            seed: args.seed,
            load_txn_per_s: 4_000.0,
            duration: Duration::from_secs(5),
            ..Default::default()
        },
        ..Deployment::default()
    };
    let (outcome, report) = super::tiga::run_and_check(&tiga)?;
    let tiga_result = super::tiga::tiga_result(&tiga, &outcome, &report);
    super::tiga::print_table(&tiga, &outcome, &tiga_result);
    println!("{report}\n");

    println!("━━ 1b. Tiga loses a leader under load ━━");
    println!("The same run, but shard 0's leader crashes at 2.5 s with no warning and no pause of the");
    println!("coordinators: the view manager notices the silent leader, moves every leader to fi (the first");
    println!("region with a live replica of every shard), the servers merge their logs, and coordinators");
    println!("resend what they had in flight. Commits per second and median latency around the crash:\n");
    let crash = Deployment {
        kill_leader: Some(LeaderKill { at: Duration::from_millis(2_500), shard: 0, restart_after: None }),
        ..tiga.clone()
    };
    let (crash_outcome, crash_report) = super::tiga::run_and_check(&crash)?;
    let mut crash_result = super::tiga::tiga_result(&crash, &crash_outcome, &crash_report);
    super::tiga::print_recovery(&crash, &crash_outcome, &mut crash_result, 2);
    println!("{crash_report}\n");

    println!("━━ 2. Tiga against its peers, on identical work ━━");
    println!("The same deployment, MicroBench, clocks and seed for Tiga, 2PL+Paxos, OCC+Paxos, Tapir, Janus,");
    println!(
        "Calvin+, Detock, NCC (one server per shard, as the Tiga paper ran it) and NCC+ (NCC over Multi-Paxos), at"
    );
    println!("2,000 txn/s for 2 virtual seconds (fixed 5 µs per handler), every history checked strictly");
    println!("serializable.");
    println!("Maximum throughput and the skew sweep: `kairos bench micro`.\n");
    let bench = Bench {
        base: TxnDeployment {
            seed: args.seed,
            load_txn_per_s: 2_000.0,
            duration: Duration::from_secs(2),
            cpu: CpuModel::Fixed(Duration::from_micros(5)),
            ..Default::default()
        },
        ..Bench::default()
    };
    let peers = Protocol::ALL.into_iter().map(|p| super::micro::run_point(&bench, p)).collect::<Result<Vec<_>, _>>()?;
    let regions: Vec<String> = bench.base.coordinator_regions.iter().map(|(r, _)| r.clone()).collect();
    super::micro::print_comparison(&regions, None, &peers, bench.base.load_txn_per_s, false);
    println!();

    println!("━━ 2b. Tiga and the peers on TPC-C ━━");
    println!("The Tiga paper's TPC-C deployment: 6 shards × 3 replicas in sc / fi / br, one warehouse per shard");
    println!("(10 districts; tables scaled down), the mix new-order / payment / delivery / order-status /");
    println!("stock-level = 44 / 44 / 4 / 4 / 4, 15 % remote payments, a delivery per district as in the paper's");
    println!("code, each transaction split into one-shot pieces per warehouse, a payment or order-status by");
    println!("customer name first pre-reading the customer's id in a round trip of its own (2PL, OCC and Tapir");
    println!("also interactively: the lookup runs with the piece); 400 txn/s for 2 virtual seconds (fixed 5 µs");
    println!("per handler). Every history is checked strictly serializable over the conflict keys,");
    println!("and every run's databases against TPC-C's consistency conditions.");
    println!("Maximum throughput: `kairos bench tpcc`.\n");
    let tpcc = Bench {
        base: TxnDeployment { shards: 6, load_txn_per_s: 400.0, ..bench.base.clone() },
        tpcc: Some(TpccBench {
            scale: TpccScale { customers_per_district: 100, initial_orders_per_district: 100, ..TpccScale::default() },
            ..TpccBench::default()
        }),
        ..bench.clone()
    };
    let tpcc_peers =
        Protocol::all(true).into_iter().map(|p| super::micro::run_point(&tpcc, p)).collect::<Result<Vec<_>, _>>()?;
    super::micro::print_comparison(&regions, None, &tpcc_peers, tpcc.base.load_txn_per_s, true);
    super::micro::print_by_type(&tpcc_peers, tpcc.base.load_txn_per_s);
    println!();

    println!("━━ 3. Causal sessions over a signed cluster-wide clock (MongoDB) ━━");
    println!("3-member replica set in sc / fi / br, 8 sessions reading from the nearest member, majority");
    println!("reads and writes; causal consistency on and off side by side, range signing against per-reply.\n");
    super::causal::bench(CausalBenchArgs {
        nodes: vec![3],
        write_concern: WriteConcernArg::Majority,
        read_concern: ReadConcernArg::Majority,
        read_pref: ReadPrefArg::Nearest,
        causal: vec![OnOff::On, OnOff::Off],
        threads: 8,
        signing: vec![SigningArg::Range, SigningArg::PerReply],
        read_fraction: 0.5,
        duration_s: 10.0,
        seed: args.seed,
        measured_cpu: false,
        workload: crate::cli::CausalWorkloadArg::ListAppend,
        json: None,
        plot: None,
    })?;
    println!();

    println!("━━ 4. SWARM-KV: replicated passive memory in one round trip ━━");
    println!("YCSB B (95% gets, Zipf 0.99) over 10,000 keys, 3 memory nodes (0.7 µs one way, verbs interleaved");
    println!(
        "adversarially), 4 clients with skewed clocks; SWARM-KV against DM-ABD (2 RTT), FUSEE (3 RTT updates) and RAW\n\
         (no replication).\n"
    );
    let mut swarm_results = Vec::new();
    let mut swarm_ok = true;
    for protocol in kairos_swarm::engine::Protocol::ALL {
        let run = kairos_harness::swarm::sim::SwarmRun {
            protocol,
            keys: 10_000,
            warmup: 10_000,
            ops: 1_500,
            seed: args.seed,
            ..kairos_harness::swarm::sim::SwarmRun::default()
        };
        let started = std::time::Instant::now();
        let o = kairos_harness::swarm::run(&run).map_err(|e| CliError::Runtime(e.to_string()))?;
        super::swarm::print_table(&run, &o);
        swarm_ok &= o.linearizable == Some(true);
        swarm_results.push(super::swarm::swarm_result(&run, &o, started.elapsed()));
    }
    println!();

    println!("━━ 5. The seam: a replicated register (multi-writer ABD), checked linearizable ━━");
    println!("3 replicas in sc / fi / br, 2 clients in each of sc / fi / br / hk, 20 virtual seconds.\n");
    let run = RegisterRun { seed: args.seed, ..RegisterRun::default() };
    let (reg_outcome, reg_report) = run_and_check(&run, "register")?;
    let reg_result = register_result(&run, &reg_outcome, &reg_report);
    print_register_table(&[&reg_result]);
    println!("{reg_report}");

    if let Some(path) = &args.json {
        let mut results = vec![tiga_result];
        results.extend(peers.iter().chain(&tpcc_peers).map(|p| p.result.clone()));
        results.extend(swarm_results);
        results.push(reg_result);
        result::write_json(path, &results)?;
        println!("wrote {}", path.display());
    }
    verdict(&report, args.seed)?;
    for p in peers.iter().chain(&tpcc_peers) {
        if p.verdict != super::micro::Verdict::Valid {
            let what = match &p.tpcc {
                Some(t) if !t.holds() => "left TPC-C databases that fail their checks",
                Some(_) => "TPC-C history is not verified strictly serializable",
                None => "history is not verified strictly serializable",
            };
            return Err(CliError::Anomaly(format!(
                "the {} {what} (seed {}; replay with --seed {})",
                p.protocol, args.seed, args.seed
            )));
        }
    }
    verdict(&reg_report, args.seed)?;
    if swarm_ok {
        Ok(())
    } else {
        Err(CliError::Anomaly(format!(
            "a SWARM history is not linearizable, or no checker could decide it (seed {})",
            args.seed
        )))
    }
}
