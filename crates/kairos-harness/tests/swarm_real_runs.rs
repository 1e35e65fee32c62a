//! SWARM-KV, DM-ABD and RAW on the real backends (shared memory, TCP on loopback): sampled
//! YCSB runs whose histories are checked linearizable per key, with skewed client clocks, and
//! with a memory node crashing mid-run. Small and bounded: each run takes well under 10 s.

use std::sync::Mutex;
use std::time::Duration;

use kairos_harness::swarm::backend::shm::ShmCluster;
use kairos_harness::swarm::backend::tcp::TcpCluster;
use kairos_harness::swarm::real::RealRun;
use kairos_harness::swarm::sim::{Outcome, SwarmRun};
use kairos_swarm::client::OpKind;
use kairos_swarm::engine::Protocol;
use kairos_workload::ycsb::Workload;

fn small(protocol: Protocol, seed: u64) -> RealRun {
    RealRun::new(SwarmRun {
        protocol,
        workload: Workload::YcsbA,
        clients: 3,
        ops: 400,
        inflight: 2,
        keys: 32,
        warmup: 500,
        // 200 µs of skew: stale guesses happen, so repairs and timestamp locks run.
        clock_offset_max: Duration::from_micros(200),
        seed,
        ..SwarmRun::default()
    })
}

fn assert_good(o: &Outcome, what: &str) {
    assert_eq!(o.linearizable, Some(true), "{what}: {}", o.check_report);
    assert!(o.checked_keys > 0, "{what}");
    let gets = o.latency_us.get(&OpKind::Get).map_or(0, |l| l.count);
    let updates = o.latency_us.get(&OpKind::Update).map_or(0, |l| l.count);
    assert!(gets > 0 && updates > 0, "{what}: {gets} gets, {updates} updates ok; errors {:?}", o.errors);
}

#[test]
fn shm_runs_of_every_protocol_are_linearizable() {
    for (i, p) in [Protocol::SwarmKv, Protocol::DmAbd, Protocol::Raw].into_iter().enumerate() {
        let run = small(p, 1 + i as u64);
        let layout = run.layout().unwrap();
        let shm = ShmCluster::create(run.run.seed, layout.config.memory_nodes, layout.node_bytes()).unwrap();
        let o = run.run_on(&shm, None).unwrap();
        assert_good(&o, p.name());
        assert_eq!(o.completed, 1200, "{}: {:?}", p.name(), o.errors);
    }
}

#[test]
fn tcp_swarm_kv_run_is_linearizable() {
    let run = small(Protocol::SwarmKv, 4);
    let layout = run.layout().unwrap();
    let tcp = TcpCluster::start_loopback(layout.config.memory_nodes, layout.node_bytes()).unwrap();
    let o = run.run_on(tcp.backend(), None).unwrap();
    assert_good(&o, "swarm-kv on tcp");
    assert!(o.errors.is_empty(), "{:?}", o.errors);
}

#[test]
fn tcp_killing_one_of_three_memory_servers_does_not_stop_the_clients() {
    let mut run = small(Protocol::SwarmKv, 5);
    run.run.ops = 1500;
    let layout = run.layout().unwrap();
    let tcp = Mutex::new(TcpCluster::start_loopback(3, layout.node_bytes()).unwrap());
    let backend = tcp.lock().unwrap().backend().clone();
    let kill = || {
        if let Ok(mut t) = tcp.lock() {
            t.kill(1);
        }
    };
    let o = run.run_on(&backend, Some((Duration::from_millis(30), Box::new(kill)))).unwrap();
    assert!(tcp.lock().unwrap().server(1).is_none(), "the run ended before the kill: make it longer");
    assert_good(&o, "swarm-kv on tcp, node 1 killed");
    let ok: u64 = o.latency_us.values().map(|l| l.count).sum();
    assert!(ok >= 4000, "clients kept going after the crash: {ok} of 4500 ok; errors {:?}", o.errors);
}

