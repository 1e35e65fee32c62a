//! The host: one tokio task owns the [`Process`]; it turns inbound messages, timer expiries
//! and shutdown into handler calls and carries out the effects. Around it: an accept loop with
//! one reader task per inbound connection, and one dialer task per peer it sends to.

use crate::config::ClusterConfig;
use crate::frame::{self, FrameError, FrameKind, Hello};
use kairos_core::history::HistoryRecord;
use kairos_core::{duration_nanos, Ctx, Effect, LocalTime, Message, NodeId, Process, Rng, TimerId};
use rand::SeedableRng;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep_until, timeout, Instant};

/// Names of the counters the host itself keeps (a role's own metrics sit beside them).
pub mod metric {
    /// Inbound connections accepted (before the Hello check).
    pub const IN_CONNECTIONS: &str = "net.in.connections";
    /// Inbound connections refused because `max_connections` were open.
    pub const IN_REJECTED_LIMIT: &str = "net.in.rejected_limit";
    /// Inbound connections closed for a malformed frame (garbage, truncated, wrong version,
    /// unknown kind, oversized, bad checksum).
    pub const IN_BAD_FRAME: &str = "net.in.bad_frame";
    /// Inbound connections closed for a bad Hello (missing, undecodable, unknown node id,
    /// wrong cluster name, or not within `hello_timeout`).
    pub const IN_BAD_HELLO: &str = "net.in.bad_hello";
    /// Inbound connections closed for a message that does not decode as the role's message
    /// type (or a second Hello).
    pub const IN_BAD_MESSAGE: &str = "net.in.bad_message";
    /// Inbound connections closed after `idle_timeout` without a frame (a silent or half-open
    /// peer must not hold one of the `max_connections` permits forever; a dialer reconnects).
    pub const IN_IDLE_CLOSED: &str = "net.in.idle_closed";
    /// Messages received over TCP and handed to the role.
    pub const IN_MESSAGES: &str = "net.in.messages";
    /// Outbound connections established.
    pub const OUT_CONNECTIONS: &str = "net.out.connections";
    /// Failed connection attempts (each is followed by a backoff).
    pub const OUT_CONNECT_FAILED: &str = "net.out.connect_failed";
    /// Outbound connections lost on a write error or closed by the peer.
    pub const OUT_CONNECTION_LOST: &str = "net.out.connection_lost";
    /// Messages written to a peer's socket.
    pub const OUT_MESSAGES: &str = "net.out.messages";
    /// Messages dropped because the peer's outbound queue was full.
    pub const OUT_QUEUE_FULL: &str = "net.out.queue_full";
    /// Messages dropped because they do not encode or exceed the frame limit.
    pub const OUT_ENCODE_ERROR: &str = "net.out.encode_error";
    /// Messages dropped because the destination is not in the cluster.
    pub const OUT_UNKNOWN_PEER: &str = "net.out.unknown_peer";
    /// Records and snapshots made durable under the data directory.
    pub const PERSIST_WRITES: &str = "net.persist.writes";
    /// Persist requests dropped because the node has no data directory.
    pub const PERSIST_DISCARDED: &str = "net.persist.discarded";
    /// Messages a node sent to itself (delivered without TCP).
    pub const SELF_MESSAGES: &str = "net.self.messages";
    /// Messages to itself dropped because the loopback queue was full.
    pub const SELF_QUEUE_FULL: &str = "net.self.queue_full";
    /// Timers that fired.
    pub const TIMERS_FIRED: &str = "net.timers.fired";
    /// History records handed to the sink.
    pub const HISTORY_RECORDS: &str = "net.history.records";
    /// Messages to local clients (see `LocalPort`) dropped because their queue was full.
    pub const LOCAL_QUEUE_FULL: &str = "net.local.queue_full";
}

