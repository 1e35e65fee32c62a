//! `kairos cluster bench`: the paper's Tiga deployment as real processes, measured through
//! real Redis connections.
//!
//! It starts the default cluster of `kairos cluster up` (3 shards × 3 replicas in sc / fi / br,
//! a gateway per region including hk, the view manager) on free loopback ports, with the GCP
//! one-way delays injected on every link unless `--no-delay`, then:
//! 1. **Latency.** From every region's gateway at once, one client alternates a single-key
//!    `INCR` and a `MULTI` / `EXEC` of three `INCR`s on keys of the three shards, `--requests`
//!    of each, one at a time. The p50 / p90 of each kind per region stand beside the analytic
//!    commit latency of the placement ([`kairos_harness::tiga::analytic_latency`]: what the
//!    simulator's median approaches at moderate load), with injected delay only.
//! 2. **Throughput and CPU.** `--clients` connections per gateway run MicroBench-like
//!    transactions back to back for `--duration-s` (`MULTI`, three `INCR`s of keys drawn over
//!    every shard, `EXEC`): the committed rate, and the CPU time (user + system, from
//!    `/proc/PID/stat`) each role spent per committed transaction — the figure `kairos bench
//!    tiga --measured-cpu` gives for the simulator's roles.
//!
//! It then stops the cluster with SIGINT (the gateways finish their histories) and checks the
//! gateways' merged history strictly serializable: every number comes from a checked run.
//!
//! The client is this module's few lines of RESP over `std::net` (with
//! [`super::resp::read_reply`]): the bench needs three reply shapes, and a client crate
//! would add dozens of dependencies for them.

use super::cluster::{default_config, start, Running, StartOptions};
use super::resp::{read_reply, Limits, Reply};
use crate::CliError;
use clap::Args;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use kairos_check::{check, Model, Verdict};
use kairos_core::history::HistoryRecord;
use kairos_core::NodeId;
use kairos_harness::tiga::{analytic_latency, Deployment};
use kairos_harness::TxnDeployment;
use kairos_net::ClusterConfig;
use serde::Serialize;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct ClusterBenchArgs {
    /// Folder for the cluster file, the nodes' logs and the gateways' histories.
    #[arg(long, default_value = "kairos-cluster-bench")]
    pub dir: PathBuf,
    /// Run on plain loopback (no injected wide-area delay): the speed of the real stack.
    #[arg(long)]
    pub no_delay: bool,
    /// Latency phase: transactions of each kind (single-key, 3-shard) per region.
    #[arg(long, default_value_t = 40)]
    pub requests: u32,
    /// Throughput phase: connections per gateway, each running INCRs back to back.
    #[arg(long, default_value_t = 8)]
    pub clients: u32,
    /// Throughput phase: how long, seconds (0 skips it).
    #[arg(long, default_value_t = 10.0)]
    pub duration_s: f64,
    /// The headroom margin Δ every node adds to its one-way delay estimate, ms (paper: 10). On
    /// plain loopback it is most of a transaction's latency, so a smaller one shows the stack's speed.
    #[arg(long, default_value_t = 10.0)]
    pub margin_ms: f64,
    /// Gateways take the slow path's smaller headroom per transaction when it commits sooner (beyond the paper).
    #[arg(long)]
    pub quorum_choice: bool,
    /// Write the result as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Nodes of the default cluster file: 9 servers, 4 gateways, 3 view-manager nodes.
const NODES: u16 = 16;
const GATEWAYS: u16 = 4;
const SHARDS: usize = 3;

#[derive(Serialize, Debug)]
struct LatencyRow {
    region: String,
    kind: &'static str,
    committed: usize,
    failed: usize,
    latency_ms_p50: f64,
    latency_ms_p90: f64,
    /// None without injected delay.
    analytic_ms: Option<f64>,
}

#[derive(Serialize, Debug)]
struct CpuRow {
    role: String,
    processes: usize,
    cpu_us_per_txn: f64,
}

#[derive(Serialize, Debug)]
struct BenchResult {
    injected_delay: bool,
    margin_ms: f64,
    quorum_choice: bool,
    latency: Vec<LatencyRow>,
    throughput_txn_per_s: Option<f64>,
    cpu: Vec<CpuRow>,
    history_records: usize,
    verdict: String,
}

/// A RESP connection to a gateway.
struct Conn {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Conn {
    fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let w = TcpStream::connect(addr)?;
        w.set_read_timeout(Some(Duration::from_secs(30)))?;
        w.set_nodelay(true)?;
        Ok(Conn { r: BufReader::new(w.try_clone()?), w })
    }

    /// Sends the commands in one write and reads one reply per command.
    fn call(&mut self, commands: &[&[&str]]) -> std::io::Result<Vec<Reply>> {
        let mut out = Vec::new();
        for args in commands {
            out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
            for a in *args {
                out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
            }
        }
        self.w.write_all(&out)?;
        commands.iter().map(|_| read_reply(&mut self.r, &Limits::default())).collect()
    }
}

/// `per_shard` keys of each shard, named `prefix:n`.
fn keys_by_shard(cfg: &ClusterConfig, prefix: &str, per_shard: usize) -> Result<Vec<Vec<String>>, CliError> {
    let t = super::topology(cfg, 3)?;
    let mut by_shard = vec![Vec::new(); t.shard_count()];
    for n in 0.. {
        if by_shard.iter().all(|k: &Vec<String>| k.len() >= per_shard) {
            break;
        }
        let k = format!("{prefix}:{n}");
        let s = t.shard_of_bytes(k.as_bytes()) as usize;
        if by_shard[s].len() < per_shard {
            by_shard[s].push(k);
        }
    }
    Ok(by_shard)
}

fn percentile_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e3
}

