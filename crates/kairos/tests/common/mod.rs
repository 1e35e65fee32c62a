//! Helpers shared by the tests that run Kairos as real processes.

use std::path::{Path, PathBuf};

/// `n` loopback ports free at the time of the call.
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<_> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    listeners.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

/// Kills the child processes when the test ends, however it ends.
pub struct Children(pub Vec<std::process::Child>);
impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Merges the JSON-lines histories of several client processes into `out`, in time order and
/// re-indexed (with `one_process`, every record gets process 0: one logical client). Returns
/// how many records it wrote.
pub fn merge_histories(histories: &[PathBuf], out: &Path, one_process: bool) -> usize {
    let mut lines: Vec<serde_json::Value> = histories
        .iter()
        .flat_map(|h| {
            std::fs::read_to_string(h).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect::<Vec<_>>()
        })
        .collect();
    lines.sort_by_key(|v: &serde_json::Value| v["time"].as_u64().unwrap());
    let body: String = lines
        .iter_mut()
        .enumerate()
        .map(|(i, v)| {
            v["index"] = i.into();
            if one_process {
                v["process"] = 0.into();
            }
            format!("{v}\n")
        })
        .collect();
    std::fs::write(out, body).unwrap();
    lines.len()
}
