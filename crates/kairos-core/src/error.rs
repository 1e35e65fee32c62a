use thiserror::Error;

/// Errors of the shared vocabulary (today: loading a latency matrix).
#[derive(Debug, Error)]
pub enum CoreError {
    #[error("cannot read latency matrix {path}: {source}")]
    MatrixIo {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("latency matrix {what}, line {line}: {problem}. Expected a CSV with a header `from,<r1>,<r2>,…` and one row of RTTs in milliseconds per region, in the header's order")]
    MatrixFormat { what: String, line: usize, problem: String },
    #[error("unknown region `{0}`; known regions: {1}")]
    UnknownRegion(String, String),
}
