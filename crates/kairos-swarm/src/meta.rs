//! In-n-Out's 8-byte words and hashed copies.
//!
//! **Metadata word** (one per writer per key per node): `ts:35 | buf:20 | writer:7 | rewrite:1 |
//! verified:1`, most significant first, so comparing words as integers orders tuples by
//! timestamp (ties by buffer, then writer). A word of 0 is "no tuple". A timestamp of all ones
//! is a deletion ([`DELETED_TS`]): nothing can be ordered above it. [`REWRITE`] marks a stale
//! write's second tuple (`crate::safe_guess`, step 3): not the first tuple of its operation.
//!
//! **Lock word** (first word of every out-of-place buffer): the identity (word without the low
//! two bits) of the latest tuple of that buffer raced for, with a 2-bit mode — [`LOCK_READER`]
//! or [`LOCK_WRITER`] ([`LOCK_FREE`] only from the load phase and
//! DM-ABD, which takes no locks). It only grows: a timestamp lock
//! of `X` is taken with `CAS(w → X|mode)` from the word `w` last read, allowed when `w` names an
//! older tuple (or is 0, or `X|FREE`); nobody writes it blindly, so once one side holds `X` on a
//! node the other never does (see [`crate::safe_guess`]).
//!
//! **Copy** (in-place copy and out-of-place buffer body): `[meta][hash][len][value, padded]`
//! where `hash = xxh3(tuple id, len, value)` covers the pointer, so a torn read, a recycled
//! buffer or garbage bytes never decode as a valid copy of another tuple.

use xxhash_rust::xxh3::xxh3_64_with_seed;

pub const TS_BITS: u32 = 35;
pub const TS_MAX: u64 = (1 << TS_BITS) - 1;
/// Timestamp of a deletion.
pub const DELETED_TS: u64 = TS_MAX;
/// One timestamp unit, in nanoseconds of the client's clock (35 bits × 16 ns ≈ 9 minutes).
pub const TS_UNIT_NS: u64 = 16;
pub const VERIFIED: u64 = 1;
/// The flag of a rewritten tuple (module docs). Like [`VERIFIED`] it is not part of the
/// tuple's identity ([`id`]).
pub const REWRITE: u64 = 2;
pub const LOCK_FREE: u64 = 1;
pub const LOCK_READER: u64 = 2;
pub const LOCK_WRITER: u64 = 3;

/// Packs a metadata word.
pub fn pack(ts: u64, buf: u32, writer: u32, verified: bool) -> u64 {
    (ts.min(TS_MAX) << 29) | (u64::from(buf & 0xF_FFFF) << 9) | (u64::from(writer & 0x7F) << 2) | u64::from(verified)
}
pub fn ts(word: u64) -> u64 {
    word >> 29
}
pub fn buf(word: u64) -> u32 {
    ((word >> 9) & 0xF_FFFF) as u32
}
pub fn writer(word: u64) -> u32 {
    ((word >> 2) & 0x7F) as u32
}
pub fn is_verified(word: u64) -> bool {
    word & VERIFIED != 0
}
pub fn is_rewrite(word: u64) -> bool {
    word & REWRITE != 0
}
pub fn is_deleted(word: u64) -> bool {
    word != 0 && ts(word) == DELETED_TS
}
/// The tuple's identity: the word without its flag bits (the same for GUESSED and VERIFIED).
pub fn id(word: u64) -> u64 {
    word & !3
}
/// The lock word of `tuple` in `mode`.
pub fn lock(tuple: u64, mode: u64) -> u64 {
    id(tuple) | mode
}

/// The hash that guards a copy.
pub fn hash(tuple: u64, value: &[u8]) -> u64 {
    xxh3_64_with_seed(value, id(tuple) ^ (value.len() as u64).rotate_left(32))
}

/// Encodes a copy `[meta][hash][len][value padded to 8]`.
pub fn encode_copy(tuple: u64, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(24 + value.len().div_ceil(8) * 8);
    out.extend_from_slice(&tuple.to_le_bytes());
    out.extend_from_slice(&hash(tuple, value).to_le_bytes());
    out.extend_from_slice(&(value.len() as u64).to_le_bytes());
    out.extend_from_slice(value);
    out.resize(24 + value.len().div_ceil(8) * 8, 0);
    out
}

/// Decodes a copy read from memory; `None` if it is torn, garbage or longer than `value_max`.
/// Returns the tuple word it holds and the value.
pub fn decode_copy(bytes: &[u8], value_max: usize) -> Option<(u64, Vec<u8>)> {
    let word = |i: usize| bytes.get(i * 8..i * 8 + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    let (tuple, h, len) = (word(0)?, word(1)?, word(2)?);
    let len = usize::try_from(len).ok().filter(|l| *l <= value_max)?;
    let value = bytes.get(24..24 + len)?;
    (tuple != 0 && hash(tuple, value) == h).then(|| (tuple, value.to_vec()))
}

/// The first 8-byte little-endian word of a read, if it is that long.
pub fn first_word(bytes: &[u8]) -> Option<u64> {
    bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
}

/// 8-byte little-endian words from a read (trailing bytes ignored).
pub fn words(bytes: &[u8]) -> Vec<u64> {
    bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_order_by_timestamp_and_round_trip() {
        let a = pack(5, 1000, 100, false);
        let b = pack(6, 0, 0, false);
        assert!(a < b);
        assert_eq!((ts(a), buf(a), writer(a), is_verified(a)), (5, 1000, 100, false));
        assert!(is_verified(a | VERIFIED) && id(a | VERIFIED) == id(a));
        assert!(is_rewrite(a | REWRITE) && !is_rewrite(a) && id(a | REWRITE | VERIFIED) == id(a));
        assert!(is_deleted(pack(DELETED_TS, 0, 3, true)));
        assert!(pack(DELETED_TS, 0, 0, true) > pack(TS_MAX - 1, 0xF_FFFF, 127, true));
    }

    #[test]
    fn copies_detect_tearing_other_tuples_and_garbage() {
        let t = pack(9, 2, 1, true);
        let c = encode_copy(t, b"hello world");
        assert_eq!(decode_copy(&c, 64), Some((t, b"hello world".to_vec())));
        let mut torn = c.clone();
        torn[30] ^= 1;
        assert_eq!(decode_copy(&torn, 64), None);
        let mut other = c.clone();
        other[..8].copy_from_slice(&pack(10, 2, 1, true).to_le_bytes());
        assert_eq!(decode_copy(&other, 64), None);
        assert_eq!(decode_copy(&c, 4), None, "longer than allowed");
        for garbage in [vec![], vec![0xFF; 7], vec![0xFF; 40], vec![0; 64]] {
            assert_eq!(decode_copy(&garbage, 64), None);
        }
    }
}
