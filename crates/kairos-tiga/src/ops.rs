//! General one-shot transactions: byte-string keys and values, and the deterministic per-key
//! operations a transaction is made of.
//!
//! A transaction is a list of [`Op`]s. Every operation names one key, and whether it reads
//! and/or writes that key is fixed by its kind ([`OpKind::reads`], [`OpKind::writes`]), so the
//! read and write sets are known before anything runs — what Tiga's one-shot model needs. The
//! coordinator splits the list by shard (a key's shard is [`key_id`] mod shards, i.e. xxh3 of
//! the key bytes); each shard's server runs its piece with [`execute`] as a stored procedure in
//! timestamp order. Execution is a pure function of the store and the operations, so every
//! replica that executes the same log reaches the same state. Operations on different keys
//! commute, so running each shard's operations in their transaction order gives the same
//! results as running the whole list in order.
//!
//! The kinds are the Redis string commands one key at a time (multi-key commands such as MGET,
//! MSET or `DEL a b` are several operations): a runtime error (INCRBY on a non-integer) is a
//! result of that operation, not an abort, as in Redis's EXEC.
//!
//! # Versions and the history
//! Besides its value, every key has a **version**: the number of transactions that wrote it
//! (a write bumps it once per transaction, even a SETNX that did not set or a DEL of a missing
//! key). `kairos-check` reasons about integer registers with unique writes, so a transaction's
//! history records, per distinct key, a read of the version it saw (if its first operation on
//! the key reads it) and a write of `version + 1` (if it writes the key) — see
//! [`crate::coordinator`]. For a key only ever incremented by 1 (MicroBench) the version equals
//! the value, so the history is the same as that of the original increment-only procedure.
//!
//! # Limits
//! A value may grow to [`VALUE_BYTES_MAX`] (APPEND beyond it is an error result): values travel
//! in replies and log synchronization, which are framed with a size limit.

use crate::cow_map::BucketKey;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A key or a value: a byte string.
pub type Bytes = Vec<u8>;

/// Largest value a key may hold, bytes (1 MiB: well inside the hosts' frame limit).
pub const VALUE_BYTES_MAX: usize = 1 << 20;

pub use kairos_workload::txn::{history_key, key_id};

/// What one operation does to its key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpKind {
    /// The value, or nil.
    Get,
    /// 1 if the key holds a value, else 0.
    Exists,
    /// The value's length (0 for a missing key).
    Strlen,
    /// Store the value; replies OK.
    Set(#[serde(with = "serde_bytes")] Bytes),
    /// Store the value only if the key holds none; 1 if it was set, else 0.
    SetNx(#[serde(with = "serde_bytes")] Bytes),
    /// Remove the value; 1 if there was one, else 0.
    Del,
    /// Add to the value read as a signed 64-bit decimal integer (missing = 0); the new value,
    /// or an error if the value is not such an integer or the sum overflows.
    IncrBy(i64),
    /// Append to the value (missing = empty); the new length.
    Append(#[serde(with = "serde_bytes")] Bytes),
}

impl OpKind {
    /// Whether the operation's result depends on the key's state before it.
    pub fn reads(&self) -> bool {
        !matches!(self, OpKind::Set(_) | OpKind::Del)
    }
    /// Whether the operation may change the key.
    pub fn writes(&self) -> bool {
        matches!(self, OpKind::Set(_) | OpKind::SetNx(_) | OpKind::Del | OpKind::IncrBy(_) | OpKind::Append(_))
    }
}

/// One operation of a transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    #[serde(with = "serde_bytes")]
    pub key: Bytes,
    pub kind: OpKind,
}

impl Op {
    pub fn new(key: impl Into<Bytes>, kind: OpKind) -> Self {
        Op { key: key.into(), kind }
    }
    /// The MicroBench increment of an integer key (its decimal digits are the key's bytes).
    pub fn increment(key: u64) -> Self {
        Op::new(key.to_string().into_bytes(), OpKind::IncrBy(1))
    }
    /// A read of an integer key (as [`Op::increment`] names it).
    pub fn read(key: u64) -> Self {
        Op::new(key.to_string().into_bytes(), OpKind::Get)
    }
    /// Bytes this operation carries (key and argument), for size limits.
    pub fn payload_bytes(&self) -> usize {
        let arg = match &self.kind {
            OpKind::Set(v) | OpKind::SetNx(v) | OpKind::Append(v) => v.len(),
            _ => 8,
        };
        self.key.len() + arg
    }
}

/// Why an operation failed at run time (its result; the transaction still commits).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Error)]
pub enum OpError {
    #[error("ERR value is not an integer or out of range")]
    NotInteger,
    #[error("ERR increment or decrement would overflow")]
    Overflow,
    #[error("ERR string exceeds maximum allowed size (1 MiB in Kairos)")]
    TooLarge,
}

/// The result of one operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpOutput {
    Ok,
    Nil,
    Int(i64),
    Bulk(#[serde(with = "serde_bytes")] Bytes),
    Error(OpError),
}

/// A key's state: its value (none: missing or deleted) and its version (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    pub value: Option<InlineBytes>,
    pub version: u64,
}