/// Latencies of single-key and 3-shard transactions from one gateway, and how many failed.
type RegionLatencies = (Vec<Duration>, Vec<Duration>, usize, usize);

fn latency_phase(addr: SocketAddr, keys: &[Vec<String>], requests: u32) -> std::io::Result<RegionLatencies> {
    let mut c = Conn::open(addr)?;
    let (mut single, mut multi, mut single_failed, mut multi_failed) = (Vec::new(), Vec::new(), 0, 0);
    for i in 0..requests as usize {
        let k = &keys[i % SHARDS][i % keys[0].len()];
        let started = Instant::now();
        match c.call(&[&["INCR", k]])?.as_slice() {
            [Reply::Int(_)] => single.push(started.elapsed()),
            _ => single_failed += 1,
        }
        let (a, b, d) = (&keys[0][i % keys[0].len()], &keys[1][i % keys[1].len()], &keys[2][i % keys[2].len()]);
        let started = Instant::now();
        let replies = c.call(&[&["MULTI"], &["INCR", a], &["INCR", b], &["INCR", d], &["EXEC"]])?;
        match replies.last() {
            Some(Reply::Array(items)) if items.iter().all(|r| matches!(r, Reply::Int(_))) => {
                multi.push(started.elapsed())
            }
            _ => multi_failed += 1,
        }
    }
    Ok((single, multi, single_failed, multi_failed))
}

/// CPU time (user + system) a process has used so far.
fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_nanos(ticks * 1_000_000_000 / per_s))
}

/// Transactions committed by the throughput phase: `clients` connections per gateway, each
/// running MULTI / three INCRs / EXEC back to back, the keys stepping through `keys` (every
/// shard's, interleaved) with a stride per connection.
fn throughput_phase(gateways: &[SocketAddr], keys: &[String], clients: u32, duration: Duration) -> u64 {
    let deadline = Instant::now() + duration;
    let mut handles = Vec::new();
    for (g, addr) in gateways.iter().enumerate() {
        for c in 0..clients as usize {
            let (addr, keys) = (*addr, keys.to_vec());
            handles.push(std::thread::spawn(move || {
                let mut committed = 0u64;
                let Ok(mut conn) = Conn::open(addr) else { return 0 };
                let mut i = c * 7919 + g * 104_729;
                while Instant::now() < deadline {
                    let k = |j: usize| keys[(i * 3 + j * 1_009) % keys.len()].as_str();
                    let commands: [&[&str]; 5] =
                        [&["MULTI"], &["INCR", k(0)], &["INCR", k(1)], &["INCR", k(2)], &["EXEC"]];
                    match conn.call(&commands) {
                        Ok(r) if matches!(r.last(), Some(Reply::Array(_))) => committed += 1,
                        Ok(_) => {}
                        Err(_) => break,
                    }
                    i += 1;
                }
                committed
            }));
        }
    }
    handles.into_iter().filter_map(|h| h.join().ok()).sum()
}

/// Ports `base..base + n` that are all free on loopback now.
fn free_port_base(n: u16) -> Result<u16, CliError> {
    (20_000u16..60_000)
        .step_by(211)
        .find(|base| (0..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok()))
        .ok_or_else(|| CliError::Runtime(format!("found no {n} consecutive free ports on 127.0.0.1")))
}

/// The gateways' histories as one, in time order (records carry real time since the Unix
/// epoch, so several processes' records on one machine compare).
fn merged_history(running: &Running) -> Result<Vec<HistoryRecord>, CliError> {
    let mut records = Vec::new();
    for g in &running.gateways {
        let h = kairos_check::load_history(&g.history)
            .map_err(|e| CliError::Io(format!("cannot read the history {}: {e}", g.history.display())))?;
        records.extend(h.records);
    }
    records.sort_by_key(|r| r.time);
    for (i, r) in records.iter_mut().enumerate() {
        r.index = i as u64;
    }
    Ok(records)
}

