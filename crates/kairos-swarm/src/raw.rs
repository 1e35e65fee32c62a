//! RAW: the lower bound — one copy per key on one node (the key's first replica), no
//! replication, no concurrency control. get reads the in-place copy (retrying a torn one), update
//! writes it; 1 round trip each.

use crate::client::{KvError, KvOp, Outbox};
use crate::engine::{Client, Op, Shape, Stage};
use crate::meta;
use crate::verbs::{Verb, VerbOutcome};
use kairos_core::LocalTime;

/// Reads of a torn copy before a get gives up with [`KvError::Corrupt`].
const TORN_READS_MAX: u32 = 16;

pub(crate) fn begin(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    let node = c.cfg.layout.replicas_of(slot)[0];
    let nodes = if c.members.is_alive(node) { vec![node] } else { vec![] };
    let l = c.cfg.layout.clone();
    let (stage, verbs) = match &op.op {
        KvOp::Get { .. } => (Stage::RawRead, vec![Verb::Read { addr: l.inplace(node, slot), len: l.copy_bytes_max() }]),
        KvOp::Update { value, .. } | KvOp::Insert { value, .. } => {
            let ts = match c.guess_ts(now) {
                Ok(ts) => ts,
                Err(e) => return c.finish(op, Err(e), now, out),
            };
            let copy = meta::encode_copy(meta::pack(ts, 0, c.cfg.writer, true), value);
            (Stage::RawWrite, vec![Verb::Write { addr: l.inplace(node, slot), data: copy }])
        }
        KvOp::Delete { .. } => {
            let copy = meta::encode_copy(meta::pack(meta::DELETED_TS, 0, c.cfg.writer, true), &[]);
            (Stage::RawWrite, vec![Verb::Write { addr: l.inplace(node, slot), data: copy }])
        }
    };
    let chains =
        nodes.into_iter().map(|n| (n, verbs.clone(), Shape { inplace: Some(0), ..Shape::default() })).collect();
    c.send_round(op, stage, chains, 1, now, out);
}

pub(crate) fn advance(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    match op.stage {
        Stage::RawWrite => c.finish(op, Ok(None), now, out),
        Stage::RawRead => {
            let bytes = match op.replies.values().next().and_then(|o| o.first()) {
                Some(VerbOutcome::Read(b)) => b.clone(),
                _ => Vec::new(),
            };
            if bytes.iter().all(|b| *b == 0) {
                return c.finish(op, Ok(None), now, out);
            }
            match meta::decode_copy(&bytes, c.cfg.layout.config.value_size as usize) {
                Some((t, _)) if meta::is_deleted(t) => c.finish(op, Err(KvError::Deleted), now, out),
                Some((_, v)) => c.finish(op, Ok(Some(v)), now, out),
                // A copy torn by a write in flight heals when the write lands; one that stays
                // torn was interleaved by two writers (RAW has no concurrency control).
                None if op.rtt >= TORN_READS_MAX => {
                    c.bump("corrupt_copies");
                    c.finish(op, Err(KvError::Corrupt), now, out)
                }
                None => {
                    c.bump("torn_retries");
                    begin(c, op, now, out)
                }
            }
        }
        _ => {}
    }
}
