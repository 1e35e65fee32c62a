//! Elections: Raft's, each preceded by a **dry run** (MongoDB's `replSetRequestVotes` with
//! `dryRun: true`; Raft's pre-vote).
//!
//! A member that has heard from no primary for its randomized election timeout asks every other
//! member whether it *would* get its vote in the next term ([`PeerBody::RequestVote`] with
//! `dry_run`, sent in the member's current term). A member says yes when it would grant the
//! real vote: the asker's oplog is at least as up to date as its own, and it is neither primary
//! nor amnesiac. Answering a dry run changes nothing at the answerer: no vote is given, no timer
//! re-armed.
//! Only with yes from a majority (its own included) does the member stand: term + 1, its own
//! vote, a real `RequestVote` to every other member. Until then it stays a secondary.
//!
//! **Why.** A real election raises the term of every member it reaches: it deposes the primary
//! and sends every other candidate back to wait a new timeout, even when its candidate cannot
//! win. `kairos sim causal --seeds 50868 --faults all --load 150 --fault-s 4 --recovery-s 2`
//! showed the cost: after the last repair, the two members that held every entry split their
//! votes, and then a member whose oplog lacked three of their entries stood twice in a row, each
//! time turning both back into secondaries with fresh timeouts; the set had no primary for
//! 6.7 s after the repair and two sessions got no answer. With the dry run a member that cannot
//! win touches nobody's term.
//!
//! **Two members in a dry run at once.** Dry-run answers bind nobody, so two members with the
//! same oplog whose timers fire within a round trip of each other both hear yes, both stand,
//! and split the vote; with the third member unable to vote (down, or amnesiac) only those two
//! can elect, and each new pair of timeouts may collide again. So while its own dry run is
//! younger than two heartbeat intervals, a member says no to a dry run of a higher-numbered
//! member with the same oplog (yes to a lower-numbered one, and to one whose oplog is ahead).
//! Over `kairos sim causal --seeds 1..10001 --faults all --load 150 --fault-s 4
//! --recovery-s 2` (a lost disk in about half the seeds) it took the seeds whose sessions got
//! no answer after the repair from 2 to 0, and those with fewer than 150 ok operations from 10
//! to 3. Nor does an old heartbeat count: a secondary follows a primary only on a heartbeat or
//! batch numbered above the last it took from it ([`crate::msg::PeerMsg::seq`]), so copies of
//! a crashed primary's heartbeats, replayed, do not put off the election that replaces it.
//!
//! Raft's rule against disruptive servers (say no while hearing from a primary) is not applied:
//! MongoDB's voters do not apply it either, and it cost availability in the campaign: over
//! `kairos sim causal --seeds 50001..100001` (same window) the sessions' ok operations were
//! 18,199,248 with it and 18,255,928 without (main, without dry runs: 18,244,523), seeds with
//! fewer than 200 ok 210 against 77 (main 92).
//!
//! **Safety does not rest on it.** Only real votes elect (one per term, journaled before the
//! answer leaves). A dry-run answer counts only in the term it was asked in; a duplicated or
//! replayed yes of an earlier dry run of the same term can at worst start a real election that
//! fails, as any election may.

use super::{Member, MemberState, MemberTimer};
use crate::msg::{CausalMsg, OpPos, PeerBody};
use kairos_core::{Ctx, LocalTime};
use rand::Rng as _;
use std::collections::BTreeSet;
use std::time::Duration;

/// A dry run in progress: the term it asks in, and the members that said yes (this one too).
pub(super) struct DryRun {
    term: u64,
    yes: BTreeSet<u32>,
    started_at: LocalTime,
}

impl Member {
    /// (Re)starts the election timer: the base timeout plus a random jitter below it.
    pub(super) fn arm_election(&self, ctx: &mut Ctx<'_, CausalMsg>) {
        let base = self.cfg.election_timeout;
        let jitter_ns = ctx.rng().random_range(0..base.as_nanos().max(1) as u64);
        ctx.set_timer(MemberTimer::Election, base + Duration::from_nanos(jitter_ns));
    }

