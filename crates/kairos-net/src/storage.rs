//! A node's durable state on disk, under its data directory.
//!
//! Two files and a directory: `snapshot` (the last [`Persist::Snapshot`] with its generation,
//! replaced atomically — written to `snapshot.tmp`, synced, renamed over, the directory synced),
//! `log` (a 24-byte header naming the generation of the snapshot it follows and the log's
//! salt, then every
//! [`Persist::Append`] since, one frame per sync: the records a handler appended, each
//! `[length u32 LE][bytes]`), and `pages/` (one file per [`Persist::Page`], named by its
//! number in 16 hex digits, one framed record, replaced atomically like the snapshot). A
//! frame is `[length u32 LE][xxh3-64 of the length, low 32 bits][xxh3-64 of the bytes, u64
//! LE][bytes]`, both hashes seeded with the log's salt in the log (0 in a snapshot or page).
//! A handler's requests are written and then synced once, before the host carries out any
//! other effect of that handler (see [`kairos_core::Effect::Persist`]).
//!
//! One frame per sync makes the unit that can tear the unit that is acknowledged: a power
//! failure before a sync can leave any part of what was written since the last one unwritten
//! (pages never written back read as zeros, while the file's length covers them), and all of
//! it is then the last frame. With a frame per record, a first record whose header was never
//! written back and a second one intact after it were taken for corruption, and the node
//! could not start again (a review's schedule). Logs of the earlier format (a frame per
//! record, header magic `KLOG`) are read, and rewritten in this one on open.
//!
//! A snapshot supersedes the log: once the new snapshot is in place, the log starts again
//! with a header of the new generation. A log whose header names an older generation is what
//! a crash between the two leaves behind, and its records are superseded: they are dropped, not
//! replayed after the snapshot (a review's schedule replayed them).
//!
//! Opening reads all of it. A frame cut short at the end of the log is a torn last write —
//! the process died while writing it, so nothing that depended on it was sent — and is
//! dropped (the log is truncated there); so is a last frame failing its checksum, and a frame
//! whose header fails its checksum with no whole frame anywhere after it (a sync that never
//! finished: whatever follows is its unwritten remains; the salt is what makes "a whole frame"
//! mean one the log wrote, not one inside a record's bytes). A log header that fails its
//! checksum with nothing but zeros after it is a log being started when the power failed: it
//! holds nothing, and starts again. A sync of more than
//! `FRAME_MAX_BYTES` (1 GiB) is written as several frames, and only its last can tear alone.
//! A frame header that fails its checksum with a whole frame after it, a bad frame body
//! followed by more data, or a bad snapshot or page, is corruption: an error that names the
//! file, never a silent loss. (The length has a checksum of its own so that a
//! corrupted length in the middle is not taken for a frame cut short at the end: a review's
//! test lost two synced records that way.)
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
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// The largest record or snapshot a node may persist.
pub const RECORD_MAX_BYTES: usize = 256 << 20;
/// The largest frame: the records of one sync (more than this in one sync are written as
/// several frames; only the last of them can then tear alone).
const FRAME_MAX_BYTES: usize = 1 << 30;
/// A frame's header: length, its checksum, the bytes' checksum.
const HEADER: usize = 16;
/// The log's header: magic, the generation of the snapshot the log follows, the log's salt
/// (a random seed of its frames' checksums, so that no record's bytes can hold a frame of the
/// log: a review's schedule), a checksum.
const LOG_MAGIC: &[u8; 4] = b"KLG2";
const LOG_HEADER: usize = 24;
/// The earlier format's magic and header (no salt): a frame per record.
const LOG_MAGIC_V1: &[u8; 4] = b"KLOG";
const LOG_HEADER_V1: usize = 16;

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
    /// The generation of the snapshot on disk (0: none); the log's header names it.
    generation: u64,
    /// The seed of the log's frame checksums (its header holds it).
    salt: u64,
    /// Records appended since the last sync, written as one frame by it.
    appended: Vec<Vec<u8>>,
    /// Bytes written to the log since the last sync.
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
        let (generation, snapshot) = match std::fs::read(&snap_path) {
            Ok(bytes) => {
                let frame = decode_single(&snap_path, &bytes)?;
                let corrupt =
                    || StorageError::Corrupt { file: snap_path.clone(), offset: 0, why: "no generation".into() };
                let generation = u64::from_le_bytes(frame.get(..8).ok_or_else(corrupt)?.try_into().expect("8 bytes"));
                (generation, Some(frame[8..].to_vec()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (0, None),
            Err(e) => return Err(io(&snap_path)(e)),
        };
        let log_path = dir.join("log");
        let mut log = OpenOptions::new().create(true).read(true).append(true).open(&log_path).map_err(io(&log_path))?;
        let mut bytes = Vec::new();
        log.read_to_end(&mut bytes).map_err(io(&log_path))?;
        let (records, salt) = match log_header_of(&log_path, &bytes)? {
            Some(header) if header.generation == generation => {
                let (records, good) = decode_log(&log_path, &bytes, header)?;
                if header.format == LogFormat::RecordFrames {
                    let salt;
                    (log, salt) = rewrite_log(dir, generation, &records)?;
                    (records, salt)
                } else {
                    if good < bytes.len() {
                        // A torn last write: dropped, so the next append starts on a frame
                        // boundary.
                        log.set_len(good as u64).map_err(io(&log_path))?;
                        log.sync_all().map_err(io(&log_path))?;
                    }
                    (records, header.salt)
                }
            }
            Some(LogHeader { generation: g, .. }) if g > generation => {
                return Err(StorageError::Corrupt {
                    file: log_path,
                    offset: 4,
                    why: format!("the log follows snapshot generation {g}, the snapshot is generation {generation}"),
                })
            }
            // No header yet (a new log, or one cut short while it was started), or one of an
            // older snapshot (a crash after the new snapshot was in place): nothing in it counts.
            _ => {
                let salt = start_log(&mut log, &log_path, generation)?;
                log.sync_all().map_err(io(&log_path))?;
                (Vec::new(), salt)
            }
        };
        let pages = read_pages(&dir.join("pages"))?;
        let numbers = pages.keys().copied().collect();
        let store = DiskStore {
            dir: dir.to_path_buf(),
            log,
            generation,
            salt,
            appended: Vec::new(),
            dirty: false,
            pages: numbers,
            pages_dirty: false,
        };
        Ok((store, Stored { snapshot, records, pages }))
    }

    /// Writes one request (made durable by the next [`DiskStore::sync`]).
    pub fn write(&mut self, p: Persist) -> Result<(), StorageError> {
        match p {
            Persist::Append(r) => {
                if r.len() > RECORD_MAX_BYTES {
                    return Err(StorageError::TooLarge(r.len()));
                }
                self.appended.push(r);
            }
            Persist::Snapshot(s) => {
                // Records appended so far are superseded by the snapshot (those of this sync
                // are never written): once it is in place, the log's older generation says
                // so, whether or not the new log below is.
                self.appended.clear();
                let generation = self.generation + 1;
                let (tmp, path) = (self.dir.join("snapshot.tmp"), self.dir.join("snapshot"));
                let mut f = File::create(&tmp).map_err(io(&tmp))?;
                let mut body = Vec::with_capacity(8 + s.len());
                body.extend_from_slice(&generation.to_le_bytes());
                body.extend_from_slice(&s);
                f.write_all(&frame(&body, 0)?).map_err(io(&tmp))?;
                f.sync_all().map_err(io(&tmp))?;
                // Pages written before it (which the snapshot may name) are on disk before it.
                if self.pages_dirty {
                    sync_dir(&self.dir.join("pages"))?;
                    self.pages_dirty = false;
                }
                std::fs::rename(&tmp, &path).map_err(io(&path))?;
                sync_dir(&self.dir)?;
                self.generation = generation;
                self.salt = start_log(&mut self.log, &self.dir.join("log"), generation)?;
                self.dirty = true;
            }
            Persist::Page { page, bytes } => {
                let pages = self.dir.join("pages");
                let (tmp, path) = (pages.join(format!("{page:016x}.tmp")), pages.join(format!("{page:016x}")));
                let mut f = File::create(&tmp).map_err(io(&tmp))?;
                f.write_all(&frame(&bytes, 0)?).map_err(io(&tmp))?;
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

    /// Makes everything written durable: the records appended since the last sync go to the
    /// log as one frame (module docs).
    pub fn sync(&mut self) -> Result<(), StorageError> {
        let log_path = self.dir.join("log");
        for frame in batch_frames(&std::mem::take(&mut self.appended), self.salt)? {
            self.log.write_all(&frame).map_err(io(&log_path))?;
            self.dirty = true;
        }
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
        pages.insert(page, decode_single(&path, &bytes)?);
    }
    Ok(pages)
}

fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|source| StorageError::Dir { dir: dir.to_path_buf(), source })
}

/// A new log's salt: a hash of the clock, the process and the path. Not secret from whoever
/// reads the disk; unknown to a client that chooses the bytes of the records (module docs).
/// (Storage is the host's, not a role's: the system clock is its to read.)
#[allow(clippy::disallowed_methods)]
fn new_salt(path: &Path) -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let seed = format!("{nanos} {} {}", std::process::id(), path.display());
    xxh3_64(seed.as_bytes())
}

fn log_header(generation: u64, salt: u64) -> Vec<u8> {
    let mut header = Vec::with_capacity(LOG_HEADER);
    header.extend_from_slice(LOG_MAGIC);
    header.extend_from_slice(&generation.to_le_bytes());
    header.extend_from_slice(&salt.to_le_bytes());
    header.extend_from_slice(&(xxh3_64(&header) as u32).to_le_bytes());
    header
}

/// Empties the log and writes its header for `generation`, with a new salt (durable at the
/// next sync); returns the salt.
fn start_log(log: &mut File, path: &Path, generation: u64) -> Result<u64, StorageError> {
    let salt = new_salt(path);
    log.set_len(0).map_err(io(path))?;
    log.write_all(&log_header(generation, salt)).map_err(io(path))?;
    Ok(salt)
}

/// Replaces the log with one of the current format holding `records` (written aside, synced,
/// renamed over it): a log of the earlier format is converted once, on open. Returns the new
/// log and its salt.
fn rewrite_log(dir: &Path, generation: u64, records: &[Vec<u8>]) -> Result<(File, u64), StorageError> {
    let (tmp, path) = (dir.join("log.tmp"), dir.join("log"));
    let salt = new_salt(&path);
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(&log_header(generation, salt)).map_err(io(&tmp))?;
    for frame in batch_frames(records, salt)? {
        f.write_all(&frame).map_err(io(&tmp))?;
    }
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    sync_dir(dir)?;
    let log = OpenOptions::new().read(true).append(true).open(&path).map_err(io(&path))?;
    Ok((log, salt))
}

/// How a log's frames hold its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    /// A frame per sync, of `[length u32 LE][bytes]` records (magic `KLG2`).
    SyncFrames,
    /// A frame per record (magic `KLOG`, the earlier format).
    RecordFrames,
}

