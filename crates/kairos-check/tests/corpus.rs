//! Every corpus history gets the verdict and anomaly its manifest promises, from every
//! applicable checker, and paired checkers agree — but for a checker the manifest names as
//! missing a bad history (`missed_by`), which must still accept it, the disagreement flagged.
//! adya only refutes (`kairos_check` docs): on a good history it says unknown, and on a bad
//! one it misses, unknown too (no disagreement to flag).

use std::path::PathBuf;

use kairos_check::{check, checkers, load_history, Model};
use serde_json::Value;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

/// A checker whose "no anomaly" is no proof: it answers unknown there.
fn refutes_only(checker: &str) -> bool {
    checker == checkers::ADYA
}

fn checkers_for(model: Model) -> &'static [&'static str] {
    match model {
        Model::Serializable | Model::StrictSerializable => &[checkers::ADYA, checkers::SERIAL_SEARCH],
        Model::Linearizable => &[checkers::TODC, checkers::WGL],
        Model::Causal => &[checkers::CAUSAL],
    }
}

#[test]
fn corpus_matches_manifest() {
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(corpus().join("manifest.json")).unwrap()).unwrap();
    let entries = manifest["histories"].as_array().unwrap();
    assert!(entries.len() >= 20, "manifest lost entries");
    let mut failures = Vec::new();
    let mut checked = 0;
    for e in entries {
        let file = e["file"].as_str().unwrap();
        let h = load_history(&corpus().join(file)).unwrap_or_else(|err| panic!("{file}: {err}"));
        for x in e["expect"].as_array().unwrap() {
            let model: Model = x["model"].as_str().unwrap().parse().unwrap();
            let want = x["valid"].as_bool().unwrap();
            let r = check(&h, model).unwrap_or_else(|err| panic!("{file} {model}: {err}"));
            checked += 1;
            let ctx = format!("{file} as {model}:\n{r}");
            if r.valid != want {
                failures.push(format!("expected valid={want}; {ctx}"));
            }
            let missed: Vec<&str> =
                x["missed_by"].as_object().map_or(vec![], |m| m.keys().map(String::as_str).collect());
            assert!(missed.is_empty() || !want, "{file}: missed_by is for bad histories");
            if missed.is_empty() && r.disagreement.is_some() {
                failures.push(format!("checkers disagree; {ctx}"));
            }
            let accepting: Vec<&str> = missed.iter().copied().filter(|c| !refutes_only(c)).collect();
            if !accepting.is_empty() && r.disagreement.is_none() {
                failures.push(format!("checkers {accepting:?} should miss the anomaly, and the report flag it; {ctx}"));
            }
            for c in missed.iter().copied() {
                assert!(checkers_for(model).contains(&c), "{file}: {c} is not a checker of {model}");
                let missing = if refutes_only(c) { None } else { Some(true) };
                match r.verdict(c) {
                    Some(v) if v.valid == missing => {}
                    other => failures.push(format!(
                        "checker {c} gave {other:?}: it no longer misses this history, update missed_by; {ctx}"
                    )),
                }
            }
            for c in checkers_for(model).iter().filter(|c| !missed.contains(c)) {
                let expected = if refutes_only(c) && want { None } else { Some(want) };
                match r.verdict(c) {
                    Some(v) if v.valid == expected => {}
                    other => failures.push(format!("checker {c} gave {other:?}, expected {expected:?}; {ctx}")),
                }
                if let Some(name) = x["anomaly"].as_str() {
                    if !r.anomaly_names(c).contains(&name) {
                        failures.push(format!("checker {c} did not name {name}; {ctx}"));
                    }
                }
            }
            // The dependency-graph checker may be unable to decide (blind writes leave version
            // order open), but it never contradicts the expected verdict.
            if let Some(v) = r.verdict(checkers::DSG) {
                if v.valid == Some(!want) {
                    failures.push(format!("checker {} gave {:?}, expected {want}; {ctx}", checkers::DSG, v.valid));
                }
            }
            if !want && !r.to_string().contains("INVALID") {
                failures.push(format!("report text does not say INVALID; {ctx}"));
            }
        }
    }
    assert!(checked >= 28, "only {checked} expectations checked");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n----\n"));
}
