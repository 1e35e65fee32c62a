//! MongoDB drivers against the replica set: the wire protocol ([`wire`]) and the pieces of
//! command execution that do not touch a member's state (filters, projections, updates,
//! `$clusterTime` in BSON, error documents). The member executes commands in
//! `member/mongo_exec.rs`; the TCP listener lives in the `kairos` binary
//! (`kairos serve … --mongo-listen ADDR`).
//!
//! ## Documents
//! A namespace (`db.collection`) maps a document's `_id` to its versions. The key is the BSON
//! encoding of `{_id: value}` ([`id_key`], integral numbers as Int64), so two `_id`s are the same
//! when their bytes are (except that `1`, `1L` and `1.0` are one id, as in MongoDB; other
//! values that MongoDB deems equal, like documents with reordered fields, are not). Writes reach the
//! oplog as [`crate::msg::Op::Docs`]: full documents to put and ids to delete, computed on the
//! primary (like MongoDB's idempotent oplog), so secondaries, rollback and majority reads treat
//! them like any other entry.
//!
//! ## Supported subset
//! * Filters: equality on top-level fields (`{a: 1}` or `{a: {$eq: 1}}`), numbers compared by
//!   value; anything else is BadValue (2).
//! * Projections: inclusion or exclusion of top-level fields.
//! * Updates: a replacement document, or `$set` / `$inc` / `$unset` on top-level fields.
//! * No sort (a non-empty `sort` is BadValue), no indexes besides `_id`, no transactions.

pub mod wire;

use bson::{doc, Bson, Document};
use kairos_clock::{ClusterTime, Signature, SignedClusterTime, TimeProof};

/// MongoDB error codes of the document commands (the replication ones are in `msg::codes`).
pub mod codes {
    pub const BAD_VALUE: i32 = 2;
    pub const FAILED_TO_PARSE: i32 = 9;
    pub const UNSUPPORTED_FORMAT: i32 = 12;
    pub const CURSOR_NOT_FOUND: i32 = 43;
    pub const COMMAND_NOT_FOUND: i32 = 59;
    pub const TRANSACTION_TOO_OLD: i32 = 225;
    pub const DUPLICATE_KEY: i32 = 11000;
    pub const NOT_PRIMARY_NO_SECONDARY_OK: i32 = 13435;
    pub const BSON_OBJECT_TOO_LARGE: i32 = 10334;
    pub const ILLEGAL_OPERATION: i32 = 20;
    pub const NAMESPACE_NOT_FOUND: i32 = 26;
    /// A retry of a write whose record says it was applied in part (not retryable).
    pub const INCOMPLETE_TRANSACTION_HISTORY: i32 = 217;
    /// Too many sessions hold retryable-write records.
    pub const TOO_MANY_LOGICAL_SESSIONS: i32 = 261;
    /// `getMore` without a session on a cursor opened in one.
    pub const CURSOR_SESSION_MISSING: i32 = 50737;
    /// `getMore` in another session than the cursor's.
    pub const CURSOR_SESSION_MISMATCH: i32 = 50738;

    pub fn name(code: i32) -> &'static str {
        match code {
            BAD_VALUE => "BadValue",
            FAILED_TO_PARSE => "FailedToParse",
            UNSUPPORTED_FORMAT => "UnsupportedFormat",
            CURSOR_NOT_FOUND => "CursorNotFound",
            COMMAND_NOT_FOUND => "CommandNotFound",
            TRANSACTION_TOO_OLD => "TransactionTooOld",
            DUPLICATE_KEY => "DuplicateKey",
            NOT_PRIMARY_NO_SECONDARY_OK => "NotPrimaryNoSecondaryOk",
            BSON_OBJECT_TOO_LARGE => "BSONObjectTooLarge",
            ILLEGAL_OPERATION => "IllegalOperation",
            NAMESPACE_NOT_FOUND => "NamespaceNotFound",
            INCOMPLETE_TRANSACTION_HISTORY => "IncompleteTransactionHistory",
            TOO_MANY_LOGICAL_SESSIONS => "TooManyLogicalSessions",
            CURSOR_SESSION_MISSING => "Location50737",
            CURSOR_SESSION_MISMATCH => "Location50738",
            c => crate::msg::codes::name(c),
        }
    }

    /// Errors after which a driver may retry a write (MongoDB labels them `RetryableWriteError`).
    pub fn retryable_write(code: i32) -> bool {
        matches!(code, 6 | 7 | 89 | 91 | 189 | 262 | 9001 | 10107 | 11600 | 11602 | 13435 | 13436)
    }
}

