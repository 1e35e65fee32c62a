//! Shared-memory memory nodes (CXL-style): one file per node in `/dev/shm`, mapped by every
//! client thread and process that uses the node.
//!
//! ```text
//! region file = 64-byte header + node bytes (rounded up to whole words)
//! header word 0  magic b"KRSWSHM1"
//!             1  node length in bytes
//!             2  crashed flag (0 = alive; anything else = crashed)
//!             3  pid of the creating process (the owner, who removes the file)
//!             4  node index
//! ```
//!
//! All accesses are atomic word accesses ([`AtomicWords`]): CAS is a real `compare_exchange`
//! on the mapped word, large reads may tear under concurrent writes. A crash is the header
//! flag: a port checks it before every verb and silently drops the rest of a chain to a crashed
//! node (a prefix may stay applied), so the chain never completes, as with a node that died.
//! Clocks are perfectly shared between processes here; the driver injects per-client offsets.
//!
//! Names are `kairos-swarm-<pid>-<seed>-<n>-node<i>` (n counts clusters created by this
//! process), so concurrent runs never share a region by accident. The creator removes the
//! files when its [`ShmCluster`] is dropped; processes that [`ShmCluster::open`] them do not.
//! Regions of processes that died without cleaning up are removed by the next
//! [`ShmCluster::create`] ([`remove_stale_regions`]).
//! Whoever truncates a mapped file makes every user fault (SIGBUS): do not touch the files
//! while a run uses them.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use memmap2::MmapRaw;

use super::atomic::AtomicWords;
use super::{BackendError, Completion, MemoryBackend, MemoryPort, PORT_IN_FLIGHT_MAX};
use kairos_swarm::verbs::{Chain, MemNodeId, VerbError, CHAIN_VERBS_MAX};

/// First header word of every region.
pub const SHM_MAGIC: u64 = u64::from_le_bytes(*b"KRSWSHM1");
/// Header size in bytes (node data starts at this offset in the file).
pub const SHM_HEADER_BYTES: u64 = 64;
/// Largest node a region may hold (tmpfs pages are allocated on first touch).
pub const SHM_NODE_BYTES_MAX: u64 = 1 << 36;

const HDR_MAGIC: usize = 0;
const HDR_LEN: usize = 1;
const HDR_CRASHED: usize = 2;
const HDR_OWNER_PID: usize = 3;
const HDR_NODE: usize = 4;

static CLUSTERS_CREATED: AtomicUsize = AtomicUsize::new(0);

/// One memory node's mapped region.
pub struct ShmRegion {
    map: MmapRaw,
    path: PathBuf,
    /// Created by this value (and so removed when it drops).
    created: bool,
    data_words: usize,
}

fn shm_err(path: &Path, what: impl std::fmt::Display) -> BackendError {
    BackendError::Shm { path: path.display().to_string(), what: what.to_string() }
}

impl ShmRegion {
    /// Creates a new zeroed region file of `len_bytes` node bytes; fails if the file exists.
    pub fn create(path: &Path, node: MemNodeId, len_bytes: u64) -> Result<Self, BackendError> {
        if len_bytes == 0 || len_bytes > SHM_NODE_BYTES_MAX {
            return Err(shm_err(path, format!("node size {len_bytes} bytes is not in 1..={SHM_NODE_BYTES_MAX}")));
        }
        let data_words = len_bytes.div_ceil(8);
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path).map_err(|e| {
            shm_err(path, format!("cannot create ({e}); if a stale run left it behind, remove it or use another seed"))
        })?;
        // From here on the file exists; remove it again if mapping fails.
        let result = (|| {
            file.set_len(SHM_HEADER_BYTES + data_words * 8)
                .map_err(|e| shm_err(path, format!("cannot size the region ({e}); is /dev/shm full?")))?;
            let map = MmapRaw::map_raw(&file).map_err(|e| shm_err(path, format!("cannot map ({e})")))?;
            let region = ShmRegion { map, path: path.to_path_buf(), created: true, data_words: data_words as usize };
            region.header(HDR_LEN).store(data_words * 8, Ordering::Relaxed);
            region.header(HDR_OWNER_PID).store(u64::from(std::process::id()), Ordering::Relaxed);
            region.header(HDR_NODE).store(u64::from(node), Ordering::Relaxed);
            region.header(HDR_MAGIC).store(SHM_MAGIC, Ordering::Release);
            Ok(region)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(path);
        }
        result
    }

