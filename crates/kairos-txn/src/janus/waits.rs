//! The blocked components of one server between execution walks ([`super::graph::plan`]).
//!
//! A walk that finds a component blocked registers it here as a **group**: its members and
//! every reason the walk found ([`Wait`]) — the uncommitted transactions it depends on, and
//! the blocked components it reached. Each reason stands for an edge out of the component;
//! every other edge out led to an executed transaction. So once the group's uncommitted
//! transactions have committed, a walk can cross the whole component as one vertex whose
//! edges are its reasons ([`Known::Group`]): it is strongly connected (edges are only ever
//! added) and its reasons are all it still depends on.
//!
//! - While it waits for a commit, its members are [`Known::Blocked`] to every walk, which
//!   stops there: that reason still holds (dependencies never change once committed).
//! - When the last of its commits arrives it is **ready**: walked again from its first
//!   member, as one vertex. The walk runs it, registers it again (taken into a new group, with
//!   what it found), or finds it on a cycle with others.
//! - Groups that depend on it (it was a reason of theirs) are walked again when it runs.
//!
//! **When a transaction runs does not change** with the grouping: a walk over the groups sees
//! the same reachability among unexecuted transactions as one over their members, so the
//! same components in the same order. **Nothing waits forever**: a group waits for commits
//! (which come), or is ready and was walked when it became so; one that found only blocked
//! components in its way is their dependent and is walked again when they run (or, taken into
//! a new group, that group's dependent). **What it saves**: before, a blocked component was
//! walked member by member, every dependency of each, on every commit of the ancestor it
//! waited for; under load TPC-C's hot keys form components of thousands of transactions that
//! grow by a few at each commit, so a server paid more per commit the longer they grew.

use std::collections::BTreeMap;

use kairos_workload::txn::TxnId;

use super::graph::{plan, Blocked, Known, Wait};
use super::msg::Dep;

/// A registered component.
#[derive(Clone, Debug)]
struct Group {
    /// In id order: the first one stands for the group in walks.
    members: Vec<TxnId>,
    /// Its reasons, as the edges they stand for.
    deps: Vec<Dep>,
    /// Uncommitted transactions among them.
    commits_pending: usize,
    /// Groups with one of its members among their reasons (some maybe gone since).
    dependents: Vec<u64>,
    /// How many of `dependents` were still registered when last counted.
    dependents_live: usize,
}

/// One walk's outcome ([`Waits::walk`]).
#[derive(Debug, Default)]
pub struct Walk {
    /// Components to run now, in this order, each one's members in id order.
    pub run: Vec<Vec<TxnId>>,
    /// Every uncommitted ancestor the walk met.
    pub waiting: Vec<Dep>,
    /// Dependency edges it followed.
    pub edges: u64,
    /// What to walk next, once `run` has run: the groups that depended on what ran.
    pub next: Vec<TxnId>,
}

/// The groups of one server (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Waits {
    groups: BTreeMap<u64, Group>,
    next_group: u64,
    /// Each grouped transaction's group.
    group_of: BTreeMap<TxnId, u64>,
    /// Each uncommitted transaction waited for → the groups waiting (some maybe gone since:
    /// those are skipped).
    on_commit: BTreeMap<TxnId, Vec<u64>>,
}

