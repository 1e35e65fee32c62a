//! Histories other projects wrote, with the verdicts their own tests expect. Nothing fetched is
//! kept in this repository, so this test runs only when pointed at a local copy:
//!
//! ```sh
//! KAIROS_EXTERNAL_CORPUS=/path/to/corpus cargo test -p kairos-check --release --test external -- --ignored --nocapture
//! ```
//!
//! The folder holds the histories (for example Elle's `histories/`, Knossos's `data/`,
//! porcupine's `test_data/kv/`, elle-cli's `histories/`) and a `verdicts.tsv` with a header
//! and the columns `path` (relative to the folder), `model` (strict-serializable,
//! serializable or linearizable) and `expected` (valid or invalid), taken from each project's
//! tests. Further columns are ignored. The test prints every disagreement and fails on any
//! that is not listed in the optional `known-disagreements.tsv` (`path`, `model`, `why`).

use std::path::PathBuf;

use kairos_check::{check_history, load_history, CheckOptions, Model, Verdict};

#[test]
#[ignore = "needs KAIROS_EXTERNAL_CORPUS: a local copy of other projects' histories"]
fn external_histories_get_the_verdicts_their_projects_expect() {
    let Some(dir) = std::env::var_os("KAIROS_EXTERNAL_CORPUS").map(PathBuf::from) else {
        panic!("set KAIROS_EXTERNAL_CORPUS to a folder with verdicts.tsv (see this file's docs)");
    };
    let table = std::fs::read_to_string(dir.join("verdicts.tsv")).expect("verdicts.tsv");
    let known = std::fs::read_to_string(dir.join("known-disagreements.tsv")).unwrap_or_default();
    let is_known = |path: &str, model: &str| {
        known.lines().any(|l| {
            let mut c = l.split('\t');
            c.next() == Some(path) && c.next() == Some(model)
        })
    };
    let (mut agree, mut unexpected, mut explained) = (0, Vec::new(), 0);
    for line in table.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let cols: Vec<&str> = line.split('\t').collect();
        let [path, model, expected, ..] = cols[..] else { panic!("bad row {line:?}") };
        let m: Model = model.parse().unwrap();
        let got = match load_history(&dir.join(path)).and_then(|h| check_history(&h, m, &CheckOptions::default())) {
            Ok(r) => match r.verdict {
                Verdict::Valid => "valid".to_string(),
                Verdict::Invalid => "invalid".to_string(),
                Verdict::Unknown => "unknown".to_string(),
            },
            Err(e) => format!("error: {e}"),
        };
        if got == expected {
            agree += 1;
        } else if is_known(path, model) {
            explained += 1;
            println!("known disagreement: {path} as {model}: expected {expected}, got {got}");
        } else {
            unexpected.push(format!("{path} as {model}: expected {expected}, got {got}"));
        }
    }
    println!("{agree} agree, {explained} known disagreements, {} unexpected", unexpected.len());
    assert!(agree > 0, "no history checked");
    assert!(unexpected.is_empty(), "{}", unexpected.join("\n"));
}
