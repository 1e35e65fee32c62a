//! A server's part in a view change (the paper's §4 and Algorithms 4–6), and its rejoin.
//!
//! **Entering a view.** A server that learns of a newer view (from the view manager, or from
//! its new leader's `CollectLog`) tells the coordinators of the transactions it holds (they
//! resend in the new view at once) and stops normal processing. It keeps its log and the
//! transactions it released but has not seen in the log, drops every other volatile thing
//! (queue, locks, speculative executions: its store goes back to the executed state) and
//! buffers submits of the new view until it serves in it.
//!
//! **The new leader** asks the replicas of its shard for their state (`CollectLog`, with its
//! executed point: the committed prefix every replica shares) and, with f + 1 voters (replicas
//! whose journal is whole), merges:
//! - (a) among those with the largest last normal view, the log of the one with the largest
//!   sync-point, up to it;
//! - (b) every released transaction that at least ⌈f/2⌉ + 1 of them released at the same
//!   timestamp: any f + 1 replicas include that many of any super quorum, so every transaction
//!   committed on the fast path is here. Those whose timestamp is not above every conflicting
//!   transaction in (a) cannot have committed (the old leader would have logged them first) and
//!   are dropped; the rest follow (a) in timestamp order.
//!
//! **Multi-shard transactions** are then reconciled among the new leaders of all shards
//! (every view change runs on every shard). Each lists its recent multi-shard transactions
//! to the other shards involved and answers questions about others; once it knows the state of
//! every such transaction on every shard involved, each leader decides alike:
//! settled on some shard (it came from an old leader's log: agreed and possibly executed) →
//! kept everywhere at that timestamp, a shard that lacks it taking its piece from the
//! transaction's operations (which every multi-shard piece carries). Shards may report it
//! settled at different timestamps when their merges took logs of different views: it was
//! settled at A in view 1, then dropped, resent and agreed at B in view 2, and one shard's
//! voters last served in view 1. The latest view's word wins, and a shard that settled it
//! earlier moves its entry to B: had it committed at A, view 2's merge would have kept it there
//! (the argument below), so nothing executed it or read it at A. Otherwise it is kept at the
//! largest tentative timestamp, fetched by the shards that lack it, if each of them can place
//! it there — none of its merged entries that conflict with the piece is as late — and dropped
//! everywhere if one cannot (the transaction cannot have committed).
//!
//! *Recent* means every tentative one, and the settled ones as old as a coordinator resends
//! (`retry_timeout × max_sends` before the newest entry). A transaction settles on one shard
//! while the other's leader may still hold it back for seconds — behind the lock of a
//! transaction whose agreement waits for its coordinator's resend, or in a view that never
//! started there — and that leader may then lose it in a view change (seeds 503, 4849, 5161 of
//! the tiga campaign: with a 2 s window it was settled on one shard, missing on the other,
//! which ran the resend as a new transaction that could never agree). A shard that lacks a
//! settled transaction older than what it remembers of its executed ones (`forget_truncated`)
//! does not take it: it may have run it already (counted as `tiga.vc_fetch_forgotten`; the
//! transaction then stays applied on one shard only — a known gap).
//!
//! Keeping what some shard settled matters: a leader executes T2 after a multi-shard T1 once
//! T1's timestamp is agreed, and T2 may commit on the fast path before T1 is durable on T1's
//! other shard, with a result that read T1's writes. A follower answers such a T2 on the fast
//! path only once T1 is in its log (`reply_gate.rs`), so a committed T2, fast or slow, leaves
//! T1 in the log of one of any f + 1 replicas of its shard: settled there, and kept everywhere.
//! On a shard whose merge lacks T1, no conflicting transaction after T1's timestamp can have
//! committed (T1's agreed timestamp put it before them on that shard's old leader, so their
//! fast quorums released T1 and their slow commits logged it), so T1 is placed before them.
//! A transaction tentative everywhere was read by no committed one: keeping it where every
//! shard can place it, or dropping it, are both safe. (Without the gate this was ambiguous:
//! from what f + 1 replicas report, "T1 agreed, the later conflicting transaction never
//! committed" looks like "T1 never reached that shard's leader, the later one committed";
//! the test `a_fast_commit_that_read_a_multi_shard_transaction_survives_when_its_other_shard_lost_it`
//! shows the loss without it.)
//!
//! **Starting the view.** The leader rebuilds its maps, hashes and stores from the new log,
//! keeps a reply (with the execution's result) for every transaction in it, and sends each
//! replica the log from that replica's executed point (`StartView`); log synchronization goes
//! on from there. A replica adopts it, answers the coordinators of the new entries on the slow
//! path, journals the new log and serves again. Coordinators resend what they had in flight
//! (same id); a transaction in the new log is answered from it (at-most-once).
//!
//! **Rejoin.** A restarted server comes back *recovering*: it serves nowhere until a leader of
//! its view sends it the log. If it led its view, the view manager replaces it (it forgot its
//! agreements and speculative executions); so too if it was changing to a view it leads (the
//! leader journals the view before it collects): a second run of that view's change could
//! merge other voters' reports and decide a multi-shard transaction otherwise than its first
//! run told the other shards' leaders, which may have started the view on it. Its journal
//! holds its log and the transactions it released, so it may vote in a later view change as
//! before the crash. One that lost its
//! journal (or cannot read its snapshot) does not know which views it led: it asks every
//! view-manager node for the highest view it holds (`ViewProbe`, with a fresh nonce so that a
//! replayed answer does not count). The highest answer of a majority is its *floor*: every view
//! it served in was chosen by a majority of the view managers, so it is at most the floor. It
//! neither votes nor leads until it has served as a follower in a view past the floor, and a
//! follower serving in a view ignores a `CollectLog` for that view (only a leader that forgot
//! the view would ask it again). The first view it hears of would not do as a floor: a
//! replayed message can carry a view long past.

