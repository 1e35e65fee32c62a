//! The MongoDB wire-protocol listener of a `causal-member` node (`kairos serve … --mongo-listen
//! ADDR`, or `mongo_addr` in the cluster file): unmodified drivers (pymongo, the Node driver)
//! connect here.
//!
//! One tokio task per connection reads a message header, checks the length (at most
//! `maxMessageSizeBytes`, 48 MB) before reading the rest, parses it with
//! [`kairos_causal::mongo::wire`], and hands the command to the member's state machine through
//! the node's [`kairos_net::LocalPort`] as if sent by a node id of its own (ids above the
//! cluster's). The member answers by sending to that id; a router task passes the answer back
//! to the connection, which writes it as OP_MSG (or OP_REPLY for a legacy OP_QUERY handshake).
//! A connection handles one command at a time, as drivers use them; `moreToCome` requests get
//! no reply.
//!
//! Bad input closes that connection only (a length outside 21 ..= 48 MB, an unknown opCode, a
//! stream that ends inside a message) or gets an error reply on it (invalid BSON, a bad
//! checksum, a malformed section): the node and every other connection go on. Limits:
//! connections open at once, idle time per connection, time to wait for the member's answer.

use crate::cli::ServeArgs;
use crate::CliError;
use kairos_causal::mongo::wire::{self, HEADER_LEN};
use kairos_causal::msg::{MongoReply, MongoRequest};
use kairos_causal::{CausalMsg, Member, MongoSetConfig};
use kairos_core::NodeId;
use kairos_net::{ClusterConfig, LocalSubmitter, NodeOptions};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

/// Driver connections open at once; more are closed at once.
const MAX_CONNECTIONS: usize = 512;
/// A connection that sends nothing for this long is closed (drivers reconnect).
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest wait for the member's answer (its own waits are capped at 60 s).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(90);
/// Replies queued from the node to all connections.
const REPLY_QUEUE: usize = 4_096;
/// Bytes of messages being read or parsed at once over all connections (a message waits for
/// its share, so 512 connections cannot each hold 48 MB).
const INFLIGHT_BYTES_MAX: usize = 256 * 1024 * 1024;

/// The listener of this node, bound now (so `--mongo-listen 127.0.0.1:0` learns its port), or
/// `None` when neither `--mongo-listen` nor the cluster file's `mongo_addr` asks for one.
pub fn listen_addr(
    args: &ServeArgs,
    cfg: &ClusterConfig,
    me: NodeId,
) -> Result<Option<std::net::TcpListener>, CliError> {
    let addr: SocketAddr = match (&args.mongo_listen, cfg.mongo_addr(me)) {
        (Some(a), _) => a.parse().map_err(|e| {
            CliError::Usage(format!("--mongo-listen {a}: {e}; write an IP and port like 127.0.0.1:27017"))
        })?,
        (None, Some(a)) => a,
        (None, None) => return Ok(None),
    };
    let l = std::net::TcpListener::bind(addr).map_err(|e| {
        CliError::Io(format!("cannot listen for MongoDB drivers on {addr}: {e}; is another process using it?"))
    })?;
    Ok(Some(l))
}

/// `hello`'s view of the set: the set name and every member's MongoDB address (this node's
/// from its listener; the others' from `mongo_addr` in the cluster file).
pub fn set_config(
    args: &ServeArgs,
    cfg: &ClusterConfig,
    members: &[NodeId],
    index: usize,
    listener: &std::net::TcpListener,
) -> Result<MongoSetConfig, CliError> {
    let mine = listener.local_addr().map_err(|e| CliError::Io(format!("MongoDB listener: {e}")))?;
    let hosts =
        members
            .iter()
            .enumerate()
            .map(|(i, &m)| {
                if i == index {
                    mine.to_string()
                } else {
                    cfg.mongo_addr(m).map(|a| a.to_string()).unwrap_or_default()
                }
            })
            .collect();
    Ok(MongoSetConfig { set_name: args.mongo_set_name.clone(), hosts })
}

type Routes = Arc<Mutex<HashMap<NodeId, mpsc::Sender<MongoReply>>>>;

/// Runs the member with its MongoDB listener until Ctrl-C or `duration`.
pub async fn serve(
    cfg: Arc<ClusterConfig>,
    me: NodeId,
    member: Member,
    mut opts: NodeOptions,
    duration: Option<Duration>,
    listener: std::net::TcpListener,
) -> Result<(), CliError> {
    opts.history = kairos_net::HistorySink::Discard;
    let (node, port) = kairos_net::spawn_node_with_local_port(cfg, me, member, opts, REPLY_QUEUE)
        .await
        .map_err(|e| CliError::Io(e.to_string()))?;
    listener.set_nonblocking(true).map_err(|e| CliError::Io(format!("MongoDB listener: {e}")))?;
    let listener = TcpListener::from_std(listener).map_err(|e| CliError::Io(format!("MongoDB listener: {e}")))?;
    let mongo_addr = listener.local_addr().map_err(|e| CliError::Io(e.to_string()))?;
    eprintln!("node {me} listening on {}; MongoDB drivers on {mongo_addr}", node.local_addr());
    let (submit, mut replies) = port.split();
    let routes: Routes = Arc::default();
    let router = {
        let routes = routes.clone();
        tokio::spawn(async move {
            while let Some((to, msg)) = replies.recv().await {
                if let CausalMsg::MongoReply(r) = msg {
                    let tx = routes.lock().unwrap_or_else(|e| e.into_inner()).get(&to).cloned();
                    // A closed or full connection loses this reply (the driver times out).
                    if let Some(tx) = tx {
                        let _ = tx.try_send(r);
                    }
                }
            }
        })
    };
    let acceptor = tokio::spawn(accept_loop(listener, submit, routes));
    let end = super::serve::Until { duration, ops: None, history_out: None, flush_each: false };
    super::serve::run_until_stopped(node, me, end, vec![acceptor.abort_handle(), router.abort_handle()]).await
}

