//! Bad input gets clear errors, never a panic: oversized keys and values, unknown keys, deleted
//! keys, garbage in memory.

use kairos_core::LocalTime;
use kairos_swarm::client::{KvClient, KvError, KvOp};
use kairos_swarm::direct::DirectMemory;
use kairos_swarm::engine::{Client, ClientConfig, Protocol};
use kairos_swarm::index::bulk_load;
use kairos_swarm::layout::{Layout, LayoutConfig};
use kairos_swarm::verbs::MemoryImage;

fn setup(protocol: Protocol) -> (DirectMemory, Client, Layout) {
    let layout = Layout::new(
        LayoutConfig {
            keys: 16,
            key_size: 8,
            value_size: 16,
            replicas: 3,
            memory_nodes: 3,
            writers: 2,
            buffers_per_writer: 0,
        }
        .with_default_buffers(),
    )
    .unwrap();
    let mut images: Vec<MemoryImage> = (0..3).map(|_| MemoryImage::new(layout.node_bytes())).collect();
    let load = bulk_load(&layout, protocol, &mut images, [(b"a".to_vec(), b"1".to_vec())], 1).unwrap();
    let mut c = Client::new(ClientConfig::new(protocol, 0, layout.clone(), LocalTime::ZERO));
    c.absorb_load(&load);
    (DirectMemory::new(images), c, layout)
}

#[test]
fn bad_operations_are_clear_errors() {
    for protocol in [Protocol::SwarmKv, Protocol::DmAbd, Protocol::Fusee] {
        let (mut mem, mut c, _) = setup(protocol);
        let mut now = LocalTime::from_secs(1);
        let mut run = |op: KvOp| mem.run_op(&mut c, 1, op, &mut now).result;
        assert_eq!(run(KvOp::Get { key: b"a".to_vec() }), Ok(Some(b"1".to_vec())));
        assert_eq!(run(KvOp::Get { key: vec![7; 9] }), Err(KvError::KeyTooLong { len: 9, max: 8 }));
        assert_eq!(run(KvOp::Get { key: vec![] }), Err(KvError::EmptyKey));
        assert_eq!(
            run(KvOp::Update { key: b"a".to_vec(), value: vec![0; 17] }),
            Err(KvError::ValueTooLong { len: 17, max: 16 })
        );
        assert_eq!(run(KvOp::Update { key: b"nope".to_vec(), value: vec![1] }), Err(KvError::UnknownKey));
        assert_eq!(run(KvOp::Get { key: b"nope".to_vec() }), Err(KvError::UnknownKey));
        assert_eq!(run(KvOp::Insert { key: b"b".to_vec(), value: b"2".to_vec() }), Ok(None));
        assert_eq!(run(KvOp::Get { key: b"b".to_vec() }), Ok(Some(b"2".to_vec())));
        assert_eq!(run(KvOp::Update { key: b"b".to_vec(), value: b"3".to_vec() }), Ok(None));
        assert_eq!(run(KvOp::Get { key: b"b".to_vec() }), Ok(Some(b"3".to_vec())));
        assert_eq!(run(KvOp::Delete { key: b"b".to_vec() }), Ok(None));
        assert_eq!(run(KvOp::Get { key: b"b".to_vec() }), Err(KvError::Deleted));
        assert_eq!(run(KvOp::Update { key: b"b".to_vec(), value: b"4".to_vec() }), Err(KvError::Deleted));
        assert!(KvError::Deleted.to_string().contains("deleted"));
    }
}

#[test]
fn a_second_client_finds_an_inserted_key_through_the_directory() {
    let (mut mem, mut c, layout) = setup(Protocol::SwarmKv);
    let mut other = Client::new(ClientConfig::new(Protocol::SwarmKv, 1, layout, LocalTime::ZERO));
    let mut now = LocalTime::from_secs(1);
    let ins = mem.run_op(&mut c, 1, KvOp::Insert { key: b"k".to_vec(), value: b"v".to_vec() }, &mut now);
    assert_eq!((ins.result, ins.round_trips), (Ok(None), 2), "a new key: index lookup, then entry and value");
    let got = mem.run_op(&mut other, 1, KvOp::Get { key: b"k".to_vec() }, &mut now);
    assert_eq!(got.result, Ok(Some(b"v".to_vec())));
    assert_eq!(got.round_trips, 2, "index lookup, then the get");
}

#[test]
fn garbage_in_memory_never_panics_a_client() {
    for protocol in [Protocol::SwarmKv, Protocol::DmAbd, Protocol::Raw, Protocol::Fusee] {
        let (mut mem, mut c, _) = setup(protocol);
        // Scribble over every node.
        for img in &mut mem.images {
            let len = img.len_bytes();
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            for a in (0..len).step_by(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                img.write(a, &x.to_le_bytes());
            }
        }
        let mut now = LocalTime::from_secs(1);
        for op in [
            KvOp::Get { key: b"a".to_vec() },
            KvOp::Update { key: b"a".to_vec(), value: b"x".to_vec() },
            KvOp::Get { key: b"zz".to_vec() },
            KvOp::Insert { key: b"q".to_vec(), value: b"y".to_vec() },
        ] {
            // Any result is fine; a panic is not.
            let _ = mem.run_op(&mut c, 1, op, &mut now);
        }
    }
}