use super::{Log, Record, Server, Status};
use crate::msg::{
    LogEntry, LogReport, PieceResult, ReplyKind, ServerReply, ShardId, TigaMsg, Ts, TxnId, TxnState, VerifyItem,
    VerifyKind,
};
use crate::view::{ServerState, View};
use kairos_core::{Ctx, LocalTime, NodeId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Submits buffered while a view change runs, at most.
const BUFFERED_MAX: usize = 100_000;
/// Log entries one `StartView` carries (the rest follows as log synchronization).
const START_VIEW_BATCH_MAX: usize = 1024;

/// The new leader's merged log, waiting for the multi-shard reconciliation.
#[derive(Clone, Debug, Default)]
pub(super) struct Merged {
    /// From the old leader's log: final.
    prefix: Vec<LogEntry>,
    /// The last view the prefix's log served in (the view of its `Settled` states).
    prefix_view: u64,
    /// From the released transactions of enough replicas.
    tail: Vec<LogEntry>,
    /// This shard's state of each recent multi-shard transaction (and of any asked about).
    mine: BTreeMap<TxnId, TxnState>,
    /// Other shards' states, and the shards each transaction involves.
    remote: BTreeMap<TxnId, BTreeMap<ShardId, TxnState>>,
    shards_of: BTreeMap<TxnId, Vec<ShardId>>,
    /// A piece (carrying the whole transaction) of each transaction heard of.
    pieces: BTreeMap<TxnId, Arc<crate::msg::Piece>>,
    /// Shards whose listing arrived.
    listed: BTreeSet<ShardId>,
    /// Per key, the latest timestamp that read it and that wrote it, over the executed state
    /// and the merged log: where a transaction this shard lacks could still be placed.
    /// (Their log hashes are not used.)
    stamps: super::KeyMaps,
    /// Where each transaction of the merged log is: (timestamp, in the prefix). Transactions
    /// of entries truncated below a checkpoint count as in the prefix (they are executed).
    index: BTreeMap<TxnId, (Ts, bool)>,
    /// The pieces of truncated entries this replica still has.
    truncated_pieces: BTreeMap<TxnId, Arc<crate::msg::Piece>>,
    /// Where each transaction's entry is in `prefix` then `tail` (read as one sequence), so
    /// that answering thousands of questions does not scan the merged log for each.
    at: BTreeMap<TxnId, usize>,
}

/// A server's view-change progress.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Transactions released and not in the log when the server stopped serving (or, after a
    /// restart, as journaled).
    pub(super) released: Vec<LogEntry>,
    /// Leader: the executed point its `CollectLog` asked from, and what replicas reported.
    collect_from: u64,
    reports: BTreeMap<u32, LogReport>,
    /// Leader: the merged log once f + 1 voters reported.
    merged: Option<Merged>,
    /// Verify messages that arrived before the merge.
    early_verify: Vec<(ShardId, VerifyKind, Vec<VerifyItem>)>,
    /// Submits of this view that arrived before it started, with when they arrived.
    buffered: Vec<(NodeId, TigaMsg, LocalTime)>,
    /// Leader, after the view started: the states it reported (late questions are answered
    /// from them, so every leader decides on the same facts).
    pub(super) answered: BTreeMap<TxnId, TxnState>,
    pub(super) started_at: Option<LocalTime>,
    /// A view change began here since the last restart.
    pub(super) entered_since_restart: bool,
    /// Restarted without knowing its view (nothing on disk, [`Process::on_amnesia`], or a
    /// snapshot it cannot read), and the view floor the view managers gave since: it votes
    /// only once it serves in a later view, and leads no view before (module docs).
    pub(super) amnesia: bool,
    pub(super) view_floor: Option<u64>,
    /// The probe for the floor while it is unknown.
    pub(super) floor_probe: Option<FloorProbe>,
    /// Follower: where the new leader asked its log from.
    asked_from: Option<u64>,
}

/// An amnesiac server's question to the view managers (module docs).
#[derive(Debug)]
pub(super) struct FloorProbe {
    nonce: u64,
    answered: BTreeSet<NodeId>,
    highest: u64,
}

impl Server {
    pub(super) fn servers_of_shard(&self) -> Vec<NodeId> {
        self.topology.shards[self.shard as usize].clone()
    }

    /// Whether `node` is a server of this deployment.
    pub(super) fn is_server(&self, node: NodeId) -> bool {
        self.topology.locate(node).is_some()
    }

    pub(super) fn heartbeat(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        let serving_follower = self.state == ServerState::Normal && !self.is_leader();
        let heard = ctx.now().saturating_since(self.leader_heard_at) <= self.config.leader_timeout;
        let leader_contact = serving_follower.then_some(heard);
        let may_lead = self.may_lead();
        let msg = TigaMsg::Heartbeat { view: self.view.number, state: self.state, leader_contact, may_lead };
        ctx.send_all(self.view_managers.clone(), &msg);
        self.probe_view_floor(ctx);
    }

    /// After amnesia, until a majority of the view managers answered: ask those that have not.
    fn probe_view_floor(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        if !self.vc.amnesia || self.vc.view_floor.is_some() {
            return;
        }
        let nonce = match &self.vc.floor_probe {
            Some(p) => p.nonce,
            None => {
                let nonce = rand::Rng::random(ctx.rng());
                self.vc.floor_probe = Some(FloorProbe { nonce, answered: BTreeSet::new(), highest: 0 });
                nonce
            }
        };
        let answered = self.vc.floor_probe.as_ref().map(|p| p.answered.clone()).unwrap_or_default();
        for &vm in self.view_managers.iter().filter(|vm| !answered.contains(vm)) {
            ctx.send(vm, TigaMsg::ViewProbe { nonce });
        }
    }

    /// A view manager's answer to the floor probe.
    pub(super) fn on_view_floor(&mut self, ctx: &mut Ctx<'_, TigaMsg>, from: NodeId, nonce: u64, view: u64) {
        let Some(probe) = self.vc.floor_probe.as_mut().filter(|p| p.nonce == nonce) else { return };
        probe.answered.insert(from);
        probe.highest = probe.highest.max(view);
        if probe.answered.len() > self.view_managers.len() / 2 {
            self.vc.view_floor = Some(probe.highest);
            self.vc.floor_probe = None;
            ctx.metric("tiga.vc_amnesiac_floor_known", 1);
            self.write_snapshot(ctx);
        }
    }

    /// A newer view arrived (module docs).
    pub(super) fn on_new_view(&mut self, ctx: &mut Ctx<'_, TigaMsg>, view: View) {
        if !self.plausible(&view) {
            ctx.metric("tiga.server_bad_view", 1);
            return;
        }
        if view.number < self.view.number {
            return;
        }
        if view.number == self.view.number {
            // A recovering follower of the view it restarted in: ask its leader for the log.
            if self.state == ServerState::Recovering && !self.is_leader() {
                self.send_log_state(ctx, self.executed_or_synced());
            }
            return;
        }
        self.enter_view(ctx, view);
    }

    /// Where a replica's log is known to match the leader's: its synced log when it served in
    /// the leader's view, else its executed (committed) prefix.
    pub(super) fn executed_or_synced(&self) -> u64 {
        if self.last_normal == self.view.number {
            self.log.len()
        } else {
            self.executed
        }
    }

    /// Whether this replica may lead a view: not after it lost its disk, until it has served
    /// again ([`Self::become_normal`] clears the amnesia; `enter_view` says why).
    fn may_lead(&self) -> bool {
        !self.vc.amnesia
    }

