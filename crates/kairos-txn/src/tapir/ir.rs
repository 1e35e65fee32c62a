//! Inconsistent replication (IR), the coordinator's side of a consensus operation: collect
//! one shard's replies to a prepare, and decide it on the **fast path** (a super quorum of
//! ⌈3f/2⌉ + 1 identical results) or the **slow path** (the coordinator decides from at least
//! f + 1 replies with Tapir's decide function, then makes a PREPARE-OK durable with
//! `Finalize`, waiting for f + 1 confirmations — see [`Confirms`]).
//!
//! Inconsistent operations (commit, abort) need no agreement: they are sent to every replica
//! and retried until acknowledged; replicas apply them in any order (commit is idempotent and
//! keyed by version, abort only drops a prepared entry).

use super::msg::PrepareResult;

/// Failures tolerated by `n` = 2f + 1 replicas.
pub fn f_of(n: usize) -> usize {
    n.saturating_sub(1) / 2
}

/// IR's super quorum: ⌈3f/2⌉ + 1 replicas (3 of 3 when f = 1), at most n.
pub fn super_quorum(n: usize) -> usize {
    let f = f_of(n);
    (f + f.div_ceil(2) + 1).min(n.max(1))
}

/// Tapir's decide function for IR's slow path (TAPIR paper, §5.2.2): from at least f + 1
/// replies, ABORT if any replica saw a stale read, PREPARE-OK if f + 1 replicas prepared,
/// RETRY at the largest suggested timestamp if any replica asked for one, ABORT otherwise
/// (the abstentions). `None` with fewer than f + 1 replies.
pub fn decide(results: &[PrepareResult], n: usize) -> Option<PrepareResult> {
    let f = f_of(n);
    if results.len() < f + 1 {
        return None;
    }
    if results.contains(&PrepareResult::Abort) {
        return Some(PrepareResult::Abort);
    }
    if results.iter().filter(|r| **r == PrepareResult::Ok).count() > f {
        return Some(PrepareResult::Ok);
    }
    let retry = results.iter().filter_map(|r| if let PrepareResult::Retry(ts) = r { Some(*ts) } else { None }).max();
    Some(retry.map_or(PrepareResult::Abort, PrepareResult::Retry))
}

/// One shard's replies to one prepare (one consensus operation), by replica index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsensusQuorum {
    replies: Vec<Option<PrepareResult>>,
}

impl ConsensusQuorum {
    pub fn new(n: usize) -> Self {
        ConsensusQuorum { replies: vec![None; n] }
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
        let sq = super_quorum(self.n());
        results.iter().copied().find(|r| results.iter().filter(|x| *x == r).count() >= sq)
    }

    /// The slow-path decision over the replies so far (`None` below f + 1 replies).
    pub fn decide(&self) -> Option<PrepareResult> {
        decide(&self.results(), self.n())
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
    use PrepareResult::*;

    #[test]
    fn quorum_sizes() {
        assert_eq!((f_of(3), super_quorum(3)), (1, 3));
        assert_eq!((f_of(5), super_quorum(5)), (2, 4));
        assert_eq!(super_quorum(1), 1);
    }

    #[test]
    fn fast_path_needs_a_super_quorum_of_identical_results() {
        let mut q = ConsensusQuorum::new(3);
        assert!(q.record(0, Ok) && q.record(1, Ok));
        assert!(!q.record(1, Abstain), "one reply per replica");
        assert!(!q.record(3, Ok), "out of range");
        assert_eq!(q.fast(), None);
        assert_eq!(q.decide(), Some(Ok), "f + 1 PREPARE-OK decide the slow path");
        q.record(2, Ok);
        assert_eq!(q.fast(), Some(Ok));
        let mut q = ConsensusQuorum::new(3);
        q.record(0, Ok);
        q.record(1, Abstain);
        q.record(2, Ok);
        assert_eq!((q.fast(), q.decide(), q.complete()), (None, Some(Ok), true));
    }

    #[test]
    fn decide_follows_tapir() {
        assert_eq!(decide(&[Ok], 3), None);
        assert_eq!(decide(&[Ok, Abort], 3), Some(Abort));
        assert_eq!(decide(&[Abstain, Ok], 3), Some(Abort));
        assert_eq!(decide(&[Retry(5), Ok, Retry(9)], 3), Some(Retry(9)));
        assert_eq!(decide(&[Retry(5), Ok, Ok], 3), Some(Ok));
        assert_eq!(decide(&[Abstain, Abstain], 3), Some(Abort));
    }

    #[test]
    fn confirms_count_each_replica_once() {
        let mut c = Confirms::default();
        assert!(c.mark(2) && !c.mark(2) && c.mark(0) && !c.mark(64));
        assert_eq!(c.count(), 2);
        assert!(c.has(0) && !c.has(1));
    }
}
