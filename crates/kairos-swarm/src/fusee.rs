//! FUSEE (Shen et al., FAST 2023): client-centric replication over disaggregated memory — the
//! SWARM paper's third peer, on the same layout, verbs and backends as SWARM-KV.
//!
//! A key has one **index slot** per replica (here: metadata word 0 of the key's slot), holding
//! the tuple word of its current KV block; KV blocks are out-of-place buffers, as in SWARM-KV.
//! The first replica's slot is the **primary**: its value is the key's value, and a write is
//! linearized when the primary changes. Writers agree on one winner with FUSEE's SNAPSHOT
//! protocol, which needs no locks:
//!
//! * update, round 1: write the new KV block on every replica and read the primary slot
//!   (`v_old`); round 2: `CAS(v_old → v_new)` on every backup slot. The backups now hold one
//!   value each, and every writer that raced from `v_old` learns all of them (its own where its
//!   CAS succeeded, the returned one elsewhere), so all decide alike:
//!   - rule 1: a writer holding every backup wins;
//!   - rule 2: else the value holding a majority of the backups wins;
//!   - rule 3: else the lowest value in the backups wins.
//!
//!   When rule 1 does not apply, a writer first reads the primary again: if it has left
//!   `v_old` the race is over and the write lost; otherwise every value it saw belongs to this
//!   race (see `after_recheck`). The winner sets the backups that hold another value to its
//!   own, then `CAS(v_old → v_new)` on the primary: its write is linearized there. A loser's
//!   write is linearized just before the winner's (overwritten at once, never visible): it
//!   reads the primary until it left `v_old`, then returns. A deletion cannot be overwritten
//!   (it is final), so a delete that lost starts over from the primary's new value. A writer whose `v_old` is stale
//!   finds every backup at a later value, loses to it, and returns at once (that write was
//!   concurrent with it: its primary was still `v_old` after it began).
//! * get: read the primary slot and, when this client saw the key before, the KV block it
//!   pointed to, in one chain: a hit (the slot still names that block) takes one round trip,
//!   as FUSEE's adaptive index cache does; otherwise a second round reads the named block
//!   (a block recycled in between fails its hash check, and the get starts over).
//!
//! Tuple words are unique (a per-writer sequence number in the timestamp field), so a slot
//! never returns to an old value and rule 3's order is total.
//!
//! **Simplifications**, each with its reason:
//! - No embedded operation log and no log-based recovery. FUSEE recovers crashed clients from
//!   their logs and reconfigures after a memory-node crash through a master, neither of which
//!   is part of the normal path the benchmark measures. Instead, a loser that waited a chain
//!   timeout for its winner finishes the winner's write itself (`help`: a winner stalled,
//!   crashed or past its deadline would otherwise leave the key unwritable for good). A
//!   crashed memory node stops writes (FUSEE runs are excluded from the crash campaigns), and
//!   a slow chain is waited for (until the operation's deadline) rather than taken for a
//!   crashed node.
//! - RACE hashing is replaced by the shared directory every protocol here uses.
//! - KV blocks are replicated on every replica of the key and hold the value only (FUSEE's
//!   also hold the key: about 32 bytes more per replica, which this FUSEE does not store).
//! - Without the log writes, an update takes 3 round trips in the common case (5 when it raced
//!   another writer and won), where the paper reports 4–5.

use crate::client::{KvError, KvOp, Outbox};
use crate::engine::{Client, Op, Shape, Stage, UnsafeSwitch};
use crate::meta;
use crate::verbs::{MemNodeId, Verb, VerbOutcome};
use kairos_core::LocalTime;

/// The index slot of `slot` on a node: metadata word 0.
fn index_slot(c: &Client, slot: u64) -> u64 {
    c.cfg.layout.meta_word(slot, 0)
}

fn primary(c: &Client, slot: u64) -> MemNodeId {
    c.cfg.layout.replicas_of(slot)[0]
}

/// Sends a round to the given nodes of `slot`, all of which must answer (FUSEE writes every
/// replica and needs every backup's value).
fn round(
    c: &mut Client,
    op: &mut Op,
    stage: Stage,
    chains: Vec<(MemNodeId, Vec<Verb>, Shape)>,
    now: LocalTime,
    out: &mut Outbox,
) {
    let need = chains.len();
    let wanted: Vec<MemNodeId> = chains.iter().map(|(n, _, _)| *n).collect();
    if wanted.iter().any(|n| !c.members.is_alive(*n)) {
        let alive = wanted.iter().filter(|n| c.members.is_alive(**n)).count();
        return c.finish(op, Err(KvError::Unavailable { alive, needed: need }), now, out);
    }
    c.send_round(op, stage, chains, need, now, out);
}