/// Why a node could not be started or did not stop cleanly.
#[derive(Debug, Error)]
pub enum NetError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("node {me} is not in the cluster, which has nodes 0..{n}; pick an id from the config")]
    UnknownNode { me: NodeId, n: usize },
    #[error("node {me}: rejoining after a lost disk needs the data directory to recover into; pass --data-dir")]
    RejoinWithoutDataDir { me: NodeId },
    #[error("cannot listen on {addr}: {source}; is another process using that address? check the node's `addr` in the cluster config")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot use the given listener: {0}")]
    Listener(#[source] std::io::Error),
    #[error("cannot wait for Ctrl-C: {0}")]
    Signal(#[source] std::io::Error),
    #[error("the role's task of node {me} ended abnormally: {reason}")]
    ProcessDied { me: NodeId, reason: String },
    #[error(transparent)]
    Storage(#[from] crate::storage::StorageError),
}

/// Where history records go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistorySink {
    /// Records are counted and dropped.
    Discard,
    /// Records go to [`NodeHandle::take_history`]'s receiver, a bounded channel. A full channel
    /// pauses the role until it is drained (records are never lost); dropping the receiver
    /// discards later records.
    Channel { capacity: usize },
}

/// How a node runs. Every queue is bounded.
#[derive(Debug)]
pub struct NodeOptions {
    /// Seed of the role's random generator: ChaCha8 seeded with `seed`, stream = node id.
    pub seed: u64,
    /// Messages received and not yet handled, over all connections (a full queue pauses the
    /// readers, which pushes back on the senders through TCP).
    pub inbound_queue: usize,
    /// Messages waiting to be written to one peer; when full, new messages to it are dropped
    /// and counted in [`metric::OUT_QUEUE_FULL`].
    pub outbound_queue: usize,
    /// Messages a node sent to itself and has not handled yet.
    pub loopback_queue: usize,
    /// Inbound connections open at once; further ones are closed at once.
    pub max_connections: usize,
    /// Time a new inbound connection has to send its Hello.
    pub hello_timeout: Duration,
    /// An identified inbound connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
    /// Time allowed for one connection attempt.
    pub connect_timeout: Duration,
    /// First and largest pause between failed connection attempts (doubling in between).
    pub reconnect_backoff_min: Duration,
    pub reconnect_backoff_max: Duration,
    /// How long [`NodeHandle::shutdown`] lets queued outbound messages drain.
    pub shutdown_grace: Duration,
    pub history: HistorySink,
    /// An already-bound listener to use instead of binding the config's address (tests bind
    /// port 0 first, then write the config).
    pub listener: Option<std::net::TcpListener>,
    /// Where the node keeps what its role persists ([`crate::storage`]); `None`: nothing
    /// survives the process.
    pub data_dir: Option<std::path::PathBuf>,
    /// This node ran before (`kairos serve --rejoin`): if `data_dir` holds nothing, its disk
    /// was lost or replaced, and the role is told so ([`Process::on_amnesia`]) instead of
    /// starting as a new member. A host cannot tell a wiped directory from a new one by itself.
    pub rejoin: bool,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            seed: 0,
            inbound_queue: 4096,
            outbound_queue: 4096,
            loopback_queue: 4096,
            max_connections: 256,
            hello_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(2),
            reconnect_backoff_min: Duration::from_millis(10),
            reconnect_backoff_max: Duration::from_secs(1),
            shutdown_grace: Duration::from_millis(500),
            history: HistorySink::Channel { capacity: 65_536 },
            listener: None,
            data_dir: None,
            rejoin: false,
        }
    }
}

impl NodeOptions {
    /// Defaults with the given seed.
    pub fn with_seed(seed: u64) -> Self {
        NodeOptions { seed, ..Self::default() }
    }
    /// Uses `listener` (already bound) instead of binding the config's address.
    pub fn listener(mut self, listener: std::net::TcpListener) -> Self {
        self.listener = Some(listener);
        self
    }
}

/// Counters by name, shared by the host's tasks.
#[derive(Clone, Default, Debug)]
struct Metrics(Arc<Mutex<BTreeMap<&'static str, u64>>>);

impl Metrics {
    fn add(&self, name: &'static str, value: u64) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let c = m.entry(name).or_insert(0);
        *c = c.saturating_add(value);
    }
    fn snapshot(&self) -> BTreeMap<String, u64> {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }
    fn get(&self, name: &str) -> u64 {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.get(name).copied().unwrap_or(0)
    }
}

/// What every task of a node shares.
struct Shared {
    cfg: Arc<ClusterConfig>,
    me: NodeId,
    metrics: Metrics,
    max_frame: u32,
    hello_timeout: Duration,
    idle_timeout: Duration,
    connect_timeout: Duration,
    backoff_min: Duration,
    backoff_max: Duration,
    /// This node's Hello, framed once.
    hello: Vec<u8>,
}

/// A running node.
pub struct NodeHandle {
    me: NodeId,
    local_addr: SocketAddr,
    metrics: Metrics,
    history: Option<mpsc::Receiver<HistoryRecord>>,
    shutdown: watch::Sender<bool>,
    process_task: Option<JoinHandle<()>>,
    process_result: Option<Result<(), String>>,
    accept_task: Option<JoinHandle<()>>,
}

impl NodeHandle {
    pub fn id(&self) -> NodeId {
        self.me
    }
    /// The address the node listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
    /// The history receiver (once; `None` with [`HistorySink::Discard`] or when taken).
    /// Records carry a per-node index and real time in nanoseconds since the Unix epoch.
    pub fn take_history(&mut self) -> Option<mpsc::Receiver<HistoryRecord>> {
        self.history.take()
    }
    /// All counters: the host's (see [`metric`]) and the role's.
    pub fn metrics(&self) -> BTreeMap<String, u64> {
        self.metrics.snapshot()
    }
    /// One counter (0 if never incremented).
    pub fn metric(&self, name: &str) -> u64 {
        self.metrics.get(name)
    }
    /// Resolves when the role's task has ended (after [`NodeHandle::shutdown`] began, or if a
    /// handler panicked).
    pub async fn stopped(&mut self) {
        if let Some(task) = self.process_task.as_mut() {
            let r = task.await;
            self.process_task = None;
            self.process_result = Some(r.map_err(|e| e.to_string()));
        }
    }
    /// Stops the node: no handler runs after this begins; queued outbound messages get up to
    /// `shutdown_grace` to drain; then every task is ended. Returns the final counters.
    pub async fn shutdown(mut self) -> Result<BTreeMap<String, u64>, NetError> {
        let _ = self.shutdown.send(true);
        self.stopped().await;
        if let Some(task) = self.accept_task.take() {
            task.abort();
            let _ = task.await;
        }
        match self.process_result.take() {
            Some(Err(reason)) => Err(NetError::ProcessDied { me: self.me, reason }),
            _ => Ok(self.metrics.snapshot()),
        }
    }
}

impl Drop for NodeHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(t) = &self.accept_task {
            t.abort();
        }
    }
}