#[test]
fn shm_crash_flag_mid_run_does_not_stop_the_clients() {
    // Long enough that the crash (5 ms in) lands mid-run even on a fast, idle machine: shm
    // operations take microseconds, and 1,500 per client once finished within 20 ms.
    let mut run = small(Protocol::DmAbd, 6);
    run.run.ops = 6000;
    let layout = run.layout().unwrap();
    let shm = ShmCluster::create(run.run.seed, 3, layout.node_bytes()).unwrap();
    let crash = || shm.crash(2).unwrap();
    let o = run.run_on(&shm, Some((Duration::from_millis(5), Box::new(crash)))).unwrap();
    assert!(shm.region(2).unwrap().is_crashed(), "the run ended before the crash: make it longer");
    assert_good(&o, "dm-abd on shm, node 2 crashed");
    let ok: u64 = o.latency_us.values().map(|l| l.count).sum();
    assert!(ok >= 16_000, "{ok} of 18,000 ok; errors {:?}", o.errors);
}

/// SWARM-KV clients in two processes share the same shared-memory nodes: this test re-runs
/// itself as a child that prepares the same run (deterministically), opens the parent's
/// regions and runs clients 2..4 while the parent runs clients 0..2, both on one time line (a
/// shared Unix-time epoch); the merged history is linearizable.
#[test]
fn swarm_kv_clients_in_two_processes_share_the_shm_nodes() {
    use kairos_core::history::HistoryRecord;
    use kairos_harness::swarm::driver::unix_now_ns;
    const CHILD_ENV: &str = "KAIROS_SWARM_REAL_CHILD";
    let mut run = small(Protocol::SwarmKv, 8);
    run.run.clients = 4;
    run.run.ops = 2000;
    let wait_until = |epoch_ns: u64| {
        let now = unix_now_ns();
        std::thread::sleep(Duration::from_nanos(epoch_ns.saturating_sub(now)));
    };
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let mut parts = spec.split('|');
        let (paths, epoch, out) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        let paths: Vec<std::path::PathBuf> = paths.split(',').map(Into::into).collect();
        let epoch: u64 = epoch.parse().unwrap();
        let prepared = run.prepare().unwrap();
        let shm = ShmCluster::open(&paths).unwrap();
        wait_until(epoch);
        let report = run.measure(prepared, &shm, 2..4, Some(epoch), None).unwrap();
        let lines: Vec<String> = report.history.iter().map(|r| serde_json::to_string(r).unwrap()).collect();
        std::fs::write(out, lines.join("\n")).unwrap();
        return;
    }
    let prepared = run.prepare().unwrap();
    let layout = prepared.layout.clone();
    let last_value = prepared.last_value.clone();
    let shm = ShmCluster::create(run.run.seed, 3, layout.node_bytes()).unwrap();
    run.load(&prepared, &shm).unwrap();
    let out = std::env::temp_dir().join(format!("kairos-swarm-child-history-{}.jsonl", std::process::id()));
    let epoch = unix_now_ns() + 1_500_000_000; // both start then (the child prepares first)
    let paths: Vec<String> = shm.paths().iter().map(|p| p.display().to_string()).collect();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "swarm_kv_clients_in_two_processes_share_the_shm_nodes", "--quiet"])
        .env(CHILD_ENV, format!("{}|{epoch}|{}", paths.join(","), out.display()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until(epoch);
    let report = run.measure(prepared, &shm, 0..2, Some(epoch), None).unwrap();
    assert!(child.wait().unwrap().success(), "the child process failed");
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let theirs: Vec<HistoryRecord> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!theirs.is_empty());
    let span = |h: &[HistoryRecord]| (h[0].time, h[h.len() - 1].time);
    let (mine, their) = (span(&report.history), span(&theirs));
    assert!(mine.0 < their.1 && their.0 < mine.1, "the two processes ran at the same time: {mine:?} vs {their:?}");
    let mut merged: Vec<HistoryRecord> = report.history.into_iter().chain(theirs).collect();
    merged.sort_by_key(|r| r.time);
    for (i, r) in merged.iter_mut().enumerate() {
        r.index = i as u64;
    }
    assert_eq!(merged.len(), 2 * 4 * 2000, "every operation invoked and completed");
    let (valid, text, keys) = kairos_harness::swarm::check_per_key(&merged, &last_value);
    assert_eq!(valid, Some(true), "{text}");
    assert!(keys > 0);
    eprintln!("two processes: parent ran {mine:?} ns, child {their:?} ns; {text}");
}
