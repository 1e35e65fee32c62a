//! Encoding and decoding one frame (postcard + header + xxh3 checksum) by payload size: the
//! part of `kairos bench net`'s per-message cost that is not system calls or wake-ups.
//! `cargo bench -p kairos-net --bench frame`.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kairos_net::frame::{self, FrameKind};
use serde::{Deserialize, Serialize};

/// A message shaped like the protocols' (ids, a key list, values), `n` entries long.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Shaped {
    txn: (u32, u64),
    timestamp_ns: u64,
    writes: Vec<(u64, u64)>,
}

fn shaped(n: usize) -> Shaped {
    Shaped {
        txn: (7, 1 << 40),
        timestamp_ns: 1_700_000_000_000_000_000,
        writes: (0..n as u64).map(|k| (k * 7919, k)).collect(),
    }
}

fn frames(c: &mut Criterion) {
    const MAX: u32 = 64 << 20;
    let mut group = c.benchmark_group("frame");
    for n in [1usize, 16, 256, 4096] {
        let msg = shaped(n);
        let bytes = frame::encode(FrameKind::Msg, &msg, MAX).expect("fits");
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_with_input(BenchmarkId::new("encode", bytes.len()), &msg, |b, m| {
            b.iter(|| frame::encode(FrameKind::Msg, m, MAX).expect("fits"))
        });
        group.bench_with_input(BenchmarkId::new("decode", bytes.len()), &bytes, |b, f| {
            b.iter(|| {
                let (_, payload, _) = frame::decode_frame(f, MAX).expect("valid");
                frame::decode_payload::<Shaped>(payload).expect("decodes")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, frames);
criterion_main!(benches);
