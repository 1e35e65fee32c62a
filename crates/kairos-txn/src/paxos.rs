//! Multi-Paxos per shard (see the crate docs).
