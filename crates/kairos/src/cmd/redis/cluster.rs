//! `kairos cluster up`: the paper's Tiga deployment as local processes, one command.
//!
//! Without `--config` it writes (if absent) and uses `DIR/cluster.toml`: 3 shards × 3 replicas
//! (`tiga-server`, replica r of every shard in sc / fi / br, so every leader is in sc), one
//! `tiga-gateway` per region (sc, fi, br, hk) and a `tiga-view-manager` node per server region
//! (so a leader that fails is replaced), all on 127.0.0.1 with the GCP matrix's one-way
//! delay injected on every link. Each node is a `kairos serve` child process logging to
//! `DIR/node-N.log`; gateway k (in id order) serves Redis clients on `--redis-port + k` and
//! writes its history to `DIR/gateway-N.jsonl`. The command prints each region's gateway
//! address once all answer PING, then waits: Ctrl-C (or `--duration-s`) stops every child with
//! SIGINT (so gateways finish their histories), and kills what has not stopped after 5 s.
//! While it runs, `DIR/cluster.pid` holds its process id, so `kairos cluster down --dir DIR`
//! (from another terminal) stops it the same way.
//!
//! A user can edit the file (or pass their own) for other hosts: `cluster up` starts every node
//! of the file on this machine, so for real hosts run `kairos serve --config … --node N` on
//! each instead.

use crate::CliError;
use clap::{Args, Subcommand};
use kairos_core::NodeId;
use kairos_net::ClusterConfig;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Start a Tiga cluster of local processes (default: the paper's 3 shards × 3 replicas in sc / fi / br with
    /// a Redis gateway per region, GCP delays injected); prints the gateways' addresses; Ctrl-C stops it.
    Up(ClusterUpArgs),
    /// Stop the cluster that `kairos cluster up --dir DIR` runs (as Ctrl-C in its terminal would).
    Down(ClusterDownArgs),
    /// Start the default cluster on free ports, measure per-region latency (single-key and 3-shard MULTI/EXEC
    /// against the analytic bound), throughput and CPU per transaction through Redis connections, stop it, and
    /// check the gateways' history.
    Bench(super::bench::ClusterBenchArgs),
}

#[derive(Args, Debug)]
pub struct ClusterDownArgs {
    /// The folder `kairos cluster up` was given.
    #[arg(long, default_value = "kairos-cluster")]
    pub dir: PathBuf,
    /// Seconds to wait for the cluster to stop (0 to 3,600).
    #[arg(long, default_value_t = 20.0, value_parser = wait_s, allow_hyphen_values = true)]
    pub wait_s: f64,
}

/// The file in the cluster's folder that holds the process id of `kairos cluster up`.
const PID_FILE: &str = "cluster.pid";

/// Removes the pid file when `up` ends, however it ends.
struct PidFile(PathBuf);

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Whether `pid` is a running `kairos cluster up` (not a process that reused the id).
fn is_cluster_up(pid: i32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.windows(2).any(|w| w[0] == b"cluster" && w[1] == b"up")
}

