//! Validating received cluster times before they may move a clock (MongoDB's
//! `LogicalTimeValidator`), and [`gossip_in`], which chains validation and the clock.
//!
//! [`ClusterTimeValidator::validate`] decides whether a received `$clusterTime` is genuine:
//!
//! 1. from a trusted sender (holds `advanceClusterTime`): accepted unchecked;
//! 2. a time `<=` the last validated time: accepted **without an HMAC** (it cannot push the clock
//!    past anything already proven);
//! 3. no signature, or a key id this node does not have (or whose key expired before the time) →
//!    `KeyNotFound` (211);
//! 4. a hash that is not the proof of the time under that key → `TimeProofMismatch` (204);
//! 5. otherwise accepted, and the last validated time rises to it.
//!
//! Times the node itself signs or produces can be recorded with
//! [`ClusterTimeValidator::note_valid`] so echoes of them skip the HMAC too.

use crate::keys::KeyRing;
use crate::signed::SignedClusterTime;
use crate::time_proof::TimeProofService;
use crate::{ClusterTime, ClusterTimeError, LogicalClock};
use kairos_core::LocalTime;

/// Remembers the highest cluster time this node has proven genuine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterTimeValidator {
    last_validated: ClusterTime,
}

impl ClusterTimeValidator {
    pub const fn new() -> Self {
        ClusterTimeValidator { last_validated: ClusterTime::ZERO }
    }

    /// The highest time validated (or noted) so far.
    pub const fn last_validated(&self) -> ClusterTime {
        self.last_validated
    }

    /// Records a time known to be genuine without checking it (one this node signed or wrote).
    pub fn note_valid(&mut self, t: ClusterTime) {
        self.last_validated = self.last_validated.max(t);
    }

    /// Checks a received `$clusterTime`; see the [module docs](self). Never changes anything on
    /// error.
    pub fn validate(
        &mut self,
        received: &SignedClusterTime,
        from_trusted: bool,
        keys: &KeyRing,
        proofs: &mut TimeProofService,
    ) -> Result<(), ClusterTimeError> {
        let time = received.time;
        if from_trusted || time <= self.last_validated {
            return Ok(());
        }
        let Some(sig) = received.signature else {
            return Err(ClusterTimeError::KeyNotFound { time, key_id: None });
        };
        let Some(key) = keys.key_for_validation(sig.key_id, time) else {
            return Err(ClusterTimeError::KeyNotFound { time, key_id: Some(sig.key_id) });
        };
        if !proofs.check(key.key_id, &key.bytes, time, &sig.hash) {
            return Err(ClusterTimeError::TimeProofMismatch { time, key_id: sig.key_id });
        }
        self.last_validated = time;
        Ok(())
    }
}

