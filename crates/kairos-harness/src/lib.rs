//! # kairos-harness — what runs the protocols outside their roles
//!
//! Protocol crates hold sans-IO roles: no threads, sockets, wall clock or checker. What a run
//! needs beyond the roles lives here: real backends, the threaded drivers that run roles on
//! them with the host clock, and the calls into the history checkers.
//!
//! | module | what it holds |
//! |---|---|
//! | [`swarm`] | SWARM's real memory nodes (shm, TCP), the client driver, real runs, and the per-key linearizability check of simulated and real runs |
//!
//! The other protocols' runners still live in their crates (the testing-tree issue moves them
//! here, one protocol at a time).

pub mod swarm;