/// A call into a running node's role from outside it — a front end, such as a gateway that
/// turns client requests into transactions. It runs in the role's task like a handler, with a
/// context (clock, generator, outbox), and its effects are carried out like a handler's.
pub type Call<P> = Box<dyn FnOnce(&mut P, &mut Ctx<'_, <P as Process>::Msg>) + Send>;

/// Process-local clients of a node (a gateway speaking another protocol, in the same
/// process): they submit messages to the role as if sent by a node id outside the cluster
/// (`>= cfg.len()`), and receive every message the role sends to such an id. Both directions
/// are bounded: a full request queue makes [`LocalSubmitter::submit`] wait; a full reply queue
/// drops the reply (counted in [`metric::LOCAL_QUEUE_FULL`]).
pub struct LocalPort<M> {
    requests: mpsc::Sender<(NodeId, M)>,
    replies: mpsc::Receiver<(NodeId, M)>,
    first_client: u32,
}

/// The sending half of a [`LocalPort`], to share between connections.
#[derive(Clone)]
pub struct LocalSubmitter<M> {
    requests: mpsc::Sender<(NodeId, M)>,
    first_client: u32,
}

impl<M> LocalSubmitter<M> {
    /// The smallest id a local client may use (the cluster's size).
    pub fn first_client_id(&self) -> u32 {
        self.first_client
    }
    /// Hands `msg` to the role as sent by `from`. Fails when `from` is a cluster node's id or
    /// the node has stopped.
    pub async fn submit(&self, from: NodeId, msg: M) -> Result<(), &'static str> {
        if from.0 < self.first_client {
            return Err("a local client may not use the id of a cluster node");
        }
        self.requests.send((from, msg)).await.map_err(|_| "the node has stopped")
    }
}

impl<M> LocalPort<M> {
    /// Splits into the submitting half and the receiver of the role's replies.
    pub fn split(self) -> (LocalSubmitter<M>, mpsc::Receiver<(NodeId, M)>) {
        (LocalSubmitter { requests: self.requests, first_client: self.first_client }, self.replies)
    }
}

/// Starts `process` as node `me` of `cfg`: binds (or takes) the listener, runs `on_start`,
/// and serves until [`NodeHandle::shutdown`].
pub async fn spawn_node<P>(
    cfg: Arc<ClusterConfig>,
    me: NodeId,
    process: P,
    opts: NodeOptions,
) -> Result<NodeHandle, NetError>
where
    P: Process + Send + 'static,
{
    Ok(spawn_inner(cfg, me, process, opts, None, None).await?.0)
}

/// As [`spawn_node`], and the role also runs every [`Call`] that arrives on `calls` (a bounded
/// channel the caller made: a full one pushes back on the front end), between handlers.
pub async fn spawn_node_with_calls<P>(
    cfg: Arc<ClusterConfig>,
    me: NodeId,
    process: P,
    opts: NodeOptions,
    calls: Option<mpsc::Receiver<Call<P>>>,
) -> Result<NodeHandle, NetError>
where
    P: Process + Send + 'static,
{
    Ok(spawn_inner(cfg, me, process, opts, None, calls).await?.0)
}

