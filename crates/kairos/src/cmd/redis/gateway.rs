//! The Redis-protocol gateway: a Tiga coordinator that serves RESP2 (and, after `HELLO 3`,
//! RESP3) clients.
//!
//! [`GatewayRole`] wraps the sans-IO [`Coordinator`] (it is the node's role under the TCP
//! host) and remembers, per submitted transaction, where its result goes. Client connections
//! run in their own tasks: they parse commands ([`super::resp`], [`super::commands`]) and hand
//! transactions to the role as host calls ([`kairos_net::Call`]); the role answers through a
//! oneshot channel when the coordinator reports the transaction finished.
//!
//! Per connection, commands are answered in order. Consecutive data commands that are already
//! buffered (a pipeline) run as **one** transaction, up to the coordinator's limits — atomic and
//! in order, which is stronger than Redis promises for a pipeline and costs one commit instead
//! of one per command. MULTI … EXEC is one transaction; its replies come back as EXEC's array.
//!
//! Limits: connections at once (`max_clients`; an extra one is told
//! `-ERR max number of clients reached` and closed), commands taken from one read of a
//! pipeline (`pipeline_max`; the rest wait in the socket, so TCP pushes back), commands queued
//! in one MULTI and their bytes (`ops_per_txn_max` and `txn_bytes_max` of the coordinator; a
//! command without operations counts as one), how long a connection may stay silent or leave a
//! command incomplete (`idle_timeout`, `partial_command_timeout`), and the RESP limits of
//! [`super::resp::Limits`]. A protocol error answers `-ERR Protocol error: …` and closes that
//! connection only.

use super::commands::{self, Command, ConnInfo, DataCmd, Shape};
use super::resp::{self, Limits, Reply};
use kairos_core::{Ctx, NodeId, Process, TimerId};
use kairos_net::Call;
use kairos_tiga::coordinator::{Coordinator, TxnError};
use kairos_tiga::ops::{Op, OpOutput};
use kairos_tiga::{TigaMsg, TxnId};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// A transaction's result as a connection sees it: each operation's output, `Ok(None)` if the
/// outcome is unknown (the coordinator gave up), or why it was refused.
pub type TxnResult = Result<Option<Vec<OpOutput>>, TxnError>;

/// The gateway's role: a coordinator plus where each transaction's result goes.
pub struct GatewayRole {
    coordinator: Coordinator,
    waiting: BTreeMap<TxnId, oneshot::Sender<TxnResult>>,
}

impl GatewayRole {
    pub fn new(coordinator: Coordinator) -> Self {
        GatewayRole { coordinator: coordinator.with_completions(), waiting: BTreeMap::new() }
    }

    /// Submits `ops`; `done` receives the result.
    pub fn submit(&mut self, ctx: &mut Ctx<'_, TigaMsg>, ops: Vec<Op>, done: oneshot::Sender<TxnResult>) {
        match self.coordinator.submit(ctx, ops) {
            Ok(txn) => {
                self.waiting.insert(txn, done);
            }
            Err(e) => {
                let _ = done.send(Err(e));
            }
        }
    }

    fn deliver(&mut self) {
        for c in self.coordinator.take_completions() {
            if let Some(done) = self.waiting.remove(&c.txn) {
                // A client that went away no longer listens; the transaction still counted.
                let _ = done.send(Ok(c.outputs));
            }
        }
    }
}

impl Process for GatewayRole {
    type Msg = TigaMsg;
    fn on_start(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        self.coordinator.on_start(ctx);
        self.deliver();
    }
    fn on_message(&mut self, ctx: &mut Ctx<'_, TigaMsg>, from: NodeId, msg: TigaMsg) {
        self.coordinator.on_message(ctx, from, msg);
        self.deliver();
    }
    fn on_timer(&mut self, ctx: &mut Ctx<'_, TigaMsg>, timer: TimerId) {
        self.coordinator.on_timer(ctx, timer);
        self.deliver();
    }
}

/// How long a started command may go without progress before its connection is closed.
pub const PARTIAL_COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The query-buffer limit for a coordinator whose transactions hold at most `txn_bytes_max`
/// bytes: 64 MiB, or 4 × `txn_bytes_max` if more. A command that large could never run as a
/// transaction anyway; the limit is well above it so that such a command is still answered with
/// the transaction limit, not cut off, unless it is far past it.
pub fn query_bytes_max(txn_bytes_max: usize) -> usize {
    (64 << 20).max(txn_bytes_max.saturating_mul(4))
}

