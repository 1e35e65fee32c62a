//! The one error of every simulated deployment the harness builds and runs.

/// A deployment that cannot be built as described, or a run that broke an invariant.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// The run broke an invariant and stopped at that event.
    #[error("{0}")]
    Invariant(kairos_sim::Violation),
    #[error("{0}")]
    Region(#[from] kairos_core::CoreError),
    #[error("{0}")]
    Workload(#[from] kairos_workload::WorkloadError),
    /// The deployment's sizes cannot run (no replicas, no sessions, too many members…); the
    /// message says what is allowed.
    #[error("{0}")]
    Shape(String),
}
