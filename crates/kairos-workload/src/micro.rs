//! Where a coordinator's transactions come from: a source of key sets.
//!
//! [`MicroBench`] is the Tiga paper's micro-benchmark: every transaction increments
//! `keys_per_txn` (3) distinct keys drawn from a Zipf distribution over all keys
//! (`keys_per_shard × shards`); rank 1 (the hottest) is key 0. Tiga runs each key as an
//! increment of the byte-string key of its decimal digits, placed by hash; the peers in
//! `kairos-txn` place the integer key by `key % shards` ([`crate::Topology::shard_of_key`]).
//! Either way a transaction may touch fewer shards than it has keys. [`FixedKeys`] replays a
//! fixed list, for tests.
//!
//! Every draw comes from the generator the caller passes in (the node's seeded `ctx.rng()`),
//! so a source is reproducible from the run's seed.

use kairos_core::Rng;
use rand::Rng as _;
use rand_distr::{Distribution, Zipf};
use thiserror::Error;

use crate::txn::Key;

/// A source of transactions: the keys the next transaction touches, in its order.
pub trait TxnSource: Send {
    fn next_keys(&mut self, rng: &mut Rng) -> Vec<Key>;

    /// The next transaction in full, drawn at the coordinator's clock reading `date_ns`: its
    /// keys and, for a workload richer than increments (TPC-C), the pieces the shards run.
    fn next_txn(&mut self, rng: &mut Rng, date_ns: u64) -> TxnWork {
        let _ = date_ns;
        TxnWork { keys: self.next_keys(rng), pieces: Pieces::default(), kind: None }
    }
}

/// A TPC-C transaction's pieces, one per warehouse it touches (none for MicroBench).
pub type Pieces = std::sync::Arc<[crate::tpcc::Piece]>;

/// Whether a transaction with these pieces only reads its keys: TPC-C's order-status and
/// stock-level, whose every piece only reads. Every other transaction (MicroBench's has no
/// pieces) increments each of its keys.
pub fn reads_only(pieces: &[crate::tpcc::Piece]) -> bool {
    !pieces.is_empty() && pieces.iter().all(crate::tpcc::Piece::reads_only)
}

/// What a transaction does. Every protocol reads the counter of each of `keys` (MicroBench's
/// whole transaction; TPC-C's conflict keys, whose counters the history records), increments
/// each unless the transaction [only reads](reads_only), and in the same step runs the
/// `pieces` of the warehouses it holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnWork {
    pub keys: Vec<Key>,
    pub pieces: Pieces,
    /// The transaction's type, for per-type statistics (TPC-C: its index in
    /// [`crate::tpcc::TxnType::ALL`]); none for MicroBench.
    pub kind: Option<u8>,
}

/// One finished transaction of a workload with types (TPC-C), for per-type statistics.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct KindSample {
    /// [`TxnWork::kind`].
    pub kind: u8,
    /// Committed, or failed after its last attempt.
    pub committed: bool,
    pub attempts: u32,
    /// From the invocation to the commit or the failure, on the coordinator's clock.
    pub latency_ns: u64,
}

/// Samples one coordinator keeps at most (later ones are counted nowhere).
pub const KIND_SAMPLES_MAX: usize = 1 << 20;

/// A workload that cannot be built as asked.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum WorkloadError {
    #[error("Zipf skew must be a finite number ≥ 0 (0 = uniform), not {0}")]
    BadSkew(f64),
    #[error(
        "the workload needs at least one key and one shard (got {keys_per_shard} keys per shard × {shards} shards)"
    )]
    NoKeys { keys_per_shard: u64, shards: u32 },
    #[error("{keys_per_shard} keys per shard × {shards} shards overflows 2^53 keys; use fewer keys")]
    TooManyKeys { keys_per_shard: u64, shards: u32 },
    #[error("a transaction of {keys_per_txn} distinct keys needs at least that many keys (there are {keys_total}), and at least one key")]
    KeysPerTxn { keys_per_txn: usize, keys_total: u64 },
}

