//! A node's durable state on disk, under its data directory.
//!
//! Two files and a directory: `snapshot` (the last [`Persist::Snapshot`], replaced atomically —
//! written to `snapshot.tmp`, synced, renamed over, the directory synced — after which `log` is
//! emptied), `log` (every [`Persist::Append`] since, as `[length u32 LE][xxh3-64 of the bytes,
//! u64 LE][bytes]`), and `pages/` (one file per [`Persist::Page`], named by its number in 16 hex
//! digits, framed like a record and replaced atomically like the snapshot). A handler's
//! requests are written and then synced once, before the host carries out any other effect of
//! that handler (see [`kairos_core::Effect::Persist`]).
//!
//! Opening reads both. A record cut short, or failing its checksum, at the end of the log is a
//! torn last write — the process died while writing it, so nothing that depended on it was
//! sent — and is dropped (the log is truncated there). A bad record followed by more data, or a
//! bad snapshot, is corruption: an error that names the file, never a silent loss.
//!
//! Written by hand rather than with an embedded database: the host needs exactly an append-only
//! log with checksums and an atomic snapshot (about a hundred lines), and every role already
//! encodes its own records; an embedded key-value store (sled, redb) would add a second data
//! model and its own recovery rules between the role and the disk.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use kairos_core::{Persist, Stored};
use thiserror::Error;
use xxhash_rust::xxh3::xxh3_64;

/// The largest record or snapshot a node may persist.
pub const RECORD_MAX_BYTES: usize = 256 << 20;
const HEADER: usize = 12;

#[derive(Debug, Error)]
pub enum StorageError {
    #[error("cannot use the data directory {dir}: {source}; check that it exists and is writable")]
    Dir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read or write {file}: {source}")]
    Io {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file} is corrupt at byte {offset}: {why}; it was not written by this node as it stands (restore it or start from an empty data directory)")]
    Corrupt { file: PathBuf, offset: u64, why: String },
    #[error("a record of {0} bytes exceeds the limit of {RECORD_MAX_BYTES} bytes")]
    TooLarge(usize),
}

/// The open storage of one node.
pub struct DiskStore {
    dir: PathBuf,
    log: File,
    /// Records appended since the last sync.
    dirty: bool,
    /// The pages on disk, and whether the pages directory changed since the last sync.
    pages: std::collections::BTreeSet<u64>,
    pages_dirty: bool,
}

fn io(file: &Path) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
    move |source| StorageError::Io { file: file.to_path_buf(), source }
}

impl DiskStore {
    /// Opens (creating if needed) the storage in `dir` and reads what it holds.
    pub fn open(dir: &Path) -> Result<(DiskStore, Stored), StorageError> {
        std::fs::create_dir_all(dir).map_err(|source| StorageError::Dir { dir: dir.to_path_buf(), source })?;
        let snap_path = dir.join("snapshot");
        let snapshot = match std::fs::read(&snap_path) {
            Ok(bytes) => Some(decode_snapshot(&snap_path, &bytes)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&snap_path)(e)),
        };
        let log_path = dir.join("log");
        let mut log = OpenOptions::new().create(true).read(true).append(true).open(&log_path).map_err(io(&log_path))?;
        let mut bytes = Vec::new();
        log.read_to_end(&mut bytes).map_err(io(&log_path))?;
        let (records, good) = decode_log(&log_path, &bytes)?;
        if good < bytes.len() {
            // A torn last write: drop it, so the next append starts on a record boundary.
            log.set_len(good as u64).map_err(io(&log_path))?;
            log.sync_all().map_err(io(&log_path))?;
        }
        let pages = read_pages(&dir.join("pages"))?;
        let numbers = pages.keys().copied().collect();
        let store = DiskStore { dir: dir.to_path_buf(), log, dirty: false, pages: numbers, pages_dirty: false };
        Ok((store, Stored { snapshot, records, pages }))
    }

    /// Writes one request (made durable by the next [`DiskStore::sync`]).
    pub fn write(&mut self, p: Persist) -> Result<(), StorageError> {
        match p {
            Persist::Append(r) => {
                let log_path = self.dir.join("log");
                self.log.write_all(&frame(&r)?).map_err(io(&log_path))?;
                self.dirty = true;
            }
            Persist::Snapshot(s) => {
                // Records written so far are superseded by the snapshot.
                let (tmp, path) = (self.dir.join("snapshot.tmp"), self.dir.join("snapshot"));
                let mut f = File::create(&tmp).map_err(io(&tmp))?;
                f.write_all(&frame(&s)?).map_err(io(&tmp))?;
                f.sync_all().map_err(io(&tmp))?;
                std::fs::rename(&tmp, &path).map_err(io(&path))?;
                sync_dir(&self.dir)?;
                let log_path = self.dir.join("log");
                self.log.set_len(0).map_err(io(&log_path))?;
                self.dirty = true;
            }
            Persist::Page { page, bytes } => {
                let pages = self.dir.join("pages");
                let (tmp, path) = (pages.join(format!("{page:016x}.tmp")), pages.join(format!("{page:016x}")));
                let mut f = File::create(&tmp).map_err(io(&tmp))?;
                f.write_all(&frame(&bytes)?).map_err(io(&tmp))?;
                f.sync_all().map_err(io(&tmp))?;
                std::fs::rename(&tmp, &path).map_err(io(&path))?;
                self.pages.insert(page);
                self.pages_dirty = true;
            }
            Persist::DropPages { from, to } => {
                // Pages written before (a manifest naming what replaces the dropped pages) are
                // on disk before any removal is.
                if self.pages_dirty {
                    sync_dir(&self.dir.join("pages"))?;
                    self.pages_dirty = false;
                }
                let dropped: Vec<u64> =
                    if from < to { self.pages.range(from..to).copied().collect() } else { Vec::new() };
                for page in dropped {
                    let path = self.dir.join("pages").join(format!("{page:016x}"));
                    std::fs::remove_file(&path).map_err(io(&path))?;
                    self.pages.remove(&page);
                    self.pages_dirty = true;
                }
            }
        }
        Ok(())
    }

    /// Makes everything written durable.
    pub fn sync(&mut self) -> Result<(), StorageError> {
        if self.dirty {
            let log_path = self.dir.join("log");
            self.log.sync_data().map_err(io(&log_path))?;
            self.dirty = false;
        }
        if self.pages_dirty {
            sync_dir(&self.dir.join("pages"))?;
            self.pages_dirty = false;
        }
        Ok(())
    }
}