/// What a log's header says.
#[derive(Clone, Copy, Debug)]
struct LogHeader {
    generation: u64,
    format: LogFormat,
    /// The seed of its frames' checksums (0 in the earlier format).
    salt: u64,
    /// Where its frames begin.
    len: usize,
}

/// A log's header; `None` if it has no whole header (a log cut short while it was started:
/// nothing was appended to it yet).
fn log_header_of(path: &Path, bytes: &[u8]) -> Result<Option<LogHeader>, StorageError> {
    let (format, len) = match bytes.get(..4) {
        None => return Ok(None),
        Some(m) if m == LOG_MAGIC_V1 => (LogFormat::RecordFrames, LOG_HEADER_V1),
        Some(_) => (LogFormat::SyncFrames, LOG_HEADER),
    };
    let Some(header) = bytes.get(..len) else { return Ok(None) };
    let check = u32::from_le_bytes(header[len - 4..].try_into().expect("4 bytes"));
    if (format == LogFormat::SyncFrames && &header[..4] != LOG_MAGIC) || xxh3_64(&header[..len - 4]) as u32 != check {
        if zeros_from(bytes) <= len {
            // A header not (or partly) written back, nothing after it: a log being started
            // when the power failed (after a snapshot, or on a first open), which holds
            // nothing yet (a review's schedule).
            return Ok(None);
        }
        let why = "not a log this node wrote (bad header)".into();
        return Err(StorageError::Corrupt { file: path.to_path_buf(), offset: 0, why });
    }
    let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"));
    let salt = if format == LogFormat::SyncFrames { word(12) } else { 0 };
    Ok(Some(LogHeader { generation: word(4), format, salt, len }))
}

