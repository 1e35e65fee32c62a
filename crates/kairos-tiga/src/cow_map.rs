//! A map whose clone costs the same whatever its size: the store, the committed state and the
//! key maps of a Tiga replica, which a checkpoint must capture every few thousand
//! positions and a view change copies.
//!
//! Keys are spread by a hash over [`BUCKETS`] small ordered maps, each behind an [`Arc`].
//! Cloning the map clones the bucket pointers; a write copies its bucket first only when a clone
//! still shares it ([`Arc::make_mut`]). So a checkpoint is taken in microseconds, and the copying
//! it implies is spread over the writes that follow, a bucket at a time, instead of stopping the
//! replica for a copy of the whole state (55–75 ms at 65,000 keys in the 10,000 txn/s kill run;
//! it grows with the state).
//!
//! Why not a persistent map crate (`imbl::OrdMap`): it was tried, and every lookup and insert
//! got slower (leaders 74 against 59 µs per transaction); here a lookup is one hash and a search
//! in a bucket of a few dozen keys, faster than in one large tree. Why not `HashMap`: iteration
//! order must be deterministic (checkpoints are serialized and compared), and here it is: by
//! bucket, then by key.

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

/// Buckets per map: a power of two. A clone copies this many pointers (32 KiB); a state of
/// 65,000 keys has about 16 per bucket.
pub const BUCKETS: usize = 4096;

/// How a key picks its bucket: a hash that a key and its borrowed form agree on.
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

fn bucket_of<Q: BucketKey + ?Sized>(k: &Q) -> usize {
    (k.bucket_hash() >> 52) as usize & (BUCKETS - 1)
}

/// A map with O([`BUCKETS`]) clones (module docs).
pub struct CowMap<K, V> {
    buckets: Vec<Option<Arc<BTreeMap<K, V>>>>,
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
        self.buckets[bucket_of(k)].as_ref()?.get(k)
    }

    /// The value of `k` to change in place (its bucket is copied first if a clone shares it).
    pub fn get_mut<Q>(&mut self, k: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + BucketKey + ?Sized,
    {
        self.bucket_holding_mut(k)?.get_mut(k)
    }

    /// The value of `k`, inserted as `make()` if absent.
    pub fn get_or_insert_with(&mut self, k: K, make: impl FnOnce() -> V) -> &mut V {
        match Self::bucket_for_mut(&mut self.buckets, &k).entry(k) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                self.len += 1;
                e.insert(make())
            }
        }
    }

    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        let old = Self::bucket_for_mut(&mut self.buckets, &k).insert(k, v);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove<Q>(&mut self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + BucketKey + ?Sized,
    {
        let old = self.bucket_holding_mut(k)?.remove(k);
        self.len -= 1;
        old
    }

    /// `k`'s bucket to change (copied first if a clone shares it), if it holds `k`.
    fn bucket_holding_mut<Q>(&mut self, k: &Q) -> Option<&mut BTreeMap<K, V>>
    where
        K: Borrow<Q>,
        Q: Ord + BucketKey + ?Sized,
    {
        let bucket = self.buckets[bucket_of(k)].as_mut()?;
        bucket.contains_key(k).then(|| Arc::make_mut(bucket))
    }

    /// `k`'s bucket among `buckets` to insert into (created, or copied first if a clone
    /// shares it). Takes the field, not `self`, so the caller can still count `len`.
    fn bucket_for_mut<'a>(buckets: &'a mut [Option<Arc<BTreeMap<K, V>>>], k: &K) -> &'a mut BTreeMap<K, V> {
        Arc::make_mut(buckets[bucket_of(k)].get_or_insert_with(Default::default))
    }

    /// The buckets, to free a few at a time (a whole map at once would stop its owner for as
    /// long as copying it does; see the Tiga server's retired maps).
    pub fn into_buckets(self) -> impl Iterator<Item = Arc<BTreeMap<K, V>>> {
        self.buckets.into_iter().flatten()
    }

    /// The entries of buckets `buckets` (a range of `0..BUCKETS`), by bucket and then by key.
    pub fn bucket_entries(&self, buckets: std::ops::Range<usize>) -> impl Iterator<Item = (&K, &V)> {
        let buckets = buckets.start.min(BUCKETS)..buckets.end.min(BUCKETS);
        self.buckets[buckets].iter().flatten().flat_map(|b| b.iter())
    }

    /// Every entry, by bucket and then by key (deterministic, not sorted by key).
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.buckets.iter().flatten().flat_map(|b| b.iter())
    }
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
                (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
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