    fn enter_view(&mut self, ctx: &mut Ctx<'_, TigaMsg>, view: View) {
        ctx.metric("tiga.server_view_changes", 1);
        let serving_leader = self.is_leader() && self.state == ServerState::Normal;
        if self.state == ServerState::Normal {
            // Remember what this replica released (and replied to) for the merge.
            self.vc.released = self.released_entries();
        }
        // A restarted replica stays recovering (it serves nowhere until a leader sends it the
        // log), unless it is to lead this view and may: it runs the view change, and says so to
        // the view manager, which would otherwise replace it as if it had not restarted yet.
        let leads_it = view.leaders.get(self.shard as usize) == Some(&self.replica) && self.may_lead();
        if self.state != ServerState::Recovering || leads_it {
            self.state = ServerState::ViewChange;
        }
        // A serving leader goes back to the executed state (its live store also holds
        // speculative executions and final-but-uncommitted entries, re-run from the new log).
        // Anyone else's store is the executed state already (a leader that never started its
        // view has no committed copy of its own).
        if serving_leader {
            let store = std::mem::replace(&mut self.store, self.committed.clone());
            self.retired.store(store);
        }
        // Tell the coordinators of what this server holds at once, so that they resend in the
        // new view now rather than when their retry timers fire.
        let coordinators: BTreeSet<NodeId> = self.txns.keys().map(|t| t.coordinator()).collect();
        for c in coordinators {
            ctx.send(c, TigaMsg::NewView { view: view.clone() });
        }
        self.view = view;
        self.topology.leader = self.view.leaders.clone();
        self.config.preventive = self.view.preventive;
        self.clear_volatile();
        self.vc.reports.clear();
        self.vc.merged = None;
        self.vc.early_verify.clear();
        self.vc.buffered.clear();
        self.vc.answered.clear();
        self.vc.asked_from = None;
        self.vc.started_at = Some(ctx.now());
        self.vc.entered_since_restart = true;
        if self.is_leader() && !self.may_lead() {
            // It may have led this very view before it lost its disk (seed 1389 of the tiga
            // campaign: a leader wiped, restarted, heard of its own view and started it again
            // with another log). It leads nothing until it has served again: it says it is
            // recovering, so the view manager names another leader (seed 1903: one that
            // merely waited in a view change was named again and again).
            self.state = ServerState::Recovering;
            ctx.metric("tiga.vc_amnesiac_leader_waits", 1);
        } else if self.is_leader() {
            // The view is durable before this leader asks for anything: restarted, it must not
            // run this view's change again. Its first run may have told other shards' leaders
            // its states (the listings), and they may have started the view on them; a second
            // merge, from other voters, can decide a multi-shard transaction otherwise (the
            // test `rerun_view_change`). Restarted in this view, it stays recovering, and the
            // view manager names the next view's leaders, as for a leader that crashed serving.
            self.write_snapshot(ctx);
            self.vc.collect_from = self.executed;
            self.collect(ctx, None);
        }
        ctx.set_timer(super::ServerTimer::ViewChangeRetry, self.config.view_change_retry);
    }

    /// Drops the queue, locks, agreements and the transaction table (rebuilt from the log when
    /// the view starts), except the transactions of truncated entries (at-most-once: a resend
    /// of one is answered, never run again).
    fn clear_volatile(&mut self) {
        let kept: Vec<(TxnId, Box<super::Txn>)> =
            self.truncated.iter().filter_map(|t| self.txns.remove(&t.txn).map(|x| (t.txn, x))).collect();
        self.txns.clear();
        for (id, mut t) in kept {
            t.status = Status::Final;
            t.last_reply = Some(self.slow_reply(id, t.ts));
            self.txns.insert(id, t);
        }
        self.pq = Default::default();
        self.locked.clear();
        self.early_agree.clear();
        self.awaiting.clear();
        self.gate = Default::default();
        self.release_timer_at = None;
        let n = self.topology.replicas_per_shard();
        self.sync_point = vec![0; n];
        self.checkpoint_sent = vec![None; n];
        self.next_send = vec![0; n];
        self.stalls = vec![0; n];
        self.commit_point_sent = vec![0; n];
    }

    /// Leader: asks the replicas that have not reported (all of them if `only` is None).
    fn collect(&mut self, ctx: &mut Ctx<'_, TigaMsg>, only: Option<&BTreeSet<u32>>) {
        let msg = TigaMsg::CollectLog { view: self.view.clone(), from: self.vc.collect_from };
        for (r, node) in self.servers_of_shard().into_iter().enumerate() {
            let r = r as u32;
            if r == self.replica {
                continue;
            }
            if only.is_none_or(|missing| missing.contains(&r)) {
                ctx.send(node, msg.clone());
            }
        }
        if !self.vc.reports.contains_key(&self.replica) {
            let mine = self.own_state(self.vc.collect_from);
            self.vc.reports.insert(self.replica, mine);
        }
    }

    fn own_state(&self, from: u64) -> LogReport {
        let len = self.log.len();
        // A log truncated past `from` continues from its checkpoint: send that along.
        let checkpoint = self.checkpoint.clone().filter(|_| from < self.log.base());
        let from = checkpoint.as_ref().map_or(from, |c| c.position);
        let entries = if from <= len { self.log.range(from, len) } else { Vec::new() };
        LogReport {
            voter: self.voter,
            last_normal: self.last_normal,
            sync_point: len,
            executed: self.executed,
            from,
            entries,
            released: if self.voter { self.vc.released.clone() } else { Vec::new() },
            checkpoint,
        }
    }

    pub(super) fn send_log_state(&mut self, ctx: &mut Ctx<'_, TigaMsg>, from: u64) {
        let report = self.own_state(from);
        let leader = self.topology.leader_node(self.shard);
        ctx.send(leader, TigaMsg::LogState { view: self.view.number, replica: self.replica, report });
    }

    /// Only the leader the view names for this shard collects for it.
    pub(super) fn on_collect_log(&mut self, ctx: &mut Ctx<'_, TigaMsg>, from_node: NodeId, view: View, from: u64) {
        let named = self.plausible(&view)
            && self.topology.shards[self.shard as usize].get(view.leaders[self.shard as usize] as usize)
                == Some(&from_node);
        if !named || view.number < self.view.number {
            ctx.metric("tiga.server_bad_view", 1);
            return;
        }
        if view.number > self.view.number {
            self.enter_view(ctx, view);
        } else if self.state == ServerState::Normal {
            // This view started here already: the ask is a late copy, or its leader forgot
            // the view (a lost disk); a log reported to it now could restart the view with
            // another log.
            ctx.metric("tiga.server_collect_for_started_view", 1);
            return;
        }
        if !self.is_leader() {
            self.vc.asked_from = Some(from);
            self.send_log_state(ctx, from);
        }
    }

    /// A view that fits the deployment and leaves room for a successor.
    fn plausible(&self, view: &View) -> bool {
        view.fits(&self.topology) && view.number < u64::MAX
    }

    pub(super) fn on_log_state(
        &mut self,
        ctx: &mut Ctx<'_, TigaMsg>,
        from_node: NodeId,
        replica: u32,
        report: LogReport,
    ) {
        let r = replica as usize;
        // A leader that lost its disk takes no report: it waits to be replaced (`enter_view`).
        let leading = (self.state == ServerState::Normal || self.vc.started_at.is_some()) && self.may_lead();
        if !self.is_leader()
            || !leading
            || self.topology.shards[self.shard as usize].get(r) != Some(&from_node)
            || replica == self.replica
        {
            return;
        }
        let LogReport { last_normal, sync_point, executed, from, ref entries, ref released, ref checkpoint, .. } =
            report;
        // A log that does not match its claimed sync-point, or claims from the future, is refused.
        let consistent = last_normal <= self.view.number
            && executed <= sync_point
            && (from > sync_point || from + entries.len() as u64 == sync_point)
            && checkpoint.as_ref().is_none_or(|c| c.position == from && c.position <= executed)
            && entries.iter().chain(released).all(|e| self.validate(&e.piece));
        if !consistent {
            ctx.metric("tiga.server_bad_log_state", 1);
            return;
        }
        if self.state == ServerState::Normal {
            // A late or rejoining replica: send it the view's log from where it matches ours.
            let start = if last_normal == self.view.number { sync_point.min(self.log.len()) } else { executed };
            self.send_start_view(ctx, replica, start);
            return;
        }
        // While collecting: a log that starts beyond what this leader holds, without the
        // checkpoint to bridge the gap, lacks entries the merge may need: ask it again.
        let from_ok = report.from == self.vc.collect_from
            || report.sync_point <= self.vc.collect_from
            || report.checkpoint.is_some();
        if self.vc.merged.is_none() && !from_ok {
            ctx.metric("tiga.vc_report_from_elsewhere", 1);
            let msg = TigaMsg::CollectLog { view: self.view.clone(), from: self.vc.collect_from };
            ctx.send(from_node, msg);
            return;
        }
        self.vc.reports.insert(replica, report);
        if self.vc.merged.is_none() {
            self.try_merge(ctx);
        }
    }

