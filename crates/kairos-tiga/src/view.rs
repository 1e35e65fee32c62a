//! Views and the view manager.
//!
//! A [`View`] says which replica leads every shard and whether multi-shard transactions run in
//! preventive or detective mode. Views are numbered; every message between servers and
//! coordinators carries the sender's view number and a role handles only messages of its own
//! view. There is one global view number: every view change runs on every shard (a shard whose
//! leader stays the same still rebuilds its log from f + 1 replicas, which also settles the
//! multi-shard transactions the failed leader left open with it).
//!
//! The **view manager** is a small replicated state machine on its own nodes (2f + 1 of them):
//! each node embeds [`kairos_consensus::paxos::MultiPaxos`] over the sequence of views, so a
//! view is decided once a majority of view-manager nodes accepted it, and view-manager nodes
//! may crash and restart (their Paxos state is durable). Servers send heartbeats to every
//! view-manager node; a serving follower's heartbeat says whether its leader's log
//! synchronization (sent at least every heartbeat interval) reaches it. The node that leads the
//! Paxos log watches them and, when a shard's leader has been silent for `leader_timeout`,
//! restarted (it lost its volatile state), is heard by fewer than f of its followers (it reaches
//! the view manager but cannot commit), or has not finished a view change within
//! `view_change_timeout`, proposes the next view:
//!
//! - its leaders are in **one region where every shard has a live replica** if there is one
//!   (the region of most current leaders first, so a healthy placement stays put; a leader
//!   judged failed but still heard counts as live only when its shard has no other), otherwise
//!   each shard keeps a live leader or takes its live replica in the region with the most live
//!   servers; a shard none of whose replicas is live (all restarted, waiting for a leader of
//!   their view: seed 8427 of the tiga campaign, where all three replicas of a shard crashed
//!   during one view change and the one named to lead the next had lost its disk) takes,
//!   once the current view got nowhere for `view_change_timeout`, a restarted replica that
//!   kept its journal (a restarted leader named earlier may still hear of its view and lead
//!   it: a server entering a view it may lead runs its view change even when restarted);
//! - it is **preventive** when all leaders share a region (agreement among co-located leaders
//!   is cheap) and detective otherwise, unless the deployment fixed the mode.
//!
//! Every view-manager node sends a decided view to every server, and answers a heartbeat
//! from an older view with the current one (a restarted or partitioned server catches up that
//! way). Coordinators learn views from servers.

use crate::msg::{ShardId, TigaMsg};
use crate::topology::{TigaConfig, Topology};
use kairos_consensus::paxos::{MultiPaxos, PaxosConfig, PaxosMsg};
use kairos_core::{duration_nanos, Ctx, LocalTime, NodeId, Process, Stored, Timer, TimerId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Who leads each shard, and how multi-shard transactions agree, from view `number` on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    pub number: u64,
    /// The leading replica index of every shard.
    pub leaders: Vec<u32>,
    pub preventive: bool,
}

impl View {
    /// View 0: the topology's initial leaders.
    pub fn initial(topology: &Topology, preventive: bool) -> Self {
        View { number: 0, leaders: topology.leader.clone(), preventive }
    }

    /// Whether this view fits `topology` (a leader for every shard, each a replica of it).
    pub fn fits(&self, topology: &Topology) -> bool {
        self.leaders.len() == topology.shard_count()
            && self.leaders.iter().zip(&topology.shards).all(|(l, rs)| (*l as usize) < rs.len())
    }
}

/// What a server tells the view manager about itself in a heartbeat.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerState {
    /// Serving in its view.
    Normal,
    /// Running the view change into its view.
    ViewChange,
    /// Restarted, or behind, and not yet serving in any view since: it may lead nothing.
    Recovering,
}

/// How the view manager picks the mode of a new view.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ModeRule {
    /// Preventive when all leaders share a region, detective otherwise.
    ByPlacement,
    Preventive,
    Detective,
}

kairos_core::timers! {
    /// A view manager's timers.
    enum ViewManagerTimer {
        /// Look at the servers' heartbeats.
        Tick = 1,
        /// The replicated log of views (its Multi-Paxos heartbeat).
        Paxos = 2,
    }
}

