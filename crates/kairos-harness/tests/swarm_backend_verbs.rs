//! The real memory backends (shared memory, TCP) against the verb contract: same outcomes as
//! `MemoryImage`, atomic CAS under contention, honest tearing of large reads, crashes that
//! never complete, and a TCP server that survives malformed frames.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kairos_harness::swarm::backend::shm::ShmCluster;
use kairos_harness::swarm::backend::tcp::{
    read_frame_blocking, ChainReply, ChainRequest, TcpCluster, MEM_FRAME_BYTES_MAX,
};
use kairos_harness::swarm::backend::{Completion, MemoryBackend, MemoryPort};
use kairos_net::frame::{encode, encode_raw, FrameKind, Hello};
use kairos_swarm::verbs::{Chain, MemoryImage, Verb, VerbError, VerbOutcome, CHAIN_VERBS_MAX};
use proptest::prelude::*;
use xxhash_rust::xxh3::xxh3_64;

const NODE_BYTES: u64 = 96;
const WAIT: Duration = Duration::from_secs(5);

/// Submits one chain and waits for its completion.
fn run(port: &mut dyn MemoryPort, tag: u64, node: u32, verbs: Vec<Verb>) -> Option<Completion> {
    port.submit(tag, Chain { node, verbs }).expect("submit");
    let c = port.poll(WAIT)?;
    assert_eq!((c.tag, c.node), (tag, node), "completions arrive in order");
    Some(c)
}

/// What MemoryImage says a chain returns: outcomes until the first refused verb.
fn reference(m: &mut MemoryImage, verbs: &[Verb]) -> Result<Vec<VerbOutcome>, VerbError> {
    if verbs.len() > CHAIN_VERBS_MAX {
        return Err(VerbError::ChainTooLong(verbs.len()));
    }
    verbs.iter().map(|v| m.apply(v)).collect()
}

