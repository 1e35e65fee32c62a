//! SWARM memory nodes as real processes (`kairos serve swarm-memory`): a killed node does not
//! stop SWARM-KV clients and their history stays linearizable; a malformed frame closes only
//! its connection; `kairos bench swarm --backend shm|tcp` runs and writes the result contract.
//! Loopback only; every process is killed when its test ends.

// A test of real processes: it bounds their start-up with the real clock.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kairos_harness::swarm::backend::tcp::{
    read_frame_blocking, ChainReply, ChainRequest, TcpBackend, MEM_FRAME_BYTES_MAX,
};
use kairos_harness::swarm::real::RealRun;
use kairos_harness::swarm::sim::SwarmRun;
use kairos_net::frame::{encode, FrameKind};
use kairos_swarm::engine::Protocol;
use kairos_swarm::verbs::{Verb, VerbOutcome};
use kairos_workload::ycsb::Workload;

/// Memory-node processes, killed on drop.
struct Nodes(Vec<Child>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `n` memory nodes on free loopback ports and returns them with their addresses.
fn start_nodes(n: usize, bytes: u64) -> (Nodes, Vec<SocketAddr>) {
    let mut nodes = Nodes(Vec::new());
    let mut addrs = Vec::new();
    for _ in 0..n {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kairos"))
            .args(["serve", "swarm-memory", "--listen", "127.0.0.1:0", "--bytes", &bytes.to_string()])
            .args(["--duration-s", "60"]) // never outlives a stuck test by long
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kairos runs");
        let stdout = child.stdout.take().unwrap();
        nodes.0.push(child);
        let started = Instant::now();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        assert!(started.elapsed() < Duration::from_secs(10), "memory node took too long to start");
        let addr = line
            .strip_prefix("swarm-memory listening on ")
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        addrs.push(addr.parse().unwrap());
    }
    (nodes, addrs)
}

#[test]
fn killing_one_of_three_memory_node_processes_does_not_stop_swarm_kv() {
    let run = RealRun::new(SwarmRun {
        protocol: Protocol::SwarmKv,
        workload: Workload::YcsbA,
        clients: 3,
        ops: 1500,
        inflight: 2,
        keys: 32,
        warmup: 500,
        clock_offset_max: Duration::from_micros(200),
        seed: 7,
        ..SwarmRun::default()
    });
    let layout = run.layout().unwrap();
    let (nodes, addrs) = start_nodes(3, layout.node_bytes());
    let nodes = Mutex::new(nodes);
    let kill = || {
        let mut n = nodes.lock().unwrap();
        n.0[1].kill().unwrap();
        n.0[1].wait().unwrap();
    };
    let o = run.run_on(&TcpBackend::new(addrs), Some((Duration::from_millis(30), Box::new(kill)))).unwrap();
    assert!(nodes.lock().unwrap().0[1].try_wait().unwrap().is_some(), "node 1 was killed during the run");
    assert_eq!(o.linearizable, Some(true), "{}", o.check_report);
    let ok: u64 = o.latency_us.values().map(|l| l.count).sum();
    assert!(ok >= 4000, "clients kept going: {ok} of 4500 ok; errors {:?}", o.errors);
}

#[test]
fn a_malformed_frame_closes_only_its_connection_on_a_memory_node_process() {
    let (_nodes, addrs) = start_nodes(1, 4096);
    let mut good = TcpStream::connect(addrs[0]).unwrap();
    let ask = |s: &mut TcpStream, tag: u64, verbs: Vec<Verb>| -> ChainReply {
        s.write_all(&encode(FrameKind::Msg, &ChainRequest { tag, verbs }, MEM_FRAME_BYTES_MAX).unwrap()).unwrap();
        let (_, f) = read_frame_blocking(s, MEM_FRAME_BYTES_MAX).unwrap().unwrap();
        kairos_net::frame::decode_payload(&f[16..]).unwrap()
    };
    assert_eq!(
        ask(&mut good, 1, vec![Verb::Write { addr: 8, data: vec![5; 8] }]).result,
        Ok(vec![VerbOutcome::Written])
    );
    let mut bad = TcpStream::connect(addrs[0]).unwrap();
    bad.write_all(b"KR\x01\x02\xff\xff\xff\xffthis is not a frame").unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 16];
    assert!(matches!(bad.read(&mut buf), Ok(0) | Err(_)), "the server closes the malformed connection");
    let r = ask(&mut good, 2, vec![Verb::Read { addr: 8, len: 8 }]);
    assert_eq!(r.result, Ok(vec![VerbOutcome::Read(vec![5; 8])]), "the other connection and the memory are unharmed");
}

fn kairos(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kairos")).args(args).output().expect("kairos runs")
}

#[test]
fn bench_swarm_on_shm_and_tcp_writes_checked_results() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, host) in [("shm", "shm"), ("tcp", "net")] {
        let json = dir.path().join(format!("{backend}.json"));
        let o = kairos(&[
            "bench",
            "swarm",
            "--backend",
            backend,
            "--clients",
            "2",
            "--ops",
            "300",
            "--inflight",
            "2",
            "--keys",
            "200",
            "--warmup",
            "1000",
            "--json",
            json.to_str().unwrap(),
        ]);
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.status.code(), Some(0), "{backend}: {text}");
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let runs = v.as_array().unwrap();
        assert_eq!(runs.len(), 4, "{backend}: swarm-kv, dm-abd, fusee, raw side by side");
        for r in runs {
            assert_eq!(r["host"], host);
            assert_eq!(r["check"]["valid"], true, "{backend} {}", r["protocol"]);
            let lat = if r["latency_us"].is_null() { &r["extra"]["latency_us"] } else { &r["latency_us"] };
            assert!(lat["get"]["p50"].as_f64().is_some_and(|us| us > 0.0), "{backend}: {r}");
            assert!(r.get("trace_hash").is_none_or(|h| h.is_null()), "no trace hash off the simulator");
        }
    }
}