pub fn bench(a: ClusterBenchArgs) -> Result<(), CliError> {
    if a.requests == 0 || a.clients == 0 || !(0.0..=3_600.0).contains(&a.duration_s) {
        return Err(CliError::Usage("--requests and --clients must be positive, --duration-s within 0..=3600".into()));
    }
    if !(0.0..=10_000.0).contains(&a.margin_ms) {
        return Err(CliError::Usage(format!("--margin-ms must be 0..=10000, not {}", a.margin_ms)));
    }
    let io = |what: String, e: std::io::Error| CliError::Io(format!("{what}: {e}"));
    std::fs::create_dir_all(&a.dir).map_err(|e| io(format!("cannot create {}", a.dir.display()), e))?;
    let base = free_port_base(NODES + GATEWAYS)?;
    let mut text = default_config(base);
    if a.no_delay {
        text = text.replace("inject_delay = true", "inject_delay = false");
    }
    let config = a.dir.join("cluster.toml");
    std::fs::write(&config, &text).map_err(|e| io(format!("cannot write {}", config.display()), e))?;
    let cfg = ClusterConfig::load(&config).map_err(|e| CliError::Io(e.to_string()))?;
    let options = StartOptions {
        config: &config,
        dir: &a.dir,
        data_dir: None,
        redis_port: base + NODES,
        tiga_replicas: 3,
        margin_ms: Some(a.margin_ms),
        quorum_choice: a.quorum_choice,
    };
    eprintln!("starting the cluster ({} nodes, logs in {})", NODES, a.dir.display());
    let mut running = start(&options)?;
    let gateways: Vec<(String, SocketAddr)> = running.gateways.iter().map(|g| (g.region.clone(), g.addr)).collect();

    // 1. Latency, every region at once.
    eprintln!("latency: {} single-key and {} 3-shard transactions per region", a.requests, a.requests);
    let mut handles = Vec::new();
    for (r, (region, addr)) in gateways.iter().enumerate() {
        let keys = keys_by_shard(&cfg, &format!("lat:{r}"), 16)?;
        let (region, addr, requests) = (region.clone(), *addr, a.requests);
        handles.push(std::thread::spawn(move || (region, latency_phase(addr, &keys, requests))));
    }
    let analytic = |region: &str, shards: u32| -> Option<f64> {
        if a.no_delay {
            return None;
        }
        let mut d = Deployment { base: TxnDeployment { shards, ..Default::default() }, ..Deployment::default() };
        d.config.margin = Duration::from_secs_f64(a.margin_ms / 1e3);
        d.config.quorum_choice = a.quorum_choice;
        analytic_latency(&d, region).ok().map(|l| l.as_secs_f64() * 1e3)
    };
    let mut latency = Vec::new();
    for h in handles {
        let (region, result) = h.join().map_err(|_| CliError::Runtime("a latency client panicked".into()))?;
        let (mut single, mut multi, single_failed, multi_failed) =
            result.map_err(|e| io(format!("the {region} gateway"), e))?;
        for (kind, list, failed, shards) in
            [("single-key", &mut single, single_failed, 1), ("3-shard", &mut multi, multi_failed, 3)]
        {
            list.sort();
            latency.push(LatencyRow {
                region: region.clone(),
                kind,
                committed: list.len(),
                failed,
                latency_ms_p50: percentile_ms(list, 0.5),
                latency_ms_p90: percentile_ms(list, 0.9),
                analytic_ms: analytic(&region, shards),
            });
        }
    }

    // 2. Throughput and CPU.
    let mut cpu = Vec::new();
    let mut throughput = None;
    if a.duration_s > 0.0 {
        eprintln!("throughput: {} connections per gateway for {} s", a.clients, a.duration_s);
        let t = super::topology(&cfg, 3)?;
        let pid_of = |id| running.ids.iter().position(|n| *n == id).map(|i| running.children.0[i].id());
        let pids = |ids: Vec<NodeId>| -> Vec<u32> { ids.into_iter().filter_map(pid_of).collect() };
        let roles: Vec<(&str, Vec<u32>)> = vec![
            ("gateways (coordinators)", pids(running.gateways.iter().map(|g| g.id).collect())),
            ("leaders", pids(t.shards.iter().map(|rs| rs[0]).collect())),
            ("followers", pids(t.shards.iter().flat_map(|rs| rs[1..].to_vec()).collect())),
            ("view manager", pids(cfg.nodes_with_role(super::VIEW_MANAGER_ROLE))),
            ("all nodes", running.children.0.iter().map(|c| c.id()).collect()),
        ];
        let total = |pids: &[u32]| -> Duration { pids.iter().filter_map(|p| cpu_time(*p)).sum() };
        let keys: Vec<String> = {
            let by_shard = keys_by_shard(&cfg, "tput", 1_000)?;
            (0..1_000).flat_map(|i| by_shard.iter().map(move |ks| ks[i].clone())).collect()
        };
        let addrs: Vec<SocketAddr> = gateways.iter().map(|g| g.1).collect();
        let before: Vec<Duration> = roles.iter().map(|(_, p)| total(p)).collect();
        let started = Instant::now();
        let committed = throughput_phase(&addrs, &keys, a.clients, Duration::from_secs_f64(a.duration_s));
        let elapsed = started.elapsed().as_secs_f64();
        throughput = Some(committed as f64 / elapsed.max(1e-9));
        for ((role, p), before) in roles.iter().zip(before) {
            let used = total(p).saturating_sub(before);
            cpu.push(CpuRow {
                role: role.to_string(),
                processes: p.len(),
                cpu_us_per_txn: used.as_secs_f64() * 1e6 / committed.max(1) as f64,
            });
        }
    }

    eprintln!("stopping the cluster and checking the gateways' histories");
    running.children.stop(Duration::from_secs(10));
    let history = merged_history(&running)?;
    let report = check(&history, Model::StrictSerializable)
        .map_err(|e| CliError::Runtime(format!("the gateways wrote a history the checker cannot read: {e}")))?;

    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(["region", "transaction", "committed", "failed", "p50 ms", "p90 ms", "analytic ms", "p50 / analytic"]);
    for r in &latency {
        let (analytic, ratio) = match r.analytic_ms {
            Some(x) => (format!("{x:.1}"), format!("{:.2}", r.latency_ms_p50 / x)),
            None => ("-".into(), "-".into()),
        };
        t.add_row([
            r.region.clone(),
            r.kind.to_string(),
            r.committed.to_string(),
            r.failed.to_string(),
            format!("{:.1}", r.latency_ms_p50),
            format!("{:.1}", r.latency_ms_p90),
            analytic,
            ratio,
        ]);
    }
    let delay = if a.no_delay { "no injected delay" } else { "GCP one-way delays injected" };
    println!("latency from each region's gateway ({delay}; one transaction at a time per region):\n{t}");
    if let Some(x) = throughput {
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED);
        t.set_header(["role", "processes", "CPU µs per committed transaction"]);
        for r in &cpu {
            t.add_row([r.role.clone(), r.processes.to_string(), format!("{:.1}", r.cpu_us_per_txn)]);
        }
        println!(
            "throughput: {x:.0} txn/s ({} connections per gateway, MULTI of 3 INCRs over every shard)\n{t}",
            a.clients
        );
    }
    print!("{report}");
    let result = BenchResult {
        injected_delay: !a.no_delay,
        margin_ms: a.margin_ms,
        quorum_choice: a.quorum_choice,
        latency,
        throughput_txn_per_s: throughput,
        cpu,
        history_records: history.len(),
        verdict: report.verdict.name().to_string(),
    };
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&result).map_err(|e| CliError::Runtime(e.to_string()))?;
        std::fs::write(path, text + "\n").map_err(|e| io(format!("cannot write {}", path.display()), e))?;
        println!("wrote {}", path.display());
    }
    match report.verdict {
        Verdict::Valid => Ok(()),
        Verdict::Invalid => {
            Err(CliError::Anomaly(format!("the gateways' history is not strictly serializable:\n{report}")))
        }
        Verdict::Unknown => Err(CliError::Unknown(format!("no checker could decide the gateways' history:\n{report}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_sorted_latencies() {
        let ms = |v: &[u64]| v.iter().map(|x| Duration::from_millis(*x)).collect::<Vec<_>>();
        assert_eq!(percentile_ms(&ms(&[1, 2, 3, 4]), 0.5), 2.0);
        assert_eq!(percentile_ms(&ms(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), 0.9), 9.0);
        assert_eq!(percentile_ms(&[], 0.5), 0.0);
    }

    #[test]
    fn keys_land_on_the_shard_they_are_listed_for() {
        let cfg = ClusterConfig::parse(&default_config(7100), "default").unwrap();
        let keys = keys_by_shard(&cfg, "k", 5).unwrap();
        let t = super::super::topology(&cfg, 3).unwrap();
        for (s, ks) in keys.iter().enumerate() {
            assert_eq!(ks.len(), 5);
            assert!(ks.iter().all(|k| t.shard_of_bytes(k.as_bytes()) as usize == s));
        }
    }
}
