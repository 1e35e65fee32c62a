//! # kairos — the command line
//!
//! `kairos demo` runs the main job; `kairos bench`, `kairos sim`, `kairos check` and
//! `kairos serve` are the tools behind it. See `kairos --help` and README.md.

// The command line is a host, not a protocol: it may read the real clock (to report wall time).
#![allow(clippy::disallowed_methods)]

mod cli;
mod cmd;
mod progress;
mod report;
mod result;
mod stats;

use clap::Parser;
use std::process::ExitCode;

/// Errors a command reports to its user. Exit codes: 1 = a checker found an anomaly,
/// 2 = bad input (arguments, files, configuration), 3 = a runtime failure.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Anomaly(String),
    /// A check that could neither prove nor refute the model.
    #[error("{0}")]
    Unknown(String),
    #[error("{0}")]
    Runtime(String),
}

impl CliError {
    fn exit_code(&self) -> u8 {
        match self {
            CliError::Anomaly(_) => 1,
            CliError::Usage(_) | CliError::Io(_) => 2,
            CliError::Unknown(_) => 3,
            CliError::Runtime(_) => 4,
        }
    }
}

fn main() -> ExitCode {
    // Rust ignores SIGPIPE, so `kairos check h.jsonl | head` would panic on the closed pipe;
    // restore the default (end quietly), as command-line tools do.
    // SAFETY: called once at start, before any thread exists; SIG_DFL is a valid disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = cli::Cli::parse();
    match cmd::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