/// The pages in `dir` (created if missing). A leftover `.tmp` file is a page write cut short
/// (its rename never happened, so nothing depended on it): removed. A page failing its
/// checksum is corruption.
fn read_pages(dir: &Path) -> Result<std::collections::BTreeMap<u64, Vec<u8>>, StorageError> {
    std::fs::create_dir_all(dir).map_err(|source| StorageError::Dir { dir: dir.to_path_buf(), source })?;
    let mut pages = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(dir).map_err(|source| StorageError::Dir { dir: dir.to_path_buf(), source })? {
        let path = entry.map_err(|source| StorageError::Dir { dir: dir.to_path_buf(), source })?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        if name.ends_with(".tmp") {
            std::fs::remove_file(&path).map_err(io(&path))?;
            continue;
        }
        let Some(page) = (name.len() == 16).then(|| u64::from_str_radix(&name, 16).ok()).flatten() else {
            return Err(StorageError::Corrupt { file: path, offset: 0, why: "not a page this node wrote".into() });
        };
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        pages.insert(page, decode_snapshot(&path, &bytes)?);
    }
    Ok(pages)
}

fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|source| StorageError::Dir { dir: dir.to_path_buf(), source })
}

fn frame(bytes: &[u8]) -> Result<Vec<u8>, StorageError> {
    if bytes.len() > RECORD_MAX_BYTES {
        return Err(StorageError::TooLarge(bytes.len()));
    }
    let mut out = Vec::with_capacity(HEADER + bytes.len());
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(&xxh3_64(bytes).to_le_bytes());
    out.extend_from_slice(bytes);
    Ok(out)
}

/// One framed record at `at`: `Ok(Some((record, next)))`, `Ok(None)` if cut short or bad.
fn record_at(bytes: &[u8], at: usize) -> Option<(Vec<u8>, usize)> {
    let header = bytes.get(at..at + HEADER)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
    let sum = u64::from_le_bytes(header[4..].try_into().ok()?);
    if len > RECORD_MAX_BYTES {
        return None;
    }
    let body = bytes.get(at + HEADER..at + HEADER + len)?;
    (xxh3_64(body) == sum).then(|| (body.to_vec(), at + HEADER + len))
}

fn decode_snapshot(path: &Path, bytes: &[u8]) -> Result<Vec<u8>, StorageError> {
    match record_at(bytes, 0) {
        Some((s, end)) if end == bytes.len() => Ok(s),
        _ => Err(StorageError::Corrupt { file: path.to_path_buf(), offset: 0, why: "bad length or checksum".into() }),
    }
}