/// Draws with more than this many repeats of already-chosen keys fall back to a deterministic
/// scan, so a tiny key space with extreme skew cannot spin for long.
const REDRAWS_MAX: usize = 1_000;

/// The paper's micro-benchmark (see the module docs).
#[derive(Clone, Debug)]
pub struct MicroBench {
    keys_total: u64,
    keys_per_txn: usize,
    zipf: Zipf<f64>,
}

impl MicroBench {
    /// Keys per transaction in the paper's micro-benchmark.
    pub const KEYS_PER_TXN: usize = 3;

    /// `keys_per_shard` (paper: 1,000,000) × `shards` keys, 3 keys per transaction, Zipf
    /// exponent `skew` (0 = uniform; paper: 0.5, swept to 0.99).
    pub fn new(keys_per_shard: u64, shards: u32, skew: f64) -> Result<Self, WorkloadError> {
        Self::with_keys_per_txn(keys_per_shard, shards, skew, Self::KEYS_PER_TXN)
    }

    /// As [`MicroBench::new`] with another number of keys per transaction.
    pub fn with_keys_per_txn(
        keys_per_shard: u64,
        shards: u32,
        skew: f64,
        keys_per_txn: usize,
    ) -> Result<Self, WorkloadError> {
        if !skew.is_finite() || skew < 0.0 {
            return Err(WorkloadError::BadSkew(skew));
        }
        if keys_per_shard == 0 || shards == 0 {
            return Err(WorkloadError::NoKeys { keys_per_shard, shards });
        }
        let keys_total = keys_per_shard
            .checked_mul(u64::from(shards))
            .filter(|n| *n <= 1 << 53)
            .ok_or(WorkloadError::TooManyKeys { keys_per_shard, shards })?;
        if keys_per_txn == 0 || keys_per_txn as u64 > keys_total {
            return Err(WorkloadError::KeysPerTxn { keys_per_txn, keys_total });
        }
        let zipf = Zipf::new(keys_total as f64, skew).map_err(|_| WorkloadError::BadSkew(skew))?;
        Ok(MicroBench { keys_total, keys_per_txn, zipf })
    }

    pub fn keys_total(&self) -> u64 {
        self.keys_total
    }

    pub fn keys_per_txn(&self) -> usize {
        self.keys_per_txn
    }

    /// One key: Zipf rank r ∈ [1, keys_total] is key r − 1.
    fn draw(&self, rng: &mut Rng) -> Key {
        let rank = self.zipf.sample(rng);
        // Ranks are integral floats in [1, n]; clamp defensively (NaN casts to 0).
        (rank as u64).clamp(1, self.keys_total) - 1
    }
}

impl TxnSource for MicroBench {
    fn next_keys(&mut self, rng: &mut Rng) -> Vec<Key> {
        let mut keys: Vec<Key> = Vec::with_capacity(self.keys_per_txn);
        let mut redraws = 0;
        while keys.len() < self.keys_per_txn {
            let k = self.draw(rng);
            if !keys.contains(&k) {
                keys.push(k);
                continue;
            }
            redraws += 1;
            if redraws > REDRAWS_MAX {
                // Take the next unused keys after a uniform start (keys_per_txn ≤ keys_total).
                let mut k = rng.random_range(0..self.keys_total);
                while keys.len() < self.keys_per_txn {
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                    k = (k + 1) % self.keys_total;
                }
            }
        }
        keys
    }
}

/// Replays fixed key lists in order, cycling; an empty list of lists yields empty transactions
/// (which a coordinator rejects).
#[derive(Clone, Debug, Default)]
pub struct FixedKeys {
    lists: Vec<Vec<Key>>,
    next: usize,
}

impl FixedKeys {
    pub fn new(lists: Vec<Vec<Key>>) -> Self {
        FixedKeys { lists, next: 0 }
    }
}

