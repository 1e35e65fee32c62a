//! Parsing Jepsen-shaped histories leniently, and checking their structure.
//!
//! Accepted input: one JSON record per line (blank lines ignored), or a single JSON array of
//! records. Each record needs `type`, `process` and `value` (`value` may be `null` or absent,
//! meaning no micro-ops). `f` defaults to `"txn"`. `index` defaults to the record's position.
//! `time` may be absent from *every* record of a foreign history (adya/Elle inputs often omit
//! it); then every record gets [`TIME_UNKNOWN`], and the real-time models (strict
//! serializability, linearizability) refuse the history with a clear error. A history where
//! some records carry `time` and some do not is rejected here.
//!
//! Structural errors (a completion with no invocation in flight on its process, a second
//! invocation while one is in flight, a completion whose `f` differs from its invocation's) are
//! reported with the line (or array element) number.

use std::collections::HashMap;
use std::path::Path;

use kairos_core::history::{HistoryEvent, HistoryRecord, MicroOp, OpType};
use serde_json::Value;

use crate::CheckError;

/// The `time` given to every record of a history that carries no times at all.
pub const TIME_UNKNOWN: u64 = u64::MAX;

/// Parses JSON lines (or one JSON array of records) into history records.
pub fn parse_history(text: &str) -> Result<Vec<HistoryRecord>, CheckError> {
    let trimmed = text.trim_start();
    let values: Vec<(usize, Value)> = if trimmed.starts_with('[') {
        let all: Value = serde_json::from_str(trimmed)
            .map_err(|e| CheckError::parse(1, format!("not a JSON array of records: {e}")))?;
        let Value::Array(items) = all else {
            return Err(CheckError::parse(1, "expected a JSON array of records"));
        };
        items.into_iter().enumerate().map(|(i, v)| (i + 1, v)).collect()
    } else {
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let v: Value =
                serde_json::from_str(line).map_err(|e| CheckError::parse(i + 1, format!("not JSON: {e}")))?;
            out.push((i + 1, v));
        }
        out
    };
    let mut records = Vec::with_capacity(values.len());
    let mut lines = Vec::with_capacity(values.len());
    let mut timed = 0usize;
    for (pos, (line, v)) in values.iter().enumerate() {
        let (rec, has_time) = record(*line, pos, v)?;
        timed += has_time as usize;
        records.push(rec);
        lines.push(*line);
    }
    if timed != 0 && timed != records.len() {
        let line = values.iter().find(|(_, v)| v.get("time").is_none()).map(|(l, _)| *l).unwrap_or(1);
        return Err(CheckError::parse(
            line,
            "this record has no `time` but others do; give every record a time or none",
        ));
    }
    if timed == 0 {
        for r in &mut records {
            r.time = TIME_UNKNOWN;
        }
    }
    validate_structure(&records, &lines)?;
    Ok(records)
}

/// Reads and parses a history file.
pub fn load_history(path: &Path) -> Result<Vec<HistoryRecord>, CheckError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CheckError::Io { path: path.display().to_string(), message: e.to_string() })?;
    parse_history(&text)
}