    /// Leader: with f + 1 voters, merges (module docs).
    fn try_merge(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        let f = self.topology.f();
        let voters: Vec<LogReport> = self.vc.reports.values().filter(|s| s.voter).cloned().collect();
        if voters.len() < f + 1 {
            return;
        }
        let last = voters.iter().map(|s| s.last_normal).max().unwrap_or(0);
        let chosen = voters.iter().filter(|s| s.last_normal == last).max_by_key(|s| s.sync_point).expect("one voter");
        let chosen = chosen.clone();
        let mut from = self.vc.collect_from;
        if chosen.from > from && chosen.sync_point > chosen.from {
            // The chosen log continues from a checkpoint beyond this leader's executed point:
            // take the checkpoint (state transfer to the new leader).
            let Some(c) = chosen.checkpoint.clone() else { return };
            self.install_checkpoint(ctx, c);
            from = chosen.from;
            self.vc.collect_from = from;
        }
        let mut prefix: Vec<LogEntry> = self.log.range(0, from);
        if chosen.sync_point > from && chosen.from == from {
            prefix.extend(chosen.entries.iter().cloned());
        }
        // (b): released at the same timestamp by enough of the voters of the latest view.
        let threshold = f.div_ceil(2) + 1;
        let mut counts: BTreeMap<(TxnId, Ts), (usize, &LogEntry)> = BTreeMap::new();
        let rule_b = !self.config.unsafe_skip_merge_rule_b;
        for s in voters.iter().filter(|s| rule_b && s.last_normal == last) {
            for e in &s.released {
                counts.entry((e.piece.txn, e.ts)).or_insert((0, e)).0 += 1;
            }
        }
        let in_prefix: BTreeSet<TxnId> = prefix.iter().map(|e| e.piece.txn).collect();
        // Conflicts with the executed state (including entries truncated below a checkpoint)
        // and with the prefix.
        let mut stamps = self.committed_maps.clone();
        for e in &prefix {
            stamps.stamp(&e.piece, e.ts);
        }
        let mut tail: Vec<LogEntry> = Vec::new();
        let mut taken: BTreeSet<TxnId> = BTreeSet::new();
        for ((txn, ts), (n, e)) in counts {
            if n < threshold || in_prefix.contains(&txn) || !taken.insert(txn) {
                continue;
            }
            let last_conflict = stamps.conflict_ts(&e.piece);
            if ts <= last_conflict {
                ctx.metric("tiga.vc_dropped_behind_log", 1);
                continue;
            }
            tail.push(e.clone());
        }
        tail.sort_by_key(|e| (e.ts, e.piece.txn));
        ctx.metric("tiga.vc_merged_from_released", tail.len() as u64);
        for e in &tail {
            stamps.stamp(&e.piece, e.ts);
        }
        let mut merged = Merged { prefix, prefix_view: last, tail, stamps, ..Merged::default() };
        let entries = merged.prefix.iter().chain(&merged.tail);
        merged.at = entries.enumerate().map(|(i, e)| (e.piece.txn, i)).collect();
        for e in &merged.prefix {
            merged.index.insert(e.piece.txn, (e.ts, true));
        }
        for e in &merged.tail {
            merged.index.insert(e.piece.txn, (e.ts, false));
        }
        for t in &self.truncated {
            merged.index.entry(t.txn).or_insert((t.ts, true));
            if let Some(p) = self.txns.get(&t.txn).map(|x| &x.piece).filter(|p| !p.txn_ops.is_empty()) {
                merged.truncated_pieces.insert(t.txn, p.clone());
            }
        }
        self.vc.merged = Some(merged);
        ctx.metric("tiga.vc_merged", 1);
        self.send_listings(ctx);
        for (shard, kind, items) in std::mem::take(&mut self.vc.early_verify) {
            self.on_verify_items(ctx, shard, kind, items);
        }
        self.try_start(ctx);
    }

    /// The state of a transaction of the merged log (None: not in it).
    fn state_of(merged: &Merged, txn: TxnId) -> Option<TxnState> {
        match merged.index.get(&txn) {
            Some(&(ts, true)) => Some(TxnState::Settled { ts, view: merged.prefix_view }),
            Some(&(ts, false)) => Some(TxnState::Tentative(ts)),
            None => None,
        }
    }

    /// The state of a transaction this shard's merge lacks: how late its piece `here` (taken
    /// from the transaction's operations; unplaceable without them) conflicts here.
    fn absent_state(merged: &Merged, here: Option<crate::msg::Piece>) -> TxnState {
        match here {
            Some(p) => TxnState::Absent { latest_conflict: merged.stamps.conflict_ts(&p) },
            None => TxnState::UNPLACEABLE,
        }
    }

    fn piece_in_merge(merged: &Merged, txn: TxnId) -> Option<&Arc<crate::msg::Piece>> {
        let in_log = merged.at.get(&txn).and_then(|i| match i.checked_sub(merged.prefix.len()) {
            None => merged.prefix.get(*i),
            Some(j) => merged.tail.get(j),
        });
        in_log.map(|e| &e.piece).or_else(|| merged.truncated_pieces.get(&txn))
    }

    /// Leader, merged: lists its recent multi-shard transactions to every other shard.
    fn send_listings(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        let horizon = self.resend_horizon();
        let Some(merged) = self.vc.merged.as_mut() else { return };
        let newest = merged.prefix.iter().chain(&merged.tail).map(|e| e.ts).max().unwrap_or(Ts::ZERO);
        // Settled transactions as old as a coordinator may still resend (module docs).
        let since = newest.saturating_sub(horizon);
        // Entries truncated below a checkpoint count too: they are executed here.
        let truncated: Vec<LogEntry> = merged
            .truncated_pieces
            .iter()
            .filter_map(|(txn, piece)| merged.index.get(txn).map(|(ts, _)| LogEntry { ts: *ts, piece: piece.clone() }))
            .collect();
        // The tail (rule (b)) is listed whatever its age: a transaction released long ago and
        // never committed there (its coordinator resent it later, and the old view's leaders
        // took the resend at a new timestamp) is tentative, not settled, and every shard must
        // decide it the same way.
        let recent: Vec<&LogEntry> = truncated
            .iter()
            .chain(&merged.prefix)
            .filter(|e| e.ts >= since)
            .chain(&merged.tail)
            .filter(|e| e.piece.shards.len() > 1)
            .collect();
        let mut by_shard: BTreeMap<ShardId, Vec<VerifyItem>> = BTreeMap::new();
        let mut mine = BTreeMap::new();
        for e in recent {
            let txn = e.piece.txn;
            let state = Self::state_of(merged, txn).expect("listed from the merged log");
            mine.insert(txn, state);
            for s in e.piece.shards.iter().filter(|s| **s != self.shard) {
                by_shard.entry(*s).or_default().push(VerifyItem {
                    txn,
                    shards: e.piece.shards.clone(),
                    state,
                    piece: Some(e.piece.clone()),
                });
            }
        }
        for (txn, state) in mine {
            merged.mine.insert(txn, state);
            merged.shards_of.entry(txn).or_default();
        }
        for e in truncated.iter().chain(merged.prefix.iter().chain(&merged.tail)) {
            if let Some(sh) = merged.shards_of.get_mut(&e.piece.txn) {
                if sh.is_empty() {
                    *sh = e.piece.shards.clone();
                }
            }
        }
        let me = self.shard;
        for s in 0..self.topology.shard_count() as ShardId {
            if s == me {
                continue;
            }
            let items = by_shard.remove(&s).unwrap_or_default();
            let to = self.topology.leader_node(s);
            ctx.send(to, TigaMsg::Verify { view: self.view.number, shard: me, kind: VerifyKind::Listing, items });
        }
    }

