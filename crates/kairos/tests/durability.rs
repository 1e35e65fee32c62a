//! Real processes that are killed with SIGKILL and restarted keep what they acknowledged when
//! they have a data directory (`kairos serve --data-dir`), and the merged history stays
//! linearizable. The same run without data directories loses acknowledged writes, and the
//! checker says so: the test can fail.

// A test of real processes: it bounds their run with the real clock.
#![allow(clippy::disallowed_methods)]

mod common;
use common::{free_ports, merge_histories, Children};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

struct Cluster {
    dir: PathBuf,
    cfg: PathBuf,
    data_dir: Option<PathBuf>,
}

const REGISTER: [&str; 5] =
    ["register-replica", "register-replica", "register-replica", "register-client", "register-client"];
const CAUSAL: [&str; 5] = ["causal-member", "causal-member", "causal-member", "causal-session", "causal-session"];

impl Cluster {
    fn new(dir: &Path, roles: &[&str], durable: bool) -> Cluster {
        let ports = free_ports(roles.len());
        let mut config = String::from("[cluster]\nname = \"durability\"\nlatency = \"gcp\"\ninject_delay = false\n");
        for (i, role) in roles.iter().enumerate() {
            let region = ["sc", "fi", "br", "sc", "hk"][i];
            config.push_str(&format!(
                "[[node]]\nid = {i}\naddr = \"127.0.0.1:{}\"\nregion = \"{region}\"\nrole = \"{role}\"\n",
                ports[i]
            ));
        }
        let cfg = dir.join("cluster.toml");
        std::fs::write(&cfg, config).unwrap();
        Cluster { dir: dir.to_path_buf(), cfg, data_dir: durable.then(|| dir.join("data")) }
    }

    fn spawn(&self, node: usize, extra: &[&str]) -> Child {
        let mut c = Command::new(env!("CARGO_BIN_EXE_kairos"));
        c.args(["serve", "--config", self.cfg.to_str().unwrap(), "--node", &node.to_string(), "--duration-s", "60"]);
        c.args(["--seed", &(node + 7).to_string()]).args(extra);
        if let Some(d) = &self.data_dir {
            c.args(["--data-dir", d.to_str().unwrap()]);
        }
        c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
    }

    /// Runs client `node` for `ops` operations to the end (`extra`: more flags); its history
    /// file, `h{node}-{tag}.jsonl`.
    fn client(&self, node: usize, ops: u64, tag: &str, extra: &[&str]) -> PathBuf {
        let history = self.dir.join(format!("h{node}-{tag}.jsonl"));
        let mut args = vec!["--ops".to_string(), ops.to_string(), "--history".into(), history.to_str().unwrap().into()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut c = Children(vec![self.spawn(node, &args)]);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = c.0[0].try_wait().unwrap() {
                assert!(status.success(), "client {node} failed");
                break;
            }
            assert!(Instant::now() < deadline, "client {node} did not finish in 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        history
    }
}

/// Runs a first client, kills the three servers (nodes 0–2) with SIGKILL, restarts them with
/// or without their data directories (`wiped`: this one's is deleted, and it restarts with
/// `--rejoin`), runs a second client; the merged history's check.
fn kill_all_servers_between_two_clients(
    roles: &[&str],
    clients: [usize; 2],
    extra: &[&str],
    model: &str,
    durable: bool,
    wiped: Option<usize>,
) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::new(dir.path(), roles, durable);
    let mut servers = Children((0..3).map(|n| cluster.spawn(n, &[])).collect());
    let first = cluster.client(clients[0], 40, "before", extra);
    for r in &mut servers.0 {
        r.kill().unwrap(); // SIGKILL: no chance to flush anything
        r.wait().unwrap();
    }
    if let Some(n) = wiped {
        std::fs::remove_dir_all(dir.path().join(format!("data/node-{n}"))).unwrap();
    }
    servers.0 = (0..3).map(|n| cluster.spawn(n, if wiped == Some(n) { &["--rejoin"] } else { &[] })).collect();
    let second = cluster.client(clients[1], 40, "after", extra);
    if durable {
        for n in 0..3 {
            let log = dir.path().join(format!("data/node-{n}/log"));
            assert!(std::fs::metadata(&log).unwrap().len() > 0, "server {n} persisted its state");
        }
    }
    let merged = dir.path().join("merged.jsonl");
    let records = merge_histories(&[first, second], &merged, model == "causal");
    assert_eq!(records, 160, "2 clients × 40 operations × (invoke + completion)");
    Command::new(env!("CARGO_BIN_EXE_kairos"))
        .args(["check", merged.to_str().unwrap(), "--model", model])
        .output()
        .unwrap()
}

fn register(durable: bool) -> Output {
    kill_all_servers_between_two_clients(&REGISTER, [3, 4], &[], "linearizable", durable, None)
}

/// A client's session before the restart (node 3) and after it (node 4, which appends values
/// of its own), checked as one session: the merged history gives both the same Jepsen process,
/// so the checker holds the second run's reads to the first run's majority-acknowledged writes
/// (read-your-writes). It reads the primary's own data (read concern local): a new primary
/// holds every majority-acknowledged entry, if the members kept their oplogs.
fn causal(durable: bool, wiped: Option<usize>) -> Output {
    let extra = ["--read-pref", "primary", "--read-concern", "local", "--write-concern", "majority"];
    kill_all_servers_between_two_clients(&CAUSAL, [3, 4], &extra, "causal", durable, wiped)
}

#[test]
fn register_replicas_killed_and_restarted_with_their_data_directories_lose_nothing_acknowledged() {
    let o = register(true);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn without_data_directories_the_register_loses_acknowledged_writes_and_the_checker_sees_it() {
    let o = register(false);
    assert_eq!(o.status.code(), Some(1), "restarted amnesiac replicas must have served stale reads: {}", text(&o));
    assert!(text(&o).contains("non-linearizable"), "{}", text(&o));
}

#[test]
fn causal_members_killed_and_restarted_with_their_data_directories_lose_nothing_acknowledged() {
    let o = causal(true, None);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn without_data_directories_the_replica_set_loses_acknowledged_writes_and_the_checker_sees_it() {
    let o = causal(false, None);
    assert_eq!(o.status.code(), Some(1), "the session must have missed its own acknowledged writes: {}", text(&o));
    assert!(text(&o).contains("read-your-writes"), "{}", text(&o));
}

/// One member's data directory is lost while all three are down; it restarts with `--rejoin`
/// (amnesiac: it votes again only once a primary elected without it caught it up), the others
/// with theirs: nothing acknowledged is lost.
#[test]
fn a_causal_member_that_lost_its_disk_rejoins_and_nothing_acknowledged_is_lost() {
    let o = causal(true, Some(1));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}
