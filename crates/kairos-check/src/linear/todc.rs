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

use super::{apply, KeyOp, LinOp, State, Texts};

pub(crate) const NAME: &str = "todc-utils";
pub(crate) const VERSION: &str = "0.1.1";
pub(crate) const MAX_OPS: usize = 3000;

/// The same sequential object as ours ([`apply`]); todc-utils' `apply` has no `self`, so each
/// operation carries the value texts it may need.
struct Object;

#[derive(Clone, Debug)]
struct TextOp(LinOp, Texts);

impl Specification for Object {
    type State = State;
    type Operation = TextOp;
    fn init() -> State {
        Vec::new()
    }
    fn apply(op: &TextOp, s: &State) -> (bool, State) {
        apply(&op.0, s, &op.1)
    }
}

/// `None` when skipped (too large) or when todc-utils panicked.
pub(crate) fn linearizable(ops: &[KeyOp], texts: &Texts) -> Option<bool> {
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
    let actions: Vec<(usize, Action<TextOp>)> = ev
        .into_iter()
        .map(|(_, ret, i)| {
            let op = TextOp(ops[i].op.clone(), texts.clone());
            (i, if ret { Action::Response(op) } else { Action::Call(op) })
        })
        .collect();
    std::panic::catch_unwind(move || WGLChecker::<Object>::is_linearizable(History::from_actions(actions))).ok()
}
