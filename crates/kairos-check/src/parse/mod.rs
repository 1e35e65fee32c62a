//! Reading histories: Kairos's JSON lines, adya's JSON, and Jepsen's / Elle's EDN.
//!
//! # Input
//! * **JSON**: one record per line (blank lines ignored), or one array of records.
//! * **EDN** (`history.edn`): one map per line (a map may span lines), or one vector of maps;
//!   tagged maps (`#jepsen.history.Op{…}`) are read as maps. Chosen by a `.edn` file name or
//!   by the text (`{:` or `[{:` at the start).
//!
//! Fields, in either syntax (JSON `"type"` or EDN `:type`): `type` (`invoke` / `ok` / `fail` /
//! `info`), `process` (a non-negative integer; records of the `nemesis` process are skipped; a
//! history where no record names one is one process's),
//! `f` (default `txn`), `value`, and optionally `index` (default: position), `time`
//! (nanoseconds; information only, see below) and `key`.
//!
//! `value` is a list of micro-ops (`[r k v]`, `[w k v]`, `[append k v]`, `[cas k [old new]]`;
//! `[w k nil]` is a write of a value the client does not know, allowed in every record but an
//! `ok`, which must carry the value written),
//! or, for single-register operations (`f` = `read` / `write` / `cas`, Knossos's shape), the
//! value itself (`3`, `[old new]`) or a `[key value]` pair (Jepsen's independent keys). For a
//! key-value store (`f` = `get` / `put` / `append` with a `key` field, porcupine's shape) the
//! value is the string got, put or appended; a `get` of `""` is a read of the initial value.
//! Keys and values may be any scalar (integer, string, keyword, …): see [`symbols`].
//!
//! # Real-time order
//! Real-time order is the order of records, as Jepsen takes it: Jepsen writes records as
//! operations are invoked and complete, and its `:time` comes from several threads' clocks, so
//! it may go backwards (by seconds in Elle's histories). `time` is kept for information; when
//! it is missing or goes backwards, the report says so.
//!
//! # Errors
//! Structural errors (a completion with no invocation in flight on its process — including a
//! second completion —, a second invocation while one is in flight, a completion whose `f`
//! differs from its invocation's) and syntax errors name the line (or array element) of the
//! record.

mod datum;
pub mod symbols;

use std::collections::HashMap;
use std::ops::Deref;
use std::path::Path;

use kairos_core::history::{HistoryEvent, HistoryRecord, MicroOp, OpType, ReadValue};

use crate::CheckError;
use datum::Datum;
use symbols::{Interner, Scalar, Symbols};

/// The `time` given to a record that carries none.
pub const TIME_UNKNOWN: u64 = u64::MAX;

/// A parsed history: the records, the names behind renamed keys and values, and notes on how
/// it was read (shown in the report).
#[derive(Clone, Debug, Default)]
pub struct History {
    pub records: Vec<HistoryRecord>,
    pub symbols: Symbols,
    pub notes: Vec<String>,
}

impl Deref for History {
    type Target = [HistoryRecord];
    fn deref(&self) -> &[HistoryRecord] {
        &self.records
    }
}

/// The syntax of a history text.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Syntax {
    Json,
    Edn,
}

impl Syntax {
    /// EDN if the first record starts with a keyword (`{:` or `[{:`, `#` for a tagged map).
    pub fn sniff(text: &str) -> Syntax {
        let t = text.trim_start();
        if t.starts_with(';') {
            return Syntax::Edn;
        }
        let t = t.trim_start_matches(['[', '(']).trim_start();
        let after = t.strip_prefix('{').map(str::trim_start);
        match (t.chars().next(), after.and_then(|a| a.chars().next())) {
            (Some('{'), Some('"' | '}')) => Syntax::Json,
            (Some('{' | '#'), _) => Syntax::Edn,
            _ => Syntax::Json,
        }
    }
}

/// Parses a history in either syntax (see [`Syntax::sniff`]).
pub fn parse_history(text: &str) -> Result<History, CheckError> {
    parse_history_as(text, Syntax::sniff(text))
}

/// Parses a history in the given syntax.
pub fn parse_history_as(text: &str, syntax: Syntax) -> Result<History, CheckError> {
    let data = match syntax {
        Syntax::Json => datum::read_json(text)?,
        Syntax::Edn => datum::read_edn(text)?,
    };
    build(data)
}