/// [`spawn_node`], plus a [`LocalPort`] whose reply queue holds `reply_queue` messages.
pub async fn spawn_node_with_local_port<P>(
    cfg: Arc<ClusterConfig>,
    me: NodeId,
    process: P,
    opts: NodeOptions,
    reply_queue: usize,
) -> Result<(NodeHandle, LocalPort<P::Msg>), NetError>
where
    P: Process + Send + 'static,
{
    let first_client = cfg.len() as u32;
    let (tx, rx) = mpsc::channel(reply_queue.max(1));
    let (handle, requests) = spawn_inner(cfg, me, process, opts, Some(tx), None).await?;
    Ok((handle, LocalPort { requests, replies: rx, first_client }))
}

async fn spawn_inner<P>(
    cfg: Arc<ClusterConfig>,
    me: NodeId,
    mut process: P,
    opts: NodeOptions,
    local: Option<mpsc::Sender<(NodeId, P::Msg)>>,
    calls: Option<mpsc::Receiver<Call<P>>>,
) -> Result<(NodeHandle, mpsc::Sender<(NodeId, P::Msg)>), NetError>
where
    P: Process + Send + 'static,
{
    let spec = cfg.node(me).ok_or(NetError::UnknownNode { me, n: cfg.len() })?;
    let store = match &opts.data_dir {
        Some(dir) => {
            let (store, stored) = crate::storage::DiskStore::open(dir)?;
            if !stored.is_empty() {
                tracing::info!(node = %me, records = stored.records.len(), snapshot = stored.snapshot.is_some(), "recovering from {}", dir.display());
                process.on_recover(&stored);
            } else if opts.rejoin {
                tracing::warn!(node = %me, "{} is empty but this node ran before (--rejoin): its disk was lost; it rejoins without the promises it made", dir.display());
                process.on_amnesia();
            }
            Some(store)
        }
        None if opts.rejoin => return Err(NetError::RejoinWithoutDataDir { me }),
        None => None,
    };
    let listener = match opts.listener {
        Some(l) => {
            l.set_nonblocking(true).map_err(NetError::Listener)?;
            TcpListener::from_std(l).map_err(NetError::Listener)?
        }
        None => TcpListener::bind(spec.addr).await.map_err(|source| NetError::Bind { addr: spec.addr, source })?,
    };
    let local_addr = listener.local_addr().map_err(NetError::Listener)?;
    let max_frame = cfg.max_frame_bytes();
    let hello = Hello { node: me, cluster: cfg.name().to_string() };
    let hello =
        frame::encode(FrameKind::Hello, &hello, max_frame).map_err(|e| crate::config::ConfigError::Invalid {
            origin: "cluster config".into(),
            problem: format!("the Hello frame does not fit: {e}; shorten the cluster name"),
        })?;
    let metrics = Metrics::default();
    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        me,
        metrics: metrics.clone(),
        max_frame,
        hello_timeout: opts.hello_timeout,
        idle_timeout: opts.idle_timeout,
        connect_timeout: opts.connect_timeout,
        backoff_min: opts.reconnect_backoff_min.max(Duration::from_millis(1)),
        backoff_max: opts.reconnect_backoff_max.max(opts.reconnect_backoff_min),
        hello,
    });
    let (inbound_tx, inbound_rx) = mpsc::channel::<(NodeId, P::Msg)>(opts.inbound_queue.max(1));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (history_tx, history_rx) = match opts.history {
        HistorySink::Discard => (None, None),
        HistorySink::Channel { capacity } => {
            let (tx, rx) = mpsc::channel(capacity.max(1));
            (Some(tx), Some(rx))
        }
    };
    let local_requests = inbound_tx.clone();
    let accept_task = tokio::spawn(accept_loop::<P::Msg>(
        listener,
        shared.clone(),
        inbound_tx,
        Arc::new(Semaphore::new(opts.max_connections.max(1))),
    ));
    let node = Node {
        process,
        rng: {
            let mut r = Rng::seed_from_u64(opts.seed);
            r.set_stream(u64::from(me.0));
            r
        },
        shared,
        timers: Timers::default(),
        peers: (0..cfg.len()).map(|_| None).collect(),
        dialers: JoinSet::new(),
        outbound_queue: opts.outbound_queue.max(1),
        loopback: VecDeque::new(),
        loopback_queue: opts.loopback_queue.max(1),
        history: history_tx,
        history_index: 0,
        effects: Vec::new(),
        store,
        local,
    };
    let process_task = tokio::spawn(node.run(inbound_rx, calls, shutdown_rx, opts.shutdown_grace));
    tracing::info!(node = %me, addr = %local_addr, cluster = cfg.name(), "node listening");
    let handle = NodeHandle {
        me,
        local_addr,
        metrics,
        history: history_rx,
        shutdown: shutdown_tx,
        process_task: Some(process_task),
        process_result: None,
        accept_task: Some(accept_task),
    };
    Ok((handle, local_requests))
}