    pub(super) fn on_verify(
        &mut self,
        ctx: &mut Ctx<'_, TigaMsg>,
        from: NodeId,
        shard: ShardId,
        kind: VerifyKind,
        items: Vec<VerifyItem>,
    ) {
        if !self.is_leader()
            || shard as usize >= self.topology.shard_count()
            || self.topology.leader_node(shard) != from
        {
            return;
        }
        // Each item's shards are looked up (their leaders asked): a list naming a shard that
        // does not exist, or one twice, is not from a correct leader.
        let items: Vec<VerifyItem> = items.into_iter().filter(|i| self.valid_shards(&i.shards)).collect();
        if self.state == ServerState::Normal {
            if matches!(kind, VerifyKind::Answer | VerifyKind::ListingAgain) {
                return;
            }
            // The view started here already: answer from what this leader decided on.
            let answers: Vec<VerifyItem> = items
                .iter()
                .map(|i| VerifyItem {
                    txn: i.txn,
                    shards: i.shards.clone(),
                    state: self.vc.answered.get(&i.txn).copied().unwrap_or(TxnState::UNPLACEABLE),
                    piece: None,
                })
                .collect();
            if kind == VerifyKind::Listing {
                // The sender lacks our listing (it was lost): everything we listed, again.
                let listed: Vec<VerifyItem> = self
                    .vc
                    .answered
                    .iter()
                    .filter(|(txn, _)| self.txns.get(txn).is_some_and(|t| t.piece.shards.contains(&shard)))
                    .map(|(txn, state)| VerifyItem {
                        txn: *txn,
                        shards: self.txns[txn].piece.shards.clone(),
                        state: *state,
                        piece: Some(self.txns[txn].piece.clone()),
                    })
                    .collect();
                let (view, shard) = (self.view.number, self.shard);
                ctx.send(from, TigaMsg::Verify { view, shard, kind: VerifyKind::ListingAgain, items: listed });
            }
            if kind != VerifyKind::Answer {
                let (view, shard) = (self.view.number, self.shard);
                ctx.send(from, TigaMsg::Verify { view, shard, kind: VerifyKind::Answer, items: answers });
            }
            return;
        }
        if self.vc.merged.is_none() {
            if self.vc.early_verify.len() < 4 * self.topology.shard_count() {
                self.vc.early_verify.push((shard, kind, items));
            }
            return;
        }
        self.on_verify_items(ctx, shard, kind, items);
        self.try_start(ctx);
    }

    fn on_verify_items(
        &mut self,
        ctx: &mut Ctx<'_, TigaMsg>,
        shard: ShardId,
        kind: VerifyKind,
        items: Vec<VerifyItem>,
    ) {
        let me = self.shard;
        let (topology, config) = (&self.topology, &self.config);
        let Some(merged) = self.vc.merged.as_mut() else { return };
        let mut answers = Vec::new();
        for item in items {
            if !item.shards.contains(&me) || !item.shards.contains(&shard) {
                continue;
            }
            let txn = item.txn;
            merged.remote.entry(txn).or_default().insert(shard, item.state);
            merged.shards_of.insert(txn, item.shards.clone());
            // The asker sent the transaction's operations if it had them: it needs ours only
            // if it did not (a piece per item would double the exchange).
            let asker_piece = item.piece.filter(|p| p.txn == txn && p.shards == item.shards && !p.txn_ops.is_empty());
            let asker_has_it = asker_piece.is_some();
            if let Some(p) = asker_piece {
                merged.pieces.entry(txn).or_insert(p);
            }
            let state = match merged.mine.get(&txn) {
                Some(s) => *s,
                None => {
                    let s = Self::state_of(merged, txn).unwrap_or_else(|| {
                        let here =
                            merged.pieces.get(&txn).and_then(|p| p.sibling(me, |k| config.shard_of(topology, k)));
                        Self::absent_state(merged, here)
                    });
                    merged.mine.insert(txn, s);
                    s
                }
            };
            answers.push(VerifyItem {
                txn,
                shards: item.shards,
                state,
                piece: if asker_has_it { None } else { Self::piece_in_merge(merged, txn).cloned() },
            });
        }
        if matches!(kind, VerifyKind::Listing | VerifyKind::ListingAgain) {
            merged.listed.insert(shard);
        }
        if kind != VerifyKind::Answer {
            let to = self.topology.leader_node(shard);
            ctx.send(
                to,
                TigaMsg::Verify { view: self.view.number, shard: me, kind: VerifyKind::Answer, items: answers },
            );
        }
    }

    /// Leader: asks the shards whose state of some transaction it still lacks.
    fn ask_missing(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        let me = self.shard;
        let Some(merged) = self.vc.merged.as_ref() else { return };
        let mut questions: BTreeMap<ShardId, Vec<VerifyItem>> = BTreeMap::new();
        for (txn, shards) in &merged.shards_of {
            for s in shards.iter().filter(|s| **s != me) {
                if merged.remote.get(txn).is_none_or(|m| !m.contains_key(s)) {
                    questions.entry(*s).or_default().push(VerifyItem {
                        txn: *txn,
                        shards: shards.clone(),
                        state: merged.mine.get(txn).copied().unwrap_or(TxnState::UNPLACEABLE),
                        piece: Self::piece_in_merge(merged, *txn).cloned(),
                    });
                }
            }
        }
        for (s, items) in questions {
            let to = self.topology.leader_node(s);
            ctx.send(to, TigaMsg::Verify { view: self.view.number, shard: me, kind: VerifyKind::Question, items });
        }
    }