fn verb() -> impl Strategy<Value = Verb> {
    // Mostly in range, sometimes out of it or misaligned, to compare the refusals too.
    let addr = prop_oneof![4 => 0u64..NODE_BYTES, 1 => NODE_BYTES - 16..NODE_BYTES + 16, 1 => Just(u64::MAX - 3)];
    prop_oneof![
        (addr.clone(), 0u32..40).prop_map(|(addr, len)| Verb::Read { addr, len }),
        (addr.clone(), proptest::collection::vec(any::<u8>(), 0..40))
            .prop_map(|(addr, data)| Verb::Write { addr, data }),
        (addr.clone().prop_map(|a| a & !7), 0u64..4, 0u64..4).prop_map(|(addr, e, n)| Verb::Cas {
            addr,
            expected: e,
            new: n
        }),
        (addr, 0u64..4, 0u64..4).prop_map(|(addr, expected, new)| Verb::Cas { addr, expected, new }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn backends_match_memory_image(chains in proptest::collection::vec(proptest::collection::vec(verb(), 0..6), 1..12)) {
        let shm = ShmCluster::create(7, 1, NODE_BYTES).unwrap();
        let tcp = TcpCluster::start_loopback(1, NODE_BYTES).unwrap();
        let mut ports = [shm.connect(0).unwrap(), tcp.backend().connect(0).unwrap()];
        let mut image = MemoryImage::new(NODE_BYTES);
        for (i, verbs) in chains.iter().enumerate() {
            let want = reference(&mut image, verbs);
            for port in ports.iter_mut() {
                let got = run(port.as_mut(), i as u64, 0, verbs.clone()).expect("a live node completes every chain");
                prop_assert_eq!(&got.result, &want, "chain {} = {:?}", i, verbs);
            }
        }
        // And the final bytes agree.
        let all = vec![Verb::Read { addr: 0, len: NODE_BYTES as u32 }];
        let want = reference(&mut image, &all);
        for port in ports.iter_mut() {
            prop_assert_eq!(&run(port.as_mut(), 999, 0, all.clone()).unwrap().result, &want);
        }
    }
}

#[test]
fn too_long_chains_and_unknown_nodes_are_refused_alike() {
    let shm = ShmCluster::create(8, 2, 64).unwrap();
    let tcp = TcpCluster::start_loopback(2, 64).unwrap();
    for mut port in [shm.connect(0).unwrap(), tcp.backend().connect(0).unwrap()] {
        let long = vec![Verb::Read { addr: 0, len: 8 }; CHAIN_VERBS_MAX + 1];
        assert_eq!(run(port.as_mut(), 1, 1, long).unwrap().result, Err(VerbError::ChainTooLong(CHAIN_VERBS_MAX + 1)));
        assert!(port.submit(2, Chain { node: 2, verbs: vec![] }).is_err());
        assert_eq!(port.nodes(), 2);
    }
}

/// `threads` clients each add 1 to word 0 `per_thread` times with read-CAS loops.
fn cas_increments(backend: &dyn MemoryBackend, threads: u32, per_thread: u64) -> u64 {
    std::thread::scope(|s| {
        for t in 0..threads {
            let mut port = backend.connect(t).unwrap();
            s.spawn(move || {
                let mut tag = 0;
                let mut guess = 0u64;
                let mut done = 0;
                while done < per_thread {
                    tag += 1;
                    let c = run(port.as_mut(), tag, 0, vec![Verb::Cas { addr: 0, expected: guess, new: guess + 1 }])
                        .expect("live node");
                    match c.result {
                        Ok(ref o) if o == &[VerbOutcome::Cas { previous: guess }] => {
                            done += 1;
                            guess += 1;
                        }
                        Ok(ref o) => match o[..] {
                            [VerbOutcome::Cas { previous }] => guess = previous,
                            _ => panic!("unexpected outcome {o:?}"),
                        },
                        Err(e) => panic!("CAS refused: {e}"),
                    }
                }
            });
        }
    });
    let mut port = backend.connect(99).unwrap();
    match run(port.as_mut(), 0, 0, vec![Verb::Read { addr: 0, len: 8 }]).unwrap().result.unwrap()[..] {
        [VerbOutcome::Read(ref b)] => u64::from_le_bytes(b[..8].try_into().unwrap()),
        _ => unreachable!(),
    }
}

#[test]
fn shm_cas_is_atomic_under_contention() {
    let shm = ShmCluster::create(9, 1, 64).unwrap();
    assert_eq!(cas_increments(&shm, 4, 10_000), 40_000);
}

#[test]
fn tcp_cas_is_atomic_under_contention() {
    let tcp = TcpCluster::start_loopback(1, 64).unwrap();
    assert_eq!(cas_increments(tcp.backend(), 4, 1_000), 4_000);
}

/// A writer rewrites a 64 KiB value as `[xxh3(payload) | payload]`, each time filled with a
/// new byte; a reader reads it whole. A torn read mixes two versions, so its hash does not
/// match; every read whose hash matches is one whole version.
#[test]
#[allow(clippy::disallowed_methods)] // bounds the test's wall time
fn shm_large_reads_tear_and_the_hash_catches_them() {
    const LEN: usize = 64 * 1024;
    let shm = ShmCluster::create(10, 1, (LEN + 8) as u64).unwrap();
    let value = |fill: u8| {
        let payload = vec![fill; LEN];
        let mut v = xxh3_64(&payload).to_le_bytes().to_vec();
        v.extend_from_slice(&payload);
        v
    };
    let mut w = shm.connect(0).unwrap();
    run(w.as_mut(), 0, 0, vec![Verb::Write { addr: 0, data: value(0) }]).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (torn, whole) = std::thread::scope(|s| {
        let stop = &stop;
        s.spawn(move || {
            let mut fill = 1u8;
            while !stop.load(Ordering::Relaxed) {
                run(w.as_mut(), 1, 0, vec![Verb::Write { addr: 0, data: value(fill) }]).unwrap();
                fill = fill.wrapping_add(1);
            }
        });
        let mut r = shm.connect(1).unwrap();
        let (mut torn, mut whole) = (0u32, 0u32);
        let start = Instant::now();
        while torn < 3 && start.elapsed() < Duration::from_secs(8) {
            let c = run(r.as_mut(), 2, 0, vec![Verb::Read { addr: 0, len: (LEN + 8) as u32 }]).unwrap();
            let Ok(mut outcomes) = c.result else { panic!("read refused") };
            let Some(VerbOutcome::Read(bytes)) = outcomes.pop() else { panic!("no read outcome") };
            let (sum, payload) = bytes.split_at(8);
            if u64::from_le_bytes(sum.try_into().unwrap()) == xxh3_64(payload) {
                assert!(payload.iter().all(|&b| b == payload[0]), "a read whose hash matches is one version");
                whole += 1;
            } else {
                torn += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        (torn, whole)
    });
    eprintln!("64 KiB reads racing 64 KiB writes: {torn} torn (hash mismatch), {whole} whole");
    assert!(torn > 0, "no torn read in 8 s: the backend should let large reads tear ({whole} whole reads)");
}

#[test]
fn shm_crashed_node_never_completes_and_other_nodes_go_on() {
    let shm = ShmCluster::create(11, 3, 64).unwrap();
    let mut port = shm.connect(0).unwrap();
    shm.crash(1).unwrap();
    port.submit(1, Chain { node: 1, verbs: vec![Verb::Write { addr: 0, data: vec![1; 8] }] }).unwrap();
    assert_eq!(port.poll(Duration::from_millis(50)), None);
    let c = run(port.as_mut(), 2, 2, vec![Verb::Cas { addr: 0, expected: 0, new: 5 }]).unwrap();
    assert_eq!(c.result, Ok(vec![VerbOutcome::Cas { previous: 0 }]));
    assert!(shm.region(1).unwrap().is_crashed());
}

#[test]
fn shm_regions_are_removed_by_their_creator_only() {
    let shm = ShmCluster::create(12, 2, 64).unwrap();
    let paths = shm.paths();
    assert!(paths.iter().all(|p| p.exists()));
    assert!(paths[0].file_name().unwrap().to_string_lossy().contains(&format!("-{}-12-", std::process::id())));
    let other = ShmCluster::open(&paths).unwrap();
    let mut a = shm.connect(0).unwrap();
    let mut b = other.connect(1).unwrap();
    run(a.as_mut(), 1, 1, vec![Verb::Write { addr: 8, data: vec![7; 8] }]).unwrap();
    assert_eq!(
        run(b.as_mut(), 1, 1, vec![Verb::Read { addr: 8, len: 8 }]).unwrap().result,
        Ok(vec![VerbOutcome::Read(vec![7; 8])])
    );
    drop((a, b, other));
    assert!(paths.iter().all(|p| p.exists()), "an opener leaves the files alone");
    drop(shm);
    assert!(paths.iter().all(|p| !p.exists()), "the creator removes them");
    assert!(ShmCluster::open(&paths).is_err());
}

#[test]
fn shm_open_refuses_foreign_files() {
    let dir = std::env::temp_dir().join(format!("kairos-swarm-foreign-{}", std::process::id()));
    std::fs::write(&dir, vec![0u8; 128]).unwrap();
    let err = ShmCluster::open(std::slice::from_ref(&dir)).err().unwrap().to_string();
    std::fs::remove_file(&dir).unwrap();
    assert!(err.contains("not a Kairos memory region"), "{err}");
}

/// Separate processes share the nodes: this test re-runs itself as a child that opens the
/// parent's regions and does CAS increments alongside the parent.
#[test]
fn shm_is_shared_with_other_processes() {
    const CHILD_ENV: &str = "KAIROS_SWARM_SHM_CHILD_PATHS";
    if let Ok(paths) = std::env::var(CHILD_ENV) {
        let paths: Vec<_> = paths.split(',').map(std::path::PathBuf::from).collect();
        let cluster = ShmCluster::open(&paths).unwrap();
        cas_increments(&cluster, 2, 5_000);
        return;
    }
    let shm = ShmCluster::create(13, 1, 64).unwrap();
    let paths: Vec<String> = shm.paths().iter().map(|p| p.display().to_string()).collect();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "shm_is_shared_with_other_processes", "--quiet"])
        .env(CHILD_ENV, paths.join(","))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let parent_total = cas_increments(&shm, 2, 5_000);
    assert!(child.wait().unwrap().success(), "child process failed");
    let mut port = shm.connect(0).unwrap();
    let c = run(port.as_mut(), 0, 0, vec![Verb::Read { addr: 0, len: 8 }]).unwrap();
    assert_eq!(c.result, Ok(vec![VerbOutcome::Read(20_000u64.to_le_bytes().to_vec())]), "parent saw {parent_total}");
}

fn send_chain(s: &mut TcpStream, tag: u64, verbs: Vec<Verb>) -> ChainReply {
    s.write_all(&encode(FrameKind::Msg, &ChainRequest { tag, verbs }, MEM_FRAME_BYTES_MAX).unwrap()).unwrap();
    let (_, frame) = read_frame_blocking(s, MEM_FRAME_BYTES_MAX).unwrap().unwrap();
    kairos_net::frame::decode_payload(&frame[16..]).unwrap()
}

/// The connection is closed by the server: a read sees end of stream (or a reset).
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Ok(0) | Err(_))
}

