//! Events per second of the bare simulator, for 10^3 .. 10^6 pending events.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kairos_sim::pingpong;

fn des(c: &mut Criterion) {
    let mut group = c.benchmark_group("des_pingpong");
    group.sample_size(10);
    const STEPS: u64 = 200_000;
    group.throughput(Throughput::Elements(STEPS));
    for pending in [1_000u32, 10_000, 100_000, 1_000_000] {
        let mut sim = pingpong::world(1, pending);
        group.bench_with_input(BenchmarkId::from_parameter(pending), &pending, |b, _| {
            b.iter(|| {
                for _ in 0..STEPS {
                    sim.step();
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, des);
criterion_main!(benches);
