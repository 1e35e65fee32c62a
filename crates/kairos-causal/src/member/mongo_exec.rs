//! MongoDB commands on a member: `hello`, `find` / `getMore` / `killCursors`, `insert` /
//! `update` / `delete`, and the small ones (see [`crate::mongo`] for the subset). A command
//! arrives as [`MongoRequest`] (its BSON bytes) from the member's wire-protocol listener and
//! is answered with [`MongoReply`]; both stay inside the member's process.
//!
//! The causal machinery is the member's own: `$clusterTime` goes through `gossip_in` (a
//! forged or foreign time is refused and the clock does not move); `readConcern
//! {afterClusterTime}` waits like a session read (parked as a waiter, answered when the oplog
//! reaches it, bounded by `maxTimeMS`); writes become one [`Op::Docs`] oplog entry each, and
//! `w: "majority"` (the default, as in MongoDB 5+) waits for the commit point. Every reply
//! carries `operationTime` and `$clusterTime` signed with a majority-committed key, or
//! neither while the member has no such key.
//!
//! Retryable writes: the entry carries the `lsid` + `txnNumber` and the reply; a retry with
//! the same pair gets that reply again without executing (on this member or a later primary:
//! the record is replicated), an older `txnNumber` gets TransactionTooOld (225). A write split
//! over several entries marks all but its last incomplete: a later primary that has only
//! those answers IncompleteTransactionHistory (217) rather than run the write a second time
//! (MongoDB keeps a record per statement and runs only the rest; Kairos does not, yet).
//! A record lives [`LOGICAL_SESSION_TIMEOUT_MINUTES`] past its session's last write, as a
//! session does in MongoDB, whatever the number of other sessions. The time is the primaries'
//! physical clocks as written in the entries (MongoDB's `wall`; never going back: a record
//! counts from the newest clock seen when it was written), not the cluster time: a
//! client allowed to advance the cluster time may move it a year ahead, and by cluster time
//! the next retryable write then dropped every record, so that an in-flight write ran twice
//! when its driver retried it (a review's schedule). With
//! [`MAX_RETRY_RECORDS`] live ones, a new session's retryable write is refused
//! (TooManyLogicalSessions, 261) rather than a live record dropped (dropped by count, a retry
//! after 100,000 other sessions' writes ran a second time: a review's schedule).
//!
//! Cursors belong to the session that opened them: `getMore` and `killCursors` from another
//! session (or none, for a session's cursor) do not reach them (MongoDB: 50737 / 50738), and
//! their ids are drawn at random, so that one client cannot guess another's. A cursor holds
//! its query, not its result: each `getMore` reads on from the `_id` after the last one it
//! returned, at the newest state (the commit point for a majority read), as MongoDB's
//! cursors yield and read on — documents are never returned twice, and those written ahead
//! of the cursor may show. (A copy of the result per cursor let a client pin a thousand
//! collections' worth of memory: a review's note.)

use super::{Member, MemberState, PendingWrite, Waiter, Waiting, MAX_TIME_MS_CAP};
use crate::mongo::wire::{decode_document, MAX_BSON_OBJECT_SIZE, MAX_MESSAGE_SIZE_BYTES};
use crate::mongo::{
    codes, get_count, get_flag, id_key, namespace, project, signed_from_bson, signed_to_bson, timestamp, CmdResult,
    CommandError, Filter, Update,
};
use crate::msg::{CausalMsg, DocWrite, ErrorReply, MongoReply, MongoRequest, Op, RetryRecord, WriteConcern};
use bson::{doc, Bson, Document};
use kairos_clock::{gossip_in, ClusterTime};
use kairos_core::{Ctx, LocalTime, NodeId};
use rand::Rng;
use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::time::Duration;

/// `maxWireVersion` announced (MongoDB 6.0); 0 is the minimum.
pub const MAX_WIRE_VERSION: i32 = 17;
/// `maxWriteBatchSize` announced.
pub const MAX_WRITE_BATCH_SIZE: i32 = 100_000;
/// `logicalSessionTimeoutMinutes` announced.
pub const LOGICAL_SESSION_TIMEOUT_MINUTES: i32 = 30;
/// Open cursors per member, and the bytes of their queries together; the least recently
/// used is dropped beyond either.
const MAX_CURSORS: usize = 1_000;
const MAX_CURSOR_QUERY_BYTES: usize = 64 * 1024 * 1024;
/// An unused cursor is dropped after this long.
const CURSOR_IDLE: Duration = Duration::from_secs(600);
/// Awaitable `hello`s parked at once; beyond this they are answered at once.
const MAX_HELLO_WAITERS: usize = 1_000;
/// Default and largest batch of a cursor, in documents and bytes.
const DEFAULT_BATCH_DOCS: usize = 101;
const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// The replica set as drivers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MongoSetConfig {
    /// `setName`: drivers connect with `replicaSet=NAME`.
    pub set_name: String,
    /// `host:port` of each member's listener, in member-index order (`hosts`, `me`, `primary`).
    pub hosts: Vec<String>,
}

/// A physical clock reading in whole ms (a retry record's `wall_ms`).
fn wall_ms(now: LocalTime) -> u64 {
    now.as_nanos() / 1_000_000
}

/// One version of a document: written at `t`, `None` = deleted.
type Version = (ClusterTime, Option<Document>);

/// The documents of every namespace, with the versions a majority read may still need, and the
/// retryable-write records (rebuilt from the oplog after a rollback).
#[derive(Default)]
pub(super) struct DocStore {
    ns: BTreeMap<String, BTreeMap<Vec<u8>, Vec<Version>>>,
    retry: BTreeMap<Vec<u8>, Retried>,
    /// The retry records by (primary's clock, optime), to drop those older than the session
    /// timeout.
    retry_by_wall: BTreeMap<(u64, ClusterTime), Vec<u8>>,
    /// The latest primary's clock among the entries applied (ms): the retry records' now.
    wall_ms_max: u64,
    /// Deletes whose document is forgotten once the commit point passes them.
    tombstones: VecDeque<(ClusterTime, String, Vec<u8>)>,
}

/// Live retryable-write records (one per session, module docs) beyond which a new session's
/// retryable write is refused. Derived from the oplog alone, so every member keeps the same.
pub const MAX_RETRY_RECORDS: usize = 100_000;
/// A retry record expires this long (ms of the primaries' clocks) after its session's last write.
const RETRY_RECORD_TTL_MS: u64 = LOGICAL_SESSION_TIMEOUT_MINUTES as u64 * 60_000;

#[derive(Clone)]
struct Retried {
    txn_number: i64,
    optime: ClusterTime,
    wall_ms: u64,
    reply: Vec<u8>,
    complete: bool,
}

impl DocStore {
    pub(super) fn apply(
        &mut self,
        ns: &str,
        writes: &[DocWrite],
        retry: Option<&RetryRecord>,
        t: ClusterTime,
        commit_point: ClusterTime,
    ) {
        let coll = self.ns.entry(ns.to_string()).or_default();
        for w in writes {
            let (id, doc) = match w {
                DocWrite::Put { id, doc } => (id, decode_document(doc).ok()),
                DocWrite::Delete { id } => {
                    self.tombstones.push_back((t, ns.to_string(), id.clone()));
                    (id, None)
                }
            };
            let versions = coll.entry(id.clone()).or_default();
            // Keep only the newest version at or below the commit point, and everything after.
            if let Some(i) = versions.iter().rposition(|(vt, _)| *vt <= commit_point) {
                versions.drain(..i);
            }
            versions.push((t, doc));
        }
        if let Some(r) = retry {
            self.record_retry(r, t);
        }
    }

