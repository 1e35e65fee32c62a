//! Janus's execution order at one server: which committed transactions can run now, and in
//! what order.
//!
//! A committed transaction runs once every ancestor (its dependencies, theirs, …, except
//! those already executed here) is committed with known dependencies. Its strongly connected
//! component of that dependency graph then runs as a unit: components in reverse topological
//! order (dependencies first, as Tarjan's algorithm emits them), the members of one component
//! in transaction-id order. Every server sees the same committed dependencies, so every
//! server derives the same order for any two transactions that conflict (module docs of
//! [`super`]).

use std::collections::{BTreeMap, BTreeSet};

use kairos_workload::txn::TxnId;

use super::msg::Dep;

/// What a server knows of a transaction in the graph.
pub enum Known<'a> {
    /// Executed here already: its ancestors are too, so the walk stops.
    Executed,
    /// Committed, with these dependencies.
    Committed(&'a [Dep]),
    /// Committed, and known to wait for this uncommitted ancestor (remembered from an earlier
    /// walk, still true): the walk stops there too.
    BlockedOn(Dep),
    /// Not committed here (or not known at all): everything that depends on it waits.
    Waiting,
}

/// The outcome of [`plan`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Components whose every ancestor is committed, to run in this order (dependencies
    /// first), each one's members in id order.
    pub run: Vec<Vec<TxnId>>,
    /// Committed transactions that cannot run yet, each with an uncommitted ancestor it
    /// waits for.
    pub blocked: Vec<(TxnId, Dep)>,
    /// Every uncommitted ancestor the walk met (so that all are asked about at once).
    pub waiting: Vec<Dep>,
}

