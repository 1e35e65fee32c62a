//! The command line as a user meets it: exit codes, clear errors on bad input, the JSON result
//! contract, and a real multi-process cluster over loopback.

// A test of real processes: it bounds their run with the real clock.
#![allow(clippy::disallowed_methods)]

mod common;
use common::{free_ports, merge_histories, Children};

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

    // Jepsen's EDN with keyword keys: the same stale read.
    let edn = dir.path().join("stale.edn");
    std::fs::write(
        &edn,
        "{:type :invoke, :f :txn, :value [[:w :x 5]], :process 0, :time 1}
         {:type :ok, :f :txn, :value [[:w :x 5]], :process 0, :time 2}
         {:process :nemesis, :type :info, :f :start, :value nil}
         {:type :invoke, :f :txn, :value [[:r :x nil]], :process 1, :time 3}
         {:type :ok, :f :txn, :value [[:r :x nil]], :process 1, :time 4}
",
    )
    .unwrap();
    let o = kairos(&["check", edn.to_str().unwrap(), "--model", "strict-serializable"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("realtime"), "{}", text(&o));
    let o = kairos(&["check", edn.to_str().unwrap(), "--model", "serializable"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn check_exit_code_3_when_no_checker_can_decide() {
    // Two blind writes of the same value: adya needs unique values, the dependency graph
    // cannot order them, and a one-step search cannot finish. Nothing proves or refutes
    // serializability, and that is not "valid".
    let dir = tempfile::tempdir().unwrap();
    let h = dir.path().join("twice.jsonl");
    std::fs::write(
        &h,
        "{\"type\":\"invoke\",\"process\":0,\"value\":[[\"w\",1,7]]}\n\
         {\"type\":\"invoke\",\"process\":1,\"value\":[[\"w\",1,7]]}\n\
         {\"type\":\"ok\",\"process\":0,\"value\":[[\"w\",1,7]]}\n\
         {\"type\":\"ok\",\"process\":1,\"value\":[[\"w\",1,7]]}\n\
         {\"type\":\"invoke\",\"process\":2,\"value\":[[\"r\",1,null]]}\n\
         {\"type\":\"ok\",\"process\":2,\"value\":[[\"r\",1,7]]}\n",
    )
    .unwrap();
    let path = h.to_str().unwrap();
    let o = kairos(&["check", path, "--model", "serializable", "--search-budget", "1"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).starts_with("UNKNOWN"), "{}", text(&o));
    assert!(text(&o).contains("--search-budget"), "the report says what would settle it: {}", text(&o));
    let o = kairos(&["check", path, "--model", "serializable", "--search-budget", "1", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    assert_eq!(report["verdict"], "unknown", "{report}");
    assert_eq!(report["valid"], false, "{report}");
    let o = kairos(&["check", path, "--model", "serializable"]);
    assert_eq!(o.status.code(), Some(0), "with the default budget the search settles it: {}", text(&o));
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

/// `--rejoin` (the node ran before): a view manager whose data directory is empty lost its
/// disk and is refused, naming what to do. Without `--data-dir` the flag is a usage error.
#[test]
fn serve_rejoin_refuses_a_view_manager_that_lost_its_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("set.toml");
    std::fs::write(
        &path,
        "[cluster]\nname = \"x\"\n[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\nregion = \"sc\"\nrole = \"tiga-view-manager\"\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let (config, data_dir) = (path.to_str().unwrap(), data.to_str().unwrap());
    let o = kairos(&["serve", "--config", config, "--node", "0", "--data-dir", data_dir, "--rejoin"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("lost its disk") && text(&o).contains("start the whole set anew"), "{}", text(&o));
    let o = kairos(&["serve", "--config", config, "--node", "0", "--rejoin"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--data-dir"), "{}", text(&o));
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    for (args, needle) in [
        (vec!["bench", "register", "--duration-s", "0"], "--duration-s"),
        (vec!["bench", "register", "--loss", "1.5"], "--loss"),
        (vec!["bench", "des", "--pending", "0"], "--pending"),
        (vec!["sim", "register", "--seeds", "x..y"], "--seeds"),
        (vec!["check", "f", "--model", "sequential"], "possible values"),
        (vec!["bench", "micro", "--protocols", "tiga,calvin"], "unknown protocol \"calvin\""),
        (
            vec!["bench", "micro", "--protocols", "slog"],
            "tiga, 2pl-paxos, occ-paxos, tapir, janus, calvin+, detock, ncc, ncc+",
        ),
        (vec!["bench", "micro", "--protocols", "occ-paxos-interactive"], "only on TPC-C"),
        (vec!["sim", "calvin+", "--seeds", "1", "--faults", "crash,torn"], "Calvin+ has no recovery"),
        (vec!["sim", "janus", "--seeds", "1", "--faults", "crash"], "Janus has no recovery"),
        (vec!["sim", "detock", "--seeds", "1", "--faults", "crash"], "Detock has no recovery"),
        (vec!["sim", "ncc", "--seeds", "1", "--faults", "crash"], "NCC has one server per shard"),
        (vec!["bench", "micro", "--protocols", ""], "at least one protocol"),
        (vec!["bench", "micro", "--protocols", " , "], "at least one protocol"),
        (vec!["bench", "micro", "--load", "0"], "--load"),
        (vec!["bench", "micro", "--load", "1000,-5"], "--load"),
        (vec!["bench", "micro", "--skew-sweep", "0.5,9"], "skew"),
        (vec!["bench", "tiga", "--duration-s", "4", "--kill-leader-at-s", "9"], "--kill-leader-at-s"),
        (vec!["bench", "tiga", "--kill-leader-at-s", "1", "--kill-shard", "5"], "--kill-shard"),
        (vec!["bench", "tiga", "--kill-leader-at-s", "1", "--restart-after-s", "5000"], "--restart-after-s"),
        (vec!["bench", "tiga", "--kill-shard", "1"], "--kill-leader-at-s"),
        (vec!["bench", "tiga", "--keys-per-shard", "0"], "--keys-per-shard"),
        (vec!["bench", "tiga", "--load-keys", "--keys-per-shard", "5000000"], "--load-keys"),
        (vec!["bench", "tiga", "--message-cost-us", "3"], "--measured-cpu"),
        (vec!["bench", "micro", "--message-cost-us", "20000"], "--message-cost-us"),
        (vec!["bench", "tiga", "--announce-at-release-ms", "0"], "--announce-at-release-ms"),
        (vec!["bench", "tiga", "--announce-at-release-ms", "soon"], "milliseconds"),
        (vec!["bench", "net", "--windows", "0"], "--windows"),
        (vec!["bench", "net", "--sizes", "99999999"], "--sizes"),
        (vec!["bench", "net", "--messages", "0"], "--messages"),
        (vec!["bench", "tpcc", "--mix", "new-order=44,refund=56"], "unknown TPC-C transaction type 'refund'"),
        (vec!["bench", "tpcc", "--mix", "new-order=44,payment=44"], "sum to 88, not 100"),
        (vec!["bench", "tpcc", "--warehouses", "0"], "at least one warehouse"),
        (vec!["bench", "tpcc", "--warehouses", "4"], "4 warehouses cannot be spread over 6 shards"),
    ] {
        let o = kairos(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(needle), "{args:?}: {}", text(&o));
    }
}

/// `cluster up --duration-s` and `cluster down --wait-s` take finite seconds: NaN used to reach
/// `Duration::from_secs_f64` and panic (`down` after it had already signalled the cluster, `up`
/// after it had started every node). Now clap refuses them before anything starts.
#[test]
fn cluster_durations_must_be_finite_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    // A cluster file that does not exist: were a value let through, `up` would stop there.
    let config = dir.path().join("absent.toml");
    let config = config.to_str().unwrap();
    for bad in ["NaN", "inf", "-1"] {
        for args in [
            vec!["cluster", "down", "--dir", d, "--wait-s", bad],
            vec!["cluster", "up", "--dir", d, "--config", config, "--duration-s", bad],
        ] {
            let o = kairos(&args);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
            assert!(text(&o).contains("number of seconds"), "{args:?}: {}", text(&o));
        }
    }
    let o = kairos(&["cluster", "up", "--dir", d, "--config", config, "--duration-s", "0"]);
    assert!(text(&o).contains("number of seconds above 0"), "{}", text(&o));
}

/// A register run too short for any operation to complete used to print "VALID: 0 operations
/// checked" and exit 0; it now says nothing was checked and exits 3 (no verdict), with what to
/// change. The header shows the --duration-s given, not rounded (1.5 was shown as 2).
#[test]
fn bench_register_that_completes_nothing_is_not_a_pass() {
    let o = kairos(&["bench", "register", "--duration-s", "0.01"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("NOTHING CHECKED") && text(&o).contains("longer --duration-s"), "{}", text(&o));
    assert!(!text(&o).contains("VALID"), "{}", text(&o));
    assert!(text(&o).contains(", 0.01 virtual s:"), "{}", text(&o));
    let o = kairos(&["bench", "register", "--duration-s", "1.5"]);
    assert!(text(&o).contains(", 1.5 virtual s:"), "{}", text(&o));
}

/// `bench net` measures two real nodes over loopback and writes what it measured and the
/// fitted per-message cost.
#[test]
fn bench_net_measures_the_host_per_message() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("net.json");
    let o = kairos(&[
        "bench",
        "net",
        "--sizes",
        "16,2048",
        "--windows",
        "1",
        "--messages",
        "300",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("sender µs/msg") && text(&o).contains("Fitted per-message cost"), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let points = v[0]["calibration"]["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    assert_eq!(points[1]["encoded_bytes"], 2048 + 3);
    assert!(v[0]["wire_cost"]["send_ns_base"].as_f64().unwrap() >= 0.0);
}

/// `bench micro` reports, per run, the admitted load beside the offered one, messages and the
/// busiest server's CPU per commit, and under measured CPU the per-message cost it charged.
#[test]
fn bench_micro_reports_admitted_load_and_costs_per_commit() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("micro.json");
    let o = kairos(&[
        "bench",
        "micro",
        "--protocols",
        "tiga,2pl-paxos",
        "--load",
        "300",
        "--common-load",
        "300",
        "--duration-s",
        "0.5",
        "--message-cost-us",
        "4",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("admitted txn/s") && text(&o).contains("busiest µs / commit"), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for r in v.as_array().unwrap() {
        let search = &r["extra"]["throughput_search"][0];
        assert_eq!(search["admitted_txn_per_s"], 300.0, "no arrival refused at 300 txn/s: {r}");
        assert_eq!(r["extra"]["throughput_search_end"], "given-loads", "{r}");
        assert_eq!(r["extra"]["max_throughput_is_lower_bound"], false, "{r}");
        assert!(r["extra"]["messages_per_commit"].as_f64().unwrap() > 1.0, "{r}");
        // A commit takes at least two messages at its busiest server, 2 µs each there, and
        // the handlers cost something beside them.
        let wire = r["extra"]["busiest_server_wire_us_per_commit"].as_f64().unwrap();
        assert!(wire > 4.0, "{r}");
        assert!(r["extra"]["busiest_server_us_per_commit"].as_f64().unwrap() > wire, "{r}");
        assert_eq!(r["extra"]["message_cost"]["source"], "--message-cost-us", "{r}");
        assert_eq!(r["extra"]["message_cost"]["wire_cost"]["send_ns_base"], 2000.0, "{r}");
    }
}

/// `bench tpcc` runs the peers on TPC-C and reports, per run, the databases' checks beside the
/// history's verdict.
#[test]
fn bench_tpcc_checks_the_databases_of_every_run() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("tpcc.json");
    let o = kairos(&[
        "bench",
        "tpcc",
        "--protocols",
        "calvin+,2pl-paxos",
        "--load",
        "150",
        "--common-load",
        "150",
        "--duration-s",
        "1",
        "--cpu-us",
        "5",
        "--customers-per-district",
        "30",
        "--initial-orders-per-district",
        "30",
        "--items",
        "1000",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("TPC-C, 6 warehouses on 6 shards"), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = v.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for r in runs {
        assert_eq!(r["workload"]["name"], "tpcc", "{r}");
        assert_eq!(r["extra"]["verdict"], "valid", "{r}");
        let db = &r["extra"]["tpcc_consistency"];
        assert_eq!(db["violations"], 0, "{r}");
        assert!(db["conditions_checked"].as_u64().unwrap() > 6 * 10 * 30 * 3, "{r}");
        assert!(db["orders_placed"].as_u64().unwrap() > 20 && db["payments_made"].as_u64().unwrap() > 20, "{r}");
        assert!(r["committed"].as_u64().unwrap() > 50, "{r}");
        // Per transaction type: every type of the mix ran, new-order and payment most.
        let by_type = r["extra"]["by_type"].as_array().unwrap();
        let names: Vec<&str> = by_type.iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["new-order", "payment", "delivery", "order-status", "stock-level"], "{r}");
        let committed = |i: usize| by_type[i]["committed"].as_u64().unwrap();
        assert!(committed(0) > committed(2) && committed(1) > committed(3), "{r}");
        assert!(r["latency_cdf_ms_by_op"]["new-order"].as_array().is_some_and(|c| !c.is_empty()), "{r}");
    }
    assert!(text(&o).contains("By transaction type at 150 txn/s"), "{}", text(&o));
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
    let merged = dir.path().join("merged.jsonl");
    let records = merge_histories(&histories, &merged, false);
    assert_eq!(records, 80, "2 clients × 20 operations × (invoke + completion)");
    let o = kairos(&["check", merged.to_str().unwrap(), "--model", "linearizable"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(Path::new(&merged).exists());
}

/// The causal replica set as real processes: 3 `causal-member` processes and a
/// `causal-session` process (read preference secondary, majority writes and reads, causal on)
/// that writes to the primary and reads its own writes back from secondaries. The history does
/// not say which member served a read, so the session counts, in the metric
/// `causal.session.own_write_reads_from_secondary` printed when it stops, the reads answered by
/// a member that named another member as primary whose list holds one of its own appends.
#[test]
fn a_causal_replica_set_of_real_processes_reads_its_own_writes_from_secondaries() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(4);
    let mut config = String::from("[cluster]\nname = \"causal-cli-test\"\nlatency = \"gcp\"\ninject_delay = false\n");
    let roles = ["causal-member", "causal-member", "causal-member", "causal-session"];
    let regions = ["sc", "fi", "br", "sc"];
    for i in 0..4 {
        config.push_str(&format!(
            "[[node]]\nid = {i}\naddr = \"127.0.0.1:{}\"\nregion = \"{}\"\nrole = \"{}\"\n",
            ports[i], regions[i], roles[i]
        ));
    }
    let cfg = dir.path().join("cluster.toml");
    std::fs::write(&cfg, config).unwrap();
    let spawn = |node: usize, extra: &[&str], stderr: Stdio| {
        Command::new(env!("CARGO_BIN_EXE_kairos"))
            .args(["serve", "--config", cfg.to_str().unwrap(), "--node", &node.to_string(), "--duration-s", "55"])
            .args(["--seed", &(node + 1).to_string()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap()
    };
    let mut children = Children((0..3).map(|n| spawn(n, &[], Stdio::null())).collect());
    // The session waits 3 s (its warm-up) before its first operation: the members elect a
    // primary and generate the first signing keys meanwhile.
    let history = dir.path().join("session.jsonl");
    let log = dir.path().join("session.log");
    let ops = 40;
    let session = spawn(
        3,
        &["--ops", &ops.to_string(), "--history", history.to_str().unwrap()],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    children.0.push(session);
    let deadline = started + Duration::from_secs(58);
    loop {
        if let Some(status) = children.0[3].try_wait().unwrap() {
            assert!(status.success(), "{}", std::fs::read_to_string(&log).unwrap_or_default());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the session did not finish in time: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(children);

    let o = kairos(&["check", history.to_str().unwrap(), "--model", "causal"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // From the history: a read returned a list holding an append the session had completed
    // (ok) before it invoked the read.
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&history).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2 * ops, "{ops} operations × (invoke + completion)");
    let mut acked: Vec<(u64, u64)> = Vec::new();
    let mut own_reads = 0;
    let mut writes_ok = 0;
    for v in &lines {
        let mop = &v["value"][0];
        if v["type"] != "ok" {
            continue;
        }
        match mop[0].as_str().unwrap() {
            "append" => {
                writes_ok += 1;
                acked.push((mop[1].as_u64().unwrap(), mop[2].as_u64().unwrap()));
            }
            "r" => {
                let key = mop[1].as_u64().unwrap();
                let list: Vec<u64> = mop[2].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
                if acked.iter().any(|&(k, val)| k == key && list.contains(&val)) {
                    own_reads += 1;
                }
            }
            other => panic!("unexpected micro-op {other}"),
        }
    }
    assert!(writes_ok > 0, "no write was acknowledged");
    assert!(own_reads > 0, "no read returned the session's own earlier append");

    // From the session's metrics: such reads were served by secondaries.
    let log = std::fs::read_to_string(&log).unwrap();
    let metric = |name: &str| -> u64 {
        log.split_whitespace()
            .find_map(|w| w.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let from_secondary = metric("causal.session.reads_from_secondary");
    let own_from_secondary = metric("causal.session.own_write_reads_from_secondary");
    assert!(own_from_secondary > 0, "no own write read from a secondary: {log}");
    assert!(from_secondary >= own_from_secondary);
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
}

/// The recovery experiment as a user runs it: a leader killed mid-run, the table's time
/// series and recovery time, and the same in `--json`.
#[test]
fn bench_tiga_kills_a_leader_and_reports_the_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("kill.json");
    let o = kairos(&[
        "bench",
        "tiga",
        "--load",
        "1500",
        "--duration-s",
        "5",
        "--kill-leader-at-s",
        "1.5",
        "--kill-shard",
        "1",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("← leader crashes") && text(&o).contains("recovery: throughput back"), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let r = &v[0];
    assert_eq!(r["check"]["verdict"], "valid", "{r}");
    assert_eq!(r["extra"]["view"], 1, "one view change");
    let recovery = r["extra"]["recovery_s"].as_f64().expect("recovered");
    assert!(recovery > 0.0 && recovery < 3.0, "{recovery}");
    assert_eq!(r["extra"]["series"].as_array().unwrap().len(), 50, "100 ms bins over 5 s");
    assert!(r["extra"]["latency_ms_p50_after_recovery_by_region"]["sc"].as_f64().unwrap() > 0.0);
}

/// `bench tiga --measured-cpu` replays shard 0's leader's inputs alone after the run and
/// reports its CPU per piece both ways (the figures are machine-dependent; only their
/// presence and sense are checked).
#[test]
fn bench_tiga_measured_cpu_replays_a_leader_alone() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("alone.json");
    let args = ["bench", "tiga", "--load", "1000", "--duration-s", "0.5", "--measured-cpu", "--message-cost-us", "0"];
    // With the keys loaded (fewer of them, to stay quick), as the paper's setup runs.
    let keys = ["--load-keys", "--keys-per-shard", "20000"];
    let o = kairos(&[&args[..], &keys, &["--json", json.to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("replayed alone on a fresh instance"), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v[0]["workload"]["keys_loaded"], true, "{v}");
    let extra = &v[0]["extra"];
    for key in ["leader0_cpu_us_per_piece", "leader0_alone_cpu_us_per_piece", "leader0_alone_handler_ms_max"] {
        assert!(extra[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {extra}");
    }
}

/// `kairos cluster bench` on plain loopback: the paper's deployment as 16 real processes, every
/// region's transactions committed, CPU per transaction measured, and the gateways' merged
/// history checked (the command fails if it is not strictly serializable).
#[test]
fn cluster_bench_measures_every_region_and_checks_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let o = kairos(&[
        "cluster",
        "bench",
        "--no-delay",
        "--margin-ms",
        "1",
        "--requests",
        "5",
        "--clients",
        "2",
        "--duration-s",
        "1",
        "--dir",
        dir.path().join("cluster").to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["verdict"], "VALID", "{r}");
    let rows = r["latency"].as_array().unwrap();
    assert_eq!(rows.len(), 8, "single-key and 3-shard rows for sc, fi, br, hk: {r}");
    for row in rows {
        assert_eq!((row["committed"].as_u64(), row["failed"].as_u64()), (Some(5), Some(0)), "{row}");
        assert!(row["analytic_ms"].is_null(), "no analytic bound without injected delay: {row}");
    }
    assert!(r["throughput_txn_per_s"].as_f64().unwrap() > 0.0, "{r}");
    let roles: Vec<(String, u64)> = r["cpu"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["role"].as_str().unwrap().to_string(), c["processes"].as_u64().unwrap()))
        .collect();
    let names = ["gateways (coordinators)", "leaders", "followers", "view manager", "all nodes"];
    let expected: Vec<(String, u64)> = names.iter().map(|n| n.to_string()).zip([4, 3, 6, 3, 16]).collect();
    assert_eq!(roles, expected, "{r}");
    assert!(r["cpu"][4]["cpu_us_per_txn"].as_f64().unwrap() > 0.0, "the cluster used CPU: {r}");
    // Every latency transaction (4 regions × 5 × 2) and every throughput one is in the history.
    assert!(r["history_records"].as_u64().unwrap() >= 2 * 40, "{r}");
}
