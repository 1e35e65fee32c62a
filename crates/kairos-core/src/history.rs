//! Client-visible history events in the Jepsen shape, as JSON lines:
//!
//! ```json
//! {"index":0,"time":1200,"type":"invoke","process":3,"f":"txn","value":[["r",1,null],["w",2,7]]}
//! {"index":1,"time":9800,"type":"ok","process":3,"f":"txn","value":[["r",1,4],["w",2,7]]}
//! ```
//!
//! A role emits a [`HistoryEvent`] (who, what, which micro-ops); the host adds the `index` and
//! the `time` of true time (nanoseconds) and writes a [`HistoryRecord`]. Micro-ops are
//! `["r", key, value|null|[list]]`, `["w", key, value|null]`, `["append", key, value]` and
//! `["cas", key, [expected, new]]`. A write of `null` ([`MicroOp::WriteUnknown`]) is one whose
//! value is not known to the client: allowed in an `invoke`, an `info` and a `fail`, never in
//! an `ok` (which must say what it wrote). A single-key operation (a register read, write or CAS) is a
//! one-micro-op value with `f` = `read`, `write` or `cas`; a transaction has `f` = `txn`.
//! `type` is `invoke`, then `ok` (took effect), `fail` (certainly did not) or `info` (unknown:
//! it may or may not have taken effect — never assume it absent).

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// Where an operation is in its life.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpType {
    Invoke,
    Ok,
    Fail,
    Info,
}

/// A write of this value deletes its key for good (a key-value store's delete): the
/// linearizability checker refuses any other write placed after it, so a deletion that a later
/// write undid is caught. A read of it is a read that reported the key deleted.
pub const TOMBSTONE: u64 = 1 << 62;

/// What a read returned: a register value, or a list (list-append). The initial, never-written
/// value is `null` in JSON and `None` in [`MicroOp::Read`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReadValue {
    Int(u64),
    List(Vec<u64>),
}

/// One step of an operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MicroOp {
    /// A read. `value` is JSON `null`: in an `invoke` the result is not known yet; in a
    /// completion the read saw the initial, never-written value (Jepsen's convention).
    Read {
        key: u64,
        value: Option<ReadValue>,
    },
    Write {
        key: u64,
        value: u64,
    },
    /// A write whose value the client does not know (JSON `["w", key, null]`): the system
    /// chooses it (an increment writes the version it read plus one). In an `invoke` the value
    /// is not known yet; in an `info` (or a never-completed operation) the operation may have
    /// taken effect and then wrote some single (non-`null`) value; an `ok` completion must
    /// carry the concrete [`MicroOp::Write`] instead.
    WriteUnknown {
        key: u64,
    },
    Append {
        key: u64,
        value: u64,
    },
    /// Compare-and-set: succeeds (operation `ok`) iff the register held `expected`.
    Cas {
        key: u64,
        expected: u64,
        new: u64,
    },
}

impl MicroOp {
    pub fn key(&self) -> u64 {
        match self {
            MicroOp::Read { key, .. }
            | MicroOp::Write { key, .. }
            | MicroOp::WriteUnknown { key }
            | MicroOp::Append { key, .. }
            | MicroOp::Cas { key, .. } => *key,
        }
    }
}

/// An event as a role emits it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEvent {
    #[serde(rename = "type")]
    pub op_type: OpType,
    /// The logical client (Jepsen's process): one operation in flight at a time.
    pub process: u64,
    pub f: String,
    pub value: Vec<MicroOp>,
}

impl HistoryEvent {
    pub fn new(op_type: OpType, process: u64, f: &str, value: Vec<MicroOp>) -> Self {
        HistoryEvent { op_type, process, f: f.to_string(), value }
    }
}

/// An event as a host records it: with its position and true time (ns).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRecord {
    pub index: u64,
    /// True time in nanoseconds (simulated time, or real time since the run began).
    pub time: u64,
    #[serde(flatten)]
    pub event: HistoryEvent,
}

