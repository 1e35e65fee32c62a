//! Tiga as a service, driven by unmodified Redis clients: 2 shards × 3 replicas of
//! `kairos serve` (role `tiga-server`) and one gateway (role `tiga-gateway`, RESP on loopback),
//! all real processes. One cluster serves every part, in order:
//!
//! 1. bad input over raw TCP — garbage bytes, a bulk length of 2^40, an unterminated array,
//!    10,000 pipelined commands, an unknown command, EXEC without MULTI, a non-integer INCRBY:
//!    each gets Redis's kind of error or closes that connection only, and a second client
//!    keeps working throughout;
//! 2. redis-cli: SET / GET / MULTI … EXEC;
//! 3. redis-py: concurrent MULTI/EXEC read-modify-write transactions whose final counters
//!    must add up;
//! 4. `redis-benchmark -t set,get,incr -n 20000 -c 16` with zero errors;
//!
//! and at the end the gateway's history (everything it served) must be strictly serializable
//! by `kairos check`.
//!
//! A second test runs `kairos cluster up` (the paper's deployment: 3 shards × 3 replicas in
//! sc / fi / br, a gateway per region including hk, GCP one-way delays injected): redis-cli
//! against the hk gateway, and redis-py clients in all four regions running concurrent
//! MULTI/EXEC read-modify-write transactions on the same keys; the gateways' merged history
//! must be strictly serializable.
//!
//! redis-cli and redis-benchmark come from Debian's `redis-tools`, redis-py from the virtual
//! environment `target/pyvenv` (`.ci/run` installs both). A missing client skips its part with a
//! printed reason — unless the environment variable `CI` is set, then it fails.
#![allow(clippy::disallowed_methods)] // wall time for the printed measurements only

mod common;

use common::{free_ports, Children};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const SHARDS: usize = 2;
const REPLICAS: usize = 3;

fn kairos() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kairos"))
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Whether `program` can run; if not, skips (prints why) — or fails under CI.
fn available(program: &Path, what: &str) -> bool {
    let ok = Command::new(program).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "{what} ({}) is missing and CI is set: .ci/run must install it",
            program.display()
        );
        eprintln!("SKIPPED: {what} ({}) is not installed; `.ci/run` installs it", program.display());
    }
    ok
}

fn python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/pyvenv/bin/python")
}

/// The servers and the gateway, running.
struct Cluster {
    children: Children,
    redis_port: u16,
    history: PathBuf,
    dir: PathBuf,
    config: PathBuf,
    /// One such cluster at a time: several at once on a 2-core machine start too slowly, and
    /// their free-port picks may collide.
    _turn: std::sync::MutexGuard<'static, ()>,
}

static ONE_CLUSTER_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Cluster {
    /// Stops every node still running with SIGINT (so each prints its metrics and the gateway
    /// writes its history), then checks the gateway's history strictly serializable.
    fn stop_and_check(&mut self) {
        for c in &mut self.children.0 {
            if let Ok(None) = c.try_wait() {
                sigint(c.id());
            }
        }
        for c in &mut self.children.0 {
            let _ = c.wait();
        }
        let c = kairos().args(["check", self.history.to_str().unwrap(), "--model", "strict-serializable"]).output();
        let c = c.unwrap();
        assert!(c.status.success() && text(&c).contains("VALID"), "{}", text(&c));
    }

    /// The value of metric `name` that node `i` printed when it stopped (0 if none), and its log.
    fn metric(&self, i: usize, name: &str) -> (u64, String) {
        let log = std::fs::read_to_string(self.dir.join(format!("node-{i}.log"))).unwrap();
        let value = log
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        (value, log)
    }

    /// Node `i` as a `kairos serve` process (logging to `node-i.log`, appending after a
    /// restart), with its data under `dir/data`.
    fn spawn(&self, i: usize) -> std::process::Child {
        self.spawn_with(i, &[])
    }

    /// [`Cluster::spawn`] with `extra` arguments.
    fn spawn_with(&self, i: usize, extra: &[&str]) -> std::process::Child {
        let mut c = kairos();
        c.args(["serve", "--config", self.config.to_str().unwrap(), "--node", &i.to_string()]);
        c.args(extra);
        c.arg("--data-dir").arg(self.dir.join("data"));
        // Loopback without injected delay: a 1 ms margin keeps each commit a few ms.
        c.args(["--tiga-margin-ms", "1"]);
        if i == SHARDS * REPLICAS {
            let listen = format!("127.0.0.1:{}", self.redis_port);
            c.args(["--redis-listen", &listen, "--history", self.history.to_str().unwrap()]);
        }
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("node-{i}.log"))).unwrap();
        c.stdout(Stdio::null()).stderr(log);
        c.spawn().unwrap()
    }
}

