//! YCSB A (50% updates) and B (5% updates) over a fixed key set, Zipfian 0.99 (scrambled, as
//! YCSB does: the popularity rank is permuted over the key space so hot keys are spread).

use rand_distr::{Distribution, Zipf};
use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Workload {
    /// 50% gets, 50% updates.
    YcsbA,
    /// 95% gets, 5% updates.
    YcsbB,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::YcsbA => "ycsb-a",
            Workload::YcsbB => "ycsb-b",
        }
    }
    pub fn parse(s: &str) -> Option<Workload> {
        match s {
            "ycsb-a" | "a" => Some(Workload::YcsbA),
            "ycsb-b" | "b" => Some(Workload::YcsbB),
            _ => None,
        }
    }
    pub fn update_ratio(self) -> f64 {
        match self {
            Workload::YcsbA => 0.5,
            Workload::YcsbB => 0.05,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum YcsbError {
    #[error("YCSB needs at least one key")]
    NoKeys,
    #[error("{keys} keys do not fit in {key_size}-byte keys")]
    KeysTooLong { keys: u64, key_size: u32 },
}

/// One generated operation: the key's number, and whether it is an update.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct YcsbOp {
    pub key: u64,
    pub update: bool,
}

/// Draws YCSB operations.
#[derive(Clone, Debug)]
pub struct Ycsb {
    pub workload: Workload,
    pub keys: u64,
    pub key_size: u32,
    zipf: Zipf<f64>,
    /// Multiplier of the rank permutation (coprime with `keys`).
    scramble: u64,
}

/// The Zipfian constant of YCSB.
pub const ZIPF_THETA: f64 = 0.99;

impl Ycsb {
    pub fn new(workload: Workload, keys: u64, key_size: u32) -> Result<Ycsb, YcsbError> {
        if keys == 0 {
            return Err(YcsbError::NoKeys);
        }
        if key_size < 8 && keys > 1u64 << (8 * key_size) {
            return Err(YcsbError::KeysTooLong { keys, key_size });
        }
        let zipf = Zipf::new(keys as f64, ZIPF_THETA).map_err(|_| YcsbError::NoKeys)?;
        let mut scramble = (0x9E37_79B9_7F4A_7C15u64 % keys.max(2)) | 1;
        while gcd(scramble, keys) != 1 {
            scramble += 2;
        }
        Ok(Ycsb { workload, keys, key_size, zipf, scramble })
    }

    pub fn next(&self, rng: &mut impl rand::Rng) -> YcsbOp {
        let rank = (self.zipf.sample(rng) as u64).clamp(1, self.keys) - 1;
        let key = ((rank as u128 * self.scramble as u128) % self.keys as u128) as u64;
        YcsbOp { key, update: rng.random_bool(self.workload.update_ratio()) }
    }

    /// The bytes of key number `k` (exactly `key_size` bytes: a `u` prefix, then `k` big-endian).
    pub fn key_bytes(&self, k: u64) -> Vec<u8> {
        key_bytes(k, self.key_size)
    }
}

/// The bytes of key number `k` in `key_size` bytes.
pub fn key_bytes(k: u64, key_size: u32) -> Vec<u8> {
    let size = key_size as usize;
    let be = k.to_be_bytes();
    if size >= 8 {
        let mut v = vec![b'u'; size - 8];
        v.extend_from_slice(&be);
        v
    } else {
        be[8 - size..].to_vec()
    }
}

/// The value bytes carrying the unique number `id` (the history's value), `len` bytes long.
pub fn value_bytes(id: u64, len: u32) -> Vec<u8> {
    let mut v = id.to_le_bytes().to_vec();
    v.resize((len as usize).max(8), 0);
    for (i, b) in v.iter_mut().enumerate().skip(8) {
        *b = (id as u8).wrapping_add(i as u8);
    }
    v.truncate((len as usize).max(8));
    v
}

/// The unique number a value carries (`None` if it is too short).
pub fn value_id(v: &[u8]) -> Option<u64> {
    v.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn zipf_is_skewed_and_mix_matches() {
        let y = Ycsb::new(Workload::YcsbB, 1000, 24).unwrap();
        let mut rng = kairos_core::Rng::seed_from_u64(1);
        let mut counts = vec![0u32; 1000];
        let mut updates = 0;
        for _ in 0..20_000 {
            let op = y.next(&mut rng);
            counts[op.key as usize] += 1;
            updates += op.update as u32;
        }
        counts.sort_unstable();
        assert!(counts[999] > 1000, "the hottest key gets > 5% of ops: {}", counts[999]);
        assert!((700..1300).contains(&updates), "{updates}");
        assert_eq!(key_bytes(5, 24).len(), 24);
        assert_eq!(value_id(&value_bytes(77, 64)), Some(77));
    }
}
