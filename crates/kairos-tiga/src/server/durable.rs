//! A replica's checkpoint on disk, written a few pages at a time.
//!
//! The journal ([`super::Record`]s and snapshots) holds the view, the log and the released
//! transactions; the checkpoint the log continues from is in pages ([`Ctx::persist_page`]),
//! apart: a journal snapshot would otherwise serialize the whole state every few thousand
//! records (12 MB and 70–90 ms at 65,000 keys in the 10,000 txn/s kill run, and growing).
//!
//! **Layout.** Two slots of pages and a manifest page naming the slot that holds a whole
//! checkpoint, and its position. A checkpoint is written into the other slot: the state and
//! the key maps in pages of whole [`CowMap`] buckets (and a TPC-C shard's warehouses, a page
//! each), then one page per segment of recent
//! transactions; the manifest last. A crash before the manifest leaves the previous checkpoint
//! whole (the journal still holds the log from its position: a replica never drops log entries
//! below its *durable* checkpoint).
//!
//! **Pacing.** A checkpoint is written a few pages per executed position, done within a
//! quarter of the positions until the next one is due, so no event pays for the whole
//! state (the checkpoint is immutable: [`CowMap`] clones). A checkpoint installed from the
//! leader is written at once: the log it continues from has nothing below it.

use super::{Checkpoint, KeyMaps, KeyStamp, Recent};
use crate::cow_map::{CowMap, BUCKETS};
use crate::msg::Key;
use crate::ops::{Entry, StoreKey};
use crate::tpcc::TpccShard;
use kairos_core::{Ctx, Stored};
use kairos_workload::tpcc::{TpccScale, WarehouseDb};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The manifest's page number; slot `s`'s pages are `SLOT_BASE[s] + i`; a segment of recent
/// transactions is page `SEGMENT_BASE + its first position`, written once and kept while the
/// checkpoint on disk carries it.
const MANIFEST_PAGE: u64 = 0;
const SLOT_BASE: [u64; 2] = [1 << 32, 2 << 32];
const SEGMENT_BASE: u64 = 1 << 40;

/// Entries per page, about: a state of n entries takes the next power of two of n / this
/// pages (at most 256, so a page holds 16 buckets or more): a page costs about 0.25 ms to
/// write at 1,000 entries.
const ENTRIES_PER_PAGE: usize = 1_024;
const PAGES_PER_MAP_MAX: usize = 256;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Manifest {
    slot: u8,
    position: u64,
    state_pages: u32,
    map_pages: u32,
    /// A TPC-C deployment's scale and refused pieces; its warehouses are one page each, after
    /// the maps' pages.
    tpcc: Option<(TpccScale, u64)>,
    warehouse_pages: u32,
    /// The first positions of the checkpoint's segments of recent transactions, in order.
    segments: Vec<u64>,
}

/// A page as read back.
#[derive(Deserialize)]
enum Page {
    State(Vec<(StoreKey, Entry)>),
    Maps(Vec<(Key, KeyStamp)>),
    Recent(Recent),
    Warehouse(WarehouseDb),
}

