//! A map whose clone costs the same whatever its size: the store, the committed state and the
//! key maps of a Tiga replica, which a checkpoint must capture every few thousand
//! positions and a view change copies.
//!
//! Keys are spread by a hash over [`BUCKETS`] small hash tables, each behind an [`Arc`].
//! Cloning the map clones the bucket pointers; a write copies its bucket first only when a clone
//! still shares it ([`Arc::make_mut`]). So a checkpoint is taken in microseconds, and the copying
//! it implies is spread over the writes that follow, a bucket at a time, instead of stopping the
//! replica for a copy of the whole state (55–75 ms at 65,000 keys in the 10,000 txn/s kill run;
//! it grows with the state).
//!
//! A key is hashed once per lookup: the hash picks the bucket (by a remix of it, so that the
//! keys of one bucket still differ in the bits the table probes by) and then the slot in the
//! bucket's table ([`hashbrown::HashTable`]). Buckets were ordered maps (`BTreeMap`) until a
//! profile of Tiga's servers found a fifth of their time in their searches, each comparison of
//! byte keys a pointer chase: a lookup is now one hash and, most often, one comparison.
//!
//! Why not a persistent map crate (`imbl::OrdMap`): it was tried, and every lookup and insert
//! got slower (leaders 74 against 59 µs per transaction). Why not one `HashMap`: its clone
//! copies everything. Iteration order is deterministic (checkpoints are serialized and
//! compared): by bucket, then by key, sorted when iterated (only checkpoints, serialization and
//! debugging iterate).

use hashbrown::hash_table::{Entry as TableEntry, HashTable};
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Borrow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

/// Buckets per map: a power of two. A clone copies this many pointers (32 KiB); a state of
/// 65,000 keys has about 16 per bucket.
pub const BUCKETS: usize = 4096;

/// How a key picks its bucket and slot: a hash that a key and its borrowed form agree on.
pub trait BucketKey {
    fn bucket_hash(&self) -> u64;
}

impl BucketKey for [u8] {
    fn bucket_hash(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(self)
    }
}

impl BucketKey for Vec<u8> {
    fn bucket_hash(&self) -> u64 {
        self.as_slice().bucket_hash()
    }
}

