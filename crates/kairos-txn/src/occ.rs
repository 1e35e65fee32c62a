//! OCC+Paxos (see the crate docs).
