//! MongoDB drivers against a 3-member Kairos replica set of real `kairos serve` processes with
//! injected WAN delay (30 ms one way between members): unmodified pymongo and the Node driver
//! run causally consistent sessions; raw wire-protocol clients send forged cluster times and
//! bad frames.
//!
//! The drivers come from `.ci/run`: pymongo in the venv `target/pyvenv`, npm `mongodb` under
//! `target/node-mongodb` (both relative to the workspace root). Without them a driver test
//! prints why and passes, unless `CI` is set: then it fails.

// A test of real processes: it bounds their run with the real clock.
#![allow(clippy::disallowed_methods)]

#[allow(dead_code)] // merge_histories is for the history tests
mod common;
use common::{free_ports, Children};

use bson::{doc, Bson, Document};
use kairos_causal::mongo::wire;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SET_NAME: &str = "kairos-test";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A replica set of three `causal-member` processes, each with a MongoDB listener.
struct Set {
    dir: tempfile::TempDir,
    children: Children,
    mongo: Vec<String>,
}

impl Set {
    fn start(name: &str) -> Set {
        Set::start_with(name, &[])
    }

    /// Three members started with `extra` flags.
    fn start_with(name: &str, extra: &[&str]) -> Set {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rtt.csv"), "region,a,b,c\na,0.2,60,60\nb,60,0.2,60\nc,60,60,0.2\n").unwrap();
        let ports = free_ports(6);
        let mut config = format!("[cluster]\nname = \"{name}\"\nlatency = \"rtt.csv\"\ninject_delay = true\n");
        for i in 0..3 {
            config.push_str(&format!(
                "[[node]]\nid = {i}\naddr = \"127.0.0.1:{}\"\nregion = \"{}\"\nrole = \"causal-member\"\nmongo_addr = \"127.0.0.1:{}\"\n",
                ports[i],
                ["a", "b", "c"][i],
                ports[3 + i]
            ));
        }
        let cfg = dir.path().join("cluster.toml");
        std::fs::write(&cfg, config).unwrap();
        let mut children = Children(Vec::new());
        for i in 0..3 {
            let log = std::fs::File::create(dir.path().join(format!("node{i}.log"))).unwrap();
            let mut c = Command::new(env!("CARGO_BIN_EXE_kairos"));
            c.args(["serve", "--config", cfg.to_str().unwrap(), "--node", &i.to_string(), "--duration-s", "120"]);
            c.args(["--seed", &(i + 3).to_string(), "--mongo-set-name", SET_NAME]).args(extra);
            children.0.push(c.stdout(Stdio::null()).stderr(log).spawn().unwrap());
        }
        let mongo = (3..6).map(|i| format!("127.0.0.1:{}", ports[i])).collect();
        let set = Set { dir, children, mongo };
        set.wait_ready();
        set
    }

    /// Stops every member with SIGINT (a clean shutdown that prints its counters) and sums
    /// the counters `names` over the members' logs.
    fn stop_and_sum(mut self, names: &[&str]) -> Vec<u64> {
        for c in &mut self.children.0 {
            // SAFETY: kill(2) on the id of a child process we own; no memory is touched.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGINT) };
        }
        for c in &mut self.children.0 {
            let _ = c.wait();
        }
        let mut sums = vec![0u64; names.len()];
        for i in 0..3 {
            let log = std::fs::read_to_string(self.dir.path().join(format!("node{i}.log"))).unwrap();
            let line = log.lines().find(|l| l.contains("stopped;")).unwrap_or_else(|| panic!("node {i}: {log}"));
            for (sum, name) in sums.iter_mut().zip(names) {
                let field = line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{name}=")));
                *sum += field.map_or(0, |v| v.parse::<u64>().unwrap());
            }
        }
        sums
    }

    fn uri(&self) -> String {
        format!("mongodb://{}/?replicaSet={SET_NAME}", self.mongo.join(","))
    }

    /// Waits until one member is primary and every member signs its replies (keys committed).
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut primaries = 0;
            let mut signing = 0;
            for a in &self.mongo {
                if let Ok(mut c) = Raw::connect(a) {
                    if let Ok(r) = c.command(doc! { "hello": 1, "$db": "admin" }) {
                        primaries += r.get_bool("isWritablePrimary").unwrap_or(false) as usize;
                        signing += r.contains_key("$clusterTime") as usize;
                    }
                }
            }
            if primaries == 1 && signing == 3 {
                return;
            }
            assert!(Instant::now() < deadline, "the set did not elect a primary and sign replies within 30 s");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn primary(&self) -> String {
        for a in &self.mongo {
            let r = Raw::connect(a).unwrap().command(doc! { "hello": 1, "$db": "admin" }).unwrap();
            if r.get_bool("isWritablePrimary").unwrap_or(false) {
                return a.clone();
            }
        }
        panic!("no primary");
    }
}