impl BucketKey for u64 {
    /// A 64-bit finalizer (SplitMix64's): key ids of nearby values land in unrelated buckets.
    fn bucket_hash(&self) -> u64 {
        let mut z = self.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The bucket of a key of hash `hash`: the top bits of a multiplicative remix of it, so that
/// the bucket fixes none of the hash's own bits, which the table probes by (its low bits) and
/// tags slots with (its top 7).
fn bucket_of(hash: u64) -> usize {
    (hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize & (BUCKETS - 1)
}

/// One bucket: a hash table of entries.
pub type Bucket<K, V> = HashTable<(K, V)>;

fn rehash<K: BucketKey, V>(entry: &(K, V)) -> u64 {
    entry.0.bucket_hash()
}

/// A map with O([`BUCKETS`]) clones (module docs).
pub struct CowMap<K, V> {
    buckets: Vec<Option<Arc<Bucket<K, V>>>>,
    len: usize,
}

impl<K, V> Default for CowMap<K, V> {
    fn default() -> Self {
        CowMap { buckets: (0..BUCKETS).map(|_| None).collect(), len: 0 }
    }
}

impl<K, V> Clone for CowMap<K, V> {
    fn clone(&self) -> Self {
        CowMap { buckets: self.buckets.clone(), len: self.len }
    }
}

impl<K: Ord + Clone + BucketKey, V: Clone> CowMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy that shares no bucket with this map: what a replica that loaded the same keys
    /// itself would hold. (A clone's first write to each bucket would copy it, on fresh pages,
    /// in the middle of a run.)
    pub fn unshared(&self) -> Self {
        let buckets = self.buckets.iter().map(|b| b.as_ref().map(|b| Arc::new(Bucket::clone(b)))).collect();
        CowMap { buckets, len: self.len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get<Q>(&self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + BucketKey + ?Sized,
    {
        let hash = k.bucket_hash();
        self.buckets[bucket_of(hash)].as_ref()?.find(hash, |(e, _)| e.borrow() == k).map(|(_, v)| v)
    }

    /// The value of `k` to change in place (its bucket is copied first if a clone shares it).
    pub fn get_mut<Q>(&mut self, k: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + BucketKey + ?Sized,
    {
        let hash = k.bucket_hash();
        let bucket = self.buckets[bucket_of(hash)].as_mut()?;
        // Found first, so that a miss does not copy a shared bucket.
        bucket.find(hash, |(e, _)| e.borrow() == k)?;
        Arc::make_mut(bucket).find_mut(hash, |(e, _)| e.borrow() == k).map(|(_, v)| v)
    }

    /// The value of `k`, inserted as `make()` if absent.
    pub fn get_or_insert_with(&mut self, k: K, make: impl FnOnce() -> V) -> &mut V {
        let hash = k.bucket_hash();
        let bucket = Arc::make_mut(self.buckets[bucket_of(hash)].get_or_insert_with(Default::default));
        match bucket.entry(hash, |(e, _)| *e == k, rehash) {
            TableEntry::Occupied(e) => &mut e.into_mut().1,
            TableEntry::Vacant(e) => {
                self.len += 1;
                &mut e.insert((k, make())).into_mut().1
            }
        }
    }

    /// The value of `k` to change in place, inserted as `make()` under the key `owned(k)` if
    /// absent: no owned key is made for a lookup that finds one.
    pub fn get_mut_or_insert_with<Q>(&mut self, k: &Q, owned: impl FnOnce(&Q) -> K, make: impl FnOnce() -> V) -> &mut V
    where
        K: Borrow<Q>,
        Q: Ord + BucketKey + ?Sized,
    {
        let hash = k.bucket_hash();
        let bucket = Arc::make_mut(self.buckets[bucket_of(hash)].get_or_insert_with(Default::default));
        match bucket.entry(hash, |(e, _)| e.borrow() == k, rehash) {
            TableEntry::Occupied(e) => &mut e.into_mut().1,
            TableEntry::Vacant(e) => {
                self.len += 1;
                &mut e.insert((owned(k), make())).into_mut().1
            }
        }
    }

    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        let hash = k.bucket_hash();
        let bucket = Arc::make_mut(self.buckets[bucket_of(hash)].get_or_insert_with(Default::default));
        match bucket.entry(hash, |(e, _)| *e == k, rehash) {
            TableEntry::Occupied(mut e) => Some(std::mem::replace(&mut e.get_mut().1, v)),
            TableEntry::Vacant(e) => {
                self.len += 1;
                e.insert((k, v));
                None
            }
        }
    }

    pub fn remove<Q>(&mut self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + BucketKey + ?Sized,
    {
        let hash = k.bucket_hash();
        let bucket = self.buckets[bucket_of(hash)].as_mut()?;
        // Found first, so that a miss does not copy a shared bucket.
        bucket.find(hash, |(e, _)| e.borrow() == k)?;
        let found = Arc::make_mut(bucket).find_entry(hash, |(e, _)| e.borrow() == k).ok()?;
        self.len -= 1;
        Some(found.remove().0 .1)
    }

    /// The buckets, to free a few at a time (a whole map at once would stop its owner for as
    /// long as copying it does; see the Tiga server's retired maps).
    pub fn into_buckets(self) -> impl Iterator<Item = Arc<Bucket<K, V>>> {
        self.buckets.into_iter().flatten()
    }

    /// The entries of buckets `buckets` (a range of `0..BUCKETS`), by bucket and then by key.
    pub fn bucket_entries(&self, buckets: std::ops::Range<usize>) -> impl Iterator<Item = (&K, &V)> {
        let buckets = buckets.start.min(BUCKETS)..buckets.end.min(BUCKETS);
        self.buckets[buckets].iter().flatten().flat_map(|b| sorted(b))
    }

    /// Every entry, by bucket and then by key (deterministic, not sorted by key).
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.buckets.iter().flatten().flat_map(|b| sorted(b))
    }
}

/// A bucket's entries by key: the table's own order depends on the order of inserts.
fn sorted<K: Ord, V>(bucket: &Bucket<K, V>) -> Vec<(&K, &V)> {
    let mut entries: Vec<(&K, &V)> = bucket.iter().map(|(k, v)| (k, v)).collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    entries
}

/// `map[k]`: the value of `k`; panics when absent, as `BTreeMap`'s does.
impl<K, V, Q> std::ops::Index<&Q> for CowMap<K, V>
where
    K: Ord + Clone + BucketKey + Borrow<Q>,
    V: Clone,
    Q: Ord + BucketKey + ?Sized,
{
    type Output = V;
    fn index(&self, k: &Q) -> &V {
        self.get(k).expect("no entry for the key")
    }
}

impl<K: Ord + Clone + BucketKey, V: Clone> FromIterator<(K, V)> for CowMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut m = CowMap::new();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

impl<K: Ord + Clone + BucketKey, V: Clone + PartialEq> PartialEq for CowMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        // Equal maps have equal buckets: a key's bucket depends on the key alone.
        self.len == other.len
            && self.buckets.iter().zip(&other.buckets).all(|(a, b)| match (a, b) {
                (Some(a), Some(b)) => {
                    Arc::ptr_eq(a, b)
                        || (a.len() == b.len()
                            && a.iter()
                                .all(|(k, v)| b.find(k.bucket_hash(), |(o, _)| o == k).is_some_and(|(_, w)| w == v)))
                }
                (a, b) => a.as_ref().is_none_or(|m| m.is_empty()) && b.as_ref().is_none_or(|m| m.is_empty()),
            })
    }
}

impl<K: Ord + Clone + BucketKey, V: Clone + Eq> Eq for CowMap<K, V> {}

impl<K: Ord + Clone + BucketKey + fmt::Debug, V: Clone + fmt::Debug> fmt::Debug for CowMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Serialized as a plain map (the same bytes as a `BTreeMap` of the same entries would take,
/// in bucket order).
impl<K: Ord + Clone + BucketKey + Serialize, V: Clone + Serialize> Serialize for CowMap<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.len))?;
        for (k, v) in self.iter() {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de, K, V> Deserialize<'de> for CowMap<K, V>
where
    K: Ord + Clone + BucketKey + Deserialize<'de>,
    V: Clone + Deserialize<'de>,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MapVisitor<K, V>(PhantomData<(K, V)>);
        impl<'de, K, V> Visitor<'de> for MapVisitor<K, V>
        where
            K: Ord + Clone + BucketKey + Deserialize<'de>,
            V: Clone + Deserialize<'de>,
        {
            type Value = CowMap<K, V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut m = CowMap::new();
                while let Some((k, v)) = access.next_entry()? {
                    m.insert(k, v);
                }
                Ok(m)
            }
        }
        d.deserialize_map(MapVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unshared_copy_holds_the_same_entries_in_buckets_of_its_own() {
        let m: CowMap<u64, u64> = (0..10_000).map(|k| (k, k)).collect();
        let (shared, own) = (m.clone(), m.unshared());
        assert!(own == m && own.len() == m.len());
        let pairs = m.buckets.iter().zip(&shared.buckets).zip(&own.buckets);
        for ((a, b), c) in pairs.filter_map(|((a, b), c)| Some(((a.as_ref()?, b.as_ref()?), c.as_ref()?))) {
            assert!(Arc::ptr_eq(a, b) && !Arc::ptr_eq(a, c));
        }
    }

    #[test]
    fn a_clone_keeps_its_entries_while_the_original_changes() {
        let mut m: CowMap<u64, u64> = (0..10_000).map(|k| (k, k)).collect();
        let snapshot = m.clone();
        for k in 0..10_000 {
            *m.get_mut(&k).unwrap() += 1;
        }
        m.insert(20_000, 0);
        assert_eq!(m.remove(&5), Some(6));
        assert_eq!(snapshot.len(), 10_000);
        assert!((0..10_000).all(|k| snapshot.get(&k) == Some(&k)));
        assert_eq!(snapshot.get(&20_000), None);
        assert_eq!(m.len(), 10_000);
        assert_eq!(m.get(&7), Some(&8));
        assert_ne!(m, snapshot);
    }

    #[test]
    fn iteration_and_bytes_do_not_depend_on_the_order_of_inserts_and_removes() {
        let forward: CowMap<u64, u64> = (0..20_000).map(|k| (k, k * 3)).collect();
        let mut backward: CowMap<u64, u64> = (0..25_000).rev().map(|k| (k, k * 3)).collect();
        for k in 20_000..25_000 {
            assert_eq!(backward.remove(&k), Some(k * 3));
        }
        assert_eq!(forward, backward);
        assert!(forward.iter().eq(backward.iter()));
        assert_eq!(postcard::to_allocvec(&forward).unwrap(), postcard::to_allocvec(&backward).unwrap());
    }

    #[test]
    fn get_mut_or_insert_with_makes_an_owned_key_only_when_absent() {
        let mut m: CowMap<Vec<u8>, u32> = CowMap::new();
        let mut made = 0;
        for _ in 0..3 {
            *m.get_mut_or_insert_with(
                b"k".as_slice(),
                |k| {
                    made += 1;
                    k.to_vec()
                },
                || 0,
            ) += 1;
        }
        assert_eq!((m.get(b"k".as_slice()), m.len(), made), (Some(&3), 1, 1));
        let shared = m.clone();
        *m.get_mut_or_insert_with(b"k".as_slice(), <[u8]>::to_vec, || 0) += 1;
        assert_eq!((shared.get(b"k".as_slice()), m.get(b"k".as_slice())), (Some(&3), Some(&4)));
    }

    #[test]
    fn byte_keys_are_found_by_their_slices_and_round_trip_through_serde() {
        let mut m: CowMap<Vec<u8>, u32> = CowMap::new();
        for i in 0..1_000u32 {
            m.insert(i.to_string().into_bytes(), i);
        }
        assert_eq!(m.get(b"417".as_slice()), Some(&417));
        assert_eq!(*m.get_or_insert_with(b"x".to_vec(), || 9), 9);
        assert_eq!(*m.get_or_insert_with(b"x".to_vec(), || 10), 9);
        assert_eq!(m.len(), 1_001);
        let bytes = postcard::to_allocvec(&m).unwrap();
        let back: CowMap<Vec<u8>, u32> = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.iter().collect::<Vec<_>>(), m.iter().collect::<Vec<_>>());
    }
}