/// Reads and parses a history file; a `.edn` name means EDN, otherwise the text decides.
pub fn load_history(path: &Path) -> Result<History, CheckError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CheckError::Io { path: path.display().to_string(), message: e.to_string() })?;
    let syntax = if path.extension().is_some_and(|e| e == "edn") { Syntax::Edn } else { Syntax::sniff(&text) };
    parse_history_as(&text, syntax)
}

enum RawRead {
    Nil,
    One(Scalar),
    List(Vec<Scalar>),
}

enum RawMop {
    Read(Scalar, RawRead),
    Write(Scalar, Scalar),
    WriteUnknown(Scalar),
    Append(Scalar, Scalar),
    Cas(Scalar, Scalar, Scalar),
}

struct Raw {
    line: usize,
    index: Option<u64>,
    time: Option<u64>,
    op_type: OpType,
    process: u64,
    f: String,
    mops: Vec<RawMop>,
}

fn build(data: Vec<(usize, Datum)>) -> Result<History, CheckError> {
    let mut raws = Vec::with_capacity(data.len());
    let mut nemesis = 0usize;
    // Elle's own examples sometimes name no process at all: then the history is one process's.
    let one_process = data.iter().all(|(_, d)| d.field("process").is_none());
    for (line, d) in &data {
        match record(*line, d, one_process)? {
            Some(r) => raws.push(r),
            None => nemesis += 1,
        }
    }
    let mut keys = Interner::default();
    let mut values = Interner::default();
    for r in &raws {
        for m in &r.mops {
            match m {
                RawMop::Read(k, v) => {
                    keys.note(k);
                    match v {
                        RawRead::Nil => {}
                        RawRead::One(x) => values.note(x),
                        RawRead::List(xs) => xs.iter().for_each(|x| values.note(x)),
                    }
                }
                RawMop::Write(k, v) | RawMop::Append(k, v) => {
                    keys.note(k);
                    values.note(v);
                }
                RawMop::WriteUnknown(k) => keys.note(k),
                RawMop::Cas(k, a, b) => {
                    keys.note(k);
                    values.note(a);
                    values.note(b);
                }
            }
        }
    }
    let symbols = Symbols { keys: keys.finish(), values: values.finish() };
    let (k, v) = (&symbols.keys, &symbols.values);
    let records: Vec<HistoryRecord> = raws
        .iter()
        .enumerate()
        .map(|(pos, r)| {
            let value = r
                .mops
                .iter()
                .map(|m| match m {
                    RawMop::Read(key, read) => MicroOp::Read {
                        key: k.id(key),
                        value: match read {
                            RawRead::Nil => None,
                            RawRead::One(x) => Some(ReadValue::Int(v.id(x))),
                            RawRead::List(xs) => Some(ReadValue::List(xs.iter().map(|x| v.id(x)).collect())),
                        },
                    },
                    RawMop::Write(key, x) => MicroOp::Write { key: k.id(key), value: v.id(x) },
                    RawMop::WriteUnknown(key) => MicroOp::WriteUnknown { key: k.id(key) },
                    RawMop::Append(key, x) => MicroOp::Append { key: k.id(key), value: v.id(x) },
                    RawMop::Cas(key, a, b) => MicroOp::Cas { key: k.id(key), expected: v.id(a), new: v.id(b) },
                })
                .collect();
            HistoryRecord {
                index: r.index.unwrap_or(pos as u64),
                time: r.time.unwrap_or(TIME_UNKNOWN),
                event: HistoryEvent { op_type: r.op_type, process: r.process, f: r.f.clone(), value },
            }
        })
        .collect();
    let lines: Vec<usize> = raws.iter().map(|r| r.line).collect();
    validate_structure(&records, &lines)?;
    let mut notes = Vec::new();
    if one_process && !records.is_empty() {
        notes.push("no record names a process: the history is read as one process's, in record order".into());
    }
    if nemesis > 0 {
        notes.push(format!("{nemesis} records of the nemesis process were skipped"));
    }
    notes.extend(time_note(&raws));
    notes.extend(symbols.legend(12));
    Ok(History { records, symbols, notes })
}