#[derive(Copy, Clone, Debug)]
struct Heard {
    at: LocalTime,
    view: u64,
    state: ServerState,
    leader_contact: Option<bool>,
    may_lead: bool,
}

/// Counters of one view-manager node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ViewManagerStats {
    pub views_proposed: u64,
    pub views_decided: u64,
    pub bad_heartbeats: u64,
}

/// One node of the view manager (see the module docs).
pub struct ViewManager {
    topology: Topology,
    /// Region index of every server, `[shard][replica]`.
    regions: Vec<Vec<u32>>,
    config: TigaConfig,
    mode: ModeRule,
    paxos: MultiPaxos<View>,
    view: View,
    /// When this node applied `view` (local time).
    view_since: LocalTime,
    /// When this node last became the ready Paxos leader (it waits a `leader_timeout` for
    /// heartbeats before judging anyone).
    leading_since: Option<LocalTime>,
    /// The latest heartbeat of every server.
    heard: BTreeMap<(ShardId, u32), Heard>,
    /// A view number this node proposed and has not seen decided.
    proposed: Option<u64>,
    stats: ViewManagerStats,
}

impl ViewManager {
    /// Node `me` of the view manager on `members`; `regions[s][r]` is the region of replica
    /// `r` of shard `s`; `initial` is view 0.
    pub fn new(
        topology: Topology,
        regions: Vec<Vec<u32>>,
        config: TigaConfig,
        mode: ModeRule,
        initial: View,
        members: Vec<NodeId>,
        me: u32,
    ) -> Self {
        let paxos_config = PaxosConfig {
            heartbeat_interval: config.heartbeat_interval,
            election_timeout: config.leader_timeout * 2,
            election_jitter: config.leader_timeout,
            ..PaxosConfig::default()
        };
        ViewManager {
            paxos: MultiPaxos::new(paxos_config, members, me, 0, ViewManagerTimer::Paxos.id()),
            topology,
            regions,
            config,
            mode,
            view: initial,
            view_since: LocalTime::ZERO,
            leading_since: None,
            heard: BTreeMap::new(),
            proposed: None,
            stats: ViewManagerStats::default(),
        }
    }

    pub fn view(&self) -> &View {
        &self.view
    }
    pub fn stats(&self) -> &ViewManagerStats {
        &self.stats
    }

