//! `kairos bench swarm --backend shm|tcp`: one protocol run on fresh real memory nodes.
//!
//! `shm` creates one region per node in /dev/shm (removed after the run); `tcp` starts one
//! memory server per node on 127.0.0.1 in this process (the same server as
//! `kairos serve swarm-memory`), stopped after the run. `--crash-node-at-us` sets the crash
//! flag of node 0 (shm) or kills its server (tcp) that long into the measured phase. Client threads share the machine's
//! cores with the memory servers: on a small machine, latency and throughput measure the
//! machine as much as the protocol.

use std::sync::Mutex;

use kairos_harness::swarm::backend::shm::ShmCluster;
use kairos_harness::swarm::backend::tcp::TcpCluster;
use kairos_harness::swarm::real::RealRun;
use kairos_harness::swarm::sim::{Outcome, SwarmRun};

use super::swarm::BackendArg;
use crate::CliError;

pub fn run(backend: BackendArg, run: &SwarmRun, layout_writers: Option<u32>) -> Result<Outcome, CliError> {
    let mut real = RealRun::new(run.clone());
    real.layout_writers = layout_writers;
    let layout = real.layout().map_err(|e| CliError::Usage(e.to_string()))?;
    let (nodes, bytes) = (layout.config.memory_nodes, layout.node_bytes());
    // --crash-node-at-us: crash memory node n that long into the measured phase.
    let crash_at = run.crash_node_at;
    let outcome = match backend {
        BackendArg::Shm => {
            let shm = ShmCluster::create(run.seed, nodes, bytes).map_err(|e| CliError::Io(e.to_string()))?;
            let crash = crash_at.map(|(n, at)| {
                let shm = shm.clone();
                let crash = move || {
                    let _ = shm.crash(n);
                };
                (at, Box::new(crash) as Box<dyn FnOnce() + Send>)
            });
            real.run_on(&shm, crash)
        }
        BackendArg::Tcp => {
            let tcp = Mutex::new(TcpCluster::start_loopback(nodes, bytes).map_err(|e| CliError::Io(e.to_string()))?);
            let backend =
                tcp.lock().map_err(|_| CliError::Runtime("memory servers poisoned".into()))?.backend().clone();
            let crash = crash_at.map(|(n, at)| {
                let tcp = &tcp;
                let kill = move || {
                    if let Ok(mut t) = tcp.lock() {
                        t.kill(n);
                    }
                };
                (at, Box::new(kill) as Box<dyn FnOnce() + Send + '_>)
            });
            real.run_on(&backend, crash)
        }
        BackendArg::Sim => kairos_harness::swarm::run(run),
    };
    outcome.map_err(|e| CliError::Runtime(format!("{} backend: {e}", format!("{backend:?}").to_lowercase())))
}
