//! Memory nodes over TCP: a tiny server that executes verb frames and nothing else, and the
//! client port that talks to it.
//!
//! Frames are kairos-net's (`kairos_net::frame`: magic `KR`, version, kind, payload length
//! checked against the limit before anything is allocated, xxh3-64 checksum), always of kind
//! `Msg`, with a postcard payload:
//!
//! ```text
//! client -> server   ChainRequest { tag: u64, verbs: Vec<Verb> }    READ, WRITE and CAS are chains of one verb
//! server -> client   ChainReply   { tag: u64, result: Result<Vec<VerbOutcome>, VerbError> }
//! ```
//!
//! One connection per (client, node) carries that client's chains in order; the server answers
//! them in order. The server applies a chain's verbs one at a time to memory shared by all its
//! connections ([`AtomicWords`]), never holding a lock across a chain, so verbs of different
//! connections interleave inside chains exactly as the verb contract allows. A frame that is
//! not a well-formed `ChainRequest` (bad magic, checksum, kind, payload, more than
//! `CHAIN_VERBS_MAX` verbs, or a chain whose reply would not fit a frame) closes that connection
//! only; a well-formed request that a node refuses (out of bounds, misaligned) gets its
//! [`VerbError`] back. (The client port refuses too long a chain itself with
//! `VerbError::ChainTooLong`, like every backend.)
//!
//! Limits: frame payloads up to [`MEM_FRAME_BYTES_MAX`], chains up to `CHAIN_VERBS_MAX` verbs,
//! at most [`MemoryServerConfig::connections_max`] connections (extra ones are closed at once),
//! connections idle for [`MemoryServerConfig::idle_timeout`] closed, and at most
//! `PORT_IN_FLIGHT_MAX` chains in flight per client connection.
//!
//! A crash is a killed server: [`MemoryServer::kill`] closes the listener and every connection
//! (as does killing the `kairos serve swarm-memory` process); chains in flight to it never
//! complete, and a port treats an unreachable or closed node as crashed for good.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use kairos_net::frame::{decode_frame, decode_header, decode_payload, encode, FrameError, FrameKind, HEADER_LEN};
use serde::{Deserialize, Serialize};

use super::atomic::{zeroed_words, AtomicWords};
use super::{BackendError, Completion, MemoryBackend, MemoryPort, PORT_IN_FLIGHT_MAX};
use kairos_swarm::verbs::{Chain, MemNodeId, Verb, VerbError, VerbOutcome, CHAIN_VERBS_MAX};

/// Largest frame payload either side sends or accepts (a 1 MiB verb fits with room to spare).
pub const MEM_FRAME_BYTES_MAX: u32 = 4 * 1024 * 1024 + 4096;
/// Largest node a server may hold.
pub const SERVER_NODE_BYTES_MAX: u64 = 1 << 36;

/// A chain sent to a memory server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainRequest {
    pub tag: u64,
    /// At most `CHAIN_VERBS_MAX` (decoding stops at the first verb beyond, so a hostile count
    /// costs no memory).
    #[serde(deserialize_with = "bounded_verbs")]
    pub verbs: Vec<Verb>,
}

fn bounded_verbs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Verb>, D::Error> {
    struct Bounded;
    impl<'de> serde::de::Visitor<'de> for Bounded {
        type Value = Vec<Verb>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a chain of at most {CHAIN_VERBS_MAX} verbs")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Verb>, A::Error> {
            let mut verbs = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(CHAIN_VERBS_MAX));
            while let Some(v) = seq.next_element()? {
                if verbs.len() == CHAIN_VERBS_MAX {
                    return Err(serde::de::Error::custom(format!("more than {CHAIN_VERBS_MAX} verbs in a chain")));
                }
                verbs.push(v);
            }
            Ok(verbs)
        }
    }
    d.deserialize_seq(Bounded)
}

/// A memory server's answer to one [`ChainRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainReply {
    pub tag: u64,
    pub result: Result<Vec<VerbOutcome>, VerbError>,
}

/// An upper bound on the encoded size of the reply to `verbs` (varints at their longest).
pub fn reply_bytes_bound(verbs: &[Verb]) -> u64 {
    let per_verb: u64 = verbs
        .iter()
        .map(|v| match v {
            Verb::Read { len, .. } => 16 + u64::from(*len),
            _ => 16,
        })
        .sum();
    64 + per_verb
}