fn record(line: usize, pos: usize, v: &Value) -> Result<(HistoryRecord, bool), CheckError> {
    let obj =
        v.as_object().ok_or_else(|| CheckError::parse(line, format!("a record must be a JSON object, not {v}")))?;
    let op_type = match obj.get("type").and_then(Value::as_str) {
        Some("invoke") => OpType::Invoke,
        Some("ok") => OpType::Ok,
        Some("fail") => OpType::Fail,
        Some("info") => OpType::Info,
        _ => {
            return Err(CheckError::parse(
                line,
                format!("`type` must be \"invoke\", \"ok\", \"fail\" or \"info\", not {}", show(obj.get("type"))),
            ))
        }
    };
    let process = obj.get("process").and_then(Value::as_u64).ok_or_else(|| {
        CheckError::parse(line, format!("`process` must be a non-negative integer, not {}", show(obj.get("process"))))
    })?;
    let f = match obj.get("f") {
        None | Some(Value::Null) => "txn".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(CheckError::parse(line, format!("`f` must be a string, not {other}"))),
    };
    let value: Vec<MicroOp> = match obj.get("value") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, m)| {
                serde_json::from_value::<MicroOp>(m.clone())
                    .map_err(|e| CheckError::parse(line, format!("micro-op {}: {e}", i + 1)))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(CheckError::parse(line, format!("`value` must be a list of micro-ops, not {other}")))
        }
    };
    let index = match obj.get("index") {
        None | Some(Value::Null) => pos as u64,
        Some(i) => i
            .as_u64()
            .ok_or_else(|| CheckError::parse(line, format!("`index` must be a non-negative integer, not {i}")))?,
    };
    let (time, has_time) = match obj.get("time") {
        None | Some(Value::Null) => (0, false),
        Some(t) => (
            t.as_u64()
                .ok_or_else(|| CheckError::parse(line, format!("`time` must be a non-negative integer, not {t}")))?,
            true,
        ),
    };
    if has_time && obj.get("time").and_then(Value::as_u64) == Some(TIME_UNKNOWN) {
        return Err(CheckError::parse(line, "`time` u64::MAX is reserved for \"unknown\""));
    }
    Ok((HistoryRecord { index, time, event: HistoryEvent { op_type, process, f, value } }, has_time))
}

fn show(v: Option<&Value>) -> String {
    v.map_or("nothing".to_string(), Value::to_string)
}

/// One operation in flight per process; every completion answers an invocation of the same `f`.
fn validate_structure(records: &[HistoryRecord], lines: &[usize]) -> Result<(), CheckError> {
    let mut in_flight: HashMap<u64, usize> = HashMap::new();
    for (i, r) in records.iter().enumerate() {
        let p = r.event.process;
        match r.event.op_type {
            OpType::Invoke => {
                if let Some(prev) = in_flight.insert(p, i) {
                    return Err(CheckError::parse(
                        lines[i],
                        format!(
                            "process {p} invoked a second operation while its invocation on line {} is still in flight",
                            lines[prev]
                        ),
                    ));
                }
            }
            _ => {
                let Some(inv) = in_flight.remove(&p) else {
                    return Err(CheckError::parse(
                        lines[i],
                        format!("completion on process {p} with no invocation in flight"),
                    ));
                };
                if records[inv].event.f != r.event.f {
                    return Err(CheckError::parse(
                        lines[i],
                        format!(
                            "completion `f` {:?} does not match its invocation's {:?} (line {})",
                            r.event.f, records[inv].event.f, lines[inv]
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Errors from [`crate::check`] if the history must carry times, and they do not increase.
pub(crate) fn require_time(records: &[HistoryRecord], model: &str) -> Result<(), CheckError> {
    if records.iter().any(|r| r.time == TIME_UNKNOWN) {
        return Err(CheckError::Unsupported(format!(
            "{model} needs the real time of every invocation and completion, but this history has no `time` fields"
        )));
    }
    for w in records.windows(2) {
        if w[1].time < w[0].time {
            return Err(CheckError::Unsupported(format!(
                "{model} needs records in real-time order, but record index {} (time {}) follows index {} (time {})",
                w[1].index, w[1].time, w[0].index, w[0].time
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenient_fields_and_array_form() {
        let h = parse_history(
            r#"[{"type":"invoke","process":0,"value":[["r",1,null]]},{"type":"ok","process":0,"value":[["r",1,3]]}]"#,
        )
        .unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(h[1].index, 1);
        assert_eq!(h[1].time, TIME_UNKNOWN);
        assert_eq!(h[0].event.f, "txn");
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("{\"type\":\"invoke\",\"process\":0,\"value\":[]}\nnot json\n", "line 2"),
            ("{\"type\":\"invoke\",\"process\":0,\"value\":[[\"x\",1,2]]}\n", "line 1"),
            ("{\"type\":\"invoke\",\"process\":0,\"value\":[[\"r\",-1,null]]}\n", "line 1"),
            ("\n{\"type\":\"ok\",\"process\":0,\"value\":[]}\n", "line 2"),
            (
                "{\"type\":\"invoke\",\"process\":0,\"value\":[]}\n{\"type\":\"invoke\",\"process\":0,\"value\":[]}\n",
                "line 2",
            ),
        ];
        for (text, want) in cases {
            let e = parse_history(text).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} should mention {want}");
        }
    }
}