/// What the report says about `time` when record order and time disagree or time is missing.
fn time_note(raws: &[Raw]) -> Option<String> {
    let missing = raws.iter().filter(|r| r.time.is_none()).count();
    if missing > 0 {
        return Some(format!(
            "{missing} of {} records carry no `time`: real-time order is the order of records, as Jepsen takes it",
            raws.len()
        ));
    }
    let backwards: Vec<&[Raw]> = raws.windows(2).filter(|w| w[1].time < w[0].time).collect();
    let first = backwards.first()?;
    Some(format!(
        "`time` goes backwards in {} of {} consecutive record pairs (first: line {} at {} ns after line {} at {} ns): \
         real-time order is the order of records, as Jepsen takes it, and `time` is information only",
        backwards.len(),
        raws.len().saturating_sub(1),
        first[1].line,
        first[1].time.unwrap_or(0),
        first[0].line,
        first[0].time.unwrap_or(0)
    ))
}

fn err(line: usize, message: impl Into<String>) -> CheckError {
    CheckError::parse(line, message)
}

fn show(d: Option<&Datum>) -> String {
    d.map_or("nothing".to_string(), Datum::show)
}

fn non_negative(line: usize, d: &Datum, what: &str) -> Result<u64, CheckError> {
    match d {
        Datum::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    }
    .ok_or_else(|| err(line, format!("`{what}` must be a non-negative integer, not {}", d.show())))
}

fn scalar(line: usize, d: &Datum, what: &str) -> Result<Scalar, CheckError> {
    Scalar::from_datum(d)
        .ok_or_else(|| err(line, format!("{what} must be a scalar (integer, string, keyword), not {}", d.show())))
}

/// One record, or `None` for a nemesis record.
fn record(line: usize, d: &Datum, one_process: bool) -> Result<Option<Raw>, CheckError> {
    if !matches!(d, Datum::Map(_)) {
        return Err(err(line, format!("a record must be a JSON object or EDN map, not {}", d.show())));
    }
    let process = match d.field("process") {
        None if one_process => 0,
        Some(p @ Datum::Int(_)) => non_negative(line, p, "process")?,
        Some(p) if p.as_name() == Some("nemesis") => return Ok(None),
        other => {
            return Err(err(
                line,
                format!("`process` must be a non-negative integer (or nemesis), not {}", show(other)),
            ))
        }
    };
    let op_type = match d.field("type").and_then(Datum::as_name) {
        Some("invoke") => OpType::Invoke,
        Some("ok") => OpType::Ok,
        Some("fail") => OpType::Fail,
        Some("info") => OpType::Info,
        _ => return Err(err(line, format!("`type` must be invoke, ok, fail or info, not {}", show(d.field("type"))))),
    };
    let f = match d.field("f") {
        None | Some(Datum::Nil) => "txn".to_string(),
        Some(x) => x.as_name().ok_or_else(|| err(line, format!("`f` must be a name, not {}", x.show())))?.to_string(),
    };
    let index = match d.field("index") {
        None | Some(Datum::Nil) => None,
        Some(i) => Some(non_negative(line, i, "index")?),
    };
    let time = match d.field("time") {
        None | Some(Datum::Nil) => None,
        Some(t) => {
            let t = non_negative(line, t, "time")?;
            if t == TIME_UNKNOWN {
                return Err(err(line, "`time` u64::MAX is reserved for \"unknown\""));
            }
            Some(t)
        }
    };
    let value = d.field("value").unwrap_or(&Datum::Nil);
    let mops = micro_ops(line, &f, value, d.field("key"))?;
    Ok(Some(Raw { line, index, time, op_type, process, f, mops }))
}

/// Whether `value` is a list of micro-ops (`[[:r 1 nil] …]`).
fn is_micro_op_list(value: &Datum) -> bool {
    let Datum::Seq(items) = value else { return false };
    items.iter().all(|m| match m {
        Datum::Seq(parts) => {
            parts.len() == 3 && matches!(parts[0].as_name(), Some("r" | "w" | "append" | "cas" | "read" | "write"))
        }
        _ => false,
    })
}

/// The register used by single-register histories that name no key.
fn the_register() -> Scalar {
    Scalar::Int(0)
}