pub(crate) fn begin(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    let l = c.cfg.layout.clone();
    let p = primary(c, slot);
    let slot_read = Verb::Read { addr: index_slot(c, slot), len: 8 };
    match &op.op {
        KvOp::Get { .. } => {
            let mut verbs = vec![slot_read];
            let mut shape = Shape { words: Some(0), ..Shape::default() };
            if let Some(&seen) = c.fusee_seen.get(&slot) {
                if seen != 0 && !meta::is_deleted(seen) {
                    verbs.push(Verb::Read {
                        addr: l.buffer_copy(meta::writer(seen), meta::buf(seen)),
                        len: l.copy_bytes_max(),
                    });
                    shape.copy = Some(1);
                }
            }
            round(c, op, Stage::FuseeRead, vec![(p, verbs, shape)], now, out);
        }
        KvOp::Update { value, .. } | KvOp::Insert { value, .. } => {
            let Some(buf) = op.buf.or_else(|| c.pool.allocate(now)) else {
                return c.finish(op, Err(KvError::OutOfBuffers), now, out);
            };
            op.buf = Some(buf);
            c.last_ts += 1;
            op.tuple = meta::pack(c.last_ts, buf, c.cfg.writer, true);
            op.value = Some(value.clone());
            let mut block = meta::lock(op.tuple, meta::LOCK_FREE).to_le_bytes().to_vec();
            block.extend_from_slice(&meta::encode_copy(op.tuple, value));
            let chains = l
                .replicas_of(slot)
                .into_iter()
                .map(|node| {
                    let mut verbs = vec![Verb::Write { addr: l.buffer(c.cfg.writer, buf), data: block.clone() }];
                    let mut shape = Shape::default();
                    if node == p {
                        shape.words = Some(1);
                        verbs.push(slot_read.clone());
                    }
                    (node, verbs, shape)
                })
                .collect();
            round(c, op, Stage::FuseeWrite, chains, now, out);
        }
        KvOp::Delete { .. } => {
            c.last_ts += 1;
            op.tuple = meta::pack(meta::DELETED_TS, 0, c.cfg.writer, true);
            op.value = None;
            round(
                c,
                op,
                Stage::FuseeWrite,
                vec![(p, vec![slot_read], Shape { words: Some(0), ..Shape::default() })],
                now,
                out,
            );
        }
    }
}

/// The primary slot's value, read by the verb at `shape.words` of the primary's chain.
fn primary_word(c: &Client, op: &Op) -> Option<u64> {
    let p = primary(c, op.slot.unwrap_or(0));
    match op.replies.get(&p)?.get(op.shapes.get(&p)?.words?)? {
        VerbOutcome::Read(b) => meta::first_word(b),
        _ => None,
    }
}

/// The value of the KV block read by the chain's `shape.copy` verb, if it is `word`'s.
fn block_value(c: &Client, op: &Op, word: u64) -> Option<Vec<u8>> {
    let p = primary(c, op.slot.unwrap_or(0));
    match op.replies.get(&p)?.get(op.shapes.get(&p)?.copy?)? {
        VerbOutcome::Read(b) => meta::decode_copy(b, c.cfg.layout.config.value_size as usize)
            .filter(|(t, _)| meta::id(*t) == meta::id(word))
            .map(|(_, v)| v),
        _ => None,
    }
}

fn after_read(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    let Some(v) = primary_word(c, op).or(if op.stage == Stage::FuseeFetch { Some(op.target) } else { None }) else {
        return begin(c, op, now, out);
    };
    c.fusee_seen.insert(slot, v);
    if v == 0 {
        return c.finish(op, Ok(None), now, out);
    }
    if meta::is_deleted(v) {
        return c.finish(op, Err(KvError::Deleted), now, out);
    }
    if let Some(value) = block_value(c, op, v) {
        return c.finish(op, Ok(Some(value)), now, out);
    }
    if op.stage == Stage::FuseeFetch {
        // The block was recycled after a newer write replaced it: start over.
        c.bump("fetch_misses");
        return begin(c, op, now, out);
    }
    let l = &c.cfg.layout;
    let verbs = vec![Verb::Read { addr: l.buffer_copy(meta::writer(v), meta::buf(v)), len: l.copy_bytes_max() }];
    op.target = v;
    let p = primary(c, slot);
    round(c, op, Stage::FuseeFetch, vec![(p, verbs, Shape { copy: Some(0), ..Shape::default() })], now, out);
}