    fn record_retry(&mut self, r: &RetryRecord, t: ClusterTime) {
        // A new primary's clock may be behind an earlier one's: time never goes back here, and
        // a record is as new as the newest clock seen when it was written (else a primary 40
        // minutes behind dropped its own records as it wrote them: a review's schedule).
        self.wall_ms_max = self.wall_ms_max.max(r.wall_ms);
        let now_ms = self.wall_ms_max;
        let rec = Retried {
            txn_number: r.txn_number,
            optime: t,
            wall_ms: now_ms,
            reply: r.reply.clone(),
            complete: r.complete,
        };
        if let Some(old) = self.retry.insert(r.lsid.clone(), rec) {
            self.retry_by_wall.remove(&(old.wall_ms, old.optime));
        }
        self.retry_by_wall.insert((now_ms, t), r.lsid.clone());
        while let Some(entry) = self.retry_by_wall.first_entry().filter(|e| Self::expired(e.key().0, now_ms)) {
            let lsid = entry.remove();
            self.retry.remove(&lsid);
        }
    }

    /// Whether a retry record written at `written_ms` has expired by `now_ms` (primaries' clocks).
    fn expired(written_ms: u64, now_ms: u64) -> bool {
        written_ms.saturating_add(RETRY_RECORD_TTL_MS) < now_ms
    }

    /// Whether a retryable write of a session with no live record may run at `now_ms` (this
    /// primary's clock): the table is not full, or its oldest record expires by then (the
    /// write's entry drops it).
    fn retry_room(&self, now_ms: u64) -> bool {
        let now_ms = now_ms.max(self.wall_ms_max);
        self.retry.len() < MAX_RETRY_RECORDS
            || self.retry_by_wall.keys().next().is_some_and(|(written_ms, _)| Self::expired(*written_ms, now_ms))
    }

    /// Forgets deleted documents whose delete the commit point has passed (no read needs them).
    pub(super) fn compact(&mut self, commit_point: ClusterTime) {
        while self.tombstones.front().is_some_and(|(t, _, _)| *t <= commit_point) {
            let Some((t, ns, id)) = self.tombstones.pop_front() else { break };
            let Some(coll) = self.ns.get_mut(&ns) else { continue };
            if coll.get(&id).and_then(|v| v.last()).is_some_and(|(vt, d)| *vt == t && d.is_none()) {
                coll.remove(&id);
                if coll.is_empty() {
                    self.ns.remove(&ns);
                }
            }
        }
    }

    /// Rollback: forgets versions written at or after `first`; rebuilds the retry records from
    /// what is left of the oplog.
    pub(super) fn truncate_from(&mut self, first: ClusterTime, oplog: &[crate::msg::Entry]) {
        for coll in self.ns.values_mut() {
            for versions in coll.values_mut() {
                while versions.last().is_some_and(|(t, _)| *t >= first) {
                    versions.pop();
                }
            }
            coll.retain(|_, v| !v.is_empty());
        }
        self.tombstones.retain(|(t, _, _)| *t < first);
        self.retry.clear();
        self.retry_by_wall.clear();
        self.wall_ms_max = 0;
        for e in oplog {
            if let Op::Docs { retry: Some(r), .. } = &e.op {
                self.record_retry(r, e.optime);
            }
        }
    }

    fn version_at(versions: &[Version], upto: ClusterTime) -> Option<&Document> {
        versions.iter().rev().find(|(t, _)| *t <= upto).and_then(|(_, d)| d.as_ref())
    }

    fn get(&self, ns: &str, id: &[u8], upto: ClusterTime) -> Option<&Document> {
        self.ns.get(ns)?.get(id).and_then(|v| Self::version_at(v, upto))
    }

    /// Every document of `ns` as of `upto`, in `_id`-key order.
    fn scan<'a>(&'a self, ns: &str, upto: ClusterTime) -> impl Iterator<Item = (&'a Vec<u8>, &'a Document)> + 'a {
        self.scan_range(ns, (Bound::Unbounded, Bound::Unbounded), upto)
    }

    /// The documents of `ns` as of `upto` whose `_id` keys lie in `range`, in key order.
    fn scan_range<'a>(
        &'a self,
        ns: &str,
        range: (Bound<&'a [u8]>, Bound<&'a [u8]>),
        upto: ClusterTime,
    ) -> impl Iterator<Item = (&'a Vec<u8>, &'a Document)> + 'a {
        let coll = self.ns.get(ns).filter(|_| range_is_valid(range));
        coll.into_iter()
            .flat_map(move |c| c.range::<[u8], _>(range))
            .filter_map(move |(k, v)| Self::version_at(v, upto).map(|d| (k, d)))
    }

    /// Number of live documents in `ns` at the newest version (tests).
    pub(super) fn count(&self, ns: &str) -> usize {
        self.scan(ns, ClusterTime::MAX).count()
    }
}

/// A `find` that has more to return (module docs).
struct Cursor {
    /// The `lsid` of the session that opened it (`id_key`), if any.
    owner: Option<Vec<u8>>,
    query: Query,
    /// The `_id` key of the last document returned: the next batch starts after it.
    after: Option<Vec<u8>>,
    /// Matches still to skip (a first batch of size 0 skipped none).
    skip: usize,
    /// Documents the `limit` still allows.
    left: usize,
    /// The bytes of its query, counted against [`MAX_CURSOR_QUERY_BYTES`].
    query_bytes: usize,
    last_used: LocalTime,
    /// When it was last used, in uses of any cursor: the least recently used goes first,
    /// also among those used at one instant.
    use_seq: u64,
}

/// What a `find` asked for, kept by its cursor.
struct Query {
    ns: String,
    filter: Filter,
    projection: Option<Document>,
    /// A majority read: each batch is read at the commit point.
    majority: bool,
}

/// A batch of a query, and whether more is left.
struct Batch {
    docs: Vec<Document>,
    /// The `_id` key of its last document.
    last_key: Option<Vec<u8>>,
    more: bool,
}

struct HelloWaiter {
    client: NodeId,
    id: u64,
    deadline: LocalTime,
    cmd: Document,
}

/// A `find` waiting for its `afterClusterTime`.
pub(super) struct ParkedRead {
    pub(super) id: u64,
    cmd: Document,
    majority: bool,
}

/// What the member keeps for drivers that is not replicated.
#[derive(Default)]
pub(super) struct MongoState {
    /// Start of this process (`topologyVersion.processId`).
    pub(super) started_at: LocalTime,
    cursors: BTreeMap<i64, Cursor>,
    cursor_query_bytes: usize,
    cursor_uses: u64,
    hello_waiters: Vec<HelloWaiter>,
    topology: (bool, Option<u32>),
    topology_counter: i64,
    generated_ids: u64,
}

/// The `$readPreference` allows a secondary (anything but mode `primary`).
fn secondary_ok(cmd: &Document) -> bool {
    cmd.get_document("$readPreference").ok().and_then(|rp| rp.get_str("mode").ok()).is_some_and(|m| m != "primary")
}

