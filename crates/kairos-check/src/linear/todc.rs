//! The external linearizability checker: `todc-utils`' `WGLChecker`.
//!
//! Quirks handled here: `History::from_actions` panics on an empty history and pairs calls with
//! responses per process in FIFO order, so every operation gets its own process id (an `info`
//! operation's response is placed at the end of the history, after later operations of the
//! same client). Its search is quadratic per step (linear scans, cloned `Vec<bool>`), so keys
//! with more than [`MAX_OPS`] operations are skipped (verdict unknown). Any panic inside it is
//! caught and reported as unknown.

use todc_utils::linearizability::history::{Action, History};
use todc_utils::linearizability::WGLChecker;
use todc_utils::specifications::Specification;

use super::{apply, KeyOp, LinOp};

pub(crate) const NAME: &str = "todc-utils";
pub(crate) const VERSION: &str = "0.1.1";
pub(crate) const MAX_OPS: usize = 3000;

struct Register;

impl Specification for Register {
    type State = Option<u64>;
    type Operation = LinOp;
    fn init() -> Option<u64> {
        None
    }
    fn apply(op: &LinOp, s: &Option<u64>) -> (bool, Option<u64>) {
        apply(op, *s)
    }
}

/// `None` when skipped (too large) or when todc-utils panicked.
pub(crate) fn linearizable(ops: &[KeyOp]) -> Option<bool> {
    if ops.is_empty() {
        return Some(true);
    }
    if ops.len() > MAX_OPS {
        return None;
    }
    let mut ev: Vec<(usize, bool, usize)> = Vec::with_capacity(2 * ops.len());
    for (i, o) in ops.iter().enumerate() {
        ev.push((o.start, false, i));
        ev.push((o.end.unwrap_or(usize::MAX), true, i));
    }
    ev.sort_unstable();
    let actions: Vec<(usize, Action<LinOp>)> = ev
        .into_iter()
        .map(|(_, ret, i)| (i, if ret { Action::Response(ops[i].op) } else { Action::Call(ops[i].op) }))
        .collect();
    std::panic::catch_unwind(move || WGLChecker::<Register>::is_linearizable(History::from_actions(actions))).ok()
}