/// Round 2: CAS every backup slot from the primary's value to this write's.
fn after_write(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    let Some(old) = primary_word(c, op) else { return c.finish(op, Err(KvError::Timeout), now, out) };
    if meta::is_deleted(old) {
        return c.finish(op, Err(KvError::Deleted), now, out);
    }
    op.prev_max = old;
    let addr = index_slot(c, slot);
    let backups: Vec<MemNodeId> = c.cfg.layout.replicas_of(slot).into_iter().skip(1).collect();
    if backups.is_empty() {
        return primary_round(c, op, now, out);
    }
    let chains = backups
        .into_iter()
        .map(|n| (n, vec![Verb::Cas { addr, expected: old, new: op.tuple }], Shape::default()))
        .collect();
    round(c, op, Stage::FuseeBackups, chains, now, out);
}

/// Each backup's value after this writer's CAS: its own where the CAS succeeded.
fn backup_values(op: &Op) -> Vec<(MemNodeId, u64)> {
    op.replies
        .iter()
        .filter_map(|(n, outs)| match outs.first()? {
            VerbOutcome::Cas { previous } if *previous == op.prev_max => Some((*n, op.tuple)),
            VerbOutcome::Cas { previous } => Some((*n, *previous)),
            _ => None,
        })
        .collect()
}

/// SNAPSHOT's rules over the backups' values (every racing writer sees the same ones).
pub(crate) fn snapshot_winner(values: &[u64]) -> Option<u64> {
    let majority = values.len() / 2 + 1;
    values
        .iter()
        .copied()
        .find(|v| values.iter().filter(|w| *w == v).count() >= majority)
        .or_else(|| values.iter().copied().min())
}

fn after_backups(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let values = backup_values(op);
    if values.iter().all(|(_, v)| *v == op.tuple) {
        return primary_round(c, op, now, out); // rule 1
    }
    // Rules 2 and 3 hold only over one race's values: read the primary again first.
    op.observed = values.iter().map(|(n, v)| (*n, vec![*v])).collect();
    c.bump("fusee_rechecks");
    let p = primary(c, op.slot.unwrap_or(0));
    let verbs = vec![Verb::Read { addr: index_slot(c, op.slot.unwrap_or(0)), len: 8 }];
    round(c, op, Stage::FuseeRecheck, vec![(p, verbs, Shape { words: Some(0), ..Shape::default() })], now, out);
}

/// The primary after this writer's backup CASes all answered. If it has left `v_old`, the race
/// is decided and this write lost. If not, every value the CASes saw was written while the
/// primary was `v_old`, so it is one of this race's (its first per backup, or the winner's
/// fix, which only adds to the winner's count and cannot undercut it): every racer decides
/// alike. Without this read, a CAS stalled through the whole race and the next one mixes a
/// later race's value with this one's, and a second "winner" overwrites a backup (campaign
/// seed 184).
fn after_recheck(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let deletes = matches!(op.op, KvOp::Delete { .. });
    if primary_word(c, op) != Some(op.prev_max) {
        c.bump("fusee_lost");
        if deletes {
            return delete_again(c, op, now, out);
        }
        return done_writing(c, op, now, out);
    }
    let values: Vec<(MemNodeId, u64)> = op.observed.iter().filter_map(|(n, v)| Some((*n, *v.first()?))).collect();
    let all: Vec<u64> = values.iter().map(|(_, v)| *v).collect();
    let winner = snapshot_winner(&all);
    if winner != Some(op.tuple) {
        c.bump("fusee_lost");
        op.target = winner.unwrap_or(0);
        if deletes {
            return delete_again(c, op, now, out);
        }
        if c.cfg.unsafe_switch == UnsafeSwitch::FuseeLoserReturnsAtOnce {
            return done_writing(c, op, now, out);
        }
        return wait_round(c, op, now, out);
    }
    let slot = op.slot.unwrap_or(0);
    let addr = index_slot(c, slot);
    let fix: Vec<(MemNodeId, Vec<Verb>, Shape)> = values
        .into_iter()
        .filter(|(_, v)| *v != op.tuple)
        .map(|(n, v)| (n, vec![Verb::Cas { addr, expected: v, new: op.tuple }], Shape::default()))
        .collect();
    if fix.is_empty() {
        return primary_round(c, op, now, out);
    }
    c.bump("fusee_backups_fixed");
    round(c, op, Stage::FuseeFix, fix, now, out);
}

fn primary_round(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    let verbs = vec![Verb::Cas { addr: index_slot(c, slot), expected: op.prev_max, new: op.tuple }];
    let p = primary(c, slot);
    round(c, op, Stage::FuseePrimary, vec![(p, verbs, Shape::default())], now, out);
}

/// A delete that lost its race starts over from the primary's new value. A lost update is
/// linearized just before the winner (overwritten at once), but a deletion is final: placed
/// before the winning update it would be undone by it (a review's schedule: a get after both
/// returned the update's value although the delete had reported success).
fn delete_again(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    c.bump("fusee_delete_retries");
    begin(c, op, now, out)
}