/// `readConcern`: (majority?, afterClusterTime).
fn read_concern(cmd: &Document) -> CmdResult<(bool, Option<ClusterTime>)> {
    let Some(rc) = cmd.get("readConcern") else { return Ok((false, None)) };
    let rc = rc.as_document().ok_or_else(|| CommandError::bad_value("readConcern must be a document"))?;
    let majority = match rc.get_str("level").unwrap_or("local") {
        "local" | "available" => false,
        "majority" => true,
        other => {
            return Err(CommandError::bad_value(format!(
                "readConcern level `{other}` is not supported (local, available, majority)"
            )))
        }
    };
    let after = match rc.get("afterClusterTime") {
        None => None,
        Some(b) => Some(
            crate::mongo::cluster_time_of(b)
                .ok_or_else(|| CommandError::bad_value("readConcern.afterClusterTime must be a Timestamp"))?,
        ),
    };
    Ok((majority, after))
}

/// `writeConcern`: `w: 0 | 1` acknowledge on the primary; anything else (and the default)
/// waits for a majority.
fn write_concern(cmd: &Document) -> WriteConcern {
    match cmd.get_document("writeConcern").ok().and_then(|wc| wc.get("w")) {
        Some(Bson::Int32(0 | 1)) | Some(Bson::Int64(0 | 1)) => WriteConcern::W1,
        Some(Bson::Double(w)) if *w <= 1.0 => WriteConcern::W1,
        _ => WriteConcern::Majority,
    }
}

/// Whether `BTreeMap::range` takes `range` without panicking (start after end, or one key
/// excluded at both ends).
fn range_is_valid((from, to): (Bound<&[u8]>, Bound<&[u8]>)) -> bool {
    match (from, to) {
        (Bound::Excluded(a), Bound::Excluded(b)) => a < b,
        (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) => a <= b,
        _ => true,
    }
}

/// The size of a value as BSON (in a one-field document).
fn bson_bytes(v: &Bson) -> usize {
    doc_bytes(&doc! { "": v.clone() }).len()
}

fn doc_bytes(d: &Document) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = d.to_writer(&mut out);
    out
}

fn docs_array(cmd: &Document, field: &str) -> CmdResult<Vec<Document>> {
    let arr = cmd.get_array(field).map_err(|_| CommandError::bad_value(format!("`{field}` must be an array")))?;
    if arr.len() > MAX_WRITE_BATCH_SIZE as usize {
        return Err(CommandError::bad_value(format!("more than {MAX_WRITE_BATCH_SIZE} entries in `{field}`")));
    }
    arr.iter()
        .map(|b| {
            b.as_document().cloned().ok_or_else(|| CommandError::bad_value(format!("`{field}` holds a non-document")))
        })
        .collect()
}

/// A write command's changes before they reach the oplog: what later statements of the same
/// command see, and the writes in order.
#[derive(Default)]
struct Overlay {
    changed: BTreeMap<Vec<u8>, Option<Document>>,
    writes: Vec<DocWrite>,
}

impl Overlay {
    fn put(&mut self, id: Vec<u8>, d: Document) {
        self.writes.push(DocWrite::Put { id: id.clone(), doc: doc_bytes(&d) });
        self.changed.insert(id, Some(d));
    }
    fn delete(&mut self, id: Vec<u8>) {
        self.writes.push(DocWrite::Delete { id: id.clone() });
        self.changed.insert(id, None);
    }
}

impl Member {
    /// Number of documents in namespace `ns` (`db.collection`) as last applied.
    pub fn mongo_document_count(&self, ns: &str) -> usize {
        self.docs.count(ns)
    }

    /// Namespaces that hold documents or versions a read may still need, in order.
    pub fn mongo_namespaces(&self) -> Vec<String> {
        self.docs.ns.keys().cloned().collect()
    }

    pub(super) fn on_mongo(&mut self, ctx: &mut Ctx<'_, CausalMsg>, from: NodeId, req: MongoRequest) {
        self.stats.client_requests += 1;
        let cmd = match decode_document(&req.command) {
            Ok(d) => d,
            Err(e) => return self.mongo_reply_error(ctx, from, req.id, codes::BAD_VALUE, &e.to_string(), false),
        };
        let name = cmd.keys().next().cloned().unwrap_or_default();
        let is_write =
            matches!(name.as_str(), "insert" | "update" | "delete" | "drop" | "findAndModify" | "findandmodify");
        let retryable = is_write && cmd.contains_key("txnNumber");
        if let Err(e) = self.mongo_prepare(ctx, &cmd) {
            return self.mongo_reply_error(ctx, from, req.id, e.code, &e.errmsg, retryable);
        }
        let r = match name.as_str() {
            "hello" | "isMaster" | "ismaster" => return self.mongo_hello(ctx, from, req.id, cmd),
            "ping" | "endSessions" | "refreshSessions" | "killSessions" => Ok(doc! { "ok": 1.0 }),
            "buildInfo" | "buildinfo" => Ok(doc! {
                "version": "6.0.0-kairos",
                "versionArray": [6, 0, 0, 0],
                "gitVersion": "kairos",
                "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE as i32,
                "ok": 1.0,
            }),
            "getParameter" => Ok(doc! { "ok": 1.0 }),
            "insert" | "update" | "delete" | "drop" | "findAndModify" | "findandmodify" => {
                return self.mongo_write(ctx, from, req.id, &name, &cmd)
            }
            "find" | "count" => return self.mongo_find(ctx, from, req.id, cmd),
            "getMore" => match self.mongo_get_more(ctx, &cmd) {
                // A majority cursor's batch is read at the commit point, and says so.
                Ok((body, read_at)) => return self.mongo_send(ctx, from, req.id, body, read_at),
                Err(e) => Err(e),
            },
            "killCursors" => self.mongo_kill_cursors(&cmd),
            _ => Err(CommandError::new(codes::COMMAND_NOT_FOUND, format!("no such command: '{name}'"))),
        };
        match r {
            Ok(body) => {
                let t = self.last_applied();
                self.mongo_send(ctx, from, req.id, body, t)
            }
            Err(e) => self.mongo_reply_error(ctx, from, req.id, e.code, &e.errmsg, false),
        }
    }

    /// What every command does first: `$clusterTime` gossip (refused: the clock does not move)
    /// and the `afterClusterTime` bound.
    fn mongo_prepare(&mut self, ctx: &mut Ctx<'_, CausalMsg>, cmd: &Document) -> CmdResult<()> {
        if let Some(ct) = cmd.get("$clusterTime") {
            let ct = signed_from_bson(ct)?;
            let (trusted, now) = (self.cfg.trusted_clients, ctx.now());
            gossip_in(&mut self.clock, &mut self.validator, &self.keys, &mut self.proofs, &ct, trusted, now)
                .map_err(|e| CommandError::from(&e))?;
        }
        let (_, after) = read_concern(cmd)?;
        if let Some(t) = after {
            self.clock.check_after_cluster_time(t).map_err(|e| CommandError::from(&e))?;
        }
        Ok(())
    }

