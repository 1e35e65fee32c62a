//! A member that restarted without its disk ([`kairos_core::Process::on_amnesia`]), or with a
//! journal it could not read whole: Raft's amnesia. It forgot the votes it gave and the entries
//! it acknowledged, so voting again from nothing could elect two primaries in one term, or a
//! primary without a committed entry (the forgotten acknowledgement was part of that entry's
//! majority).
//!
//! Until it may vote again, an amnesiac member replicates, acknowledges what it now holds and
//! serves reads, but grants no vote and stands for no election. It asks every other member
//! for its term ([`PeerBody::TermProbe`]); the highest answer is the *floor*: every vote it
//! gave before its disk was lost was in a term at most the floor (the candidate it voted for,
//! and the other voters of any election it helped win, are among those asked). It votes again
//! once it holds a committed entry of a term above the floor: that primary was elected without
//! it and its oplog has every committed entry (a majority of the others meets every committed
//! entry's majority), and this member's oplog is a copy of it up to that entry.
//!
//! The flag is durable (a crash while amnesiac keeps it). Safe while at most one member is
//! amnesiac at a time; a set of one member has nothing to forget toward and never enters it.
//! The price is availability: until the next election after the probe, the set elects without
//! this member's vote.
//!
//! **The writes it refused, and the ones it ran.** A member remembers each client's newest
//! refused write request, so that a copy arriving later never runs a write its client saw fail;
//! that record is lost with the disk. What keeps such a copy from running after the loss is
//! the term every session write names ([`crate::msg::Request::term`]): a session learns a term
//! only from replies naming the primary of that term, and a write runs only at the primary of
//! exactly that term. A copy refused here before the loss names a term of at most the floor
//! (that term's primary, or a voter that elected this member in it, is among the others
//! asked), and this member is primary only in terms above the floor once it leaves amnesia. The other way round, a copy of
//! a request its former life *ran* may reach it while amnesiac, and that entry may still
//! commit through the others: it cannot tell, so it answers every write it refuses while
//! amnesiac as of unknown outcome (`InterruptedDueToReplStateChange`), never as a certain
//! failure. `kairos sim causal --seeds 1..10001 --faults all --load 150 --fault-s 4
//! --recovery-s 2`, a lost disk in about half the seeds, found 135 seeds whose sessions read a
//! write they had been told failed, nearly all through replayed messages; the term rule alone
//! left 125, both rules none. Over TCP a copy cannot outlive its connection, which the crash
//! closes.

use super::{Change, Member};
use crate::msg::{CausalMsg, PeerBody};
use kairos_core::Ctx;
use rand::Rng as _;
use std::collections::BTreeSet;

/// The probe of an amnesiac member's current incarnation.
pub(super) struct Amnesia {
    /// Echoed by the answers: a replayed answer to an earlier probe is not counted.
    nonce: u64,
    /// Others that answered, and the highest term among the answers.
    answered: BTreeSet<u32>,
    highest_term: u64,
}

impl Member {
    pub fn is_amnesiac(&self) -> bool {
        self.d.amnesiac
    }

    /// Enters amnesia (journaled: a crash keeps it), after a lost disk or a journal it could
    /// not read whole. A set of one has nothing to forget toward.
    pub(super) fn enter_amnesia(&mut self) {
        if self.cfg.members.len() > 1 && !self.cfg.unsafe_forget_amnesia {
            self.d.amnesiac = true;
            self.journal.push(Change::Amnesiac(true));
        }
    }

    /// At start, and every tick until every other member answered: ask those that have not.
    pub(super) fn probe_terms(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        if !self.d.amnesiac {
            return;
        }
        if self.amnesia.is_none() {
            let nonce = ctx.rng().random();
            self.amnesia = Some(Amnesia { nonce, answered: BTreeSet::new(), highest_term: 0 });
        }
        let Some(a) = &self.amnesia else { return };
        let nonce = a.nonce;
        let unanswered: Vec<u32> = self.others().filter(|m| !a.answered.contains(m)).collect();
        for m in unanswered {
            self.send_peer(ctx, m, PeerBody::TermProbe { nonce });
        }
    }

    /// `from` answered a probe with `nonce`, in `term`.
    pub(super) fn on_term_answer(&mut self, from: u32, nonce: u64, term: u64) {
        if let Some(a) = self.amnesia.as_mut().filter(|a| a.nonce == nonce) {
            a.answered.insert(from);
            a.highest_term = a.highest_term.max(term);
        }
    }

    /// After every handler: leaves amnesia once every other member answered and a committed
    /// entry of a term above the highest answer is in the oplog (module docs).
    pub(super) fn maybe_end_amnesia(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        let Some(a) = &self.amnesia else { return };
        if !self.d.amnesiac || a.answered.len() + 1 < self.cfg.members.len() {
            return;
        }
        let committed = self.d.oplog.partition_point(|e| e.optime <= self.commit_point);
        if committed.checked_sub(1).is_some_and(|i| self.d.oplog[i].term > a.highest_term) {
            self.amnesia = None;
            self.d.amnesiac = false;
            self.journal.push(Change::Amnesiac(false));
            ctx.metric("causal.amnesia_ended", 1);
        }
    }
}
