//! The external transactional checker: the `adya` crate (Elle-style cycle detection).
//!
//! Options, and why they are sound for our histories:
//! * `models`: exactly the model asked for (`serializable` or `strict-serializable`).
//! * `wfr_keys = true`: a transaction that read `k = v` and then wrote `k = v'` installed `v'`
//!   after `v`. Every serializable execution satisfies this (the transaction ran atomically
//!   at one point in the serial order, after `v` was installed).
//! * `linearizable_keys = true` only for strict serializability: a strictly serializable
//!   history is linearizable per key, so real-time order between transactions implies version
//!   order. Not used for plain serializability, where it would be unsound. Also not used above
//!   [`LINEARIZABLE_KEYS_MAX_RECORDS`] records, where adya's implementation is too slow.
//! * `sequential_keys = false`: process order implies nothing under (strict) serializability
//!   beyond real time, which adya already adds for strict serializability.
//! * `timeout` 10 s per strongly connected component.
//!
//! adya takes real-time order from the *position* of records in the history, not from `time`,
//! as every checker here does (Jepsen's rule: see the `parse` module).
//!
//! Above [`REALTIME_MAX_RECORDS`] records adya checks plain serializability only; asked for
//! strict serializability, its "yes" is then reported as unknown (a weaker model proved), its
//! anomalies stand. A history that writes a value twice to a key is not given to it (a write
//! of a transaction that never completes counts too).
//!
//! **adya refutes; it does not prove.** Its "valid" is reported as unknown (corroboration,
//! not a proof): adya 0.1 does not check that a list read is a legal order of appends (a read
//! `[2, 1, 3]` after one transaction appended 1 then 2 passed), and on registers it infers no
//! rw edge where it cannot order blind writes (without `linearizable_keys`, above
//! [`LINEARIZABLE_KEYS_MAX_RECORDS`] records, a stale read after two completed writes passed).
//! A review found both; proofs come from the replayed serial order and from the dependency
//! graph over a complete version order. Its anomalies stand.
//!
//! A write of unknown value (`["w", k, null]`, in an invocation or an `info`) is given to adya
//! as a write of a fresh value, unique per (transaction, micro-op), that no other write has (a
//! string, while every other value is an integer). If its transaction took effect, it wrote
//! some value, perhaps one another write also wrote and a read returned; adya, which
//! attributes each read to the one writer of its value, would take that read for one of the
//! other writer's version: an aborted read if that writer failed, an intermediate read if it
//! overwrote the value, a wrong dependency in a cycle. (A review found adya's G1a and G1b
//! invented so; an older sentence here said none could be.) So a register that a transaction
//! which may have taken effect (`info`, or never completed) last wrote with an unknown value
//! is given to adya without its `ok` reads of non-`nil` values: the write may explain each
//! (a `nil` read saw the initial value, which no write writes). Under strict serializability a
//! read that completed before every such write of its key was invoked is kept: it cannot have
//! seen them. Dropping reads only removes constraints, and no read adya is given can have seen
//! the fresh value (a kept read precedes the write in every strictly serializable order), so a
//! history that satisfies the model satisfies it for adya too: its anomalies stand. It may miss
//! one that needs the dropped reads; kairos-serial-search decides those. Other keys are given
//! whole.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use adya::check::{Opts, Valid, Workload};
use adya::history::{History, Interner, Mop, Op, OpType as AOpType, ReadValue as AReadValue, Scalar};
use kairos_core::history::{HistoryRecord, MicroOp, OpType, ReadValue};

use crate::report::{Anomaly, CheckerVerdict};
use crate::CheckError;

pub(crate) const NAME: &str = "adya";
/// adya 0.1's `linearizable_keys` inference walks real-time successors per (transaction, key)
/// and is quadratic (5,000 transactions: ~4 s; 50,000: minutes). Above this many records we
/// leave it off: adya still adds real-time edges, but infers less version order for blind
/// writes (so it may miss some strict-serializability violations that our search finds).
pub(crate) const LINEARIZABLE_KEYS_MAX_RECORDS: usize = 4_000;
const VERSION: &str = "0.1.0";

/// Elle/adya names → ours: the `-item` suffix of G-single and G-nonadjacent is dropped.
pub(crate) fn normalize(kind: &str) -> String {
    kind.replace("G-single-item", "G-single").replace("G-nonadjacent-item", "G-nonadjacent")
}

fn int(x: u64, what: &str) -> Result<Scalar, String> {
    i64::try_from(x).map(Scalar::Int).map_err(|_| format!("{what} {x} exceeds adya's i64 range"))
}

fn unique(key: u64, value: u64) -> String {
    format!(
        "value {value} is written to key {key} more than once, and adya infers dependencies from unique values \
         (kairos-serial-search does not need them)"
    )
}