    /// Sends `body` with `operationTime` and `$clusterTime` (when the member can sign).
    pub(super) fn mongo_send(
        &mut self,
        ctx: &mut Ctx<'_, CausalMsg>,
        to: NodeId,
        id: u64,
        mut body: Document,
        operation_time: ClusterTime,
    ) {
        match self.sign_for_client() {
            Some(ct) => {
                body.insert("operationTime", timestamp(operation_time));
                body.insert("$clusterTime", signed_to_bson(&ct));
            }
            None => self.stats.replies_without_cluster_time += 1,
        }
        self.stats.replies += 1;
        ctx.metric("causal.replies", 1);
        ctx.send(to, CausalMsg::MongoReply(MongoReply { id, reply: doc_bytes(&body) }));
    }

    pub(super) fn mongo_reply_error(
        &mut self,
        ctx: &mut Ctx<'_, CausalMsg>,
        to: NodeId,
        id: u64,
        code: i32,
        errmsg: &str,
        retryable_write: bool,
    ) {
        let mut d = CommandError::new(code, errmsg).to_document();
        if retryable_write && codes::retryable_write(code) {
            d.insert("errorLabels", vec!["RetryableWriteError"]);
        }
        *self.stats.errors.entry(code).or_default() += 1;
        let t = self.last_applied();
        self.mongo_send(ctx, to, id, d, t);
    }

    /// A write that was applied but whose write concern failed (timeout, step-down).
    pub(super) fn mongo_write_concern_error(
        &mut self,
        ctx: &mut Ctx<'_, CausalMsg>,
        to: NodeId,
        id: u64,
        mut body: Document,
        e: &ErrorReply,
        t: ClusterTime,
    ) {
        body.insert(
            "writeConcernError",
            doc! { "code": e.code, "codeName": e.code_name.clone(), "errmsg": e.errmsg.clone() },
        );
        if codes::retryable_write(e.code) {
            body.insert("errorLabels", vec!["RetryableWriteError"]);
        }
        *self.stats.errors.entry(e.code).or_default() += 1;
        self.mongo_send(ctx, to, id, body, t);
    }

    // ----- hello -----

    fn topology_version(&self) -> Document {
        let mut pid = [0u8; 12];
        pid[..8].copy_from_slice(&self.mongo.started_at.0.to_be_bytes());
        pid[8..].copy_from_slice(&self.me.to_be_bytes());
        doc! { "processId": bson::oid::ObjectId::from_bytes(pid), "counter": self.mongo.topology_counter }
    }

    fn hello_doc(&self, now: LocalTime, cmd: &Document) -> Document {
        let primary = self.is_primary();
        let mut d = Document::new();
        if cmd.contains_key("helloOk") {
            d.insert("helloOk", true);
        }
        if cmd.keys().next().is_some_and(|k| k == "hello") {
            d.insert("isWritablePrimary", primary);
        } else {
            d.insert("ismaster", primary);
        }
        d.insert("secondary", !primary && self.state == MemberState::Secondary);
        if let Some(m) = &self.cfg.mongo {
            d.insert("setName", m.set_name.clone());
            d.insert("setVersion", 1);
            d.insert("hosts", m.hosts.iter().filter(|h| !h.is_empty()).cloned().collect::<Vec<_>>());
            if let Some(h) = self.primary.and_then(|p| m.hosts.get(p as usize)).filter(|h| !h.is_empty()) {
                d.insert("primary", h.clone());
            }
            if let Some(h) = m.hosts.get(self.me as usize) {
                d.insert("me", h.clone());
            }
            if primary {
                let mut eid = [0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0];
                eid[4..].copy_from_slice(&self.d.term.to_be_bytes());
                d.insert("electionId", bson::oid::ObjectId::from_bytes(eid));
            }
            let last = timestamp(self.last_applied());
            d.insert("lastWrite", doc! { "opTime": { "ts": last.clone(), "t": self.d.term as i64 }, "majorityOpTime": { "ts": timestamp(self.commit_point), "t": self.d.term as i64 } });
        }
        d.insert("topologyVersion", self.topology_version());
        d.insert("maxBsonObjectSize", MAX_BSON_OBJECT_SIZE as i32);
        d.insert("maxMessageSizeBytes", MAX_MESSAGE_SIZE_BYTES as i32);
        d.insert("maxWriteBatchSize", MAX_WRITE_BATCH_SIZE);
        d.insert("localTime", bson::DateTime::from_millis((now.0 / 1_000_000) as i64));
        d.insert("logicalSessionTimeoutMinutes", LOGICAL_SESSION_TIMEOUT_MINUTES);
        d.insert("minWireVersion", 0);
        d.insert("maxWireVersion", MAX_WIRE_VERSION);
        d.insert("readOnly", false);
        d.insert("ok", 1.0);
        d
    }

    /// `hello`; an awaitable one (with this member's current `topologyVersion` and
    /// `maxAwaitTimeMS`) waits for a topology change or its time.
    fn mongo_hello(&mut self, ctx: &mut Ctx<'_, CausalMsg>, from: NodeId, id: u64, cmd: Document) {
        let awaitable = cmd.get_document("topologyVersion").ok().is_some_and(|tv| *tv == self.topology_version());
        if awaitable && self.mongo.hello_waiters.len() < MAX_HELLO_WAITERS {
            if let Ok(Some(ms)) = get_count(&cmd, "maxAwaitTimeMS") {
                let wait_ms = (ms as u64).min(u64::from(MAX_TIME_MS_CAP));
                let deadline = ctx.now() + Duration::from_millis(wait_ms);
                self.mongo.hello_waiters.push(HelloWaiter { client: from, id, deadline, cmd });
                return;
            }
        }
        let body = self.hello_doc(ctx.now(), &cmd);
        let t = self.last_applied();
        self.mongo_send(ctx, from, id, body, t);
    }

    fn answer_hellos(&mut self, ctx: &mut Ctx<'_, CausalMsg>, all: bool) {
        let now = ctx.now();
        let waiters = std::mem::take(&mut self.mongo.hello_waiters);
        for w in waiters {
            if all || w.deadline <= now {
                let body = self.hello_doc(now, &w.cmd);
                let t = self.last_applied();
                self.mongo_send(ctx, w.client, w.id, body, t);
            } else {
                self.mongo.hello_waiters.push(w);
            }
        }
    }

    /// After every handler: a change of role or primary bumps `topologyVersion.counter` and
    /// answers the waiting `hello`s.
    pub(super) fn mongo_topology_check(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        let now = (self.is_primary(), self.primary);
        if now != self.mongo.topology {
            self.mongo.topology = now;
            self.mongo.topology_counter += 1;
            self.answer_hellos(ctx, true);
        }
    }

    pub(super) fn mongo_tick(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        self.answer_hellos(ctx, false);
        let now = ctx.now();
        let idle: Vec<i64> = self
            .mongo
            .cursors
            .iter()
            .filter(|(_, c)| now.saturating_since(c.last_used) >= CURSOR_IDLE)
            .map(|(id, _)| *id)
            .collect();
        for id in idle {
            self.drop_cursor(id);
        }
    }

    // ----- reads -----