/// Runs node `me` until Ctrl-C (or until its role's task dies), handing every history record
/// to `on_history`; then shuts it down gracefully and returns the final counters.
pub async fn run_until_ctrl_c<P>(
    cfg: Arc<ClusterConfig>,
    me: NodeId,
    process: P,
    opts: NodeOptions,
    mut on_history: impl FnMut(HistoryRecord) + Send,
) -> Result<BTreeMap<String, u64>, NetError>
where
    P: Process + Send + 'static,
{
    let mut node = spawn_node(cfg, me, process, opts).await?;
    let mut history = node.take_history();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            r = &mut ctrl_c => {
                r.map_err(NetError::Signal)?;
                tracing::info!(node = %me, "Ctrl-C: shutting down");
                break;
            }
            rec = async { match history.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => {
                match rec {
                    Some(rec) => on_history(rec),
                    None => history = None,
                }
            }
            _ = node.stopped() => break,
        }
    }
    let result = node.shutdown().await;
    if let Some(mut h) = history {
        while let Some(rec) = h.recv().await {
            on_history(rec);
        }
    }
    result
}

/// Armed timers: deadline order plus the deadline of each id (re-arming replaces).
#[derive(Default)]
struct Timers {
    by_deadline: BTreeMap<(Instant, u64), TimerId>,
    armed: BTreeMap<TimerId, (Instant, u64)>,
    seq: u64,
}

impl Timers {
    fn set(&mut self, id: TimerId, at: Instant) {
        self.cancel(id);
        self.seq += 1;
        self.by_deadline.insert((at, self.seq), id);
        self.armed.insert(id, (at, self.seq));
    }
    fn cancel(&mut self, id: TimerId) {
        if let Some(key) = self.armed.remove(&id) {
            self.by_deadline.remove(&key);
        }
    }
    fn next_deadline(&self) -> Option<Instant> {
        self.by_deadline.keys().next().map(|k| k.0)
    }
    fn pop_due(&mut self, now: Instant) -> Option<TimerId> {
        let (&key, &id) = self.by_deadline.iter().next()?;
        if key.0 > now {
            return None;
        }
        self.by_deadline.remove(&key);
        self.armed.remove(&id);
        Some(id)
    }
}

/// A framed message on its way to one peer, to be written at `due`.
struct Outgoing {
    due: Instant,
    bytes: Vec<u8>,
}

/// The role and everything its effects touch; owned by one task.
struct Node<P: Process> {
    process: P,
    rng: Rng,
    shared: Arc<Shared>,
    timers: Timers,
    peers: Vec<Option<mpsc::Sender<Outgoing>>>,
    dialers: JoinSet<()>,
    outbound_queue: usize,
    loopback: VecDeque<P::Msg>,
    loopback_queue: usize,
    history: Option<mpsc::Sender<HistoryRecord>>,
    history_index: u64,
    effects: Vec<Effect<P::Msg>>,
    store: Option<crate::storage::DiskStore>,
    /// Where messages to ids outside the cluster go (a [`LocalPort`]).
    local: Option<mpsc::Sender<(NodeId, P::Msg)>>,
}

/// `now + after`, saturating at 30 years from now (a role may ask for any Duration).
fn deadline_after(after: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(after.min(Duration::from_secs(30 * 365 * 86_400))).unwrap_or(now)
}

/// The host reads the real clock: that is its job (roles only see it through `ctx.now()`).
#[allow(clippy::disallowed_methods)]
fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(duration_nanos).unwrap_or(0)
}

enum Input<P: Process> {
    Message(NodeId, P::Msg),
    Timer(TimerId),
    Call(Call<P>),
}