    /// Leader: once every other shard listed and every transaction heard of has every involved
    /// shard's state, decides (module docs) and starts the view.
    fn try_start(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        let me = self.shard;
        let shards = self.topology.shard_count() as ShardId;
        let Some(merged) = self.vc.merged.as_ref() else { return };
        let all_listed = (0..shards).all(|s| s == me || merged.listed.contains(&s));
        let complete = merged
            .shards_of
            .iter()
            .all(|(txn, sh)| sh.iter().all(|s| *s == me || merged.remote.get(txn).is_some_and(|m| m.contains_key(s))));
        if !all_listed || !complete {
            return;
        }
        let mut merged = self.vc.merged.take().expect("merged");
        let mut keep_at: BTreeMap<TxnId, Option<Ts>> = BTreeMap::new();
        let mut settled_somewhere: BTreeSet<TxnId> = BTreeSet::new();
        for (txn, sh) in &merged.shards_of {
            let mut states: Vec<TxnState> = vec![merged.mine.get(txn).copied().unwrap_or(TxnState::UNPLACEABLE)];
            states.extend(
                sh.iter().filter(|s| **s != me).filter_map(|s| merged.remote.get(txn).and_then(|m| m.get(s)).copied()),
            );
            if states.iter().any(|s| matches!(s, TxnState::Settled { .. })) {
                settled_somewhere.insert(*txn);
            }
            keep_at.insert(*txn, decide(&states));
        }
        // Positions some replica executed stay where they are.
        let executed_somewhere =
            self.vc.reports.values().map(|r| r.executed).max().unwrap_or(0).max(self.vc.collect_from);
        // Entries that join at a timestamp the prefix did not have them at: moved (superseded)
        // and fetched ones.
        let mut placed = self.move_superseded(ctx, &mut merged, &keep_at, executed_somewhere);
        let mut tail: Vec<LogEntry> = Vec::new();
        for e in std::mem::take(&mut merged.tail) {
            match keep_at.get(&e.piece.txn) {
                None => tail.push(e),
                Some(Some(ts)) => tail.push(LogEntry { ts: *ts, ..e }),
                Some(None) => ctx.metric("tiga.vc_dropped_multi_shard", 1),
            }
        }
        // Older than this, a transaction may have run here and been forgotten since
        // (`forget_truncated`, with its clock-error slack to spare): a settled one is not taken
        // (it could run twice). A tentative one is taken only where it can be placed (`decide`),
        // which one that wrote here cannot.
        let remembered_from = Ts::at(ctx.now()).saturating_sub(self.resend_horizon());
        for (txn, at) in &keep_at {
            let Some(ts) = at else { continue };
            if merged.index.contains_key(txn) {
                continue;
            }
            if *ts < remembered_from && settled_somewhere.contains(txn) {
                ctx.metric("tiga.vc_fetch_forgotten", 1);
                continue;
            }
            let shard_of = |k: &[u8]| self.config.shard_of(&self.topology, k);
            match merged.pieces.get(txn).and_then(|p| p.sibling(me, shard_of)) {
                Some(piece) => {
                    ctx.metric("tiga.vc_fetched", 1);
                    placed.push(LogEntry { ts: *ts, piece: Arc::new(piece) });
                }
                None => ctx.metric("tiga.vc_fetch_impossible", 1),
            }
        }
        let base = self.log.base();
        let keep_below = usize::try_from(executed_somewhere.saturating_sub(base)).unwrap_or(usize::MAX);
        match unblock(&mut merged.prefix, &placed, keep_below) {
            Ok(rest) if rest.is_empty() => {}
            Ok(rest) => {
                ctx.metric("tiga.vc_reordered_after_placed", rest.len() as u64);
                tail.extend(rest);
            }
            Err(_) => ctx.metric("tiga.vc_placed_behind_executed", 1),
        }
        tail.extend(placed);
        tail.sort_by_key(|e| (e.ts, e.piece.txn));
        self.vc.answered = merged.mine.clone();
        let mut log = merged.prefix;
        log.extend(tail);
        self.start_view_as_leader(ctx, log);
    }

    /// Takes out of the prefix every transaction this shard settled at a timestamp that a later
    /// view superseded (`decide` keeps it elsewhere), and returns it at the decided timestamp.
    /// Such an entry never committed (module docs), so no replica executed it; one that some
    /// did (a contradiction) stays and is counted.
    fn move_superseded(
        &self,
        ctx: &mut Ctx<'_, TigaMsg>,
        merged: &mut Merged,
        keep_at: &BTreeMap<TxnId, Option<Ts>>,
        executed_somewhere: u64,
    ) -> Vec<LogEntry> {
        let base = self.log.base();
        let mut moved: BTreeMap<TxnId, Ts> = BTreeMap::new();
        for (txn, at) in keep_at {
            let (Some(ts), Some(&(own, true))) = (at, merged.index.get(txn)) else { continue };
            if own == *ts {
                continue;
            }
            let unexecuted =
                merged.at.get(txn).is_some_and(|i| *i < merged.prefix.len() && base + *i as u64 >= executed_somewhere);
            if unexecuted {
                moved.insert(*txn, *ts);
            } else {
                ctx.metric("tiga.vc_settled_mismatch", 1);
            }
        }
        if moved.is_empty() {
            return Vec::new();
        }
        let (prefix, out): (Vec<LogEntry>, Vec<LogEntry>) =
            std::mem::take(&mut merged.prefix).into_iter().partition(|e| !moved.contains_key(&e.piece.txn));
        merged.prefix = prefix;
        ctx.metric("tiga.vc_settled_moved", out.len() as u64);
        out.into_iter().map(|e| LogEntry { ts: moved[&e.piece.txn], ..e }).collect()
    }

    fn start_view_as_leader(&mut self, ctx: &mut Ctx<'_, TigaMsg>, log: Vec<LogEntry>) {
        let executed = self.executed;
        // The committed state stays at `executed`; the live store runs the whole new log.
        let committed = std::mem::replace(&mut self.committed, self.store.clone());
        self.retired.store(committed);
        // The merged log starts where this leader's held log does (below, a checkpoint).
        let mut new_log = Log::starting_at(self.log.base());
        for e in log {
            new_log.push(e);
        }
        self.log = new_log;
        self.rebuild_from_log();
        let kept_from = executed.saturating_sub(self.results.len() as u64);
        let truncated: BTreeMap<u64, TxnId> =
            self.truncated.iter().filter(|t| t.position >= kept_from).map(|t| (t.position, t.txn)).collect();
        for pos in kept_from..self.log.len() {
            let in_log = self.log.get(pos).map(|e| e.piece.txn);
            let Some(id) = in_log.or_else(|| truncated.get(&pos).copied()) else { continue };
            if !self.txns.contains_key(&id) {
                continue;
            }
            let result = if pos < executed {
                let back = (executed - pos) as usize;
                PieceResult::clone(&self.results[self.results.len() - back])
            } else {
                let r = self.execute(id);
                let t = self.txns.get_mut(&id).expect("rebuilt");
                t.undo.clear();
                t.tpcc_undo = Default::default();
                r
            };
            let t = self.txns.get_mut(&id).expect("rebuilt");
            let reply = TigaMsg::Reply(ServerReply {
                view: self.view.number,
                txn: id,
                shard: self.shard,
                replica: self.replica,
                kind: ReplyKind::Fast,
                ts: t.ts,
                hash: [0; 20],
                result: Some(result),
                owd_ns: 0,
            });
            t.last_reply = Some(reply);
        }
        let reports = std::mem::take(&mut self.vc.reports);
        self.commit_point = reports.values().map(|r| r.executed).max().unwrap_or(0).max(executed).min(self.log.len());
        self.sync_point[self.replica as usize] = self.log.len();
        self.become_normal(ctx);
        for (r, s) in reports {
            if r != self.replica {
                let start = if s.last_normal == self.view.number { s.sync_point } else { s.executed };
                self.send_start_view(ctx, r, start.min(self.log.len()));
            }
        }
        self.arm_leader_timers(ctx);
        ctx.metric("tiga.vc_started", 1);
    }

    fn send_start_view(&mut self, ctx: &mut Ctx<'_, TigaMsg>, replica: u32, from: u64) {
        let r = replica as usize;
        let from = if from < self.log.base() { self.send_checkpoint(ctx, r).unwrap_or(from) } else { from };
        let end = (from + START_VIEW_BATCH_MAX as u64).min(self.log.len());
        let entries = self.log.range(from, end);
        self.next_send[r] = end;
        self.sync_point[r] = self.sync_point[r].min(from);
        self.commit_point_sent[r] = self.commit_point;
        self.ack_progress_at[r] = ctx.now();
        let node = self.topology.shards[self.shard as usize][r];
        ctx.send(node, TigaMsg::StartView { view: self.view.number, from, entries, commit_point: self.commit_point });
    }