/// How the RESP listener serves.
#[derive(Clone, Debug)]
pub struct RedisOptions {
    pub limits: Limits,
    pub max_clients: usize,
    pub pipeline_max: usize,
    /// Operations one transaction may hold (the coordinator's `ops_per_txn_max`), and distinct
    /// keys (`keys_per_txn_max`): a pipeline batch stays within both.
    pub ops_per_txn_max: usize,
    pub keys_per_txn_max: usize,
    pub txn_bytes_max: usize,
    /// Most bytes one connection may have buffered for a command that is not complete yet
    /// (Redis's `client-query-buffer-limit`; see [`query_bytes_max`]). Past it the client is told
    /// `-ERR Protocol error: query buffer of N bytes exceeds the limit of M bytes` and
    /// disconnected: one command of three 500 MiB bulk strings grew the gateway to 2 GB before.
    pub query_bytes_max: usize,
    /// A connection that sends nothing for this long is closed (Redis's `timeout`; `None`:
    /// never), and one whose started command makes no progress for `partial_command_timeout`
    /// is told so and closed: neither holds one of the `max_clients` permits forever.
    pub idle_timeout: Option<std::time::Duration>,
    pub partial_command_timeout: std::time::Duration,
    /// The INFO reply.
    pub info: String,
}

/// Serves RESP clients on `listener` until the task is dropped, submitting transactions
/// through `calls` into the gateway's role.
pub async fn serve_redis(listener: TcpListener, calls: mpsc::Sender<Call<GatewayRole>>, opts: Arc<RedisOptions>) {
    let permits = Arc::new(Semaphore::new(opts.max_clients.max(1)));
    let ids = Arc::new(AtomicU64::new(1));
    loop {
        let (mut stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("redis listener: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tokio::spawn(async move {
                let _ = stream.write_all(b"-ERR max number of clients reached\r\n").await;
            });
            continue;
        };
        let (calls, opts, id) = (calls.clone(), opts.clone(), ids.fetch_add(1, Ordering::Relaxed));
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            if let Err(e) = Connection::new(id, calls, opts).run(stream).await {
                tracing::debug!(%peer, "redis connection closed: {e}");
            }
            drop(permit);
        });
    }
}

/// One client connection's state.
struct Connection {
    id: u64,
    calls: mpsc::Sender<Call<GatewayRole>>,
    opts: Arc<RedisOptions>,
    name: Option<Vec<u8>>,
    /// Replies in RESP3 (after `HELLO 3`).
    resp3: bool,
    /// Inside MULTI: the queued commands, and whether one was refused (EXEC then aborts).
    multi: Option<(Vec<DataCmd>, bool)>,
}

/// What to do after answering a batch of commands.
#[derive(PartialEq)]
enum After {
    Continue,
    Close,
}

impl Connection {
    fn new(id: u64, calls: mpsc::Sender<Call<GatewayRole>>, opts: Arc<RedisOptions>) -> Self {
        Connection { id, calls, opts, name: None, resp3: false, multi: None }
    }

