//! A world check for the causal replica set (Raft's safety, seen from outside):
//! - **committed entries agree**: an entry at or below a member's commit point is the entry every
//!   other member has at that position at or below its own commit point;
//! - **committed entries are on a majority**: every entry any member has seen committed is held,
//!   at the same position, by a majority of the members (a commit point never passes what a
//!   majority applied, and no rollback removes a committed entry from a majority).
//!
//! A crashed member counts with what it held when it crashed: a member journals every change
//! before anything it sends leaves, so what it held in memory after its last handler is on its
//! disk. The check keeps a mirror of each member's oplog (each entry's optime and term) for
//! that, updated after every event the check runs on. A member that restarts without its disk
//! is seen again with what it recovered; while it is amnesiac (it grants no vote until a
//! primary elected without it has brought it up to date: `kairos_causal::member` docs) it
//! counts as holding every committed entry, as the register's recovering replica does: the
//! entries it forgot are safe as long as it cannot help elect a primary without them, which is
//! what the first half of the check then watches.
//!
//! The check is incremental: appended entries are compared once; a mirror is compared again
//! from where it diverges only when the oplog shrank or changed (a rollback or a lost disk).

use kairos_causal::msg::{CausalMsg, Entry};
use kairos_causal::Member;
use kairos_clock::ClusterTime;
use kairos_core::NodeId;
use kairos_sim::{Sim, WorldCheck};
use std::cell::RefCell;

/// An entry's identity in the mirrors.
fn id(e: &Entry) -> (ClusterTime, u64) {
    (e.optime, e.term)
}

/// What the check knows of one member.
#[derive(Clone, Default)]
struct Mirror {
    /// The member's oplog as last seen, by entry identity.
    oplog: Vec<(ClusterTime, u64)>,
    /// The prefix of its committed part already compared with `Seen::committed`.
    compared: usize,
    /// The prefix equal to `Seen::committed` (what it holds of the committed entries).
    held: usize,
    /// Restarted without its disk and not voting yet (as last seen).
    amnesiac: bool,
}

impl Mirror {
    /// Brings the mirror up to `oplog`, and the marks back to where they first differed.
    fn sync(&mut self, oplog: &[Entry]) {
        let fast =
            self.oplog.len() <= oplog.len() && self.oplog.last().is_none_or(|l| *l == id(&oplog[self.oplog.len() - 1]));
        let keep = if fast {
            self.oplog.len()
        } else {
            self.oplog.iter().zip(oplog).take_while(|(m, e)| **m == id(e)).count()
        };
        self.oplog.truncate(keep);
        self.oplog.extend(oplog[keep..].iter().map(id));
        self.compared = self.compared.min(keep);
        self.held = self.held.min(keep);
    }
}

struct Seen {
    /// The committed entries, in oplog order (the longest committed prefix any member showed).
    committed: Vec<Entry>,
    mirrors: Vec<Mirror>,
}

/// See the module docs. `majority` is the set's majority (members / 2 + 1). Run it after every
/// event, so that the mirrors hold what a crashing member held.
pub fn committed_entries_agree(members: Vec<NodeId>, majority: usize) -> WorldCheck<CausalMsg> {
    let seen = RefCell::new(Seen { committed: Vec::new(), mirrors: vec![Mirror::default(); members.len()] });
    Box::new(move |sim: &Sim<CausalMsg>| {
        let mut seen = seen.borrow_mut();
        let Seen { committed, mirrors } = &mut *seen;
        for (i, &node) in members.iter().enumerate() {
            let Some(member) = sim.role::<Member>(node) else { continue };
            let oplog = member.oplog();
            let m = &mut mirrors[i];
            m.sync(oplog);
            m.amnesiac = member.is_amnesiac();
            let commit_point = member.commit_point();
            let upto = oplog.partition_point(|e| e.optime <= commit_point);
            for (pos, entry) in oplog.iter().enumerate().take(upto).skip(m.compared) {
                match committed.get(pos) {
                    Some(c) if c != entry => {
                        return Err(format!(
                            "member {i} ({node}) has {entry:?} committed at oplog position {pos}, where another \
                             member committed {c:?}"
                        ))
                    }
                    Some(_) => {}
                    None => committed.push(entry.clone()),
                }
            }
            m.compared = m.compared.max(upto);
        }
        // What each member holds of the committed entries (a crashed one: what it held).
        for m in mirrors.iter_mut() {
            while m.held < m.oplog.len() && m.held < committed.len() && m.oplog[m.held] == id(&committed[m.held]) {
                m.held += 1;
            }
        }
        let holders = mirrors.iter().filter(|m| m.amnesiac || m.held >= committed.len()).count();
        if holders < majority {
            let pos = committed.len() - 1;
            let held: Vec<usize> = mirrors.iter().map(|m| m.held).collect();
            return Err(format!(
                "the committed entry at oplog position {pos} ({:?}) is held by {holders} members, fewer than a \
                 majority of {majority} (committed entries each member holds: {held:?})",
                committed[pos]
            ));
        }
        Ok(())
    })
}