/// The frames that hold `records` (module docs): one, unless they pass [`FRAME_MAX_BYTES`].
fn batch_frames(records: &[Vec<u8>], salt: u64) -> Result<Vec<Vec<u8>>, StorageError> {
    let mut frames = Vec::new();
    let mut body: Vec<u8> = Vec::new();
    for r in records {
        if !body.is_empty() && body.len() + 4 + r.len() > FRAME_MAX_BYTES {
            frames.push(frame(&body, salt)?);
            body.clear();
        }
        body.extend_from_slice(&(r.len() as u32).to_le_bytes());
        body.extend_from_slice(r);
    }
    if !body.is_empty() {
        frames.push(frame(&body, salt)?);
    }
    Ok(frames)
}

/// The records of a frame of the current format; `None` if its lengths do not add up.
fn unbatch(mut body: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut records = Vec::new();
    while !body.is_empty() {
        let len = u32::from_le_bytes(body.get(..4)?.try_into().ok()?) as usize;
        records.push(body.get(4..4 + len)?.to_vec());
        body = &body[4 + len..];
    }
    Some(records)
}

fn length_check(len: u32, salt: u64) -> u32 {
    xxh3_64_with_seed(&len.to_le_bytes(), salt) as u32
}

/// `bytes` framed, its checksums seeded with `salt` (the log's; 0 for a snapshot or a page).
fn frame(bytes: &[u8], salt: u64) -> Result<Vec<u8>, StorageError> {
    if bytes.len() > FRAME_MAX_BYTES {
        return Err(StorageError::TooLarge(bytes.len()));
    }
    let len = bytes.len() as u32;
    let mut out = Vec::with_capacity(HEADER + bytes.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&length_check(len, salt).to_le_bytes());
    out.extend_from_slice(&xxh3_64_with_seed(bytes, salt).to_le_bytes());
    out.extend_from_slice(bytes);
    Ok(out)
}