/// Per record, the position of its transaction's invocation; per invocation position, the
/// position and type of its completion (none: it never completed).
fn transactions(records: &[HistoryRecord]) -> (Vec<usize>, HashMap<usize, (usize, OpType)>) {
    let mut inv = Vec::with_capacity(records.len());
    let mut end = HashMap::new();
    let mut in_flight: HashMap<u64, usize> = HashMap::new();
    for (pos, r) in records.iter().enumerate() {
        inv.push(match r.event.op_type {
            OpType::Invoke => {
                in_flight.insert(r.event.process, pos);
                pos
            }
            t => {
                let at = in_flight.remove(&r.event.process).unwrap_or(pos);
                end.insert(at, (pos, t));
                at
            }
        });
    }
    (inv, end)
}

/// The reads adya is not given, as (position of the transaction's invocation, micro-op
/// position): an `ok` read of a non-`nil` value of a register that a transaction which may have
/// taken effect (`info`, or never completed) last wrote with an unknown value. That write may
/// have written the value read, while adya knows it as a fresh value nobody read (module docs).
/// Under strict serializability a read that completed before every such write was invoked is
/// kept: it cannot have seen them.
fn hidden_reads(
    records: &[HistoryRecord],
    inv: &[usize],
    end: &HashMap<usize, (usize, OpType)>,
    strict: bool,
) -> HashSet<(usize, usize)> {
    // Per register, the earliest invocation of a transaction that may have taken effect and
    // left it with an unknown value.
    let mut unknown: HashMap<u64, usize> = HashMap::new();
    for (pos, r) in records.iter().enumerate() {
        if end.get(&inv[pos]).is_some_and(|(_, t)| *t != OpType::Info) {
            continue;
        }
        let mut last: HashMap<u64, bool> = HashMap::new();
        for m in &r.event.value {
            match m {
                MicroOp::Write { key, .. } | MicroOp::Cas { key, .. } => last.insert(*key, false),
                MicroOp::WriteUnknown { key } => last.insert(*key, true),
                MicroOp::Read { .. } | MicroOp::Append { .. } => None,
            };
        }
        for (k, _) in last.into_iter().filter(|(_, u)| *u) {
            let at = unknown.entry(k).or_insert(inv[pos]);
            *at = (*at).min(inv[pos]);
        }
    }
    let mut hidden = HashSet::new();
    for (pos, r) in records.iter().enumerate() {
        if r.event.op_type != OpType::Ok {
            continue;
        }
        for (i, m) in r.event.value.iter().enumerate() {
            if let MicroOp::Read { key, value: Some(_) } = m {
                if unknown.get(key).is_some_and(|u| !(strict && pos < *u)) {
                    hidden.insert((inv[pos], i));
                }
            }
        }
    }
    hidden
}

fn convert(records: &[HistoryRecord], strict: bool) -> Result<(History, Workload), String> {
    let mut interner = Interner::default();
    let mut ops = Vec::with_capacity(records.len());
    let mut list = false;
    let mut reg = false;
    let mut written = HashSet::new();
    let (inv, end) = transactions(records);
    let hidden = hidden_reads(records, &inv, &end, strict);
    for (at, r) in records.iter().enumerate() {
        // The transaction: the index of its invocation, which names the fresh values of its
        // writes of unknown value, the same in the invocation and its completion.
        let txn = records[inv[at]].index;
        // Whether its writes count toward "written more than once": those of the completion,
        // or of the invocation of a transaction that never completes (it may have taken effect;
        // a review found such a write of the value a failed write also wrote missed, and adya
        // took a read of it for an aborted read). Not those of an invocation that completes:
        // an `ok` completion may fill in the values its invocation left as placeholders.
        let counts = r.event.op_type != OpType::Invoke || !end.contains_key(&at);
        let mut value = Vec::with_capacity(r.event.value.len());
        for (pos, m) in r.event.value.iter().enumerate() {
            if hidden.contains(&(inv[at], pos)) {
                continue;
            }
            let mut id = |x: u64, what: &str| int(x, what).map(|s| interner.intern(s));
            value.push(match m {
                MicroOp::Read { key, value } => Mop::Read {
                    key: id(*key, "key")?,
                    value: match value {
                        None => AReadValue::Nil,
                        Some(ReadValue::Int(v)) => {
                            reg = true;
                            AReadValue::Scalar(id(*v, "value")?)
                        }
                        Some(ReadValue::List(l)) => {
                            list = true;
                            AReadValue::List(l.iter().map(|v| id(*v, "value")).collect::<Result<_, _>>()?)
                        }
                    },
                },
                MicroOp::Write { key, value } => {
                    reg = true;
                    if counts && !written.insert((*key, *value)) {
                        return Err(unique(*key, *value));
                    }
                    Mop::Write { key: id(*key, "key")?, value: id(*value, "value")? }
                }
                MicroOp::WriteUnknown { key } => {
                    reg = true;
                    let key = id(*key, "key")?;
                    Mop::Write { key, value: interner.intern(Scalar::Str(format!("unknown-write-{txn}-{pos}"))) }
                }
                MicroOp::Append { key, value } => {
                    list = true;
                    if counts && !written.insert((*key, *value)) {
                        return Err(unique(*key, *value));
                    }
                    Mop::Append { key: id(*key, "key")?, value: id(*value, "value")? }
                }
                MicroOp::Cas { .. } => return Err("adya has no compare-and-set micro-op".into()),
            });
        }
        let kind = match r.event.op_type {
            OpType::Invoke => AOpType::Invoke,
            OpType::Ok => AOpType::Ok,
            OpType::Fail => AOpType::Fail,
            OpType::Info => AOpType::Info,
        };
        let process = i64::try_from(r.event.process).map_err(|_| "process id exceeds i64".to_string())?;
        let time = i64::try_from(r.time).ok();
        ops.push(Op { index: r.index, kind, process: Some(process), value, time });
    }
    if list && reg {
        return Err("adya checks either list-append or rw-register histories, not a mix".into());
    }
    let workload = if list { Workload::ListAppend } else { Workload::RwRegister };
    Ok((History::from_ops(ops, interner), workload))
}

