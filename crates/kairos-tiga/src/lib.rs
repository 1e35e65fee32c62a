//! # kairos-tiga — Tiga (SOSP 2025)
//!
//! Strictly serializable one-shot transactions over sharded, geo-replicated data, committed in
//! one wide-area round trip in the common case by ordering them with **future timestamps** from
//! synchronized clocks. Roles, as sans-IO state machines:
//!
//! - [`coordinator::Coordinator`] (stateless): estimates one-way delays from samples piggybacked
//!   on replies, stamps a transaction `send time + headroom`, sends it to every replica of every
//!   involved shard, and commits on the **fast path** (same timestamp and log hash from a super
//!   quorum that includes the leader) or the **slow path** (the leader plus f followers whose
//!   logs are synchronized past it), once every involved leader reports the same timestamp.
//! - [`server::Server`], leader or follower of one shard: a priority queue released by the local
//!   clock, rMap / wMap conflict detection (leader bump, follower hold), a multi-version store
//!   with revocable execution, per-key XOR-of-SHA-1 log hashes, timestamp agreement among the
//!   involved leaders (three cases and the second round that prevents timestamp inversion), in
//!   **preventive** (agree, then execute) or **detective** (execute, then agree and revoke)
//!   mode, log synchronization with sync- and commit-points, execution of the committed state
//!   up to the commit-point on every replica, and checkpoints of it every
//!   `checkpoint_interval` positions (more when the state is large).
//! - [`ops`]: general one-shot transactions — byte-string keys and values, a key's shard is
//!   xxh3(key) mod shards, and a transaction is a list of per-key Redis-style operations (GET,
//!   SET, SETNX, DEL, EXISTS, INCRBY, APPEND, STRLEN) whose read and write sets are known up
//!   front; servers run each shard's piece as a stored procedure in timestamp order.
//! - [`tpcc`]: TPC-C — a transaction increments its conflict keys (decimal integers, placed by
//!   warehouse with [`TigaConfig::partitioner`]) and carries its pieces, which each shard runs
//!   on its warehouses in the same step; a leader's speculative run keeps undo records.
//! - MicroBench ([`kairos_workload::MicroBench`]): 3 distinct keys per transaction drawn from
//!   Zipf(skew) over 1,000,000 keys per shard; each transaction is a general one that increments
//!   its keys by 1 (a key's bytes are its decimal digits, so it lands on a shard by hash like any
//!   key).
//!
//! The paper's deployment in the simulator (3 shards × 3 replicas in sc / fi / br,
//! 2 coordinators in each of sc / fi / br / hk, co-located or separated leaders) and its runs
//! are in `kairos_harness::tiga`; this crate holds only the roles.
//!
//! ## The analytic latency (`kairos_harness::tiga::analytic_latency`)
//! For a coordinator c, with one-way delays d(·,·) from the latency matrix, super quorum
//! SQ = 1 + f + ⌈f/2⌉, margin Δ (10 ms) and perfectly synchronized clocks:
//!
//! ```text
//! headroom(c) = max over shards s of  SQ-th smallest d(c, r), r ∈ replicas(s)      + Δ
//! fast(c, s)  = SQ-th smallest d(r, c), r ∈ replicas(s)
//! slow(c, s)  = max( d(L_s, c),  A + sync/2 + f-th smallest [d(L_s, F) + d(F, c)], F ∈ followers(s) )
//! latency(c)  = headroom(c) + max over shards s of min(fast(c, s), slow(c, s))
//! ```
//!
//! where A is the leaders' agreement delay (the largest leader-to-leader one-way delay for
//! multi-shard transactions). With the GCP matrix and co-located leaders: sc 134.6 ms (fast),
//! fi 195.0 ms and br 191.6 ms (slow: the local follower's slow reply beats the far fast
//! reply), hk 312.1 ms (fast). Measured medians sit a few ms above it: with real clock error a
//! fast quorum waits for the slowest replica's clock to pass the timestamp.
//!
//! With the **per-transaction quorum choice** (`TigaConfig::quorum_choice`, beyond the paper)
//! the coordinator may instead stamp the transaction for the leaders only, and the bound
//! gains a case:
//!
//! ```text
//! leaders(c)  = max over shards s of d(c, L_s) + Δ
//! latency(c)  = min( the above,  leaders(c) + max over shards s of slow(c, s) )
//! ```
//!
//! With co-located leaders: sc 129.3, fi 136.1, br 129.3 ms (the slow path, from 134.6, 195.0
//! and 191.6), hk 312.1 ms (unchanged).
//!
//! ## Choices where the paper and its reference code differ
//! - Fast path: same timestamp **and same hash** from a super quorum with the leader (paper).
//! - Leader bump: `max(local clock, last released + 1)` (satisfies both).
//! - Follower that cannot accept: hold (paper), no reply until the leader's log brings it.
//! - Log hash: one accumulator per key (as the reference code); the reply hash covers the
//!   transaction's keys, so commuting transactions on other keys need not agree on order.
//! - Leaders announce their timestamp when a transaction *arrives* (it is settled then), not
//!   when they release it: announcing at release lets two leaders holding conflicting
//!   transactions in opposite orders wait for each other forever. The paper's rule stays
//!   available for measurement, with a timeout that ends those waits
//!   (`TigaConfig::announce_at_release`; `tests/tiga_micro.rs` shows the deadlock). Announcing
//!   at arrival overlaps the agreement with the wait for the timestamp, so keys are held less:
//!   with separated leaders at skew 0.9 and 8,000 txn/s offered (`kairos bench tiga
//!   --placement separated --skew 0.9 --load 8000 --duration-s 3`), at arrival 7,499 txn/s
//!   commit at a median of 261 ms; at release 6,610 at 341 ms with a 200 ms timeout, 4,476 at
//!   559 ms with 1 s. With co-located leaders the two rules measure the same.
//! - Lost messages: coordinators retransmit under the same id (at-most-once: servers answer a
//!   known id with their last reply); leaders retry agreement messages and resend log entries
//!   when a follower's sync-point stalls.
//!
//! ## Failures ([`view`], [`server`]'s `view_change`)
//! A replicated view manager (Multi-Paxos from `kairos-consensus` on its own nodes) replaces a
//! leader that stops sending heartbeats, or that restarted; every shard then merges its log from
//! f + 1 replicas, the new leaders reconcile multi-shard transactions, and coordinators resend
//! what they had in flight in the new view. Every replica journals its log and what it released,
//! so a restarted one votes as before; it rejoins through the leader's `StartView`.
//!
//! Every replica checkpoints its committed state (with the key maps of the log up to it) every
//! `checkpoint_interval` positions, or every `checkpoint_positions_per_key` positions per key
//! of the state when that is more, and drops its log below (a leader keeps up to one more
//! interval for lagging followers); a follower the leader's log no longer reaches installs the
//! leader's checkpoint. The transactions of dropped entries are forgotten once no coordinator
//! can resend them, so what a server holds is bounded by its state, the checkpoint spacing and
//! the transactions of the last few seconds.
//!
//! **Not yet here:** view changes among real processes (`kairos serve` runs no view manager),
//! detection of a wiped disk (a replica that lost its journal boots as a fresh replica of
//! view 0).
//!
//! **Transactions that never reach a leader.** A multi-shard transaction whose submit is lost
//! on its way to one leader leaves the others holding its keys until a retransmission arrives
//! (2 s: slow under contention and loss). If it never arrives (every send lost, or the
//! coordinator crashed), the waiting leaders keep probing; once the transaction is older than
//! `agree_abandon_after` (beyond any coordinator's give-up time) the leader that never saw it
//! answers "absent" and refuses it from then on, and the others revoke and drop it. Followers
//! that released it keep it in their hashes for its keys (costing the fast path there) until
//! view changes clean that up.
//!
//! **History of unknown increments.** An increment writes `read + 1`, so a transaction with an
//! unknown outcome (given up, or its coordinator crashed) enters the history without its written
//! values. If it took effect, a later read of its value looks like a read of a value nobody
//! wrote (`garbage-read`). Below saturation and without coordinator crashes this does not occur;
//! `kairos bench tiga` says so when it is all the checker found.

pub mod coordinator;
pub mod cow_map;
pub mod msg;
pub mod ops;
mod owd_window;
mod release_queue;
pub mod server;
pub mod topology;
pub mod tpcc;
pub mod view;

pub use msg::{Piece, PieceResult, TigaMsg, TxnId};
pub use ops::{Op, OpKind, OpOutput};
pub use topology::{TigaConfig, Topology};
