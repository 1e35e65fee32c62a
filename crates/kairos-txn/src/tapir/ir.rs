//! Inconsistent replication (IR), the coordinator's side of a consensus operation: collect
//! one shard's replies to a prepare, and decide it on the **fast path** (a super quorum of
//! ⌈3f/2⌉ + 1 identical results) or the **slow path** (the coordinator decides from at least
//! f + 1 replies with Tapir's decide function, then makes a PREPARE-OK durable with
//! `Finalize`, waiting for f + 1 confirmations — see [`Confirms`]).
//!
//! Inconsistent operations (commit, abort) need no agreement: they are sent to every replica
//! and retried until acknowledged; replicas apply them in any order (commit is idempotent and
//! keyed by version, abort only drops a prepared entry).

use kairos_workload::Topology;

use super::msg::PrepareResult;

/// Tapir's decide function for IR's slow path (TAPIR paper, Figure 9, `TAPIR-DECIDE`), from at
/// least f + 1 replies: ABORT if any replica saw a stale read; PREPARE-OK if f + 1 replicas
/// prepared; ABORT if f + 1 abstained; RETRY at the largest suggested timestamp if any
/// replica asked for one; ABORT otherwise. `None` with fewer than f + 1 replies.
pub fn decide(results: &[PrepareResult], f: usize) -> Option<PrepareResult> {
    if results.len() < f + 1 {
        return None;
    }
    let count = |r: PrepareResult| results.iter().filter(|x| **x == r).count();
    if results.contains(&PrepareResult::Abort) {
        return Some(PrepareResult::Abort);
    }
    if count(PrepareResult::Ok) > f {
        return Some(PrepareResult::Ok);
    }
    if count(PrepareResult::Abstain) > f {
        return Some(PrepareResult::Abort);
    }
    let retry = results.iter().filter_map(|r| if let PrepareResult::Retry(ts) = r { Some(*ts) } else { None }).max();
    Some(retry.map_or(PrepareResult::Abort, PrepareResult::Retry))
}

/// One shard's replies to one prepare (one consensus operation), by replica index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsensusQuorum {
    replies: Vec<Option<PrepareResult>>,
    /// Failures tolerated and the super quorum, from the [`Topology`].
    f: usize,
    super_quorum: usize,
}

impl ConsensusQuorum {
    /// A quorum over the replicas of one shard of `topology`.
    pub fn new(topology: &Topology) -> Self {
        let n = topology.replicas_per_shard();
        ConsensusQuorum { replies: vec![None; n], f: topology.f(), super_quorum: topology.super_quorum().min(n.max(1)) }
    }

    /// Records replica `r`'s result; false if `r` is out of range or already answered.
    pub fn record(&mut self, r: u32, result: PrepareResult) -> bool {
        match self.replies.get_mut(r as usize) {
            Some(slot @ None) => {
                *slot = Some(result);
                true
            }
            _ => false,
        }
    }

    pub fn n(&self) -> usize {
        self.replies.len()
    }

    pub fn received(&self) -> usize {
        self.replies.iter().flatten().count()
    }

    pub fn has_replied(&self, r: u32) -> bool {
        self.replies.get(r as usize).is_some_and(Option::is_some)
    }

    fn results(&self) -> Vec<PrepareResult> {
        self.replies.iter().flatten().copied().collect()
    }

    /// The fast-path result: one result returned by a super quorum.
    pub fn fast(&self) -> Option<PrepareResult> {
        let results = self.results();
        results.iter().copied().find(|r| results.iter().filter(|x| *x == r).count() >= self.super_quorum)
    }

    /// The slow-path decision over the replies so far (`None` below f + 1 replies).
    pub fn decide(&self) -> Option<PrepareResult> {
        decide(&self.results(), self.f)
    }

    /// Every replica answered (no point waiting for a super quorum any longer).
    pub fn complete(&self) -> bool {
        self.received() == self.n()
    }