    fn mongo_find(&mut self, ctx: &mut Ctx<'_, CausalMsg>, from: NodeId, id: u64, cmd: Document) {
        let parsed = (|| -> CmdResult<(bool, Option<ClusterTime>, u64)> {
            if !self.is_primary() && !secondary_ok(&cmd) {
                return Err(CommandError::new(codes::NOT_PRIMARY_NO_SECONDARY_OK, "not primary and secondaryOk=false"));
            }
            let name = cmd.keys().next().map_or("find", |k| k.as_str());
            namespace(&cmd, name)?;
            Filter::parse(cmd.get_document(if name == "count" { "query" } else { "filter" }).ok())?;
            if cmd.get_document("sort").is_ok_and(|s| !s.is_empty()) {
                return Err(CommandError::bad_value("sort is not supported by Kairos"));
            }
            let (majority, after) = read_concern(&cmd)?;
            let max_time_ms = get_count(&cmd, "maxTimeMS")?.unwrap_or(i64::from(MAX_TIME_MS_CAP)) as u64;
            Ok((majority, after, max_time_ms.clamp(1, u64::from(MAX_TIME_MS_CAP))))
        })();
        let (majority, after, max_time_ms) = match parsed {
            Ok(p) => p,
            Err(e) => return self.mongo_reply_error(ctx, from, id, e.code, &e.errmsg, false),
        };
        let parked = ParkedRead { id, cmd, majority };
        if self.ready_at(after, majority) {
            self.mongo_answer_parked(ctx, from, parked);
        } else if self.waiters.len() >= self.cfg.max_waiters {
            let e = crate::msg::codes::EXCEEDED_LIMIT;
            self.mongo_reply_error(ctx, from, id, e, "too many reads waiting for afterClusterTime", false);
        } else {
            let deadline = ctx.now() + Duration::from_millis(max_time_ms);
            let what = Waiting::Mongo(Box::new(parked));
            self.waiters.push(Waiter { client: from, deadline, after, majority, what });
            self.want_noop(ctx, after.unwrap_or_default());
        }
    }

    /// Runs a `find` whose `afterClusterTime` has been reached.
    pub(super) fn mongo_answer_parked(&mut self, ctx: &mut Ctx<'_, CausalMsg>, to: NodeId, p: ParkedRead) {
        let (upto, op_time) =
            if p.majority { (self.commit_point, self.commit_point) } else { (ClusterTime::MAX, self.last_applied()) };
        let result = if p.cmd.keys().next().is_some_and(|k| k == "count") {
            self.run_count(&p.cmd, upto)
        } else {
            self.run_find(ctx, &p.cmd, p.majority)
        };
        match result {
            Ok(body) => self.mongo_send(ctx, to, p.id, body, op_time),
            Err(e) => self.mongo_reply_error(ctx, to, p.id, e.code, &e.errmsg, false),
        }
    }

    fn run_find(&mut self, ctx: &mut Ctx<'_, CausalMsg>, cmd: &Document, majority: bool) -> CmdResult<Document> {
        let ns = namespace(cmd, "find")?;
        let query = Query {
            ns: ns.clone(),
            filter: Filter::parse(cmd.get_document("filter").ok())?,
            projection: cmd.get_document("projection").ok().cloned(),
            majority,
        };
        let skip = get_count(cmd, "skip")?.unwrap_or(0) as usize;
        let limit = match get_count(cmd, "limit")? {
            Some(0) | None => usize::MAX,
            Some(n) => n as usize,
        };
        let single_batch = get_flag(cmd, "singleBatch");
        let batch_docs = get_count(cmd, "batchSize")?.map_or(DEFAULT_BATCH_DOCS, |b| b as usize);
        let first = self.read_batch(&query, None, skip, limit, batch_docs)?;
        let cursor_id = if first.more && !single_batch {
            let skip = if first.docs.is_empty() { skip } else { 0 };
            let left = limit - first.docs.len();
            self.open_cursor(ctx, cmd.get("lsid").map(id_key), query, first.last_key, skip, left)
        } else {
            0
        };
        Ok(doc! { "cursor": { "firstBatch": first.docs, "id": cursor_id, "ns": ns }, "ok": 1.0 })
    }

    /// Up to `batch_docs` documents (and [`MAX_BATCH_BYTES`], at least one) of `query` after
    /// the `_id` key `after`, skipping the first `skip` matches and returning at most `left`.
    fn read_batch(
        &self,
        query: &Query,
        after: Option<&[u8]>,
        skip: usize,
        left: usize,
        batch_docs: usize,
    ) -> CmdResult<Batch> {
        let upto = if query.majority { self.commit_point } else { ClusterTime::MAX };
        let id = query.filter.id().map(id_key);
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let range = match &id {
            // One key at most: the `_id` of an equality filter.
            Some(id) => {
                (if after.is_some() { from } else { Bound::Included(id.as_slice()) }, Bound::Included(id.as_slice()))
            }
            None => (from, Bound::Unbounded),
        };
        let mut found =
            self.docs.scan_range(&query.ns, range, upto).filter(|(_, d)| query.filter.matches(d)).skip(skip).peekable();
        let (mut docs, mut bytes, mut last) = (Vec::new(), 0, None::<Vec<u8>>);
        while docs.len() < batch_docs.min(left) {
            let Some((key, d)) = found.peek() else { break };
            let d = project(d, query.projection.as_ref())?;
            let len = doc_bytes(&d).len();
            if !docs.is_empty() && bytes + len > MAX_BATCH_BYTES {
                break;
            }
            bytes += len;
            last = Some(key.to_vec());
            docs.push(d);
            found.next();
        }
        let more = docs.len() < left && found.peek().is_some();
        Ok(Batch { docs, last_key: last, more })
    }

    fn run_count(&self, cmd: &Document, upto: ClusterTime) -> CmdResult<Document> {
        let ns = namespace(cmd, "count")?;
        let filter = Filter::parse(cmd.get_document("query").ok())?;
        let skip = get_count(cmd, "skip")?.unwrap_or(0) as usize;
        let limit = get_count(cmd, "limit")?.filter(|&l| l > 0).map_or(usize::MAX, |l| l as usize);
        let n = self.docs.scan(&ns, upto).filter(|(_, d)| filter.matches(d)).skip(skip).take(limit).count();
        Ok(doc! { "n": n as i64, "ok": 1.0 })
    }

    /// A cursor of session `owner` that reads `query` on after `after`, under a random id
    /// (module docs); beyond [`MAX_CURSORS`] or [`MAX_CURSOR_QUERY_BYTES`] the least recently
    /// used ones go.
    fn open_cursor(
        &mut self,
        ctx: &mut Ctx<'_, CausalMsg>,
        owner: Option<Vec<u8>>,
        query: Query,
        after: Option<Vec<u8>>,
        skip: usize,
        left: usize,
    ) -> i64 {
        let query_bytes = query.ns.len()
            + query.filter.equals.iter().map(|(k, v)| k.len() + bson_bytes(v)).sum::<usize>()
            + query.projection.as_ref().map_or(0, |p| doc_bytes(p).len())
            + after.as_ref().map_or(0, Vec::len);
        while self.mongo.cursors.len() >= MAX_CURSORS
            || self.mongo.cursor_query_bytes + query_bytes > MAX_CURSOR_QUERY_BYTES
        {
            let Some((&oldest, _)) = self.mongo.cursors.iter().min_by_key(|(_, c)| c.use_seq) else { break };
            self.drop_cursor(oldest);
        }
        let id = loop {
            let id = ctx.rng().random_range(1..i64::MAX);
            if !self.mongo.cursors.contains_key(&id) {
                break id;
            }
        };
        self.mongo.cursor_query_bytes += query_bytes;
        self.mongo.cursor_uses += 1;
        let use_seq = self.mongo.cursor_uses;
        let cursor = Cursor { owner, query, after, skip, left, query_bytes, last_used: ctx.now(), use_seq };
        self.mongo.cursors.insert(id, cursor);
        id
    }

