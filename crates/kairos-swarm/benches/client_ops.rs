//! CPU per operation of each protocol's client, every chain included (background ones too), on
//! the synchronous in-process backend: what the client itself costs, without threads, clocks or
//! a network. `cargo bench -p kairos-swarm --bench client_ops`. The shm backend's latency ratios
//! (`kairos bench swarm --backend shm`) are this plus the memory accesses.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kairos_core::LocalTime;
use kairos_swarm::client::KvOp;
use kairos_swarm::direct::DirectMemory;
use kairos_swarm::engine::{Client, ClientConfig, Protocol};
use kairos_swarm::index::bulk_load;
use kairos_swarm::layout::{Layout, LayoutConfig};
use kairos_swarm::verbs::MemoryImage;

const KEYS: u64 = 10_000;

fn key(k: u64) -> Vec<u8> {
    format!("user{k:020}").into_bytes()
}

fn setup(protocol: Protocol) -> (DirectMemory, Client) {
    let replicas = if protocol == Protocol::Raw { 1 } else { 3 };
    let config = LayoutConfig {
        keys: KEYS,
        key_size: 24,
        value_size: 64,
        replicas,
        memory_nodes: replicas,
        writers: 4,
        buffers_per_writer: 0,
    };
    let layout = Layout::new(config.with_default_buffers()).expect("layout");
    let mut images: Vec<MemoryImage> =
        (0..layout.config.memory_nodes).map(|_| MemoryImage::new(layout.node_bytes())).collect();
    let load = bulk_load(&layout, protocol, &mut images, (0..KEYS).map(|k| (key(k), vec![1; 64])), 1).expect("load");
    let mut client = Client::new(ClientConfig::new(protocol, 0, layout, LocalTime::ZERO));
    client.absorb_load(&load);
    (DirectMemory::new(images), client)
}

fn client_ops(c: &mut Criterion) {
    let mut group = c.benchmark_group("swarm_client_op");
    for protocol in Protocol::ALL {
        for kind in ["get", "update"] {
            // Set up only when the filter selects this benchmark.
            let mut state: Option<(DirectMemory, Client)> = None;
            let mut now = LocalTime::from_secs(1);
            let mut i = 0u64;
            group.bench_function(BenchmarkId::new(kind, protocol.name()), |b| {
                let (memory, client) = state.get_or_insert_with(|| setup(protocol));
                b.iter(|| {
                    i += 1;
                    // A stride coprime to KEYS: every key in turn, no two neighbours alike.
                    let k = key(i * 7_919 % KEYS);
                    let op = match kind {
                        "get" => KvOp::Get { key: k },
                        _ => KvOp::Update { key: k, value: i.to_le_bytes().repeat(8) },
                    };
                    let done = memory.run_op(client, i, op, &mut now);
                    assert!(done.result.is_ok(), "{} {kind}: {:?}", protocol.name(), done.result);
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, client_ops);
criterion_main!(benches);