/// The records of a log, and how many bytes of it are good.
fn decode_log(path: &Path, bytes: &[u8]) -> Result<(Vec<Vec<u8>>, usize), StorageError> {
    let mut records = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match record_at(bytes, at) {
            Some((r, next)) => {
                records.push(r);
                at = next;
            }
            None => {
                // Torn only if nothing valid follows: the last write, cut short or half-written.
                let declared =
                    bytes.get(at..at + 4).map_or(0, |h| u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize);
                if at + HEADER + declared >= bytes.len() || declared > RECORD_MAX_BYTES {
                    return Ok((records, at));
                }
                return Err(StorageError::Corrupt {
                    file: path.to_path_buf(),
                    offset: at as u64,
                    why: "a record fails its checksum but more data follows it".into(),
                });
            }
        }
    }
    Ok((records, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_snapshots_survive_reopening_and_a_torn_tail_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut s, stored) = DiskStore::open(dir.path()).unwrap();
            assert!(stored.is_empty());
            s.write(Persist::Append(b"one".to_vec())).unwrap();
            s.write(Persist::Snapshot(b"snap".to_vec())).unwrap();
            s.write(Persist::Append(b"two".to_vec())).unwrap();
            s.write(Persist::Append(b"three".to_vec())).unwrap();
            s.sync().unwrap();
        }
        let (_, stored) = DiskStore::open(dir.path()).unwrap();
        assert_eq!(stored.snapshot.as_deref(), Some(&b"snap"[..]));
        assert_eq!(stored.records, vec![b"two".to_vec(), b"three".to_vec()]);
        // A write cut short by a crash: the last record loses its tail.
        let log = dir.path().join("log");
        let len = std::fs::metadata(&log).unwrap().len();
        let f = OpenOptions::new().write(true).open(&log).unwrap();
        f.set_len(len - 2).unwrap();
        let (mut s, stored) = DiskStore::open(dir.path()).unwrap();
        assert_eq!(stored.records, vec![b"two".to_vec()], "the torn record is dropped");
        s.write(Persist::Append(b"four".to_vec())).unwrap();
        s.sync().unwrap();
        let (_, stored) = DiskStore::open(dir.path()).unwrap();
        assert_eq!(stored.records, vec![b"two".to_vec(), b"four".to_vec()], "appends resume on a record boundary");
    }

    #[test]
    fn pages_survive_snapshots_and_reopening_and_can_be_dropped() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut s, _) = DiskStore::open(dir.path()).unwrap();
            for page in [1u64, 2, 3, 1 << 40] {
                s.write(Persist::Page { page, bytes: page.to_le_bytes().to_vec() }).unwrap();
            }
            s.write(Persist::Page { page: 2, bytes: b"two again".to_vec() }).unwrap();
            s.write(Persist::Snapshot(b"snap".to_vec())).unwrap();
            s.write(Persist::DropPages { from: 3, to: 1 << 41 }).unwrap();
            s.sync().unwrap();
        }
        // A page write cut short before its rename leaves a .tmp file behind.
        std::fs::write(dir.path().join("pages").join(format!("{:016x}.tmp", 9)), b"half").unwrap();
        let (_, stored) = DiskStore::open(dir.path()).unwrap();
        assert_eq!(stored.snapshot.as_deref(), Some(&b"snap"[..]));
        let pages: Vec<(u64, Vec<u8>)> = stored.pages.into_iter().collect();
        assert_eq!(pages, vec![(1, 1u64.to_le_bytes().to_vec()), (2, b"two again".to_vec())]);
        assert!(!dir.path().join("pages").join(format!("{:016x}.tmp", 9)).exists(), "the torn page is gone");
        let page_1 = dir.path().join("pages").join(format!("{:016x}", 1));
        let mut bytes = std::fs::read(&page_1).unwrap();
        bytes[HEADER] ^= 0xFF;
        std::fs::write(&page_1, bytes).unwrap();
        let err = DiskStore::open(dir.path()).err().expect("a bad page is an error").to_string();
        assert!(err.contains("0000000000000001"), "{err}");
    }

    #[test]
    fn corruption_in_the_middle_is_an_error_not_a_silent_loss() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut s, _) = DiskStore::open(dir.path()).unwrap();
            for r in [b"aaaa", b"bbbb", b"cccc"] {
                s.write(Persist::Append(r.to_vec())).unwrap();
            }
            s.sync().unwrap();
        }
        let log = dir.path().join("log");
        let mut bytes = std::fs::read(&log).unwrap();
        bytes[HEADER + 1] ^= 0xFF; // inside the first record's body
        std::fs::write(&log, bytes).unwrap();
        let err = DiskStore::open(dir.path()).err().expect("corruption is an error").to_string();
        assert!(err.contains("corrupt at byte 0"), "{err}");
        std::fs::write(dir.path().join("snapshot"), b"garbage").unwrap();
        assert!(DiskStore::open(dir.path()).is_err());
    }
}
