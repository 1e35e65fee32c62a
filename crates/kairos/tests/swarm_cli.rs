//! `kairos bench swarm` as a user meets it: the result contract per protocol, clear errors.

use std::process::{Command, Output};

fn kairos(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kairos")).args(args).output().expect("kairos runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn bench_swarm_writes_one_result_per_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("swarm.json");
    let o = kairos(&[
        "bench",
        "swarm",
        "--keys",
        "200",
        "--warmup",
        "500",
        "--ops",
        "200",
        "--seed",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("SWARM-KV") && text(&o).contains("linearizable"), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = v.as_array().unwrap();
    let protocols: Vec<&str> = runs.iter().map(|r| r["protocol"].as_str().unwrap()).collect();
    assert_eq!(protocols, ["swarm-kv", "dm-abd", "fusee", "raw"]);
    for r in runs {
        assert_eq!(r["system"], "swarm");
        assert_eq!(r["host"], "sim");
        assert_eq!(r["check"]["valid"], true);
        assert!(r["extra"]["latency_us"]["get"]["p50"].as_f64().unwrap() > 0.0);
        assert!(r["round_trips"].is_object());
    }
    assert_eq!(runs[1]["round_trips"]["2"].as_f64(), Some(1.0), "DM-ABD takes two round trips");
}

#[test]
fn bench_swarm_refuses_bad_flags_with_a_reason() {
    for (args, needle) in [
        (vec!["bench", "swarm", "--protocols", "farm"], "unknown protocol"),
        (vec!["bench", "swarm", "--replicas", "2"], "--replicas"),
        (vec!["bench", "swarm", "--value-size", "4"], "--value-size"),
        (vec!["bench", "swarm", "--clients", "0"], "--clients"),
    ] {
        let o = kairos(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(needle), "{args:?}: {}", text(&o));
    }
}