/// A command error: `{ok: 0, errmsg, code, codeName}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandError {
    pub code: i32,
    pub errmsg: String,
}

impl CommandError {
    pub fn new(code: i32, errmsg: impl Into<String>) -> Self {
        CommandError { code, errmsg: errmsg.into() }
    }
    pub fn bad_value(errmsg: impl Into<String>) -> Self {
        Self::new(codes::BAD_VALUE, errmsg)
    }
    pub fn to_document(&self) -> Document {
        doc! { "ok": 0.0, "errmsg": self.errmsg.clone(), "code": self.code, "codeName": codes::name(self.code) }
    }
}

impl From<&kairos_clock::ClusterTimeError> for CommandError {
    fn from(e: &kairos_clock::ClusterTimeError) -> Self {
        CommandError::new(e.code(), e.to_string())
    }
}

pub type CmdResult<T> = Result<T, CommandError>;

/// A cluster time as a BSON Timestamp.
pub fn timestamp(t: ClusterTime) -> Bson {
    Bson::Timestamp(bson::Timestamp { time: t.secs, increment: t.inc })
}

/// Reads a BSON Timestamp as a cluster time.
pub fn cluster_time_of(b: &Bson) -> Option<ClusterTime> {
    match b {
        Bson::Timestamp(ts) => Some(ClusterTime::new(ts.time, ts.increment)),
        _ => None,
    }
}

/// `$clusterTime` as sent in replies.
pub fn signed_to_bson(s: &SignedClusterTime) -> Document {
    let sig = s.signature.unwrap_or(Signature::DUMMY);
    doc! {
        "clusterTime": timestamp(s.time),
        "signature": {
            "hash": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: sig.hash.0.to_vec() }),
            "keyId": sig.key_id,
        },
    }
}

/// Parses a client's `$clusterTime`. A hash that is not 20 bytes is UnsupportedFormat (12), as
/// in MongoDB; a missing signature is accepted here (the validator then answers KeyNotFound
/// unless the time needs no proof).
pub fn signed_from_bson(b: &Bson) -> CmdResult<SignedClusterTime> {
    let d = b.as_document().ok_or_else(|| CommandError::bad_value("$clusterTime must be a document"))?;
    let time = d
        .get("clusterTime")
        .and_then(cluster_time_of)
        .ok_or_else(|| CommandError::bad_value("$clusterTime.clusterTime must be a Timestamp"))?;
    let Some(sig) = d.get("signature") else { return Ok(SignedClusterTime::unsigned(time)) };
    let sig = sig.as_document().ok_or_else(|| CommandError::bad_value("$clusterTime.signature must be a document"))?;
    let hash = match sig.get("hash") {
        Some(Bson::Binary(b)) => b.bytes.as_slice(),
        _ => return Err(CommandError::bad_value("$clusterTime.signature.hash must be BinData")),
    };
    let hash: [u8; 20] = hash.try_into().map_err(|_| {
        CommandError::new(codes::UNSUPPORTED_FORMAT, format!("Unsupported SHA1Block hash length: {}", hash.len()))
    })?;
    let key_id = match sig.get("keyId") {
        Some(Bson::Int64(k)) => *k,
        Some(Bson::Int32(k)) => i64::from(*k),
        _ => return Err(CommandError::bad_value("$clusterTime.signature.keyId must be a long")),
    };
    Ok(SignedClusterTime { time, signature: Some(Signature { hash: TimeProof(hash), key_id }) })
}

