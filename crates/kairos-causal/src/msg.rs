//! Everything on the wire: member-to-member messages and client requests and replies.

use kairos_clock::{ClusterTime, SignedClusterTime, SigningKey};
use serde::{Deserialize, Serialize};

/// One operation of the replicated log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Append `value` to the list stored at `key`.
    Append { key: u64, value: u64 },
    /// A no-op (new primary, periodic idle writer, on-demand for a waiting reader).
    Noop,
    /// New HMAC keys (MongoDB's `admin.system.keys` documents), replicated like data.
    Keys(Vec<SigningKey>),
    /// One MongoDB write command's effect on namespace `ns` (`db.collection`): whole documents
    /// to put and ids to delete, computed by the primary, plus the retryable-write record.
    Docs { ns: String, writes: Vec<DocWrite>, retry: Option<RetryRecord> },
}

impl Op {
    /// About how many bytes the entry takes on the wire (documents counted exactly).
    pub fn approx_bytes(&self) -> usize {
        const ENTRY_OVERHEAD_BYTES: usize = 48;
        ENTRY_OVERHEAD_BYTES
            + match self {
                Op::Append { .. } | Op::Noop => 0,
                Op::Keys(keys) => keys.len() * 48,
                Op::Docs { ns, writes, retry } => {
                    ns.len()
                        + writes.iter().map(DocWrite::approx_bytes).sum::<usize>()
                        + retry.as_ref().map_or(0, |r| r.lsid.len() + r.reply.len() + 16)
                }
            }
    }
}

impl DocWrite {
    pub fn approx_bytes(&self) -> usize {
        match self {
            DocWrite::Put { id, doc } => id.len() + doc.len() + 8,
            DocWrite::Delete { id } => id.len() + 8,
        }
    }
}

/// One document change of [`Op::Docs`]. `id` is [`crate::mongo::id_key`] of the `_id`, `doc`
/// the whole document's BSON bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DocWrite {
    Put { id: Vec<u8>, doc: Vec<u8> },
    Delete { id: Vec<u8> },
}

/// A retryable write (`lsid` + `txnNumber`) and the reply body it got, so that a retry, on this
/// primary or the next, gets the same answer without executing twice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryRecord {
    /// The BSON bytes of the session id (`lsid.id`).
    pub lsid: Vec<u8>,
    pub txn_number: i64,
    /// The primary's physical clock when it ran the write, in ms (MongoDB's `wall`): records
    /// expire by it. Not by the optime: a client may move the cluster time far ahead.
    pub wall_ms: u64,
    /// The BSON bytes of the reply body (`n`, `nModified`, `upserted`, `writeErrors`).
    pub reply: Vec<u8>,
    /// False on every entry of a write split over several but the last: a member that has the
    /// write only in part cannot tell which statements ran, so it must not run them again.
    pub complete: bool,
}

/// A MongoDB command handed to a member by its wire-protocol listener: the command document
/// (body and document sequences merged) as BSON bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MongoRequest {
    /// Listener-chosen id, echoed in the reply.
    pub id: u64,
    pub command: Vec<u8>,
}

/// The member's answer to a [`MongoRequest`]: the reply document as BSON bytes (with `ok`,
/// `operationTime` and `$clusterTime`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MongoReply {
    pub id: u64,
    pub reply: Vec<u8>,
}

/// An oplog entry: its optime (a cluster time), the term of the primary that wrote it, the op,
/// and for a client's write, which request it executes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub optime: ClusterTime,
    pub term: u64,
    pub op: Op,
    pub origin: Option<WriteOrigin>,
}

/// The client request a write executes (MongoDB keeps `lsid` and `txnNumber` of a retryable
/// write in its oplog entry for the same reason): a request that reaches a primary again — a
/// retransmission, a duplicated or replayed message, also after a failover — is answered with
/// the first execution's optime instead of running twice.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteOrigin {
    /// The client's node.
    pub client: u32,
    /// Its request id ([`Request::id`]); a client's ids increase.
    pub request: u64,
}

/// The position of the last entry of an oplog: `(optime, term)`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OpPos {
    pub optime: ClusterTime,
    pub term: u64,
}

