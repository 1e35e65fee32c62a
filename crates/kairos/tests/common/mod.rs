//! Helpers shared by the tests that run Kairos as real processes.

use std::path::{Path, PathBuf};

/// `n` loopback ports free at the time of the call, for child processes to listen on.
///
/// They come from below Linux's ephemeral range (32768–60999 by default), not from
/// `bind(127.0.0.1:0)`: a port the kernel hands out that way is ephemeral, and once the test
/// releases it for the child, the kernel may give it to any outgoing connection (a member
/// dialling another, a client of a parallel test) before the child binds it, and the child
/// fails with "address in use". Each test binary starts at its own offset (by process id) and
/// counts up, so the parallel tests of one binary never share a port; a port some other process
/// holds is skipped.
pub fn free_ports(n: usize) -> Vec<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const PORTS: u32 = 32_768 - FIRST;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(u32::MAX, std::process::id() % 64 * (PORTS / 64), Ordering::SeqCst, Ordering::SeqCst);
    let mut ports = Vec::with_capacity(n);
    for _ in 0..PORTS {
        if ports.len() == n {
            break;
        }
        let port = (FIRST + NEXT.fetch_add(1, Ordering::SeqCst) % PORTS) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    assert_eq!(ports.len(), n, "no {n} free loopback ports between {FIRST} and 32767");
    ports
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
