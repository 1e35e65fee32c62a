//! History checkers for Kairos.
//!
//! Every simulated (or real) run records its client-visible history in Jepsen's shape (see
//! [`kairos_core::history`]); this crate decides whether it satisfies a consistency
//! [`Model`]. It also reads the histories other tools write: Jepsen's and Elle's EDN, Knossos's
//! registers, porcupine's key-value logs ([`parse`]).
//!
//! | model | external checker | ours |
//! |---|---|---|
//! | `serializable`, `strict-serializable` (rw-register `r`/`w`/`cas`, or list-append `r`/`append`) | `adya` 0.1: Elle-style dependency graph + typed cycle search (`txn::adya`) | an exact search for a serial order (`txn::search`, with direct anomaly checks in `txn::direct`), and Adya's dependency graph with O(n) real-time edges (`txn::graph`, checker `kairos-dsg`) |
//! | `linearizable` (per key; single-micro-op read / write / cas / append) | `todc-utils` 0.1 `WGLChecker` (`linear::todc`) | our Wing–Gong–Lowe with Lowe's memoization (`linear::wgl`) |
//! | `causal` (session guarantees over list-append) | — (none exists) | `causal`: prefix consistency, read-your-writes, monotonic reads, monotonic writes, writes-follow-reads |
//!
//! # Verdicts: unknown is never valid
//! Each checker answers about the model *asked*: proved (`Some(true)`), violated
//! (`Some(false)`), or unknown (`None`: budget exhausted, input outside what it handles, or only
//! a weaker model proved — adya above 20,000 records checks plain
//! serializability, which is no proof of strict serializability). The combined [`Verdict`] is
//! valid only when some checker proved the model and none found an anomaly; invalid when any
//! found one (or two disagree); unknown otherwise, with what would settle it.
//!
//! **Who may prove.** A proof is a serial order the search found and replayed, or an acyclic
//! dependency graph over a complete version order; adya only refutes (its "no anomaly" is
//! unknown): a review outside the suite (2026-12-07) showed it accepting a list read that
//! reverses one transaction's appends, and a stale read among blind writes past its
//! `linearizable_keys` limit, and with the search out of budget either was called valid. The
//! same review's histories are `tests/review_unsound.rs`.
//!
//! # Assumptions
//! * `ok` took effect, `fail` did not, `info` (and an invocation never completed) may or may
//!   not have — at any time after its invocation.
//! * A write of unknown value (`["w", k, null]`, as a client records an increment whose
//!   result it never learned) may appear in an invocation, an `info` or a `fail`; an `ok` must
//!   carry the value it wrote (else the history is malformed). If its transaction took effect,
//!   it wrote some single value, not `nil`, to `k`. The serial search is exact for this: the
//!   value is bound by the first read that sees it. The direct checks infer nothing from a
//!   non-`nil` read of such a key that needs to know its writer (garbage, aborted,
//!   intermediate reads, lost updates); the dependency graph draws no edge from such a read and
//!   then cannot prove, only refute; adya is given a fresh value nobody reads, so it infers
//!   nothing from reads of the value really written and may miss an anomaly that needs them.
//! * Real time (strict serializability, linearizability) is the order of records, as Jepsen
//!   takes it; `time` is information only (the report notes when it is missing or goes back).
//! * adya infers dependencies from unique written values; a history that writes a value twice
//!   to a key is not given to it, and ours infers nothing from such values (the search does not
//!   need uniqueness; the dependency graph then cannot prove, only refute).
//! * The dependency graph proves a model only when the history fixes every key's version
//!   order (read-modify-write registers, list-append); otherwise it can only find cycles.
//! * Our serial search and WGL memoize on digests of (placed set, state); a collision could
//!   prune wrongly (negligible probability). Both have step budgets ([`CheckOptions`]); past
//!   them their verdict is unknown and the report names the budget.
//! * `todc-utils` is quadratic per step and has no budget: keys with more than 3000
//!   operations, or that our search could not settle, are skipped.
//!
//! # Validating the checkers
//! `corpus/manifest.json` lists known-bad histories (G0, G1a, G1b, G1c, G-single, G2-item,
//! lost update, stale read after a completed write, the Tiga timestamp-inversion history,
//! non-linearizable registers, one per broken session guarantee) and known-good ones;
//! `tests/corpus.rs` asserts every verdict and anomaly name for every applicable checker and
//! that paired checkers agree. `tests/formats.rs` re-encodes them in every syntax and at sizes
//! past adya's real-time limit; `tests/robust.rs` feeds malformed input and large generated
//! histories; `tests/external.rs` runs other projects' histories from a local copy.

pub mod causal;
mod linear;
mod ops;
pub mod parse;
pub mod report;
mod txn;

use kairos_core::history::HistoryRecord;

pub use parse::symbols::Symbols;
pub use parse::{load_history, parse_history, parse_history_as, History, Syntax, TIME_UNKNOWN};
pub use report::{Anomaly, CheckReport, CheckerVerdict, Model, Verdict};

/// Names of the checkers, as they appear in [`CheckerVerdict::name`] and [`Anomaly::checker`].
pub mod checkers {
    pub const ADYA: &str = "adya";
    pub const SERIAL_SEARCH: &str = "kairos-serial-search";
    pub const DSG: &str = "kairos-dsg";
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

/// Settings of a check.
#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    /// Steps a search may take before its verdict is unknown: the serial-order search of the
    /// transactional models (default 2,000,000 plus 20 per transaction), and the
    /// linearizability search, per key (default 2,000,000, and ten times that for the keys left
    /// undecided when no key was found non-linearizable).
    pub search_budget: Option<u64>,
}

/// Checks in-memory records (a simulated run's history) against a model with every applicable
/// checker.
pub fn check(history: &[HistoryRecord], model: Model) -> Result<CheckReport, CheckError> {
    check_records(history, &Symbols::default(), model, &CheckOptions::default())
}

/// Checks a parsed history: as [`check`], with its key and value names and reading notes in
/// the report.
pub fn check_history(history: &History, model: Model, opts: &CheckOptions) -> Result<CheckReport, CheckError> {
    let mut report = check_records(&history.records, &history.symbols, model, opts)?;
    report.notes = history.notes.clone();
    Ok(report)
}

fn check_records(
    history: &[HistoryRecord],
    symbols: &Symbols,
    model: Model,
    opts: &CheckOptions,
) -> Result<CheckReport, CheckError> {
    let ops = ops::pair(history)?;
    let completed = ops.iter().filter(|o| o.done_pos.is_some()).count();
    let parts = match model {
        Model::Serializable | Model::StrictSerializable => {
            let strict = model == Model::StrictSerializable;
            let mut parts = vec![txn::adya::check(history, strict)?];
            parts.extend(txn::check_ours(&ops, strict, opts.search_budget)?);
            parts
        }
        Model::Linearizable => linear::check(&ops, symbols, opts.search_budget)?,
        Model::Causal => vec![causal::check(&ops)?],
    };
    Ok(CheckReport::combine(model, completed, parts))
}
