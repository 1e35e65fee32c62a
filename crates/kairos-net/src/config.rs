//! The cluster configuration: a TOML file naming the cluster, its latency matrix and its nodes.
//!
//! ```toml
//! [cluster]
//! name = "demo"
//! latency = "gcp"            # built-in matrix, or a path to an RTT CSV (relative to this file); default "gcp"
//! inject_delay = true        # add the matrix one-way delay on every link; default false
//! max_frame_bytes = 4194304  # optional, default 4 MiB
//!
//! [[node]]
//! id = 0
//! addr = "127.0.0.1:7100"
//! region = "sc"
//! role = "replica"           # optional free-form string for the command line
//! mongo_addr = "127.0.0.1:27017"  # optional: where this node's MongoDB listener is (`hello` lists it)
//! ```

use crate::frame::DEFAULT_MAX_FRAME_BYTES;
use kairos_core::{CoreError, LatencyMatrix, NodeId, RegionId};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;
use toml::Spanned;

/// Smallest accepted `max_frame_bytes` (a Hello must fit).
pub const MIN_MAX_FRAME_BYTES: u32 = 256;
/// Longest cluster name in bytes: it travels in every connection's Hello, which the host reads
/// with a small frame limit.
pub const CLUSTER_NAME_MAX_BYTES: usize = 256;
/// Largest accepted `max_frame_bytes` (256 MiB).
pub const MAX_MAX_FRAME_BYTES: u32 = 256 * 1024 * 1024;

/// What is wrong with a cluster configuration, and what to do about it.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read cluster config {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}, line {line}, column {column}: {message}")]
    Syntax { origin: String, line: usize, column: usize, message: String },
    #[error("{origin}: the cluster has no nodes; add at least one [[node]] table with id, addr and region")]
    NoNodes { origin: String },
    #[error("{at}: node id {id} is used twice (first {first}); node ids must be unique")]
    DuplicateId { at: String, id: u32, first: String },
    #[error("{origin}: node ids must be dense 0..{n} but id {missing} is missing; renumber the nodes 0, 1, 2, …")]
    IdsNotDense { origin: String, n: usize, missing: u32 },
    #[error("{at}: node {id} has address {addr}, already used by node {other}; every node needs its own address")]
    DuplicateAddr { at: String, id: u32, other: u32, addr: SocketAddr },
    #[error("{at}: node {id} has address `{addr}`, {problem}; write an IP and a fixed port like \"127.0.0.1:7100\" (host names are not resolved)")]
    BadAddr { at: String, id: u32, addr: String, problem: String },
    #[error("{at}: node {id} is in unknown region `{region}`; the latency matrix knows: {known}")]
    UnknownRegion { at: String, id: u32, region: String, known: String },
    #[error("{origin}: latency matrix `{latency}`: {source}. Use latency = \"gcp\" for the built-in matrix or the path of an RTT CSV (relative to the config file)")]
    Latency {
        origin: String,
        latency: String,
        #[source]
        source: CoreError,
    },
    #[error("{origin}: {problem}")]
    Invalid { origin: String, problem: String },
}

/// One node of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    pub id: NodeId,
    pub addr: SocketAddr,
    /// Region name, one of the latency matrix's.
    pub region: String,
    /// Free-form role name for the command line to choose the protocol role (may be empty).
    pub role: String,
}

/// A validated cluster: ids are dense `0..n`, addresses are unique, regions exist in the matrix.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    name: String,
    matrix: LatencyMatrix,
    nodes: Vec<NodeSpec>,
    regions: Vec<RegionId>,
    inject_delay: bool,
    max_frame_bytes: u32,
    /// `mongo_addr` of the nodes that have one.
    mongo_addrs: BTreeMap<NodeId, SocketAddr>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    cluster: RawCluster,
    #[serde(default)]
    node: Vec<RawNode>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    name: String,
    latency: Option<String>,
    #[serde(default)]
    inject_delay: bool,
    max_frame_bytes: Option<Spanned<u32>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    id: Spanned<u32>,
    addr: Spanned<String>,
    region: Spanned<String>,
    #[serde(default)]
    role: String,
    mongo_addr: Option<Spanned<String>>,
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