    /// The election timer fired: no word from a primary. Starts a dry run (a set of one stands
    /// at once); the timer is re-armed, so a dry run or an election that gets nowhere is tried
    /// again after another timeout.
    pub(super) fn on_election_timeout(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        if self.is_primary() {
            return;
        }
        self.arm_election(ctx);
        if self.d.amnesiac {
            return;
        }
        if self.cfg.majority() <= 1 {
            return self.stand(ctx);
        }
        self.dry_run = Some(DryRun { term: self.d.term, yes: BTreeSet::from([self.me]), started_at: ctx.now() });
        ctx.metric("causal.dry_runs_started", 1);
        let last = self.last_pos();
        let others: Vec<u32> = self.others().collect();
        for m in others {
            self.send_peer(ctx, m, PeerBody::RequestVote { last, dry_run: true });
        }
    }

    /// The real election: term + 1, this member's vote, and every other member asked.
    fn stand(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        self.dry_run = None;
        // A peer may have pushed the term to its maximum; never wrap (no election then).
        let Some(term) = self.d.term.checked_add(1) else {
            ctx.metric("causal.term_exhausted", 1);
            return;
        };
        self.set_vote(term, Some(self.me));
        self.primary = None;
        self.state = MemberState::Candidate { votes: BTreeSet::from([self.me]) };
        ctx.metric("causal.elections_started", 1);
        self.arm_election(ctx);
        if self.cfg.majority() <= 1 {
            return self.become_primary(ctx);
        }
        let last = self.last_pos();
        let others: Vec<u32> = self.others().collect();
        for m in others {
            self.send_peer(ctx, m, PeerBody::RequestVote { last, dry_run: false });
        }
    }

    /// `from` asks for this member's vote (or whether it would get it), in `term` (this
    /// member's term already raised to it when higher).
    pub(super) fn on_request_vote(
        &mut self,
        ctx: &mut Ctx<'_, CausalMsg>,
        from: u32,
        term: u64,
        last: OpPos,
        dry_run: bool,
    ) {
        let current = term == self.d.term;
        let mine = self.last_pos();
        let up_to_date = (last.term, last.optime) >= (mine.term, mine.optime);
        let willing = current && up_to_date && !self.is_primary() && !self.d.amnesiac;
        self.stats.votes_refused_amnesiac += u64::from(current && self.d.amnesiac);
        // A dry run asks about the next term, where this member has given no vote yet.
        let free = dry_run || self.d.voted_for.is_none() || self.d.voted_for == Some(from);
        // Two members with the same oplog that run their dry runs at once would both stand
        // and split the vote; while its own dry run is young, the lower-numbered one says no.
        let contending = dry_run
            && last == mine
            && from > self.me
            && self
                .dry_run
                .as_ref()
                .is_some_and(|r| r.term == term && ctx.now().saturating_since(r.started_at) < self.cfg.heartbeat * 2);
        self.stats.dry_runs_refused_contending += u64::from(willing && free && contending);
        let granted = willing && free && !contending;
        if granted && !dry_run {
            self.set_vote(self.d.term, Some(from));
            self.arm_election(ctx);
        }
        self.send_peer(ctx, from, PeerBody::VoteReply { granted, dry_run });
    }

    /// `from` answered this member's (dry-run) vote request, in `term`.
    pub(super) fn on_vote_reply(
        &mut self,
        ctx: &mut Ctx<'_, CausalMsg>,
        from: u32,
        term: u64,
        granted: bool,
        dry_run: bool,
    ) {
        if !granted || term != self.d.term {
            return;
        }
        let majority = self.cfg.majority();
        if dry_run {
            // (A candidate whose election timed out runs a dry run too.)
            let primary = self.is_primary();
            if let Some(run) = self.dry_run.as_mut().filter(|r| r.term == term && !primary) {
                run.yes.insert(from);
                if run.yes.len() >= majority {
                    self.stand(ctx);
                }
            }
        } else if let MemberState::Candidate { votes } = &mut self.state {
            votes.insert(from);
            if votes.len() >= majority {
                self.become_primary(ctx);
            }
        }
    }
}
