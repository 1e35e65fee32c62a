//! The driver on both real backends with a minimal one-node register client (one word per key):
//! operations in flight, completions routed back, a history the linearizability checker accepts.

use std::time::Duration;

use kairos_check::{check, Model};
use kairos_core::LocalTime;
use kairos_harness::swarm::backend::shm::ShmCluster;
use kairos_harness::swarm::backend::tcp::TcpCluster;
use kairos_harness::swarm::backend::MemoryBackend;
use kairos_harness::swarm::driver::{run, DriverConfig, LeU64Codec, OpSource};
use kairos_swarm::client::{ChainTag, KvClient, KvOp, OpId, Outbox};
use kairos_swarm::verbs::{Chain, Verb, VerbError, VerbOutcome};
use rand::{Rng, SeedableRng};

/// Key k is the word at 8k of node 0; a get reads it, an update writes it (1 round trip).
struct WordRegister {
    waiting: std::collections::BTreeMap<ChainTag, OpId>,
    next_tag: ChainTag,
}

impl KvClient for WordRegister {
    fn invoke(&mut self, op_id: OpId, op: KvOp, _now: LocalTime, out: &mut Outbox) {
        let addr = 8 * u64::from(op.key()[0]);
        let verb = match op {
            KvOp::Get { .. } => Verb::Read { addr, len: 8 },
            KvOp::Update { value, .. } | KvOp::Insert { value, .. } => Verb::Write { addr, data: value },
            KvOp::Delete { .. } => Verb::Write { addr, data: u64::MAX.to_le_bytes().to_vec() },
        };
        self.next_tag += 1;
        self.waiting.insert(self.next_tag, op_id);
        out.issue(self.next_tag, Chain { node: 0, verbs: vec![verb] });
    }
    fn on_reply(&mut self, tag: ChainTag, reply: Result<Vec<VerbOutcome>, VerbError>, _: LocalTime, out: &mut Outbox) {
        let Some(op_id) = self.waiting.remove(&tag) else { return };
        match reply {
            Ok(o) => match o.as_slice() {
                [VerbOutcome::Read(b)] if b.iter().all(|&x| x == 0) => out.complete(op_id, Ok(None), 1),
                [VerbOutcome::Read(b)] => out.complete(op_id, Ok(Some(b.clone())), 1),
                _ => out.complete(op_id, Ok(None), 1),
            },
            Err(e) => out.complete(op_id, Err(kairos_swarm::client::KvError::Verb(e)), 1),
        }
    }
    fn on_tick(&mut self, _: LocalTime, _: &mut Outbox) {}
    fn tick_interval(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn in_flight(&self) -> usize {
        self.waiting.len()
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("word_register.chains", self.next_tag)]
    }
}

fn clients(n: u64, seed: u64) -> Vec<(WordRegister, Box<dyn OpSource>)> {
    (0..n)
        .map(|c| {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed * 1000 + c);
            let mut seq = 0u64;
            let ops = move || {
                seq += 1;
                let key = vec![rng.random_range(0..4u8)];
                Some(if rng.random_bool(0.5) {
                    KvOp::Get { key }
                } else {
                    KvOp::Update { key, value: ((c + 1) << 32 | seq).to_le_bytes().to_vec() }
                })
            };
            (WordRegister { waiting: Default::default(), next_tag: 0 }, Box::new(ops) as Box<dyn OpSource>)
        })
        .collect()
}

fn run_and_check(backend: &dyn MemoryBackend) {
    let cfg = DriverConfig { ops_per_client: 400, in_flight_per_client: 3, ..Default::default() };
    let report = run(backend, clients(4, 1), &LeU64Codec, &cfg).unwrap();
    assert_eq!((report.ok, report.failed, report.unknown), (1600, 0, 0), "{:?}", report.errors);
    assert_eq!(report.history.len(), 3200);
    assert_eq!(report.round_trips.values().map(|h| h[&1]).sum::<u64>(), 1600);
    assert_eq!(report.counters.get("word_register.chains"), Some(&1600));
    let verdict = check(&report.history, Model::Linearizable).unwrap();
    assert!(verdict.valid, "{verdict:?}");
}

#[test]
fn driver_on_shm_gives_a_linearizable_history() {
    run_and_check(&ShmCluster::create(21, 1, 64).unwrap());
}

#[test]
fn driver_on_tcp_gives_a_linearizable_history() {
    let tcp = TcpCluster::start_loopback(1, 64).unwrap();
    run_and_check(tcp.backend());
}

#[test]
fn operations_to_a_crashed_node_end_unknown_and_the_run_stops() {
    let shm = ShmCluster::create(22, 1, 64).unwrap();
    shm.crash(0).unwrap();
    let cfg = DriverConfig {
        ops_per_client: 10,
        in_flight_per_client: 2,
        drain_timeout: Duration::from_millis(100),
        op_timeout: Duration::from_millis(20),
        ..Default::default()
    };
    let report = run(&shm, clients(2, 2), &LeU64Codec, &cfg).unwrap();
    assert_eq!((report.ok, report.unknown), (0, 20), "every operation abandoned, then the run stops");
    assert!(check(&report.history, Model::Linearizable).unwrap().valid);
}