/// What is at `at` of a framed file.
enum Framed<'a> {
    /// A whole record, and where the next begins.
    Record(&'a [u8], usize),
    /// Fewer bytes than a header, or a header cut short's zero-filled remains.
    TornHeader,
    /// A header that fails its checksum with other data after it.
    BadHeader,
    /// A valid header whose record runs past the end.
    CutShort,
    /// A whole record failing its checksum, and where it ends.
    BadBody(usize),
}

/// The frame at `at`, checksums seeded with `salt`; `zeros_from`: where the file's tail of
/// zeros begins (found once per file: looking for it at each offset was quadratic, a review's
/// schedule).
fn framed_at(bytes: &[u8], at: usize, salt: u64, zeros_from: usize) -> Framed<'_> {
    let Some(header) = bytes.get(at..at + HEADER) else { return Framed::TornHeader };
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
    let check = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    let sum = u64::from_le_bytes(header[8..].try_into().expect("8 bytes"));
    if length_check(len, salt) != check || len as usize > FRAME_MAX_BYTES {
        return if at >= zeros_from { Framed::TornHeader } else { Framed::BadHeader };
    }
    let end = at + HEADER + len as usize;
    match bytes.get(at + HEADER..end) {
        None => Framed::CutShort,
        Some(body) if xxh3_64_with_seed(body, salt) == sum => Framed::Record(body, end),
        Some(_) => Framed::BadBody(end),
    }
}