fn micro_ops(line: usize, f: &str, value: &Datum, key: Option<&Datum>) -> Result<Vec<RawMop>, CheckError> {
    if let Some(key) = key.filter(|k| !k.is_nil()) {
        // A key-value store operation (porcupine's shape).
        let k = scalar(line, key, "`key`")?;
        return Ok(vec![match f {
            "get" | "read" => RawMop::Read(
                k,
                match value {
                    Datum::Nil => RawRead::Nil,
                    Datum::Str(s) if s.is_empty() => RawRead::Nil,
                    x => RawRead::One(scalar(line, x, "a value got")?),
                },
            ),
            "put" | "write" => RawMop::Write(k, scalar(line, value, "a value put")?),
            "append" => RawMop::Append(k, scalar(line, value, "a value appended")?),
            other => return Err(err(line, format!("a record with `key` must be a get, put or append, not {other:?}"))),
        }]);
    }
    if value.is_nil() && !matches!(f, "read" | "write" | "cas") {
        return Ok(vec![]);
    }
    let non_empty = matches!(value, Datum::Seq(items) if !items.is_empty());
    if f == "txn" || (non_empty && is_micro_op_list(value)) {
        let Datum::Seq(items) = value else {
            return Err(err(
                line,
                format!("`value` of a transaction must be a list of micro-ops, not {}", value.show()),
            ));
        };
        return items.iter().enumerate().map(|(i, m)| micro_op(line, i + 1, m)).collect();
    }
    // Single-register operations: a bare value, or a [key value] pair (independent keys).
    let pair = |d: &Datum| match d {
        Datum::Seq(p) if p.len() == 2 => Some((p[0].clone(), p[1].clone())),
        _ => None,
    };
    let read_of = |d: &Datum| -> Result<RawRead, CheckError> {
        Ok(match d {
            Datum::Nil => RawRead::Nil,
            Datum::Seq(xs) => {
                RawRead::List(xs.iter().map(|x| scalar(line, x, "a list element")).collect::<Result<_, _>>()?)
            }
            x => RawRead::One(scalar(line, x, "a value read")?),
        })
    };
    Ok(vec![match f {
        "read" => match pair(value) {
            Some((k, v)) => RawMop::Read(scalar(line, &k, "a key")?, read_of(&v)?),
            None => RawMop::Read(the_register(), read_of(value)?),
        },
        "write" => match pair(value) {
            Some((k, v)) => RawMop::Write(scalar(line, &k, "a key")?, scalar(line, &v, "a value written")?),
            None => RawMop::Write(the_register(), scalar(line, value, "a value written")?),
        },
        "cas" => {
            let (k, ov) = match pair(value) {
                Some((k, ov @ Datum::Seq(_))) => (scalar(line, &k, "a key")?, ov),
                _ => (the_register(), value.clone()),
            };
            let Some((o, n)) = pair(&ov) else {
                return Err(err(line, format!("a cas takes [expected new], not {}", value.show())));
            };
            RawMop::Cas(k, scalar(line, &o, "cas expected")?, scalar(line, &n, "cas new")?)
        }
        other => {
            return Err(err(
                line,
                format!(
                    "`f` {other:?} with value {} is neither a transaction (a list of [r|w|append|cas key value] \
                     micro-ops) nor a read, write, cas, get, put or append",
                    value.show()
                ),
            ));
        }
    }])
}

fn micro_op(line: usize, i: usize, m: &Datum) -> Result<RawMop, CheckError> {
    let Datum::Seq(parts) = m else {
        return Err(err(line, format!("micro-op {i} must be a 3-element list like [r key value], not {}", m.show())));
    };
    let [f, k, v] = parts.as_slice() else {
        return Err(err(line, format!("micro-op {i} must be a 3-element list like [r key value], not {}", m.show())));
    };
    let k = scalar(line, k, &format!("micro-op {i}'s key"))?;
    let value = |what: &str| scalar(line, v, &format!("micro-op {i}'s {what}"));
    Ok(match f.as_name() {
        // Knossos's multi-register spells them out.
        Some("r" | "read") => RawMop::Read(
            k,
            match v {
                Datum::Nil => RawRead::Nil,
                Datum::Seq(xs) => RawRead::List(
                    xs.iter()
                        .map(|x| scalar(line, x, &format!("micro-op {i}'s list element")))
                        .collect::<Result<_, _>>()?,
                ),
                _ => RawRead::One(value("value read")?),
            },
        ),
        // `nil`: a value the client does not know (allowed but in an `ok`: see validate_structure).
        Some("w" | "write") if v.is_nil() => RawMop::WriteUnknown(k),
        Some("w" | "write") => RawMop::Write(k, value("value written")?),
        Some("append") => RawMop::Append(k, value("value appended")?),
        Some("cas") => match v {
            Datum::Seq(p) if p.len() == 2 => RawMop::Cas(
                k,
                scalar(line, &p[0], &format!("micro-op {i}'s cas expected"))?,
                scalar(line, &p[1], &format!("micro-op {i}'s cas new"))?,
            ),
            _ => return Err(err(line, format!("micro-op {i}: a cas takes [expected new], not {}", v.show()))),
        },
        _ => {
            return Err(err(line, format!("micro-op {i}: unknown micro-op {}; expected r, w, append or cas", f.show())))
        }
    })
}

