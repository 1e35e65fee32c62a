//! # kairos-tiga — Tiga (SOSP 2025)
//!
//! (crate docs are written as the roles land)

pub mod coordinator;
pub mod msg;
pub mod server;
pub mod sim;
pub mod topology;
pub mod workload;

pub use msg::{Piece, Procedure, TigaMsg, TxnId};
pub use topology::{TigaConfig, Topology};