/// A page as written: the same encoding as [`Page`], from references (no copy of the entries).
#[derive(Serialize)]
enum PageOut<'a> {
    State(Vec<(&'a StoreKey, &'a Entry)>),
    Maps(Vec<(&'a Key, &'a KeyStamp)>),
    Recent(&'a Recent),
    Warehouse(&'a WarehouseDb),
}

/// A page of the checkpoint being written.
#[derive(Clone, Copy)]
enum Part {
    State(u32),
    Maps(u32),
    Warehouse(u32),
    /// The checkpoint's segment at this index.
    Segment(usize),
}

/// A checkpoint being written.
struct Writing {
    checkpoint: Arc<Checkpoint>,
    manifest: Manifest,
    /// What is left to write, in order (segments already on disk are not written again).
    parts: std::collections::VecDeque<Part>,
    /// Pages written every `every`-th step.
    per_step: usize,
    every: u64,
    steps: u64,
}

/// What of the checkpoints is on disk, and the one being written.
#[derive(Default)]
pub(super) struct DurableCheckpoint {
    current: Option<Manifest>,
    writing: Option<Writing>,
    /// The segment pages on disk, by first position.
    segments_on_disk: std::collections::BTreeSet<u64>,
}

fn pages_for(len: usize) -> u32 {
    (len / ENTRIES_PER_PAGE + 1).next_power_of_two().min(PAGES_PER_MAP_MAX) as u32
}

/// The entries of page `i` of `pages` over a map's buckets.
fn page_of<K: Ord + Clone + crate::cow_map::BucketKey, V: Clone>(
    map: &CowMap<K, V>,
    i: u32,
    pages: u32,
) -> Vec<(&K, &V)> {
    let per_page = BUCKETS / pages as usize;
    let first = i as usize * per_page;
    map.bucket_entries(first..first + per_page).collect()
}

impl DurableCheckpoint {
    /// The position of the checkpoint on disk (0: none; the journal then holds the log from 0).
    pub(super) fn position(&self) -> u64 {
        self.current.as_ref().map_or(0, |m| m.position)
    }

    /// Starts writing `c`, to be done within a quarter of `gap` executed positions (a
    /// write under way is abandoned: its slot is the one to write again).
    pub(super) fn start(&mut self, ctx: &mut Ctx<'_, super::TigaMsg>, c: Arc<Checkpoint>, gap: u64) {
        let slot = self.current.as_ref().map_or(0, |m| 1 - m.slot);
        let base = SLOT_BASE[slot as usize];
        ctx.drop_pages(base, base + (1 << 32));
        let manifest = Manifest {
            slot,
            position: c.position,
            state_pages: pages_for(c.state.keys.len()),
            map_pages: pages_for(c.maps.len()),
            tpcc: c.state.tpcc.as_ref().map(|t| (t.scale, t.pieces_refused)),
            warehouse_pages: c.state.tpcc.as_ref().map_or(0, |t| t.warehouses.len() as u32),
            segments: c.recent.iter().map(|r| r.from).collect(),
        };
        let mut parts: std::collections::VecDeque<Part> = (0..manifest.state_pages).map(Part::State).collect();
        parts.extend((0..manifest.map_pages).map(Part::Maps));
        parts.extend((0..manifest.warehouse_pages).map(Part::Warehouse));
        parts.extend(
            (0..c.recent.len()).filter(|i| !self.segments_on_disk.contains(&c.recent[*i].from)).map(Part::Segment),
        );
        // Spread over a quarter of the gap to the next checkpoint: a page every few positions,
        // or a few pages every position.
        let steps = (gap / 4).max(1);
        let pages = (parts.len() as u64).max(1);
        let per_step = usize::try_from(pages.div_ceil(steps)).unwrap_or(usize::MAX);
        let every = (steps / pages).max(1);
        self.writing = Some(Writing { checkpoint: c, manifest, parts, per_step, every, steps: 0 });
    }

    /// Writes the next few pages of the checkpoint under way; true when it became the one on
    /// disk (the log below it may go).
    pub(super) fn step(&mut self, ctx: &mut Ctx<'_, super::TigaMsg>) -> bool {
        let Some(w) = &mut self.writing else { return false };
        w.steps += 1;
        if (w.steps - 1) % w.every != 0 {
            return false;
        }
        let Manifest { slot, state_pages, map_pages, .. } = w.manifest;
        for _ in 0..w.per_step {
            let Some(part) = w.parts.pop_front() else { break };
            let c = &w.checkpoint;
            let (number, page) = match part {
                Part::State(i) => {
                    (SLOT_BASE[slot as usize] + u64::from(i), PageOut::State(page_of(&c.state.keys, i, state_pages)))
                }
                Part::Maps(i) => (
                    SLOT_BASE[slot as usize] + u64::from(state_pages + i),
                    PageOut::Maps(page_of(&c.maps.0, i, map_pages)),
                ),
                Part::Warehouse(i) => {
                    let Some(db) = c.state.tpcc.as_ref().and_then(|t| t.warehouses.get(i as usize)) else { continue };
                    (SLOT_BASE[slot as usize] + u64::from(state_pages + map_pages + i), PageOut::Warehouse(db))
                }
                Part::Segment(i) => {
                    self.segments_on_disk.insert(c.recent[i].from);
                    (SEGMENT_BASE + c.recent[i].from, PageOut::Recent(&c.recent[i]))
                }
            };
            if let Ok(bytes) = postcard::to_allocvec(&page) {
                ctx.persist_page(number, bytes);
            }
        }
        if !w.parts.is_empty() {
            return false;
        }
        let Some(Writing { manifest, .. }) = self.writing.take() else { return false };
        let Ok(bytes) = postcard::to_allocvec(&manifest) else { return false };
        ctx.persist_page(MANIFEST_PAGE, bytes);
        // Segments no checkpoint on disk carries any more.
        let kept: std::collections::BTreeSet<u64> = manifest.segments.iter().copied().collect();
        for from in std::mem::replace(&mut self.segments_on_disk, kept.clone()).difference(&kept) {
            ctx.drop_pages(SEGMENT_BASE + from, SEGMENT_BASE + from + 1);
        }
        self.current = Some(manifest);
        true
    }

    /// Writes `c` whole, now.
    pub(super) fn write_now(&mut self, ctx: &mut Ctx<'_, super::TigaMsg>, c: Arc<Checkpoint>) {
        // A gap of 0 is one step: every page at once.
        self.start(ctx, c, 0);
        self.step(ctx);
    }

    /// The checkpoint on disk: `Ok(None)` if there is none, `Err` if its pages are missing or
    /// unreadable.
    pub(super) fn load(&mut self, stored: &Stored) -> Result<Option<Checkpoint>, ()> {
        let segment_pages = stored.pages.range(SEGMENT_BASE..).map(|(p, _)| p - SEGMENT_BASE);
        self.segments_on_disk = segment_pages.collect();
        let Some(bytes) = stored.pages.get(&MANIFEST_PAGE) else { return Ok(None) };
        let manifest: Manifest = postcard::from_bytes(bytes).map_err(|_| ())?;
        if manifest.slot > 1 {
            return Err(());
        }
        let mut c = Checkpoint {
            position: manifest.position,
            state: Default::default(),
            maps: KeyMaps::default(),
            recent: Vec::new(),
        };
        let base = SLOT_BASE[manifest.slot as usize];
        let slot_pages =
            (0..manifest.state_pages + manifest.map_pages + manifest.warehouse_pages).map(|i| base + u64::from(i));
        let mut warehouses = Vec::new();
        let segment_pages = manifest.segments.iter().map(|from| SEGMENT_BASE + from);
        for number in slot_pages.chain(segment_pages) {
            let bytes = stored.pages.get(&number).ok_or(())?;
            match postcard::from_bytes::<Page>(bytes).map_err(|_| ())? {
                Page::State(entries) => entries.into_iter().for_each(|(k, v)| {
                    c.state.keys.insert(k, v);
                }),
                Page::Maps(entries) => entries.into_iter().for_each(|(k, v)| {
                    c.maps.0.insert(k, v);
                }),
                Page::Recent(r) => c.recent.push(Arc::new(r)),
                Page::Warehouse(db) => warehouses.push(Arc::new(db)),
            }
        }
        c.state.tpcc = match manifest.tpcc {
            Some((scale, pieces_refused)) => Some(TpccShard { scale, warehouses, pieces_refused }),
            None if warehouses.is_empty() => None,
            None => return Err(()),
        };
        self.current = Some(manifest);
        Ok(Some(c))
    }
}