/// The store key of an `_id` value: the BSON bytes of `{_id: value}`, with integral numbers
/// (Int32, Int64, a Double without fraction that a long holds exactly) written as Int64, so
/// `1`, `1L` and `1.0` are one `_id` as in MongoDB, and two `_id`s are one key exactly when
/// [`values_equal`] says so.
pub fn id_key(id: &Bson) -> Vec<u8> {
    let id = match id {
        Bson::Int32(v) => Bson::Int64(i64::from(*v)),
        Bson::Double(d) if double_as_long(*d).is_some() => Bson::Int64(*d as i64),
        other => other.clone(),
    };
    let mut out = Vec::new();
    let _ = doc! { "_id": id }.to_writer(&mut out);
    out
}

/// Numbers compare by exact value across Int32 / Int64 / Double, as in MongoDB (`2^53 + 1` as
/// a long is not the double `2^53`, which a comparison through `f64` would call equal; `NaN`
/// matches `NaN`); everything else by BSON equality.
pub fn values_equal(a: &Bson, b: &Bson) -> bool {
    match (as_i64(a), as_i64(b), a, b) {
        (Some(x), Some(y), _, _) => x == y,
        (Some(i), None, _, Bson::Double(d)) | (None, Some(i), Bson::Double(d), _) => double_equals_long(*d, i),
        (None, None, Bson::Double(x), Bson::Double(y)) => x == y || (x.is_nan() && y.is_nan()),
        _ => a == b,
    }
}

fn as_i64(b: &Bson) -> Option<i64> {
    match b {
        Bson::Int32(v) => Some(i64::from(*v)),
        Bson::Int64(v) => Some(*v),
        _ => None,
    }
}

/// Whether a double holds exactly this long: integral and inside the long range (so the cast
/// is exact), then equal.
fn double_equals_long(d: f64, i: i64) -> bool {
    double_as_long(d) == Some(i)
}

/// The long equal to `d`, if one is (`d` integral and in `[-2^63, 2^63)`).
fn double_as_long(d: f64) -> Option<i64> {
    const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
    (d.fract() == 0.0 && (-TWO_POW_63..TWO_POW_63).contains(&d)).then_some(d as i64)
}

fn as_f64(b: &Bson) -> Option<f64> {
    match b {
        Bson::Int32(v) => Some(f64::from(*v)),
        Bson::Int64(v) => Some(*v as f64),
        Bson::Double(v) => Some(*v),
        _ => None,
    }
}

/// A checked filter: `(field, value)` equalities on top-level fields.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filter {
    pub equals: Vec<(String, Bson)>,
}

impl Filter {
    pub fn parse(filter: Option<&Document>) -> CmdResult<Filter> {
        let mut equals = Vec::new();
        for (k, v) in filter.into_iter().flatten() {
            if k.starts_with('$') || k.contains('.') {
                return Err(CommandError::bad_value(format!(
                    "filter field `{k}` is not supported: only equality on top-level fields"
                )));
            }
            let v = match v {
                Bson::Document(d) if d.keys().any(|k| k.starts_with('$')) => {
                    if d.len() == 1 && d.contains_key("$eq") {
                        d.get("$eq").cloned().unwrap_or(Bson::Null)
                    } else {
                        return Err(CommandError::bad_value(format!(
                            "filter on `{k}` uses an operator other than $eq; only equality is supported"
                        )));
                    }
                }
                v => v.clone(),
            };
            equals.push((k.clone(), v));
        }
        Ok(Filter { equals })
    }

    /// The `_id` the filter pins, if it has one.
    pub fn id(&self) -> Option<&Bson> {
        self.equals.iter().find(|(k, _)| k == "_id").map(|(_, v)| v)
    }

    pub fn matches(&self, d: &Document) -> bool {
        self.equals.iter().all(|(k, v)| match d.get(k) {
            Some(x) => values_equal(x, v),
            None => matches!(v, Bson::Null),
        })
    }
}