impl<P: Process + Send + 'static> Node<P> {
    async fn run(
        mut self,
        mut inbound: mpsc::Receiver<(NodeId, P::Msg)>,
        mut calls: Option<mpsc::Receiver<Call<P>>>,
        mut shutdown: watch::Receiver<bool>,
        grace: Duration,
    ) {
        let me = self.shared.me;
        {
            let mut ctx = Ctx::new(me, LocalTime(now_ns()), &mut self.rng, &mut self.effects);
            self.process.on_start(&mut ctx);
        }
        let mut inbound_open = true;
        if self.apply_effects(&mut shutdown).await {
            loop {
                if *shutdown.borrow() {
                    break;
                }
                let deadline = self.timers.next_deadline();
                let input: Input<P> = tokio::select! {
                    _ = shutdown.changed() => break,
                    m = inbound.recv(), if inbound_open => match m {
                        Some((from, msg)) => Input::Message(from, msg),
                        None => { inbound_open = false; continue; }
                    },
                    c = async { match calls.as_mut() { Some(c) => c.recv().await, None => std::future::pending().await } } => match c {
                        Some(call) => Input::Call(call),
                        None => { calls = None; continue; }
                    },
                    _ = std::future::ready(()), if !self.loopback.is_empty() => match self.loopback.pop_front() {
                        Some(msg) => Input::Message(me, msg),
                        None => continue,
                    },
                    _ = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                        match self.timers.pop_due(Instant::now()) {
                            Some(id) => Input::Timer(id),
                            None => continue,
                        }
                    }
                };
                {
                    let mut ctx = Ctx::new(me, LocalTime(now_ns()), &mut self.rng, &mut self.effects);
                    match input {
                        Input::Message(from, msg) => self.process.on_message(&mut ctx, from, msg),
                        Input::Call(call) => call(&mut self.process, &mut ctx),
                        Input::Timer(id) => {
                            self.shared.metrics.add(metric::TIMERS_FIRED, 1);
                            self.process.on_timer(&mut ctx, id)
                        }
                    }
                }
                if !self.apply_effects(&mut shutdown).await {
                    break;
                }
            }
        }
        // Stop: no more handlers. Let the dialers drain their queues for up to `grace`.
        drop(inbound);
        self.peers.clear();
        let drain = async { while self.dialers.join_next().await.is_some() {} };
        if timeout(grace, drain).await.is_err() {
            tracing::debug!(node = %me, "outbound queues not drained within the shutdown grace; dropping them");
        }
        self.dialers.shutdown().await;
    }

    /// Carries out the effects of the last handler. Returns false if shutdown began while
    /// waiting for the history receiver.
    async fn apply_effects(&mut self, shutdown: &mut watch::Receiver<bool>) -> bool {
        let mut effects = std::mem::take(&mut self.effects);
        // Write-ahead: what the handler persisted is durable before any other effect of it.
        if effects.iter().any(|e| matches!(e, Effect::Persist(_))) {
            if let Err(e) = self.persist(&mut effects) {
                // Without its disk the node cannot keep its promises: it stops, sending nothing.
                tracing::error!(node = %self.shared.me, "stopping: {e}");
                return false;
            }
        }
        let mut running = true;
        for effect in effects {
            match effect {
                Effect::Persist(_) => {}
                Effect::Send { to, msg } => self.send(to, msg),
                Effect::SetTimer { id, after } => self.timers.set(id, deadline_after(after)),
                Effect::CancelTimer { id } => self.timers.cancel(id),
                Effect::Metric { name, value } => self.shared.metrics.add(name, value),
                Effect::History(event) => {
                    let rec = HistoryRecord { index: self.history_index, time: now_ns(), event };
                    self.history_index += 1;
                    self.shared.metrics.add(metric::HISTORY_RECORDS, 1);
                    if let (Some(tx), true) = (&self.history, running) {
                        tokio::select! {
                            r = tx.send(rec) => if r.is_err() { self.history = None },
                            _ = shutdown.changed() => running = false,
                        }
                    }
                }
            }
        }
        running
    }

    /// Writes and syncs the handler's persist requests (taking them out of `effects`).
    fn persist(&mut self, effects: &mut [Effect<P::Msg>]) -> Result<(), crate::storage::StorageError> {
        let metrics = &self.shared.metrics;
        for e in effects.iter_mut() {
            if let Effect::Persist(p) = e {
                let p = std::mem::replace(p, kairos_core::Persist::Append(Vec::new()));
                match &mut self.store {
                    Some(store) => {
                        store.write(p)?;
                        metrics.add(metric::PERSIST_WRITES, 1);
                    }
                    None => metrics.add(metric::PERSIST_DISCARDED, 1),
                }
            }
        }
        match &mut self.store {
            Some(store) => store.sync(),
            None => Ok(()),
        }
    }

    fn send(&mut self, to: NodeId, msg: P::Msg) {
        let shared = &self.shared;
        let me = shared.me;
        if to == me {
            if self.loopback.len() >= self.loopback_queue {
                shared.metrics.add(metric::SELF_QUEUE_FULL, 1);
            } else {
                shared.metrics.add(metric::SELF_MESSAGES, 1);
                self.loopback.push_back(msg);
            }
            return;
        }
        if to.index() >= self.peers.len() {
            if let Some(local) = &self.local {
                if local.try_send((to, msg)).is_err() {
                    shared.metrics.add(metric::LOCAL_QUEUE_FULL, 1);
                }
                return;
            }
        }
        let Some(slot) = self.peers.get_mut(to.index()) else {
            shared.metrics.add(metric::OUT_UNKNOWN_PEER, 1);
            tracing::warn!(node = %me, to = %to, "dropping a message to a node that is not in the cluster");
            return;
        };
        let bytes = match frame::encode(FrameKind::Msg, &msg, shared.max_frame) {
            Ok(b) => b,
            Err(e) => {
                shared.metrics.add(metric::OUT_ENCODE_ERROR, 1);
                tracing::warn!(node = %me, to = %to, error = %e, "dropping a message that cannot be framed");
                return;
            }
        };
        let due = deadline_after(shared.cfg.injected_delay(me, to));
        let mut item = Outgoing { due, bytes };
        for _attempt in 0..2 {
            let tx = slot.get_or_insert_with(|| {
                let (tx, rx) = mpsc::channel(self.outbound_queue);
                self.dialers.spawn(dial_loop(shared.clone(), to, rx));
                tx
            });
            match tx.try_send(item) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    shared.metrics.add(metric::OUT_QUEUE_FULL, 1);
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(back)) => {
                    // The dialer ended (it should not); start a new one.
                    *slot = None;
                    item = back;
                }
            }
        }
    }
}

