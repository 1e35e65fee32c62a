//! 2PL+Paxos (see the crate docs).