/// Between members (who are trusted peers: their `$clusterTime` carries the dummy signature).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerBody {
    /// A candidate asks for a vote; `last` is its last oplog position. A `dry_run` asks, in
    /// the asker's current term, whether the vote of the next term would be granted, and
    /// binds nobody (`member::election`).
    RequestVote {
        last: OpPos,
        dry_run: bool,
    },
    /// The answer to a `RequestVote`, echoing its `dry_run`.
    VoteReply {
        granted: bool,
        dry_run: bool,
    },
    /// The primary's periodic heartbeat (carries its commit point).
    Heartbeat {
        commit_point: ClusterTime,
    },
    /// A secondary's answer to a heartbeat: its progress report.
    HeartbeatAck {
        applied: OpPos,
    },
    /// A secondary pulls the entries after `last` (its last position; also a progress report).
    Pull {
        last: OpPos,
    },
    /// The answer to a pull: entries after the pull's `last`, or, when `last` is not in the
    /// primary's oplog, `rollback_to`: truncate everything after this optime and pull again.
    /// `after` echoes the pull's `last`: a batch applies only to an oplog that still ends there.
    Batch {
        after: OpPos,
        entries: Vec<Entry>,
        commit_point: ClusterTime,
        rollback_to: Option<ClusterTime>,
    },
    /// A secondary asks the primary for a no-op at or after `at_least` (a reader waits for it).
    NoopRequest {
        at_least: ClusterTime,
    },
    /// A member that lost its disk asks for the answerer's term (the envelope's).
    TermProbe {
        nonce: u64,
    },
    TermAnswer {
        nonce: u64,
    },
}

/// A member-to-member message: sender's term and clock, and the body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerMsg {
    pub term: u64,
    pub cluster_time: Option<SignedClusterTime>,
    pub body: PeerBody,
    /// The sender's count of peer messages sent in its current life. A primary's heartbeats
    /// and batches of one term therefore come numbered upwards (it is primary in a term for one
    /// life only), so a secondary takes only one newer than the last it took as a sign that
    /// the primary is alive: a copy of an old heartbeat, replayed after the primary crashed,
    /// must not put off the election that replaces it.
    #[serde(default)]
    pub seq: u64,
}

/// What a client asks for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientOp {
    Read { key: u64 },
    Append { key: u64, value: u64 },
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReadConcern {
    Local,
    Majority,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WriteConcern {
    /// Acknowledged when the primary has applied it.
    W1,
    /// Acknowledged when a majority of members have applied it.
    Majority,
}

/// A client request (a simplified command: no BSON, no wire protocol).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Client-chosen id, echoed in the reply.
    pub id: u64,
    pub op: ClientOp,
    pub read_concern: ReadConcern,
    pub write_concern: WriteConcern,
    /// `readConcern.afterClusterTime`.
    pub after_cluster_time: Option<ClusterTime>,
    /// `$clusterTime` gossiped by the client.
    pub cluster_time: Option<SignedClusterTime>,
    /// `maxTimeMS`: how long the member may wait (for afterClusterTime or write concern).
    pub max_time_ms: u32,
    /// A read that a secondary may answer (MongoDB's `secondaryOk`: read preference other
    /// than primary). Without it a member that is not primary refuses the read
    /// (`NotPrimaryNoSecondaryOk`), as MongoDB does: a read meant for the primary's data must
    /// not get a lagging or restarted secondary's.
    #[serde(default)]
    pub secondary_ok: bool,
    /// For a write: the term of the primary it is meant for, learned from replies
    /// ([`Reply::term`]). A member runs a write only while it is primary in exactly
    /// that term; otherwise it refuses with `PrimarySteppedDown` (189) and its term, and the
    /// session sends the same request again with it. So a copy of a write (a duplicated or
    /// replayed message) can run only in the term it names, which no member enters twice:
    /// after a member lost its disk with the writes it refused, copies of them still cannot
    /// run there (`member::amnesia`). `None`: any term (a client that does not track terms;
    /// the MongoDB front door, whose copies cannot outlive their TCP connection).
    #[serde(default)]
    pub term: Option<u64>,
}

/// An error reply: `{ok: 0, code, codeName, errmsg}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub code: i32,
    pub code_name: String,
    pub errmsg: String,
}

/// What a successful command returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplyBody {
    /// The list stored at the key (empty if never written).
    Read(Vec<u64>),
    Written,
}

