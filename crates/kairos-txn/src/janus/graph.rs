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
    /// A member of a blocked component an earlier walk registered, still waiting for a commit
    /// ([`super::waits::Waits`]): the walk stops there.
    Blocked,
    /// The first member (in id order) of a registered component that no longer waits for a
    /// commit: the walk treats the component as one vertex, under this member's id.
    Group {
        /// All its members, in id order.
        members: &'a [TxnId],
        /// Every edge out of it that mattered when it was registered (its reasons; see
        /// [`Wait`]): the rest led to executed transactions or inside.
        deps: &'a [Dep],
    },
    /// Another member of such a component; its first member.
    Member(TxnId),
    /// Not committed here (or not known at all): everything that depends on it waits.
    Waiting,
}

/// Why a blocked component cannot run yet.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Wait {
    /// This uncommitted ancestor is not committed here.
    Commit(Dep),
    /// It depends on this member of a blocked component: one registered by an earlier walk,
    /// or one listed before it in [`Plan::blocked`].
    After(Dep),
}

impl Wait {
    /// The edge it stands for.
    pub fn dep(self) -> Dep {
        match self {
            Wait::Commit(d) | Wait::After(d) => d,
        }
    }
}

/// A component that cannot run yet.
#[derive(Debug, PartialEq, Eq)]
pub struct Blocked {
    /// Its members, in id order.
    pub members: Vec<TxnId>,
    /// Every reason, each once, in order: the uncommitted transactions its members depend
    /// on, and the blocked components they depend on.
    pub waits: Vec<Wait>,
    /// The registered components it took in (their first members).
    pub groups: Vec<TxnId>,
}

/// The outcome of [`plan`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Components whose every ancestor is committed, to run in this order (dependencies
    /// first), each one's members in id order.
    pub run: Vec<Vec<TxnId>>,
    /// The registered components (their first members) that run with [`Plan::run`].
    pub groups_run: Vec<TxnId>,
    /// Components that cannot run yet, dependencies first.
    pub blocked: Vec<Blocked>,
    /// Every uncommitted ancestor the walk met (so that all are asked about at once).
    pub waiting: Vec<Dep>,
    /// Dependency edges the walk followed: its cost.
    pub edges: u64,
}