impl TxnSource for FixedKeys {
    fn next_keys(&mut self, _rng: &mut Rng) -> Vec<Key> {
        if self.lists.is_empty() {
            return Vec::new();
        }
        let keys = self.lists[self.next % self.lists.len()].clone();
        self.next = (self.next + 1) % self.lists.len();
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn rng(seed: u64) -> Rng {
        Rng::seed_from_u64(seed)
    }

    #[test]
    fn keys_are_distinct_and_in_range() {
        let mut w = MicroBench::new(10, 3, 0.99).unwrap();
        let mut r = rng(1);
        for _ in 0..2_000 {
            let ks = w.next_keys(&mut r);
            assert_eq!(ks.len(), 3);
            assert!(ks.iter().all(|k| *k < 30));
            assert!(ks[0] != ks[1] && ks[0] != ks[2] && ks[1] != ks[2], "{ks:?}");
        }
        // All keys of a 3-key space, even under extreme skew (the fallback scan).
        let mut w = MicroBench::new(1, 3, 50.0).unwrap();
        let mut ks = w.next_keys(&mut r);
        ks.sort_unstable();
        assert_eq!(ks, vec![0, 1, 2]);
    }

    fn top_share(skew: f64) -> f64 {
        let mut w = MicroBench::new(1_000_000, 3, skew).unwrap();
        let mut r = rng(7);
        let (mut hot, mut all) = (0u64, 0u64);
        for _ in 0..20_000 {
            for k in w.next_keys(&mut r) {
                all += 1;
                hot += u64::from(k < 100);
            }
        }
        hot as f64 / all as f64
    }

    #[test]
    fn higher_skew_concentrates_on_the_hottest_keys() {
        let (uniform, mild, steep) = (top_share(0.0), top_share(0.5), top_share(0.99));
        assert!(uniform < 0.001, "uniform top-100 share {uniform}");
        assert!(steep > 5.0 * mild, "top-100 share: skew 0.99 {steep} vs 0.5 {mild}");
        assert!(steep > 0.2, "skew 0.99 top-100 share {steep}");
    }

    #[test]
    fn reproducible_from_the_seed() {
        let draw = |seed| {
            let mut w = MicroBench::new(1_000_000, 3, 0.5).unwrap();
            let mut r = rng(seed);
            (0..100).map(|_| w.next_keys(&mut r)).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert_eq!(MicroBench::new(10, 3, -0.1).unwrap_err(), WorkloadError::BadSkew(-0.1));
        assert!(matches!(MicroBench::new(10, 3, f64::NAN), Err(WorkloadError::BadSkew(_))));
        assert!(matches!(MicroBench::new(10, 3, f64::INFINITY), Err(WorkloadError::BadSkew(_))));
        assert!(matches!(MicroBench::new(0, 3, 0.5), Err(WorkloadError::NoKeys { .. })));
        assert!(matches!(MicroBench::new(10, 0, 0.5), Err(WorkloadError::NoKeys { .. })));
        assert!(matches!(MicroBench::new(u64::MAX, 3, 0.5), Err(WorkloadError::TooManyKeys { .. })));
        assert!(matches!(
            MicroBench::new(1, 2, 0.5),
            Err(WorkloadError::KeysPerTxn { keys_per_txn: 3, keys_total: 2 })
        ));
        assert!(matches!(MicroBench::with_keys_per_txn(5, 1, 0.5, 0), Err(WorkloadError::KeysPerTxn { .. })));
        let e = MicroBench::new(10, 3, -1.0).unwrap_err().to_string();
        assert!(e.contains("≥ 0"), "{e}");
    }

    #[test]
    fn fixed_keys_cycle() {
        let mut w = FixedKeys::new(vec![vec![1, 2], vec![3]]);
        let mut r = rng(0);
        let got: Vec<_> = (0..3).map(|_| w.next_keys(&mut r)).collect();
        assert_eq!(got, vec![vec![1, 2], vec![3], vec![1, 2]]);
        assert!(FixedKeys::new(vec![]).next_keys(&mut r).is_empty());
    }
}