    fn drop_cursor(&mut self, id: i64) {
        if let Some(c) = self.mongo.cursors.remove(&id) {
            self.mongo.cursor_query_bytes -= c.query_bytes;
        }
    }

    /// The next batch of a cursor, and the time it was read at (its `operationTime`).
    fn mongo_get_more(&mut self, ctx: &mut Ctx<'_, CausalMsg>, cmd: &Document) -> CmdResult<(Document, ClusterTime)> {
        let id = match cmd.get("getMore") {
            Some(Bson::Int64(i)) => *i,
            Some(Bson::Int32(i)) => i64::from(*i),
            _ => return Err(CommandError::bad_value("getMore needs a cursor id (long)")),
        };
        let ns = namespace(cmd, "collection")?;
        let batch_docs =
            get_count(cmd, "batchSize")?.map_or(usize::MAX, |b| if b == 0 { usize::MAX } else { b as usize });
        let Some(c) = self.mongo.cursors.get(&id).filter(|c| c.query.ns == ns) else {
            return Err(CommandError::new(codes::CURSOR_NOT_FOUND, format!("cursor id {id} not found")));
        };
        let session = cmd.get("lsid").map(id_key);
        if c.owner != session {
            let (code, msg) = match (&c.owner, &session) {
                (Some(_), None) => (codes::CURSOR_SESSION_MISSING, "was created in a session; run getMore in it"),
                _ => {
                    (codes::CURSOR_SESSION_MISMATCH, "belongs to another session (or to none); run getMore in its own")
                }
            };
            return Err(CommandError::new(code, format!("cursor id {id} {msg}")));
        }
        let next = self.read_batch(&c.query, c.after.as_deref(), c.skip, c.left, batch_docs)?;
        let read_at = if c.query.majority { self.commit_point } else { self.last_applied() };
        let left_id = if next.more {
            if let Some(c) = self.mongo.cursors.get_mut(&id) {
                if !next.docs.is_empty() {
                    c.skip = 0;
                    c.left -= next.docs.len();
                    c.after = next.last_key;
                }
                c.last_used = ctx.now();
                self.mongo.cursor_uses += 1;
                c.use_seq = self.mongo.cursor_uses;
            }
            id
        } else {
            self.drop_cursor(id);
            0
        };
        Ok((doc! { "cursor": { "nextBatch": next.docs, "id": left_id, "ns": ns }, "ok": 1.0 }, read_at))
    }

    /// Kills the cursors named that belong to the session of `cmd`; another session's are
    /// reported not found.
    fn mongo_kill_cursors(&mut self, cmd: &Document) -> CmdResult<Document> {
        namespace(cmd, "killCursors")?;
        let session = cmd.get("lsid").map(id_key);
        let ids = cmd.get_array("cursors").map_err(|_| CommandError::bad_value("killCursors needs `cursors`"))?;
        let (mut killed, mut not_found) = (Vec::new(), Vec::new());
        for b in ids {
            let id = match b {
                Bson::Int64(i) => *i,
                Bson::Int32(i) => i64::from(*i),
                _ => return Err(CommandError::bad_value("cursor ids must be longs")),
            };
            if self.mongo.cursors.get(&id).is_some_and(|c| c.owner == session) {
                self.drop_cursor(id);
                killed.push(id);
            } else {
                not_found.push(id);
            }
        }
        let empty: Vec<i64> = Vec::new();
        Ok(
            doc! { "cursorsKilled": killed, "cursorsNotFound": not_found, "cursorsAlive": empty.clone(), "cursorsUnknown": empty, "ok": 1.0 },
        )
    }

    // ----- writes -----