fn start(dir: &Path) -> Cluster {
    start_with(dir, 0)
}

/// The servers, the gateway (node `SHARDS × REPLICAS`) and `view_managers` view-manager nodes
/// after it.
fn start_with(dir: &Path, view_managers: usize) -> Cluster {
    let nodes = SHARDS * REPLICAS + 1 + view_managers;
    let turn = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let ports = free_ports(nodes + 1);
    let regions = ["sc", "fi", "br"];
    let mut toml = String::from("[cluster]\nname = \"redis-test\"\n");
    for (i, port) in ports[..nodes].iter().enumerate() {
        let role = match i {
            i if i < SHARDS * REPLICAS => "tiga-server",
            i if i == SHARDS * REPLICAS => "tiga-gateway",
            _ => "tiga-view-manager",
        };
        toml += &format!(
            "\n[[node]]\nid = {i}\naddr = \"127.0.0.1:{port}\"\nregion = \"{}\"\nrole = \"{role}\"\n",
            regions[i % 3]
        );
    }
    let config = dir.join("cluster.toml");
    std::fs::write(&config, toml).unwrap();
    let redis_port = ports[nodes];
    let history = dir.join("gateway.jsonl");
    let mut cluster =
        Cluster { children: Children(Vec::new()), redis_port, history, dir: dir.to_path_buf(), config, _turn: turn };
    for i in 0..nodes {
        let child = cluster.spawn(i);
        cluster.children.0.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", redis_port)) {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            if s.write_all(b"PING\r\n").is_ok() && read_reply(&mut BufReader::new(s)).as_deref() == Some("+PONG") {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the gateway did not answer PING within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster
}

/// One reply's first line (a bulk string's line is followed by its data line, appended after
/// a space); `None` once the connection is closed.
fn read_reply(r: &mut BufReader<TcpStream>) -> Option<String> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let line = line.trim_end().to_string();
    if line.starts_with('$') && line != "$-1" {
        let mut data = String::new();
        r.read_line(&mut data).ok()?;
        return Some(format!("{line} {}", data.trim_end()));
    }
    Some(line)
}