    pub(super) fn on_start_view(
        &mut self,
        ctx: &mut Ctx<'_, TigaMsg>,
        from_node: NodeId,
        from: u64,
        entries: Vec<LogEntry>,
        commit_point: u64,
    ) {
        if self.is_leader() || from_node != self.topology.leader_node(self.shard) {
            return;
        }
        // Below its base the log is this replica's checkpoint: truncating there would drop
        // nothing below the base and put the leader's entries at the wrong positions (a restart
        // from a checkpoint at 300 adopted a stale StartView from 268: position 268's
        // transaction ran at 300; `kairos sim tiga` seed 5398). Saying where it is instead makes
        // the leader send from there.
        let matches = (self.log.base()..=self.log.len()).contains(&from)
            && (from >= self.executed || self.last_normal == self.view.number);
        if !matches || entries.iter().any(|e| !self.validate(&e.piece)) {
            // Our log does not match the leader's up to `from`: say where it does.
            self.send_log_state(ctx, self.executed);
            return;
        }
        if self.state == ServerState::Normal {
            // Already serving in this view (a duplicate): its entries are log synchronization.
            return self.on_log_sync(ctx, from_node, from, entries, commit_point);
        }
        // Rejoining the view it served in, its log is a prefix of the leader's (a leader's log
        // only grows within its view): a StartView of that view, perhaps an old copy replayed,
        // only extends it. Truncating to its `from` dropped entries this replica had already
        // acknowledged and answered on the slow path (a review's schedule).
        let keep = if self.last_normal == self.view.number { self.log.len() } else { from };
        let known = usize::try_from(keep - from).unwrap_or(usize::MAX);
        self.log.truncate(keep);
        self.rebuild_keeping_released();
        // The truncation is durable before any entry adopted below is journaled: the records
        // of those entries would otherwise follow the old log in the journal, and a write torn
        // before the snapshot at the end (a prefix of this handler's records survives) would
        // recover the dropped suffix with the new entries after it.
        self.write_snapshot(ctx);
        self.leader_heard_at = ctx.now();
        self.become_normal(ctx);
        for e in entries.into_iter().skip(known) {
            self.adopt_entry(ctx, e);
        }
        self.apply_committed(ctx, commit_point.min(self.log.len()));
        self.write_snapshot(ctx);
        let leader = self.topology.leader_node(self.shard);
        ctx.send(
            leader,
            TigaMsg::SyncAck { view: self.view.number, replica: self.replica, sync_point: self.log.len() },
        );
        self.release_due(ctx);
    }

    fn become_normal(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        self.state = ServerState::Normal;
        self.last_normal = self.view.number;
        // A replica that lost part of its journal votes again once it serves in a view that
        // started after its restart (every view change since has done without its vote). One
        // that lost all of it does not know the view it restarted in: it waits for a view
        // past the floor the view managers gave it.
        let forgot = self.vc.amnesia && self.vc.view_floor.is_none_or(|v| self.view.number <= v);
        if self.vc.entered_since_restart && !forgot && !self.voter {
            self.voter = true;
            self.vc.amnesia = false;
            // Durable, so that a later restart with this journal votes at once.
            self.write_snapshot(ctx);
        }
        self.vc.released.clear();
        self.vc.started_at = None;
        if self.is_leader() {
            self.write_snapshot(ctx);
        }
        for (from, msg, arrived) in std::mem::take(&mut self.vc.buffered) {
            if let TigaMsg::Submit(submit) = msg {
                self.on_submit(ctx, from, submit, arrived);
            }
        }
        self.release_due(ctx);
    }

    /// [`Self::rebuild_from_log`] in the view this replica serves or rejoins (a checkpoint
    /// installed, a `StartView` of the view it served in): what it released and the log does
    /// not hold stays released. That list is its vote in the next view change: rule (b) of the
    /// merge counts on every replica of a fast quorum reporting what it released (a review's
    /// schedule, the test `rejoin_forgets_released`: a follower that forgot a fast-committed
    /// multi-shard transaction on its rejoin let the next view drop it). Adopting a new view's
    /// log instead drops them: that view's merge decided them.
    pub(super) fn rebuild_keeping_released(&mut self) {
        let released = if self.state == ServerState::Normal {
            self.released_entries()
        } else if self.last_normal == self.view.number {
            self.vc.released.clone()
        } else {
            Vec::new()
        };
        self.rebuild_from_log();
        for e in released {
            let id = e.piece.txn;
            if self.txns.contains_key(&id) {
                continue; // in the log, or executed below the checkpoint
            }
            self.maps.add(&e.piece, e.ts);
            let mut t = super::Txn::new(e.piece, e.ts, Status::Released, 0);
            // Its caller writes a snapshot next, which lists it as released.
            t.released_journaled = true;
            self.txns.insert(id, t);
        }
    }

    /// Rebuilds the transaction table, maps and hashes from the log: the maps of the executed
    /// prefix (kept as it executes; a checkpoint carries them), then every later entry.
    pub(super) fn rebuild_from_log(&mut self) {
        self.clear_volatile();
        let maps = std::mem::replace(&mut self.maps, self.committed_maps.clone());
        self.retired.maps(maps);
        let base = self.log.base();
        for (i, e) in self.log.take().into_iter().enumerate() {
            let executed = base + (i as u64) < self.executed;
            self.index_entry(e, !executed);
        }
    }

    pub(super) fn buffer_submit(&mut self, ctx: &Ctx<'_, TigaMsg>, from: NodeId, msg: TigaMsg) {
        if self.vc.buffered.len() < BUFFERED_MAX {
            self.vc.buffered.push((from, msg, ctx.now()));
        }
    }

    /// The view-change retry timer: re-send what may have been lost.
    pub(super) fn on_vc_retry(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        if self.state == ServerState::Normal {
            return;
        }
        if self.is_leader() && !self.may_lead() {
            // Waits to be replaced (`enter_view`).
        } else if self.is_leader() {
            if self.vc.merged.is_none() {
                let missing: BTreeSet<u32> = (0..self.topology.replicas_per_shard() as u32)
                    .filter(|r| !self.vc.reports.contains_key(r))
                    .collect();
                self.collect(ctx, Some(&missing));
            } else {
                let me = self.shard;
                let unlisted: Vec<ShardId> = (0..self.topology.shard_count() as ShardId)
                    .filter(|s| *s != me && !self.vc.merged.as_ref().is_some_and(|m| m.listed.contains(s)))
                    .collect();
                if !unlisted.is_empty() {
                    self.send_listings(ctx);
                }
                self.ask_missing(ctx);
            }
        } else {
            // Again from where the leader asked, if it did: a report from elsewhere would not
            // give it the entries it lacks.
            let from = self.vc.asked_from.unwrap_or_else(|| self.executed_or_synced());
            self.send_log_state(ctx, from);
        }
        ctx.set_timer(super::ServerTimer::ViewChangeRetry, self.config.view_change_retry);
    }