async fn accept_loop(listener: TcpListener, submit: LocalSubmitter<CausalMsg>, routes: Routes) {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let budget = Arc::new(Semaphore::new(INFLIGHT_BYTES_MAX));
    let mut next_id = submit.first_client_id();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "MongoDB listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "MongoDB listener: too many connections; closing the new one");
            continue;
        };
        let conn = NodeId(next_id);
        next_id = next_id.checked_add(1).unwrap_or(submit.first_client_id());
        let (submit, routes, budget) = (submit.clone(), routes.clone(), budget.clone());
        tokio::spawn(async move {
            let (tx, rx) = mpsc::channel(16);
            routes.lock().unwrap_or_else(|e| e.into_inner()).insert(conn, tx);
            if let Err(why) = serve_conn(stream, conn, &submit, rx, &budget).await {
                tracing::debug!(%peer, "MongoDB connection closed: {why}");
            }
            routes.lock().unwrap_or_else(|e| e.into_inner()).remove(&conn);
            drop(permit);
        });
    }
}

/// Serves one driver connection until it closes or breaks a rule (the reason is returned).
async fn serve_conn(
    stream: TcpStream,
    conn: NodeId,
    submit: &LocalSubmitter<CausalMsg>,
    mut answers: mpsc::Receiver<MongoReply>,
    budget: &Semaphore,
) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let mut next_request_id: u64 = 0;
    let mut reply_id: i32 = 0;
    loop {
        let mut h = [0u8; HEADER_LEN];
        match tokio::time::timeout(IDLE_TIMEOUT, rd.read_exact(&mut h)).await {
            Err(_) => return Err("idle".into()),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e.to_string()),
            Ok(Ok(_)) => {}
        }
        let header = wire::parse_header(&h).map_err(|e| e.to_string())?;
        // The buffer grows only as bytes arrive: a claimed length costs nothing until sent.
        let want = header.length - HEADER_LEN;
        // `want` is at most 48 MB (checked by parse_header), so it fits a u32.
        let share = budget.acquire_many(want as u32).await.map_err(|e| e.to_string())?;
        let mut body = Vec::with_capacity(want.min(64 * 1024));
        let read = tokio::time::timeout(IDLE_TIMEOUT, (&mut rd).take(want as u64).read_to_end(&mut body)).await;
        match read {
            Ok(Ok(n)) if n == want => {}
            _ => return Err("the stream ended inside a message".into()),
        }
        reply_id = reply_id.wrapping_add(1);
        let req = match wire::parse_message(&header, &body) {
            Ok(r) => r,
            Err(e @ wire::WireError::UnsupportedOpCode(_)) => return Err(e.to_string()),
            Err(e) => {
                let code = if matches!(e, wire::WireError::InvalidBson(_)) { 22 } else { 2 };
                let name = if code == 22 { "InvalidBSON" } else { "BadValue" };
                let doc = bson::doc! { "ok": 0.0, "errmsg": e.to_string(), "code": code, "codeName": name };
                let bytes = if header.op_code == wire::OP_QUERY {
                    wire::encode_op_reply(reply_id, header.request_id, &doc)
                } else {
                    wire::encode_op_msg(reply_id, header.request_id, &doc)
                };
                wr.write_all(&bytes).await.map_err(|e| e.to_string())?;
                continue;
            }
        };
        let mut command = Vec::new();
        req.command.to_writer(&mut command).map_err(|e| e.to_string())?;
        drop(body);
        drop(share);
        next_request_id += 1;
        let id = next_request_id;
        submit.submit(conn, CausalMsg::MongoRequest(MongoRequest { id, command })).await?;
        if req.more_to_come {
            continue;
        }
        let answer = tokio::time::timeout(ANSWER_TIMEOUT, async {
            while let Some(a) = answers.recv().await {
                if a.id == id {
                    return Some(a);
                }
            }
            None
        })
        .await;
        let doc = match answer {
            Ok(Some(a)) => bson::Document::from_reader(&mut a.reply.as_slice()).map_err(|e| e.to_string())?,
            Ok(None) => return Err("the node stopped".into()),
            Err(_) => {
                bson::doc! { "ok": 0.0, "errmsg": "no answer from the member in time", "code": 50, "codeName": "MaxTimeMSExpired" }
            }
        };
        let bytes = if req.legacy {
            wire::encode_op_reply(reply_id, req.request_id, &doc)
        } else {
            wire::encode_op_msg(reply_id, req.request_id, &doc)
        };
        wr.write_all(&bytes).await.map_err(|e| e.to_string())?;
    }
}
