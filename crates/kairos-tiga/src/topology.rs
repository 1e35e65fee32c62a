//! Who is where: the replicas of every shard, which one leads, and the protocol's knobs.

use std::time::Duration;

use kairos_workload::txn::ShardId;
pub use kairos_workload::{Partitioner, Topology};

/// The protocol's knobs, shared by coordinators and servers.
#[derive(Clone, Debug, PartialEq)]
pub struct TigaConfig {
    /// Δ added to the estimated one-way delay to form the headroom (paper: 10 ms).
    pub margin: Duration,
    /// Shift added to every headroom (the headroom experiment: −50 ms … +50 ms), ns.
    pub headroom_shift_ns: i64,
    /// Use zero headroom (timestamp = send time) — the headroom experiment's worst case.
    pub zero_headroom: bool,
    /// One-way delay samples older than this are dropped from the estimate window.
    pub owd_window: Duration,
    /// Percentile of the window used as the estimate (paper: p50).
    pub owd_percentile: f64,
    /// Estimates are capped at this (paper: 400 ms).
    pub owd_cap: Duration,
    /// Smallest sample a server reports (paper: 1 ms floor).
    pub owd_floor: Duration,
    /// Leaders send log synchronization to followers this often (paper's code: 2 ms).
    pub sync_interval: Duration,
    /// A leader resends log entries from a follower's sync-point when it has not advanced for
    /// this long although entries are outstanding (a lost batch).
    pub sync_resend_after: Duration,
    /// Slack beyond the largest headroom a coordinator can choose (OWD cap + margin + shift)
    /// within which a proposed timestamp is accepted; later ones are refused as bogus.
    pub future_slack: Duration,
    /// A replica checkpoints its committed state once its log holds at least this many
    /// positions past its last checkpoint…
    pub checkpoint_interval: u64,
    /// … and at least this many per key of the state. A checkpoint writes (and, through the
    /// copy-on-write maps, later copies) the whole state, so a fixed interval makes its cost per
    /// position grow with the state; spaced by the state's size, it stays a constant share (the
    /// rule of Redis's append-only-file rewrite). 0: every `checkpoint_interval` positions.
    pub checkpoint_positions_per_key: u64,
    /// A leader probed about a transaction it never received answers "absent" once the
    /// transaction's timestamp is this old (must exceed the coordinators' give-up time,
    /// `retry_timeout × max_sends`, with room for clock error); both then drop it.
    pub agree_abandon_after: Duration,
    /// Leaders resend agreement messages that have not been answered after this long.
    pub agree_retry: Duration,
    /// A coordinator resends a transaction (same id, new timestamp) after this long.
    pub retry_timeout: Duration,
    /// … and gives up (records `info`) after this many sends.
    pub max_sends: u32,
    /// Keys one transaction may name, and transactions a coordinator keeps in flight.
    pub keys_per_txn_max: usize,
    pub inflight_max: usize,
    /// The open-loop load's arrivals are admitted under an adaptive in-flight limit
    /// ([`kairos_workload::admission`]) that sheds what the servers cannot take, instead of
    /// letting queues grow until throughput collapses. Off (the default here, so that tests and
    /// campaigns see every arrival; `kairos bench` turns it on): only `inflight_max` bounds them.
    pub admission_control: bool,
    /// Operations one transaction may hold, and bytes of keys and arguments over them.
    pub ops_per_txn_max: usize,
    pub txn_bytes_max: usize,
    /// Preventive mode: leaders of a multi-shard transaction agree on its timestamp before
    /// executing it (no revocations; best when leaders are close). Otherwise detective mode:
    /// execute, then agree, revoking on disagreement. The deployment picks it per placement.
    pub preventive: bool,
    /// Servers send a heartbeat to every view-manager node this often (and an idle leader sends
    /// its followers an empty log synchronization as often).
    pub heartbeat_interval: Duration,
    /// The view manager deems a server failed after this long without its heartbeat.
    pub leader_timeout: Duration,
    /// A view whose leader has not started serving this long after the view was decided is
    /// replaced by the next one.
    pub view_change_timeout: Duration,
    /// During a view change, unanswered messages are re-sent this often.
    pub view_change_retry: Duration,
    /// Test-only: the new leader's log merge skips rule (b): it keeps only the old leader's
    /// log, losing what was committed on the fast path and not yet synchronized.
    pub unsafe_skip_merge_rule_b: bool,
    /// When a leader sends the other involved leaders its timestamp for a multi-shard
    /// transaction. `None` (the default): when the transaction arrives — its timestamp is
    /// settled then, and no leader ever waits on a lock for it (the crate docs' deviation from
    /// the paper). `Some(timeout)`: when it releases the transaction, the paper's rule, or
    /// `timeout` after arrival if still not released, which breaks the wait of two leaders that
    /// hold conflicting transactions in opposite orders (without it they wait forever). For
    /// measuring what the deviation costs or hides (`kairos bench tiga --announce-at-release-ms`).
    pub announce_at_release: Option<Duration>,
    /// How a key finds its shard (hash; decimal integer keys by value for TPC-C).
    pub partitioner: Partitioner,
    /// Per transaction, take the slow path's smaller headroom when it is predicted to commit
    /// sooner (beyond the paper; see the coordinator's module docs). Off: the paper's rule.
    pub quorum_choice: bool,
    /// Test-only: skip the second round of timestamp agreement (reintroduces timestamp
    /// inversion; the Figure 5 test shows the checker catching it).
    pub unsafe_skip_second_round: bool,
    /// Test-only: a follower logs a transaction at the timestamp it released it at, not the
    /// leader's final one (its log diverges from the leader's; the replicas' log-agreement
    /// check catches it at that event).
    pub unsafe_follower_keeps_own_ts: bool,
    /// Test-only: a coordinator counts fast replies toward the super quorum whatever their log
    /// hash (a fast commit may then rest on followers that lack what the leader executed
    /// before it, which a view change loses).
    pub unsafe_ignore_log_hash: bool,
    /// Test-only: a follower answers on the fast path at once, even for a transaction that
    /// read from a multi-shard transaction not yet in its log (`server/reply_gate.rs`): a view
    /// change that loses that transaction on its other shard then makes a committed result
    /// false.
    pub unsafe_ungated_fast_replies: bool,
    /// Test-only: a coordinator keeps the replies it has across a view change and counts
    /// replies from any view (the fast reply of a follower that now leads is then taken as
    /// the new leader's).
    pub unsafe_accept_old_view_replies: bool,
}

