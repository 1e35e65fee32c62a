//! The layering rule of the workspace, checked on `cargo metadata`: a protocol crate
//! (`kairos-tiga`, `kairos-txn`, `kairos-swarm`, `kairos-causal`, `kairos-register`) depends,
//! directly or not, on no other protocol crate, on neither the simulator (`kairos-sim`), the
//! checker (`kairos-check`), the TCP host (`kairos-net`) nor the harness that runs them
//! (`kairos-harness`), and not on tokio.
//! What protocols share (`kairos-workload`, `kairos-consensus`) is allowed. Dev-dependencies
//! do not count (tests may check histories).
//!
//! No edge breaks the rule any more (the last ones went when the simulated runners of SWARM,
//! the replica set and the register moved into `kairos-harness`); the test fails on any.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

const PROTOCOL_CRATES: [&str; 5] = ["kairos-tiga", "kairos-txn", "kairos-swarm", "kairos-causal", "kairos-register"];
const NEVER_BELOW_A_PROTOCOL: [&str; 5] = ["kairos-sim", "kairos-check", "kairos-net", "kairos-harness", "tokio"];

/// Every package's normal and build dependencies, by name.
fn dependency_graph() -> BTreeMap<String, Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let names: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let mut graph = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let deps = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["dep_kinds"].as_array().unwrap().iter().any(|k| k["kind"].is_null() || k["kind"] == "build"))
            .map(|d| names[d["pkg"].as_str().unwrap()].to_string())
            .collect();
        graph.insert(names[node["id"].as_str().unwrap()].to_string(), deps);
    }
    graph
}

fn reachable(graph: &BTreeMap<String, Vec<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_string()];
    while let Some(p) = stack.pop() {
        for d in graph.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                stack.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn protocol_crates_depend_on_no_other_protocol_nor_on_the_checker_the_host_or_tokio() {
    let graph = dependency_graph();
    let mut found = BTreeSet::new();
    for p in PROTOCOL_CRATES {
        assert!(graph.contains_key(p), "{p} is not in the workspace any more: update this test");
        let below = reachable(&graph, p);
        for forbidden in PROTOCOL_CRATES.iter().chain(&NEVER_BELOW_A_PROTOCOL) {
            if *forbidden != p && below.contains(*forbidden) {
                found.insert((p, *forbidden));
            }
        }
    }
    assert!(found.is_empty(), "protocol crates depend on what they must not (crate, dependency): {found:?}");
}

/// The rule can fail: the binary crate depends on every protocol and on kairos-net.
#[test]
fn the_rule_sees_forbidden_edges_where_they_exist() {
    let below = reachable(&dependency_graph(), "kairos");
    for p in PROTOCOL_CRATES.iter().chain(&["kairos-net", "tokio"]) {
        assert!(below.contains(*p), "{p}");
    }
}