/// A reply to a client. `operation_time` and `cluster_time` are both present or both absent
/// (absent: the member has no signing key and the client is untrusted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub id: u64,
    pub result: Result<ReplyBody, ErrorReply>,
    pub operation_time: Option<ClusterTime>,
    pub cluster_time: Option<SignedClusterTime>,
    /// The member's idea of the current primary (index into the member list), like `hello`.
    pub primary_hint: Option<u32>,
    /// The term of the primary named in `primary_hint` (like `hello`'s `electionId`), when the
    /// member knows it: it is that primary, or took a heartbeat or batch from it in its current
    /// term. (Only a primary's heartbeats say it won that term, so a term learned here is the
    /// term of that primary, which is primary in it for one life only: see `Request::term`.)
    #[serde(default)]
    pub term: Option<u64>,
}

/// Every message of the protocol.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[allow(clippy::large_enum_variant)]
pub enum CausalMsg {
    Peer(PeerMsg),
    Request(Request),
    Reply(Reply),
    /// From the MongoDB listener of the member's process (never between members).
    MongoRequest(MongoRequest),
    MongoReply(MongoReply),
}

/// MongoDB error codes this crate answers with.
pub mod codes {
    pub const INVALID_OPTIONS: i32 = 72;
    pub const TIME_PROOF_MISMATCH: i32 = 204;
    pub const CLUSTER_TIME_FAILS_RATE_LIMITER: i32 = 205;
    pub const KEY_NOT_FOUND: i32 = 211;
    pub const MAX_TIME_MS_EXPIRED: i32 = 50;
    pub const WRITE_CONCERN_FAILED: i32 = 64;
    pub const NOT_WRITABLE_PRIMARY: i32 = 10107;
    pub const INTERRUPTED_DUE_TO_REPL_STATE_CHANGE: i32 = 11602;
    pub const NOT_PRIMARY_OR_SECONDARY: i32 = 13436;
    pub const NOT_PRIMARY_NO_SECONDARY_OK: i32 = 13435;
    pub const EXCEEDED_LIMIT: i32 = 2;
    pub const TRANSACTION_TOO_OLD: i32 = 225;
    /// A write named a term that is not the primary's ([`super::Request::term`]).
    pub const PRIMARY_STEPPED_DOWN: i32 = 189;

    /// The codeName of a code of this module.
    pub fn name(code: i32) -> &'static str {
        match code {
            INVALID_OPTIONS => "InvalidOptions",
            TIME_PROOF_MISMATCH => "TimeProofMismatch",
            CLUSTER_TIME_FAILS_RATE_LIMITER => "ClusterTimeFailsRateLimiter",
            KEY_NOT_FOUND => "KeyNotFound",
            MAX_TIME_MS_EXPIRED => "MaxTimeMSExpired",
            WRITE_CONCERN_FAILED => "WriteConcernFailed",
            NOT_WRITABLE_PRIMARY => "NotWritablePrimary",
            INTERRUPTED_DUE_TO_REPL_STATE_CHANGE => "InterruptedDueToReplStateChange",
            NOT_PRIMARY_OR_SECONDARY => "NotPrimaryOrSecondary",
            NOT_PRIMARY_NO_SECONDARY_OK => "NotPrimaryNoSecondaryOk",
            EXCEEDED_LIMIT => "BadValue",
            TRANSACTION_TOO_OLD => "TransactionTooOld",
            PRIMARY_STEPPED_DOWN => "PrimarySteppedDown",
            _ => "UnknownError",
        }
    }

    /// Whether a write that got this error certainly did not take effect.
    pub fn write_certainly_failed(code: i32) -> bool {
        matches!(
            code,
            INVALID_OPTIONS
                | TIME_PROOF_MISMATCH
                | CLUSTER_TIME_FAILS_RATE_LIMITER
                | KEY_NOT_FOUND
                | NOT_WRITABLE_PRIMARY
                | NOT_PRIMARY_OR_SECONDARY
                | EXCEEDED_LIMIT
                | PRIMARY_STEPPED_DOWN
        ) || (40_482..=40_484).contains(&code)
    }
}

impl ErrorReply {
    pub fn new(code: i32, errmsg: impl Into<String>) -> Self {
        ErrorReply { code, code_name: codes::name(code).to_string(), errmsg: errmsg.into() }
    }
    pub fn from_clock(e: &kairos_clock::ClusterTimeError) -> Self {
        ErrorReply { code: e.code(), code_name: e.code_name().to_string(), errmsg: e.to_string() }
    }
}