/// Reads one frame with blocking I/O: `Ok(None)` on a clean end of stream between frames.
/// Returns the whole frame; its payload is `frame[HEADER_LEN..]`. Allocates only after the
/// header (and so the length) passed kairos-net's checks.
pub fn read_frame_blocking<R: Read>(r: &mut R, max: u32) -> Result<Option<(FrameKind, Vec<u8>)>, FrameError> {
    let mut head = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        let n = match r.read(&mut head[filled..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FrameError::Io(e)),
        };
        if n == 0 {
            return if filled == 0 { Ok(None) } else { Err(FrameError::Truncated("inside a frame header")) };
        }
        filled += n;
    }
    let header = decode_header(&head, max)?;
    let mut frame = vec![0u8; HEADER_LEN + header.len as usize];
    frame[..HEADER_LEN].copy_from_slice(&head);
    r.read_exact(&mut frame[HEADER_LEN..]).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => FrameError::Truncated("inside a frame payload"),
        _ => FrameError::Io(e),
    })?;
    let (kind, _, _) = decode_frame(&frame, max)?;
    Ok(Some((kind, frame)))
}

// ------------------------------------------------------------------------------------------
// Server
// ------------------------------------------------------------------------------------------

/// How a memory server runs.
#[derive(Clone, Debug)]
pub struct MemoryServerConfig {
    /// Node size in bytes (rounded up to whole words).
    pub bytes: u64,
    /// Connections served at once; more are closed as soon as they are accepted.
    pub connections_max: usize,
    /// A connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
}

impl MemoryServerConfig {
    /// `bytes` bytes, 256 connections, 10 minutes idle timeout.
    pub fn new(bytes: u64) -> Self {
        MemoryServerConfig { bytes, connections_max: 256, idle_timeout: Duration::from_secs(600) }
    }
}

/// Counters a server keeps (for tests and the exit line of `kairos serve swarm-memory`).
#[derive(Debug, Default)]
pub struct ServerStats {
    pub connections_accepted: AtomicU64,
    pub connections_refused: AtomicU64,
    pub connections_closed_malformed: AtomicU64,
    pub chains_executed: AtomicU64,
}

struct ServerShared {
    memory: Box<[AtomicU64]>,
    stop: AtomicBool,
    conns: Mutex<HashMap<u64, TcpStream>>,
    live: AtomicUsize,
    stats: ServerStats,
    config: MemoryServerConfig,
}

/// A running memory server: one node's bytes behind a TCP listener.
pub struct MemoryServer {
    addr: SocketAddr,
    shared: Arc<ServerShared>,
    accept: Option<JoinHandle<()>>,
}