/// A raw wire-protocol client.
struct Raw {
    s: TcpStream,
    next_id: i32,
}

impl Raw {
    fn connect(addr: &str) -> std::io::Result<Raw> {
        let s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok(Raw { s, next_id: 0 })
    }

    fn send_bytes(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.s.write_all(b)
    }

    /// Reads one reply (None: the server closed the connection).
    fn read_reply(&mut self) -> Option<Document> {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h).ok()?;
        let header = wire::parse_header(&h).ok()?;
        let mut body = vec![0u8; header.length - 16];
        self.s.read_exact(&mut body).ok()?;
        Some(wire::parse_message(&header, &body).expect("a reply parses").command)
    }

    fn command(&mut self, cmd: Document) -> std::io::Result<Document> {
        self.next_id += 1;
        let b = wire::encode_op_msg_request(self.next_id, 0, &cmd, &[]);
        self.send_bytes(&b)?;
        self.read_reply().ok_or_else(|| std::io::Error::other("connection closed"))
    }

    /// Whether the server closed the connection (EOF or reset) within the read timeout.
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

fn cluster_time(r: &Document) -> (bson::Timestamp, Document) {
    let ct = r.get_document("$clusterTime").expect("$clusterTime in the reply");
    (ct.get_timestamp("clusterTime").unwrap(), ct.get_document("signature").unwrap().clone())
}

fn with_cluster_time(ts: bson::Timestamp, signature: Document) -> Document {
    doc! { "ping": 1, "$db": "admin", "$clusterTime": { "clusterTime": ts, "signature": signature } }
}

#[test]
fn forged_cluster_times_are_rejected_and_the_clock_does_not_move() {
    let set = Set::start("mongo-forged");
    let mut c = Raw::connect(&set.mongo[1]).unwrap();
    let r = c.command(doc! { "ping": 1, "$db": "admin" }).unwrap();
    let (ts, sig) = cluster_time(&r);
    let key_id = sig.get_i64("keyId").unwrap();
    assert!(key_id > 0);
    let ahead = bson::Timestamp { time: ts.time + 10_000, increment: 1 };
    let hash = |n: usize| Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![7; n] });
    let cases: Vec<(&str, Document, i32, &str)> = vec![
        ("a genuine signature on a later time", sig.clone(), 204, "TimeProofMismatch"),
        ("a key this set never made", doc! { "hash": hash(20), "keyId": key_id + 1_000_003 }, 211, "KeyNotFound"),
        ("a negative key id", doc! { "hash": hash(20), "keyId": -5i64 }, 211, "KeyNotFound"),
        ("a 19-byte hash", doc! { "hash": hash(19), "keyId": key_id }, 12, "UnsupportedFormat"),
    ];
    for (what, signature, code, name) in cases {
        let r = c.command(with_cluster_time(ahead, signature)).unwrap();
        assert_eq!(r.get_f64("ok").unwrap(), 0.0, "{what}: {r}");
        assert_eq!((r.get_i32("code").unwrap(), r.get_str("codeName").unwrap()), (code, name), "{what}: {r}");
        // Errors carry the signed cluster time too, and it did not move to the forged time.
        let (now, _) = cluster_time(&r);
        assert!(now.time < ahead.time, "{what}: the clock moved to {now:?}");
        assert!(r.contains_key("operationTime"), "{what}: {r}");
    }
    // No member's clock moved: ask every member.
    for a in &set.mongo {
        let r = Raw::connect(a).unwrap().command(doc! { "ping": 1, "$db": "admin" }).unwrap();
        assert!(cluster_time(&r).0.time < ahead.time, "member {a}: {r}");
    }
    // The genuine time is accepted by every member (the key is majority-committed everywhere).
    for a in &set.mongo {
        let r = Raw::connect(a).unwrap().command(with_cluster_time(ts, sig.clone())).unwrap();
        assert_eq!(r.get_f64("ok").unwrap(), 1.0, "member {a}: {r}");
    }
    drop(set.children);
}

