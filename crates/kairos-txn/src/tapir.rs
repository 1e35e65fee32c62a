//! Tapir (see the crate docs).