    fn servers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.topology.shards.iter().flatten().copied()
    }

    fn apply_decided(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        for (_, view) in self.paxos.take_committed() {
            // A view is taken only as the successor of the current one: a second proposal for
            // the same number (a new Paxos leader's retry) is a no-op.
            if view.number != self.view.number + 1 || !view.fits(&self.topology) {
                continue;
            }
            self.view = view;
            self.view_since = ctx.now();
            self.proposed = None;
            self.stats.views_decided += 1;
            ctx.metric("tiga.views_decided", 1);
            let msg = TigaMsg::NewView { view: self.view.clone() };
            let servers: Vec<NodeId> = self.servers().collect();
            ctx.send_all(servers, &msg);
        }
    }

    fn live(&self, now: LocalTime, shard: ShardId, replica: u32) -> bool {
        let timeout = duration_nanos(self.config.leader_timeout);
        let heard = self.heard.get(&(shard, replica)).is_some_and(|h| {
            now.as_nanos().saturating_sub(h.at.as_nanos()) <= timeout && h.state != ServerState::Recovering
        });
        heard && !(self.view.leaders.get(shard as usize) == Some(&replica) && self.cut_off(now, shard as usize))
    }

    /// Whether replica `replica` of `shard` restarted and waits for a leader of its view, but
    /// kept its journal: it can lead the next view (its view change rebuilds the log from
    /// f + 1 journals, its own among them, as any new leader's does), which the view manager
    /// asks of it only when no replica of the shard is live (module docs).
    fn restarted_may_lead(&self, now: LocalTime, shard: ShardId, replica: u32) -> bool {
        let timeout = duration_nanos(self.config.leader_timeout);
        self.heard.get(&(shard, replica)).is_some_and(|h| {
            now.as_nanos().saturating_sub(h.at.as_nanos()) <= timeout
                && h.state == ServerState::Recovering
                && h.may_lead
        })
    }

    /// Whether shard `s`'s leader serves but fewer than f of its followers hear it (and at
    /// least one says it does not): it cannot commit, though it reaches the view manager.
    fn cut_off(&self, now: LocalTime, s: usize) -> bool {
        let timeout = duration_nanos(self.config.leader_timeout);
        if now.as_nanos().saturating_sub(self.view_since.as_nanos()) <= 2 * timeout {
            return false;
        }
        let leader = self.view.leaders[s];
        let fresh =
            |h: &&Heard| h.view == self.view.number && now.as_nanos().saturating_sub(h.at.as_nanos()) <= timeout;
        let reports: Vec<bool> = (0..self.topology.shards[s].len() as u32)
            .filter(|r| *r != leader)
            .filter_map(|r| self.heard.get(&(s as ShardId, r)))
            .filter(fresh)
            .filter_map(|h| h.leader_contact)
            .collect();
        let hearing = reports.iter().filter(|c| **c).count();
        hearing < self.topology.f() && reports.contains(&false)
    }

    /// Whether shard `s`'s leader in the current view has failed (module docs).
    fn leader_failed(&self, now: LocalTime, s: usize) -> bool {
        let leader = self.view.leaders[s];
        if !self.live(now, s as ShardId, leader) {
            return true;
        }
        let settling = now.as_nanos().saturating_sub(self.view_since.as_nanos());
        let stuck = self
            .heard
            .get(&(s as ShardId, leader))
            .is_some_and(|h| h.state != ServerState::Normal || h.view != self.view.number);
        stuck && settling > duration_nanos(self.config.view_change_timeout)
    }

    /// The leaders of the next view (module docs), or `None` if nothing better exists.
    fn choose_leaders(&self, now: LocalTime) -> Option<Vec<u32>> {
        let shards = self.topology.shard_count();
        // A current leader judged failed is not named again while its shard has another live
        // replica: one stuck in its view change (it reaches the view manager but not its
        // followers) would otherwise be named in every view, and none would ever start (a
        // review's schedule, `tests/vm_stuck_leader.rs`).
        let failed: Vec<bool> = (0..shards).map(|s| self.leader_failed(now, s)).collect();
        let eligible = |s: usize, r: u32| {
            self.live(now, s as ShardId, r)
                && !(failed[s]
                    && r == self.view.leaders[s]
                    && (0..self.topology.shards[s].len() as u32).any(|o| o != r && self.live(now, s as ShardId, o)))
        };
        let live_in = |s: usize, region: u32| -> Option<u32> {
            (0..self.topology.shards[s].len() as u32)
                .find(|r| self.regions[s][*r as usize] == region && eligible(s, *r))
        };
        let mut regions: Vec<u32> = self.regions.iter().flatten().copied().collect();
        regions.sort_unstable();
        regions.dedup();
        // Regions by how many current leaders they hold (most first), then by index.
        let leaders_in =
            |region: u32| (0..shards).filter(|s| self.regions[*s][self.view.leaders[*s] as usize] == region).count();
        regions.sort_by_key(|g| (std::cmp::Reverse(leaders_in(*g)), *g));
        for g in &regions {
            if let Some(leaders) = (0..shards).map(|s| live_in(s, *g)).collect::<Option<Vec<u32>>>() {
                return Some(leaders);
            }
        }
        let live_count = |g: u32| (0..shards).filter(|s| live_in(*s, g).is_some()).count();
        let best = regions.iter().copied().max_by_key(|g| (live_count(*g), std::cmp::Reverse(*g)))?;
        // Only when the current view got nowhere for a view-change timeout: before that, a
        // restarted leader may still hear of its view and lead it.
        let settled_in_vain =
            now.as_nanos().saturating_sub(self.view_since.as_nanos()) > duration_nanos(self.config.view_change_timeout);
        let mut leaders = Vec::with_capacity(shards);
        for (s, &leader_failed) in failed.iter().enumerate() {
            let current = self.view.leaders[s];
            let pick = if !leader_failed {
                Some(current)
            } else {
                let replicas = 0..self.topology.shards[s].len() as u32;
                live_in(s, best).or_else(|| replicas.clone().find(|r| eligible(s, *r))).or_else(|| {
                    replicas.clone().find(|r| settled_in_vain && self.restarted_may_lead(now, s as ShardId, *r))
                })
            };
            leaders.push(pick?);
        }
        Some(leaders)
    }

    fn preventive_for(&self, leaders: &[u32]) -> bool {
        match self.mode {
            ModeRule::Preventive => true,
            ModeRule::Detective => false,
            ModeRule::ByPlacement => {
                let mut regions = leaders.iter().enumerate().map(|(s, l)| self.regions[s][*l as usize]);
                let first = regions.next();
                regions.all(|g| Some(g) == first)
            }
        }
    }

    /// The ready Paxos leader judges the servers and proposes the next view if a leader failed.
    fn detect(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        let now = ctx.now();
        if !self.paxos.is_ready() {
            self.leading_since = None;
            return;
        }
        let since = *self.leading_since.get_or_insert(now);
        if now.as_nanos().saturating_sub(since.as_nanos()) < duration_nanos(self.config.leader_timeout) {
            return;
        }
        let next = self.view.number + 1;
        if self.proposed == Some(next) || !(0..self.topology.shard_count()).any(|s| self.leader_failed(now, s)) {
            return;
        }
        let Some(leaders) = self.choose_leaders(now) else { return };
        let view = View { number: next, preventive: self.preventive_for(&leaders), leaders };
        if self.paxos.propose(ctx, view).is_ok() {
            self.proposed = Some(next);
            self.stats.views_proposed += 1;
            ctx.metric("tiga.views_proposed", 1);
        }
    }

    fn on_heartbeat(&mut self, ctx: &mut Ctx<'_, TigaMsg>, from: NodeId, heard: Heard) {
        let Some((shard, replica)) = self.topology.locate(from) else {
            self.stats.bad_heartbeats += 1;
            return;
        };
        let view = heard.view;
        self.heard.insert((shard, replica), heard);
        if view < self.view.number {
            ctx.send(from, TigaMsg::NewView { view: self.view.clone() });
        }
    }
}

