//! `kairos serve swarm-memory --listen ADDR --bytes N`: one SWARM memory node as a real process.
//!
//! The process holds `N` zeroed bytes and executes READ / WRITE / CAS / CHAIN frames from any
//! number of clients (up to `--connections-max`), one verb at a time (see
//! `kairos_harness::swarm::backend::tcp`). It runs no protocol logic. Killing it is a memory-node crash.
//! It prints `swarm-memory listening on ADDR` on stdout once it accepts connections, and its
//! counters on stderr when it stops.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kairos_harness::swarm::backend::tcp::{MemoryServer, MemoryServerConfig};

use crate::cli::SwarmMemoryArgs;
use crate::CliError;

pub fn run(args: SwarmMemoryArgs) -> Result<(), CliError> {
    if !(args.idle_timeout_s > 0.0 && args.idle_timeout_s <= 86_400.0) {
        return Err(CliError::Usage(format!(
            "--idle-timeout-s must be a positive number of seconds up to a day, not {}",
            args.idle_timeout_s
        )));
    }
    let duration = match args.duration_s {
        Some(s) if !(s > 0.0 && s <= 86_400.0 * 365.0) => {
            return Err(CliError::Usage(format!("--duration-s must be a positive number of seconds, not {s}")))
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    let config = MemoryServerConfig {
        bytes: args.bytes,
        connections_max: args.connections_max,
        idle_timeout: Duration::from_secs_f64(args.idle_timeout_s),
    };
    let mut server = MemoryServer::start(&args.listen, config).map_err(|e| CliError::Usage(e.to_string()))?;
    println!("swarm-memory listening on {} ({} bytes)", server.local_addr(), args.bytes);
    let _ = std::io::stdout().flush();
    match duration {
        Some(d) => {
            std::thread::sleep(d);
            server.kill();
            let s = server.stats();
            eprintln!(
                "swarm-memory stopped; connections_accepted={} connections_refused={} connections_closed_malformed={} chains_executed={}",
                s.connections_accepted.load(Ordering::Relaxed),
                s.connections_refused.load(Ordering::Relaxed),
                s.connections_closed_malformed.load(Ordering::Relaxed),
                s.chains_executed.load(Ordering::Relaxed),
            );
        }
        None => server.wait(),
    }
    Ok(())
}