/// Gossip in: validate `received`, then apply it to `clock` through the rate limiter
/// ([`LogicalClock::advance`]) against this node's wall clock `wall`. The clock moves only if
/// both succeed. (A genuinely signed time that the rate limiter refuses still counts as
/// validated: it was proven, just too far ahead to apply.)
pub fn gossip_in(
    clock: &mut LogicalClock,
    validator: &mut ClusterTimeValidator,
    keys: &KeyRing,
    proofs: &mut TimeProofService,
    received: &SignedClusterTime,
    from_trusted: bool,
    wall: LocalTime,
) -> Result<(), ClusterTimeError> {
    validator.validate(received, from_trusted, keys, proofs)?;
    clock.advance(received.time, wall)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signed::{sign, sign_reply, Signature};
    use crate::time_proof::{compute_proof, signing_range, TimeProof, RANGE_LEN};
    use crate::{DEFAULT_KEY_ROTATION_SECS, SIM_EPOCH};
    use kairos_core::Rng;
    use rand::SeedableRng;
    use std::collections::BTreeSet;

    fn ct(secs: u32, inc: u32) -> ClusterTime {
        ClusterTime::new(secs, inc)
    }

    fn wall(secs: u64) -> LocalTime {
        LocalTime::from_secs(secs)
    }

    const EPOCH_SECS: u32 = 1_767_225_600;

    /// One replica set's signing state as seen by one member.
    struct Node {
        clock: LogicalClock,
        validator: ClusterTimeValidator,
        keys: KeyRing,
        proofs: TimeProofService,
    }

    impl Node {
        fn new(seed: u64, key_time: ClusterTime) -> Self {
            let mut keys = KeyRing::new();
            keys.generate(&mut Rng::seed_from_u64(seed), key_time, DEFAULT_KEY_ROTATION_SECS);
            Node {
                clock: LogicalClock::new().with_time(key_time),
                validator: ClusterTimeValidator::new(),
                keys,
                proofs: TimeProofService::new(),
            }
        }
        fn sign(&mut self, t: ClusterTime) -> SignedClusterTime {
            sign_reply(t, false, &self.keys, &mut self.proofs).unwrap()
        }
        fn gossip_in(&mut self, r: &SignedClusterTime, w: LocalTime) -> Result<(), ClusterTimeError> {
            gossip_in(&mut self.clock, &mut self.validator, &self.keys, &mut self.proofs, r, false, w)
        }
    }

    #[test]
    fn forged_hash_is_rejected_with_204_and_the_clock_does_not_move() {
        let mut a = Node::new(1, ct(EPOCH_SECS, 0));
        let genuine = a.sign(ct(EPOCH_SECS + 10, 1));
        let mut forged = genuine;
        forged.time = ct(EPOCH_SECS + 100_000, 0);
        let mut sig = genuine.signature.unwrap();
        forged.signature = Some(sig);
        let before = a.clock.current();
        let e = a.gossip_in(&forged, wall(u64::from(EPOCH_SECS))).unwrap_err();
        assert_eq!((e.code(), e.code_name()), (204, "TimeProofMismatch"));
        assert!(e.to_string().contains("does not match"), "{e}");
        assert_eq!(a.clock.current(), before);
        assert_eq!(a.validator.last_validated(), ClusterTime::ZERO);
        // A flipped bit in the hash of the right time is also refused.
        sig.hash.0[0] ^= 0x80;
        let bad = SignedClusterTime { time: genuine.time, signature: Some(sig) };
        assert_eq!(a.gossip_in(&bad, wall(u64::from(EPOCH_SECS))).unwrap_err().code(), 204);
        assert_eq!(a.clock.current(), before);
        // The genuine one passes and moves the clock.
        a.gossip_in(&genuine, wall(u64::from(EPOCH_SECS))).unwrap();
        assert_eq!(a.clock.current(), genuine.time);
    }

    #[test]
    fn unknown_key_id_and_missing_or_dummy_signature_give_211() {
        let mut a = Node::new(2, ct(EPOCH_SECS, 0));
        let t = ct(EPOCH_SECS + 1, 0);
        let mut s = a.sign(t);
        s.signature.as_mut().unwrap().key_id = 12_345;
        let e = a.gossip_in(&s, wall(u64::from(EPOCH_SECS))).unwrap_err();
        assert_eq!((e.code(), e.code_name()), (211, "KeyNotFound"));
        assert!(e.to_string().contains("12345"), "{e}");
        for r in [SignedClusterTime::unsigned(t), SignedClusterTime::dummy(t)] {
            assert_eq!(a.gossip_in(&r, wall(u64::from(EPOCH_SECS))).unwrap_err().code(), 211);
        }
        assert_eq!(a.clock.current(), ct(EPOCH_SECS, 0));
        assert_eq!(a.proofs.hmac_computations(), 1, "only the signing; lookups failed before any HMAC");
    }

    #[test]
    fn trusted_senders_are_not_validated() {
        let mut a = Node::new(3, ct(EPOCH_SECS, 0));
        let t = ct(EPOCH_SECS + 5, 0);
        let r = SignedClusterTime::dummy(t);
        gossip_in(&mut a.clock, &mut a.validator, &a.keys, &mut a.proofs, &r, true, wall(u64::from(EPOCH_SECS)))
            .unwrap();
        assert_eq!(a.clock.current(), t);
        assert_eq!(a.proofs.hmac_computations(), 0);
    }

    #[test]
    fn correctly_signed_time_beyond_the_drift_limit_gives_205() {
        let mut a = Node::new(4, ct(EPOCH_SECS, 0));
        a.clock = a.clock.clone().with_max_acceptable_drift_secs(60);
        let far = a.sign(ct(EPOCH_SECS + 61, 0));
        let e = a.gossip_in(&far, wall(u64::from(EPOCH_SECS))).unwrap_err();
        assert_eq!((e.code(), e.code_name()), (205, "ClusterTimeFailsRateLimiter"));
        assert_eq!(a.clock.current(), ct(EPOCH_SECS, 0));
        // With the default limit (365 days) too, signed by a key valid that far ahead.
        let mut b = Node::new(4, ct(EPOCH_SECS, 0));
        b.keys = KeyRing::new();
        b.keys.generate(&mut Rng::seed_from_u64(4), ct(EPOCH_SECS, 0), 400 * 86_400);
        let far = b.sign(ct(EPOCH_SECS + 365 * 86_400 + 1, 0));
        assert!(b.keys.get(far.signature.unwrap().key_id).is_some());
        assert_eq!(b.gossip_in(&far, wall(u64::from(EPOCH_SECS))).unwrap_err().code(), 205);
        assert_eq!(b.clock.current(), ct(EPOCH_SECS, 0));
    }

    #[test]
    fn a_signature_covers_exactly_its_65536_range() {
        let base = ct(EPOCH_SECS + 3, 0x0005_0000); // start of a range
        let mut a = Node::new(5, ct(EPOCH_SECS, 0));
        let sig = a.sign(ct(base.secs, base.inc + 1234)).signature.unwrap();
        let w = wall(u64::from(EPOCH_SECS));
        // Outside the range (just below, just above, next second): 204 each time, clock unmoved.
        for t in [ct(base.secs, base.inc - 1), ct(base.secs, base.inc + 0x1_0000), ct(base.secs + 1, base.inc)] {
            let e = a.gossip_in(&SignedClusterTime { time: t, signature: Some(sig) }, w).unwrap_err();
            assert_eq!(e.code(), 204, "{t}");
        }
        assert_eq!(a.clock.current(), ct(EPOCH_SECS, 0));
        // Inside: every time is accepted, with fresh validators so each is really checked.
        let mut checked = 0u64;
        for inc in (base.inc..base.inc + 0x1_0000).step_by(997).chain([base.inc + 0xFFFF]) {
            let t = ct(base.secs, inc);
            let mut v = ClusterTimeValidator::new();
            v.validate(&SignedClusterTime { time: t, signature: Some(sig) }, false, &a.keys, &mut a.proofs).unwrap();
            assert_eq!(v.last_validated(), t);
            checked += 1;
        }
        assert!(checked > 60);
        assert_eq!(signing_range(base), signing_range(ct(base.secs, base.inc + 0xFFFF)));
        assert_eq!(RANGE_LEN, 0x1_0000);
    }

    #[test]
    fn times_at_or_below_the_last_validated_need_no_hmac() {
        let mut a = Node::new(6, ct(EPOCH_SECS, 0));
        let mut b = Node::new(6, ct(EPOCH_SECS, 0)); // same keys (same seed): a replica-set peer
        let high = a.sign(ct(EPOCH_SECS + 20, 0x0003_0000));
        let w = wall(u64::from(EPOCH_SECS));
        b.gossip_in(&high, w).unwrap();
        assert_eq!(b.proofs.hmac_computations(), 1);
        // Older times — even forged or unsigned ones — pass without an HMAC and don't move the
        // clock backwards.
        for r in [
            SignedClusterTime::unsigned(ct(EPOCH_SECS + 1, 0)),
            SignedClusterTime {
                time: ct(EPOCH_SECS + 20, 7),
                signature: Some(Signature { hash: TimeProof([1; 20]), key_id: 99 }),
            },
            high,
        ] {
            b.gossip_in(&r, w).unwrap();
        }
        assert_eq!(b.proofs.hmac_computations(), 1);
        assert_eq!(b.clock.current(), high.time);
        // note_valid also raises the bar.
        let mut v = ClusterTimeValidator::new();
        v.note_valid(ct(9, 9));
        v.note_valid(ct(1, 1));
        assert_eq!(v.last_validated(), ct(9, 9));
    }

    #[test]
    fn a_client_talking_to_two_sets_poisons_neither() {
        let w = wall(u64::from(EPOCH_SECS) + 1_000);
        // Two sets whose keys were created at different times (so their key ids differ).
        let mut a = Node::new(7, ct(EPOCH_SECS, 1));
        let mut b = Node::new(8, ct(EPOCH_SECS + 17, 4));
        let b_start = b.clock.current();
        // The client reads from A and gossips A's (higher) time to B.
        let from_a = a.sign(ct(EPOCH_SECS + 500, 3));
        let e = b.gossip_in(&from_a, w).unwrap_err();
        assert_eq!(e.code(), 211);
        assert_eq!(b.clock.current(), b_start);
        assert_eq!(b.validator.last_validated(), ClusterTime::ZERO);
        // B's own times still work at B, and A's at A.
        let from_b = b.sign(ct(EPOCH_SECS + 600, 1));
        b.gossip_in(&from_b, w).unwrap();
        assert_eq!(b.clock.current(), from_b.time);
        // …and B's time is refused by A, whose clock stays put.
        let a_start = a.clock.current();
        assert_eq!(a.gossip_in(&from_b, w).unwrap_err().code(), 211);
        assert_eq!(a.clock.current(), a_start);
        a.gossip_in(&from_a, w).unwrap();
        assert_eq!(a.clock.current(), from_a.time);
        // Even if the two sets' key ids happened to collide, the other set's hash is refused (204).
        let mut c = Node::new(9, ct(EPOCH_SECS, 1));
        assert_eq!(c.keys.signing_key(from_a.time).unwrap().key_id, from_a.signature.unwrap().key_id);
        assert_eq!(c.gossip_in(&from_a, w).unwrap_err().code(), 204);
        assert_eq!(c.clock.current(), ct(EPOCH_SECS, 1));
    }

    #[test]
    fn an_expired_key_does_not_vouch_for_later_times() {
        let mut a = Node::new(10, ct(100, 0));
        let k1 = a.keys.signing_key(ct(100, 0)).unwrap().clone();
        // A leaked old key signs a time after its expiry: refused with 211 (not vouched for).
        let t = ct(k1.expires_at.secs + 1, 0);
        let r = SignedClusterTime {
            time: t,
            signature: Some(Signature { hash: compute_proof(&k1.bytes, t), key_id: k1.key_id }),
        };
        let e = a.validator.validate(&r, false, &a.keys, &mut a.proofs).unwrap_err();
        assert_eq!(e.code(), 211);
    }

    /// Cluster time runs over several rotation periods; the primary regenerates keys whenever
    /// `needs_new_keys` says so (replicating them to a secondary), expires old ones, and every
    /// time signed just before and just after each rotation validates — at the secondary, and at
    /// a node that restarted (last validated time zero) one period later.
    #[test]
    fn rotation_across_expiries_keeps_signing_and_validation_working() {
        const PERIOD: u32 = 1_000;
        let mut rng = Rng::seed_from_u64(12);
        let mut primary = KeyRing::new().with_retention_secs(PERIOD);
        let mut secondary = KeyRing::new().with_retention_secs(PERIOD);
        let mut proofs = TimeProofService::new();
        let mut sec_proofs = TimeProofService::new();
        let mut sec_validator = ClusterTimeValidator::new();
        let start = ct(EPOCH_SECS, 0);
        let mut signed_around_rotation: Vec<(SignedClusterTime, u32)> = Vec::new();
        let mut key_ids_used = BTreeSet::new();
        // Step through cluster time in 100 s steps for 8 periods, plus the instants around each
        // rotation (an expiry of the then-current key).
        let mut now = start;
        while now.secs < EPOCH_SECS + 8 * PERIOD {
            if primary.needs_new_keys(now) {
                for k in primary.generate(&mut rng, now, PERIOD) {
                    secondary.insert(k);
                }
            }
            primary.expire(now);
            secondary.expire(now);
            assert!(primary.len() <= 4, "history is bounded: {}", primary.len());
            let current = primary.signing_key(now).expect("always a current key").clone();
            assert!(primary.reserve_key(now).is_some(), "always a reserve key");
            key_ids_used.insert(current.key_id);
            // Just before and just after the current key's expiry.
            let e = current.expires_at;
            let before = if e.inc > 0 { ct(e.secs, e.inc - 1) } else { ct(e.secs - 1, crate::MAX_COMPONENT) };
            for t in [before, e] {
                let s = sign(t, &primary, &mut proofs).expect("signing never stops");
                let expect_id = if t < e { current.key_id } else { primary.reserve_key(now).unwrap().key_id };
                assert_eq!(s.signature.unwrap().key_id, expect_id, "{t}");
                sec_validator.validate(&s, false, &secondary, &mut sec_proofs).unwrap();
                signed_around_rotation.push((s, t.secs));
            }
            // An ordinary time at `now`.
            let s = sign(now, &primary, &mut proofs).unwrap();
            ClusterTimeValidator::new().validate(&s, false, &secondary, &mut sec_proofs).unwrap();
            now = ct(now.secs + 100, now.inc + 1);
            // A restarted node at `now` can still validate everything signed within the last
            // period before `now`.
            for (s, secs) in &signed_around_rotation {
                if now.secs <= secs + PERIOD {
                    ClusterTimeValidator::new().validate(s, false, &secondary, &mut sec_proofs).unwrap();
                }
            }
        }
        // Eight periods: at least eight keys took their turn as the current key.
        assert!(key_ids_used.len() >= 8, "{key_ids_used:?}");
        // Old keys were dropped: the first key is gone.
        assert!(primary.get(start.as_u64() as i64).is_none());
    }

    /// 1,000,000 consecutive ticks, one per µs of wall clock, each reply signed for an untrusted
    /// client: range signing computes one HMAC per distinct 65,536-range touched, per-reply
    /// signing one per reply. (A protocol fact, not a speed measurement.)
    #[test]
    fn range_signing_computes_one_hmac_per_range_touched() {
        let mut keys = KeyRing::new();
        let start_wall = SIM_EPOCH.saturating_add(std::time::Duration::from_millis(400));
        keys.generate(&mut Rng::seed_from_u64(13), ct(EPOCH_SECS, 0), DEFAULT_KEY_ROTATION_SECS);
        let mut ranged = TimeProofService::new();
        let mut per_reply = TimeProofService::per_reply();
        let mut clock = LogicalClock::new();
        let mut ranges = BTreeSet::new();
        const N: u64 = 1_000_000;
        for i in 0..N {
            let w = start_wall.saturating_add(std::time::Duration::from_micros(i));
            let t = clock.reserve_ticks(1, w).unwrap();
            ranges.insert(signing_range(t));
            let a = sign_reply(t, false, &keys, &mut ranged).unwrap();
            let b = sign_reply(t, false, &keys, &mut per_reply).unwrap();
            assert_eq!(a, b);
        }
        // The stream crosses one wall-clock second boundary, so it touches two seconds' ranges.
        assert_eq!(clock.current().secs, EPOCH_SECS + 1);
        assert_eq!(ranged.hmac_computations(), ranges.len() as u64);
        assert!(ranges.len() <= 18, "{}", ranges.len());
        assert_eq!(per_reply.hmac_computations(), N);
    }
}