#[test]
fn a_crashed_node_is_suspected_and_the_majority_serves() {
    let (mut mem, mut c, _) = setup(Protocol::SwarmKv);
    mem.crashed[1] = true;
    let mut now = LocalTime::from_secs(1);
    let r = mem.run_op(&mut c, 1, KvOp::Update { key: b"a".to_vec(), value: b"z".to_vec() }, &mut now);
    assert_eq!(r.result, Ok(None));
    assert_eq!(mem.run_op(&mut c, 2, KvOp::Get { key: b"a".to_vec() }, &mut now).result, Ok(Some(b"z".to_vec())));
    mem.crashed[2] = true;
    let r = mem.run_op(&mut c, 3, KvOp::Get { key: b"a".to_vec() }, &mut now).result;
    assert!(matches!(r, Err(KvError::Unavailable { .. }) | Err(KvError::Timeout)), "{r:?}");
}

#[test]
fn a_slow_node_that_was_suspected_is_tried_again_later() {
    let (mut mem, mut c, _) = setup(Protocol::SwarmKv);
    let mut now = LocalTime::from_secs(1);
    // "a" is slot 0: its rounds go to the primary (node 0) and node 1 first (see `hedge`).
    mem.crashed[1] = true;
    let update = |id: u64| KvOp::Update { key: b"a".to_vec(), value: id.to_le_bytes().to_vec() };
    assert_eq!(mem.run_op(&mut c, 1, update(1), &mut now).result, Ok(None));
    // Let the chain to node 1 time out (the round widened to node 2 meanwhile).
    now = now + std::time::Duration::from_millis(3);
    c.on_tick(now, &mut kairos_swarm::client::Outbox::new());
    assert!(!c.membership().is_alive(1), "node 1 is suspected");
    mem.crashed[1] = false;
    now = now + std::time::Duration::from_millis(200);
    c.on_tick(now, &mut kairos_swarm::client::Outbox::new());
    for id in 3..6 {
        assert_eq!(mem.run_op(&mut c, id, update(id), &mut now).result, Ok(None));
    }
    assert!(c.membership().is_alive(1), "node 1 answers again and is back in the view");
    // Node 1 is in the majority again and holds the latest words, like node 0.
    let l = &c.config().layout;
    let words =
        |node: usize| (0..l.config.keys).map(|s| mem.images[node].read(l.meta_words(s), 16)).collect::<Vec<_>>();
    assert_eq!(words(1), words(0));
}

#[test]
fn inserting_a_key_another_client_created_updates_it_in_place() {
    // Writer 1 creates "k" in its slot 1; writer 0, whose next slot (0) is lower, inserts "k"
    // again: it must find and update slot 1, not create a second copy.
    let (mut mem, mut w0, layout) = setup(Protocol::SwarmKv);
    let mut w1 = Client::new(ClientConfig::new(Protocol::SwarmKv, 1, layout, LocalTime::ZERO));
    let mut now = LocalTime::from_secs(1);
    let key = b"k".to_vec();
    assert_eq!(
        mem.run_op(&mut w1, 1, KvOp::Insert { key: key.clone(), value: b"one".to_vec() }, &mut now).result,
        Ok(None)
    );
    assert_eq!(
        mem.run_op(&mut w0, 1, KvOp::Insert { key: key.clone(), value: b"two".to_vec() }, &mut now).result,
        Ok(None)
    );
    assert_eq!(mem.run_op(&mut w1, 2, KvOp::Get { key: key.clone() }, &mut now).result, Ok(Some(b"two".to_vec())));
    let cached = mem.run_op(&mut w0, 2, KvOp::Insert { key: key.clone(), value: b"three".to_vec() }, &mut now);
    assert_eq!((cached.result, cached.round_trips), (Ok(None), 1), "a known key's insert is a 1-RTT write");
    assert_eq!(mem.run_op(&mut w1, 3, KvOp::Get { key }, &mut now).result, Ok(Some(b"three".to_vec())));
}

/// The directory must hold every key of a full load whatever the number of writers (with one
/// bucket per key, one or two writers overflowed some windows: "the index is full").
#[test]
fn a_full_load_fits_the_directory_with_any_number_of_writers() {
    for writers in [1, 2, 3, 4, 8] {
        let keys = 100_000u64;
        let config = LayoutConfig {
            keys,
            key_size: 24,
            value_size: 8,
            replicas: 3,
            memory_nodes: 3,
            writers,
            buffers_per_writer: 0,
        };
        let layout = kairos_swarm::layout::Layout::new(config.with_default_buffers()).unwrap();
        let mut images: Vec<_> = (0..3).map(|_| kairos_swarm::verbs::MemoryImage::new(layout.node_bytes())).collect();
        let load = (0..keys).map(|k| (kairos_workload::ycsb::key_bytes(k, 24), vec![1u8; 8]));
        let loaded = kairos_swarm::index::bulk_load(&layout, Protocol::SwarmKv, &mut images, load, 1);
        assert!(loaded.is_ok(), "{writers} writers: {:?}", loaded.err());
    }
}
