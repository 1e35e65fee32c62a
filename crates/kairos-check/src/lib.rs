//! History checkers for Kairos.
//!
//! Every simulated (or real) run records its client-visible history in Jepsen's shape (see
//! [`kairos_core::history`]); this crate decides whether it satisfies a consistency
//! [`Model`]. No verdict rests on one implementation: each model is checked by two independent
//! checkers where possible, and a disagreement is reported loudly and counted as invalid.
//!
//! | model | checker 1 (external) | checker 2 (ours) |
//! |---|---|---|
//! | `serializable`, `strict-serializable` (rw-register `r`/`w`, or list-append `r`/`append`) | `adya` 0.1: Elle-style dependency graph + typed cycle search (`txn::adya`) | exact search for a serial order (WGL-style DFS with memoization, real-time-minimal candidates for strict), plus direct anomaly checks and our own cycle naming (`txn::search`, `txn::direct`, `txn::graph`) |
//! | `linearizable` (per key; `read`/`write`/`cas` with one micro-op) | `todc-utils` 0.1 `WGLChecker` (`linear::todc`) | our Wing–Gong–Lowe with Lowe's memoization (`linear::wgl`) |
//! | `causal` (session guarantees over list-append) | — (none exists) | `causal`: prefix consistency, read-your-writes, monotonic reads, monotonic writes, writes-follow-reads |
//!
//! # Assumptions
//! * `ok` took effect, `fail` did not, `info` (and an invocation never completed) may or may
//!   not have — at any time after its invocation.
//! * Values written to a key are unique (rw-register) and appended values are unique per key
//!   (list-append); adya needs this to infer dependencies, our search does not.
//! * Real time (strict serializability, linearizability) is the order of records in the
//!   history, which must carry `time` fields that never decrease; histories without `time`
//!   are refused for those models (they are fine for `serializable` and `causal`).
//! * Our serial search and WGL memoize on 128-bit digests of (placed set, state); a collision
//!   could prune wrongly (negligible probability). The serial search has a step budget; past
//!   it its verdict is unknown (`valid: None`) and the verdict rests on adya alone.
//! * `todc-utils` is quadratic per step: keys with more than 3000 operations are skipped.
//!
//! # Validating the checkers
//! `corpus/manifest.json` lists known-bad histories (G0, G1a, G1b, G1c, G-single, G2-item,
//! lost update, stale read after a completed write, the Tiga timestamp-inversion history,
//! non-linearizable registers, one per broken session guarantee) and known-good ones;
//! `tests/corpus.rs` asserts every verdict and anomaly name for every applicable checker and
//! that paired checkers agree. `tests/robust.rs` feeds malformed input and large generated
//! histories.

pub mod causal;
mod linear;
mod ops;
pub mod parse;
pub mod report;
mod txn;

use kairos_core::history::HistoryRecord;

pub use parse::{load_history, parse_history, TIME_UNKNOWN};
pub use report::{Anomaly, CheckReport, CheckerVerdict, Model};

/// Names of the checkers, as they appear in [`CheckerVerdict::name`] and [`Anomaly::checker`].
pub mod checkers {
    pub const ADYA: &str = "adya";
    pub const SERIAL_SEARCH: &str = "kairos-serial-search";
    pub const TODC: &str = "todc-utils";
    pub const WGL: &str = "kairos-wgl";
    pub const CAUSAL: &str = "kairos-causal";
}

/// Why a history could not be read or checked.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CheckError {
    #[error("line {line}: {message}")]
    Parse { line: usize, message: String },
    #[error("cannot read {path}: {message}")]
    Io { path: String, message: String },
    #[error("malformed history: {0}")]
    Structure(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    UnknownModel(String),
}

impl CheckError {
    pub(crate) fn parse(line: usize, message: impl Into<String>) -> CheckError {
        CheckError::Parse { line, message: message.into() }
    }
}

/// Checks a history against a model with every applicable checker.
pub fn check(history: &[HistoryRecord], model: Model) -> Result<CheckReport, CheckError> {
    let ops = ops::pair(history)?;
    let completed = ops.iter().filter(|o| o.done_pos.is_some()).count();
    let parts = match model {
        Model::Serializable | Model::StrictSerializable => {
            let strict = model == Model::StrictSerializable;
            if strict {
                parse::require_time(history, model.name())?;
            }
            let ours = txn::check_ours(&ops, strict)?;
            let adya = txn::adya::check(history, strict)?;
            vec![adya, ours]
        }
        Model::Linearizable => {
            parse::require_time(history, model.name())?;
            linear::check(&ops)?
        }
        Model::Causal => vec![causal::check(&ops)?],
    };
    Ok(CheckReport::combine(model, completed, parts))
}