impl TigaConfig {
    /// The shard of a key under this configuration's partitioner.
    pub fn shard_of(&self, topology: &Topology, key: &[u8]) -> ShardId {
        self.partitioner.shard_of(key, topology.shard_count())
    }
}

impl Default for TigaConfig {
    fn default() -> Self {
        TigaConfig {
            margin: Duration::from_millis(10),
            headroom_shift_ns: 0,
            zero_headroom: false,
            owd_window: Duration::from_secs(1),
            owd_percentile: 0.5,
            owd_cap: Duration::from_millis(400),
            owd_floor: Duration::from_millis(1),
            sync_interval: Duration::from_millis(2),
            sync_resend_after: Duration::from_millis(400),
            checkpoint_interval: 10_000,
            checkpoint_positions_per_key: 1,
            future_slack: Duration::from_secs(1),
            agree_retry: Duration::from_millis(250),
            agree_abandon_after: Duration::from_secs(8),
            retry_timeout: Duration::from_secs(2),
            max_sends: 3,
            keys_per_txn_max: 64,
            inflight_max: 15_000,
            admission_control: false,
            ops_per_txn_max: 1_024,
            txn_bytes_max: 2 << 20,
            preventive: false,
            heartbeat_interval: Duration::from_millis(50),
            leader_timeout: Duration::from_millis(400),
            view_change_timeout: Duration::from_secs(2),
            view_change_retry: Duration::from_millis(150),
            announce_at_release: None,
            quorum_choice: false,
            partitioner: Partitioner::Hash,
            unsafe_skip_merge_rule_b: false,
            unsafe_skip_second_round: false,
            unsafe_follower_keeps_own_ts: false,
            unsafe_ignore_log_hash: false,
            unsafe_ungated_fast_replies: false,
            unsafe_accept_old_view_replies: false,
        }
    }
}