    /// Makes the whole durable state one journal snapshot; returns whether it was written.
    pub(super) fn write_snapshot(&mut self, ctx: &mut Ctx<'_, TigaMsg>) -> bool {
        // Out of service, what it released is kept apart (its transactions are cleared, or
        // rebuilt from the log after a restart): that list is its vote in a view change.
        let released =
            if self.state == ServerState::Normal { self.released_entries() } else { self.vc.released.clone() };
        // The log from the checkpoint on disk on (its pages are apart; a replica may hold a
        // little more log than that, which recovery does not need).
        let from = self.durable.position().max(self.log.base());
        let snapshot = super::Snapshot {
            view: self.view.clone(),
            last_normal: self.last_normal,
            voter: self.voter,
            amnesiac: self.vc.amnesia,
            view_floor: self.vc.view_floor,
            log_from: from,
            log: self.log.range(from, self.log.len()),
            released,
        };
        match postcard::to_allocvec(&snapshot) {
            Ok(bytes) => {
                ctx.persist_snapshot(bytes);
                self.journaled = 0;
                true
            }
            Err(_) => false,
        }
    }

    pub(super) fn journal_released(&mut self, ctx: &mut Ctx<'_, TigaMsg>, id: TxnId) {
        if let Some(t) = self.txns.get(&id) {
            let entry = LogEntry { ts: t.ts, piece: t.piece.clone() };
            let durable = self.journal(ctx, Record::Released(entry));
            if let Some(t) = self.txns.get_mut(&id) {
                t.released_journaled = durable;
            }
        }
    }
}

/// Keeps conflicting entries in timestamp order around the entries `placed` after the prefix:
/// from the first prefix entry that conflicts with a placed one and has a later timestamp, the
/// rest of the prefix is taken out and returned (to be sorted into the tail). Such an entry
/// never committed — the placed transaction's agreed timestamp put it first on this shard's old
/// leader, so had the later one committed, the placed one would be in this merge (module docs)
/// — and neither did anything logged after it (commitment is a log prefix). Positions below
/// `keep_below` never move: a conflict there is an error (with its position).
fn unblock(prefix: &mut Vec<LogEntry>, placed: &[LogEntry], keep_below: usize) -> Result<Vec<LogEntry>, usize> {
    let later_conflict = |e: &LogEntry| prefix.iter().position(|p| p.ts > e.ts && conflicts(&p.piece, &e.piece));
    match placed.iter().filter_map(later_conflict).min() {
        None => Ok(Vec::new()),
        Some(cut) if cut < keep_below.min(prefix.len()) => Err(cut),
        Some(cut) => Ok(prefix.split_off(cut)),
    }
}

/// Whether two pieces conflict (as [`super::KeyMaps`] counts it): one writes a key the other
/// reads or writes.
fn conflicts(a: &crate::msg::Piece, b: &crate::msg::Piece) -> bool {
    let touches = |p: &crate::msg::Piece, k| p.reads.contains(k) || p.writes.contains(k);
    a.writes.iter().any(|k| touches(b, k)) || b.writes.iter().any(|k| touches(a, k))
}

/// What every new leader decides for a multi-shard transaction from its states on the
/// shards involved: `Some(ts)` keeps it at `ts`, `None` drops it (module docs).
///
/// Among settled states, the latest view's word wins (then the largest timestamp, so that the
/// decision never depends on the order of `states`: each leader lists its own first).
pub(super) fn decide(states: &[TxnState]) -> Option<Ts> {
    let settled = states
        .iter()
        .filter_map(|s| match s {
            TxnState::Settled { ts, view } => Some((*view, *ts)),
            _ => None,
        })
        .max();
    if let Some((_, ts)) = settled {
        return Some(ts);
    }
    let ts = states
        .iter()
        .filter_map(|s| match s {
            TxnState::Tentative(ts) => Some(*ts),
            _ => None,
        })
        .max()?;
    let placeable = states.iter().all(|s| match s {
        TxnState::Absent { latest_conflict } => *latest_conflict < ts,
        _ => true,
    });
    placeable.then_some(ts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_placed_after_the_prefix_takes_the_later_conflicting_entries_behind_it() {
        let entry = |txn, ts, reads: &[u64], writes: &[u64]| LogEntry {
            ts: Ts::from_nanos(ts),
            piece: Arc::new(crate::msg::Piece {
                txn: TxnId(txn),
                shard: 0,
                shards: vec![0, 1],
                reads: reads.to_vec(),
                writes: writes.to_vec(),
                ops: Vec::new(),
                txn_ops: Vec::new(),
                tpcc: Default::default(),
            }),
        };
        let prefix =
            vec![entry(1, 10, &[7], &[7]), entry(2, 30, &[8], &[]), entry(3, 40, &[], &[7]), entry(4, 50, &[], &[])];
        let txns = |es: &[LogEntry]| es.iter().map(|e| e.piece.txn.0).collect::<Vec<_>>();
        // Placed at 20 and writing key 7: entry 3 (a later write of 7) and all after it move.
        let mut p = prefix.clone();
        assert_eq!(unblock(&mut p, &[entry(9, 20, &[], &[7])], 0).map(|r| txns(&r)), Ok(vec![3, 4]));
        assert_eq!(txns(&p), vec![1, 2]);
        // Reading key 8 only: a later read of it is no conflict.
        let mut p = prefix.clone();
        assert_eq!(unblock(&mut p, &[entry(9, 20, &[8], &[])], 0), Ok(Vec::new()));
        assert_eq!(p, prefix);
        // Writing key 8, read at 30: from entry 2 on.
        assert_eq!(unblock(&mut prefix.clone(), &[entry(9, 20, &[], &[8])], 0).map(|r| txns(&r)), Ok(vec![2, 3, 4]));
        // A conflict with an executed position is refused, and nothing moves.
        let mut p = prefix.clone();
        assert_eq!(unblock(&mut p, &[entry(9, 20, &[], &[8])], 2), Err(1));
        assert_eq!(p, prefix);
    }

    #[test]
    fn settled_wins_else_the_largest_tentative_if_every_shard_lacking_it_can_place_it() {
        use TxnState::*;
        let t = Ts::from_nanos;
        let absent = |latest_conflict| Absent { latest_conflict: t(latest_conflict) };
        let settled = |ts, view| Settled { ts: t(ts), view };
        assert_eq!(decide(&[TxnState::UNPLACEABLE, settled(5, 1), Tentative(t(9))]), Some(t(5)));
        // A later view's settled word wins, whatever the order the states come in (seed 4770 of
        // the tiga campaign: settled at A in view 1 on one shard, at B in view 2 on another)...
        assert_eq!(decide(&[settled(9, 1), settled(5, 2)]), Some(t(5)));
        assert_eq!(decide(&[settled(5, 2), settled(9, 1)]), Some(t(5)));
        // ...and within a view, the largest timestamp.
        assert_eq!(decide(&[settled(5, 2), settled(7, 2)]), decide(&[settled(7, 2), settled(5, 2)]));
        assert_eq!(decide(&[Tentative(t(3)), Tentative(t(7))]), Some(t(7)));
        // Lacking shards fetch it when nothing conflicting is merged as late there...
        assert_eq!(decide(&[Tentative(t(3)), absent(0)]), Some(t(3)));
        assert_eq!(decide(&[Tentative(t(3)), Tentative(t(7)), absent(6)]), Some(t(7)));
        // ...and it is dropped everywhere when one of them cannot.
        assert_eq!(decide(&[Tentative(t(3)), absent(3)]), None);
        assert_eq!(decide(&[Tentative(t(3)), Tentative(t(7)), absent(9)]), None);
        assert_eq!(decide(&[Tentative(t(3)), TxnState::UNPLACEABLE]), None);
        assert_eq!(decide(&[absent(0), absent(0)]), None);
    }
}
