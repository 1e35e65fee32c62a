//! Malformed input, large histories, and random differential tests between paired checkers.

use kairos_check::{check, check_history, checkers, parse_history, CheckOptions, Model, Verdict};
use kairos_core::history::{HistoryEvent, HistoryRecord, MicroOp, OpType, ReadValue};

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn malformed_input_is_a_clear_error_naming_the_line() {
    let inv = r#"{"index":0,"time":0,"type":"invoke","process":0,"f":"txn","value":[["r",1,null]]}"#;
    let cases: Vec<(String, &str)> = vec![
        (format!("{inv}\n{{not json"), "line 2"),
        (r#"{"type":"invoke","process":0,"value":[["zap",1,2]]}"#.into(), "unknown micro-op"),
        (r#"{"type":"invoke","process":0,"value":[["r",{"a":1},null]]}"#.into(), "must be a scalar"),
        (r#"{"type":"invoke","process":-1,"value":[]}"#.into(), "non-negative"),
        (r#"{"type":"ok","process":4,"value":[]}"#.into(), "no invocation in flight"),
        (format!("{inv}\n{inv}"), "still in flight"),
        (r#"{"type":"started","process":0,"value":[]}"#.into(), "`type`"),
        (r#"[1,2,3]"#.into(), "JSON object"),
    ];
    for (text, want) in cases {
        let e = parse_history(&text).expect_err(&text).to_string();
        assert!(e.contains(want), "{text:?}: error {e:?} should mention {want:?}");
        assert!(e.starts_with("line "), "{e:?} should name the line");
    }
}

#[test]
fn mangled_corpus_never_panics() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/bad");
    let mut rng = Lcg(7);
    let mut parsed = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for _ in 0..40 {
            let mut bytes = text.clone().into_bytes();
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(bytes.len() as u64) as usize;
                bytes[i] = b"0123456789[]{},\"-nrw"[rng.below(20) as usize];
            }
            let Ok(s) = String::from_utf8(bytes) else { continue };
            if let Ok(h) = parse_history(&s) {
                parsed += 1;
                for m in Model::ALL {
                    let _ = check(&h, m);
                }
            }
        }
    }
    assert!(parsed > 0);
}

#[test]
fn without_time_real_time_order_is_record_order_and_the_report_says_so() {
    // T1 writes 1 and completes; then T2 reads nil: a stale read in record order.
    let h = parse_history(
        "{\"type\":\"invoke\",\"process\":0,\"value\":[[\"w\",1,1]]}\n{\"type\":\"ok\",\"process\":0,\"value\":[[\"w\",1,1]]}\n\
         {\"type\":\"invoke\",\"process\":1,\"value\":[[\"r\",1,null]]}\n{\"type\":\"ok\",\"process\":1,\"value\":[[\"r\",1,null]]}",
    )
    .unwrap();
    let opts = CheckOptions::default();
    let strict = check_history(&h, Model::StrictSerializable, &opts).unwrap();
    assert_eq!(strict.verdict, Verdict::Invalid, "{strict}");
    assert!(strict.to_string().contains("order of records"), "{strict}");
    assert_eq!(check_history(&h, Model::Serializable, &opts).unwrap().verdict, Verdict::Valid);
}

fn rec(i: &mut u64, t: OpType, p: u64, f: &str, v: Vec<MicroOp>) -> HistoryRecord {
    *i += 1;
    HistoryRecord { index: *i - 1, time: *i * 10, event: HistoryEvent::new(t, p, f, v) }
}

/// A healthy run: `n` read-modify-write increments (and some reads) from `procs` clients over
/// `keys` counters, each taking effect atomically somewhere inside its interval.
fn healthy(n: usize, procs: u64, keys: u64, seed: u64) -> Vec<HistoryRecord> {
    let mut rng = Lcg(seed);
    let mut state = vec![None::<u64>; keys as usize];
    let mut next_val = 1u64;
    // Per process: None = idle, Some((stage, ops)) = invoked (stage 0) or applied (stage 1).
    let mut busy: Vec<Option<(u8, Vec<MicroOp>, bool)>> = vec![None; procs as usize];
    let (mut out, mut idx, mut done) = (Vec::new(), 0u64, 0usize);
    while done < n || busy.iter().any(Option::is_some) {
        let p = rng.below(procs) as usize;
        match busy[p].take() {
            None if done < n => {
                let k = rng.below(keys);
                let read_only = rng.below(4) == 0;
                let ops = if read_only {
                    vec![MicroOp::Read { key: k, value: None }]
                } else {
                    vec![MicroOp::Read { key: k, value: None }, MicroOp::Write { key: k, value: 0 }]
                };
                out.push(rec(&mut idx, OpType::Invoke, p as u64, "txn", ops.clone()));
                busy[p] = Some((0, ops, read_only));
                done += 1;
            }
            None => {}
            Some((0, ops, ro)) => {
                let k = ops[0].key();
                let v = state[k as usize];
                let mut filled = vec![MicroOp::Read { key: k, value: v.map(ReadValue::Int) }];
                if !ro {
                    filled.push(MicroOp::Write { key: k, value: next_val });
                    state[k as usize] = Some(next_val);
                    next_val += 1;
                }
                busy[p] = Some((1, filled, ro));
            }
            Some((_, ops, _)) => out.push(rec(&mut idx, OpType::Ok, p as u64, "txn", ops)),
        }
    }
    out
}

#[test]
fn large_healthy_history_is_strictly_serializable_for_both_checkers() {
    let n: usize = std::env::var("KAIROS_CHECK_BIG").ok().and_then(|v| v.parse().ok()).unwrap_or(50_000);
    let h = healthy(n, 12, 8, 1);
    assert_eq!(h.len(), 2 * n);
    for model in [Model::StrictSerializable, Model::Serializable] {
        let r = check(&h, model).unwrap();
        assert!(r.valid, "{r}");
        assert_eq!(r.verdict(checkers::SERIAL_SEARCH).unwrap().valid, Some(true), "{r}");
        assert_eq!(r.verdict(checkers::DSG).unwrap().valid, Some(true), "{r}");
        // adya refutes, it does not prove: unknown, and above its real-time limit it says
        // that it checked serializability only.
        let adya = r.verdict(checkers::ADYA).unwrap();
        assert_eq!(adya.valid, None, "{r}");
        if model == Model::StrictSerializable && h.len() > 20_000 {
            assert!(adya.detail.contains("serializability only"), "{r}");
        }
    }
}

#[test]
fn large_history_with_one_stale_read_is_rejected() {
    let mut h = healthy(5_000, 8, 4, 2);
    // Make the last completed read of some key return a value older than the latest write.
    let pos = h
        .iter()
        .rposition(|r| {
            r.event.op_type == OpType::Ok
                && r.event.value.len() == 1
                && matches!(r.event.value[0], MicroOp::Read { value: Some(_), .. })
        })
        .unwrap();
    let MicroOp::Read { key, .. } = h[pos].event.value[0] else { unreachable!() };
    h[pos].event.value[0] = MicroOp::Read { key, value: None };
    let r = check(&h, Model::StrictSerializable).unwrap();
    assert!(!r.valid, "{r}");
    assert_eq!(r.verdict(checkers::ADYA).unwrap().valid, Some(false));
    assert_ne!(r.verdict(checkers::SERIAL_SEARCH).unwrap().valid, Some(true));
    assert!(r.disagreement.is_none());
}

/// Random small register histories: our WGL and todc-utils must agree on every one.
#[test]
fn wgl_and_todc_agree_on_random_register_histories() {
    let mut rng = Lcg(42);
    let (mut bad, mut good) = (0, 0);
    for _ in 0..400 {
        let mut idx = 0u64;
        let mut h = Vec::new();
        let mut inflight: Vec<Option<(OpType, MicroOp, &str)>> = vec![None; 3];
        let mut n = 0;
        while n < 8 || inflight.iter().any(Option::is_some) {
            let p = rng.below(3) as usize;
            match inflight[p].take() {
                None if n < 8 => {
                    n += 1;
                    let (m, f) = match rng.below(3) {
                        0 => (MicroOp::Read { key: 0, value: None }, "read"),
                        1 => (MicroOp::Write { key: 0, value: rng.below(3) }, "write"),
                        _ => (MicroOp::Cas { key: 0, expected: rng.below(3), new: rng.below(3) }, "cas"),
                    };
                    h.push(rec(&mut idx, OpType::Invoke, p as u64, f, vec![m.clone()]));
                    let t = match rng.below(8) {
                        0 => OpType::Info,
                        1 => OpType::Fail,
                        _ => OpType::Ok,
                    };
                    let m = match m {
                        MicroOp::Read { key, .. } => {
                            MicroOp::Read { key, value: rng.below(4).checked_sub(1).map(ReadValue::Int) }
                        }
                        m => m,
                    };
                    inflight[p] = Some((t, m, f));
                }
                None => {}
                Some((t, m, f)) => h.push(rec(&mut idx, t, p as u64, f, vec![m])),
            }
        }
        let r = check(&h, Model::Linearizable).unwrap();
        assert!(r.disagreement.is_none(), "{r}");
        assert_eq!(r.verdict(checkers::WGL).unwrap().valid, r.verdict(checkers::TODC).unwrap().valid, "{r}");
        if r.valid {
            good += 1
        } else {
            bad += 1
        }
    }
    assert!(good > 20 && bad > 20, "generator too one-sided: {good} good, {bad} bad");
}

/// Random small read-modify-write transaction histories with corrupted reads: adya and our
/// search must never reach opposite verdicts.
#[test]
fn adya_and_search_agree_on_random_txn_histories() {
    let mut rng = Lcg(9);
    let (mut bad, mut good) = (0, 0);
    for round in 0..300 {
        let mut h = healthy(8, 3, 2, round + 100);
        // Corrupt some reads, but only to values someone wrote (or nil): adya cannot see reads
        // of never-written values (see `adya_misses_garbage_reads`).
        let written: Vec<(u64, u64)> = h
            .iter()
            .filter(|r| r.event.op_type == OpType::Ok)
            .flat_map(|r| r.event.value.iter())
            .filter_map(|m| if let MicroOp::Write { key, value } = m { Some((*key, *value)) } else { None })
            .collect();
        for r in h.iter_mut().filter(|r| r.event.op_type == OpType::Ok) {
            if rng.below(6) == 0 {
                if let MicroOp::Read { key, .. } = r.event.value[0] {
                    // Not its own write either: adya ignores such "future reads" too.
                    let own = r.event.value.get(1).cloned();
                    let mine: Vec<u64> = written
                        .iter()
                        .filter(|w| w.0 == key && own != Some(MicroOp::Write { key, value: w.1 }))
                        .map(|w| w.1)
                        .collect();
                    let i = rng.below(mine.len() as u64 + 1) as usize;
                    r.event.value[0] = MicroOp::Read { key, value: mine.get(i).copied().map(ReadValue::Int) };
                }
            }
        }
        for model in [Model::Serializable, Model::StrictSerializable] {
            let r = check(&h, model).unwrap();
            assert!(r.disagreement.is_none(), "{r}");
            if r.valid {
                good += 1
            } else {
                bad += 1
            }
        }
    }
    assert!(good > 20 && bad > 20, "generator too one-sided: {good} good, {bad} bad");
}

/// A known limitation of adya 0.1 (rw-register): a read of a value no transaction wrote is not
/// an anomaly to it. Our checker rejects it; adya finds nothing (which, from adya, proves
/// nothing), and the report is invalid.
#[test]
fn adya_misses_garbage_reads() {
    let mut i = 0;
    let h = vec![
        rec(&mut i, OpType::Invoke, 0, "txn", vec![MicroOp::Write { key: 1, value: 1 }]),
        rec(&mut i, OpType::Ok, 0, "txn", vec![MicroOp::Write { key: 1, value: 1 }]),
        rec(&mut i, OpType::Invoke, 1, "txn", vec![MicroOp::Read { key: 1, value: None }]),
        rec(&mut i, OpType::Ok, 1, "txn", vec![MicroOp::Read { key: 1, value: Some(ReadValue::Int(99)) }]),
    ];
    let r = check(&h, Model::Serializable).unwrap();
    assert!(!r.valid, "{r}");
    assert_eq!(r.verdict(checkers::SERIAL_SEARCH).unwrap().valid, Some(false));
    assert!(r.anomaly_names(checkers::SERIAL_SEARCH).contains(&"garbage-read"));
    let adya = r.verdict(checkers::ADYA).unwrap();
    assert_eq!(adya.valid, None, "adya now sees garbage reads: update docs");
    assert!(!r.anomaly_names(checkers::ADYA).contains(&"garbage-read"), "{r}");
}

/// A small increment history in which some transactions give up (`info`, writes of unknown
/// value) and, of those, some took effect anyway; then some `ok` reads corrupted.
fn with_unknowns(rng: &mut Lcg, n: usize, procs: u64, keys: u64) -> Vec<HistoryRecord> {
    let mut state = vec![None::<u64>; keys as usize];
    let mut next_val = 1u64;
    // Per process: the invocation's key and read-only flag, and the completion once applied.
    type Completion = (OpType, Vec<MicroOp>);
    let mut busy: Vec<Option<(u64, bool, Option<Completion>)>> = vec![None; procs as usize];
    let (mut out, mut idx, mut started) = (Vec::new(), 0u64, 0usize);
    let invocation = |k: u64, ro: bool| {
        let mut v = vec![MicroOp::Read { key: k, value: None }];
        if !ro {
            v.push(MicroOp::WriteUnknown { key: k });
        }
        v
    };
    while started < n || busy.iter().any(Option::is_some) {
        let p = rng.below(procs) as usize;
        match busy[p].take() {
            None if started < n => {
                let (k, ro) = (rng.below(keys), rng.below(4) == 0);
                out.push(rec(&mut idx, OpType::Invoke, p as u64, "txn", invocation(k, ro)));
                busy[p] = Some((k, ro, None));
                started += 1;
            }
            None => {}
            Some((k, ro, None)) => {
                // Takes effect now, or (1 in 8) gives up — having taken effect or not.
                let gives_up = !ro && rng.below(8) == 0;
                let takes_effect = !gives_up || rng.below(2) == 0;
                let v = state[k as usize];
                let mut done = vec![MicroOp::Read { key: k, value: v.map(ReadValue::Int) }];
                if !ro && takes_effect {
                    done.push(MicroOp::Write { key: k, value: next_val });
                    state[k as usize] = Some(next_val);
                    next_val += 1;
                }
                let completion = if gives_up { (OpType::Info, invocation(k, ro)) } else { (OpType::Ok, done) };
                busy[p] = Some((k, ro, Some(completion)));
            }
            Some((_, _, Some((t, value)))) => out.push(rec(&mut idx, t, p as u64, "txn", value)),
        }
    }
    for r in out.iter_mut().filter(|r| r.event.op_type == OpType::Ok) {
        if rng.below(5) == 0 {
            if let MicroOp::Read { key, .. } = r.event.value[0] {
                let v = rng.below(next_val + 1);
                r.event.value[0] = MicroOp::Read { key, value: (v > 0).then_some(ReadValue::Int(v)) };
            }
        }
    }
    out
}

/// The reference the search is held to on tiny histories of single-key transactions: try every
/// order of every subset of the given-up transactions with all `ok` ones. A write of unknown
/// value writes whatever the next read sees (anything but `nil`).
fn brute_force_serializable(h: &[HistoryRecord], strict: bool) -> bool {
    #[derive(Clone, Copy, PartialEq, Eq, Hash)]
    enum Held {
        Known(Option<u64>),
        Unknown,
    }
    struct T {
        ok: bool,
        inv: usize,
        end: usize,
        key: usize,
        read: Option<Option<u64>>,
        write: Option<Option<u64>>,
    }
    let mut open: std::collections::HashMap<u64, usize> = Default::default();
    let mut txns: Vec<T> = Vec::new();
    for (pos, r) in h.iter().enumerate() {
        let e = &r.event;
        if e.op_type == OpType::Invoke {
            open.insert(e.process, pos);
            continue;
        }
        let inv = open.remove(&e.process).unwrap();
        let ok = e.op_type == OpType::Ok;
        if e.op_type == OpType::Fail {
            continue;
        }
        let key = e.value[0].key() as usize;
        let read = match &e.value[0] {
            MicroOp::Read { value, .. } if ok => Some(value.as_ref().map(|v| match v {
                ReadValue::Int(v) => *v,
                ReadValue::List(_) => unreachable!(),
            })),
            _ => None,
        };
        let write = e.value.get(1).map(|m| match m {
            MicroOp::Write { value, .. } => Some(*value),
            _ => None,
        });
        if !ok && write.is_none() {
            continue;
        }
        txns.push(T { ok, inv, end: pos, key, read, write });
    }
    let keys = txns.iter().map(|t| t.key + 1).max().unwrap_or(0);
    fn go(
        txns: &[T],
        strict: bool,
        placed: u64,
        held: &mut Vec<Held>,
        seen: &mut std::collections::HashSet<(u64, Vec<Held>)>,
    ) -> bool {
        if txns.iter().enumerate().all(|(i, t)| !t.ok || placed >> i & 1 == 1) {
            return true;
        }
        if !seen.insert((placed, held.clone())) {
            return false;
        }
        for (i, t) in txns.iter().enumerate() {
            let blocked = txns.iter().enumerate().any(|(j, u)| j != i && u.ok && placed >> j & 1 == 0 && u.end < t.inv);
            if placed >> i & 1 == 1 || (strict && blocked) {
                continue;
            }
            let fits = match (t.read, held[t.key]) {
                (None, _) => true,
                (Some(want), Held::Known(v)) => want == v,
                (Some(want), Held::Unknown) => want.is_some(),
            };
            if !fits {
                continue;
            }
            let before = held[t.key];
            if let Some(want) = t.read {
                held[t.key] = Held::Known(want);
            }
            if let Some(w) = t.write {
                held[t.key] = w.map_or(Held::Unknown, |v| Held::Known(Some(v)));
            }
            if go(txns, strict, placed | 1 << i, held, seen) {
                return true;
            }
            held[t.key] = before;
        }
        false
    }
    go(&txns, strict, 0, &mut vec![Held::Known(None); keys], &mut Default::default())
}

/// The serial search is exact with writes of unknown value: on random tiny histories with
/// given-up increments (some of which took effect) and corrupted reads, it agrees with brute
/// force, for both models.
#[test]
fn search_with_unknown_writes_agrees_with_brute_force() {
    let mut rng = Lcg(77);
    let (mut bad, mut good) = (0, 0);
    for _ in 0..400 {
        let h = with_unknowns(&mut rng, 9, 3, 2);
        for (model, strict) in [(Model::Serializable, false), (Model::StrictSerializable, true)] {
            let want = brute_force_serializable(&h, strict);
            let r = check(&h, model).unwrap();
            let got = r.verdict(checkers::SERIAL_SEARCH).unwrap().valid;
            let json: Vec<String> = h.iter().map(|x| serde_json::to_string(x).unwrap()).collect();
            assert_eq!(got, Some(want), "{model:?}: brute force says {want}\n{r}\n{}", json.join("\n"));
            // The dependency graph may know less, never the opposite. (adya is not held to this:
            // it takes an unknown value to be a fresh one, and corrupted reads here can make a
            // history valid only if an unknown write wrote a value some other write wrote.)
            let dsg = r.verdict(checkers::DSG).unwrap().valid;
            assert!(dsg.is_none() || dsg == Some(want), "dsg: {dsg:?}\n{r}");
            if want {
                good += 1
            } else {
                bad += 1
            }
        }
    }
    assert!(good > 50 && bad > 50, "generator too one-sided: {good} good, {bad} bad");
}