/// Histories up to this many records get adya's real-time (strict) check.
pub const REALTIME_MAX_RECORDS: usize = 20_000;

pub(crate) fn check(records: &[HistoryRecord], strict: bool) -> Result<(CheckerVerdict, Vec<Anomaly>), CheckError> {
    let verdict = |valid, detail: String| CheckerVerdict { name: NAME.into(), version: VERSION.into(), valid, detail };
    let (h, workload) = match convert(records, strict) {
        Ok(x) => x,
        Err(why) => return Ok((verdict(None, format!("not run: {why}")), vec![])),
    };
    // adya 0.1's real-time reduction clones the frontier of concurrent completions for every
    // invocation: quadratic in concurrency, in time and memory (19.6 s and gigabytes for a
    // 20,000-transaction Tiga history with ~2,000 transactions in flight). Above the limit adya
    // checks serializability, and real-time order rests on kairos-serial-search alone; the
    // verdict says so.
    let realtime = strict && records.len() <= REALTIME_MAX_RECORDS;
    // Asked for strict serializability but adya checks serializability only.
    let weaker = strict && !realtime;
    let model = if realtime { "strict-serializable" } else { "serializable" };
    let opts = Opts {
        models: vec![model.into()],
        anomalies: vec![],
        timeout: Duration::from_secs(10),
        wfr_keys: true,
        sequential_keys: false,
        linearizable_keys: strict && records.len() <= LINEARIZABLE_KEYS_MAX_RECORDS,
        transaction_order: None,
    };
    let report = adya::check(&h, workload, &opts);
    let mut anomalies = Vec::new();
    let mut unknown_why = Vec::new();
    for (kind, list) in &report.anomalies {
        for a in list {
            if matches!(kind.as_str(), "empty-transaction-graph" | "cycle-search-timeout")
                || (report.valid == Valid::Unknown)
            {
                unknown_why.push(format!("{kind}: {}", a.explanation));
                continue;
            }
            anomalies.push(Anomaly {
                name: normalize(kind),
                ops: a.ops.clone(),
                explanation: a.explanation.trim_end().to_string(),
                checker: NAME.into(),
            });
        }
    }
    let wl = if workload == Workload::ListAppend { "list-append" } else { "rw-register" };
    let mut opts_desc = format!("{wl}, wfr-keys, linearizable-keys={}", opts.linearizable_keys);
    if weaker {
        opts_desc.push_str(&format!(
            "; serializability only: adya's real-time graph is quadratic in concurrency, so above {REALTIME_MAX_RECORDS} \
             records real-time order is checked by kairos-serial-search and kairos-dsg"
        ));
    }
    let v = match report.valid {
        Valid::True if weaker => verdict(
            None,
            format!("no serializable anomalies found, and it checked serializability only ({opts_desc}); adya refutes, it does not prove"),
        ),
        Valid::True => verdict(None, format!("no {model} anomalies found ({opts_desc}); adya refutes, it does not prove")),
        Valid::False => {
            verdict(Some(false), format!("{model} anomalies: {} ({opts_desc})", report.anomaly_types.join(", ")))
        }
        Valid::Unknown => {
            // No inferable dependency at all (e.g. a single transaction): nothing can be cyclic.
            let empty = report.anomaly_types.iter().all(|t| t == "empty-transaction-graph");
            if empty && !weaker {
                verdict(None, format!("no dependencies between transactions that it could infer ({opts_desc})"))
            } else {
                verdict(None, format!("unknown: {} ({opts_desc})", unknown_why.join("; ")))
            }
        }
    };
    Ok((v, anomalies))
}