/// A loser reads the primary until the winner has changed it (after a chain timeout, it
/// finishes the winner's write itself: [`help`]).
fn wait_round(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    op.waiting_since.get_or_insert(now);
    let slot = op.slot.unwrap_or(0);
    let p = primary(c, slot);
    let verbs = vec![Verb::Read { addr: index_slot(c, slot), len: 8 }];
    round(c, op, Stage::FuseeWait, vec![(p, verbs, Shape { words: Some(0), ..Shape::default() })], now, out);
}

/// A loser whose winner has not changed the primary for a chain timeout (stalled, crashed, or
/// given up past its deadline; a review's schedule left a key unwritable for good that way)
/// finishes the winner's write as the winner would: every backup set to the winner's value,
/// then `CAS(v_old → winner)` on the primary. All racers decided on the same winner from the
/// same values (see `after_recheck`), its block was on the primary before its first CAS, and a
/// winner that resumes later finds its value in place and completes; so helping changes no
/// outcome, only when it happens. (FUSEE recovers such races from the winner's log; this FUSEE
/// keeps no log.)
fn help(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    c.bump("fusee_helped");
    let (winner, addr) = (op.target, index_slot(c, op.slot.unwrap_or(0)));
    let fix: Vec<(MemNodeId, Vec<Verb>, Shape)> = op
        .observed
        .iter()
        .filter_map(|(n, v)| v.first().filter(|v| **v != winner).map(|v| (*n, *v)))
        .map(|(n, v)| (n, vec![Verb::Cas { addr, expected: v, new: winner }], Shape::default()))
        .collect();
    if fix.is_empty() {
        return help_primary(c, op, now, out);
    }
    round(c, op, Stage::FuseeHelp, fix, now, out);
}

fn help_primary(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    let verbs = vec![Verb::Cas { addr: index_slot(c, slot), expected: op.prev_max, new: op.target }];
    round(c, op, Stage::FuseeHelpPrimary, vec![(primary(c, slot), verbs, Shape::default())], now, out);
}

fn done_writing(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    match op.buf.take() {
        Some(buf) => c.pool.commit(slot, buf, now),
        None => c.pool.delete(slot, now),
    }
    c.finish(op, Ok(None), now, out)
}

pub(crate) fn advance(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    match op.stage {
        Stage::FuseeRead | Stage::FuseeFetch => after_read(c, op, now, out),
        Stage::FuseeWrite => after_write(c, op, now, out),
        Stage::FuseeBackups => after_backups(c, op, now, out),
        Stage::FuseeRecheck => after_recheck(c, op, now, out),
        Stage::FuseeFix => primary_round(c, op, now, out),
        Stage::FuseePrimary => {
            let p = primary(c, op.slot.unwrap_or(0));
            match op.replies.get(&p).and_then(|o| o.first()) {
                // Its own CAS, or a loser's that finished this write for it (`help`).
                Some(VerbOutcome::Cas { previous }) if *previous == op.prev_max || *previous == op.tuple => {
                    c.fusee_seen.insert(op.slot.unwrap_or(0), op.tuple);
                    done_writing(c, op, now, out)
                }
                // Only the round's winner changes the primary from `v_old`, so this needs a
                // crashed or misbehaving client; the write's fate is then unknown.
                _ => {
                    c.bump("fusee_primary_moved");
                    c.finish(op, Err(KvError::Timeout), now, out)
                }
            }
        }
        Stage::FuseeWait => match primary_word(c, op) {
            Some(v) if v != op.prev_max => done_writing(c, op, now, out),
            _ if op.waiting_since.is_some_and(|t| now.saturating_since(t) >= c.cfg.chain_timeout) => {
                help(c, op, now, out)
            }
            _ => wait_round(c, op, now, out),
        },
        Stage::FuseeHelp => help_primary(c, op, now, out),
        // Installed, or the primary moved on otherwise: the race is over either way.
        Stage::FuseeHelpPrimary => done_writing(c, op, now, out),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::snapshot_winner;

    #[test]
    fn snapshot_rules_pick_one_winner_from_the_backups() {
        assert_eq!(snapshot_winner(&[7, 7]), Some(7), "rule 1: every backup");
        assert_eq!(snapshot_winner(&[7, 9, 7]), Some(7), "rule 2: a majority");
        assert_eq!(snapshot_winner(&[9, 7]), Some(7), "rule 3: the lowest");
        assert_eq!(snapshot_winner(&[9, 8, 7]), Some(7));
        assert_eq!(snapshot_winner(&[]), None);
    }
}