/// Plans the execution of `roots` and their unexecuted ancestors (see the module docs): one
/// iterative Tarjan walk over them, in which a component is blocked when one of its members
/// depends on an uncommitted transaction or on a blocked component. Components are decided
/// as Tarjan emits them, so a component's dependencies are always decided first. A blocked
/// component lists every reason it has, for [`super::waits::Waits`] to register it by (and
/// why that matters).
pub fn plan<'a>(roots: &[TxnId], known: impl Fn(TxnId) -> Known<'a>) -> Plan {
    struct Mark<'a> {
        index: usize,
        low: usize,
        on_stack: bool,
        /// Where its component's reasons start in `reasons` (while on the stack).
        reasons_from: usize,
        /// Its component is finished and blocked.
        blocked: bool,
        /// A registered component's members, if it is one.
        group: Option<&'a [TxnId]>,
    }
    let mut out = Plan::default();
    // Keyed by vertex: a transaction, or a registered component's first member.
    let mut marks: BTreeMap<TxnId, Mark<'a>> = BTreeMap::new();
    let mut stack: Vec<TxnId> = Vec::new();
    // The reasons the vertices on the stack found, in the order found: a component's are the
    // last ones when Tarjan emits it (its members are the top of the stack, and the
    // components found above it have taken theirs).
    let mut reasons: Vec<Wait> = Vec::new();
    // `out.waiting`'s members, to list each once without a linear search (a hot key's
    // uncommitted accessors can be many).
    let mut waiting_seen: BTreeSet<TxnId> = BTreeSet::new();
    // (vertex, its dependencies, next dependency to visit, the edge that led to it)
    let mut frames: Vec<(TxnId, &'a [Dep], usize, Option<Dep>)> = Vec::new();
    /// Where the walk stops.
    enum Stop {
        Executed,
        Blocked,
        Waiting,
    }
    /// A vertex of the walk: its key, its edges, and its members if it is a registered
    /// component.
    type Vertex<'a> = (TxnId, &'a [Dep], Option<&'a [TxnId]>);
    // What transaction `t` is to the walk: a vertex, or a stop.
    let resolve = |t: TxnId| -> Result<Vertex<'a>, Stop> {
        let (t, k) = match known(t) {
            Known::Member(first) => (first, known(first)),
            k => (t, k),
        };
        match k {
            Known::Committed(deps) => Ok((t, deps, None)),
            Known::Group { members, deps } => Ok((t, deps, Some(members))),
            Known::Executed => Err(Stop::Executed),
            Known::Blocked => Err(Stop::Blocked),
            Known::Waiting => Err(Stop::Waiting),
            Known::Member(_) => {
                debug_assert!(false, "a component's first member is not a member of another");
                Err(Stop::Waiting)
            }
        }
    };
    for &root in roots {
        let Ok((root, deps, group)) = resolve(root) else { continue };
        if marks.contains_key(&root) {
            continue;
        }
        let index = marks.len();
        marks.insert(
            root,
            Mark { index, low: index, on_stack: true, reasons_from: reasons.len(), blocked: false, group },
        );
        stack.push(root);
        frames.push((root, deps, 0, None));
        while let Some((v, deps, next, _)) = frames.last_mut() {
            let v = *v;
            if let Some(d) = deps.get(*next).copied() {
                *next += 1;
                out.edges += 1;
                if d.txn == v {
                    continue;
                }
                let target = match marks.get(&d.txn) {
                    Some(m) => Ok((d.txn, m)),
                    None => match resolve(d.txn) {
                        Ok((w, dd, group)) => match marks.get(&w) {
                            Some(m) => Ok((w, m)),
                            None => {
                                let index = marks.len();
                                let reasons_from = reasons.len();
                                marks.insert(
                                    w,
                                    Mark { index, low: index, on_stack: true, reasons_from, blocked: false, group },
                                );
                                stack.push(w);
                                frames.push((w, dd, 0, Some(d)));
                                continue;
                            }
                        },
                        Err(stop) => Err(stop),
                    },
                };
                match target {
                    // An edge inside a registered component.
                    Ok((w, _)) if w == v => {}
                    Ok((_, m)) if m.on_stack => {
                        let index = m.index;
                        let mv = marks.get_mut(&v).expect("on the frame stack");
                        mv.low = mv.low.min(index);
                    }
                    Ok((_, m)) => {
                        if m.blocked {
                            reasons.push(Wait::After(d));
                        }
                    }
                    Err(Stop::Executed) => {}
                    Err(Stop::Waiting) => {
                        if waiting_seen.insert(d.txn) {
                            out.waiting.push(d);
                        }
                        reasons.push(Wait::Commit(d));
                    }
                    Err(Stop::Blocked) => reasons.push(Wait::After(d)),
                }
                continue;
            }
            let (_, _, _, via) = frames.pop().expect("the loop's frame");
            let (index, low, from) = (marks[&v].index, marks[&v].low, marks[&v].reasons_from);
            if low == index {
                // v roots a component: its vertices are on the stack down to v, and the
                // reasons they found are the last ones.
                let at = stack.iter().rposition(|w| *w == v).expect("v is on the stack");
                let vertices: Vec<TxnId> = stack.drain(at..).collect();
                let mut waits: Vec<Wait> = reasons.drain(from..).collect();
                let blocked = !waits.is_empty();
                let (mut members, mut groups) = (Vec::new(), Vec::new());
                for w in &vertices {
                    let m = marks.get_mut(w).expect("marked");
                    m.on_stack = false;
                    m.blocked = blocked;
                    match m.group {
                        Some(g) => {
                            members.extend_from_slice(g);
                            groups.push(*w);
                        }
                        None => members.push(*w),
                    }
                }
                members.sort_unstable();
                if blocked {
                    waits.sort_unstable();
                    waits.dedup();
                    out.blocked.push(Blocked { members, waits, groups });
                } else {
                    out.run.push(members);
                    out.groups_run.extend(groups);
                }
            }
            if let Some((parent, _, _, _)) = frames.last() {
                let parent = *parent;
                if !marks[&v].on_stack && marks[&v].blocked {
                    reasons.push(Wait::After(via.expect("a vertex with a parent was reached by an edge")));
                }
                let mp = marks.get_mut(&parent).expect("on the frame stack");
                mp.low = mp.low.min(low);
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
    fn ts(ns: &[u32]) -> Vec<TxnId> {
        ns.iter().map(|n| t(*n)).collect()
    }

    enum State {
        Executed,
        Committed(Vec<Dep>),
        Blocked,
        /// A registered component's first member: its members and edges.
        Group(Vec<TxnId>, Vec<Dep>),
        Member(u32),
        Waiting,
    }

    fn run(graph: &BTreeMap<TxnId, State>, roots: &[u32]) -> Plan {
        plan(&ts(roots), |x| match graph.get(&x) {
            Some(State::Executed) => Known::Executed,
            Some(State::Committed(d)) => Known::Committed(d),
            Some(State::Blocked) => Known::Blocked,
            Some(State::Group(members, deps)) => Known::Group { members, deps },
            Some(State::Member(first)) => Known::Member(t(*first)),
            Some(State::Waiting) | None => Known::Waiting,
        })
    }

    fn ran(components: &[&[u32]]) -> Vec<Vec<TxnId>> {
        components.iter().map(|c| ts(c)).collect()
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
        let p = run(&g, &[5]);
        assert_eq!((p.run, p.blocked, p.waiting, p.edges), (ran(&[&[2, 3], &[4], &[5]]), vec![], vec![], 6));
        // The same component from another start: the same members, the same order.
        assert_eq!(run(&g, &[3]).run, ran(&[&[2, 3]]));
        assert_eq!(run(&g, &[1]), Plan::default());
        // Several roots in one walk: each component once, each edge once.
        let p = run(&g, &[4, 6, 5]);
        assert_eq!((p.run, p.edges), (ran(&[&[2, 3], &[4], &[6], &[5]]), 6));
    }

    #[test]
    fn a_blocked_component_lists_every_reason_and_its_descendants_wait_after_it() {
        // 2 → 3 → {9, 10} (not committed); 4 → 7 (committed, independent) and 8 (a member of a
        // registered component still waiting); {5 ⇄ 6} → 9 and 2.
        let mut g = BTreeMap::new();
        g.insert(t(2), State::Committed(vec![dep(3)]));
        g.insert(t(3), State::Committed(vec![dep(9), dep(10), dep(9)]));
        g.insert(t(4), State::Committed(vec![dep(7), dep(8)]));
        g.insert(t(5), State::Committed(vec![dep(6), dep(9)]));
        g.insert(t(6), State::Committed(vec![dep(5), dep(2)]));
        g.insert(t(7), State::Committed(vec![]));
        g.insert(t(8), State::Blocked);
        g.insert(t(10), State::Waiting);
        let p = run(&g, &[2, 4, 5]);
        assert_eq!(p.run, ran(&[&[7]]));
        let blocked = |members: &[u32], waits: Vec<Wait>| Blocked { members: ts(members), waits, groups: vec![] };
        assert_eq!(
            p.blocked,
            vec![
                blocked(&[3], vec![Wait::Commit(dep(9)), Wait::Commit(dep(10))]),
                blocked(&[2], vec![Wait::After(dep(3))]),
                blocked(&[4], vec![Wait::After(dep(8))]),
                blocked(&[5, 6], vec![Wait::Commit(dep(9)), Wait::After(dep(2))]),
            ]
        );
        assert_eq!(p.waiting, vec![dep(9), dep(10)]);
        // A root that is not committed, or blocked, is nobody's business here.
        assert_eq!(run(&g, &[9, 8]), Plan::default());
    }

    #[test]
    fn a_registered_component_is_crossed_as_one_vertex() {
        // {1, 2, 3} registered, its reasons (committed since) 4 and 5; 4 → 1 (a cycle back into
        // it), 5 executed; 6 → 2.
        let mut g = BTreeMap::new();
        g.insert(t(1), State::Group(ts(&[1, 2, 3]), vec![dep(4), dep(5)]));
        g.insert(t(2), State::Member(1));
        g.insert(t(3), State::Member(1));
        g.insert(t(4), State::Committed(vec![dep(1)]));
        g.insert(t(5), State::Executed);
        g.insert(t(6), State::Committed(vec![dep(2)]));
        let p = run(&g, &[6, 3]);
        assert_eq!(p.run, ran(&[&[1, 2, 3, 4], &[6]]));
        assert_eq!(p.groups_run, ts(&[1]));
        assert_eq!(p.edges, 4, "6 → 2, the component's two reasons, 4 → 1");
        // Still blocked further on: it is taken into the new blocked component.
        g.insert(t(4), State::Committed(vec![dep(1), dep(11)]));
        let p = run(&g, &[2]);
        assert!(p.run.is_empty());
        assert_eq!(
            p.blocked,
            vec![Blocked { members: ts(&[1, 2, 3, 4]), waits: vec![Wait::Commit(dep(11))], groups: ts(&[1]) }]
        );
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
        assert_eq!(run(&g, &[2]).run, ran(&[&[4, 5], &[1, 2, 3]]));
    }
}