fn check_addr(text: &str, id: u32, at: &str) -> Result<SocketAddr, ConfigError> {
    let bad = |problem: String| ConfigError::BadAddr { at: at.to_string(), id, addr: text.to_string(), problem };
    let addr = text.parse::<SocketAddr>().map_err(|e| bad(format!("which is not an address ({e})")))?;
    if addr.port() == 0 {
        return Err(bad("whose port 0 peers cannot dial".into()));
    }
    Ok(addr)
}

impl ClusterConfig {
    /// Reads and validates a cluster config file. A relative `latency` path is resolved
    /// against the directory of the file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Io { path: path.display().to_string(), source })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse_in(&text, &path.display().to_string(), &base)
    }

    /// Parses and validates config text; `origin` names it in errors. A relative `latency`
    /// path is resolved against the current directory.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        Self::parse_in(text, origin, Path::new(""))
    }

    fn parse_in(text: &str, origin: &str, base: &Path) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map_or((0, 0), |s| line_col(text, s.start));
            ConfigError::Syntax { origin: origin.to_string(), line, column, message: e.message().trim().to_string() }
        })?;
        let latency = raw.cluster.latency.unwrap_or_else(|| "gcp".to_string());
        let matrix = if latency == "gcp" {
            LatencyMatrix::gcp()
        } else {
            let p = PathBuf::from(&latency);
            let p = if p.is_relative() { base.join(p) } else { p };
            LatencyMatrix::load_rtt_csv(&p).map_err(|source| ConfigError::Latency {
                origin: origin.to_string(),
                latency: latency.clone(),
                source,
            })?
        };
        let at = |offset: usize| format!("{origin}, line {}", line_col(text, offset).0);
        // Check in file order so the first problem in the file is the one reported.
        let mut nodes = Vec::with_capacity(raw.node.len());
        let mut first_id: BTreeMap<u32, usize> = BTreeMap::new();
        let mut seen_addr: BTreeMap<SocketAddr, u32> = BTreeMap::new();
        for n in &raw.node {
            let id = *n.id.get_ref();
            let addr_at = at(n.addr.span().start);
            let addr = check_addr(n.addr.get_ref(), id, &addr_at)?;
            if let Some(&first) = first_id.get(&id) {
                return Err(ConfigError::DuplicateId {
                    at: at(n.id.span().start),
                    id,
                    first: format!("at line {}", line_col(text, first).0),
                });
            }
            first_id.insert(id, n.id.span().start);
            if let Some(&other) = seen_addr.get(&addr) {
                return Err(ConfigError::DuplicateAddr { at: addr_at, id, other, addr });
            }
            seen_addr.insert(addr, id);
            if matrix.region(n.region.get_ref()).is_err() {
                return Err(ConfigError::UnknownRegion {
                    at: at(n.region.span().start),
                    id,
                    region: n.region.get_ref().clone(),
                    known: matrix.names().join(", "),
                });
            }
            nodes.push(NodeSpec { id: NodeId(id), addr, region: n.region.get_ref().clone(), role: n.role.clone() });
        }
        let mut mongo_addrs = BTreeMap::new();
        for n in &raw.node {
            if let Some(m) = &n.mongo_addr {
                let id = *n.id.get_ref();
                let addr = check_addr(m.get_ref(), id, &at(m.span().start))?;
                if let Some(&other) = seen_addr.get(&addr) {
                    return Err(ConfigError::DuplicateAddr { at: at(m.span().start), id, other, addr });
                }
                seen_addr.insert(addr, id);
                mongo_addrs.insert(NodeId(id), addr);
            }
        }
        let mut cfg = Self::build(origin, raw.cluster.name, matrix, nodes)?;
        cfg.mongo_addrs = mongo_addrs;
        cfg.inject_delay = raw.cluster.inject_delay;
        if let Some(m) = raw.cluster.max_frame_bytes {
            cfg = cfg.with_max_frame_bytes(*m.get_ref()).map_err(|e| match e {
                ConfigError::Invalid { problem, .. } => ConfigError::Invalid { origin: at(m.span().start), problem },
                other => other,
            })?;
        }
        Ok(cfg)
    }

    /// Builds a validated config in code (tests, local demos). `nodes` may come in any order;
    /// delay injection is off and the frame limit is the default until changed with
    /// [`ClusterConfig::with_inject_delay`] and [`ClusterConfig::with_max_frame_bytes`].
    pub fn new(name: impl Into<String>, matrix: LatencyMatrix, nodes: Vec<NodeSpec>) -> Result<Self, ConfigError> {
        Self::build("cluster config", name.into(), matrix, nodes)
    }

    fn build(origin: &str, name: String, matrix: LatencyMatrix, mut nodes: Vec<NodeSpec>) -> Result<Self, ConfigError> {
        let err = |problem: String| ConfigError::Invalid { origin: origin.to_string(), problem };
        if name.trim().is_empty() {
            return Err(err("the cluster name is empty; set `name` in [cluster]".into()));
        }
        if name.len() > CLUSTER_NAME_MAX_BYTES {
            return Err(err(format!(
                "the cluster name is {} bytes; keep it to {CLUSTER_NAME_MAX_BYTES} (it travels in every connection's Hello)",
                name.len()
            )));
        }
        if nodes.is_empty() {
            return Err(ConfigError::NoNodes { origin: origin.to_string() });
        }
        nodes.sort_by_key(|n| n.id);
        let at = |id: NodeId| format!("{origin}, node {}", id.0);
        for w in nodes.windows(2) {
            if w[0].id == w[1].id {
                return Err(ConfigError::DuplicateId { at: at(w[1].id), id: w[1].id.0, first: "earlier".into() });
            }
        }
        if let Some(missing) = (0..nodes.len()).find(|&i| nodes[i].id.index() != i) {
            return Err(ConfigError::IdsNotDense {
                origin: origin.to_string(),
                n: nodes.len(),
                missing: missing as u32,
            });
        }
        let mut seen: BTreeMap<SocketAddr, u32> = BTreeMap::new();
        let mut regions = Vec::with_capacity(nodes.len());
        for n in &nodes {
            check_addr(&n.addr.to_string(), n.id.0, &at(n.id))?;
            if let Some(&other) = seen.get(&n.addr) {
                return Err(ConfigError::DuplicateAddr { at: at(n.id), id: n.id.0, other, addr: n.addr });
            }
            seen.insert(n.addr, n.id.0);
            let region = matrix.region(&n.region).map_err(|_| ConfigError::UnknownRegion {
                at: at(n.id),
                id: n.id.0,
                region: n.region.clone(),
                known: matrix.names().join(", "),
            })?;
            regions.push(region);
        }
        Ok(ClusterConfig {
            name,
            matrix,
            nodes,
            regions,
            inject_delay: false,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            mongo_addrs: BTreeMap::new(),
        })
    }

    /// Turns per-link delay injection on or off.
    pub fn with_inject_delay(mut self, on: bool) -> Self {
        self.inject_delay = on;
        self
    }

    /// Sets the frame payload limit (between [`MIN_MAX_FRAME_BYTES`] and [`MAX_MAX_FRAME_BYTES`]).
    pub fn with_max_frame_bytes(mut self, max: u32) -> Result<Self, ConfigError> {
        if !(MIN_MAX_FRAME_BYTES..=MAX_MAX_FRAME_BYTES).contains(&max) {
            return Err(ConfigError::Invalid {
                origin: "cluster config".into(),
                problem: format!(
                    "max_frame_bytes = {max} is out of range; use {MIN_MAX_FRAME_BYTES} ..= {MAX_MAX_FRAME_BYTES}"
                ),
            });
        }
        self.max_frame_bytes = max;
        Ok(self)
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    /// The nodes, indexed by id.
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }
    pub fn node(&self, id: NodeId) -> Option<&NodeSpec> {
        self.nodes.get(id.index())
    }
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
    pub fn contains(&self, id: NodeId) -> bool {
        id.index() < self.nodes.len()
    }
    /// Ids of the nodes whose `role` is `role`.
    pub fn nodes_with_role(&self, role: &str) -> Vec<NodeId> {
        self.nodes.iter().filter(|n| n.role == role).map(|n| n.id).collect()
    }
    pub fn matrix(&self) -> &LatencyMatrix {
        &self.matrix
    }
    pub fn region_of(&self, id: NodeId) -> Option<RegionId> {
        self.regions.get(id.index()).copied()
    }
    /// The node's MongoDB listener address (`mongo_addr`), if the file gives one.
    pub fn mongo_addr(&self, id: NodeId) -> Option<SocketAddr> {
        self.mongo_addrs.get(&id).copied()
    }
    pub fn inject_delay(&self) -> bool {
        self.inject_delay
    }
    pub fn max_frame_bytes(&self) -> u32 {
        self.max_frame_bytes
    }
    /// The delay the host adds to every message from `from` to `to`: the matrix one-way delay
    /// between their regions if `inject_delay` is on, else zero (and zero for unknown ids).
    pub fn injected_delay(&self, from: NodeId, to: NodeId) -> Duration {
        match (self.inject_delay, self.region_of(from), self.region_of(to)) {
            (true, Some(a), Some(b)) => self.matrix.one_way(a, b),
            _ => Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[cluster]
name = "demo"
latency = "gcp"
inject_delay = true
max_frame_bytes = 65536

[[node]]
id = 1
addr = "127.0.0.1:7101"
region = "fi"

[[node]]
id = 0
addr = "127.0.0.1:7100"
region = "sc"
role = "replica"
"#;

    fn err(text: &str) -> String {
        ClusterConfig::parse(text, "t.toml").unwrap_err().to_string()
    }

    fn with_nodes(nodes: &str) -> String {
        format!("[cluster]\nname = \"demo\"\n{nodes}")
    }

    #[test]
    fn parses_a_good_config() {
        let c = ClusterConfig::parse(GOOD, "t.toml").unwrap();
        assert_eq!(c.name(), "demo");
        assert_eq!(c.len(), 2);
        assert_eq!(c.node(NodeId(0)).unwrap().role, "replica");
        assert_eq!(c.node(NodeId(1)).unwrap().role, "");
        assert_eq!(c.nodes_with_role("replica"), vec![NodeId(0)]);
        assert!(c.inject_delay());
        assert_eq!(c.max_frame_bytes(), 65536);
        // sc -> fi is half the 116.5 ms RTT of the GCP table (whatever it is, it is symmetric and > 0).
        let d = c.injected_delay(NodeId(0), NodeId(1));
        assert!(d > Duration::from_millis(10));
        assert_eq!(d, c.injected_delay(NodeId(1), NodeId(0)));
        assert_eq!(c.clone().with_inject_delay(false).injected_delay(NodeId(0), NodeId(1)), Duration::ZERO);
    }

    #[test]
    fn defaults_to_the_gcp_matrix_without_delay() {
        let c =
            ClusterConfig::parse(&with_nodes("[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\nregion = \"hk\"\n"), "t.toml")
                .unwrap();
        assert_eq!(c.matrix().names().len(), 4);
        assert!(!c.inject_delay());
        assert_eq!(c.max_frame_bytes(), DEFAULT_MAX_FRAME_BYTES);
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let e = err("[cluster]\nname = \"x\"\n\n[[node]\nid = 0\n");
        assert!(e.contains("t.toml, line 4"), "{e}");
    }

    #[test]
    fn unknown_fields_are_rejected_with_their_line() {
        let e = err(&with_nodes("[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\nregion = \"sc\"\nzone = \"a\"\n"));
        assert!(e.contains("unknown field `zone`") && e.contains("line 7"), "{e}");
        let e = err("[cluster]\nname = \"d\"\nlatncy = \"gcp\"\n");
        assert!(e.contains("unknown field `latncy`") && e.contains("line 3"), "{e}");
    }

    #[test]
    fn missing_cluster_section_or_field() {
        assert!(err("[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\nregion = \"sc\"\n").contains("missing field `cluster`"));
        let e = err(&with_nodes("[[node]]\nid = 0\nregion = \"sc\"\n"));
        assert!(e.contains("missing field `addr`"), "{e}");
    }

    #[test]
    fn empty_node_list() {
        assert!(err("[cluster]\nname = \"d\"\n").contains("no nodes"));
    }

    #[test]
    fn duplicate_id() {
        let e = err(&with_nodes(
            "[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\nregion = \"sc\"\n[[node]]\nid = 0\naddr = \"127.0.0.1:2\"\nregion = \"sc\"\n",
        ));
        assert!(e.contains("node id 0 is used twice") && e.contains("line 8") && e.contains("line 4"), "{e}");
    }

    #[test]
    fn ids_not_dense() {
        let e = err(&with_nodes(
            "[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\nregion = \"sc\"\n[[node]]\nid = 2\naddr = \"127.0.0.1:2\"\nregion = \"sc\"\n",
        ));
        assert!(e.contains("dense 0..2") && e.contains("id 1 is missing"), "{e}");
    }

    #[test]
    fn duplicate_addr() {
        let e = err(&with_nodes(
            "[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\nregion = \"sc\"\n[[node]]\nid = 1\naddr = \"127.0.0.1:1\"\nregion = \"sc\"\n",
        ));
        assert!(e.contains("already used by node 0") && e.contains("line 9"), "{e}");
    }

    #[test]
    fn unparsable_addr() {
        for bad in ["localhost:7100", "127.0.0.1", "127.0.0.1:99999", "127.0.0.1:0"] {
            let e = err(&with_nodes(&format!("[[node]]\nid = 0\naddr = \"{bad}\"\nregion = \"sc\"\n")));
            assert!(e.contains(bad) && e.contains("127.0.0.1:7100"), "{e}");
        }
    }

    #[test]
    fn unknown_region_lists_the_known_ones() {
        let e = err(&with_nodes("[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\nregion = \"mars\"\n"));
        assert!(e.contains("unknown region `mars`") && e.contains("sc, fi, br, hk") && e.contains("line 6"), "{e}");
    }

    #[test]
    fn missing_latency_file() {
        let e = err("[cluster]\nname = \"d\"\nlatency = \"/nonexistent/rtt.csv\"\n[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\nregion = \"sc\"\n");
        assert!(e.contains("/nonexistent/rtt.csv") && e.contains("latency = \"gcp\""), "{e}");
    }

    #[test]
    fn latency_csv_relative_to_the_config_file() {
        let dir = std::env::temp_dir().join(format!("kairos-net-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("rtt.csv"), "from,a,b\na,1,80\nb,80,1\n").unwrap();
        std::fs::write(
            dir.join("c.toml"),
            "[cluster]\nname = \"d\"\nlatency = \"rtt.csv\"\ninject_delay = true\n[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\nregion = \"a\"\n[[node]]\nid = 1\naddr = \"127.0.0.1:2\"\nregion = \"b\"\n",
        )
        .unwrap();
        let c = ClusterConfig::load(dir.join("c.toml")).unwrap();
        assert_eq!(c.injected_delay(NodeId(0), NodeId(1)), Duration::from_millis(40));
        assert!(ClusterConfig::load(dir.join("absent.toml")).unwrap_err().to_string().contains("cannot read"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn frame_limit_range_and_empty_name() {
        let e = err("[cluster]\nname = \"d\"\nmax_frame_bytes = 10\n[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\nregion = \"sc\"\n");
        assert!(e.contains("out of range") && e.contains("line 3"), "{e}");
        assert!(err("[cluster]\nname = \" \"\n[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\nregion = \"sc\"\n")
            .contains("name is empty"));
        let long = format!(
            "[cluster]\nname = \"{}\"\n[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\nregion = \"sc\"\n",
            "n".repeat(300)
        );
        assert!(err(&long).contains("keep it to 256"), "{}", err(&long));
    }

    #[test]
    fn built_in_code_is_validated_too() {
        let spec = |id, port, region: &str| NodeSpec {
            id: NodeId(id),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            region: region.into(),
            role: String::new(),
        };
        let m = LatencyMatrix::gcp;
        assert!(ClusterConfig::new("x", m(), vec![spec(1, 2, "sc"), spec(0, 1, "hk")]).is_ok());
        assert!(matches!(
            ClusterConfig::new("x", m(), vec![spec(0, 1, "sc"), spec(0, 2, "sc")]),
            Err(ConfigError::DuplicateId { .. })
        ));
        assert!(matches!(ClusterConfig::new("x", m(), vec![spec(1, 1, "sc")]), Err(ConfigError::IdsNotDense { .. })));
        assert!(matches!(ClusterConfig::new("x", m(), vec![spec(0, 1, "xx")]), Err(ConfigError::UnknownRegion { .. })));
        assert!(matches!(ClusterConfig::new("x", m(), vec![]), Err(ConfigError::NoNodes { .. })));
    }
}
