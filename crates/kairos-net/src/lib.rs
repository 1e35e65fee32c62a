//! # kairos-net — the tokio TCP host
//!
//! Every Kairos protocol role is a sans-IO [`kairos_core::Process`]. This crate runs one as a
//! real node: [`spawn_node`] binds the node's address from a [`ClusterConfig`], and a single
//! task owns the role, calling `on_start`, then `on_message(from, msg)` for each message that
//! arrives and `on_timer(id)` for each timer that expires, each time with a [`kairos_core::Ctx`]
//! whose `now()` is the system clock (nanoseconds since the Unix epoch) and whose random
//! generator is ChaCha8 seeded with [`NodeOptions::seed`] on stream = node id. The role's
//! effects are carried out by the host:
//!
//! - **Send** goes to a bounded per-peer queue drained by a dialer task that connects lazily,
//!   reconnects with capped exponential backoff, and writes frames. A message to the node
//!   itself loops back without TCP (and without injected delay).
//! - **SetTimer / CancelTimer**: setting an armed id re-arms it; a cancelled or re-armed
//!   deadline never fires.
//! - **History** records get a per-node `index` and `time` = real nanoseconds since the Unix
//!   epoch (so records of several processes on one machine are comparable) and go to the
//!   receiver of [`NodeHandle::take_history`].
//! - **Metric** adds to a named counter; [`NodeHandle::metrics`] reads them, beside the host's
//!   own counters (names in [`metric`]).
//! - **Persist** goes to the node's [`storage`] under [`NodeOptions::data_dir`], synced before
//!   any other effect of the same handler is carried out; a restarted process with the same
//!   data directory hands it to the role's `on_recover` before `on_start`. Without a data
//!   directory nothing survives the process (counted as `net.persist.discarded`).
//!
//! [`run_until_ctrl_c`] is the whole life of a `serve` command: start, pass on history, stop
//! gracefully on Ctrl-C.
//!
//! [`spawn_node_with_local_port`] also returns a [`LocalPort`]: a gateway in the same process
//! (the MongoDB listener of `kairos serve`) submits messages to the role as if from node ids
//! above the cluster's, and receives what the role sends to such ids. Both directions are
//! bounded queues.
//!
//! ## Connections
//!
//! Each node dials each peer it sends to; links are one-way (a pair that talks both ways has
//! two TCP connections). The dialer's first frame is a Hello with its node id and the cluster
//! name. The acceptor checks that the cluster name matches and that the id is another node of
//! the config, then attributes every message on that connection to that id. Garbage,
//! truncated, wrong-version, unknown-kind, oversized or bad-checksum frames, a bad Hello, and a
//! message that does not decode as the role's message type each close *that* connection, with
//! a `tracing::warn!` and a counter; the node keeps serving every other connection and accepts
//! new ones. The host never panics on network input.
//!
//! ## Frame format ([`frame`])
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 2 | magic `b"KR"` |
//! | 2 | 1 | version, `1` |
//! | 3 | 1 | kind: `1` Hello, `2` Msg |
//! | 4 | 4 | payload length, u32 little-endian |
//! | 8 | 8 | xxh3-64 of the payload, u64 little-endian |
//! | 16 | n | payload, postcard (`Hello { node, cluster }` or the role's message) |
//!
//! The length is checked against `max_frame_bytes` before any buffer is allocated.
//!
//! ## Cluster config ([`config`])
//!
//! ```toml
//! [cluster]
//! name = "demo"
//! latency = "gcp"            # built-in GCP matrix (default), or a path to an RTT CSV relative to this file
//! inject_delay = true        # add the matrix one-way delay per link (default false)
//! max_frame_bytes = 4194304  # default 4 MiB, 256 ..= 256 MiB
//!
//! [[node]]
//! id = 0                     # ids dense 0..n
//! addr = "127.0.0.1:7100"    # IP:port, unique, port not 0
//! region = "sc"              # a region of the latency matrix
//! role = "replica"           # optional, free-form; for the command line to pick the role
//! ```
//!
//! Unknown fields, TOML syntax errors, duplicate or missing ids, duplicate or unparsable
//! addresses, unknown regions, an empty node list and an unreadable latency file are
//! [`ConfigError`]s that name the file and line and say what to do.
//!
//! ## Limits
//!
//! Everything is bounded ([`NodeOptions`]): frame payload (`max_frame_bytes`), the inbound
//! queue shared by all connections (full: readers pause, TCP pushes back), the outbound queue
//! per peer (full: the message is dropped and counted in [`metric::OUT_QUEUE_FULL`]), the
//! loopback queue, inbound connections open at once (`max_connections`, extra ones closed at
//! once), the Hello's size (4 KiB: it is read before the sender is known; cluster names are at
//! most 256 bytes), the time to send a Hello, an identified connection's silence
//! (`idle_timeout`, after which it is closed and its dialer reconnects), connect timeout and reconnect backoff, and the time a
//! shutdown lets outbound queues drain.
//!
//! ## Delay injection
//!
//! With `inject_delay = true`, a message from node *a* to node *b* is written no earlier than
//! the matrix's one-way delay between their regions after the role sent it, so local processes
//! behave like the geo deployment. The delay is applied on the sender: each queued message
//! carries its due instant and the peer's dialer sleeps until it, which keeps each link FIFO
//! (the delay of a link is constant) and never holds up other links.

pub mod config;
pub mod frame;
mod host;
pub mod storage;

pub use config::{ClusterConfig, ConfigError, NodeSpec};
pub use frame::{FrameError, FrameKind, Hello};
pub use host::{
    metric, run_until_ctrl_c, spawn_node, spawn_node_with_calls, spawn_node_with_local_port, Call, HistorySink,
    LocalPort, LocalSubmitter, NetError, NodeHandle, NodeOptions,
};
