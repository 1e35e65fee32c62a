//! Models, verdicts and the combined report.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::CheckError;

/// The consistency model a history is checked against.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Model {
    StrictSerializable,
    Serializable,
    Linearizable,
    Causal,
}

impl Model {
    pub const ALL: [Model; 4] = [Model::StrictSerializable, Model::Serializable, Model::Linearizable, Model::Causal];

    pub fn name(self) -> &'static str {
        match self {
            Model::StrictSerializable => "strict-serializable",
            Model::Serializable => "serializable",
            Model::Linearizable => "linearizable",
            Model::Causal => "causal",
        }
    }
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Model {
    type Err = CheckError;
    fn from_str(s: &str) -> Result<Model, CheckError> {
        Model::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| {
            CheckError::UnknownModel(format!(
                "unknown model {s:?}; valid models are {}",
                Model::ALL.map(Model::name).join(", ")
            ))
        })
    }
}

/// One anomaly found by one checker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Anomaly {
    /// Elle-style name: "G0", "G1a", "G1b", "G1c", "G-single", "G2-item", "lost-update",
    /// "G-single-realtime", "read-your-writes", "non-linearizable", ...
    pub name: String,
    /// History indexes of the operations involved (completion index, or the invocation's if the
    /// operation never completed).
    pub ops: Vec<u64>,
    pub explanation: String,
    /// Which checker found it.
    pub checker: String,
}

/// What one checker concluded *about the model asked*. A checker that proved a weaker model
/// (say, serializability when strict serializability was asked) answers `None` and says so in
/// `detail`: a proof of the weaker model is not a proof of the stronger one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckerVerdict {
    pub name: String,
    pub version: String,
    /// `Some(true)`: proved the asked model; `Some(false)`: found a violation of it; `None`:
    /// unknown (budget exhausted, history outside what the checker supports, weaker model only).
    pub valid: Option<bool>,
    pub detail: String,
}

/// The combined verdict. Unknown is never valid.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Some checker proved the asked model, and none found an anomaly.
    Valid,
    /// Some checker found an anomaly (or two checkers disagree).
    Invalid,
    /// No checker could decide: neither a proof nor an anomaly.
    Unknown,
}

impl Verdict {
    /// The exit status of `kairos check`: 0 valid, 1 anomaly, 3 unknown (2 is unreadable input).
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Valid => 0,
            Verdict::Invalid => 1,
            Verdict::Unknown => 3,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Verdict::Valid => "VALID",
            Verdict::Invalid => "INVALID",
            Verdict::Unknown => "UNKNOWN",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The combined verdict of every checker run for a model.
#[derive(Clone, Debug, Serialize)]
pub struct CheckReport {
    pub model: Model,
    pub verdict: Verdict,
    /// `verdict == Valid`: kept for readers of older reports.
    pub valid: bool,
    /// Completed (`ok`, `fail` or `info`) operations checked.
    pub ops: usize,
    pub anomalies: Vec<Anomaly>,
    pub checkers: Vec<CheckerVerdict>,
    /// Set when two checkers reached opposite verdicts: a bug in one of them.
    pub disagreement: Option<String>,
    /// For an unknown verdict: why, and what would settle it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown_why: Option<String>,
    /// How the input was read: where real-time order came from, records skipped, keys renamed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl CheckReport {
    pub(crate) fn combine(model: Model, ops: usize, parts: Vec<(CheckerVerdict, Vec<Anomaly>)>) -> CheckReport {
        let mut anomalies = Vec::new();
        let mut checkers = Vec::new();
        for (v, a) in parts {
            checkers.push(v);
            anomalies.extend(a);
        }
        let yes: Vec<&str> = checkers.iter().filter(|c| c.valid == Some(true)).map(|c| c.name.as_str()).collect();
        let no: Vec<&str> = checkers.iter().filter(|c| c.valid == Some(false)).map(|c| c.name.as_str()).collect();
        let disagreement = (!yes.is_empty() && !no.is_empty()).then(|| {
            format!(
                "CHECKERS DISAGREE: {} accepted the history but {} rejected it; one of them has a bug",
                yes.join(", "),
                no.join(", ")
            )
        });
        let verdict = if !no.is_empty() || !anomalies.is_empty() || disagreement.is_some() {
            Verdict::Invalid
        } else if !yes.is_empty() {
            Verdict::Valid
        } else {
            Verdict::Unknown
        };
        let unknown_why = (verdict == Verdict::Unknown).then(|| {
            let why: Vec<String> = checkers.iter().map(|c| format!("{}: {}", c.name, c.detail)).collect();
            format!(
                "no checker proved {model} and none found an anomaly ({}). To settle it: raise the search budget \
                 (`--search-budget`), check a smaller part of the history, or check a weaker model",
                why.join("; ")
            )
        });
        CheckReport {
            model,
            verdict,
            valid: verdict == Verdict::Valid,
            ops,
            anomalies,
            checkers,
            disagreement,
            unknown_why,
            notes: Vec::new(),
        }
    }

    /// Names of the anomalies a given checker reported.
    pub fn anomaly_names(&self, checker: &str) -> Vec<&str> {
        self.anomalies.iter().filter(|a| a.checker == checker).map(|a| a.name.as_str()).collect()
    }

    /// The verdict of the named checker, if it ran.
    pub fn verdict(&self, checker: &str) -> Option<&CheckerVerdict> {
        self.checkers.iter().find(|c| c.name == checker)
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}: {} operations checked against {}", self.verdict, self.ops, self.model)?;
        for n in &self.notes {
            writeln!(f, "  note: {n}")?;
        }
        if let Some(d) = &self.disagreement {
            writeln!(f, "!!! {d} !!!")?;
        }
        for c in &self.checkers {
            let v = match c.valid {
                Some(true) => "valid",
                Some(false) => "INVALID",
                None => "unknown",
            };
            writeln!(f, "  checker {} {}: {v} — {}", c.name, c.version, c.detail)?;
        }
        for a in &self.anomalies {
            let ops: Vec<String> = a.ops.iter().map(u64::to_string).collect();
            writeln!(f, "anomaly {} (found by {}) involving ops at indexes [{}]:", a.name, a.checker, ops.join(", "))?;
            for line in a.explanation.lines() {
                writeln!(f, "    {line}")?;
            }
        }
        if let Some(why) = &self.unknown_why {
            writeln!(f, "unknown: {why}")?;
        }
        Ok(())
    }
}