#[test]
fn bad_frames_close_only_their_connection_and_other_clients_keep_working() {
    let set = Set::start("mongo-bad-input");
    let addr = set.primary();
    let mut good = Raw::connect(&addr).unwrap();
    let ping = doc! { "ping": 1, "$db": "admin" };
    assert_eq!(good.command(ping.clone()).unwrap().get_f64("ok").unwrap(), 1.0);
    let msg = wire::encode_op_msg_request(1, 0, &ping, &[]);

    // A truncated OP_MSG: the header promises more than is sent, then the client stops.
    let mut c = Raw::connect(&addr).unwrap();
    c.send_bytes(&msg[..msg.len() - 3]).unwrap();
    c.s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(c.closed(), "a truncated message closes its connection");

    // A message length of 2^31 (negative as i32) and one above maxMessageSizeBytes.
    for len in [0x8000_0000u32, 48_000_001, 3] {
        let mut c = Raw::connect(&addr).unwrap();
        let mut b = msg.clone();
        b[..4].copy_from_slice(&len.to_le_bytes());
        c.send_bytes(&b).unwrap();
        assert!(c.closed(), "length {len} closes its connection");
    }

    // An unknown opcode.
    let mut c = Raw::connect(&addr).unwrap();
    let mut b = msg.clone();
    b[12..16].copy_from_slice(&9_999i32.to_le_bytes());
    c.send_bytes(&b).unwrap();
    assert!(c.closed(), "an unknown opcode closes its connection");

    // Invalid BSON: an error reply, and the connection still serves the next command.
    let mut c = Raw::connect(&addr).unwrap();
    let mut b = msg.clone();
    b[16 + 4 + 1 + 4] = 0x7f; // type byte of the body's first element
    c.send_bytes(&b).unwrap();
    let r = c.read_reply().expect("invalid BSON gets an error reply");
    assert_eq!((r.get_f64("ok").unwrap(), r.get_i32("code").unwrap()), (0.0, 22), "{r}");
    assert_eq!(c.command(ping.clone()).unwrap().get_f64("ok").unwrap(), 1.0);

    // A bad checksum and an unknown command: error replies.
    let mut b = wire::encode_op_msg_request(2, 1, &ping, &[]);
    let n = b.len();
    b[n - 1] ^= 0xff;
    c.send_bytes(&b).unwrap();
    assert_eq!(c.read_reply().unwrap().get_f64("ok").unwrap(), 0.0);
    let r = c.command(doc! { "frobnicate": 1, "$db": "admin" }).unwrap();
    assert_eq!((r.get_i32("code").unwrap(), r.get_str("codeName").unwrap()), (59, "CommandNotFound"), "{r}");
    assert!(r.contains_key("$clusterTime") && r.contains_key("operationTime"), "{r}");

    // moreToCome: no reply; the next command's reply is the next thing on the wire.
    let b = wire::encode_op_msg_request(
        3,
        2,
        &doc! { "insert": "c", "$db": "t", "writeConcern": { "w": 0 } },
        &[("documents", vec![doc! { "_id": 1 }])],
    );
    c.send_bytes(&b).unwrap();
    let r = c.command(doc! { "find": "c", "filter": { "_id": 1 }, "$db": "t" }).unwrap();
    assert_eq!(r.get_document("cursor").unwrap().get_array("firstBatch").unwrap().len(), 1, "{r}");

    // Through all of it the first client was never disturbed.
    assert_eq!(good.command(ping).unwrap().get_f64("ok").unwrap(), 1.0);
    drop(set.children);
}

/// The driver's path if installed, else `None` after printing why (a failure under CI).
fn driver(path: PathBuf, what: &str) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    let why = format!("{what} is not installed at {} (.ci/run installs it)", path.display());
    assert!(std::env::var_os("CI").is_none(), "CI is set and {why}");
    eprintln!("SKIPPED: {why}");
    None
}

