//! # kairos-register — a linearizable replicated register (multi-writer ABD)
//!
//! The small real protocol that proves Kairos's seam: its roles run unchanged in the
//! simulator and as processes over TCP, and every run's history is checked linearizable.
//!
//! - [`Replica`] keeps, per key, the value with the highest tag `(ts, writer)`.
//! - [`Client`] runs a closed loop of reads and writes on random keys. Both take two round
//!   trips to a majority: a write queries the highest tag, then stores its value under
//!   `(max.ts + 1, me)`; a read queries, then writes back what it returns (so a later read
//!   cannot return an older value). Lost messages are retransmitted; an operation that does not
//!   complete in time is recorded as `info` (it may or may not have taken effect).
//!
//! **Crash, disk and amnesia.** A replica persists every newer value before it acknowledges it
//! ([`kairos_core::Ctx::persist`]; a snapshot of its store every 4,096 records), so a replica
//! that crashes and restarts with its disk recovers it and serves at once. A replica without
//! a disk — a fresh one, or one whose disk was lost — starts in *recovery*: it answers nothing
//! but recovery requests until it has adopted the state of a majority of the *other*
//! replicas (each state in pages of [`RECOVERY_KEYS_MAX`] keys), and persists what it adopted only then, as one snapshot (a crash in the middle of
//! a recovery leaves the disk empty, so the restart recovers again instead of serving part of
//! a state). Any completed write was acked by a majority; the replica that forgot it is one of
//! them, so the rest of that majority meets every majority of the others. This is safe while
//! at most one replica is amnesiac at a time; at the very first start every replica recovers
//! from the (empty) states of the others.
//!
//! **Lives.** That argument needs the write to have completed *before* the forgetful replica
//! asked the others for their state. A write still in flight can count an acknowledgement the
//! replica gave in its previous life, then reach another replica only after that one answered
//! the recovery: it completes with a majority of acknowledgements of which one is forgotten
//! (campaign seeds 29551 and 48604: the write was then held by one replica of three). So a
//! replica's recovery starts a new *life* ([`Life`], kept on its disk), every acknowledgement
//! of a store names the life that gave it, and a replica that answers another's recovery
//! records that replica's new life (durably, before it answers) and reports it with its own
//! acknowledgements. A client counts only acknowledgements that agree on each other's lives:
//! two that disagree (whichever arrived first) are both dropped, and both replicas asked
//! again. Take such a write and the replica `a` that acknowledged it before forgetting: the
//! rest of its majority and `a`'s recovery majority share a replica `b`; if `b` acknowledged
//! before it answered `a`, its answer carried the write; if after, its acknowledgement reports
//! `a`'s new life and the client no longer counts `a`'s old one.
//!
//! That last step needs `b` never to go back to an ended life of `a`, whatever arrives late:
//! lives are ordered, and a replica records a life only if it is newer than the one it holds.
//! (With unordered random lives, a delayed request of `a`'s earlier recovery reached a replica
//! after `a`'s next one and made it report the ended life again: a write completed with two
//! holders of five, a review's schedule.) A recovery is numbered in a first round: each peer
//! tells the newest life of `a` it knows of, and once a majority has answered, `a` numbers
//! its life one epoch above the highest (every earlier recovery that completed told a majority
//! of the peers, and two majorities of them meet), then asks for the state in a second round.
//! A peer that knows a life numbered alike — of an earlier recovery that did not complete —
//! refuses the new one, and `a` numbers itself above it and asks again. A recovering replica
//! also takes the other replicas' lives from the states it adopts, so that a replica that lost
//! its disk still refuses their ended lives.
//!
//! Liveness needs the replicas to agree in the end: a recovered replica keeps telling the
//! peers that have not answered its recovery its life (without asking for their state), and a
//! replica restarted with its disk tells every peer again the same way, so that a peer that
//! missed the recovery stops reporting the ended life.

mod client;
mod replica;

pub use client::{Client, ClientConfig, ROUND_TRIP_METRICS};
pub use replica::{Replica, RECOVERY_KEYS_MAX};

use serde::{Deserialize, Serialize};

/// Version of a value: ordered by timestamp, ties broken by writer.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Tag {
    pub ts: u64,
    pub writer: u32,
}

/// A key's state on a replica.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Versioned {
    pub tag: Tag,
    /// `None`: never written.
    pub value: Option<u64>,
}

/// Every message of the protocol. `op` and `phase` let a client ignore stale replies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RegisterMsg {
    Query {
        op: u64,
        key: u64,
    },
    QueryAck {
        op: u64,
        key: u64,
        state: Versioned,
    },
    Store {
        op: u64,
        key: u64,
        state: Versioned,
    },
    /// `life`: the acknowledging replica's life (see the crate docs); `lives`: the life of
    /// each other replica as this one last learned it (when it answered that replica's
    /// recovery), so that the client drops an acknowledgement of a life that has ended.
    StoreAck {
        op: u64,
        key: u64,
        life: Life,
        lives: Vec<(kairos_core::NodeId, Life)>,
    },
    /// A recovery's first round: the newest life of the asker that the peer knows of, so that
    /// the new life is numbered above every earlier one. `nonce` is drawn per recovery and
    /// echoed.
    LifeQuery {
        nonce: u64,
    },
    LifeReply {
        nonce: u64,
        known: Life,
    },
    /// A recovery's second round (`want_state`), or the announcement of a recovered replica's
    /// life to a peer that missed it (after a restart with the disk, say): the peer records
    /// `life` unless it knows a newer one, and answers with its whole state if asked.
    /// The state travels in pages of at most [`RECOVERY_KEYS_MAX`] keys: `after` asks for the
    /// keys above it.
    RecoverRequest {
        life: Life,
        want_state: bool,
        after: Option<u64>,
    },
    /// `known`: the asker's life as the peer now records it (newer than `life` when the peer
    /// refused it); `entries` and `lives` (a page of the peer's store, and its record of every
    /// replica's life) only when the state was asked for; `more`: the store goes on past the
    /// page's last key.
    RecoverReply {
        life: Life,
        known: Life,
        entries: Vec<(u64, Versioned)>,
        lives: Vec<(kairos_core::NodeId, Life)>,
        more: bool,
    },
}

/// A replica's life: what the recovery that gave it its state was numbered (crate docs,
/// "Lives"). Ordered by `epoch`, then by `nonce` (random, drawn per recovery).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Life {
    pub epoch: u64,
    pub nonce: u64,
}

/// Majority of `n` replicas.
pub fn majority(n: usize) -> usize {
    n / 2 + 1
}