#[test]
fn tcp_malformed_frames_close_only_their_connection() {
    let tcp = TcpCluster::start_loopback(1, 64).unwrap();
    let addr = tcp.backend().addrs()[0];
    let mut good = TcpStream::connect(addr).unwrap();
    assert_eq!(
        send_chain(&mut good, 1, vec![Verb::Write { addr: 0, data: vec![9; 8] }]).result,
        Ok(vec![VerbOutcome::Written])
    );

    let valid = encode(FrameKind::Msg, &ChainRequest { tag: 5, verbs: vec![] }, MEM_FRAME_BYTES_MAX).unwrap();
    let mut bad_sum = valid.clone();
    *bad_sum.last_mut().unwrap() ^= 0xff;
    let mut oversized = valid[..16].to_vec();
    oversized[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let hello = encode(FrameKind::Hello, &Hello { node: kairos_core::NodeId(0), cluster: "x".into() }, 1024).unwrap();
    let junk_payload = encode_raw(FrameKind::Msg, &[0xff; 7], MEM_FRAME_BYTES_MAX).unwrap();
    let huge_reply = encode(
        FrameKind::Msg,
        &ChainRequest { tag: 1, verbs: vec![Verb::Read { addr: 0, len: 1 << 20 }; 8] },
        MEM_FRAME_BYTES_MAX,
    )
    .unwrap();
    let too_long = encode(
        FrameKind::Msg,
        &ChainRequest { tag: 1, verbs: vec![Verb::Read { addr: 0, len: 1 }; CHAIN_VERBS_MAX + 1] },
        MEM_FRAME_BYTES_MAX,
    )
    .unwrap();
    let cases: [(&str, Vec<u8>); 7] = [
        ("more verbs than a chain may hold", too_long),
        ("garbage", b"GET / HTTP/1.1\r\n\r\n".to_vec()),
        ("bad checksum", bad_sum),
        ("oversized length", oversized),
        ("Hello kind", hello),
        ("payload not a chain", junk_payload),
        ("reply would not fit a frame", huge_reply),
    ];
    for (i, (what, bytes)) in cases.iter().enumerate() {
        let mut bad = TcpStream::connect(addr).unwrap();
        bad.write_all(bytes).unwrap();
        assert!(closed_by_server(&mut bad), "{what}: connection stays open");
        // The other connection is unharmed, its memory too.
        let r = send_chain(&mut good, 10 + i as u64, vec![Verb::Read { addr: 0, len: 8 }]);
        assert_eq!((r.tag, r.result), (10 + i as u64, Ok(vec![VerbOutcome::Read(vec![9; 8])])), "{what}");
    }
    let stats = tcp.server(0).unwrap().stats();
    assert_eq!(stats.connections_closed_malformed.load(Ordering::Relaxed), cases.len() as u64);
    // A refused verb is an answer, not a close.
    let r = send_chain(&mut good, 99, vec![Verb::Cas { addr: 3, expected: 0, new: 1 }]);
    assert_eq!(r.result, Err(VerbError::Misaligned(3)));
}

#[test]
fn tcp_killed_node_never_completes_and_other_nodes_go_on() {
    let mut tcp = TcpCluster::start_loopback(3, 64).unwrap();
    let mut port = tcp.backend().connect(0).unwrap();
    run(port.as_mut(), 1, 1, vec![Verb::Write { addr: 0, data: vec![1; 8] }]).unwrap();
    tcp.kill(1);
    port.submit(2, Chain { node: 1, verbs: vec![Verb::Read { addr: 0, len: 8 }] }).unwrap();
    assert_eq!(port.poll(Duration::from_millis(200)), None);
    let c = run(port.as_mut(), 3, 2, vec![Verb::Read { addr: 0, len: 8 }]).unwrap();
    assert_eq!(c.result, Ok(vec![VerbOutcome::Read(vec![0; 8])]));
    // Later chains to the dead node are accepted and dropped.
    port.submit(4, Chain { node: 1, verbs: vec![Verb::Read { addr: 0, len: 8 }] }).unwrap();
    assert_eq!(port.poll(Duration::from_millis(50)), None);
}

#[test]
fn tcp_connections_are_bounded() {
    use kairos_harness::swarm::backend::tcp::{MemoryServer, MemoryServerConfig};
    let mut cfg = MemoryServerConfig::new(64);
    cfg.connections_max = 2;
    let server = MemoryServer::start("127.0.0.1:0", cfg).unwrap();
    let mut a = TcpStream::connect(server.local_addr()).unwrap();
    let _b = TcpStream::connect(server.local_addr()).unwrap();
    send_chain(&mut a, 1, vec![]);
    let mut c = TcpStream::connect(server.local_addr()).unwrap();
    assert!(closed_by_server(&mut c), "a third connection is refused");
    assert_eq!(server.stats().connections_refused.load(Ordering::Relaxed), 1);
}

#[test]
fn regions_of_dead_processes_are_removed() {
    let dir = std::env::temp_dir().join(format!("kairos-swarm-stale-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // No process has pid 4_000_000_000 (Linux caps pids at 2^22).
    let stale = dir.join("kairos-swarm-4000000000-1-0-node0");
    std::fs::write(&stale, b"left behind").unwrap();
    let mine = ShmCluster::create_in(&dir, 14, 1, 64).unwrap();
    assert!(!stale.exists(), "a dead process's region is removed");
    assert!(mine.paths()[0].exists(), "a live process's region stays");
    drop(mine);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ports_bound_chains_in_flight_and_drop_cleanly_with_replies_unread() {
    use kairos_harness::swarm::backend::{BackendError, PORT_IN_FLIGHT_MAX};
    let shm = ShmCluster::create(15, 1, 64).unwrap();
    let tcp = TcpCluster::start_loopback(1, 64).unwrap();
    for mut port in [shm.connect(0).unwrap(), tcp.backend().connect(0).unwrap()] {
        let chain = || Chain { node: 0, verbs: vec![Verb::Read { addr: 0, len: 8 }] };
        let mut refused = None;
        for tag in 0..(2 * PORT_IN_FLIGHT_MAX as u64) {
            if let Err(e) = port.submit(tag, chain()) {
                refused = Some((tag, e));
                break;
            }
        }
        let (tag, e) = refused.expect("the port refuses chains past its limit");
        assert_eq!(tag, PORT_IN_FLIGHT_MAX as u64);
        assert!(matches!(e, BackendError::TooManyInFlight { .. }), "{e}");
        // One completion handed out makes room for one more chain.
        assert!(port.poll(WAIT).is_some());
        port.submit(9999, chain()).unwrap();
        drop(port); // with ~1000 replies unread: must not hang
    }
}