fn run_json(mut c: Command) -> serde_json::Value {
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "driver script failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

const TRIALS: u64 = 200;

#[test]
fn pymongo_causal_session_reads_its_writes_from_secondaries() {
    let Some(python) = driver(workspace_root().join("target/pyvenv/bin/python"), "pymongo's venv") else { return };
    let set = Set::start("mongo-pymongo");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mongo_drivers/causal.py");
    let mut c = Command::new(python);
    c.arg(script).arg(set.uri()).arg(TRIALS.to_string());
    let out = run_json(c);
    eprintln!("pymongo: {out}");
    assert_eq!(out["set_name"], SET_NAME, "{out}");
    assert_eq!(out["secondaries"], 2, "pymongo discovered both secondaries: {out}");
    assert_eq!(out["causal_found"], TRIALS, "every causal read from a secondary finds the insert: {out}");
    let stale = TRIALS - out["non_causal_found"].as_u64().unwrap();
    assert!(stale >= 1, "with causal consistency off, some secondary read is stale: {out}");
    assert_eq!(out["big_found"], 6, "a 6 MiB insert_many (several oplog entries) reaches a secondary: {out}");
    let fam = serde_json::json!([{ "_id": "fam", "n": 1 }, { "_id": "fam", "n": 1 }, null]);
    assert_eq!(out["find_and_modify"], fam, "find_one_and_update, then find_one_and_delete: {out}");
    drop(set.children);
}

#[test]
fn node_driver_causal_session_reads_its_writes_from_secondaries() {
    let Some(modules) = driver(workspace_root().join("target/node-mongodb/node_modules/mongodb"), "npm `mongodb`")
    else {
        return;
    };
    let set = Set::start("mongo-node");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mongo_drivers/causal.js");
    let mut c = Command::new("node");
    c.env("NODE_PATH", modules.parent().unwrap()).arg(script).arg(set.uri()).arg(TRIALS.to_string());
    let out = run_json(c);
    eprintln!("node mongodb: {out}");
    assert_eq!(out["causal_found"], TRIALS, "every causal read from a secondary finds the insert: {out}");
    let stale = TRIALS - out["non_causal_found"].as_u64().unwrap();
    assert!(stale >= 1, "with causal consistency off, some secondary read is stale: {out}");
    drop(set.children);
}

#[test]
fn pymongo_session_continues_after_the_primary_is_killed_and_keeps_every_majority_write() {
    let Some(python) = driver(workspace_root().join("target/pyvenv/bin/python"), "pymongo's venv") else { return };
    let mut set = Set::start("mongo-failover");
    let dir = tempfile::tempdir().unwrap();
    let (marker, history) = (dir.path().join("kill-now"), dir.path().join("history.jsonl"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mongo_drivers/failover.py");
    let mut c = Command::new(python);
    c.arg(script).arg(set.uri()).arg("150").arg(&marker).arg(&history);
    let run = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the driver did not get a third of the way in 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let old = set.primary();
    let i = set.mongo.iter().position(|a| *a == old).unwrap();
    set.children.0[i].kill().unwrap(); // SIGKILL
    let out = run.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "driver failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let out: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    eprintln!("pymongo across a failover (killed {old}): {out}");
    assert_eq!(out["missing"], serde_json::json!([]), "every majority-acknowledged append survives: {out}");
    assert!(out["acked_appends"].as_u64().unwrap() > 20, "{out}");
    let new = format!("{}:{}", out["primary"][0].as_str().unwrap(), out["primary"][1]);
    assert_ne!(new, old, "the session ended on a new primary: {out}");
    // The session's history (appends and majority reads) passes the causal session checker.
    let check = Command::new(env!("CARGO_BIN_EXE_kairos"))
        .args(["check", history.to_str().unwrap(), "--model", "causal"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stdout);
    eprintln!("{report}");
    assert!(check.status.success(), "the causal checker rejects the history:\n{report}");
    drop(set.children);
}

/// HMAC computations (signing and validating) per 10^6 replies with pymongo driving the set:
/// range signing (one HMAC per 65,536 cluster times per key, cached) against one per reply.
#[test]
fn range_signing_computes_far_fewer_hmacs_per_reply_than_per_reply_signing_under_pymongo() {
    let Some(python) = driver(workspace_root().join("target/pyvenv/bin/python"), "pymongo's venv") else { return };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mongo_drivers/hmac_load.py");
    let mut per_million = Vec::new();
    for (name, extra) in [("mongo-hmac-range", &[][..]), ("mongo-hmac-per-reply", &["--per-reply-signing"][..])] {
        let set = Set::start_with(name, extra);
        let mut c = Command::new(&python);
        c.arg(&script).arg(set.uri()).arg("3000");
        run_json(c);
        let sums = set.stop_and_sum(&["causal.hmac_computations", "causal.replies"]);
        let (hmacs, replies) = (sums[0], sums[1]);
        assert!(replies >= 3_000, "{name}: {replies} replies");
        let rate = hmacs as f64 * 1e6 / replies as f64;
        eprintln!("{name}: {hmacs} HMAC computations for {replies} replies = {rate:.0} per 10^6 replies");
        per_million.push(rate);
    }
    let (range, per_reply) = (per_million[0], per_million[1]);
    // About one per reply (the `hello`s with which the test waits for the set go out before
    // the members can sign, and carry no `$clusterTime`).
    assert!(per_reply >= 0.9e6, "per-reply signing computes about one HMAC per reply: {per_reply:.0}");
    eprintln!("range signing: {:.0}x fewer HMAC computations per reply", per_reply / range.max(1.0));
    assert!(range * 20.0 < per_reply, "range signing: {range:.0} per 10^6 replies, per-reply: {per_reply:.0}");
}
