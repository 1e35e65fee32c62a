//! The `$clusterTime` field: a cluster time and its signature, and what a node attaches to a
//! reply (docs/causal.md, "Signatures" and "Trusted peers").
//!
//! [`sign_reply`] decides, for one reply:
//!
//! | recipient                                   | node has a key at `time` | attach                         |
//! |---------------------------------------------|--------------------------|--------------------------------|
//! | trusted (holds `advanceClusterTime`)        | either                   | dummy signature (20 zero bytes, keyId 0) |
//! | untrusted                                   | yes                      | real signature                 |
//! | untrusted                                   | no                       | nothing: omit `$clusterTime` **and** `operationTime` |
//!
//! An untrusted recipient never gets the dummy: a driver would gossip it back, and every later
//! operation would fail with KeyNotFound. Trusted recipients are never validated, so the dummy
//! spares an HMAC per reply (this matches MongoDB, which sends the dummy to authorized clients
//! even before it has a key).

use crate::keys::KeyRing;
use crate::time_proof::{TimeProof, TimeProofService};
use crate::ClusterTime;
use serde::{Deserialize, Serialize};

/// The `signature` sub-document of `$clusterTime`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Signature {
    /// `hash`: HMAC-SHA1 of the time's signing range.
    pub hash: TimeProof,
    /// `keyId`: the id of the key that produced `hash` (0 for the dummy).
    pub key_id: i64,
}

impl Signature {
    /// The dummy signature for trusted recipients: 20 zero bytes, keyId 0.
    pub const DUMMY: Signature = Signature { hash: TimeProof::ZERO, key_id: 0 };

    pub fn is_dummy(&self) -> bool {
        *self == Signature::DUMMY
    }
}

/// `$clusterTime { clusterTime, signature { hash, keyId } }` as carried on every message.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SignedClusterTime {
    pub time: ClusterTime,
    /// `None` when the sender attached no signature (only acceptable from trusted senders).
    pub signature: Option<Signature>,
}

impl SignedClusterTime {
    /// `time` with no signature.
    pub const fn unsigned(time: ClusterTime) -> Self {
        SignedClusterTime { time, signature: None }
    }

    /// `time` with the dummy signature.
    pub const fn dummy(time: ClusterTime) -> Self {
        SignedClusterTime { time, signature: Some(Signature::DUMMY) }
    }

    /// Whether the signature is present and is the dummy.
    pub fn is_dummy_signed(&self) -> bool {
        self.signature.is_some_and(|s| s.is_dummy())
    }
}

/// Signs `time` with the current key at `time` ([`KeyRing::signing_key`]). `None` if the node has
/// no key that may sign `time`.
pub fn sign(time: ClusterTime, keys: &KeyRing, proofs: &mut TimeProofService) -> Option<SignedClusterTime> {
    let key = keys.signing_key(time)?;
    let hash = proofs.proof(key.key_id, &key.bytes, time);
    Some(SignedClusterTime { time, signature: Some(Signature { hash, key_id: key.key_id }) })
}

/// What to attach to a reply carrying cluster time `time` (see the [module docs](self)):
/// `Some` → set `$clusterTime` (and `operationTime`); `None` → omit both fields.
///
/// `recipient_trusted` is whether the recipient holds `advanceClusterTime` (internal nodes,
/// trusted applications; every client when authentication is off).
pub fn sign_reply(
    time: ClusterTime,
    recipient_trusted: bool,
    keys: &KeyRing,
    proofs: &mut TimeProofService,
) -> Option<SignedClusterTime> {
    if recipient_trusted {
        Some(SignedClusterTime::dummy(time))
    } else {
        sign(time, keys, proofs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time_proof::compute_proof;
    use kairos_core::Rng;
    use rand::SeedableRng;

    fn ct(secs: u32, inc: u32) -> ClusterTime {
        ClusterTime::new(secs, inc)
    }

    #[test]
    fn untrusted_never_gets_the_dummy_and_trusted_always_does() {
        let mut rng = Rng::seed_from_u64(11);
        let mut keys = KeyRing::new();
        let mut proofs = TimeProofService::new();
        // Before any key exists, and after: trusted always gets the dummy; untrusted never.
        for step in 0..2 {
            if step == 1 {
                keys.generate(&mut rng, ct(100, 0), 1_000);
            }
            for inc in [1, 2, 70_000] {
                let t = ct(500, inc);
                let trusted = sign_reply(t, true, &keys, &mut proofs).unwrap();
                assert_eq!(trusted, SignedClusterTime { time: t, signature: Some(Signature::DUMMY) });
                assert!(trusted.is_dummy_signed());
                match sign_reply(t, false, &keys, &mut proofs) {
                    None => assert_eq!(step, 0, "a node with keys must sign"),
                    Some(s) => {
                        assert_eq!(step, 1);
                        let sig = s.signature.expect("a reply to an untrusted client is signed");
                        assert!(!sig.is_dummy());
                        assert_ne!(sig.key_id, 0);
                        assert_ne!(sig.hash, TimeProof::ZERO);
                        let key = keys.get(sig.key_id).unwrap();
                        assert_eq!(sig.hash, compute_proof(&key.bytes, t));
                    }
                }
            }
        }
    }

    #[test]
    fn a_node_with_no_key_omits_the_field_for_untrusted_recipients() {
        let keys = KeyRing::new();
        let mut proofs = TimeProofService::new();
        assert_eq!(sign_reply(ct(5, 5), false, &keys, &mut proofs), None);
        assert_eq!(sign(ct(5, 5), &keys, &mut proofs), None);
        // Also when every key it has is expired at that time.
        let mut keys = KeyRing::new();
        keys.generate(&mut Rng::seed_from_u64(1), ct(5, 0), 10);
        assert!(sign_reply(ct(14, 9), false, &keys, &mut proofs).is_some());
        assert_eq!(sign_reply(ct(25, 0), false, &keys, &mut proofs), None);
        assert_eq!(proofs.hmac_computations(), 1);
    }

    #[test]
    fn serde_shape() {
        let s =
            SignedClusterTime { time: ct(1, 2), signature: Some(Signature { hash: TimeProof([9; 20]), key_id: 7 }) };
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<SignedClusterTime>(&json).unwrap(), s);
        assert_eq!(SignedClusterTime::unsigned(ct(1, 2)).signature, None);
    }
}
