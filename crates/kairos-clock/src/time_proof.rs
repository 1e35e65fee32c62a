//! Time proofs: the HMAC-SHA1 that signs a cluster time (docs/causal.md, "Signatures").
//!
//! A proof of `t` under a 20-byte key is
//!
//! ```text
//! HMAC-SHA1(key, little_endian_u64(t.as_u64() | 0xFFFF))
//! ```
//!
//! The mask means one proof covers the **signing range** of 65,536 consecutive times that share
//! everything but the low 16 bits of `inc` ([`signing_range`]). A node signs and checks through a
//! [`TimeProofService`], which remembers the last proof it computed (key + range → proof), so a
//! primary handing out a million times per second computes about sixteen HMACs per second instead
//! of one per reply. For measurement the service can be switched to *per-reply* signing: same
//! proofs (peers cannot tell the difference), no cache. Either way it counts every HMAC it
//! computes ([`TimeProofService::hmac_computations`]).
//!
//! Proofs are compared in constant time (through `digest`'s `CtOutput`, which uses `subtle`), so
//! a forger learns nothing from how long a rejection takes.

use crate::ClusterTime;
use hmac::digest::CtOutput;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha1::Sha1;
use std::fmt;

type HmacSha1 = Hmac<Sha1>;

/// Length of a key and of a proof: 20 bytes (the SHA-1 block output).
pub const PROOF_LEN: usize = 20;

/// The bits set before signing: one proof covers every time whose
/// `as_u64() | RANGE_MASK` is the same, i.e. 65,536 consecutive times.
pub const RANGE_MASK: u64 = 0xFFFF;

/// Number of consecutive times one proof covers (2¹⁶).
pub const RANGE_LEN: u64 = RANGE_MASK + 1;

/// A signing key's secret: 20 random bytes.
pub type KeyBytes = [u8; PROOF_LEN];

/// An HMAC-SHA1 time proof (the `hash` of a `$clusterTime` signature).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct TimeProof(pub [u8; PROOF_LEN]);

impl TimeProof {
    /// Twenty zero bytes: the hash of the dummy signature handed to trusted recipients.
    pub const ZERO: TimeProof = TimeProof([0; PROOF_LEN]);

    pub const fn as_bytes(&self) -> &[u8; PROOF_LEN] {
        &self.0
    }

    /// Compares in constant time (the `==` of this type is *not* constant time; use this one
    /// whenever one side came from the network).
    pub fn ct_eq(&self, other: &TimeProof) -> bool {
        let a: CtOutput<HmacSha1> = CtOutput::new(self.0.into());
        let b: CtOutput<HmacSha1> = CtOutput::new(other.0.into());
        a == b
    }
}

impl fmt::Display for TimeProof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for TimeProof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TimeProof({self})")
    }
}

/// The value actually signed for `t`: `t.as_u64() | 0xFFFF`, the last time of its signing range.
pub const fn signing_range(t: ClusterTime) -> u64 {
    t.as_u64() | RANGE_MASK
}

/// `HMAC-SHA1(key, little_endian_u64(t.as_u64() | 0xFFFF))`. Pure, uncached; prefer a
/// [`TimeProofService`] on hot paths.
pub fn compute_proof(key: &KeyBytes, t: ClusterTime) -> TimeProof {
    hmac_of_range(key, signing_range(t))
}