/// A file of exactly one frame (a snapshot, a page): its bytes.
fn decode_single(path: &Path, bytes: &[u8]) -> Result<Vec<u8>, StorageError> {
    match framed_at(bytes, 0, 0, zeros_from(bytes)) {
        Framed::Record(body, end) if end == bytes.len() => Ok(body.to_vec()),
        _ => Err(StorageError::Corrupt { file: path.to_path_buf(), offset: 0, why: "bad length or checksum".into() }),
    }
}

/// Where the tail of zeros of `bytes` begins.
fn zeros_from(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1)
}

/// The records of a log after its header, and how many bytes of it are good.
fn decode_log(path: &Path, bytes: &[u8], header: LogHeader) -> Result<(Vec<Vec<u8>>, usize), StorageError> {
    let LogHeader { format, salt, .. } = header;
    let zeros = zeros_from(bytes);
    let mut records = Vec::new();
    let mut at = header.len;
    while at < bytes.len() {
        let corrupt =
            |why: &str| StorageError::Corrupt { file: path.to_path_buf(), offset: at as u64, why: why.into() };
        match framed_at(bytes, at, salt, zeros) {
            Framed::Record(body, next) => {
                match format {
                    LogFormat::RecordFrames => records.push(body.to_vec()),
                    LogFormat::SyncFrames => {
                        records.extend(unbatch(body).ok_or_else(|| corrupt("a frame's record lengths do not add up"))?)
                    }
                }
                at = next;
            }
            // The last write, cut short or half-written: torn.
            Framed::TornHeader | Framed::CutShort => return Ok((records, at)),
            Framed::BadBody(end) if end == bytes.len() => return Ok((records, at)),
            Framed::BadBody(_) => return Err(corrupt("a frame fails its checksum but more data follows it")),
            // A sync's frame whose header was not (or only partly) written back, the rest of
            // it partly: torn, unless a whole frame follows (then the header was written, and
            // lost). (Only a header of zeros counted at first; one cut at a page boundary is
            // half written: a review's schedule.)
            Framed::BadHeader if format == LogFormat::SyncFrames && !whole_frame_after(bytes, at + 1, salt, zeros) => {
                return Ok((records, at))
            }
            Framed::BadHeader => return Err(corrupt("a frame's length fails its checksum but more data follows it")),
        }
    }
    Ok((records, at))
}

