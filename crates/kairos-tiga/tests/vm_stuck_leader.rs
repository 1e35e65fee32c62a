//! A review's schedule: the view manager judged a new leader "stuck" (it had not finished its
//! view change within `view_change_timeout`) and proposed the next view, but named the very
//! same leader again (it heartbeats, is not recovering, and sits in the region of most current
//! leaders), forever. With a non-transitive partition — shard 0's new leader reaches the view
//! managers but not its two followers, which reach the view managers too — no view change
//! could ever finish, although the two followers (f + 1 voters, live and heard) could run one.
//! (`cut_off` covers this partition only for a leader that already serves: during a view
//! change the followers report no `leader_contact`.)

use kairos_core::harness::{sent, RoleHarness};
use kairos_core::{Effect, NodeId};
use kairos_tiga::msg::TigaMsg;
use kairos_tiga::topology::{TigaConfig, Topology};
use kairos_tiga::view::{ModeRule, ServerState, View, ViewManager};
use std::collections::BTreeMap;
use std::time::Duration;

const VMS: [NodeId; 3] = [NodeId(100), NodeId(101), NodeId(102)];

/// Shard 0 on nodes 0–2, shard 1 on nodes 3–5; replica r of every shard in region r; replica
/// 0 leads both in view 0.
fn topology() -> Topology {
    Topology {
        shards: vec![vec![NodeId(0), NodeId(1), NodeId(2)], vec![NodeId(3), NodeId(4), NodeId(5)]],
        leader: vec![0, 0],
    }
}

fn vm(i: u32) -> ViewManager {
    let t = topology();
    let regions = vec![vec![0, 1, 2], vec![0, 1, 2]];
    let initial = View::initial(&t, false);
    ViewManager::new(t, regions, TigaConfig::default(), ModeRule::ByPlacement, initial, VMS.to_vec(), i)
}

/// A server's heartbeat in a view: its state and leader contact (None: it is down).
type Beat<'a> = &'a dyn Fn(usize, &View) -> Option<(ServerState, Option<bool>)>;

struct Net {
    vms: Vec<RoleHarness<ViewManager>>,
    pool: Vec<(NodeId, NodeId, TigaMsg)>,
    announced: BTreeMap<u64, View>,
}

impl Net {
    fn absorb(&mut self, i: usize, effects: Vec<Effect<TigaMsg>>) {
        for (to, msg) in sent(&effects) {
            match msg {
                TigaMsg::NewView { view } => {
                    let old = self.announced.insert(view.number, view.clone());
                    assert!(old.is_none_or(|o| o == *view), "one view per number");
                }
                TigaMsg::Paxos(_) => self.pool.push((VMS[i], to, msg.clone())),
                _ => {}
            }
        }
    }

    fn current(&self) -> View {
        self.announced.values().next_back().cloned().unwrap_or_else(|| View::initial(&topology(), false))
    }

    /// 50 ms pass: timers fire, every Paxos message is delivered, and every server heartbeats
    /// with `beat(server, current view)` (None: it is down).
    fn tick(&mut self, beat: Beat<'_>) {
        for i in 0..3 {
            let eff = self.vms[i].advance(Duration::from_millis(50));
            self.absorb(i, eff);
        }
        while !self.pool.is_empty() {
            let (from, to, msg) = self.pool.remove(0);
            let i = VMS.iter().position(|n| *n == to).unwrap();
            let eff = self.vms[i].deliver(from, msg);
            self.absorb(i, eff);
        }
        let view = self.current();
        for s in 0..6 {
            let Some((state, leader_contact)) = beat(s, &view) else { continue };
            for i in 0..3 {
                let msg = TigaMsg::Heartbeat { view: view.number, state, leader_contact, may_lead: true };
                let eff = self.vms[i].deliver(NodeId(s as u32), msg);
                self.absorb(i, eff);
            }
        }
    }
}

#[test]
fn a_leader_stuck_in_its_view_change_is_replaced_by_a_live_replica() {
    let mut net = Net { vms: Vec::new(), pool: Vec::new(), announced: BTreeMap::new() };
    for (i, node) in VMS.into_iter().enumerate() {
        net.vms.push(RoleHarness::new(node, vm(i as u32), 11 + i as u64));
        let eff = net.vms[i].start();
        net.absorb(i, eff);
    }
    for _ in 0..40 {
        net.tick(&|_, _| Some((ServerState::Normal, None))); // 2 s of a healthy view 0
    }
    assert_eq!(net.current().number, 0);
    // Node 3 (shard 1's leader, region 0) crashes: both leaders move to a region that has a
    // live replica of every shard.
    for _ in 0..40 {
        let state = |v: &View| if v.number == 0 { ServerState::Normal } else { ServerState::ViewChange };
        net.tick(&|s, v| (s != 3).then_some((state(v), None)));
        if net.current().number >= 1 {
            break;
        }
    }
    let v1 = net.current();
    assert_eq!(v1.number, 1, "view 1 decided");
    let stuck = v1.leaders[0];
    // From now on shard 0's new leader reaches the view managers but not its followers: it
    // waits in its view change, and everyone else waits for it. 30 s pass.
    let mut started = None;
    for _ in 0..600 {
        let view = net.current();
        if view.number > 1 && view.leaders[0] != stuck && started.is_none() {
            started = Some(view.clone());
        }
        net.tick(&|s, _| (s != 3).then_some((ServerState::ViewChange, None)));
    }
    let moved = started.expect("a view past view 1 names another of shard 0's live replicas");
    assert!(moved.leaders[0] != stuck && moved.leaders[1] != 0, "{moved:?}: live, reachable leaders");
}
