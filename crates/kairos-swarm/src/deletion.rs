//! A deletion is read only once it is on a majority.
//!
//! A delete writes the maximal tuple ([`meta::DELETED_TS`]) into its writer's word, like any
//! write, and completes once a majority holds it. Until then it may sit on fewer nodes — its
//! chains stalled, or its client crashed — and a read that meets it there must not report it
//! as it stands: a later read from a majority without it would bring the key back
//! (`Err(Deleted)`, then the old value). So an operation that meets a deletion reports
//! [`KvError::Deleted`] only after the deletion is on a majority: where a node's words lack
//! it, it CASes the deleter's word from the word last read to the deletion, and reads the words
//! back (`confirm`), as an ABD read writes back what it returns. A deletion is final and the
//! highest tuple there is, so writing it back can only repeat what its deleter would have
//! done. Once it is on a majority every majority read meets it: no read returns a value again.

use crate::client::{KvError, Outbox};
use crate::engine::{words_by_node, Client, NodeMap, Op, Shape, Stage};
use crate::meta;
use crate::verbs::Verb;
use kairos_core::LocalTime;

/// The deletion among these words, if any (the highest deleted word).
pub(crate) fn find(words: &NodeMap<Vec<u64>>) -> Option<u64> {
    words.values().flatten().copied().filter(|w| meta::is_deleted(*w)).max()
}

/// How many of these nodes' words hold a deletion.
fn nodes_holding(words: &NodeMap<Vec<u64>>) -> usize {
    words.values().filter(|ws| ws.iter().any(|w| meta::is_deleted(*w))).count()
}

/// Reports [`KvError::Deleted`] for `op` once `deletion` is on a majority: at once if the
/// words just read (`observed`) already show it on a majority, else after writing it back.
pub(crate) fn confirm(
    c: &mut Client,
    op: &mut Op,
    deletion: u64,
    observed: NodeMap<Vec<u64>>,
    now: LocalTime,
    out: &mut Outbox,
) {
    if nodes_holding(&observed) >= c.majority() {
        return c.finish(op, Err(KvError::Deleted), now, out);
    }
    c.bump("deletion_write_backs");
    let slot = op.slot.unwrap_or(0);
    let l = &c.cfg.layout;
    let dw = meta::writer(deletion);
    let mut chains = Vec::new();
    for node in c.alive_replicas(slot) {
        let mut verbs = Vec::new();
        let mut shape = Shape::default();
        // A node not read yet is read first; the next round writes it back if it needs it.
        if let Some(&o) = observed.get(&node).and_then(|ws| ws.get(dw as usize)) {
            if !meta::is_deleted(o) {
                shape.cas_other = Some((verbs.len(), o));
                verbs.push(Verb::Cas { addr: l.meta_word(slot, dw), expected: o, new: deletion });
            }
        }
        shape.words = Some(verbs.len());
        verbs.push(Verb::Read { addr: l.meta_words(slot), len: l.meta_words_bytes() });
        chains.push((node, verbs, shape));
    }
    op.target = deletion;
    let need = c.majority();
    c.send_round(op, Stage::DeleteBack, chains, need, now, out);
}

/// A write-back round of [`confirm`] answered: done if the deletion is now on a majority,
/// else again with the words it read.
pub(crate) fn after_confirm(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let deletion = op.target;
    confirm(c, op, deletion, words_by_node(op), now, out)
}