    fn mongo_write(&mut self, ctx: &mut Ctx<'_, CausalMsg>, from: NodeId, id: u64, name: &str, cmd: &Document) {
        let retryable = cmd.contains_key("txnNumber");
        if !self.is_primary() {
            let code = crate::msg::codes::NOT_WRITABLE_PRIMARY;
            return self.mongo_reply_error(ctx, from, id, code, "not primary", retryable);
        }
        let wc = write_concern(cmd);
        if wc == WriteConcern::Majority && self.pending_writes.len() >= self.cfg.max_waiters {
            let code = crate::msg::codes::EXCEEDED_LIMIT;
            return self.mongo_reply_error(ctx, from, id, code, "too many writes waiting for majority", retryable);
        }
        let txn = match (cmd.get("lsid"), cmd.get("txnNumber")) {
            (Some(lsid), Some(n)) => {
                let n = match n {
                    Bson::Int64(n) => *n,
                    Bson::Int32(n) => i64::from(*n),
                    _ => {
                        return self.mongo_reply_error(
                            ctx,
                            from,
                            id,
                            codes::BAD_VALUE,
                            "txnNumber must be a long",
                            false,
                        )
                    }
                };
                Some((id_key(lsid), n))
            }
            (None, Some(_)) => {
                let msg = "txnNumber needs an lsid";
                return self.mongo_reply_error(ctx, from, id, codes::ILLEGAL_OPERATION, msg, false);
            }
            _ => None,
        };
        if let Some((lsid, n)) = &txn {
            if let Some(r) = self.docs.retry.get(lsid).cloned() {
                if r.txn_number == *n && !r.complete {
                    // Its first entries reached this member, its last did not (its primary
                    // failed in between): which statements ran is unknown here, and running
                    // them again could apply some twice (a review's schedule incremented two
                    // documents twice). MongoDB answers this way when a retry's history is
                    // incomplete; the driver does not retry it.
                    let msg = "this retryable write was applied in part before a failover; it is not run again";
                    let code = codes::INCOMPLETE_TRANSACTION_HISTORY;
                    return self.mongo_reply_error(ctx, from, id, code, msg, false);
                }
                if r.txn_number == *n {
                    // Already executed: the same answer, no second execution; it waits for the
                    // write concern like the first attempt did.
                    let mut body = decode_document(&r.reply).unwrap_or_default();
                    body.insert("ok", 1.0);
                    ctx.metric("causal.mongo.retried_writes", 1);
                    if wc == WriteConcern::W1 || r.optime <= self.commit_point {
                        return self.mongo_send(ctx, from, id, body, r.optime);
                    }
                    let deadline = ctx.now() + Duration::from_millis(u64::from(MAX_TIME_MS_CAP));
                    self.add_pending(r.optime, PendingWrite { client: from, id, deadline, mongo: Some(body) });
                    return;
                }
                if r.txn_number > *n {
                    let msg = format!("txnNumber {n} is older than this session's {}", r.txn_number);
                    return self.mongo_reply_error(ctx, from, id, codes::TRANSACTION_TOO_OLD, &msg, false);
                }
            } else if !self.docs.retry_room(wall_ms(ctx.now())) {
                let msg = format!(
                    "{MAX_RETRY_RECORDS} sessions made retryable writes in the last \
                     {LOGICAL_SESSION_TIMEOUT_MINUTES} minutes; retry later, or write without a txnNumber"
                );
                return self.mongo_reply_error(ctx, from, id, codes::TOO_MANY_LOGICAL_SESSIONS, &msg, false);
            }
        }
        let ns = match namespace(cmd, name) {
            Ok(ns) => ns,
            Err(e) => return self.mongo_reply_error(ctx, from, id, e.code, &e.errmsg, false),
        };
        let ordered = cmd.get_bool("ordered").unwrap_or(true);
        let mut ov = Overlay::default();
        let summary = match name {
            "insert" => self.plan_insert(ctx, &ns, cmd, ordered, &mut ov),
            "update" => self.plan_update(ctx, &ns, cmd, ordered, &mut ov),
            "findAndModify" | "findandmodify" => self.plan_find_and_modify(ctx, &ns, cmd, &mut ov),
            "drop" => self.plan_drop(&ns, &mut ov),
            _ => self.plan_delete(&ns, cmd, ordered, &mut ov),
        };
        let summary = match summary {
            Ok(s) => s,
            Err(e) => return self.mongo_reply_error(ctx, from, id, e.code, &e.errmsg, false),
        };
        let cap = self.cfg.max_docs_entry_bytes;
        if let Some(big) = ov.writes.iter().map(DocWrite::approx_bytes).find(|&b| b > cap) {
            let msg = format!("a document of {big} bytes is larger than this set's limit of {cap} bytes per write");
            return self.mongo_reply_error(ctx, from, id, codes::BSON_OBJECT_TOO_LARGE, &msg, false);
        }
        // Several entries when the documents do not fit one; the last carries the retry record,
        // the others a record that says the write is incomplete without it.
        let (mut chunks, mut current, mut bytes) = (Vec::new(), Vec::new(), 0);
        for w in ov.writes {
            let b = w.approx_bytes();
            if bytes + b > cap && !current.is_empty() {
                chunks.push(std::mem::take(&mut current));
                bytes = 0;
            }
            bytes += b;
            current.push(w);
        }
        chunks.push(current);
        let last = chunks.len() - 1;
        let mut optime = ClusterTime::ZERO;
        for (i, writes) in chunks.into_iter().enumerate() {
            let retry = txn.as_ref().map(|(lsid, txn_number)| RetryRecord {
                lsid: lsid.clone(),
                txn_number: *txn_number,
                wall_ms: wall_ms(ctx.now()),
                reply: if i == last { doc_bytes(&summary) } else { Vec::new() },
                complete: i == last,
            });
            let op = Op::Docs { ns: ns.clone(), writes, retry };
            match self.write(ctx, op) {
                Ok(t) => optime = t,
                Err(e) => return self.mongo_reply_error(ctx, from, id, e.code(), &e.to_string(), retryable),
            }
        }
        ctx.metric("causal.mongo.writes", 1);
        let mut body = summary;
        body.insert("ok", 1.0);
        match wc {
            WriteConcern::W1 => self.mongo_send(ctx, from, id, body, optime),
            WriteConcern::Majority => {
                let max_ms = cmd
                    .get_document("writeConcern")
                    .ok()
                    .and_then(|wc| get_count(wc, "wtimeout").ok().flatten())
                    .filter(|&ms| ms > 0)
                    .map_or(u64::from(MAX_TIME_MS_CAP), |ms| (ms as u64).min(u64::from(MAX_TIME_MS_CAP)));
                let deadline = ctx.now() + Duration::from_millis(max_ms);
                self.add_pending(optime, PendingWrite { client: from, id, deadline, mongo: Some(body) });
                self.advance_commit(ctx);
            }
        }
    }

    /// The current version of a document, seen through the command's own earlier changes.
    fn current<'a>(&'a self, ns: &str, key: &[u8], ov: &'a Overlay) -> Option<&'a Document> {
        match ov.changed.get(key) {
            Some(d) => d.as_ref(),
            None => self.docs.get(ns, key, ClusterTime::MAX),
        }
    }

    /// Documents matching `filter`, newest versions with the overlay, in key order.
    fn matching(&self, ns: &str, filter: &Filter, ov: &Overlay) -> Vec<(Vec<u8>, Document)> {
        if let Some(id) = filter.id() {
            let key = id_key(id);
            return self
                .current(ns, &key, ov)
                .filter(|d| filter.matches(d))
                .map(|d| (key, d.clone()))
                .into_iter()
                .collect();
        }
        let mut out: BTreeMap<Vec<u8>, Document> = BTreeMap::new();
        for (k, d) in self.docs.scan(ns, ClusterTime::MAX) {
            if !ov.changed.contains_key(k) && filter.matches(d) {
                out.insert(k.clone(), d.clone());
            }
        }
        for (k, d) in &ov.changed {
            if let Some(d) = d.as_ref().filter(|d| filter.matches(d)) {
                out.insert(k.clone(), d.clone());
            }
        }
        out.into_iter().collect()
    }

    fn new_object_id(&mut self, ctx: &mut Ctx<'_, CausalMsg>) -> Bson {
        self.mongo.generated_ids += 1;
        let mut b = [0u8; 12];
        b[..4].copy_from_slice(&((ctx.now().0 / 1_000_000_000) as u32).to_be_bytes());
        b[4] = self.me as u8;
        b[5..].copy_from_slice(&self.mongo.generated_ids.to_be_bytes()[1..]);
        Bson::ObjectId(bson::oid::ObjectId::from_bytes(b))
    }

    fn plan_insert(
        &mut self,
        ctx: &mut Ctx<'_, CausalMsg>,
        ns: &str,
        cmd: &Document,
        ordered: bool,
        ov: &mut Overlay,
    ) -> CmdResult<Document> {
        let docs = docs_array(cmd, "documents")?;
        let (mut n, mut errors) = (0i32, Vec::new());
        for (i, mut d) in docs.into_iter().enumerate() {
            if !d.contains_key("_id") {
                let oid = self.new_object_id(ctx);
                let mut with_id = doc! { "_id": oid };
                with_id.extend(d);
                d = with_id;
            }
            let key = id_key(d.get("_id").unwrap_or(&Bson::Null));
            let err = if self.current(ns, &key, ov).is_some() {
                Some((codes::DUPLICATE_KEY, format!("E11000 duplicate key error collection: {ns} index: _id_")))
            } else if doc_bytes(&d).len() > MAX_BSON_OBJECT_SIZE {
                Some((codes::BSON_OBJECT_TOO_LARGE, "document is larger than 16 MiB".to_string()))
            } else {
                None
            };
            match err {
                None => {
                    ov.put(key, d);
                    n += 1;
                }
                Some((code, errmsg)) => {
                    errors.push(write_error(i, code, errmsg));
                    if ordered {
                        break;
                    }
                }
            }
        }
        Ok(write_result(n, errors))
    }