impl Waits {
    /// Plans the execution of `roots` ([`plan`]), seeing grouped transactions as this
    /// registry says and the others as `known` says, and registers what is blocked. The
    /// caller runs [`Walk::run`] and then walks [`Walk::next`], until that is empty.
    pub fn walk<'v>(&mut self, roots: &[TxnId], known: impl Fn(TxnId) -> Known<'v>) -> Walk {
        let outcome = {
            let me = &*self;
            plan(roots, |t| me.known(t).unwrap_or_else(|| known(t)))
        };
        self.register(outcome.blocked);
        let next = self.ran(&outcome.groups_run);
        Walk { run: outcome.run, waiting: outcome.waiting, edges: outcome.edges, next }
    }

    /// What a walk sees of `txn` if it is grouped.
    fn known(&self, txn: TxnId) -> Option<Known<'_>> {
        let g = self.groups.get(self.group_of.get(&txn)?)?;
        Some(if g.commits_pending > 0 {
            Known::Blocked
        } else if g.members[0] == txn {
            Known::Group { members: &g.members, deps: &g.deps }
        } else {
            Known::Member(g.members[0])
        })
    }

    /// Registers the blocked components of one walk, in the walk's order (a component's
    /// [`Wait::After`] reasons name members of earlier ones or of groups registered before).
    fn register(&mut self, blocked: Vec<Blocked>) {
        for Blocked { members, waits, groups } in blocked {
            let id = self.next_group;
            self.next_group += 1;
            let mut dependents = Vec::new();
            for first in groups {
                if let Some(old) = self.group_of.get(&first).and_then(|g| self.groups.remove(g)) {
                    dependents.extend(old.dependents);
                }
            }
            // Groups taken into others since they registered are gone: carried over, they
            // would pile up for as long as the component keeps growing.
            dependents.retain(|g| self.groups.contains_key(g));
            dependents.sort_unstable();
            dependents.dedup();
            let mut parents: Vec<u64> = Vec::new();
            let mut commits_pending = 0;
            for wait in &waits {
                match *wait {
                    Wait::Commit(u) => {
                        commits_pending += 1;
                        self.on_commit.entry(u.txn).or_default().push(id);
                    }
                    Wait::After(d) => parents.extend(self.group_of.get(&d.txn)),
                }
            }
            parents.sort_unstable();
            parents.dedup();
            for p in parents {
                let Some(parent) = self.groups.get_mut(&p) else { continue };
                parent.dependents.push(id);
                // A dependent taken into a new group registers again: drop the gone ones
                // whenever the list has doubled.
                if parent.dependents.len() >= 2 * parent.dependents_live.max(8) {
                    let mut dependents = std::mem::take(&mut parent.dependents);
                    dependents.retain(|g| *g == id || self.groups.contains_key(g));
                    let parent = self.groups.get_mut(&p).expect("just found");
                    parent.dependents_live = dependents.len();
                    parent.dependents = dependents;
                }
            }
            for m in &members {
                self.group_of.insert(*m, id);
            }
            let deps = waits.into_iter().map(Wait::dep).collect();
            let dependents_live = dependents.len();
            self.groups.insert(id, Group { members, deps, commits_pending, dependents, dependents_live });
        }
    }

    /// `txn` committed: the first members of the groups this makes ready, to walk again.
    pub fn committed(&mut self, txn: TxnId) -> Vec<TxnId> {
        let mut ready = Vec::new();
        for id in self.on_commit.remove(&txn).unwrap_or_default() {
            let Some(group) = self.groups.get_mut(&id) else { continue };
            group.commits_pending -= 1;
            if group.commits_pending == 0 {
                ready.push(group.members[0]);
            }
        }
        ready
    }

    /// The groups of these first members ran: forgets them; returns the first members of the
    /// groups that depended on them, to walk again.
    fn ran(&mut self, firsts: &[TxnId]) -> Vec<TxnId> {
        let mut dependents = Vec::new();
        for first in firsts {
            let Some(group) = self.group_of.get(first).and_then(|g| self.groups.remove(g)) else { continue };
            for m in &group.members {
                self.group_of.remove(m);
            }
            dependents.extend(group.dependents);
        }
        dependents.sort_unstable();
        dependents.dedup();
        dependents.into_iter().filter_map(|g| self.groups.get(&g)).map(|g| g.members[0]).collect()
    }

    /// How many groups wait for `txn`'s commit.
    pub fn waiting_for_commit(&self, txn: TxnId) -> usize {
        self.on_commit.get(&txn).map_or(0, |ids| ids.iter().filter(|id| self.groups.contains_key(id)).count())
    }

    /// The uncommitted transactions some group waits for.
    pub fn commits_awaited(&self) -> impl Iterator<Item = TxnId> + '_ {
        self.on_commit.keys().copied()
    }

    /// No component is registered and no commit awaited (a drained server's state).
    pub fn is_idle(&self) -> bool {
        self.groups.is_empty() && self.group_of.is_empty() && self.on_commit.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use kairos_core::NodeId;
    use proptest::prelude::*;

    use super::*;

    fn t(n: u32) -> TxnId {
        TxnId::new(NodeId(1), n)
    }

    /// Transaction `i` depends on `deps[i]`; they commit in the order `commits`, and each
    /// commit is walked with what it makes ready, as the servers do. Returns when each ran (the
    /// index of the commit that ran it), the order they ran in, and the edges walked.
    fn execute(deps: &[Vec<u32>], commits: &[u32]) -> (BTreeMap<u32, usize>, Vec<u32>, u64) {
        let deps: Vec<Vec<Dep>> =
            deps.iter().map(|d| d.iter().map(|n| Dep { txn: t(*n), shards: 1 }).collect()).collect();
        let (mut waits, mut committed, mut executed) = (Waits::default(), BTreeSet::new(), BTreeSet::new());
        let (mut ran_at, mut order, mut edges) = (BTreeMap::new(), Vec::new(), 0);
        for (step, &c) in commits.iter().enumerate() {
            committed.insert(c);
            let mut roots = vec![t(c)];
            roots.extend(waits.committed(t(c)));
            while !roots.is_empty() {
                let walk = waits.walk(&roots, |x| {
                    let n = x.seq();
                    if executed.contains(&n) {
                        Known::Executed
                    } else if committed.contains(&n) {
                        Known::Committed(&deps[n as usize])
                    } else {
                        Known::Waiting
                    }
                });
                edges += walk.edges;
                for member in walk.run.into_iter().flatten() {
                    let n = member.seq();
                    assert!(executed.insert(n), "{n} ran twice");
                    ran_at.insert(n, step);
                    order.push(n);
                }
                roots = walk.next;
            }
        }
        (ran_at, order, edges)
    }

    /// Every transaction runs at the first commit after which it and all its ancestors are
    /// committed, after every ancestor outside its component, and a component's members run
    /// together in id order: the rule written out plainly, over the whole graph.
    fn check(deps: &[Vec<u32>], commits: &[u32]) -> Result<(), TestCaseError> {
        let n = deps.len();
        let (ran_at, order, _) = execute(deps, commits);
        let mut reach = vec![vec![false; n]; n];
        for (i, ds) in deps.iter().enumerate() {
            for &d in ds {
                reach[i][d as usize] = true;
            }
        }
        for k in 0..n {
            for i in 0..n {
                for j in 0..n {
                    reach[i][j] |= reach[i][k] && reach[k][j];
                }
            }
        }
        let committed_at: BTreeMap<u32, usize> = commits.iter().enumerate().map(|(s, c)| (*c, s)).collect();
        let position: BTreeMap<u32, usize> = order.iter().enumerate().map(|(p, x)| (*x, p)).collect();
        for i in 0..n {
            let due = (0..n).filter(|&a| a == i || reach[i][a]).map(|a| committed_at[&(a as u32)]).max();
            prop_assert_eq!(ran_at.get(&(i as u32)).copied(), due, "transaction {} ran at the wrong commit", i);
            for a in (0..n).filter(|&a| a != i && reach[i][a]) {
                let (pi, pa) = (position[&(i as u32)], position[&(a as u32)]);
                if reach[a][i] {
                    // One component: consecutive, in id order.
                    let members: Vec<usize> = (0..n).filter(|&m| m == i || (reach[i][m] && reach[m][i])).collect();
                    let span = members.iter().map(|m| position[&(*m as u32)]).max().unwrap()
                        - members.iter().map(|m| position[&(*m as u32)]).min().unwrap();
                    prop_assert_eq!(span + 1, members.len(), "component {:?} interleaved", members);
                    prop_assert_eq!(pi < pa, i < a, "component members {} and {} out of id order", i, a);
                } else {
                    prop_assert!(pa < pi, "{} ran before its ancestor {}", i, a);
                }
            }
        }
        Ok(())
    }

    fn graphs() -> impl Strategy<Value = (Vec<Vec<u32>>, Vec<u32>)> {
        (1u32..14).prop_flat_map(|n| {
            let deps = prop::collection::vec(prop::collection::vec(0..n, 0..4), n as usize);
            (deps, Just((0..n).collect::<Vec<u32>>()).prop_shuffle())
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]
        #[test]
        fn runs_each_transaction_when_and_where_the_plain_rule_says(case in graphs()) {
            check(&case.0, &case.1)?;
        }
    }

    /// A component that keeps growing, as on a hot key under load: `i` depends on `i - 1` and
    /// on `i + 1`, which commits after it; the last depends on the one before only. Crossing
    /// the registered component as one vertex costs a few edges per commit; walking all its
    /// members at each commit (as before) cost about n² / 2 in all.
    #[test]
    fn a_growing_component_costs_a_few_edges_per_commit() {
        let n = 2_000u32;
        let deps: Vec<Vec<u32>> =
            (0..n).map(|i| (i.saturating_sub(1)..(i + 2).min(n)).filter(|d| *d != i).collect()).collect();
        let commits: Vec<u32> = (0..n).collect();
        let (ran_at, order, edges) = execute(&deps, &commits);
        assert_eq!(order, commits, "one component, in id order");
        assert!(ran_at.values().all(|s| *s == n as usize - 1), "all at the last commit");
        assert!(edges <= 4 * u64::from(n), "{edges} edges for {n} commits");
    }
}