/// A byte string as the store keeps its keys and values: inside the table's entry when it is
/// short (MicroBench's keys and counters, most Redis keys), so that finding a key compares
/// bytes already in the cache line the table probe loaded and reading a counter needs no
/// further load, where a `Vec<u8>` is a pointer to chase to another line each time (a profile
/// of a leader put 6 % of its time in the key comparisons alone). Ordered, hashed and
/// serialized as its bytes (the encoding of a `Vec<u8>`, so checkpoints written before read
/// back the same).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InlineBytes(smallvec::SmallVec<[u8; 16]>);

/// A key of the store.
pub type StoreKey = InlineBytes;

impl InlineBytes {
    pub fn new(bytes: &[u8]) -> Self {
        InlineBytes(smallvec::SmallVec::from_slice(bytes))
    }
}

impl std::ops::Deref for InlineBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::borrow::Borrow<[u8]> for InlineBytes {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

impl BucketKey for InlineBytes {
    fn bucket_hash(&self) -> u64 {
        self.0.as_slice().bucket_hash()
    }
}

impl Serialize for InlineBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for InlineBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes = serde_bytes::ByteBuf::deserialize(d)?;
        Ok(InlineBytes(smallvec::SmallVec::from_vec(bytes.into_vec())))
    }
}

/// A shard's data: its keys (a deleted key keeps its entry and version, with no value) and,
/// in a TPC-C deployment, its warehouses ([`crate::tpcc`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Store {
    pub keys: crate::cow_map::CowMap<StoreKey, Entry>,
    pub tpcc: Option<crate::tpcc::TpccShard>,
}

impl Store {
    pub fn new() -> Self {
        Store::default()
    }
    /// A key's state, if it was ever written.
    pub fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.keys.get(key)
    }
}

/// The distinct keys of `ops` in order of first appearance, with whether the first operation
/// on each reads it and whether any operation writes it.
pub fn distinct_keys(ops: &[Op]) -> Vec<(&[u8], bool, bool)> {
    let mut out: Vec<(&[u8], bool, bool)> = Vec::new();
    for op in ops {
        match out.iter_mut().find(|(k, _, _)| *k == op.key.as_slice()) {
            Some(e) => e.2 |= op.kind.writes(),
            None => out.push((&op.key, op.kind.reads(), op.kind.writes())),
        }
    }
    out
}

/// What [`execute`] did: an output per operation, the version of each distinct key before it
/// ran (in [`distinct_keys`] order), and what to restore to undo it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Execution {
    pub outputs: Vec<OpOutput>,
    pub versions: Vec<u64>,
    pub undo: Vec<(StoreKey, Option<Entry>)>,
}

/// Runs `ops` on `store` in order (see the module docs), remembering what they overwrote (a
/// speculative execution, which [`undo`] reverts). Deterministic.
pub fn execute(store: &mut Store, ops: &[Op]) -> Execution {
    run(store, ops, true)
}

/// Runs `ops` on `store` for good: [`execute`] without the undo record (the committed state).
pub fn execute_final(store: &mut Store, ops: &[Op]) -> Execution {
    run(store, ops, false)
}

/// One lookup per distinct key for its version, and one per writing operation, which also
/// creates the entry (every written key has one afterwards, at `version + 1`).
fn run(store: &mut Store, ops: &[Op], keep_undo: bool) -> Execution {
    let keys = distinct_keys(ops);
    let mut versions = Vec::with_capacity(keys.len());
    let mut undo = Vec::new();
    for (k, _, written) in &keys {
        let old = store.keys.get(*k);
        versions.push(old.map_or(0, |e| e.version));
        if *written && keep_undo {
            undo.push((StoreKey::new(k), old.cloned()));
        }
    }
    // Whether each distinct key's version was bumped yet (once per transaction).
    let mut bumped = vec![false; keys.len()];
    let outputs = ops
        .iter()
        .map(|op| {
            let k = op.key.as_slice();
            if !op.kind.writes() {
                return read(store.keys.get(k).and_then(|e| e.value.as_ref()), &op.kind);
            }
            let i = keys.iter().position(|(d, _, _)| *d == k).expect("a distinct key of ops");
            let e = store.keys.get_mut_or_insert_with(k, StoreKey::new, Entry::default);
            if !bumped[i] {
                bumped[i] = true;
                e.version = versions[i] + 1;
            }
            write(&mut e.value, &op.kind)
        })
        .collect();
    Execution { outputs, versions, undo }
}