/// Applies a projection (inclusion or exclusion of top-level fields).
pub fn project(d: &Document, projection: Option<&Document>) -> CmdResult<Document> {
    let Some(p) = projection.filter(|p| !p.is_empty()) else { return Ok(d.clone()) };
    let truthy = |b: &Bson| match b {
        Bson::Boolean(x) => Ok(*x),
        b => as_f64(b).map(|x| x != 0.0).ok_or_else(|| CommandError::bad_value("projection values must be 0/1")),
    };
    let mut include = None;
    for (k, v) in p {
        if k == "_id" {
            continue;
        }
        let t = truthy(v)?;
        if include.is_some_and(|i| i != t) {
            return Err(CommandError::bad_value("a projection cannot mix inclusion and exclusion"));
        }
        include = Some(t);
    }
    let keep_id = match p.get("_id") {
        Some(v) => truthy(v)?,
        None => true,
    };
    let mut out = Document::new();
    for (k, v) in d {
        let listed = p.contains_key(k);
        let keep = if k == "_id" {
            keep_id
        } else {
            match include {
                Some(true) => listed,
                _ => !listed,
            }
        };
        if keep {
            out.insert(k.clone(), v.clone());
        }
    }
    Ok(out)
}

/// An update: a replacement document or top-level operators.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    Replace(Document),
    /// `$set`, `$inc`, `$unset`, and `$push` of one value onto a top-level array.
    Ops {
        set: Document,
        inc: Document,
        unset: Vec<String>,
        push: Document,
    },
}

impl Update {
    pub fn parse(u: &Bson) -> CmdResult<Update> {
        let u = u
            .as_document()
            .ok_or_else(|| CommandError::new(codes::FAILED_TO_PARSE, "update must be a document (no pipelines)"))?;
        if !u.keys().any(|k| k.starts_with('$')) {
            return Ok(Update::Replace(u.clone()));
        }
        let (mut set, mut inc, mut unset, mut push) = (Document::new(), Document::new(), Vec::new(), Document::new());
        for (op, fields) in u {
            let fields = fields
                .as_document()
                .ok_or_else(|| CommandError::new(codes::FAILED_TO_PARSE, format!("{op} needs a document")))?;
            for (k, v) in fields {
                if k.contains('.') || k.starts_with('$') || k == "_id" {
                    return Err(CommandError::bad_value(format!(
                        "{op} on `{k}` is not supported (top-level, not _id)"
                    )));
                }
                match op.as_str() {
                    "$set" => {
                        set.insert(k.clone(), v.clone());
                    }
                    "$inc" => {
                        if as_f64(v).is_none() {
                            return Err(CommandError::new(
                                14,
                                format!("Cannot increment with non-numeric argument: {{{k}: {v}}}"),
                            ));
                        }
                        inc.insert(k.clone(), v.clone());
                    }
                    "$unset" => unset.push(k.clone()),
                    "$push" => {
                        if v.as_document().is_some_and(|d| d.keys().any(|k| k.starts_with('$'))) {
                            return Err(CommandError::bad_value("$push modifiers ($each, …) are not supported"));
                        }
                        push.insert(k.clone(), v.clone());
                    }
                    _ => {
                        return Err(CommandError::new(
                            codes::FAILED_TO_PARSE,
                            format!("update operator {op} is not supported (only $set, $inc, $unset, $push)"),
                        ))
                    }
                }
            }
        }
        Ok(Update::Ops { set, inc, unset, push })
    }