    /// Maps an existing region created by another process (or this one). Checks the header
    /// against the file size, so a foreign or damaged file is an error, not a fault.
    pub fn open(path: &Path) -> Result<Self, BackendError> {
        let file: File = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| shm_err(path, format!("cannot open ({e}); is the run that creates it still up?")))?;
        let file_len = file.metadata().map_err(|e| shm_err(path, e))?.len();
        if file_len < SHM_HEADER_BYTES || (file_len - SHM_HEADER_BYTES) & 7 != 0 {
            return Err(shm_err(path, format!("{file_len} bytes is not a Kairos memory region")));
        }
        let map = MmapRaw::map_raw(&file).map_err(|e| shm_err(path, format!("cannot map ({e})")))?;
        let data_words = ((file_len - SHM_HEADER_BYTES) / 8) as usize;
        let region = ShmRegion { map, path: path.to_path_buf(), created: false, data_words };
        let magic = region.header(HDR_MAGIC).load(Ordering::Acquire);
        if magic != SHM_MAGIC {
            return Err(shm_err(path, format!("magic {magic:#018x} is not a Kairos memory region's")));
        }
        let len = region.header(HDR_LEN).load(Ordering::Relaxed);
        if len != data_words as u64 * 8 {
            return Err(shm_err(path, format!("header says {len} node bytes, the file holds {}", data_words * 8)));
        }
        Ok(region)
    }

    fn all_words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is page-aligned, `SHM_HEADER_BYTES + data_words * 8` bytes long
        // (checked against the file size when created or opened) and lives as long as `self`.
        // AtomicU64 has the size and alignment of u64 and allows shared mutation; every access
        // to the region in this crate goes through these atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.map.as_ptr() as *const AtomicU64,
                SHM_HEADER_BYTES as usize / 8 + self.data_words,
            )
        }
    }

    fn header(&self, word: usize) -> &AtomicU64 {
        &self.all_words()[word]
    }

    /// The node's bytes.
    pub fn data(&self) -> AtomicWords<'_> {
        AtomicWords::new(&self.all_words()[SHM_HEADER_BYTES as usize / 8..])
    }

    /// Bytes of node addresses `start..end` backed by allocated tmpfs pages (found with
    /// `SEEK_DATA` / `SEEK_HOLE`: a page exists once something wrote it).
    pub fn allocated_bytes_in(&self, start: u64, end: u64) -> Result<u64, BackendError> {
        use std::os::fd::AsRawFd;
        let file = File::open(&self.path).map_err(|e| shm_err(&self.path, format!("cannot open ({e})")))?;
        let fd = file.as_raw_fd();
        let stop = SHM_HEADER_BYTES + end.min(self.data_words as u64 * 8);
        let (mut pos, mut total) = (SHM_HEADER_BYTES + start, 0);
        while pos < stop {
            // SAFETY: lseek on a file descriptor this function owns; no memory is passed.
            let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
            if data < 0 || data as u64 >= stop {
                break; // ENXIO: no data at or after `pos`
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
            let hole = if hole < 0 { stop } else { (hole as u64).min(stop) };
            total += hole - data as u64;
            pos = hole;
        }
        Ok(total)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_crashed(&self) -> bool {
        self.header(HDR_CRASHED).load(Ordering::Acquire) != 0
    }

    /// Marks the node crashed for every client of every process: none of its verbs completes
    /// from now on.
    pub fn crash(&self) {
        self.header(HDR_CRASHED).store(1, Ordering::Release);
    }
}

impl Drop for ShmRegion {
    fn drop(&mut self) {
        if self.created && self.header(HDR_OWNER_PID).load(Ordering::Relaxed) == u64::from(std::process::id()) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Where regions live: `/dev/shm` when it exists (Linux), else the temporary directory.
pub fn default_shm_dir() -> PathBuf {
    let dev_shm = Path::new("/dev/shm");
    if dev_shm.is_dir() {
        dev_shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Removes regions left behind by processes that no longer exist (a run killed before it
/// could clean up), so that /dev/shm does not fill up. Needs `/proc` (Linux); elsewhere it
/// does nothing.
pub fn remove_stale_regions(dir: &Path) -> usize {
    if !Path::new("/proc/self").exists() {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("kairos-swarm-")).and_then(|r| r.split('-').next())
        else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The memory nodes of one run, as shared-memory regions.
#[derive(Clone)]
pub struct ShmCluster {
    regions: Arc<Vec<ShmRegion>>,
}

impl ShmCluster {
    /// Creates `nodes` zeroed regions of `bytes_per_node` bytes in [`default_shm_dir`], named
    /// after this process and `seed`. They are removed when the last clone of this value drops.
    pub fn create(seed: u64, nodes: u32, bytes_per_node: u64) -> Result<Self, BackendError> {
        Self::create_in(&default_shm_dir(), seed, nodes, bytes_per_node)
    }

    /// [`ShmCluster::create`] in directory `dir`.
    pub fn create_in(dir: &Path, seed: u64, nodes: u32, bytes_per_node: u64) -> Result<Self, BackendError> {
        if nodes == 0 || nodes > 1024 {
            return Err(BackendError::Config(format!("{nodes} memory nodes: use 1 to 1024")));
        }
        remove_stale_regions(dir);
        let n = CLUSTERS_CREATED.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("kairos-swarm-{}-{seed}-{n}", std::process::id());
        let regions = (0..nodes)
            .map(|i| ShmRegion::create(&dir.join(format!("{prefix}-node{i}")), i, bytes_per_node))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ShmCluster { regions: Arc::new(regions) })
    }

    /// Attaches to regions another process created (in node order); never removes them.
    pub fn open(paths: &[PathBuf]) -> Result<Self, BackendError> {
        if paths.is_empty() {
            return Err(BackendError::Config("no region paths given".into()));
        }
        let regions = paths.iter().map(|p| ShmRegion::open(p)).collect::<Result<Vec<_>, _>>()?;
        Ok(ShmCluster { regions: Arc::new(regions) })
    }

    /// The region files in node order (give them to [`ShmCluster::open`] in other processes).
    pub fn paths(&self) -> Vec<PathBuf> {
        self.regions.iter().map(|r| r.path.clone()).collect()
    }

    pub fn region(&self, node: MemNodeId) -> Option<&ShmRegion> {
        self.regions.get(node as usize)
    }

    /// Crashes `node` for every client in every process.
    pub fn crash(&self, node: MemNodeId) -> Result<(), BackendError> {
        let nodes = self.regions.len() as u32;
        self.region(node).ok_or(BackendError::NoSuchNode { node, nodes })?.crash();
        Ok(())
    }
}

impl MemoryBackend for ShmCluster {
    fn nodes(&self) -> u32 {
        self.regions.len() as u32
    }

    fn connect(&self, _client: u32) -> Result<Box<dyn MemoryPort>, BackendError> {
        Ok(Box::new(ShmPort { regions: self.regions.clone(), done: VecDeque::new() }))
    }

    fn allocated_bytes_in(&self, node: MemNodeId, start: u64, end: u64) -> Option<u64> {
        self.region(node)?.allocated_bytes_in(start, end).ok()
    }

    fn name(&self) -> &'static str {
        "shm"
    }
}

/// One client's view of a [`ShmCluster`]: executes chains inside `submit`.
pub struct ShmPort {
    regions: Arc<Vec<ShmRegion>>,
    done: VecDeque<Completion>,
}

impl MemoryPort for ShmPort {
    fn nodes(&self) -> u32 {
        self.regions.len() as u32
    }

    fn submit(&mut self, tag: u64, chain: Chain) -> Result<(), BackendError> {
        let nodes = self.regions.len() as u32;
        let region =
            self.regions.get(chain.node as usize).ok_or(BackendError::NoSuchNode { node: chain.node, nodes })?;
        if self.done.len() >= PORT_IN_FLIGHT_MAX * self.regions.len() {
            return Err(BackendError::TooManyInFlight { node: chain.node, in_flight: self.done.len() });
        }
        let node = chain.node;
        if chain.verbs.len() > CHAIN_VERBS_MAX {
            self.done.push_back(Completion { tag, node, result: Err(VerbError::ChainTooLong(chain.verbs.len())) });
            return Ok(());
        }
        let data = region.data();
        let mut outcomes = Vec::with_capacity(chain.verbs.len());
        for verb in &chain.verbs {
            if region.is_crashed() {
                return Ok(()); // never completes; the verbs before stay applied
            }
            match data.apply(verb) {
                Ok(o) => outcomes.push(o),
                Err(e) => {
                    self.done.push_back(Completion { tag, node, result: Err(e) });
                    return Ok(());
                }
            }
        }
        self.done.push_back(Completion { tag, node, result: Ok(outcomes) });
        Ok(())
    }

    fn poll(&mut self, timeout: Duration) -> Option<Completion> {
        let next = self.done.pop_front();
        if next.is_none() && !timeout.is_zero() {
            // Every chain completes inside submit: nothing can arrive while we wait.
            std::thread::sleep(timeout);
        }
        next
    }
}
