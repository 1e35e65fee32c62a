//! Regions and the one-way latency matrix between them.
//!
//! The reference table (`shared/data/gcp-rtt-ms.csv`) gives round-trip times in milliseconds;
//! one-way delay is RTT / 2. Both hosts use the matrix: the simulator to delay messages, the
//! TCP host to inject per-link delay so local processes behave like a geo deployment.

use crate::error::CoreError;
use crate::ids::RegionId;
use std::time::Duration;

/// Region names and the one-way delay between every ordered pair of regions.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyMatrix {
    names: Vec<String>,
    /// one_way_ns[from][to]
    one_way_ns: Vec<Vec<u64>>,
}

impl LatencyMatrix {
    /// Builds a matrix from region names and round-trip times in ms (`rtt_ms[from][to]`).
    pub fn from_rtt_ms(names: Vec<String>, rtt_ms: Vec<Vec<f64>>) -> Result<Self, CoreError> {
        let bad = |problem: String| CoreError::MatrixFormat { what: "given in code".into(), line: 0, problem };
        if names.is_empty() || names.len() > u8::MAX as usize {
            return Err(bad(format!("needs 1..=255 regions, got {}", names.len())));
        }
        if rtt_ms.len() != names.len() || rtt_ms.iter().any(|r| r.len() != names.len()) {
            return Err(bad("the RTT table must be square, one row and column per region".into()));
        }
        let mut one_way_ns = Vec::with_capacity(names.len());
        for row in &rtt_ms {
            let mut out = Vec::with_capacity(row.len());
            for &rtt in row {
                if !rtt.is_finite() || !(0.0..=3_600_000.0).contains(&rtt) {
                    return Err(bad(format!("RTT {rtt} ms is not a delay between 0 and one hour")));
                }
                out.push((rtt * 1e6 / 2.0).round() as u64);
            }
            one_way_ns.push(out);
        }
        Ok(LatencyMatrix { names, one_way_ns })
    }

    /// Parses the CSV format of `gcp-rtt-ms.csv`: `#` comments, a header `from,r1,r2,…`, then
    /// one row per region in header order with RTTs in milliseconds.
    pub fn parse_rtt_csv(text: &str, what: &str) -> Result<Self, CoreError> {
        let err = |line: usize, problem: String| CoreError::MatrixFormat { what: what.to_string(), line, problem };
        let mut header: Option<Vec<String>> = None;
        let mut rows: Vec<Vec<f64>> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let cells: Vec<&str> = line.split(',').map(str::trim).collect();
            match &header {
                None => {
                    if cells.len() < 2 {
                        return Err(err(line_no, "the header needs `from` and at least one region".into()));
                    }
                    header = Some(cells[1..].iter().map(|s| s.to_string()).collect());
                }
                Some(names) => {
                    let expected = &names[rows.len().min(names.len() - 1)];
                    if rows.len() >= names.len() {
                        return Err(err(line_no, format!("more rows than the {} regions of the header", names.len())));
                    }
                    if cells[0] != expected {
                        return Err(err(line_no, format!("row `{}` is out of order; expected `{expected}`", cells[0])));
                    }
                    if cells.len() != names.len() + 1 {
                        return Err(err(line_no, format!("{} values, expected {}", cells.len() - 1, names.len())));
                    }
                    let row = cells[1..]
                        .iter()
                        .map(|c| {
                            c.parse::<f64>().map_err(|_| err(line_no, format!("`{c}` is not a number of milliseconds")))
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    rows.push(row);
                }
            }
        }
        let names = header.ok_or_else(|| err(0, "no header line".into()))?;
        if rows.len() != names.len() {
            return Err(err(0, format!("{} rows, expected {}", rows.len(), names.len())));
        }
        LatencyMatrix::from_rtt_ms(names, rows).map_err(|e| match e {
            CoreError::MatrixFormat { problem, .. } => err(0, problem),
            other => other,
        })
    }

    /// Loads a CSV file in the format of [`LatencyMatrix::parse_rtt_csv`].
    pub fn load_rtt_csv(path: &std::path::Path) -> Result<Self, CoreError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| CoreError::MatrixIo { path: path.display().to_string(), source })?;
        Self::parse_rtt_csv(&text, &path.display().to_string())
    }

    /// The Tiga evaluation's four Google Cloud regions (sc, fi, br, hk), compiled in from
    /// `shared/data/gcp-rtt-ms.csv` so that a binary needs no data file to run.
    pub fn gcp() -> Self {
        Self::parse_rtt_csv(GCP_RTT_MS_CSV, "built-in gcp-rtt-ms.csv").expect("the built-in matrix parses")
    }

    /// A single region with the given intra-region one-way delay (for local tests).
    pub fn single(name: &str, one_way: Duration) -> Self {
        LatencyMatrix { names: vec![name.to_string()], one_way_ns: vec![vec![crate::duration_nanos(one_way)]] }
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
    pub fn name(&self, r: RegionId) -> &str {
        &self.names[r.index()]
    }
    pub fn names(&self) -> &[String] {
        &self.names
    }
    pub fn region(&self, name: &str) -> Result<RegionId, CoreError> {
        self.names
            .iter()
            .position(|n| n == name)
            .map(|i| RegionId(i as u8))
            .ok_or_else(|| CoreError::UnknownRegion(name.to_string(), self.names.join(", ")))
    }
    /// One-way delay from `from` to `to`.
    pub fn one_way(&self, from: RegionId, to: RegionId) -> Duration {
        Duration::from_nanos(self.one_way_ns[from.index()][to.index()])
    }
}

/// Copy of `shared/data/gcp-rtt-ms.csv` (a test checks that they are the same).
pub const GCP_RTT_MS_CSV: &str = include_str!("../data/gcp-rtt-ms.csv");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gcp_matrix_is_half_the_rtt() {
        let m = LatencyMatrix::gcp();
        assert_eq!(m.names(), &["sc", "fi", "br", "hk"]);
        let sc = m.region("sc").unwrap();
        let hk = m.region("hk").unwrap();
        assert_eq!(m.one_way(sc, hk), Duration::from_micros(98_350));
        assert_eq!(m.one_way(sc, sc), Duration::from_micros(250));
        assert!(m.region("mars").is_err());
    }

    #[test]
    fn builtin_copy_matches_the_shared_reference_data() {
        let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/gcp-rtt-ms.csv");
        if let Ok(text) = std::fs::read_to_string(&shared) {
            assert_eq!(text, GCP_RTT_MS_CSV, "crates/kairos-core/data/gcp-rtt-ms.csv drifted from shared/data");
        }
    }

    #[test]
    fn malformed_tables_are_clear_errors() {
        for (bad, needle) in [
            ("from,a,b\na,0,1\n", "rows"),
            ("from,a,b\nb,0,1\na,1,0\n", "out of order"),
            ("from,a\na,x\n", "not a number"),
            ("from,a\na,-3\n", "between 0"),
            ("", "no header"),
        ] {
            let e = LatencyMatrix::parse_rtt_csv(bad, "t").unwrap_err().to_string();
            assert!(e.contains(needle), "{e} should mention {needle}");
        }
    }
}