/// `kairos cluster down`: SIGINT to the `cluster up` of `--dir`, then waits for it to stop.
pub fn down(a: ClusterDownArgs) -> Result<(), CliError> {
    let path = a.dir.join(PID_FILE);
    let text = std::fs::read_to_string(&path).map_err(|_| {
        CliError::Usage(format!(
            "no cluster runs in {} (no {PID_FILE} there); start one with `kairos cluster up --dir {}`",
            a.dir.display(),
            a.dir.display()
        ))
    })?;
    let pid: i32 = text
        .trim()
        .parse()
        .map_err(|_| CliError::Usage(format!("{} does not hold a process id: {text:?}", path.display())))?;
    if !is_cluster_up(pid) {
        let _ = std::fs::remove_file(&path);
        return Err(CliError::Usage(format!(
            "the cluster of {} is not running any more (process {pid} is gone); removed the stale {PID_FILE}",
            a.dir.display()
        )));
    }
    // SAFETY: a signal to a process we checked is `kairos cluster up`.
    unsafe {
        libc::kill(pid, libc::SIGINT);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(a.wait_s);
    while is_cluster_up(pid) {
        if Instant::now() > deadline {
            return Err(CliError::Runtime(format!(
                "the cluster (process {pid}) did not stop within {} s; see the node logs in {}",
                a.wait_s,
                a.dir.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("stopped the cluster of {}", a.dir.display());
    Ok(())
}

#[derive(Args, Debug)]
pub struct ClusterUpArgs {
    /// Cluster file to use (default: DIR/cluster.toml, written with the paper's deployment if absent).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Folder for the default cluster file, the nodes' logs and the gateways' histories.
    #[arg(long, default_value = "kairos-cluster")]
    pub dir: PathBuf,
    /// Passed to every node (`kairos serve --data-dir`): a restarted follower recovers its log from it.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Redis port of the first gateway; the k-th gateway (in node-id order) listens on this + k.
    #[arg(long, default_value_t = 6379)]
    pub redis_port: u16,
    /// Replicas per shard (the `tiga-server` nodes, in id order, are shard-major).
    #[arg(long, default_value_t = 3)]
    pub tiga_replicas: usize,
    /// Stop after this many seconds (default: run until Ctrl-C; at most a year).
    #[arg(long, value_parser = up_duration_s, allow_hyphen_values = true)]
    pub duration_s: Option<f64>,
}

/// `cluster down --wait-s`: 0 (do not wait) to an hour.
fn wait_s(arg: &str) -> Result<f64, String> {
    crate::cli::seconds_within(arg, true, 3_600.0)
}

/// `cluster up --duration-s`: more than 0, at most a year (as `serve --duration-s`).
fn up_duration_s(arg: &str) -> Result<f64, String> {
    crate::cli::seconds_within(arg, false, 86_400.0 * 365.0)
}

/// The paper's deployment (see the module docs), peers on ports `port_base..`.
pub fn default_config(port_base: u16) -> String {
    let mut s = String::from(
        "# Tiga, as in the paper: 3 shards x 3 replicas (replica r of every shard in sc / fi / br;\n\
         # leaders in sc), a Redis gateway per region, and the view manager (one node per server\n\
         # region) that replaces a failed leader. Written by `kairos cluster up`; edit freely.\n\
         [cluster]\nname = \"tiga\"\nlatency = \"gcp\"\ninject_delay = true\n",
    );
    let servers = ["sc", "fi", "br"];
    let mut id = 0u16;
    for _shard in 0..3 {
        for region in servers {
            s += &format!(
                "\n[[node]]\nid = {id}\naddr = \"127.0.0.1:{}\"\nregion = \"{region}\"\nrole = \"tiga-server\"\n",
                port_base + id
            );
            id += 1;
        }
    }
    for region in ["sc", "fi", "br", "hk"] {
        s += &format!(
            "\n[[node]]\nid = {id}\naddr = \"127.0.0.1:{}\"\nregion = \"{region}\"\nrole = \"tiga-gateway\"\n",
            port_base + id
        );
        id += 1;
    }
    for region in servers {
        s += &format!(
            "\n[[node]]\nid = {id}\naddr = \"127.0.0.1:{}\"\nregion = \"{region}\"\nrole = \"{}\"\n",
            port_base + id,
            super::VIEW_MANAGER_ROLE
        );
        id += 1;
    }
    s
}

/// Kills every child still running when dropped (however `up` ends).
pub struct Children(pub Vec<Child>);

impl Children {
    /// SIGINT to each, then waits up to `grace` before killing the rest.
    pub fn stop(&mut self, grace: Duration) {
        for c in &self.0 {
            if let Ok(pid) = i32::try_from(c.id()) {
                // SAFETY: sending a signal to our own child process by its id.
                unsafe {
                    libc::kill(pid, libc::SIGINT);
                }
            }
        }
        let deadline = Instant::now() + grace;
        for c in &mut self.0 {
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn ping(addr: std::net::SocketAddr) -> bool {
    let Ok(s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut w = match s.try_clone() {
        Ok(w) => w,
        Err(_) => return false,
    };
    if w.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).is_ok() && line.starts_with("+PONG")
}

/// A gateway of a running cluster.
pub struct Gateway {
    pub id: NodeId,
    pub region: String,
    pub addr: std::net::SocketAddr,
    pub history: PathBuf,
}

/// The nodes of a cluster file, started as `kairos serve` children.
pub struct Running {
    pub children: Children,
    /// Each child's node id, in the order of `children`.
    pub ids: Vec<NodeId>,
    pub gateways: Vec<Gateway>,
}

/// How to start a cluster's nodes.
pub struct StartOptions<'a> {
    pub config: &'a Path,
    /// Logs (`node-N.log`) and histories (`gateway-N.jsonl`) go here.
    pub dir: &'a Path,
    pub data_dir: Option<&'a Path>,
    pub redis_port: u16,
    pub tiga_replicas: usize,
    /// `--tiga-margin-ms` for every node (None: serve's default, the paper's 10 ms).
    pub margin_ms: Option<f64>,
    /// `--tiga-quorum-choice` for the gateways.
    pub quorum_choice: bool,
}

/// Starts every Tiga node of the cluster file and waits until each gateway answers PING.
pub fn start(o: &StartOptions<'_>) -> Result<Running, CliError> {
    let io = |what: &str, e: std::io::Error| CliError::Io(format!("{what}: {e}"));
    let cfg = ClusterConfig::load(o.config).map_err(|e| CliError::Io(e.to_string()))?;
    super::topology(&cfg, o.tiga_replicas)?;
    let gateway_ids = cfg.nodes_with_role("tiga-gateway");
    if gateway_ids.is_empty() {
        return Err(CliError::Usage(format!("{} has no node with role `tiga-gateway`", o.config.display())));
    }
    let exe = std::env::current_exe().map_err(|e| io("cannot find the kairos executable", e))?;
    let mut running = Running { children: Children(Vec::new()), ids: Vec::new(), gateways: Vec::new() };
    for spec in cfg.nodes() {
        if !["tiga-server", "tiga-gateway", super::VIEW_MANAGER_ROLE].contains(&spec.role.as_str()) {
            continue;
        }
        let mut c = Command::new(&exe);
        c.args(["serve", "--config"]).arg(o.config).args(["--node", &spec.id.0.to_string()]);
        c.args(["--tiga-replicas", &o.tiga_replicas.to_string()]);
        if let Some(m) = o.margin_ms {
            c.args(["--tiga-margin-ms", &m.to_string()]);
        }
        if o.quorum_choice && spec.role == "tiga-gateway" {
            c.arg("--tiga-quorum-choice");
        }
        if let Some(d) = o.data_dir {
            c.arg("--data-dir").arg(d);
        }
        if spec.role == "tiga-gateway" {
            let k = gateway_ids.iter().position(|g| *g == spec.id).unwrap_or(0);
            let port = o
                .redis_port
                .checked_add(k as u16)
                .ok_or_else(|| CliError::Usage("--redis-port leaves no room for every gateway".into()))?;
            let addr = std::net::SocketAddr::new(spec.addr.ip(), port);
            let history = o.dir.join(format!("gateway-{}.jsonl", spec.id.0));
            c.arg("--redis-listen").arg(addr.to_string()).arg("--history").arg(&history);
            running.gateways.push(Gateway { id: spec.id, region: spec.region.clone(), addr, history });
        }
        let log = o.dir.join(format!("node-{}.log", spec.id.0));
        let log = std::fs::File::create(&log).map_err(|e| io(&format!("cannot write {}", log.display()), e))?;
        c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        running.children.0.push(c.spawn().map_err(|e| io("cannot start a node", e))?);
        running.ids.push(spec.id);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for g in &running.gateways {
        while !ping(g.addr) {
            if Instant::now() > deadline || running.children.0.iter_mut().any(|c| matches!(c.try_wait(), Ok(Some(_)))) {
                running.children.stop(Duration::from_secs(5));
                return Err(CliError::Runtime(format!(
                    "the {} gateway ({}) did not come up; see the node logs in {}",
                    g.region,
                    g.addr,
                    o.dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(running)
}

pub fn up(a: ClusterUpArgs) -> Result<(), CliError> {
    let io = |what: &str, e: std::io::Error| CliError::Io(format!("{what}: {e}"));
    std::fs::create_dir_all(&a.dir).map_err(|e| io(&format!("cannot create {}", a.dir.display()), e))?;
    let config = match &a.config {
        Some(c) => c.clone(),
        None => {
            let c = a.dir.join("cluster.toml");
            if !c.exists() {
                std::fs::write(&c, default_config(7100))
                    .map_err(|e| io(&format!("cannot write {}", c.display()), e))?;
                eprintln!("wrote the default cluster file {}", c.display());
            }
            c
        }
    };
    let options = StartOptions {
        config: &config,
        dir: &a.dir,
        data_dir: a.data_dir.as_deref(),
        redis_port: a.redis_port,
        tiga_replicas: a.tiga_replicas,
        margin_ms: None,
        quorum_choice: false,
    };
    let mut running = start(&options)?;
    println!("Tiga cluster up ({} nodes, {}); Redis gateways:", running.children.0.len(), config.display());
    for g in &running.gateways {
        println!(
            "  {:<3} redis-cli -h {} -p {}   (history: {})",
            g.region,
            g.addr.ip(),
            g.addr.port(),
            g.history.display()
        );
    }
    let pid_path = a.dir.join(PID_FILE);
    std::fs::write(&pid_path, format!("{}\n", std::process::id()))
        .map_err(|e| io(&format!("cannot write {}", pid_path.display()), e))?;
    let _pid_file = PidFile(pid_path);
    println!("Ctrl-C (or `kairos cluster down --dir {}`) stops the cluster.", a.dir.display());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Runtime(format!("cannot start the async runtime: {e}")))?;
    let duration = a.duration_s.map(Duration::from_secs_f64);
    runtime.block_on(async {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match duration { Some(d) => tokio::time::sleep(d).await, None => std::future::pending().await } } => {}
        }
    });
    eprintln!("stopping the cluster");
    running.children.stop(Duration::from_secs(5));
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_cluster_file_is_the_papers_deployment() {
        let cfg = kairos_net::ClusterConfig::parse(&super::default_config(7100), "default").unwrap();
        assert_eq!(cfg.nodes_with_role("tiga-server").len(), 9);
        let t = super::super::topology(&cfg, 3).unwrap();
        assert_eq!(t.shard_count(), 3);
        let regions: Vec<String> =
            cfg.nodes_with_role("tiga-gateway").iter().map(|g| cfg.node(*g).unwrap().region.clone()).collect();
        assert_eq!(regions, ["sc", "fi", "br", "hk"]);
        assert_eq!(cfg.nodes_with_role(super::super::VIEW_MANAGER_ROLE).len(), 3);
        assert!(cfg.inject_delay());
    }

    /// `--tiga-replicas 0` said "must be a positive multiple of 0"; it now says what the flag
    /// needs. A count of servers that does not divide into shards still names the multiple.
    #[test]
    fn tiga_replicas_errors_say_what_is_wrong() {
        let cfg = kairos_net::ClusterConfig::parse(&super::default_config(7100), "default").unwrap();
        let e = super::super::topology(&cfg, 0).unwrap_err().to_string();
        assert!(e.contains("--tiga-replicas") && e.contains("at least 1"), "{e}");
        assert!(!e.contains("multiple of 0"), "{e}");
        let e = super::super::topology(&cfg, 4).unwrap_err().to_string();
        assert!(e.contains("9 nodes with role `tiga-server`") && e.contains("positive multiple of 4"), "{e}");
    }
}