/// Restores what an [`Execution`] changed (its `undo`, newest first).
pub fn undo(store: &mut Store, undo: Vec<(StoreKey, Option<Entry>)>) {
    for (k, old) in undo.into_iter().rev() {
        match old {
            Some(e) => store.keys.insert(k, e),
            None => store.keys.remove(&*k),
        };
    }
}

/// Parses a value as Redis does for INCRBY: a signed 64-bit decimal, no spaces or `+`.
pub fn parse_int(v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?;
    if s.is_empty() || s.starts_with('+') || (s.len() > 1 && (s.starts_with('0') || s.starts_with("-0"))) {
        return None;
    }
    s.parse().ok()
}

/// A reading operation on a key's value.
fn read(value: Option<&InlineBytes>, kind: &OpKind) -> OpOutput {
    match kind {
        OpKind::Get => value.map_or(OpOutput::Nil, |v| OpOutput::Bulk(v.to_vec())),
        OpKind::Exists => OpOutput::Int(i64::from(value.is_some())),
        OpKind::Strlen => OpOutput::Int(value.map_or(0, |v| v.len() as i64)),
        _ => unreachable!("{kind:?} writes"),
    }
}

/// A writing operation on a key's value (none: missing or deleted).
fn write(value: &mut Option<InlineBytes>, kind: &OpKind) -> OpOutput {
    match kind {
        OpKind::Get | OpKind::Exists | OpKind::Strlen => read(value.as_ref(), kind),
        OpKind::Set(v) => {
            if v.len() > VALUE_BYTES_MAX {
                return OpOutput::Error(OpError::TooLarge);
            }
            *value = Some(InlineBytes::new(v));
            OpOutput::Ok
        }
        OpKind::SetNx(v) => {
            if value.is_some() {
                return OpOutput::Int(0);
            }
            if v.len() > VALUE_BYTES_MAX {
                return OpOutput::Error(OpError::TooLarge);
            }
            *value = Some(InlineBytes::new(v));
            OpOutput::Int(1)
        }
        OpKind::Del => {
            let had = value.is_some();
            *value = None;
            OpOutput::Int(i64::from(had))
        }
        OpKind::IncrBy(by) => {
            let cur = match value {
                None => 0,
                Some(v) => match parse_int(v) {
                    Some(n) => n,
                    None => return OpOutput::Error(OpError::NotInteger),
                },
            };
            match cur.checked_add(*by) {
                Some(n) => {
                    // Written over the old digits: no allocation once the value exists.
                    let v = &mut value.get_or_insert_with(InlineBytes::default).0;
                    v.clear();
                    v.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
                    OpOutput::Int(n)
                }
                None => OpOutput::Error(OpError::Overflow),
            }
        }
        OpKind::Append(tail) => {
            let len = value.as_ref().map_or(0, |v| v.len());
            if len + tail.len() > VALUE_BYTES_MAX {
                return OpOutput::Error(OpError::TooLarge);
            }
            let v = &mut value.get_or_insert_with(InlineBytes::default).0;
            v.extend_from_slice(tail);
            OpOutput::Int(v.len() as i64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(k: &str, kind: OpKind) -> Op {
        Op::new(k.as_bytes().to_vec(), kind)
    }

    /// Byte strings are serialized as bytes (one copy, not a call per byte), which postcard
    /// encodes exactly as it encoded them as sequences of `u8`: journals, checkpoints and frames
    /// written before read back the same. The plain types below are the encoding before.
    #[test]
    fn byte_strings_keep_their_postcard_encoding() {
        #[derive(Serialize)]
        enum PlainKind {
            _Get,
            _Exists,
            _Strlen,
            Set(Vec<u8>),
        }
        #[derive(Serialize)]
        struct PlainOp {
            key: Vec<u8>,
            kind: PlainKind,
        }
        #[derive(Serialize)]
        struct PlainEntry {
            value: Option<Vec<u8>>,
            version: u64,
        }
        let long = vec![7u8; 300]; // a length of two varint bytes
        let ours = op("k1", OpKind::Set(long.clone()));
        let plain = PlainOp { key: b"k1".to_vec(), kind: PlainKind::Set(long.clone()) };
        assert_eq!(postcard::to_allocvec(&ours).unwrap(), postcard::to_allocvec(&plain).unwrap());
        for value in [None, Some(Vec::new()), Some(long)] {
            let entry = Entry { value: value.as_deref().map(InlineBytes::new), version: 3 };
            let bytes = postcard::to_allocvec(&entry).unwrap();
            assert_eq!(bytes, postcard::to_allocvec(&PlainEntry { value, version: 3 }).unwrap());
            assert_eq!(postcard::from_bytes::<Entry>(&bytes).unwrap(), entry);
        }
        let bytes = postcard::to_allocvec(&ours).unwrap();
        assert_eq!(postcard::from_bytes::<Op>(&bytes).unwrap(), ours);
        // Store keys too (checkpoint pages), short and long.
        for key in [b"k1".to_vec(), vec![9u8; 300]] {
            let bytes = postcard::to_allocvec(&StoreKey::new(&key)).unwrap();
            assert_eq!(bytes, postcard::to_allocvec(&key).unwrap());
            assert_eq!(&*postcard::from_bytes::<StoreKey>(&bytes).unwrap(), key.as_slice());
        }
    }

    #[test]
    fn redis_semantics_per_kind() {
        let mut s = Store::new();
        let e = execute(
            &mut s,
            &[
                op("a", OpKind::Get),
                op("a", OpKind::Set(b"10".to_vec())),
                op("a", OpKind::IncrBy(-3)),
                op("a", OpKind::Append(b"x".to_vec())),
                op("a", OpKind::IncrBy(1)),
                op("a", OpKind::Strlen),
                op("b", OpKind::SetNx(b"1".to_vec())),
                op("b", OpKind::SetNx(b"2".to_vec())),
                op("b", OpKind::Exists),
                op("c", OpKind::Del),
                op("b", OpKind::Del),
                op("b", OpKind::Exists),
            ],
        );
        assert_eq!(
            e.outputs,
            vec![
                OpOutput::Nil,
                OpOutput::Ok,
                OpOutput::Int(7),
                OpOutput::Int(2),
                OpOutput::Error(OpError::NotInteger),
                OpOutput::Int(2),
                OpOutput::Int(1),
                OpOutput::Int(0),
                OpOutput::Int(1),
                OpOutput::Int(0),
                OpOutput::Int(1),
                OpOutput::Int(0),
            ]
        );
        assert_eq!(e.versions, vec![0, 0, 0]);
        // One version bump per written key per transaction.
        assert_eq!(s.keys[b"a".as_slice()], Entry { value: Some(InlineBytes::new(b"7x")), version: 1 });
        assert_eq!(s.keys[b"b".as_slice()].version, 1);
        assert_eq!(s.keys[b"c".as_slice()], Entry { value: None, version: 1 });
        // Overflow and undo.
        let before = s.clone();
        let e = execute(&mut s, &[op("n", OpKind::IncrBy(i64::MAX)), op("n", OpKind::IncrBy(1)), op("a", OpKind::Get)]);
        assert_eq!(e.outputs[1], OpOutput::Error(OpError::Overflow));
        assert_eq!(e.versions, vec![0, 1]);
        undo(&mut s, e.undo);
        assert_eq!(s, before);
        // The committed path runs the same, without an undo record.
        let ops = [op("n", OpKind::IncrBy(5)), op("a", OpKind::Get), op("z", OpKind::Del), op("n", OpKind::Get)];
        let (mut spec, mut fin) = (s.clone(), s.clone());
        let (e, f) = (execute(&mut spec, &ops), execute_final(&mut fin, &ops));
        assert_eq!((&e.outputs, &e.versions, spec), (&f.outputs, &f.versions, fin));
        assert!(f.undo.is_empty() && e.undo.len() == 2);
    }

    #[test]
    fn integers_parse_as_redis_does() {
        for ok in ["0", "-1", "9223372036854775807", "-9223372036854775808", "42"] {
            assert!(parse_int(ok.as_bytes()).is_some(), "{ok}");
        }
        for bad in ["", "+1", " 1", "1 ", "01", "-0", "1.5", "9223372036854775808", "abc"] {
            assert!(parse_int(bad.as_bytes()).is_none(), "{bad}");
        }
    }

    #[test]
    fn read_and_write_sets() {
        let ops =
            [op("a", OpKind::Set(vec![])), op("a", OpKind::Get), op("b", OpKind::Get), op("c", OpKind::IncrBy(1))];
        let d = distinct_keys(&ops);
        assert_eq!(
            d,
            vec![(b"a".as_slice(), false, true), (b"b".as_slice(), true, false), (b"c".as_slice(), true, true)]
        );
        assert_eq!(Op::increment(17).key, b"17".to_vec());
    }
}