    /// The document after the update; `_id` is kept from `old`.
    pub fn apply(&self, old: &Document) -> CmdResult<Document> {
        match self {
            Update::Replace(r) => {
                let mut out = Document::new();
                if let Some(id) = old.get("_id") {
                    if r.get("_id").is_some_and(|n| !values_equal(n, id)) {
                        return Err(CommandError::new(66, "the _id field cannot be changed"));
                    }
                    out.insert("_id", id.clone());
                }
                for (k, v) in r {
                    if k != "_id" {
                        out.insert(k.clone(), v.clone());
                    }
                }
                Ok(out)
            }
            Update::Ops { set, inc, unset, push } => {
                let mut out = old.clone();
                for (k, v) in set {
                    out.insert(k.clone(), v.clone());
                }
                for (k, by) in inc {
                    let new = match (out.get(k), by) {
                        (None, by) => by.clone(),
                        (Some(Bson::Int32(a)), Bson::Int32(b)) => match a.checked_add(*b) {
                            Some(s) => Bson::Int32(s),
                            None => Bson::Int64(i64::from(*a) + i64::from(*b)),
                        },
                        (Some(a), b) if as_i64(a).is_some() && as_i64(b).is_some() => {
                            let (a, b) = (as_i64(a).unwrap_or_default(), as_i64(b).unwrap_or_default());
                            // MongoDB refuses a long $inc that overflows rather than wrapping.
                            let sum = a.checked_add(b).ok_or_else(|| {
                                CommandError::bad_value(format!(
                                    "Failed to apply $inc operations to current value ({a}) in field `{k}`: \
                                     the sum overflows a long"
                                ))
                            })?;
                            Bson::Int64(sum)
                        }
                        (Some(a), b) => match (as_f64(a), as_f64(b)) {
                            (Some(x), Some(y)) => Bson::Double(x + y),
                            _ => {
                                return Err(CommandError::new(
                                    14,
                                    format!("Cannot apply $inc to a value of non-numeric type in field `{k}`"),
                                ))
                            }
                        },
                    };
                    out.insert(k.clone(), new);
                }
                for k in unset {
                    out.remove(k);
                }
                for (k, v) in push {
                    match out.get_mut(k) {
                        None => {
                            out.insert(k.clone(), vec![v.clone()]);
                        }
                        Some(Bson::Array(a)) => a.push(v.clone()),
                        Some(_) => {
                            return Err(CommandError::new(
                                14,
                                format!("The field '{k}' must be an array to $push onto it"),
                            ))
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

/// The database and collection of a command: (`db`, `coll`) → `db.coll`.
pub fn namespace(cmd: &Document, name: &str) -> CmdResult<String> {
    let db = cmd.get_str("$db").unwrap_or("test");
    let coll = cmd.get_str(name).map_err(|_| CommandError::bad_value(format!("`{name}` must name a collection")))?;
    if coll.is_empty() || db.is_empty() {
        return Err(CommandError::new(73, "empty database or collection name"));
    }
    Ok(format!("{db}.{coll}"))
}

/// A non-negative integer field (`limit`, `batchSize`, `maxTimeMS`…), if present.
pub fn get_count(cmd: &Document, field: &str) -> CmdResult<Option<i64>> {
    match cmd.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(b) => match as_f64(b) {
            Some(x) if x >= 0.0 && x.fract() == 0.0 => Ok(Some(x as i64)),
            _ => Err(CommandError::bad_value(format!("`{field}` must be a non-negative integer"))),
        },
    }
}

/// Truthiness of an optional boolean-ish field.
pub fn get_flag(cmd: &Document, field: &str) -> bool {
    match cmd.get(field) {
        Some(Bson::Boolean(b)) => *b,
        Some(b) => as_f64(b).is_some_and(|x| x != 0.0),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_projections_and_updates() {
        let d = doc! { "_id": 1, "a": 2i64, "b": "x" };
        assert!(Filter::parse(Some(&doc! { "a": 2 })).unwrap().matches(&d));
        assert!(Filter::parse(Some(&doc! { "a": { "$eq": 2.0 } })).unwrap().matches(&d));
        assert!(!Filter::parse(Some(&doc! { "b": "y" })).unwrap().matches(&d));
        assert_eq!(Filter::parse(Some(&doc! { "a": { "$gt": 1 } })).unwrap_err().code, 2);
        assert_eq!(project(&d, Some(&doc! { "b": 1 })).unwrap(), doc! { "_id": 1, "b": "x" });
        assert_eq!(project(&d, Some(&doc! { "b": 0, "_id": 0 })).unwrap(), doc! { "a": 2i64 });
        let u = Update::parse(&Bson::Document(doc! { "$set": { "b": "z" }, "$inc": { "a": 3 } })).unwrap();
        assert_eq!(u.apply(&d).unwrap(), doc! { "_id": 1, "a": 5i64, "b": "z" });
        let r = Update::parse(&Bson::Document(doc! { "c": 1 })).unwrap();
        assert_eq!(r.apply(&d).unwrap(), doc! { "_id": 1, "c": 1 });
        assert!(Update::parse(&Bson::Document(doc! { "$pull": { "a": 1 } })).is_err());
        let big = Update::parse(&Bson::Document(doc! { "$inc": { "a": i64::MAX } })).unwrap();
        assert_eq!(big.apply(&d).unwrap_err().code, 2, "a long $inc past i64::MAX is an error, not a wrap");
        let p = Update::parse(&Bson::Document(doc! { "$push": { "l": 7 } })).unwrap();
        let once = p.apply(&d).unwrap();
        assert_eq!(p.apply(&once).unwrap().get_array("l").unwrap(), &vec![Bson::Int32(7), Bson::Int32(7)]);
    }

    #[test]
    fn numbers_compare_exactly_across_types() {
        let above_double_precision = (1i64 << 53) + 1;
        assert!(!values_equal(&Bson::Int64(above_double_precision), &Bson::Int64(1 << 53)));
        assert!(!values_equal(&Bson::Int64(above_double_precision), &Bson::Double((1i64 << 53) as f64)));
        assert!(!values_equal(&Bson::Int64(i64::MAX), &Bson::Double(9_223_372_036_854_775_808.0)));
        assert!(values_equal(&Bson::Int64(1 << 53), &Bson::Double((1i64 << 53) as f64)));
        assert!(values_equal(&Bson::Int32(7), &Bson::Int64(7)));
        assert!(values_equal(&Bson::Double(7.0), &Bson::Int32(7)));
        assert!(!values_equal(&Bson::Double(7.5), &Bson::Int32(7)));
        assert!(values_equal(&Bson::Double(f64::NAN), &Bson::Double(f64::NAN)));
        let d = doc! { "_id": 1, "n": above_double_precision };
        assert!(!Filter::parse(Some(&doc! { "n": 1i64 << 53 })).unwrap().matches(&d));
        assert!(Filter::parse(Some(&doc! { "n": above_double_precision })).unwrap().matches(&d));
    }

    /// Two `_id`s are one store key exactly when they compare equal (it used to normalise a
    /// Double only below 9e15, so `9e15` as a double and as a long were two documents).
    #[test]
    fn id_keys_agree_with_equality() {
        let numbers = [
            Bson::Int32(7),
            Bson::Int64(7),
            Bson::Double(7.0),
            Bson::Double(7.5),
            Bson::Double(-0.0),
            Bson::Int64(0),
            Bson::Double(9.0e15),
            Bson::Int64(9_000_000_000_000_000),
            Bson::Double((1i64 << 62) as f64),
            Bson::Int64(1 << 62),
            Bson::Int64((1 << 53) + 1),
            Bson::Double((1i64 << 53) as f64),
            Bson::Double(-9_223_372_036_854_775_808.0),
            Bson::Int64(i64::MIN),
            Bson::Double(9_223_372_036_854_775_808.0),
            Bson::Int64(i64::MAX),
            Bson::Double(1e300),
        ];
        for a in &numbers {
            for b in &numbers {
                assert_eq!(id_key(a) == id_key(b), values_equal(a, b), "{a:?} and {b:?}");
            }
        }
    }

    #[test]
    fn cluster_time_bson_round_trip_and_bad_hash() {
        let s = SignedClusterTime {
            time: ClusterTime::new(5, 6),
            signature: Some(Signature { hash: TimeProof([3; 20]), key_id: 9 }),
        };
        assert_eq!(signed_from_bson(&Bson::Document(signed_to_bson(&s))).unwrap(), s);
        let mut d = signed_to_bson(&s);
        d.insert("signature", doc! { "hash": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0; 19] }, "keyId": 9i64 });
        assert_eq!(signed_from_bson(&Bson::Document(d)).unwrap_err().code, codes::UNSUPPORTED_FORMAT);
    }
}