    /// Some replica saw a stale read: the transaction can never commit, whatever the others say.
    pub fn any_abort(&self) -> bool {
        self.replies.contains(&Some(PrepareResult::Abort))
    }
}

/// Which replicas of a shard confirmed something (a finalize, a commit, an abort).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Confirms(u64);

impl Confirms {
    /// Marks replica `r` (replica indices beyond 63 are ignored). Returns whether it was new.
    pub fn mark(&mut self, r: u32) -> bool {
        if r >= 64 || self.has(r) {
            return false;
        }
        self.0 |= 1 << r;
        true
    }
    pub fn has(&self, r: u32) -> bool {
        r < 64 && self.0 & (1 << r) != 0
    }
    pub fn count(&self) -> usize {
        self.0.count_ones() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kairos_workload::txn::Ts;
    use PrepareResult::*;

    use kairos_core::NodeId;

    fn topology(n: u32) -> Topology {
        Topology { shards: vec![(0..n).map(NodeId).collect()], leader: vec![0] }
    }

    #[test]
    fn quorum_sizes_come_from_the_topology() {
        for (n, f, sq) in [(1, 0, 1), (3, 1, 3), (5, 2, 4)] {
            let q = ConsensusQuorum::new(&topology(n));
            assert_eq!((q.n(), q.f, q.super_quorum), (n as usize, f, sq));
        }
    }

    #[test]
    fn fast_path_needs_a_super_quorum_of_identical_results() {
        let mut q = ConsensusQuorum::new(&topology(3));
        assert!(q.record(0, Ok) && q.record(1, Ok));
        assert!(!q.record(1, Abstain), "one reply per replica");
        assert!(!q.record(3, Ok), "out of range");
        assert_eq!(q.fast(), None);
        assert_eq!(q.decide(), Some(Ok), "f + 1 PREPARE-OK decide the slow path");
        q.record(2, Ok);
        assert_eq!(q.fast(), Some(Ok));
        let mut q = ConsensusQuorum::new(&topology(3));
        q.record(0, Ok);
        q.record(1, Abstain);
        q.record(2, Ok);
        assert_eq!((q.fast(), q.decide(), q.complete()), (None, Some(Ok), true));
    }

    #[test]
    fn decide_follows_tapir() {
        assert_eq!(decide(&[Ok], 1), None);
        assert_eq!(decide(&[Ok, Abort], 1), Some(Abort));
        assert_eq!(decide(&[Abstain, Ok], 1), Some(Abort));
        assert_eq!(
            decide(&[Retry(Ts::from_nanos(5)), Ok, Retry(Ts::from_nanos(9))], 1),
            Some(Retry(Ts::from_nanos(9)))
        );
        assert_eq!(decide(&[Retry(Ts::from_nanos(5)), Ok, Ok], 1), Some(Ok));
        assert_eq!(decide(&[Abstain, Abstain], 1), Some(Abort));
        // The paper aborts on f + 1 abstentions before considering RETRY.
        assert_eq!(decide(&[Abstain, Abstain, Retry(Ts::from_nanos(7))], 1), Some(Abort));
        assert_eq!(decide(&[Abstain, Retry(Ts::from_nanos(7)), Ok], 1), Some(Retry(Ts::from_nanos(7))));
        assert_eq!(
            decide(&[Abstain, Abstain, Retry(Ts::from_nanos(7)), Retry(Ts::from_nanos(8)), Ok], 2),
            Some(Retry(Ts::from_nanos(8)))
        );
        assert_eq!(decide(&[Abstain, Abstain, Abstain, Retry(Ts::from_nanos(8)), Ok], 2), Some(Abort));
    }

    #[test]
    fn confirms_count_each_replica_once() {
        let mut c = Confirms::default();
        assert!(c.mark(2) && !c.mark(2) && c.mark(0) && !c.mark(64));
        assert_eq!(c.count(), 2);
        assert!(c.has(0) && !c.has(1));
    }
}