fn connect(port: u16) -> (TcpStream, BufReader<TcpStream>) {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

/// Sends `bytes` on a fresh connection and returns every reply until the gateway closes it or
/// `replies` have arrived.
fn exchange(port: u16, bytes: &[u8], replies: usize) -> (Vec<String>, bool) {
    let (mut s, mut r) = connect(port);
    s.write_all(bytes).unwrap();
    let mut got = Vec::new();
    while got.len() < replies {
        match read_reply(&mut r) {
            Some(x) => got.push(x),
            None => return (got, true),
        }
    }
    (got, false)
}

/// Asks the long-lived second client something; it must still be served.
fn still_served(s: &mut TcpStream, r: &mut BufReader<TcpStream>, after: &str) {
    s.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    assert_eq!(read_reply(r).as_deref(), Some("+PONG"), "the other client after {after}");
}

fn bad_input(port: u16) {
    let (mut other, mut other_r) = connect(port);
    still_served(&mut other, &mut other_r, "nothing");

    // Garbage bytes are an inline command nobody knows; a bad array header is a protocol error.
    let (got, _) = exchange(port, b"\x00\xff\xfe\x01garbage\r\n", 1);
    assert!(got[0].starts_with("-ERR unknown command"), "{got:?}");
    still_served(&mut other, &mut other_r, "garbage bytes");
    let (got, closed) = exchange(port, b"*12x\r\n", 2);
    assert_eq!(got, vec!["-ERR Protocol error: invalid multibulk length"]);
    assert!(closed, "a protocol error closes the connection");

    // A bulk length of 2^40 is refused from its header, and the connection closed.
    let (got, closed) = exchange(port, b"*1\r\n$1099511627776\r\n", 2);
    assert_eq!(got, vec!["-ERR Protocol error: invalid bulk length"]);
    assert!(closed);
    still_served(&mut other, &mut other_r, "a 2^40 bulk length");

    // An unterminated array: nothing is answered; closing our side ends the connection.
    let (mut s, mut r) = connect(port);
    s.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(read_reply(&mut r), None, "no reply to half a command");
    still_served(&mut other, &mut other_r, "an unterminated array");

    // 10,000 pipelined commands: every one answered, in order.
    let started = Instant::now();
    let mut pipeline = Vec::new();
    for _ in 0..10_000 {
        pipeline.extend_from_slice(b"*2\r\n$4\r\nINCR\r\n$8\r\npipeline\r\n");
    }
    pipeline.extend_from_slice(b"*2\r\n$3\r\nGET\r\n$8\r\npipeline\r\n");
    let (got, closed) = exchange(port, &pipeline, 10_001);
    assert!(!closed);
    assert_eq!(got.len(), 10_001);
    assert!(got[..10_000].iter().enumerate().all(|(i, g)| *g == format!(":{}", i + 1)), "in order, each counted once");
    assert_eq!(got[10_000], "$5 10000");
    eprintln!("10,000 pipelined INCRs answered in {:.2} s", started.elapsed().as_secs_f64());
    still_served(&mut other, &mut other_r, "10,000 pipelined commands");

    // Unknown command, EXEC without MULTI, a non-integer INCRBY (value and argument), WATCH,
    // an error queued inside MULTI: each answered with Redis's kind of error; the connection
    // stays open.
    let (got, closed) = exchange(
        port,
        b"FLUSHALL\r\nEXEC\r\nSET s abc\r\nINCRBY s 1\r\nINCRBY n x\r\nWATCH s\r\nMULTI\r\nGET\r\nINCR n\r\nEXEC\r\nPING\r\n",
        11,
    );
    assert!(!closed);
    assert!(got[0].starts_with("-ERR unknown command 'FLUSHALL'"), "{got:?}");
    assert_eq!(got[1], "-ERR EXEC without MULTI");
    assert_eq!(got[2], "+OK");
    assert_eq!(got[3], "-ERR value is not an integer or out of range");
    assert_eq!(got[4], "-ERR value is not an integer or out of range");
    assert!(got[5].starts_with("-ERR not supported: transactions are one-shot"), "{got:?}");
    assert_eq!(&got[6..9], ["+OK", "-ERR wrong number of arguments for 'get' command", "+QUEUED"]);
    assert_eq!(got[9], "-EXECABORT Transaction discarded because of previous errors.");
    assert_eq!(got[10], "+PONG");
    still_served(&mut other, &mut other_r, "command errors");
}

fn redis_cli(port: u16) {
    let cli = Path::new("redis-cli");
    if !available(cli, "redis-cli") {
        return;
    }
    let run = |args: &[&str], stdin: Option<&str>| -> String {
        let mut c = Command::new(cli);
        c.args(["-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let input = stdin.unwrap_or("").to_string();
        let mut sin = child.stdin.take().unwrap();
        sin.write_all(input.as_bytes()).unwrap();
        drop(sin);
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "redis-cli {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(run(&["SET", "greeting", "hello world"], None).trim(), "OK");
    assert_eq!(run(&["GET", "greeting"], None).trim(), "hello world");
    let out = run(&[], Some("MULTI\nSET cli:a 10\nINCRBY cli:a 5\nAPPEND cli:b xy\nMGET cli:a cli:b\nEXEC\n"));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, ["OK", "QUEUED", "QUEUED", "QUEUED", "QUEUED", "OK", "15", "2", "15", "xy"], "{out}");
}

const REDIS_PY_SCRIPT: &str = r#"
import sys, threading, redis
port, clients, txns = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
keys = ["acct:%d" % i for i in range(4)]
errors = []
def work(c):
    r = redis.Redis(host="127.0.0.1", port=port)
    try:
        for i in range(txns):
            # Read-modify-write in one shot: move 1 from one account to another, count the
            # transfer, and read the total of the two accounts touched.
            a, b = keys[(c + i) % 4], keys[(c + i + 1) % 4]
            p = r.pipeline(transaction=True)
            p.decrby(a, 1); p.incrby(b, 1); p.incr("transfers"); p.append("log:%d" % c, "x")
            p.mget(a, b)
            res = p.execute()
            assert res[2] >= 1 and res[3] == i + 1, res
            assert int(res[4][0]) == res[0] and int(res[4][1]) == res[1], res
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=work, args=(c,)) for c in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
r = redis.Redis(host="127.0.0.1", port=port)
total = sum(int(r.get(k) or 0) for k in keys)
transfers = int(r.get("transfers"))
print("errors", len(errors), errors[:3])
print("total", total, "transfers", transfers)
sys.exit(0 if not errors and total == 0 and transfers == clients * txns else 1)
"#;

fn redis_py(port: u16, dir: &Path) {
    let py = python();
    let ok = Command::new(&py)
        .args(["-c", "import redis"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(std::env::var_os("CI").is_none(), "redis-py is missing from {} and CI is set", py.display());
        eprintln!("SKIPPED: redis-py is not installed in {}; `.ci/run` installs it", py.display());
        return;
    }
    let script = dir.join("rmw.py");
    std::fs::write(&script, REDIS_PY_SCRIPT).unwrap();
    let started = Instant::now();
    let (clients, txns) = (8, 40);
    let o = Command::new(&py)
        .args([script.to_str().unwrap(), &port.to_string(), &clients.to_string(), &txns.to_string()])
        .output()
        .unwrap();
    eprintln!(
        "redis-py: {clients} clients × {txns} MULTI/EXEC in {:.2} s: {}",
        started.elapsed().as_secs_f64(),
        text(&o)
    );
    assert!(o.status.success(), "{}", text(&o));
}

fn redis_benchmark(port: u16) {
    let bench = Path::new("redis-benchmark");
    if !available(bench, "redis-benchmark") {
        return;
    }
    let started = Instant::now();
    let o = Command::new(bench)
        .args(["-p", &port.to_string(), "-t", "set,get,incr", "-n", "20000", "-c", "16", "-q"])
        .output()
        .unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    // -q prints one summary line per test (after \r-separated progress lines).
    let summaries: Vec<&str> = out.split(['\r', '\n']).filter(|l| l.contains("requests per second")).collect();
    eprintln!("redis-benchmark in {:.1} s:\n{}", started.elapsed().as_secs_f64(), summaries.join("\n"));
    assert_eq!(summaries.len(), 3, "a summary for SET, GET and INCR: {out}");
    assert!(!out.contains("ERR") && !out.to_lowercase().contains("error"), "no errors: {out}");
}

#[test]
fn redis_clients_against_a_tiga_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start(dir.path());
    let port = cluster.redis_port;
    bad_input(port);
    redis_cli(port);
    redis_py(port, dir.path());
    redis_benchmark(port);

    // The history is written as the gateway serves; let the last records reach the file.
    std::thread::sleep(Duration::from_millis(300));
    let history = std::fs::read_to_string(&cluster.history).unwrap();
    let records = history.lines().count();
    assert!(records > 2 * 100, "the gateway recorded what it served ({records} records)");
    let o =
        kairos().args(["check", cluster.history.to_str().unwrap(), "--model", "strict-serializable"]).output().unwrap();
    eprintln!("kairos check of {records} records: {}", text(&o));
    assert!(o.status.success() && text(&o).contains("VALID"), "{}", text(&o));
    for i in 0..=SHARDS * REPLICAS {
        let log = std::fs::read_to_string(dir.path().join(format!("node-{i}.log"))).unwrap_or_default();
        assert!(!log.contains("panicked"), "node {i} panicked:\n{log}");
    }
}

const REGIONS_SCRIPT: &str = r#"
import sys, threading, redis
ports, txns = [int(p) for p in sys.argv[1].split(",")], int(sys.argv[2])
errors = []
def work(port):
    r = redis.Redis(host="127.0.0.1", port=port)
    try:
        for i in range(txns):
            p = r.pipeline(transaction=True)
            for k in ("geo:a", "geo:b", "geo:c"):
                p.incr(k)
            p.get("geo:a")
            res = p.execute()
            assert res[0] == int(res[3]), res
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=work, args=(p,)) for p in ports]
for t in threads: t.start()
for t in threads: t.join()
r = redis.Redis(host="127.0.0.1", port=ports[0])
values = [int(r.get(k)) for k in ("geo:a", "geo:b", "geo:c")]
print("errors", errors[:3], "values", values)
sys.exit(0 if not errors and values == [len(ports) * txns] * 3 else 1)
"#;