/// Plans the execution of `roots` and their unexecuted ancestors (see the module docs): one
/// iterative Tarjan walk over them, in which a component is blocked when one of its members
/// depends on an uncommitted transaction or on a blocked component. Components are decided
/// as Tarjan emits them, so a component's dependencies are always decided first.
pub fn plan<'a>(roots: &[TxnId], known: impl Fn(TxnId) -> Known<'a>) -> Plan {
    struct Mark {
        index: usize,
        low: usize,
        on_stack: bool,
        /// An uncommitted ancestor found so far (its own, or its finished component's).
        blocker: Option<Dep>,
    }
    let mut out = Plan::default();
    let mut marks: BTreeMap<TxnId, Mark> = BTreeMap::new();
    let mut stack: Vec<TxnId> = Vec::new();
    // `out.waiting`'s members, to list each once without a linear search (a hot key's
    // uncommitted accessors can be many).
    let mut waiting_seen: BTreeSet<TxnId> = BTreeSet::new();
    // (vertex, its dependencies, next dependency to visit)
    let mut frames: Vec<(TxnId, &'a [Dep], usize)> = Vec::new();
    for &root in roots {
        if marks.contains_key(&root) {
            continue;
        }
        let deps = match known(root) {
            Known::Committed(deps) => deps,
            Known::BlockedOn(u) => {
                out.blocked.push((root, u));
                continue;
            }
            Known::Executed | Known::Waiting => continue,
        };
        let index = marks.len();
        marks.insert(root, Mark { index, low: index, on_stack: true, blocker: None });
        stack.push(root);
        frames.push((root, deps, 0));
        while let Some((v, deps, next)) = frames.last_mut() {
            let v = *v;
            if let Some(d) = deps.get(*next).copied() {
                *next += 1;
                if d.txn == v {
                    continue;
                }
                let found = match marks.get(&d.txn) {
                    Some(m) if m.on_stack => {
                        let index = m.index;
                        let mv = marks.get_mut(&v).expect("on the frame stack");
                        mv.low = mv.low.min(index);
                        None
                    }
                    Some(m) => m.blocker,
                    None => match known(d.txn) {
                        Known::Executed => None,
                        Known::Waiting => {
                            if waiting_seen.insert(d.txn) {
                                out.waiting.push(d);
                            }
                            Some(d)
                        }
                        Known::BlockedOn(u) => Some(u),
                        Known::Committed(dd) => {
                            let index = marks.len();
                            marks.insert(d.txn, Mark { index, low: index, on_stack: true, blocker: None });
                            stack.push(d.txn);
                            frames.push((d.txn, dd, 0));
                            continue;
                        }
                    },
                };
                if let Some(b) = found {
                    let mv = marks.get_mut(&v).expect("on the frame stack");
                    mv.blocker = mv.blocker.or(Some(b));
                }
                continue;
            }
            frames.pop();
            let (index, low) = (marks[&v].index, marks[&v].low);
            if low == index {
                // v roots a component: the members are on the stack down to v.
                let at = stack.iter().rposition(|w| *w == v).expect("v is on the stack");
                let mut component: Vec<TxnId> = stack.drain(at..).collect();
                let blocker = component.iter().find_map(|w| marks[w].blocker);
                for w in &component {
                    let m = marks.get_mut(w).expect("marked");
                    m.on_stack = false;
                    m.blocker = blocker;
                }
                match blocker {
                    Some(u) => out.blocked.extend(component.iter().map(|w| (*w, u))),
                    None => {
                        component.sort_unstable();
                        out.run.push(component);
                    }
                }
            }
            if let Some((parent, _, _)) = frames.last() {
                let parent = *parent;
                let finished = marks[&v].blocker.filter(|_| !marks[&v].on_stack);
                let mp = marks.get_mut(&parent).expect("on the frame stack");
                mp.low = mp.low.min(low);
                mp.blocker = mp.blocker.or(finished);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kairos_core::NodeId;

    fn t(n: u32) -> TxnId {
        TxnId::new(NodeId(1), n)
    }
    fn dep(n: u32) -> Dep {
        Dep { txn: t(n), shards: 1 }
    }

    enum State {
        Executed,
        Committed(Vec<Dep>),
        BlockedOn(u32),
        Waiting,
    }

    fn run(graph: &BTreeMap<TxnId, State>, roots: &[u32]) -> Plan {
        let roots: Vec<TxnId> = roots.iter().map(|n| t(*n)).collect();
        plan(&roots, |x| match graph.get(&x) {
            Some(State::Executed) => Known::Executed,
            Some(State::Committed(d)) => Known::Committed(d),
            Some(State::BlockedOn(u)) => Known::BlockedOn(dep(*u)),
            Some(State::Waiting) | None => Known::Waiting,
        })
    }

    fn ran(components: &[&[u32]]) -> Vec<Vec<TxnId>> {
        components.iter().map(|c| c.iter().map(|n| t(*n)).collect()).collect()
    }

    #[test]
    fn dependencies_run_first_and_a_cycle_runs_in_id_order() {
        // 5 → 4 → {3 → 2 → 3} → 1 (executed); 6 unrelated.
        let mut g = BTreeMap::new();
        g.insert(t(1), State::Executed);
        g.insert(t(2), State::Committed(vec![dep(3)]));
        g.insert(t(3), State::Committed(vec![dep(2), dep(1)]));
        g.insert(t(4), State::Committed(vec![dep(3)]));
        g.insert(t(5), State::Committed(vec![dep(4), dep(2)]));
        g.insert(t(6), State::Committed(vec![]));
        assert_eq!(run(&g, &[5]), Plan { run: ran(&[&[2, 3], &[4], &[5]]), blocked: vec![], waiting: vec![] });
        // The same component from another start: the same members, the same order.
        assert_eq!(run(&g, &[3]), Plan { run: ran(&[&[2, 3]]), blocked: vec![], waiting: vec![] });
        assert_eq!(run(&g, &[1]), Plan::default());
        // Several roots in one walk: each component once.
        assert_eq!(
            run(&g, &[4, 6, 5]),
            Plan { run: ran(&[&[2, 3], &[4], &[6], &[5]]), blocked: vec![], waiting: vec![] }
        );
    }

    #[test]
    fn an_uncommitted_ancestor_blocks_its_descendants_only() {
        // 2 → 3 → 9 (not committed); 4 → 7 (committed, independent); 8 remembered blocked on 9.
        let mut g = BTreeMap::new();
        g.insert(t(2), State::Committed(vec![dep(3)]));
        g.insert(t(3), State::Committed(vec![dep(9)]));
        g.insert(t(4), State::Committed(vec![dep(7), dep(8)]));
        g.insert(t(7), State::Committed(vec![]));
        g.insert(t(8), State::BlockedOn(9));
        g.insert(t(9), State::Waiting);
        let p = run(&g, &[2, 4]);
        assert_eq!(p.run, ran(&[&[7]]));
        assert_eq!(p.blocked, vec![(t(3), dep(9)), (t(2), dep(9)), (t(4), dep(9))]);
        assert_eq!(p.waiting, vec![dep(9)]);
        // A root that is not committed itself is nobody's business here.
        assert_eq!(run(&g, &[9]), Plan::default());
    }

    #[test]
    fn a_cycle_with_a_blocked_member_waits_whole() {
        // {1 → 2 → 3 → 1}, 3 → 9 (not committed): the whole component waits.
        let mut g = BTreeMap::new();
        g.insert(t(1), State::Committed(vec![dep(2)]));
        g.insert(t(2), State::Committed(vec![dep(3)]));
        g.insert(t(3), State::Committed(vec![dep(1), dep(9)]));
        let p = run(&g, &[1]);
        assert!(p.run.is_empty(), "{p:?}");
        assert_eq!(p.blocked.len(), 3);
        assert!(p.blocked.iter().all(|(_, u)| *u == dep(9)));
    }

    #[test]
    fn a_three_way_cycle_through_other_components() {
        // 1 → 2 → 3 → 1 and 3 → 4 → 5 → 4.
        let mut g = BTreeMap::new();
        g.insert(t(1), State::Committed(vec![dep(2)]));
        g.insert(t(2), State::Committed(vec![dep(3)]));
        g.insert(t(3), State::Committed(vec![dep(1), dep(4)]));
        g.insert(t(4), State::Committed(vec![dep(5)]));
        g.insert(t(5), State::Committed(vec![dep(4)]));
        assert_eq!(run(&g, &[2]), Plan { run: ran(&[&[4, 5], &[1, 2, 3]]), blocked: vec![], waiting: vec![] });
    }
}