    fn plan_update(
        &mut self,
        ctx: &mut Ctx<'_, CausalMsg>,
        ns: &str,
        cmd: &Document,
        ordered: bool,
        ov: &mut Overlay,
    ) -> CmdResult<Document> {
        let stmts = docs_array(cmd, "updates")?;
        let (mut n, mut modified, mut upserted, mut errors) = (0i32, 0i32, Vec::new(), Vec::new());
        for (i, s) in stmts.iter().enumerate() {
            let r = (|| -> CmdResult<()> {
                let filter = Filter::parse(s.get_document("q").ok())?;
                let update = Update::parse(s.get("u").unwrap_or(&Bson::Null))?;
                let multi = get_flag(s, "multi");
                if multi && matches!(update, Update::Replace(_)) {
                    return Err(CommandError::new(
                        codes::FAILED_TO_PARSE,
                        "multi update is not supported with a replacement",
                    ));
                }
                let mut hits = self.matching(ns, &filter, ov);
                if !multi {
                    hits.truncate(1);
                }
                if hits.is_empty() && get_flag(s, "upsert") {
                    let (id, _) = self.upsert(ctx, ns, &filter, &update, ov)?;
                    n += 1;
                    upserted.push(doc! { "index": i as i32, "_id": id });
                    return Ok(());
                }
                for (key, old) in hits {
                    let new = update.apply(&old)?;
                    n += 1;
                    if new != old {
                        modified += 1;
                        ov.put(key, new);
                    }
                }
                Ok(())
            })();
            if let Err(e) = r {
                errors.push(
                    doc! { "index": i as i32, "code": e.code, "codeName": codes::name(e.code), "errmsg": e.errmsg },
                );
                if ordered {
                    break;
                }
            }
        }
        let mut out = doc! { "n": n, "nModified": modified };
        if !upserted.is_empty() {
            out.insert("upserted", upserted);
        }
        if !errors.is_empty() {
            out.insert("writeErrors", errors);
        }
        Ok(out)
    }

    /// An upsert that matched nothing: inserts the filter's equalities with `update` applied,
    /// and returns the new document and its `_id`.
    fn upsert(
        &mut self,
        ctx: &mut Ctx<'_, CausalMsg>,
        ns: &str,
        filter: &Filter,
        update: &Update,
        ov: &mut Overlay,
    ) -> CmdResult<(Bson, Document)> {
        let mut base = Document::new();
        for (k, v) in &filter.equals {
            base.insert(k.clone(), v.clone());
        }
        let mut new = update.apply(&base)?;
        if !new.contains_key("_id") {
            let id = base.get("_id").cloned().unwrap_or_else(|| self.new_object_id(ctx));
            let mut with_id = doc! { "_id": id };
            with_id.extend(new);
            new = with_id;
        }
        let id = new.get("_id").cloned().unwrap_or(Bson::Null);
        if self.current(ns, &id_key(&id), ov).is_some() {
            // The filter named an existing `_id` but did not match it: the insert meets the `_id`
            // index, as in MongoDB (a review's schedule replaced the document, which optimistic
            // concurrency relies on never happening).
            let errmsg = format!("E11000 duplicate key error collection: {ns} index: _id_");
            return Err(CommandError::new(codes::DUPLICATE_KEY, &errmsg));
        }
        ov.put(id_key(&id), new.clone());
        Ok((id, new))
    }

    /// `findAndModify`: the first document matching `query` is updated (`update`; the reply's
    /// `value` is the old version, or the new one with `new: true`) or removed (`remove: true`),
    /// or, matching none, upserted (`upsert: true`); `fields` projects `value`. `sort` is
    /// refused, as by `find` (documents are in `_id` order).
    fn plan_find_and_modify(
        &mut self,
        ctx: &mut Ctx<'_, CausalMsg>,
        ns: &str,
        cmd: &Document,
        ov: &mut Overlay,
    ) -> CmdResult<Document> {
        if cmd.get_document("sort").is_ok_and(|s| !s.is_empty()) {
            return Err(CommandError::bad_value("sort is not supported by Kairos"));
        }
        let filter = Filter::parse(cmd.get_document("query").ok())?;
        let remove = get_flag(cmd, "remove");
        let update = match (cmd.get("update"), remove) {
            (Some(u), false) => Some(Update::parse(u)?),
            (None, true) => None,
            _ => return Err(CommandError::new(codes::FAILED_TO_PARSE, "give either an update or remove: true")),
        };
        let (return_new, upsert) = (get_flag(cmd, "new"), get_flag(cmd, "upsert"));
        let hit = self.matching(ns, &filter, ov).into_iter().next();
        let (value, last_error) = match (hit, update) {
            (Some((key, old)), None) => {
                ov.delete(key);
                (Some(old), doc! { "n": 1 })
            }
            (None, None) => (None, doc! { "n": 0 }),
            (Some((key, old)), Some(update)) => {
                let new = update.apply(&old)?;
                if new != old {
                    ov.put(key, new.clone());
                }
                (Some(if return_new { new } else { old }), doc! { "n": 1, "updatedExisting": true })
            }
            (None, Some(update)) if upsert => {
                let (id, new) = self.upsert(ctx, ns, &filter, &update, ov)?;
                (return_new.then_some(new), doc! { "n": 1, "updatedExisting": false, "upserted": id })
            }
            (None, Some(_)) => (None, doc! { "n": 0, "updatedExisting": false }),
        };
        let value = match value {
            Some(d) => Bson::Document(project(&d, cmd.get_document("fields").ok())?),
            None => Bson::Null,
        };
        Ok(doc! { "lastErrorObject": last_error, "value": value })
    }

    /// `drop`: deletes every document (there are no indexes or collection options to drop).
    fn plan_drop(&mut self, ns: &str, ov: &mut Overlay) -> CmdResult<Document> {
        let ids: Vec<Vec<u8>> = self.docs.scan(ns, ClusterTime::MAX).map(|(k, _)| k.clone()).collect();
        if ids.is_empty() {
            return Err(CommandError::new(codes::NAMESPACE_NOT_FOUND, "ns not found"));
        }
        for id in ids {
            ov.delete(id);
        }
        Ok(doc! { "ns": ns, "nIndexesWas": 1 })
    }

    fn plan_delete(&mut self, ns: &str, cmd: &Document, ordered: bool, ov: &mut Overlay) -> CmdResult<Document> {
        let stmts = docs_array(cmd, "deletes")?;
        let (mut n, mut errors) = (0i32, Vec::new());
        for (i, s) in stmts.iter().enumerate() {
            match Filter::parse(s.get_document("q").ok()) {
                Ok(filter) => {
                    let mut hits = self.matching(ns, &filter, ov);
                    if get_count(s, "limit").ok().flatten() == Some(1) {
                        hits.truncate(1);
                    }
                    for (key, _) in hits {
                        ov.delete(key);
                        n += 1;
                    }
                }
                Err(e) => {
                    errors.push(write_error(i, e.code, e.errmsg));
                    if ordered {
                        break;
                    }
                }
            }
        }
        Ok(write_result(n, errors))
    }
}

/// Takes up to `n` documents (and at most [`MAX_BATCH_BYTES`], at least one) off the front.
/// One entry of a write command's `writeErrors`.
fn write_error(index: usize, code: i32, errmsg: String) -> Document {
    doc! { "index": index as i32, "code": code, "codeName": codes::name(code), "errmsg": errmsg }
}

/// A write command's reply body: how many documents it wrote, and its per-document errors.
fn write_result(n: i32, errors: Vec<Document>) -> Document {
    let mut out = doc! { "n": n };
    if !errors.is_empty() {
        out.insert("writeErrors", errors);
    }
    out
}
