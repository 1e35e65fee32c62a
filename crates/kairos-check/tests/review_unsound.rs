//! Adversarial reviews (2026-12-07): histories the checkers got wrong. Every test here failed
//! on the code reviewed (main at e436818, then 17fe27c for the second review's), and passes
//! since the fixes; the second review's probes passed throughout.

use kairos_check::{check_history, parse_history, CheckOptions, CheckReport, Model, Verdict};

fn run(text: &str, m: Model) -> CheckReport {
    let h = parse_history(text).unwrap();
    check_history(&h, m, &CheckOptions::default()).unwrap()
}
fn rec(t: &str, p: u64, v: &str) -> String {
    format!("{{\"type\":\"{t}\",\"process\":{p},\"value\":{v}}}\n")
}
fn inv(p: u64, v: &str) -> String {
    rec("invoke", p, v)
}
fn ok(p: u64, v: &str) -> String {
    rec("ok", p, v)
}
fn info(p: u64, v: &str) -> String {
    rec("info", p, v)
}
/// An invocation immediately followed by its `ok` completion.
fn op(p: u64, inv_v: &str, ok_v: &str) -> String {
    inv(p, inv_v) + &ok(p, ok_v)
}
fn op_info(p: u64, v: &str) -> String {
    inv(p, v) + &info(p, v)
}
/// `n` concurrent `ok` appends of distinct values to list key `k`, never read: harmless, but
/// the serial search must try every order of them (n! states) before it can refute.
fn concurrent_unread_appends(k: u64, n: u64) -> String {
    let mut h = String::new();
    for p in 0..n {
        h += &inv(100 + p, &format!(r#"[["append",{k},{}]]"#, 100 + p));
    }
    for p in 0..n {
        h += &ok(100 + p, &format!(r#"[["append",{k},{}]]"#, 100 + p));
    }
    h
}
/// `n` concurrent `ok` blind writes of distinct values to register `k`, never read.
fn concurrent_blind_writes(k: u64, n: u64) -> String {
    let mut h = String::new();
    for p in 0..n {
        h += &inv(100 + p, &format!(r#"[["w",{k},{}]]"#, 100 + p));
    }
    for p in 0..n {
        h += &ok(100 + p, &format!(r#"[["w",{k},{}]]"#, 100 + p));
    }
    h
}

// ---------------------------------------------------------------- causal (unsound)

/// a -> (B reads a, appends b) -> (C reads b, appends c) -> D reads c, then reads k1 without a.
/// Causality is transitive (WFR + MR at the servers: a server holding c holds b holds a).
#[test]
fn causal_transitive_dependency_is_enforced() {
    let mut h = String::new();
    h += &op(0, r#"[["append",1,1]]"#, r#"[["append",1,1]]"#);
    h += &op(1, r#"[["r",1,null]]"#, r#"[["r",1,[1]]]"#);
    h += &op(1, r#"[["append",2,2]]"#, r#"[["append",2,2]]"#);
    h += &op(2, r#"[["r",2,null]]"#, r#"[["r",2,[2]]]"#);
    h += &op(2, r#"[["append",3,3]]"#, r#"[["append",3,3]]"#);
    h += &op(3, r#"[["r",3,null]]"#, r#"[["r",3,[3]]]"#);
    h += &op(3, r#"[["r",1,null]]"#, r#"[["r",1,[]]]"#);
    let r = run(&h, Model::Causal);
    assert_eq!(r.verdict, Verdict::Invalid, "{r}");
}

/// Session 1 reads k1=[1] then appends 2 to k2 and times out (info). Session 2 observes 2, so
/// the append took effect, after session 1's read: session 2 must then see 1 in k1 (WFR).
#[test]
fn causal_observed_info_append_carries_its_dependencies() {
    let mut h = String::new();
    h += &op(0, r#"[["append",1,1]]"#, r#"[["append",1,1]]"#);
    h += &op(1, r#"[["r",1,null]]"#, r#"[["r",1,[1]]]"#);
    h += &inv(1, r#"[["append",2,2]]"#);
    h += &info(1, r#"[["append",2,2]]"#);
    h += &op(2, r#"[["r",2,null]]"#, r#"[["r",2,[2]]]"#);
    h += &op(2, r#"[["r",1,null]]"#, r#"[["r",1,[]]]"#);
    let r = run(&h, Model::Causal);
    assert_eq!(r.verdict, Verdict::Invalid, "{r}");
}

// ------------------------------------------------------- transactions (unsound)

/// T0 appends 1 then 2 to key 1 (one transaction); T1 appends 3; a reader sees [2, 1, 3]:
/// impossible in any serial execution. adya and kairos-dsg both "prove" it strictly
/// serializable; only the serial search refutes it, and 11 unread concurrent appends to
/// another key push the search past its default budget. Verdict: VALID.
#[test]
fn list_read_reversing_a_transactions_own_appends_is_not_valid() {
    let mut h = concurrent_unread_appends(2, 11);
    h += &op(0, r#"[["append",1,1],["append",1,2]]"#, r#"[["append",1,1],["append",1,2]]"#);
    h += &op(1, r#"[["append",1,3]]"#, r#"[["append",1,3]]"#);
    h += &op(2, r#"[["r",1,null]]"#, r#"[["r",1,[2,1,3]]]"#);
    let r = run(&h, Model::StrictSerializable);
    assert_ne!(r.verdict, Verdict::Valid, "{r}");
    // Each checker that claims a proof must not claim one for this history.
    for c in ["adya", "kairos-dsg"] {
        assert_ne!(r.verdict(c).unwrap().valid, Some(true), "{c} proved a non-serializable history:\n{r}");
    }
}

/// Stale read after a completed write (the corpus's `stale-read`), but with > 4,000 records
/// (adya's linearizable_keys is switched off) and 20 concurrent blind writes to another key
/// (the serial search exhausts its budget). adya's "valid" is then taken as a proof.
#[test]
fn stale_read_in_a_large_blind_write_history_is_not_valid() {
    let mut h = String::new();
    for i in 0..2100u64 {
        let v = format!(r#"[["w",{},1]]"#, 1000 + i);
        h += &op(0, &v, &v);
    }
    for p in 0..20u64 {
        h += &inv(100 + p, &format!(r#"[["w",2,{}]]"#, 100 + p));
    }
    for p in 0..20u64 {
        h += &ok(100 + p, &format!(r#"[["w",2,{}]]"#, 100 + p));
    }
    h += &op(1, r#"[["w",1,1]]"#, r#"[["w",1,1]]"#);
    h += &op(1, r#"[["w",1,2]]"#, r#"[["w",1,2]]"#); // completes before the read below
    h += &op(2, r#"[["r",1,null]]"#, r#"[["r",1,1]]"#); // stale
    let r = run(&h, Model::StrictSerializable);
    assert_ne!(r.verdict, Verdict::Valid, "{r}");
}

/// kairos-dsg drops the "nil precedes every write" edges when (nil readers x written values)
/// of a key exceeds 1,000,000, without recording a gap, then claims a complete graph. Here a
/// read of nil after a 1,000-write chain completed (a stale read) is "proved" strictly
/// serializable. (A list key makes adya refuse the mixed history; 11 unread concurrent
/// appends exhaust the serial search.)
#[test]
fn dsg_nil_edge_cutoff_does_not_prove_a_stale_nil_read() {
    let mut h = String::new();
    for _ in 0..1001u64 {
        h += &op(0, r#"[["r",1,null]]"#, r#"[["r",1,null]]"#);
    }
    h += &concurrent_unread_appends(2, 11);
    h += &op(0, r#"[["r",1,null],["w",1,1]]"#, r#"[["r",1,null],["w",1,1]]"#);
    for v in 2..=1000u64 {
        h += &op(0, &format!(r#"[["r",1,null],["w",1,{v}]]"#), &format!(r#"[["r",1,{}],["w",1,{v}]]"#, v - 1));
    }
    h += &op(1, r#"[["r",1,null]]"#, r#"[["r",1,null]]"#); // stale: the chain completed
    let r = run(&h, Model::StrictSerializable);
    assert_ne!(r.verdict, Verdict::Valid, "{r}");
    assert_ne!(r.verdict("kairos-dsg").unwrap().valid, Some(true), "{r}");
}

// --------------------------------------------- transactions (valid reported invalid)

/// T0 writes 1 then 2; T1 writes 1; T2 reads 1 (T1's write). Serial order T0, T1, T2.
/// Reported as G1b: the intermediate-write map ignores that 1 is also a committed final value.
#[test]
fn read_of_a_value_also_written_finally_is_not_g1b() {
    let mut h = String::new();
    h += &op(0, r#"[["w",1,1],["w",1,2]]"#, r#"[["w",1,1],["w",1,2]]"#);
    h += &op(1, r#"[["w",1,1]]"#, r#"[["w",1,1]]"#);
    h += &op(2, r#"[["r",1,null]]"#, r#"[["r",1,1]]"#);
    let r = run(&h, Model::StrictSerializable);
    assert_eq!(r.verdict, Verdict::Valid, "{r}");
}

/// w(1); r(1)w(2); w(1); r(1)w(3) — sequential, plainly serializable (ABA on a register).
/// Reported as lost-update (direct) and G2-item (kairos-dsg): both infer from the duplicate value 1.
#[test]
fn aba_register_is_not_a_lost_update() {
    let mut h = String::new();
    h += &op(0, r#"[["w",1,1]]"#, r#"[["w",1,1]]"#);
    h += &op(1, r#"[["r",1,null],["w",1,2]]"#, r#"[["r",1,1],["w",1,2]]"#);
    h += &op(0, r#"[["w",1,1]]"#, r#"[["w",1,1]]"#);
    h += &op(2, r#"[["r",1,null],["w",1,3]]"#, r#"[["r",1,1],["w",1,3]]"#);
    let r = run(&h, Model::StrictSerializable);
    assert_eq!(r.verdict, Verdict::Valid, "{r}");
}

// ------------------------------------------------------------ linearizability (minor)

/// The tombstone "deletes the key for good: no other write may follow it", but an `ok` CAS
/// from the tombstone re-creates the key and the history is VALID.
#[test]
fn cas_from_tombstone_does_not_resurrect_a_deleted_key() {
    let t = kairos_core::history::TOMBSTONE;
    let mut h = String::new();
    h += &op(0, r#"[["w",1,5]]"#, r#"[["w",1,5]]"#);
    h += &op(0, &format!(r#"[["w",1,{t}]]"#), &format!(r#"[["w",1,{t}]]"#));
    h += &op(0, &format!(r#"[["cas",1,[{t},7]]]"#), &format!(r#"[["cas",1,[{t},7]]]"#));
    h += &op(1, r#"[["r",1,null]]"#, r#"[["r",1,7]]"#);
    let r = run(&h, Model::Linearizable);
    assert_eq!(r.verdict, Verdict::Invalid, "{r}");
}

// ---------------------------------- a second review (of 17fe27c): false negatives

/// Lost update on a LIST key whose read ends in an ambiguous value. T3 and T4 (both ok) read
/// key 1 as [1, 2] and both appended to it: in any serial order the second would have seen the
/// first's append. A list only grows, so two equal list reads are the same version: the
/// duplicate value 2 (also appended by an info transaction) changes nothing. 17fe27c's
/// `ambiguous_read` skipped it as it does for registers; kairos-dsg has no writer for 2 or 3
/// and cannot refute, adya refuses duplicate values, and the search is out of budget: the
/// verdict was unknown.
#[test]
fn list_lost_update_behind_an_ambiguous_value_is_still_invalid() {
    let mut h = concurrent_unread_appends(2, 11);
    h += &op(0, r#"[["append",1,1]]"#, r#"[["append",1,1]]"#);
    h += &op(1, r#"[["append",1,2]]"#, r#"[["append",1,2]]"#);
    h += &op_info(5, r#"[["append",1,2]]"#); // duplicate 2: never happened (the reads show one 2)
    h += &op_info(6, r#"[["append",1,3]]"#); // duplicate 3
    h += &op(3, r#"[["r",1,null],["append",1,3]]"#, r#"[["r",1,[1,2]],["append",1,3]]"#);
    h += &op(4, r#"[["r",1,null],["append",1,4]]"#, r#"[["r",1,[1,2]],["append",1,4]]"#);
    h += &op(7, r#"[["r",1,null]]"#, r#"[["r",1,[1,2,3,4]]]"#);
    let r = run(&h, Model::Serializable);
    assert_eq!(r.verdict, Verdict::Invalid, "{r}");
}

/// A register value that two transactions each wrote and overwrote (intermediate only, in
/// both): whoever's it was, reading it is G1b. 17fe27c made the value "ambiguous", and every
/// direct check skipped it: the verdict stayed Invalid (the search refutes at once) but only
/// as an anonymous "serializability-violation".
#[test]
fn read_of_a_value_only_ever_written_intermediately_is_g1b() {
    let mut h = concurrent_blind_writes(2, 20);
    h += &op(0, r#"[["w",1,1],["w",1,2]]"#, r#"[["w",1,1],["w",1,2]]"#);
    h += &op(1, r#"[["w",1,1],["w",1,3]]"#, r#"[["w",1,1],["w",1,3]]"#);
    h += &op(3, r#"[["r",1,null]]"#, r#"[["r",1,1]]"#);
    let r = run(&h, Model::Serializable);
    assert_eq!(r.verdict, Verdict::Invalid, "{r}");
    // The search refutes it (no final write of 1 exists); the direct check names it.
    assert!(r.anomaly_names("kairos-serial-search").contains(&"G1b"), "{r}");
}

// ------------------------------------------------------------------ FALSE POSITIVES

/// T0 writes 1, 2, then 1 again (ABA inside one transaction; it names itself, as
/// ambiguous_writes now says); T1 reads 1 — T0's final value. Serial order T0, T1.
/// Was reported G1b: `inter` held (1, 1) and was consulted before `writer`.
#[test]
fn read_of_a_final_value_the_writer_also_wrote_earlier_is_not_g1b() {
    let mut h = String::new();
    h += &op(0, r#"[["w",1,1],["w",1,2],["w",1,1]]"#, r#"[["w",1,1],["w",1,2],["w",1,1]]"#);
    h += &op(1, r#"[["r",1,null]]"#, r#"[["r",1,1]]"#);
    let r = run(&h, Model::StrictSerializable);
    assert_eq!(r.verdict, Verdict::Valid, "{r}");
}

/// Causal: "must see a" is expanded to the obligations of every value BEFORE `a` in its key's
/// order, although those values need not be in the observer's causal past. Session 2 appends
/// 21 to key 1 blindly, then 30 to key 3. Session 1 (which had read 10 in key 2) appended 20 to
/// key 1, ordered before 21. Session 3 sees 30, so must see 21 (MW) — but 20 is concurrent with
/// 21 and 30, and so is 10: session 3 reading key 2 as [] is causal (its causal past is {21, 30}).
/// Session 3 later reads key 1 as [20, 21], and only then has it seen 20.
#[test]
fn causal_obligation_does_not_reach_values_before_a_required_one() {
    let mut h = String::new();
    h += &op(0, r#"[["append",2,10]]"#, r#"[["append",2,10]]"#);
    h += &op(1, r#"[["r",2,null]]"#, r#"[["r",2,[10]]]"#);
    h += &op(1, r#"[["append",1,20]]"#, r#"[["append",1,20]]"#);
    h += &op(2, r#"[["append",1,21]]"#, r#"[["append",1,21]]"#);
    h += &op(2, r#"[["append",3,30]]"#, r#"[["append",3,30]]"#);
    h += &op(3, r#"[["r",3,null]]"#, r#"[["r",3,[30]]]"#);
    h += &op(3, r#"[["r",2,null]]"#, r#"[["r",2,[]]]"#);
    h += &op(3, r#"[["r",1,null]]"#, r#"[["r",1,[20,21]]]"#);
    let r = run(&h, Model::Causal);
    assert_eq!(r.verdict, Verdict::Valid, "{r}");
}

/// Causal, monotonic-writes on one key: session 0 appends 1 (ok), then 2 (info). Session 1 reads
/// [2, 1]: 2 took effect (it is read), after its invocation, which followed 1's completion, so
/// 1 must precede 2. Was not flagged: the same-key order check skipped `info` appends even
/// when the key's order showed they took effect.
#[test]
fn causal_observed_info_append_ordered_before_its_sessions_earlier_append() {
    let mut h = String::new();
    h += &op(0, r#"[["append",1,1]]"#, r#"[["append",1,1]]"#);
    h += &op_info(0, r#"[["append",1,2]]"#);
    h += &op(1, r#"[["r",1,null]]"#, r#"[["r",1,[2,1]]]"#);
    let r = run(&h, Model::Causal);
    assert_eq!(r.verdict, Verdict::Invalid, "{r}");
}

// ------------------------------------------- probes expected to PASS (tried, no bug)

/// A transaction appends to a key, reads it, appends again; others read its appends whole.
#[test]
fn probe_append_read_append_is_one_run() {
    let mut h = String::new();
    h += &op(0, r#"[["append",1,1]]"#, r#"[["append",1,1]]"#);
    h += &op(
        1,
        r#"[["append",1,2],["r",1,null],["append",1,3],["r",1,null]]"#,
        r#"[["append",1,2],["r",1,[1,2]],["append",1,3],["r",1,[1,2,3]]]"#,
    );
    h += &op(2, r#"[["r",1,null],["append",1,4]]"#, r#"[["r",1,[1,2,3]],["append",1,4]]"#);
    h += &op(3, r#"[["r",1,null]]"#, r#"[["r",1,[1,2,3,4]]]"#);
    let r = run(&h, Model::StrictSerializable);
    assert_eq!(r.verdict, Verdict::Valid, "{r}");
}

/// Info and never-completed appenders, seen whole, in the middle of a read.
#[test]
fn probe_info_appenders_seen_whole() {
    let mut h = String::new();
    h += &op_info(0, r#"[["append",1,1],["append",1,2]]"#);
    h += &inv(1, r#"[["append",1,3],["append",2,9],["append",1,4]]"#);
    h += &op(2, r#"[["r",1,null],["append",1,5]]"#, r#"[["r",1,[1,2,3,4]],["append",1,5]]"#);
    h += &op(3, r#"[["r",1,null],["r",2,null]]"#, r#"[["r",1,[1,2,3,4,5]],["r",2,[9]]]"#);
    let r = run(&h, Model::Serializable);
    assert_eq!(r.verdict, Verdict::Valid, "{r}");
}

/// Causal: info append observed, then the same session's later ok append.
#[test]
fn probe_causal_info_then_ok() {
    let mut h = String::new();
    h += &op_info(0, r#"[["append",1,1]]"#);
    h += &op(0, r#"[["append",2,2]]"#, r#"[["append",2,2]]"#);
    h += &op(1, r#"[["r",2,null]]"#, r#"[["r",2,[2]]]"#);
    h += &op(1, r#"[["r",1,null]]"#, r#"[["r",1,[]]]"#);
    h += &op(2, r#"[["r",1,null]]"#, r#"[["r",1,[1]]]"#);
    let r = run(&h, Model::Causal);
    assert_eq!(r.verdict, Verdict::Valid, "{r}");
}