/// Whether a whole frame of the log (both checksums good with its salt) starts anywhere at or
/// after `from`. A record's bytes cannot hold one: they do not know the salt.
fn whole_frame_after(bytes: &[u8], from: usize, salt: u64, zeros: usize) -> bool {
    (from..bytes.len().saturating_sub(HEADER)).any(|at| matches!(framed_at(bytes, at, salt, zeros), Framed::Record(..)))
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
            s.sync().unwrap();
            s.write(Persist::Append(b"three".to_vec())).unwrap();
            s.sync().unwrap();
        }
        let (_, stored) = DiskStore::open(dir.path()).unwrap();
        assert_eq!(stored.snapshot.as_deref(), Some(&b"snap"[..]));
        assert_eq!(stored.records, vec![b"two".to_vec(), b"three".to_vec()]);
        // A write cut short by a crash: the last sync's frame loses its tail.
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

    /// The bytes of the frame of a sync of one 4-byte record.
    const ONE_RECORD_FRAME: usize = HEADER + 4 + 4;

    /// A store holding three records (`aaaa`, `bbbb`, `cccc`), each synced on its own (three
    /// frames): its directory, its log file and the log's bytes.
    fn three_synced_records() -> (tempfile::TempDir, PathBuf, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = DiskStore::open(dir.path()).unwrap();
        for r in [b"aaaa", b"bbbb", b"cccc"] {
            s.write(Persist::Append(r.to_vec())).unwrap();
            s.sync().unwrap();
        }
        let log = dir.path().join("log");
        let bytes = std::fs::read(&log).unwrap();
        (dir, log, bytes)
    }

    #[test]
    fn corruption_in_the_middle_is_an_error_not_a_silent_loss() {
        let (dir, log, mut bytes) = three_synced_records();
        bytes[LOG_HEADER + HEADER + 1] ^= 0xFF; // inside the first frame's body
        std::fs::write(&log, bytes).unwrap();
        let err = DiskStore::open(dir.path()).err().expect("corruption is an error").to_string();
        assert!(err.contains(&format!("corrupt at byte {LOG_HEADER}")), "{err}");
        std::fs::write(dir.path().join("snapshot"), b"garbage").unwrap();
        assert!(DiskStore::open(dir.path()).is_err());
    }

    /// A review's schedule: one bit of the length of a record in the middle of the log. The
    /// length was not checksummed, so the record looked cut short at the end: the two synced
    /// records after it were dropped and the file truncated.
    #[test]
    fn a_corrupt_length_in_the_middle_is_an_error_and_the_file_is_kept() {
        let (dir, log, mut bytes) = three_synced_records();
        let second = LOG_HEADER + ONE_RECORD_FRAME;
        bytes[second + 3] ^= 0x80;
        std::fs::write(&log, &bytes).unwrap();
        let err = DiskStore::open(dir.path()).err().expect("corruption is an error").to_string();
        assert!(err.contains(&format!("corrupt at byte {second}")), "{err}");
        assert_eq!(std::fs::read(&log).unwrap(), bytes, "the log is left as it was");
        // A tail of zeros (blocks allocated, data never written) is a torn write, not corruption.
        bytes[second + 3] ^= 0x80;
        bytes.extend_from_slice(&[0; 40]);
        std::fs::write(&log, &bytes).unwrap();
        let (_, stored) = DiskStore::open(dir.path()).unwrap();
        assert_eq!(stored.records.len(), 3);
    }

    /// A review's schedule: one handler appends two records and the host syncs once; the power
    /// fails before the sync completes. The file's length covers both, but the page holding
    /// the start of the sync's frame never reached the disk (it reads as zeros) while the rest
    /// did. Nothing of that handler was acknowledged; with a frame per record, the second
    /// record intact after the zeroed first was taken for corruption and the node could never
    /// open its storage again.
    #[test]
    fn a_sync_torn_before_its_header_was_written_back_is_dropped() {
        let (dir, log, synced) = three_synced_records();
        {
            let (mut s, _) = DiskStore::open(dir.path()).unwrap();
            s.write(Persist::Append(vec![7u8; 64])).unwrap();
            s.write(Persist::Append(vec![9u8; 64])).unwrap();
            s.sync().unwrap();
        }
        let mut bytes = std::fs::read(&log).unwrap();
        assert_eq!(bytes.len(), synced.len() + HEADER + 2 * (4 + 64), "one frame for the sync");
        bytes[synced.len()..synced.len() + HEADER + 8].fill(0);
        std::fs::write(&log, &bytes).unwrap();
        let (mut s, stored) = DiskStore::open(dir.path()).expect("an unacknowledged torn sync is not corruption");
        assert_eq!(stored.records, vec![b"aaaa".to_vec(), b"bbbb".to_vec(), b"cccc".to_vec()]);
        assert_eq!(std::fs::read(&log).unwrap(), synced, "the torn frame is cut off");
        s.write(Persist::Append(b"dddd".to_vec())).unwrap();
        s.sync().unwrap();
        assert_eq!(DiskStore::open(dir.path()).unwrap().1.records.len(), 4, "appends resume on a frame boundary");
        // A zeroed header with a whole frame after it is not a torn last sync: corruption.
        let mut bytes = std::fs::read(&log).unwrap();
        bytes[LOG_HEADER + ONE_RECORD_FRAME..LOG_HEADER + ONE_RECORD_FRAME + HEADER].fill(0);
        std::fs::write(&log, &bytes).unwrap();
        let err = DiskStore::open(dir.path()).err().expect("a lost header before synced frames").to_string();
        assert!(err.contains(&format!("corrupt at byte {}", LOG_HEADER + ONE_RECORD_FRAME)), "{err}");
    }

    /// The review of the fix above: a torn sync whose record (a client's value) holds a
    /// well-formed frame was taken for corruption again (a "whole frame after" the zeroed
    /// header). Frames are now checksummed with the log's salt, which a record cannot know.
    #[test]
    fn a_torn_sync_whose_record_holds_a_frame_is_dropped_not_corruption() {
        let (dir, log, synced) = three_synced_records();
        {
            let (mut s, _) = DiskStore::open(dir.path()).unwrap();
            let mut value = b"user value: ".to_vec();
            value.extend_from_slice(&frame(b"any bytes a client chose", 0).unwrap());
            s.write(Persist::Append(value)).unwrap();
            s.sync().unwrap();
        }
        let mut bytes = std::fs::read(&log).unwrap();
        bytes[synced.len()..synced.len() + HEADER + 8].fill(0);
        std::fs::write(&log, &bytes).unwrap();
        let (_, stored) = DiskStore::open(dir.path()).expect("an unacknowledged torn sync is not corruption");
        assert_eq!(stored.records.len(), 3);
    }

    /// The review of the fix above: a 1 MiB torn sync of which only the last page reached the
    /// disk took opening quadratic time (each offset scanned the zeros after it: still
    /// running after 20 s); the zeros are now found once per file, and this opens at once.
    #[test]
    fn opening_after_a_large_torn_sync_looks_at_each_offset_once() {
        let (dir, log, synced) = three_synced_records();
        {
            let (mut s, _) = DiskStore::open(dir.path()).unwrap();
            s.write(Persist::Append(vec![0xAB; 1 << 20])).unwrap();
            s.sync().unwrap();
        }
        let mut bytes = std::fs::read(&log).unwrap();
        let end = bytes.len() - 4096;
        bytes[synced.len()..end].fill(0);
        std::fs::write(&log, &bytes).unwrap();
        let (_, stored) = DiskStore::open(dir.path()).expect("a torn sync");
        assert_eq!(stored.records.len(), 3);
    }

    /// The third review's schedules: a sync's frame header cut at a page boundary (its first
    /// bytes written back, the rest not), and a log header never written back after a
    /// snapshot (24 zeros): both torn, nothing acknowledged, and both were taken for
    /// corruption.
    #[test]
    fn a_half_written_frame_header_and_a_zeroed_log_header_are_torn_writes() {
        let (dir, log, synced) = three_synced_records();
        {
            let (mut s, _) = DiskStore::open(dir.path()).unwrap();
            s.write(Persist::Append(vec![7u8; 64])).unwrap();
            s.sync().unwrap();
        }
        let mut bytes = std::fs::read(&log).unwrap();
        bytes[synced.len() + 6..].fill(0);
        std::fs::write(&log, &bytes).unwrap();
        let (mut s, stored) = DiskStore::open(dir.path()).expect("a torn unacknowledged sync is not corruption");
        assert_eq!(stored.records.len(), 3);
        s.write(Persist::Snapshot(b"state".to_vec())).unwrap();
        drop(s);
        let len = std::fs::metadata(&log).unwrap().len() as usize;
        assert_eq!(len, LOG_HEADER, "the restarted log is its header");
        std::fs::write(&log, vec![0u8; len]).unwrap();
        let (_, stored) = DiskStore::open(dir.path()).expect("a log header never written back is not corruption");
        assert_eq!((stored.snapshot.as_deref(), stored.records.len()), (Some(&b"state"[..]), 0));
        // A bad log header with frames after it is still an error.
        let (mut s, _) = DiskStore::open(dir.path()).unwrap();
        s.write(Persist::Append(b"x".to_vec())).unwrap();
        s.sync().unwrap();
        drop(s);
        let mut bytes = std::fs::read(&log).unwrap();
        bytes[..LOG_HEADER].fill(0);
        std::fs::write(&log, &bytes).unwrap();
        assert!(DiskStore::open(dir.path()).is_err(), "frames after a lost log header");
    }

    /// A log of the earlier format (a frame per record) is read, and rewritten in the current
    /// one.
    #[test]
    fn a_log_of_the_earlier_format_is_read_and_converted() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let mut old = LOG_MAGIC_V1.to_vec();
        old.extend_from_slice(&0u64.to_le_bytes());
        old.extend_from_slice(&(xxh3_64(&old) as u32).to_le_bytes());
        for r in [&b"one"[..], b"two"] {
            old.extend_from_slice(&frame(r, 0).unwrap());
        }
        std::fs::write(&log, &old).unwrap();
        let (mut s, stored) = DiskStore::open(dir.path()).unwrap();
        assert_eq!(stored.records, vec![b"one".to_vec(), b"two".to_vec()]);
        assert_eq!(&std::fs::read(&log).unwrap()[..4], LOG_MAGIC, "rewritten in the current format");
        s.write(Persist::Append(b"three".to_vec())).unwrap();
        s.sync().unwrap();
        let (_, stored) = DiskStore::open(dir.path()).unwrap();
        assert_eq!(stored.records, vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);
    }

    /// A review's schedule: a crash after the new snapshot is in place and before the log's
    /// emptying is durable left the old log behind it, and its records were replayed after
    /// the snapshot that superseded them.
    #[test]
    fn records_a_snapshot_superseded_are_never_replayed_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        {
            let (mut s, _) = DiskStore::open(dir.path()).unwrap();
            s.write(Persist::Append(b"old-1".to_vec())).unwrap();
            s.write(Persist::Append(b"old-2".to_vec())).unwrap();
            s.sync().unwrap();
            let log_on_disk = std::fs::read(&log).unwrap();
            s.write(Persist::Snapshot(b"covers old-1 and old-2".to_vec())).unwrap();
            // The power fails before the sync: the renamed snapshot is on disk, the new log not.
            drop(s);
            std::fs::write(&log, log_on_disk).unwrap();
        }
        let (mut s, stored) = DiskStore::open(dir.path()).unwrap();
        assert_eq!(stored.snapshot.as_deref(), Some(&b"covers old-1 and old-2"[..]));
        assert!(stored.records.is_empty(), "superseded records replayed: {:?}", stored.records);
        // The log goes on from there, in the snapshot's generation.
        s.write(Persist::Append(b"new".to_vec())).unwrap();
        s.sync().unwrap();
        drop(s);
        let (mut s, stored) = DiskStore::open(dir.path()).unwrap();
        assert_eq!(stored.records, vec![b"new".to_vec()]);
        // A crash while a new log was started (its header cut short): it holds nothing yet.
        s.write(Persist::Snapshot(b"second".to_vec())).unwrap();
        drop(s);
        std::fs::write(&log, b"KLO").unwrap();
        let (_, stored) = DiskStore::open(dir.path()).unwrap();
        assert_eq!((stored.snapshot.as_deref(), stored.records.len()), (Some(&b"second"[..]), 0));
        // A log of a later generation than the snapshot was not written by this node.
        let mut newer = b"KLOG".to_vec();
        newer.extend_from_slice(&9u64.to_le_bytes());
        newer.extend_from_slice(&(xxh3_64(&newer) as u32).to_le_bytes());
        std::fs::write(&log, newer).unwrap();
        let err = DiskStore::open(dir.path()).err().expect("a mismatched log is an error").to_string();
        assert!(err.contains("generation 9"), "{err}");
    }
}