impl Serialize for ReadValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ReadValue::Int(v) => s.serialize_u64(*v),
            ReadValue::List(l) => l.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ReadValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        read_value_from_json(&Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

fn read_value_from_json(v: &Value) -> Result<ReadValue, String> {
    match v {
        Value::Number(_) => Ok(ReadValue::Int(int(v, "a read value")?)),
        Value::Array(items) => {
            items.iter().map(|x| int(x, "a list element")).collect::<Result<_, _>>().map(ReadValue::List)
        }
        other => Err(format!("a read value must be an integer or a list of integers, not {other}")),
    }
}

fn int(v: &Value, what: &str) -> Result<u64, String> {
    v.as_u64().ok_or_else(|| format!("{what} must be a non-negative integer, not {v}"))
}

impl Serialize for MicroOp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MicroOp::Read { key, value } => match value {
                None => ("r", key, ()).serialize(s),
                Some(v) => ("r", key, v).serialize(s),
            },
            MicroOp::Write { key, value } => ("w", key, value).serialize(s),
            MicroOp::WriteUnknown { key } => ("w", key, ()).serialize(s),
            MicroOp::Append { key, value } => ("append", key, value).serialize(s),
            MicroOp::Cas { key, expected, new } => ("cas", key, [expected, new]).serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for MicroOp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        micro_op_from_json(&v).map_err(D::Error::custom)
    }
}

fn micro_op_from_json(v: &Value) -> Result<MicroOp, String> {
    let parts = v
        .as_array()
        .filter(|a| a.len() == 3)
        .ok_or_else(|| format!("a micro-op must be a 3-element array like [\"r\", key, value], not {v}"))?;
    let f =
        parts[0].as_str().ok_or_else(|| format!("a micro-op must start with its function name, not {}", parts[0]))?;
    let key = int(&parts[1], "a key")?;
    match f {
        "r" => {
            let value = match &parts[2] {
                Value::Null => None,
                other => Some(read_value_from_json(other)?),
            };
            Ok(MicroOp::Read { key, value })
        }
        "w" => match &parts[2] {
            Value::Null => Ok(MicroOp::WriteUnknown { key }),
            other => Ok(MicroOp::Write { key, value: int(other, "a written value")? }),
        },
        "append" => Ok(MicroOp::Append { key, value: int(&parts[2], "an appended value")? }),
        "cas" => {
            let pair = parts[2]
                .as_array()
                .filter(|a| a.len() == 2)
                .ok_or_else(|| format!("a cas micro-op takes [expected, new], not {}", parts[2]))?;
            Ok(MicroOp::Cas { key, expected: int(&pair[0], "cas expected")?, new: int(&pair[1], "cas new")? })
        }
        other => Err(format!("unknown micro-op `{other}`; expected r, w, append or cas")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_through_jepsen_json() {
        let line = r#"{"index":1,"time":9800,"type":"ok","process":3,"f":"txn","value":[["r",1,4],["w",2,7],["append",3,9],["r",3,[9]],["cas",4,[1,2]]]}"#;
        let rec: HistoryRecord = serde_json::from_str(line).unwrap();
        assert_eq!(rec.event.op_type, OpType::Ok);
        assert_eq!(rec.event.value[0], MicroOp::Read { key: 1, value: Some(ReadValue::Int(4)) });
        assert_eq!(rec.event.value[4], MicroOp::Cas { key: 4, expected: 1, new: 2 });
        let back: HistoryRecord = serde_json::from_str(&serde_json::to_string(&rec).unwrap()).unwrap();
        assert_eq!(back, rec);
    }

    #[test]
    fn a_null_write_is_an_unknown_value_and_round_trips() {
        let op: MicroOp = serde_json::from_str(r#"["w",5,null]"#).unwrap();
        assert_eq!(op, MicroOp::WriteUnknown { key: 5 });
        assert_eq!(op.key(), 5);
        assert_eq!(serde_json::to_string(&op).unwrap(), r#"["w",5,null]"#);
        let known: MicroOp = serde_json::from_str(r#"["w",5,0]"#).unwrap();
        assert_eq!(known, MicroOp::Write { key: 5, value: 0 });
    }

    #[test]
    fn a_null_read_is_an_unknown_result() {
        let op: MicroOp = serde_json::from_str(r#"["r",5,null]"#).unwrap();
        assert_eq!(op, MicroOp::Read { key: 5, value: None });
    }

    #[test]
    fn malformed_micro_ops_are_errors_not_panics() {
        for bad in [r#"["x",1,2]"#, r#"["r",-1,2]"#, r#"["w",1]"#, r#"{"r":1}"#, r#"["cas",1,[1]]"#, r#"["r",1,"s"]"#] {
            assert!(serde_json::from_str::<MicroOp>(bad).is_err(), "{bad} should be rejected");
        }
    }
}