impl Process for ViewManager {
    type Msg = TigaMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        self.view_since = ctx.now();
        self.paxos.start(ctx);
        ctx.set_timer(ViewManagerTimer::Tick, self.config.heartbeat_interval);
        self.apply_decided(ctx);
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, TigaMsg>, from: NodeId, msg: TigaMsg) {
        match msg {
            TigaMsg::Paxos(m) => self.paxos.on_message(ctx, from, m),
            TigaMsg::Heartbeat { view, state, leader_contact, may_lead } => {
                self.on_heartbeat(ctx, from, Heard { at: ctx.now(), view, state, leader_contact, may_lead })
            }
            TigaMsg::ViewProbe { nonce } if self.topology.locate(from).is_some() => {
                // Accepted entries count too: a server may serve in a view this node accepted
                // and has not yet learned was chosen.
                let accepted = (0..self.paxos.log_len()).filter_map(|s| self.paxos.entry(s)).map(|v| v.number);
                let view = accepted.max().unwrap_or(0).max(self.view.number);
                ctx.send(from, TigaMsg::ViewFloor { nonce, view });
            }
            _ => ctx.metric("tiga.view_manager_ignored", 1),
        }
        self.apply_decided(ctx);
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, TigaMsg>, timer: TimerId) {
        if self.paxos.on_timer(ctx, timer) {
            self.apply_decided(ctx);
            return;
        }
        if ViewManagerTimer::from_id(timer) == Some(ViewManagerTimer::Tick) {
            self.detect(ctx);
            self.apply_decided(ctx);
            ctx.set_timer(ViewManagerTimer::Tick, self.config.heartbeat_interval);
        }
    }

    fn on_recover(&mut self, stored: &Stored) {
        self.paxos.recover(stored);
    }

    fn invariants(&self) -> Result<(), String> {
        self.paxos.invariants()
    }
}

impl From<PaxosMsg<View>> for TigaMsg {
    fn from(m: PaxosMsg<View>) -> Self {
        TigaMsg::Paxos(m)
    }
}