/// An established outbound connection.
struct Conn {
    reader: OwnedReadHalf,
    writer: BufWriter<OwnedWriteHalf>,
}

async fn connect(shared: &Shared, addr: SocketAddr) -> std::io::Result<Conn> {
    let stream = timeout(shared.connect_timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(true)?;
    let (reader, writer) = stream.into_split();
    let mut writer = BufWriter::new(writer);
    writer.write_all(&shared.hello).await?;
    Ok(Conn { reader, writer })
}

enum Next {
    Item(Option<Outgoing>),
    PeerClosed,
}

/// Owns the queue to one peer: waits for each message's due time, connects lazily (with
/// capped exponential backoff), writes, and reconnects after errors. Ends when the queue's
/// sender is dropped and the queue is drained.
async fn dial_loop(shared: Arc<Shared>, to: NodeId, mut rx: mpsc::Receiver<Outgoing>) {
    let me = shared.me;
    let Some(addr) = shared.cfg.node(to).map(|n| n.addr) else {
        return;
    };
    let mut conn: Option<Conn> = None;
    let mut backoff = shared.backoff_min;
    let mut next_attempt = Instant::now();
    let mut pending: Option<Outgoing> = None;
    loop {
        let item = match pending.take() {
            Some(item) => item,
            None => {
                let next = match conn.as_mut() {
                    // The acceptor never writes: any read result means the peer closed.
                    Some(c) => {
                        let mut byte = [0u8; 1];
                        tokio::select! {
                            m = rx.recv() => Next::Item(m),
                            _ = c.reader.read(&mut byte) => Next::PeerClosed,
                        }
                    }
                    None => Next::Item(rx.recv().await),
                };
                match next {
                    Next::Item(Some(item)) => item,
                    Next::Item(None) => break,
                    Next::PeerClosed => {
                        shared.metrics.add(metric::OUT_CONNECTION_LOST, 1);
                        tracing::debug!(node = %me, peer = %to, "peer closed the connection");
                        conn = None;
                        continue;
                    }
                }
            }
        };
        // A tokio timer fires on the next millisecond tick at the earliest, even when its
        // deadline has passed: sleeping on a message already due would delay it by up to 1 ms
        // and cost a timer wake-up (`kairos bench net` measured 2.3 ms per loopback round trip).
        if item.due > Instant::now() {
            sleep_until(item.due).await;
        }
        if conn.is_none() && next_attempt > Instant::now() {
            sleep_until(next_attempt).await;
        }
        if conn.is_none() {
            match connect(&shared, addr).await {
                Ok(c) => {
                    shared.metrics.add(metric::OUT_CONNECTIONS, 1);
                    backoff = shared.backoff_min;
                    conn = Some(c);
                }
                Err(e) => {
                    shared.metrics.add(metric::OUT_CONNECT_FAILED, 1);
                    tracing::debug!(node = %me, peer = %to, %addr, error = %e, retry_in = ?backoff, "cannot connect");
                    next_attempt = Instant::now() + backoff;
                    backoff = (backoff * 2).min(shared.backoff_max);
                    pending = Some(item);
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let mut written = 0u64;
        let mut result = c.writer.write_all(&item.bytes).await;
        // Write every further message that is already due, then flush once.
        while result.is_ok() {
            written += 1;
            match rx.try_recv() {
                Ok(next) if next.due <= Instant::now() => result = c.writer.write_all(&next.bytes).await,
                Ok(next) => {
                    pending = Some(next);
                    break;
                }
                Err(_) => break,
            }
        }
        if result.is_ok() {
            result = c.writer.flush().await;
        }
        match result {
            Ok(()) => shared.metrics.add(metric::OUT_MESSAGES, written),
            Err(e) => {
                shared.metrics.add(metric::OUT_CONNECTION_LOST, 1);
                tracing::warn!(node = %me, peer = %to, error = %e, "write failed; reconnecting for later messages");
                conn = None;
            }
        }
    }
    if let Some(mut c) = conn {
        let _ = c.writer.flush().await;
        let _ = c.writer.shutdown().await;
    }
}

/// Accepts connections (at most `limit` open at once) and serves each in its own task.
async fn accept_loop<M: Message>(
    listener: TcpListener,
    shared: Arc<Shared>,
    inbound: mpsc::Sender<(NodeId, M)>,
    limit: Arc<Semaphore>,
) {
    let mut conns = JoinSet::new();
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                while conns.try_join_next().is_some() {}
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    shared.metrics.add(metric::IN_REJECTED_LIMIT, 1);
                    tracing::warn!(node = %shared.me, %peer, "too many inbound connections; closing the new one");
                    continue;
                };
                shared.metrics.add(metric::IN_CONNECTIONS, 1);
                let shared = shared.clone();
                let inbound = inbound.clone();
                conns.spawn(async move {
                    serve_conn(stream, peer, &shared, inbound).await;
                    drop(permit);
                });
            }
            Err(e) => {
                // Out of descriptors and the like: wait a little rather than spin.
                tracing::warn!(node = %shared.me, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Largest Hello frame payload accepted (a node id and the cluster name).
const HELLO_MAX_BYTES: u32 = 4096;

/// Serves one inbound connection: a Hello, then messages attributed to the Hello's node.
/// Any violation closes this connection only.
async fn serve_conn<M: Message>(
    stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    inbound: mpsc::Sender<(NodeId, M)>,
) {
    let me = shared.me;
    let _ = stream.set_nodelay(true);
    let mut r = BufReader::new(stream);
    let reject = |counter: &'static str, why: String| {
        shared.metrics.add(counter, 1);
        tracing::warn!(node = %me, %peer, "closing inbound connection: {why}");
    };
    // The sender is unknown until its Hello: read that with a small limit, so anonymous
    // connections cannot make the node allocate full-size frames.
    let hello_max = HELLO_MAX_BYTES.min(shared.max_frame);
    let from = match timeout(shared.hello_timeout, frame::read_frame(&mut r, hello_max)).await {
        Err(_) => return reject(metric::IN_BAD_HELLO, format!("no Hello within {:?}", shared.hello_timeout)),
        Ok(Ok(None)) => return,
        Ok(Err(e)) => return reject(metric::IN_BAD_FRAME, e.to_string()),
        Ok(Ok(Some((FrameKind::Msg, _)))) => {
            return reject(metric::IN_BAD_HELLO, "the first frame is a message, not a Hello".into())
        }
        Ok(Ok(Some((FrameKind::Hello, payload)))) => match frame::decode_payload::<Hello>(&payload) {
            Err(e) => return reject(metric::IN_BAD_HELLO, format!("Hello does not decode: {e}")),
            Ok(h) if h.cluster != shared.cfg.name() => {
                return reject(
                    metric::IN_BAD_HELLO,
                    format!("Hello from cluster `{}`, this is `{}`", h.cluster, shared.cfg.name()),
                )
            }
            Ok(h) if !shared.cfg.contains(h.node) || h.node == me => {
                return reject(
                    metric::IN_BAD_HELLO,
                    format!("Hello claims node {}, which may not dial this node", h.node),
                )
            }
            Ok(h) => h.node,
        },
    };
    tracing::debug!(node = %me, %peer, from = %from, "inbound connection identified");
    loop {
        let Ok(read) = timeout(shared.idle_timeout, frame::read_frame(&mut r, shared.max_frame)).await else {
            shared.metrics.add(metric::IN_IDLE_CLOSED, 1);
            return tracing::debug!(node = %me, %peer, from = %from, "closing an idle inbound connection");
        };
        match read {
            Ok(None) => return,
            Err(FrameError::Io(e)) => {
                return tracing::debug!(node = %me, %peer, from = %from, error = %e, "inbound connection lost")
            }
            Err(e) => return reject(metric::IN_BAD_FRAME, format!("from {from}: {e}")),
            Ok(Some((FrameKind::Hello, _))) => {
                return reject(metric::IN_BAD_MESSAGE, format!("from {from}: a second Hello"))
            }
            Ok(Some((FrameKind::Msg, payload))) => match frame::decode_payload::<M>(&payload) {
                Ok(msg) => {
                    shared.metrics.add(metric::IN_MESSAGES, 1);
                    if inbound.send((from, msg)).await.is_err() {
                        return; // the node is stopping
                    }
                }
                Err(e) => return reject(metric::IN_BAD_MESSAGE, format!("from {from}: message {e}")),
            },
        }
    }
}
