//! # kairos-clock — clocks, skewed and logical
//!
//! Kairos's protocols trust clocks (Tiga's timestamps, SWARM's Safe-Guess, MongoDB's cluster
//! time), so how good a node's clock is must be a parameter of every experiment. This crate
//! holds every clock a Kairos node can have:
//!
//! * [`SimClock`] — the simulator's model of one node's clock, turning true time ([`SimTime`])
//!   into a skewed reading ([`LocalTime`], ns since the Unix epoch). The simulator calls
//!   [`SimClock::read`] before each handler and hands the result to the role as `ctx.now()`.
//! * [`ClockPreset`] — named synchronization qualities measured in the Tiga paper, each of
//!   which [`samples`](ClockPreset::sample) a `SimClock` per node from the run's seed.
//! * [`SystemClock`] — the real clock, for the TCP host only.
//! * [`LogicalClock`] / [`ClusterTime`] — MongoDB's hybrid logical clock.
//! * [`TimeProofService`], [`KeyRing`], [`ClusterTimeValidator`], [`sign_reply`] — the HMAC
//!   signatures that stop a client from pushing the cluster clock.
//!
//! Everything except `SystemClock` is deterministic: no wall clock, no thread-local randomness,
//! no hash-map iteration; randomness comes from a [`Rng`](kairos_core::Rng) the caller seeds.
//!
//! ## The simulated clock
//!
//! ```text
//! reading(t) = SIM_EPOCH + t + offset + ⌊drift_ppb · t / 10⁹⌋ + Σ steps(at ≤ t) + jitter
//! ```
//!
//! saturated to `[0, u64::MAX]`. [`SIM_EPOCH`] is 2026-01-01T00:00:00Z, so a perfect clock at
//! the start of a run reads a realistic Unix time (and MongoDB's cluster time, in whole seconds,
//! starts at 1 767 225 600). Offset is constant, drift is integer parts per billion, jitter is
//! uniform in `±jitter_ns` per reading (drawn from the rng passed to `read`), and steps jump the
//! clock forward or backward at scheduled true times ([`SimClock::add_step`]) or right away
//! ([`SimClock::step_now`]). Readings are monotonic by default — jitter is clamped so a reading
//! never goes below the previous one — except that a backward step moves the clock back by
//! exactly its size; see [`sim_clock`] for the precise guarantee.
//!
//! ## Presets
//!
//! With `E` the synchronization error of the Tiga paper (Table 3), a preset draws the offset
//! from Normal(0, E·√(π/2)) (mean |offset| = E), a drift uniform in ±E/2400 ppb (at most E/4
//! after 10 minutes), a jitter bound of E/10, and — for `bad` only — clock steps:
//!
//! | preset    | `E`       | offset σ  | drift ≤      | jitter    | steps |
//! |-----------|----------:|----------:|-------------:|----------:|-------|
//! | `perfect` | 0         | 0         | 0            | 0         | —     |
//! | `huygens` | 0.012 ms  | 15.04 µs  | 5 ppb        | ±1.2 µs   | —     |
//! | `chrony`  | 4.54 ms   | 5.690 ms  | 1.891 ppm    | ±454 µs   | —     |
//! | `ntpd`    | 16.45 ms  | 20.617 ms | 6.854 ppm    | ±1.645 ms | —     |
//! | `bad`     | 62.55 ms  | 78.394 ms | 26.062 ppm   | ±6.255 ms | ~every 30 s for the first hour, each to a fresh offset draw |
//!
//! A test samples thousands of nodes per preset and checks that the mean |reading − true time|
//! is within 0.9–1.1× of `E`. Details in [`preset`].
//!
//! ## Cluster time (MongoDB)
//!
//! [`ClusterTime`] is `(secs: u32, inc: u32)` ordered as `secs << 32 | inc`. A
//! [`LogicalClock`] ticks only when a primary writes ([`LogicalClock::reserve_ticks`]: jump to
//! `(wall_secs, 0)` if behind the wall clock, else roll to `(secs + 1, 0)` if `inc + n` would
//! pass 2³¹−1; the write gets the clock + 1 and the clock ends at the last reserved time;
//! passing `Timestamp(2³¹−1, 2³¹−1)` fails, code 40482). On gossip it takes the max without
//! ticking ([`LogicalClock::advance`]), after a rate limiter that rejects times more than
//! `max_acceptable_drift_secs` (default 365 days) ahead of its wall clock with
//! `ClusterTimeFailsRateLimiter` (205). Errors carry MongoDB's codes ([`ClusterTimeError::code`]).
//! [`cluster_time`] only ever sees times whose signatures were already checked; the signing layer
//! below does the checking. [`LogicalClock::check_after_cluster_time`] refuses a
//! `readConcern.afterClusterTime` beyond the clock with `InvalidOptions` (72).
//!
//! ## Signed cluster time
//!
//! Every `$clusterTime` is a [`SignedClusterTime`]: the time plus a [`Signature`] `{hash, keyId}`.
//!
//! * **Proofs** ([`time_proof`]): `hash = HMAC-SHA1(key, le_u64(secs << 32 | inc | 0xFFFF))`, so
//!   one proof covers 65,536 consecutive times. [`TimeProofService`] caches the last proof (key +
//!   range), which cuts HMACs from one per reply to one per range touched — about 16 per second
//!   at a million writes per second; a per-reply mode and an HMAC counter
//!   ([`TimeProofService::hmac_computations`]) let a benchmark measure the difference. Proofs are
//!   compared in constant time.
//! * **Keys** ([`keys`]): a [`KeyRing`] of [`SigningKey`]s (20 random bytes from the caller's
//!   seeded rng; id = cluster time at creation; `expires_at`), generated by the primary so that
//!   there is always a current key and a reserve key, rotated every 90 days of cluster time by
//!   default, replicated to the other members with [`KeyRing::insert`], and kept one extra period
//!   after expiry for validation ([`KeyRing::expire`]; the rule is in [`keys`]).
//! * **Replies** ([`signed`]): [`sign_reply`] gives a trusted recipient (one holding
//!   `advanceClusterTime`) the dummy signature (20 zero bytes, keyId 0), an untrusted one a real
//!   signature, and — when the node has no key — nothing, meaning omit `$clusterTime` and
//!   `operationTime`. An untrusted recipient never gets the dummy.
//! * **Validation** ([`validator`]): [`ClusterTimeValidator::validate`] accepts trusted senders
//!   unchecked and times at or below the last validated time without an HMAC; otherwise a
//!   missing signature or unknown key is `KeyNotFound` (211) and a wrong hash
//!   `TimeProofMismatch` (204). [`gossip_in`] validates and then advances the clock through the
//!   rate limiter (205); the clock moves only if both succeed.

pub mod cluster_time;
pub mod keys;
pub mod preset;
pub mod signed;
pub mod sim_clock;
mod system_clock;
pub mod time_proof;
pub mod validator;

pub use cluster_time::{
    AdvanceKind, ClusterTime, ClusterTimeError, LogicalClock, WideTime, DEFAULT_MAX_ACCEPTABLE_DRIFT_SECS,
    MAX_COMPONENT,
};
pub use keys::{KeyRing, SigningKey, DEFAULT_KEY_RETENTION_SECS, DEFAULT_KEY_ROTATION_SECS};
pub use preset::{ClockPreset, PresetParams, UnknownClockPreset};
pub use signed::{sign, sign_reply, Signature, SignedClusterTime};
pub use sim_clock::{SimClock, Step, MAX_DRIFT_PPB, SIM_EPOCH, SIM_EPOCH_NS};
pub use system_clock::SystemClock;
pub use time_proof::{
    compute_proof, signing_range, KeyBytes, TimeProof, TimeProofService, PROOF_LEN, RANGE_LEN, RANGE_MASK,
};
pub use validator::{gossip_in, ClusterTimeValidator};

#[doc(no_inline)]
pub use kairos_core::{LocalTime, SimTime};
