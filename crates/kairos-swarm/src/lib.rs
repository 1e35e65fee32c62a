//! # kairos-swarm — SWARM-KV (SOSP 2024) over passive memory nodes
//!
//! Memory nodes are byte arrays that execute one-sided **verbs** only ([`verbs`]): read,
//! write, 64-bit compare-and-swap, and ordered chains of verbs on one connection (applied in
//! order, never atomically as a group). Everything else — replication, concurrency control,
//! the key-value store — runs in clients, as sans-IO state machines behind one interface
//! ([`client::KvClient`]) that every backend drives.
//!
//! | file | what it holds |
//! |---|---|
//! | [`verbs`] | verbs, chains, outcomes, [`verbs::MemoryImage`] (the reference semantics) |
//! | [`client`] | the sans-IO client interface: [`client::KvOp`], [`client::Outbox`], [`client::KvError`], membership |
//! | [`layout`] | where the directory, metadata words, in-place entries (key + copy, primary only) and buffer pools live |
//! | [`meta`] | In-n-Out's metadata and lock words, hashed copies (xxHash3 over tuple + value) |
//! | [`index`] | the replica-location index (shared directory + client cache), the bulk loader |
//! | [`pool`] | memory recycling of out-of-place buffers |
//! | [`node_words`] | the client's own metadata and lock words per (key, node), a key's nodes in one entry |
//! | [`engine`] | [`engine::Client`]: rounds of chains, timeouts, membership, per-key ordering |
//! | [`hedge`] | majority-first rounds (reads, a write's first try) that widen to every replica when one is slow or fails |
//! | [`safe_guess`] | SWARM-KV: Safe-Guess writes and reads, timestamp locks |
//! | [`dm_abd`], [`raw`], [`fusee`] | the baselines on the same layout and verbs (FUSEE: the SWARM paper's third peer) |
//! | [`sim`] | the simulator's memory-node and client-machine processes (their runs: `kairos_harness::swarm::sim`) |
//! | [`direct`] | synchronous backend (warm-up, unit tests) |
//!
//! The real memory backends (shm, TCP), the threaded driver that runs clients on them, and the
//! per-key linearizability check live in `kairos-harness` (`kairos_harness::swarm`): this crate
//! has no threads, sockets, wall clock or checker.
//!
//! ## The protocol in one paragraph
//! Every key has, on each of its replicas, one 8-byte metadata word **per writer** (packing
//! timestamp, buffer, writer, VERIFIED flag so integer order is timestamp order), an in-place copy
//! of the latest value, and out-of-place buffers in each writer's pool. A write **guesses** its
//! timestamp from the local clock and, in one round trip to a majority, fills a buffer, CASes its
//! own word and reads everyone's words; if nothing newer was read it is done, and the VERIFIED flag
//! and in-place copy follow in the background. A stale guess is repaired (clock resync, then a
//! rewrite above what was seen, after winning the tuple's **timestamp lock** against readers when
//! a reader might have chosen it). A read fetches all words and the in-place copy in one round
//! trip and returns a VERIFIED maximum at once; a GUESSED one is returned only after locking it
//! (seen twice in a row) or after seeing its writer move on (see [`safe_guess`]); a reader that
//! had to follow the pointer to a VERIFIED value repairs the in-place copy in the background (after
//! a primary crash the next replica's copy is stale until then). DM-ABD does the
//! same in two round trips with timestamps from a read phase; RAW is one unreplicated copy.
//!
//! ## Memory recycling (designed here; the paper describes but does not implement it)
//! Per-writer buffer pools; a buffer is retired when its tuple can no longer be a key's maximum
//! (the writer wrote or deleted the key again, or saw a newer VERIFIED tuple of another writer)
//! and reused after a grace period ≥ the longest operation (default 1 ms). Copies carry their
//! tuple word and a hash over it, so a reader that follows a stale pointer into a reused buffer
//! detects it and retries. But a reader's or stale writer's lock round writes a tuple's copy
//! into its writer's buffer, and such a chain stalled past the grace period can land over a
//! newer tuple's value once the buffer is reused: **recycling is safe only under eventual
//! synchrony** (a grace period longer than any chain stays in flight), as in the paper's design
//! ([`pool`] says why; runs that must not assume it turn recycling off). Memory
//! per writer is bounded by one current buffer per key plus the buffers retired within one grace
//! period ([`pool`]).
//!
//! ## Simplifications (be aware)
//! * Membership is a per-client suspicion list (a node that misses a 2 ms deadline is skipped,
//!   but a client never suspects a majority), not uKharon; memory nodes never restart (a
//!   restarted node would be an empty replica).
//! * The in-place copy is written and read on the first alive replica only; every replica
//!   reserves address space for it, grouped by rank, and only the primaries' group is touched
//!   ([`layout`]).
//! * Inserting a key the client does not know costs an index lookup first (2 round trips: lookup,
//!   then directory entry + first value together, or an update if the key exists); known keys (the
//!   client's index cache, warm after the load phase) take 1. 40-bit key fingerprints must be
//!   unique; two clients *concurrently* creating the same new key may each keep their own slot
//!   (see [`index`]).
//! * A deleted key's slot is never reused; timestamps are 35 bits of 16 ns (~9 minutes of clock)
//!   — past that, writes fail with [`client::KvError::TimestampExhausted`].
//! * One operation per key at a time *per client* (later ones queue in the client); any number of
//!   keys in flight.
//! * A reader racing for a GUESSED tuple writes it back (value, then metadata) where missing and,
//!   if it wins, marks it VERIFIED in the background; a reader that returns a VERIFIED tuple
//!   does not write back (VERIFIED means "on a majority").
//! * Latency is measured from invocation to completion in true simulated time; background
//!   verification and in-place refresh are not on the critical path (as in the paper).

pub mod client;
pub mod deletion;
pub mod direct;
pub mod dm_abd;
pub mod engine;
pub mod fusee;
pub mod hedge;
pub mod index;
pub mod layout;
pub mod meta;
pub mod node_words;
pub mod pool;
pub mod raw;
pub mod safe_guess;
pub mod sim;
pub mod verbs;