impl MemoryServer {
    /// Binds `listen` (e.g. `127.0.0.1:0`) and serves a zeroed node of `config.bytes` bytes on
    /// background threads until [`MemoryServer::kill`] or drop.
    pub fn start(listen: &str, config: MemoryServerConfig) -> Result<Self, BackendError> {
        let net_err = |what: String| BackendError::Net { addr: listen.to_string(), what };
        if config.bytes == 0 || config.bytes > SERVER_NODE_BYTES_MAX {
            return Err(net_err(format!("--bytes {} is not in 1..={SERVER_NODE_BYTES_MAX}", config.bytes)));
        }
        if config.connections_max == 0 {
            return Err(net_err("connections_max must be at least 1".into()));
        }
        let listener =
            TcpListener::bind(listen).map_err(|e| net_err(format!("cannot listen ({e}); pick a free address")))?;
        let addr = listener.local_addr().map_err(|e| net_err(e.to_string()))?;
        let memory = zeroed_words(config.bytes)
            .ok_or_else(|| net_err(format!("cannot allocate {} bytes of node memory: lower --bytes", config.bytes)))?;
        let shared = Arc::new(ServerShared {
            memory,
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            live: AtomicUsize::new(0),
            stats: ServerStats::default(),
            config,
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name(format!("swarm-mem-accept-{}", addr.port()))
            .spawn(move || accept_loop(listener, s))
            .map_err(|e| net_err(format!("cannot start the accept thread: {e}")))?;
        Ok(MemoryServer { addr, shared, accept: Some(accept) })
    }

    /// The address the server listens on (with the real port when started on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stats(&self) -> &ServerStats {
        &self.shared.stats
    }

    /// Connections being served now.
    pub fn connections_live(&self) -> usize {
        self.shared.live.load(Ordering::Acquire)
    }

    /// Blocks until the server is killed (for `kairos serve swarm-memory`).
    pub fn wait(mut self) {
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }

    /// Crashes the node: stops accepting, closes every connection, and waits (at most 2 s) for
    /// their threads to finish. Chains in flight get no reply.
    pub fn kill(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wake the blocking accept with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(if wake.is_ipv4() { [127, 0, 0, 1].into() } else { std::net::Ipv6Addr::LOCALHOST.into() });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        if let Ok(conns) = self.shared.conns.lock() {
            for s in conns.values() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        for _ in 0..200 {
            if self.shared.live.load(Ordering::Acquire) == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for MemoryServer {
    fn drop(&mut self) {
        if self.accept.is_some() {
            self.kill();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<ServerShared>) {
    let mut next_id = 0u64;
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(stream) = stream else {
            // Out of descriptors or a connection reset before accept: back off and go on.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if shared.live.load(Ordering::Acquire) >= shared.config.connections_max {
            shared.stats.connections_refused.fetch_add(1, Ordering::Relaxed);
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        }
        let id = next_id;
        next_id += 1;
        let Ok(registered) = stream.try_clone() else { continue };
        if let Ok(mut conns) = shared.conns.lock() {
            conns.insert(id, registered);
        }
        shared.live.fetch_add(1, Ordering::AcqRel);
        shared.stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
        let s = shared.clone();
        let spawned = std::thread::Builder::new().name(format!("swarm-mem-conn-{id}")).spawn(move || {
            serve_connection(stream, &s);
            if let Ok(mut conns) = s.conns.lock() {
                conns.remove(&id);
            }
            s.live.fetch_sub(1, Ordering::AcqRel);
        });
        if spawned.is_err() {
            if let Ok(mut conns) = shared.conns.lock() {
                if let Some(s) = conns.remove(&id) {
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
            shared.live.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Why a connection was closed.
#[derive(Debug)]
enum Close {
    Clean,
    Malformed(String),
    Io,
}

fn serve_connection(stream: TcpStream, shared: &ServerShared) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(shared.config.idle_timeout));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let memory = AtomicWords::new(&shared.memory);
    let close = loop {
        if shared.stop.load(Ordering::Acquire) {
            break Close::Clean;
        }
        let (kind, frame) = match read_frame_blocking(&mut reader, MEM_FRAME_BYTES_MAX) {
            Ok(Some(f)) => f,
            Ok(None) => break Close::Clean,
            Err(FrameError::Io(_)) => break Close::Io,
            Err(e) => break Close::Malformed(e.to_string()),
        };
        if kind != FrameKind::Msg {
            break Close::Malformed(format!("frame kind {kind:?}: a memory server takes only Msg frames"));
        }
        let request: ChainRequest = match decode_payload(&frame[HEADER_LEN..]) {
            Ok(r) => r,
            Err(e) => break Close::Malformed(format!("not a chain request: {e}")),
        };
        let bound = reply_bytes_bound(&request.verbs);
        if bound > u64::from(MEM_FRAME_BYTES_MAX) {
            break Close::Malformed(format!(
                "the reply to this chain could need {bound} bytes, over the {MEM_FRAME_BYTES_MAX}-byte frame limit"
            ));
        }
        let reply = ChainReply { tag: request.tag, result: execute(&memory, &request.verbs) };
        shared.stats.chains_executed.fetch_add(1, Ordering::Relaxed);
        let Ok(bytes) = encode(FrameKind::Msg, &reply, MEM_FRAME_BYTES_MAX) else {
            break Close::Malformed("reply does not fit a frame".into());
        };
        if writer.write_all(&bytes).is_err() {
            break Close::Io;
        }
    };
    if let Close::Malformed(why) = &close {
        shared.stats.connections_closed_malformed.fetch_add(1, Ordering::Relaxed);
        let peer = writer.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
        tracing::warn!("memory server: closing the connection from {peer}: {why}");
    }
    let _ = writer.shutdown(Shutdown::Both);
}

/// Applies a chain verb by verb (no lock across verbs), stopping at the first refused verb.
pub fn execute(memory: &AtomicWords<'_>, verbs: &[Verb]) -> Result<Vec<VerbOutcome>, VerbError> {
    if verbs.len() > CHAIN_VERBS_MAX {
        return Err(VerbError::ChainTooLong(verbs.len()));
    }
    verbs.iter().map(|v| memory.apply(v)).collect()
}

// ------------------------------------------------------------------------------------------
// Client
// ------------------------------------------------------------------------------------------

/// Memory nodes served by memory servers at known addresses (node i at `addrs[i]`).
#[derive(Clone, Debug)]
pub struct TcpBackend {
    addrs: Vec<SocketAddr>,
    pub connect_timeout: Duration,
    /// A write blocked this long marks the node crashed for this port.
    pub write_timeout: Duration,
}

impl TcpBackend {
    pub fn new(addrs: Vec<SocketAddr>) -> Self {
        TcpBackend { addrs, connect_timeout: Duration::from_secs(1), write_timeout: Duration::from_secs(2) }
    }

    /// Resolves `host:port` strings, one per node.
    pub fn resolve(addrs: &[String]) -> Result<Self, BackendError> {
        let addrs = addrs
            .iter()
            .map(|a| {
                a.to_socket_addrs().ok().and_then(|mut i| i.next()).ok_or_else(|| BackendError::Net {
                    addr: a.clone(),
                    what: "does not resolve to an address (expected host:port)".into(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(addrs))
    }

    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }
}

impl MemoryBackend for TcpBackend {
    fn nodes(&self) -> u32 {
        self.addrs.len() as u32
    }

    fn connect(&self, _client: u32) -> Result<Box<dyn MemoryPort>, BackendError> {
        Ok(Box::new(TcpPort::connect(self)?))
    }

    fn name(&self) -> &'static str {
        "tcp"
    }
}

struct NodeConn {
    /// The write half; `None` once the node is known crashed.
    stream: Option<TcpStream>,
    alive: Arc<AtomicBool>,
    /// Chains submitted and not yet handed out by `poll` (so the reply channel, sized for
    /// `PORT_IN_FLIGHT_MAX` per node, never fills and a reader thread never blocks on it).
    in_flight: usize,
    reader: Option<JoinHandle<()>>,
}

/// One client's connections to every memory server.
pub struct TcpPort {
    conns: Vec<NodeConn>,
    done: Receiver<Completion>,
    /// Completions the port makes itself (chains refused before sending).
    refused: std::collections::VecDeque<Completion>,
}

impl TcpPort {
    pub fn connect(backend: &TcpBackend) -> Result<Self, BackendError> {
        let (tx, rx) = sync_channel(PORT_IN_FLIGHT_MAX * backend.addrs.len().max(1));
        let mut conns = Vec::with_capacity(backend.addrs.len());
        for (node, addr) in backend.addrs.iter().enumerate() {
            conns.push(connect_node(node as MemNodeId, *addr, backend, tx.clone()));
        }
        Ok(TcpPort { conns, done: rx, refused: std::collections::VecDeque::new() })
    }

    /// Whether this port still believes `node` is up.
    pub fn node_alive(&self, node: MemNodeId) -> bool {
        self.conns.get(node as usize).is_some_and(|c| c.alive.load(Ordering::Acquire))
    }
}

fn connect_node(node: MemNodeId, addr: SocketAddr, backend: &TcpBackend, tx: SyncSender<Completion>) -> NodeConn {
    let alive = Arc::new(AtomicBool::new(false));
    let dead = NodeConn { stream: None, alive: alive.clone(), in_flight: 0, reader: None };
    let Ok(stream) = TcpStream::connect_timeout(&addr, backend.connect_timeout) else {
        tracing::warn!("memory node {node} at {addr} is unreachable: treating it as crashed");
        return dead;
    };
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(backend.write_timeout));
    let Ok(read_half) = stream.try_clone() else { return dead };
    alive.store(true, Ordering::Release);
    let a = alive.clone();
    let reader = std::thread::Builder::new()
        .name(format!("swarm-port-node{node}"))
        .spawn(move || read_replies(node, read_half, a, tx))
        .ok();
    if reader.is_none() {
        alive.store(false, Ordering::Release);
        let _ = stream.shutdown(Shutdown::Both);
        return dead;
    }
    NodeConn { stream: Some(stream), alive, in_flight: 0, reader }
}

fn read_replies(node: MemNodeId, stream: TcpStream, alive: Arc<AtomicBool>, tx: SyncSender<Completion>) {
    let mut reader = BufReader::with_capacity(64 * 1024, &stream);
    loop {
        let frame = match read_frame_blocking(&mut reader, MEM_FRAME_BYTES_MAX) {
            Ok(Some((FrameKind::Msg, frame))) => frame,
            Ok(None) | Err(FrameError::Io(_)) => break,
            Ok(Some((kind, _))) => {
                tracing::warn!("memory node {node} sent a {kind:?} frame: dropping the connection");
                break;
            }
            Err(e) => {
                tracing::warn!("memory node {node} sent a bad frame ({e}): dropping the connection");
                break;
            }
        };
        let reply: ChainReply = match decode_payload(&frame[HEADER_LEN..]) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("memory node {node} sent a bad reply ({e}): dropping the connection");
                break;
            }
        };
        if tx.send(Completion { tag: reply.tag, node, result: reply.result }).is_err() {
            break; // the port is gone
        }
    }
    alive.store(false, Ordering::Release);
    let _ = stream.shutdown(Shutdown::Both);
}

impl MemoryPort for TcpPort {
    fn nodes(&self) -> u32 {
        self.conns.len() as u32
    }

    fn submit(&mut self, tag: u64, chain: Chain) -> Result<(), BackendError> {
        let nodes = self.conns.len() as u32;
        let node = chain.node;
        let conn = self.conns.get_mut(node as usize).ok_or(BackendError::NoSuchNode { node, nodes })?;
        let verbs = chain.verbs.len();
        if verbs > CHAIN_VERBS_MAX {
            // Refused here, as every backend refuses it (the server would close the connection).
            if self.refused.len() >= PORT_IN_FLIGHT_MAX {
                return Err(BackendError::TooManyInFlight { node, in_flight: self.refused.len() });
            }
            self.refused.push_back(Completion { tag, node, result: Err(VerbError::ChainTooLong(verbs)) });
            return Ok(());
        }
        let reply_bytes = reply_bytes_bound(&chain.verbs);
        if reply_bytes > u64::from(MEM_FRAME_BYTES_MAX) {
            return Err(BackendError::ChainTooLarge { verbs, bytes: reply_bytes, max: MEM_FRAME_BYTES_MAX });
        }
        let request = ChainRequest { tag, verbs: chain.verbs };
        let frame = encode(FrameKind::Msg, &request, MEM_FRAME_BYTES_MAX).map_err(|e| match e {
            FrameError::Oversized { len, max } => BackendError::ChainTooLarge { verbs, bytes: len, max },
            other => BackendError::Config(format!("cannot encode a chain: {other}")),
        })?;
        if !conn.alive.load(Ordering::Acquire) {
            conn.stream = None;
        }
        let Some(stream) = conn.stream.as_mut() else {
            return Ok(()); // a crashed node: the chain never completes
        };
        if conn.in_flight >= PORT_IN_FLIGHT_MAX {
            return Err(BackendError::TooManyInFlight { node, in_flight: conn.in_flight });
        }
        conn.in_flight += 1;
        if stream.write_all(&frame).is_err() {
            // Dead or stuck server: from now on it is crashed for this port.
            let _ = stream.shutdown(Shutdown::Both);
            conn.alive.store(false, Ordering::Release);
            conn.stream = None;
        }
        Ok(())
    }

    fn poll(&mut self, timeout: Duration) -> Option<Completion> {
        if let Some(c) = self.refused.pop_front() {
            return Some(c);
        }
        let c = if timeout.is_zero() { self.done.try_recv().ok() } else { self.done.recv_timeout(timeout).ok() }?;
        if let Some(conn) = self.conns.get_mut(c.node as usize) {
            conn.in_flight = conn.in_flight.saturating_sub(1);
        }
        Some(c)
    }
}

impl Drop for TcpPort {
    fn drop(&mut self) {
        // Drop the receiver first, so that no reader thread can stay blocked sending to it.
        drop(std::mem::replace(&mut self.done, sync_channel(1).1));
        for c in &mut self.conns {
            if let Some(s) = c.stream.take() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        for c in &mut self.conns {
            if let Some(h) = c.reader.take() {
                let _ = h.join();
            }
        }
    }
}

/// `n` memory servers on loopback, in this process (tests and `kairos bench swarm --backend
/// tcp`). [`TcpCluster::kill`] crashes one.
pub struct TcpCluster {
    servers: Vec<Option<MemoryServer>>,
    backend: TcpBackend,
}

impl TcpCluster {
    pub fn start_loopback(nodes: u32, bytes_per_node: u64) -> Result<Self, BackendError> {
        if nodes == 0 || nodes > 64 {
            return Err(BackendError::Config(format!("{nodes} memory servers: use 1 to 64")));
        }
        let servers = (0..nodes)
            .map(|_| MemoryServer::start("127.0.0.1:0", MemoryServerConfig::new(bytes_per_node)).map(Some))
            .collect::<Result<Vec<_>, _>>()?;
        let addrs = servers.iter().flatten().map(|s| s.local_addr()).collect();
        Ok(TcpCluster { servers, backend: TcpBackend::new(addrs) })
    }

    pub fn backend(&self) -> &TcpBackend {
        &self.backend
    }

    pub fn server(&self, node: MemNodeId) -> Option<&MemoryServer> {
        self.servers.get(node as usize).and_then(|s| s.as_ref())
    }

    /// Crashes memory node `node` (its server closes every connection and stops).
    pub fn kill(&mut self, node: MemNodeId) {
        if let Some(mut s) = self.servers.get_mut(node as usize).and_then(|s| s.take()) {
            s.kill();
        }
    }
}