fn hmac_of_range(key: &KeyBytes, range: u64) -> TimeProof {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = HmacSha1::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(&range.to_le_bytes());
    TimeProof(mac.finalize().into_bytes().into())
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct CacheEntry {
    key_id: i64,
    key: KeyBytes,
    range: u64,
    proof: TimeProof,
}

/// Signs and checks cluster times, with a one-entry cache and an HMAC counter.
///
/// The cache holds the last `(key id, key bytes, signing range) → proof`; a request for any time
/// in the same range under the same key is answered without an HMAC. (The key bytes are part of
/// the cache key so that a key replaced under the same id — e.g. after a rollback — can never be
/// answered with a stale proof.)
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TimeProofService {
    cache: Option<CacheEntry>,
    per_reply: bool,
    hmac_computations: u64,
}

impl TimeProofService {
    /// Range signing with the one-entry cache (the normal mode).
    pub const fn new() -> Self {
        TimeProofService { cache: None, per_reply: false, hmac_computations: 0 }
    }

    /// Per-reply signing: every proof is computed afresh (for measuring what range signing saves).
    /// Proofs are identical to range signing's, so the two modes interoperate.
    pub const fn per_reply() -> Self {
        TimeProofService { cache: None, per_reply: true, hmac_computations: 0 }
    }

    /// Switches per-reply signing on or off (switching on drops the cache).
    pub fn set_per_reply(&mut self, per_reply: bool) {
        self.per_reply = per_reply;
        if per_reply {
            self.cache = None;
        }
    }

    pub const fn is_per_reply(&self) -> bool {
        self.per_reply
    }

    /// How many HMACs this service has computed since it was created (or the counter was reset).
    pub const fn hmac_computations(&self) -> u64 {
        self.hmac_computations
    }

    pub fn reset_hmac_computations(&mut self) {
        self.hmac_computations = 0;
    }

    /// Forgets the cached proof (MongoDB resets it when keys are reloaded).
    pub fn reset_cache(&mut self) {
        self.cache = None;
    }

    /// The proof of `t` under key `key_id` / `key`, from the cache when possible.
    pub fn proof(&mut self, key_id: i64, key: &KeyBytes, t: ClusterTime) -> TimeProof {
        let range = signing_range(t);
        if let Some(c) = &self.cache {
            if c.key_id == key_id && c.range == range && c.key == *key {
                return c.proof;
            }
        }
        let proof = hmac_of_range(key, range);
        self.hmac_computations += 1;
        if !self.per_reply {
            self.cache = Some(CacheEntry { key_id, key: *key, range, proof });
        }
        proof
    }

    /// Whether `proof` is the proof of `t` under `key`, compared in constant time.
    pub fn check(&mut self, key_id: i64, key: &KeyBytes, t: ClusterTime, proof: &TimeProof) -> bool {
        self.proof(key_id, key, t).ct_eq(proof)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ct(secs: u32, inc: u32) -> ClusterTime {
        ClusterTime::new(secs, inc)
    }

    /// Known-answer test against an independent HMAC implementation. The expected values were
    /// computed with Python 3's standard library, outside this code:
    ///
    /// ```text
    /// python3 -c 'import hmac,hashlib,struct
    /// key=bytes(range(1,21))
    /// for v in [(1767225600<<32|7)|0xFFFF, 0xFFFF]:
    ///     print(hmac.new(key, struct.pack("<Q", v), hashlib.sha1).hexdigest())'
    /// ```
    #[test]
    fn known_answer() {
        let key: KeyBytes = core::array::from_fn(|i| i as u8 + 1);
        assert_eq!(compute_proof(&key, ct(1_767_225_600, 7)).to_string(), KAT_EPOCH_7);
        assert_eq!(compute_proof(&key, ClusterTime::ZERO).to_string(), KAT_ZERO);
        // The whole range shares the proof; the next range does not.
        assert_eq!(compute_proof(&key, ct(1_767_225_600, 0xFFFF)).to_string(), KAT_EPOCH_7);
        assert_ne!(compute_proof(&key, ct(1_767_225_600, 0x1_0000)).to_string(), KAT_EPOCH_7);
    }

    const KAT_EPOCH_7: &str = "c44ea4f3cd32b25044ebac665b4edd431959b471";
    const KAT_ZERO: &str = "c65c400a0fa681a1035737d97b66e4731f606431";

    #[test]
    fn range_is_65536_consecutive_times() {
        assert_eq!(RANGE_LEN, 65_536);
        assert_eq!(signing_range(ct(9, 0)), signing_range(ct(9, 65_535)));
        assert_ne!(signing_range(ct(9, 65_535)), signing_range(ct(9, 65_536)));
        // Ranges never span two seconds.
        assert_ne!(signing_range(ct(9, u32::MAX)), signing_range(ct(10, 0)));
    }

    #[test]
    fn cache_answers_the_same_range_and_key_without_hmac() {
        let (k1, k2): (KeyBytes, KeyBytes) = ([1; 20], [2; 20]);
        let mut s = TimeProofService::new();
        let p = s.proof(1, &k1, ct(5, 3));
        assert_eq!(p, compute_proof(&k1, ct(5, 3)));
        assert_eq!(s.proof(1, &k1, ct(5, 60_000)), p);
        assert!(s.check(1, &k1, ct(5, 0), &p));
        assert_eq!(s.hmac_computations(), 1);
        // Another range, another key, or the same id with other bytes: a fresh HMAC each.
        s.proof(1, &k1, ct(5, 70_000));
        s.proof(2, &k2, ct(5, 70_000));
        assert_eq!(s.proof(2, &k1, ct(5, 70_000)), compute_proof(&k1, ct(5, 70_000)));
        assert_eq!(s.hmac_computations(), 4);
        s.reset_cache();
        s.proof(2, &k1, ct(5, 70_000));
        assert_eq!(s.hmac_computations(), 5);
        // A wrong proof is refused.
        assert!(!s.check(2, &k1, ct(5, 70_000), &TimeProof::ZERO));
    }

    #[test]
    fn per_reply_mode_computes_every_time_with_the_same_proofs() {
        let k: KeyBytes = [7; 20];
        let mut s = TimeProofService::per_reply();
        assert!(s.is_per_reply());
        for inc in 0..10 {
            assert_eq!(s.proof(1, &k, ct(5, inc)), compute_proof(&k, ct(5, inc)));
        }
        assert_eq!(s.hmac_computations(), 10);
        s.set_per_reply(false);
        s.reset_hmac_computations();
        for inc in 0..10 {
            s.proof(1, &k, ct(5, inc));
        }
        assert_eq!(s.hmac_computations(), 1);
    }

    #[test]
    fn constant_time_comparison_agrees_with_equality() {
        let a = compute_proof(&[3; 20], ct(1, 1));
        let mut b = a;
        assert!(a.ct_eq(&b));
        b.0[19] ^= 1;
        assert!(!a.ct_eq(&b));
        assert_eq!(format!("{:?}", TimeProof::ZERO), format!("TimeProof({})", "00".repeat(20)));
    }
}