    async fn run(mut self, mut stream: TcpStream) -> std::io::Result<()> {
        let mut buf: Vec<u8> = Vec::with_capacity(16 << 10);
        let mut chunk = vec![0u8; 64 << 10];
        let mut out: Vec<u8> = Vec::with_capacity(16 << 10);
        // How far the incomplete command at the front of `buf` was checked.
        let mut scan = resp::Scan::default();
        loop {
            // Take the complete commands already buffered (at most pipeline_max).
            let mut cmds: Vec<resp::Args> = Vec::new();
            let mut used = 0;
            let mut error = None;
            while cmds.len() < self.opts.pipeline_max.max(1) {
                match resp::parse_command(&buf[used..], &self.opts.limits, &mut scan) {
                    Ok(Some((args, n))) => {
                        used += n;
                        if !args.is_empty() {
                            cmds.push(args);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            buf.drain(..used);
            let after = self.answer(cmds, &mut out).await;
            if let Some(e) = &error {
                resp::encode_as(self.resp3, &Reply::err(format!("ERR Protocol error: {e}")), &mut out);
            }
            if !out.is_empty() {
                stream.write_all(&out).await?;
                out.clear();
            }
            if error.is_some() || after == After::Close {
                return Ok(());
            }
            if used > 0 {
                // Something was parsed: more complete commands may be buffered.
                continue;
            }
            let wait = if buf.is_empty() { self.opts.idle_timeout } else { Some(self.opts.partial_command_timeout) };
            let read = stream.read(&mut chunk);
            let n = match wait {
                None => read.await?,
                Some(d) => match tokio::time::timeout(d, read).await {
                    Ok(n) => n?,
                    Err(_) if buf.is_empty() => return Ok(()),
                    Err(_) => {
                        let e = format!("ERR Protocol error: the command stayed incomplete for {d:?}");
                        resp::encode_as(self.resp3, &Reply::err(e), &mut out);
                        stream.write_all(&out).await?;
                        return Ok(());
                    }
                },
            };
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
            // `buf` holds one incomplete command here: what was complete was taken above.
            if buf.len() > self.opts.query_bytes_max {
                let e = format!(
                    "ERR Protocol error: query buffer of {} bytes exceeds the limit of {} bytes",
                    buf.len(),
                    self.opts.query_bytes_max
                );
                resp::encode_as(self.resp3, &Reply::err(e), &mut out);
                stream.write_all(&out).await?;
                return Ok(());
            }
        }
    }

    /// Answers `cmds` in order into `out`.
    async fn answer(&mut self, cmds: Vec<resp::Args>, out: &mut Vec<u8>) -> After {
        // A run of data commands outside MULTI, waiting to go as one transaction.
        let mut batch: Vec<DataCmd> = Vec::new();
        for args in cmds {
            let info = ConnInfo { id: self.id, name: self.name.as_deref(), info: &self.opts.info };
            let cmd = commands::parse(&args, &info);
            if let Some((queued, dirty)) = self.multi.as_mut() {
                let reply = match cmd {
                    Command::Data(d) => {
                        // Every queued command counts (one without operations, such as ECHO,
                        // as one), and so do its bytes: the queue is bounded before EXEC.
                        let (ops, bytes) = queued
                            .iter()
                            .chain([&d])
                            .fold((0, 0), |(o, b), c| (o + c.ops.len().max(1), b + c.queued_bytes()));
                        if ops > self.opts.ops_per_txn_max || bytes > self.opts.txn_bytes_max {
                            *dirty = true;
                            Reply::err(format!(
                                "ERR a transaction may hold at most {} operations and {} bytes",
                                self.opts.ops_per_txn_max, self.opts.txn_bytes_max
                            ))
                        } else {
                            queued.push(d);
                            Reply::Simple("QUEUED".into())
                        }
                    }
                    Command::Multi => Reply::err("ERR MULTI calls can not be nested"),
                    Command::Watch => Reply::err("ERR WATCH inside MULTI is not allowed"),
                    Command::Discard => {
                        self.multi = None;
                        Reply::ok()
                    }
                    Command::Exec => {
                        let Some((queued, dirty)) = self.multi.take() else { continue };
                        if dirty {
                            Reply::err("EXECABORT Transaction discarded because of previous errors.")
                        } else {
                            match self.run_txn(&queued).await {
                                Ok(replies) => Reply::Array(replies),
                                Err(e) => e,
                            }
                        }
                    }
                    Command::Quit => {
                        resp::encode_as(self.resp3, &Reply::ok(), out);
                        return After::Close;
                    }
                    Command::Error(e) => {
                        *dirty = true;
                        Reply::Error(e)
                    }
                    // Connection commands inside MULTI run at once (Kairos does not queue them).
                    other => self.connection_command(other),
                };
                resp::encode_as(self.resp3, &reply, out);
                continue;
            }
            match cmd {
                Command::Data(d) => {
                    let (ops, bytes) = batch.iter().chain([&d]).fold((0, 0), |(o, b), c| {
                        (o + c.ops.len(), b + c.ops.iter().map(Op::payload_bytes).sum::<usize>())
                    });
                    let fits = ops <= self.opts.ops_per_txn_max.min(self.opts.keys_per_txn_max)
                        && bytes <= self.opts.txn_bytes_max / 2;
                    if !fits {
                        self.flush(&mut batch, out).await;
                    }
                    batch.push(d);
                }
                other => {
                    self.flush(&mut batch, out).await;
                    let reply = match other {
                        Command::Multi => {
                            self.multi = Some((Vec::new(), false));
                            Reply::ok()
                        }
                        Command::Exec => Reply::err("ERR EXEC without MULTI"),
                        Command::Discard => Reply::err("ERR DISCARD without MULTI"),
                        Command::Watch => Reply::err(
                            "ERR not supported: transactions are one-shot in Kairos (no WATCH); \
                             put the reads and writes in one MULTI/EXEC",
                        ),
                        Command::Quit => {
                            resp::encode_as(self.resp3, &Reply::ok(), out);
                            return After::Close;
                        }
                        Command::Error(e) => Reply::Error(e),
                        other => self.connection_command(other),
                    };
                    resp::encode_as(self.resp3, &reply, out);
                }
            }
        }
        self.flush(&mut batch, out).await;
        After::Continue
    }

    /// HELLO and CLIENT SETNAME / GETNAME.
    fn connection_command(&mut self, cmd: Command) -> Reply {
        match cmd {
            Command::Hello { proto, name } => {
                match proto {
                    None => {}
                    Some(2) => self.resp3 = false,
                    Some(3) => self.resp3 = true,
                    Some(_) => return Reply::err("NOPROTO sorry, this protocol version is not supported"),
                }
                if let Some(n) = name {
                    self.name = Some(n);
                }
                let b = Reply::bulk;
                Reply::Map(vec![
                    (b("server"), b("redis")),
                    (b("version"), b(commands::REDIS_VERSION)),
                    (b("proto"), Reply::Int(if self.resp3 { 3 } else { 2 })),
                    (b("id"), Reply::Int(self.id as i64)),
                    (b("mode"), b("standalone")),
                    (b("role"), b("master")),
                    (b("modules"), Reply::Array(Vec::new())),
                ])
            }
            Command::ClientSetName(n) => {
                self.name = (!n.is_empty()).then_some(n);
                Reply::ok()
            }
            Command::ClientGetName => self.name.clone().map_or(Reply::Nil, Reply::Bulk),
            _ => Reply::err("ERR unexpected command"),
        }
    }

    /// Runs the batched data commands as one transaction and answers each.
    async fn flush(&mut self, batch: &mut Vec<DataCmd>, out: &mut Vec<u8>) {
        if batch.is_empty() {
            return;
        }
        let cmds = std::mem::take(batch);
        let resp3 = self.resp3;
        match self.run_txn(&cmds).await {
            Ok(replies) => replies.iter().for_each(|r| resp::encode_as(resp3, r, out)),
            Err(e) => cmds.iter().for_each(|_| resp::encode_as(resp3, &e, out)),
        }
    }

    /// Runs `cmds` as one transaction: each command's reply, or one error for all.
    async fn run_txn(&self, cmds: &[DataCmd]) -> Result<Vec<Reply>, Reply> {
        let ops: Vec<Op> = cmds.iter().flat_map(|c| c.ops.iter().cloned()).collect();
        let outputs = if ops.is_empty() {
            Vec::new()
        } else {
            let (tx, rx) = oneshot::channel();
            let call: Call<GatewayRole> = Box::new(move |g: &mut GatewayRole, ctx| g.submit(ctx, ops, tx));
            if self.calls.send(call).await.is_err() {
                return Err(Reply::err("ERR the gateway is shutting down"));
            }
            match rx.await {
                Ok(Ok(Some(outputs))) => outputs,
                Ok(Ok(None)) => {
                    return Err(Reply::err(
                        "ERR transaction outcome unknown: no commit within the retry limit; it may or may not have taken effect",
                    ))
                }
                Ok(Err(e)) => return Err(Reply::err(format!("ERR {e}"))),
                Err(_) => return Err(Reply::err("ERR the gateway is shutting down")),
            }
        };
        let mut replies = Vec::with_capacity(cmds.len());
        let mut at = 0;
        for c in cmds {
            let n = c.ops.len();
            let Some(outs) = outputs.get(at..at + n) else {
                return Err(Reply::err("ERR internal error: a result is missing outputs"));
            };
            replies.push(match &c.shape {
                Shape::Fixed(r) => r.clone(),
                shape => commands::reply(shape, outs),
            });
            at += n;
        }
        Ok(replies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Duration;

    /// A gateway with `opts` on a loopback port of `rt` (its transaction calls go nowhere).
    fn start_gateway(rt: &tokio::runtime::Runtime, opts: Arc<RedisOptions>) -> u16 {
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let (calls, rx) = mpsc::channel(1);
            tokio::spawn(async move {
                let _rx = rx;
                serve_redis(listener, calls, opts).await
            });
            port
        })
    }

    fn opts(max_clients: usize) -> Arc<RedisOptions> {
        Arc::new(RedisOptions {
            limits: Limits::default(),
            max_clients,
            pipeline_max: 1024,
            ops_per_txn_max: 4,
            keys_per_txn_max: 4,
            txn_bytes_max: 4096,
            query_bytes_max: 64 << 10,
            idle_timeout: Some(Duration::from_secs(2)),
            partial_command_timeout: Duration::from_millis(500),
            info: String::new(),
        })
    }

    /// A review's inputs: commands without operations (ECHO) were queued without limit, and
    /// writes far past `txn_bytes_max` were held until EXEC refused them.
    #[tokio::test]
    async fn a_multi_queue_is_bounded_in_commands_and_bytes() {
        let (calls, _rx) = mpsc::channel(1);
        let mut c = Connection::new(1, calls, opts(4));
        let mut cmds: Vec<resp::Args> = vec![vec![b"MULTI".to_vec()]];
        for _ in 0..10_000 {
            cmds.push(vec![b"ECHO".to_vec(), vec![b'x'; 100]]);
        }
        let mut out = Vec::new();
        c.answer(cmds, &mut out).await;
        let (queued, dirty) = c.multi.as_ref().expect("inside MULTI");
        assert_eq!((queued.len(), *dirty), (4, true), "four queued, then refused");
        let text = String::from_utf8_lossy(&out);
        assert_eq!(text.matches("+QUEUED").count(), 4, "{}", &text[..200]);
        assert!(text.contains("-ERR a transaction may hold at most 4 operations and 4096 bytes"));

        let mut c = Connection::new(2, mpsc::channel(1).0, opts(4));
        let mut cmds: Vec<resp::Args> = vec![vec![b"MULTI".to_vec()]];
        for i in 0..4u8 {
            cmds.push(vec![b"SET".to_vec(), vec![b'k', i], vec![b'v'; 1 << 20]]);
        }
        cmds.push(vec![b"EXEC".to_vec()]);
        let mut out = Vec::new();
        c.answer(cmds, &mut out).await;
        let text = String::from_utf8_lossy(&out);
        assert!(text.ends_with("-EXECABORT Transaction discarded because of previous errors.\r\n"), "{text}");
        assert!(!text.contains("QUEUED"), "no 1 MiB write was queued: {text}");
    }

    /// A review's schedule: two sockets that send half a command and then nothing held both
    /// permits of `max_clients = 2` forever; now they are closed, and a third client is served.
    /// A silent connection is closed after the idle timeout.
    #[test]
    fn stalled_and_silent_connections_give_their_permits_back() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let port = start_gateway(&rt, opts(2));
        let mut stalled = Vec::new();
        for _ in 0..2 {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(b"*1\r\n$4\r\nPI").unwrap();
            stalled.push(s);
        }
        std::thread::sleep(Duration::from_millis(1_500));
        for s in &mut stalled {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut reply = String::new();
            let _ = s.read_to_string(&mut reply);
            assert!(reply.starts_with("-ERR Protocol error: the command stayed incomplete"), "{reply:?}");
        }
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"PING\r\n").unwrap();
        let mut reply = [0u8; 64];
        let n = c.read(&mut reply).unwrap_or(0);
        assert_eq!(&reply[..n], b"+PONG\r\n", "a third client is served");
        // Silent past the idle timeout: closed (end of stream, no reply).
        let n = c.read(&mut reply).unwrap_or(usize::MAX);
        assert_eq!(n, 0, "the silent connection was closed");
        rt.shutdown_timeout(Duration::from_secs(1));
    }

    /// A review's input: one command of huge bulk strings was buffered whole (2 GB for three of
    /// 500 MiB) before the gateway answered. Past the query-buffer limit the client is told why
    /// and disconnected, while the command is still incomplete; a client within it is served.
    #[test]
    fn a_command_past_the_query_buffer_limit_is_refused_and_disconnected() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let o = opts(4);
        let limit = o.query_bytes_max;
        let port = start_gateway(&rt, o);
        // A bulk string declared far longer than the limit; exactly limit + 1 bytes are sent, so
        // the gateway has read all of them when it refuses (no unread bytes to reset the socket).
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let header = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$500000000\r\n";
        let mut command = header.to_vec();
        command.resize(limit + 1, b'x');
        c.write_all(&command).unwrap();
        let mut reply = String::new();
        let _ = c.read_to_string(&mut reply);
        let want =
            format!("-ERR Protocol error: query buffer of {} bytes exceeds the limit of {limit} bytes\r\n", limit + 1);
        assert_eq!(reply, want, "refused, then closed (end of stream)");
        // Up to the limit a command is buffered: this one, completed, is answered.
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let value = vec![b'v'; limit - 64];
        let mut command = format!("*2\r\n$4\r\nECHO\r\n${}\r\n", value.len()).into_bytes();
        command.extend_from_slice(&value);
        command.extend_from_slice(b"\r\n");
        assert!(command.len() <= limit);
        c.write_all(&command).unwrap();
        let mut reply = [0u8; 128];
        let n = c.read(&mut reply).unwrap();
        let reply = String::from_utf8_lossy(&reply[..n]);
        assert!(n > 0 && !reply.contains("Protocol error"), "answered, not refused: {reply:?}");
        rt.shutdown_timeout(Duration::from_secs(1));
    }
}