/// One operation in flight per process; every completion answers an invocation of the same `f`;
/// an `ok` carries the value of each of its writes.
fn validate_structure(records: &[HistoryRecord], lines: &[usize]) -> Result<(), CheckError> {
    let mut in_flight: HashMap<u64, usize> = HashMap::new();
    for (i, r) in records.iter().enumerate() {
        if r.event.op_type == OpType::Ok {
            if let Some(why) = crate::ops::unknown_write_in_ok(&r.event.value) {
                return Err(err(lines[i], why));
            }
        }
        let p = r.event.process;
        match r.event.op_type {
            OpType::Invoke => {
                if let Some(prev) = in_flight.insert(p, i) {
                    return Err(err(
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
                    return Err(err(
                        lines[i],
                        format!(
                            "completion (index {}) on process {p} with no invocation in flight: a second completion, \
                             or one whose invocation is missing",
                            r.index
                        ),
                    ));
                };
                if records[inv].event.f != r.event.f {
                    return Err(err(
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
        assert!(!h.symbols.renamed());
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("{\"type\":\"invoke\",\"process\":0,\"value\":[]}\nnot json\n", "line 2"),
            ("{\"type\":\"invoke\",\"process\":0,\"value\":[[\"x\",1,2]]}\n", "line 1"),
            ("\n{\"type\":\"ok\",\"process\":0,\"value\":[]}\n", "line 2"),
            (
                "{\"type\":\"invoke\",\"process\":0,\"value\":[]}\n{\"type\":\"invoke\",\"process\":0,\"value\":[]}\n",
                "line 2",
            ),
            ("{:type :invoke, :process 0, :f :txn, :value []}\n{:type :ok :process 0 :f :txn :value [}\n", "line 2"),
        ];
        for (text, want) in cases {
            let e = parse_history(text).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} should mention {want}");
        }
    }

    #[test]
    fn edn_and_json_with_names_give_the_same_records() {
        let edn = "{:type :invoke, :f :txn, :value [[:append :x 1] [:r \"y\" nil]], :process 0, :time 5, :index 0}\n\
                   {:process :nemesis, :type :info, :f :start, :value nil}\n\
                   {:type :ok, :f :txn, :value [[:append :x 1] [:r \"y\" [2 3]]], :process 0, :time 4, :index 1}\n";
        let json = "{\"type\":\"invoke\",\"process\":0,\"value\":[[\"append\",\":x\",1],[\"r\",\"y\",null]]}\n\
                    {\"type\":\"ok\",\"process\":0,\"value\":[[\"append\",\":x\",1],[\"r\",\"y\",[2,3]]]}\n";
        let (e, j) = (parse_history(edn).unwrap(), parse_history(json).unwrap());
        assert_eq!(Syntax::sniff(edn), Syntax::Edn);
        assert_eq!(
            e.records.iter().map(|r| &r.event.value).collect::<Vec<_>>(),
            j.records.iter().map(|r| &r.event.value).collect::<Vec<_>>()
        );
        assert_eq!(e.symbols.key_name(0), ":x");
        assert_eq!(j.symbols.key_name(1), "\"y\"");
        assert!(e.notes.iter().any(|n| n.contains("nemesis")), "{:?}", e.notes);
        assert!(e.notes.iter().any(|n| n.contains("backwards")), "{:?}", e.notes);
    }

    #[test]
    fn register_shapes_knossos_and_independent_keys() {
        let h = parse_history(
            "{:type :invoke, :f :cas, :value [1 2], :process 0}\n{:type :fail, :f :cas, :value [1 2], :process 0}\n\
             {:type :invoke, :f :write, :value [:k 4], :process 1}\n{:type :ok, :f :write, :value [:k 4], :process 1}\n\
             {:type :invoke, :f :cas, :value [:k [4 5]], :process 1}\n{:type :info, :f :cas, :value [:k [4 5]], :process 1}\n",
        )
        .unwrap();
        assert!(matches!(h[0].event.value[0], MicroOp::Cas { .. }));
        assert!(matches!(h[2].event.value[0], MicroOp::Write { .. }));
        assert!(matches!(h[4].event.value[0], MicroOp::Cas { .. }));
        assert_ne!(h[0].event.value[0].key(), h[2].event.value[0].key());
    }
}
