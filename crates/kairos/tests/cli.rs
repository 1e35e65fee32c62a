//! The command line as a user meets it: exit codes, clear errors on bad input, the JSON result
//! contract, and a real multi-process cluster over loopback.

// A test of real processes: it bounds their run with the real clock.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn kairos(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kairos")).args(args).output().expect("kairos runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn check_exit_codes_valid_anomaly_unreadable() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.jsonl");
    std::fs::write(
        &good,
        "{\"index\":0,\"time\":1,\"type\":\"invoke\",\"process\":0,\"f\":\"write\",\"value\":[[\"w\",1,5]]}\n\
         {\"index\":1,\"time\":2,\"type\":\"ok\",\"process\":0,\"f\":\"write\",\"value\":[[\"w\",1,5]]}\n\
         {\"index\":2,\"time\":3,\"type\":\"invoke\",\"process\":1,\"f\":\"read\",\"value\":[[\"r\",1,null]]}\n\
         {\"index\":3,\"time\":4,\"type\":\"ok\",\"process\":1,\"f\":\"read\",\"value\":[[\"r\",1,5]]}\n",
    )
    .unwrap();
    let o = kairos(&["check", good.to_str().unwrap(), "--model", "linearizable"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // The read starts after the write completed yet misses it: a stale read.
    let stale = dir.path().join("stale.jsonl");
    std::fs::write(&stale, std::fs::read_to_string(&good).unwrap().replace("[\"r\",1,5]", "[\"r\",1,null]")).unwrap();
    let o = kairos(&["check", stale.to_str().unwrap(), "--model", "linearizable"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    let garbage = dir.path().join("garbage.jsonl");
    std::fs::write(&garbage, "{\"index\":0,\"type\":\"invoke\"\nnot json at all\n").unwrap();
    let o = kairos(&["check", garbage.to_str().unwrap(), "--model", "strict-serializable"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("line 1"), "the error names the line: {}", text(&o));
    assert!(!text(&o).contains("panicked"));

    let o = kairos(&["check", dir.path().join("missing.jsonl").to_str().unwrap(), "--model", "causal"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn serve_with_a_broken_config_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[cluster]\nname = \"x\"\n[[node]]\nid = 0\naddr = \"127.0.0.1:7001\"\nregion = \"mars\"\n", "mars"),
        ("[cluster]\nname = \"x\"\n[[node]]\nid = 0\naddr = \"nowhere\"\nregion = \"sc\"\n", "nowhere"),
        ("[cluster\nname = \"x\"\n", "line"),
        (
            "[cluster]\nname = \"x\"\n[[node]]\nid = 0\naddr = \"127.0.0.1:7001\"\nregion = \"sc\"\n[[node]]\nid = 0\naddr = \"127.0.0.1:7002\"\nregion = \"sc\"\n",
            "used twice",
        ),
    ];
    for (i, (config, needle)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("c{i}.toml"));
        std::fs::write(&path, config).unwrap();
        let o = kairos(&["serve", "--config", path.to_str().unwrap(), "--node", "0"]);
        assert_eq!(o.status.code(), Some(2), "case {i}: {}", text(&o));
        assert!(text(&o).to_lowercase().contains(needle), "case {i} should mention {needle}: {}", text(&o));
        assert!(!text(&o).contains("panicked"));
    }
    let path = dir.path().join("role.toml");
    std::fs::write(
        &path,
        "[cluster]\nname = \"x\"\n[[node]]\nid = 0\naddr = \"127.0.0.1:7001\"\nregion = \"sc\"\nrole = \"wizard\"\n",
    )
    .unwrap();
    let o = kairos(&["serve", "--config", path.to_str().unwrap(), "--node", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("register-replica"), "lists the known roles: {}", text(&o));
    let o = kairos(&["serve", "--config", path.to_str().unwrap(), "--node", "9"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    for (args, needle) in [
        (vec!["bench", "register", "--duration-s", "0"], "--duration-s"),
        (vec!["bench", "register", "--loss", "1.5"], "--loss"),
        (vec!["bench", "des", "--pending", "0"], "--pending"),
        (vec!["sim", "register", "--seeds", "x..y"], "--seeds"),
        (vec!["check", "f", "--model", "sequential"], "possible values"),
    ] {
        let o = kairos(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(needle), "{args:?}: {}", text(&o));
    }
}

#[test]
fn bench_writes_the_result_contract_and_a_checkable_history() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out/r.json");
    let hist = dir.path().join("h.jsonl");
    let o = kairos(&[
        "bench",
        "register",
        "--duration-s",
        "5",
        "--seed",
        "3",
        "--json",
        json.to_str().unwrap(),
        "--history",
        hist.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let r = &v.as_array().expect("an array of results")[0];
    for field in [
        "system",
        "protocol",
        "workload",
        "host",
        "clock",
        "seed",
        "duration_s",
        "throughput_ops_per_s",
        "latency_ms",
        "latency_ms_by_region",
        "committed",
        "aborted",
        "unknown",
        "round_trips",
        "check",
        "trace_hash",
        "wall_s",
    ] {
        assert!(r.get(field).is_some(), "missing {field}");
    }
    assert_eq!(r["host"], "sim");
    assert_eq!(r["check"]["valid"], true);
    assert!(r["committed"].as_u64().unwrap() > 50);
    assert!(
        r["latency_ms_by_region"]["hk"]["p50"].as_f64().unwrap()
            > r["latency_ms_by_region"]["sc"]["p50"].as_f64().unwrap()
    );
    let o = kairos(&["check", hist.to_str().unwrap(), "--model", "linearizable"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // Same seed, same trace.
    let again = dir.path().join("r2.json");
    kairos(&["bench", "register", "--duration-s", "5", "--seed", "3", "--json", again.to_str().unwrap()]);
    let w: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&again).unwrap()).unwrap();
    assert_eq!(w[0]["trace_hash"], r["trace_hash"]);
}

fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<_> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    listeners.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

/// Kills the child processes when the test ends, however it ends.
struct Children(Vec<std::process::Child>);
impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn a_cluster_of_real_processes_serves_a_linearizable_register() {
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(5);
    let mut config = String::from("[cluster]\nname = \"cli-test\"\nlatency = \"gcp\"\ninject_delay = false\n");
    let roles = ["register-replica", "register-replica", "register-replica", "register-client", "register-client"];
    let regions = ["sc", "fi", "br", "sc", "hk"];
    for i in 0..5 {
        config.push_str(&format!(
            "[[node]]\nid = {i}\naddr = \"127.0.0.1:{}\"\nregion = \"{}\"\nrole = \"{}\"\n",
            ports[i], regions[i], roles[i]
        ));
    }
    let cfg = dir.path().join("cluster.toml");
    std::fs::write(&cfg, config).unwrap();
    let spawn = |node: usize, extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_kairos"))
            .args(["serve", "--config", cfg.to_str().unwrap(), "--node", &node.to_string(), "--duration-s", "60"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut children = Children((0..3).map(|n| spawn(n, &[])).collect());
    let histories: Vec<_> = (3..5).map(|n| dir.path().join(format!("h{n}.jsonl"))).collect();
    let mut clients: Vec<_> =
        (3..5).map(|n| spawn(n, &["--ops", "20", "--history", histories[n - 3].to_str().unwrap()])).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    for c in &mut clients {
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                assert!(status.success());
                break;
            }
            assert!(Instant::now() < deadline, "clients did not finish in 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    children.0.append(&mut clients);
    // Merge the two clients' histories by time and check them with the CLI.
    let mut lines: Vec<serde_json::Value> = histories
        .iter()
        .flat_map(|h| {
            std::fs::read_to_string(h).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect::<Vec<_>>()
        })
        .collect();
    lines.sort_by_key(|v: &serde_json::Value| v["time"].as_u64().unwrap());
    let merged = dir.path().join("merged.jsonl");
    let body: String = lines
        .iter_mut()
        .enumerate()
        .map(|(i, v)| {
            v["index"] = i.into();
            format!("{v}\n")
        })
        .collect();
    std::fs::write(&merged, body).unwrap();
    assert_eq!(lines.len(), 80, "2 clients × 20 operations × (invoke + completion)");
    let o = kairos(&["check", merged.to_str().unwrap(), "--model", "linearizable"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(Path::new(&merged).exists());
}