/// `n` consecutive loopback ports free at the time of the call.
fn free_consecutive_ports(n: u16) -> u16 {
    for _ in 0..200 {
        // Taken from the shared counter, so no parallel test is handed one of them.
        let ports = free_ports(n as usize);
        if ports.windows(2).all(|w| w[1] == w[0] + 1) {
            return ports[0];
        }
    }
    panic!("no {n} consecutive free ports");
}

#[test]
fn cluster_up_serves_every_region_strictly_serializably() {
    let cli = Path::new("redis-cli");
    if !available(cli, "redis-cli") {
        return;
    }
    let py = python();
    if !available(&py, "redis-py's Python") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The default deployment, on free ports.
    let ports = free_ports(13);
    let regions = ["sc", "fi", "br", "sc", "fi", "br", "sc", "fi", "br", "sc", "fi", "br", "hk"];
    let mut toml = String::from("[cluster]\nname = \"up-test\"\nlatency = \"gcp\"\ninject_delay = true\n");
    for (i, (port, region)) in ports.iter().zip(regions).enumerate() {
        let role = if i < 9 { "tiga-server" } else { "tiga-gateway" };
        toml +=
            &format!("\n[[node]]\nid = {i}\naddr = \"127.0.0.1:{port}\"\nregion = \"{region}\"\nrole = \"{role}\"\n");
    }
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, toml).unwrap();
    let redis_base = free_consecutive_ports(4);
    let out_dir = dir.path().join("up");
    let mut up = Up(kairos()
        .args(["cluster", "up", "--config", config.to_str().unwrap(), "--dir", out_dir.to_str().unwrap()])
        .args(["--redis-port", &redis_base.to_string(), "--duration-s", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap());
    let mut stdout = BufReader::new(up.0.stdout.take().unwrap());
    let mut banner = String::new();
    while !banner.contains("stops the cluster") {
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap() == 0 {
            panic!("cluster up ended early: {banner}");
        }
        banner += &line;
    }
    eprintln!("{banner}");
    let hk = redis_base + 3;
    let run_cli = |args: &[&str]| {
        let o = Command::new(cli).args(["-p", &hk.to_string()]).args(args).output().unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(run_cli(&["SET", "greeting", "hello from hk"]), "OK");
    assert_eq!(run_cli(&["GET", "greeting"]), "hello from hk");
    let started = Instant::now();
    let gateways: Vec<String> = (0..4).map(|k| (redis_base + k).to_string()).collect();
    let script = dir.path().join("regions.py");
    std::fs::write(&script, REGIONS_SCRIPT).unwrap();
    let o = Command::new(&py).args([script.to_str().unwrap(), &gateways.join(","), "6"]).output().unwrap();
    eprintln!("redis-py in 4 regions × 6 MULTI/EXEC in {:.1} s: {}", started.elapsed().as_secs_f64(), text(&o));
    // Stop the cluster from outside, as a user in another terminal would (`cluster down` sends
    // SIGINT, which lets the gateways finish their histories).
    let down = kairos().args(["cluster", "down", "--dir", out_dir.to_str().unwrap()]).output().unwrap();
    assert!(down.status.success(), "{}", text(&down));
    let status = up.0.wait().unwrap();
    assert!(!out_dir.join("cluster.pid").exists(), "cluster up removes its pid file");
    let again = kairos().args(["cluster", "down", "--dir", out_dir.to_str().unwrap()]).output().unwrap();
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    assert!(text(&again).contains("no cluster runs in"), "{}", text(&again));
    assert!(o.status.success(), "{}", text(&o));
    assert!(status.success(), "cluster up exited with {status}");
    let histories: Vec<PathBuf> = (9..13).map(|n| out_dir.join(format!("gateway-{n}.jsonl"))).collect();
    let merged = dir.path().join("merged.jsonl");
    let records = common::merge_histories(&histories, &merged, false);
    assert!(records >= 2 * (2 + 4 * 6), "{records} records");
    let c = kairos().args(["check", merged.to_str().unwrap(), "--model", "strict-serializable"]).output().unwrap();
    eprintln!("kairos check of the 4 gateways' merged history: {}", text(&c));
    assert!(c.status.success() && text(&c).contains("VALID"), "{}", text(&c));
}

/// Sends SIGINT to a process (as Ctrl-C would).
fn sigint(pid: u32) {
    let _ = Command::new("kill").args(["-INT", &pid.to_string()]).status();
}

/// `kairos cluster up`, stopped with SIGINT (so it stops its nodes) however the test ends.
struct Up(std::process::Child);
impl Drop for Up {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            sigint(self.0.id());
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(self.0.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A follower killed with SIGKILL mid-run and restarted from its data directory: every
/// acknowledged increment is there afterwards, the restarted follower recovered its log from
/// disk, and the gateway's history is strictly serializable.
#[test]
fn a_follower_killed_and_restarted_from_its_data_directory_loses_nothing() {
    follower_killed_and_restarted(false);
}

/// The same, but the follower's data directory is wiped before it restarts with `--rejoin`:
/// it knows its disk was lost (so it does not vote until a later view), and nothing
/// acknowledged is lost.
#[test]
fn a_follower_that_lost_its_disk_rejoins_knowing_it_and_nothing_acknowledged_is_lost() {
    follower_killed_and_restarted(true);
}

fn follower_killed_and_restarted(wipe: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = start(dir.path());
    let (mut s, mut r) = connect(cluster.redis_port);
    let mut acked = [0i64; 8];
    let mut incr = |s: &mut TcpStream, r: &mut BufReader<TcpStream>, n: usize| {
        for i in 0..n {
            let k = i % acked.len();
            s.write_all(format!("INCR k{k}\r\n").as_bytes()).unwrap();
            let reply = read_reply(r).unwrap_or_default();
            if reply.starts_with(':') {
                acked[k] += 1;
            }
        }
    };
    incr(&mut s, &mut r, 200);
    // Node 1 is a follower of shard 0 (replica 0 of every shard leads).
    let victim = 1;
    cluster.children.0[victim].kill().unwrap();
    cluster.children.0[victim].wait().unwrap();
    incr(&mut s, &mut r, 200);
    let back = if wipe {
        std::fs::remove_dir_all(dir.path().join("data").join(format!("node-{victim}"))).unwrap();
        cluster.spawn_with(victim, &["--rejoin"])
    } else {
        cluster.spawn(victim)
    };
    cluster.children.0[victim] = back;
    std::thread::sleep(Duration::from_millis(500));
    incr(&mut s, &mut r, 200);
    for (k, n) in acked.iter().enumerate() {
        s.write_all(format!("GET k{k}\r\n").as_bytes()).unwrap();
        assert_eq!(read_reply(&mut r), Some(format!("${} {n}", n.to_string().len())), "k{k}");
    }
    assert_eq!(acked.iter().sum::<i64>(), 600, "every increment was acknowledged");
    drop((s, r));
    // Stop every node with SIGINT so each prints its metrics and the gateway its history.
    cluster.stop_and_check();
    if wipe {
        let (lost, log) = cluster.metric(victim, "tiga.server_disk_lost");
        assert_eq!(lost, 1, "the rejoining follower knows its disk was lost\n{log}");
        assert!(log.contains("its disk was lost"), "the host says why\n{log}");
    } else {
        let (recovered, log) = cluster.metric(victim, "tiga.server_recovered_entries");
        assert!(recovered >= 50, "the restarted follower recovered its log from disk: {recovered}\n{log}");
    }
}

/// A shard's leader killed with SIGKILL mid-run: the view manager replaces it (a view change
/// among real processes), the gateway learns the new view and goes on, every acknowledged
/// increment is there afterwards (one whose outcome the gateway could not learn may or may not
/// be), and the gateway's history is strictly serializable.
#[test]
fn a_leader_killed_mid_run_is_replaced_by_a_view_change_and_nothing_acknowledged_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = start_with(dir.path(), 3);
    let (mut s, mut r) = connect(cluster.redis_port);
    let mut acked = [0i64; 8];
    let mut unknown = [0i64; 8];
    // Returns the longest any one increment waited (the failover shows as one long wait).
    let mut incr = |s: &mut TcpStream, r: &mut BufReader<TcpStream>, n: usize| {
        let mut longest = Duration::ZERO;
        for i in 0..n {
            let k = i % acked.len();
            let sent = Instant::now();
            s.write_all(format!("INCR k{k}\r\n").as_bytes()).unwrap();
            let reply = read_reply(r).unwrap_or_default();
            longest = longest.max(sent.elapsed());
            if reply.starts_with(':') {
                acked[k] += 1;
            } else {
                assert!(reply.contains("outcome unknown"), "only an unknown outcome may fail: {reply}");
                unknown[k] += 1;
            }
        }
        longest
    };
    let before = incr(&mut s, &mut r, 200);
    // Node 0 leads shard 0 in view 0.
    let victim = 0;
    cluster.children.0[victim].kill().unwrap();
    cluster.children.0[victim].wait().unwrap();
    let across = incr(&mut s, &mut r, 300);
    eprintln!("longest wait of one increment: {before:?} before the kill, {across:?} across the failover");
    for k in 0..acked.len() {
        s.write_all(format!("GET k{k}\r\n").as_bytes()).unwrap();
        let reply = read_reply(&mut r).unwrap_or_default();
        let value: i64 = reply.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(-1);
        assert!(
            (acked[k]..=acked[k] + unknown[k]).contains(&value),
            "k{k}: {value}, with {} acknowledged and {} unknown",
            acked[k],
            unknown[k]
        );
    }
    assert!(acked.iter().sum::<i64>() >= 450, "the cluster went on after the failover: {acked:?}");
    drop((s, r));
    cluster.stop_and_check();
    // A surviving replica of shard 0 served in a later view.
    let (view_changes, log) = cluster.metric(1, "tiga.server_view_changes");
    assert!(view_changes >= 1, "the servers changed views:\n{log}");
}
