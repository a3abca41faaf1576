//! One address family of a Python table: fibre's LPM table behind a shared writer, and an
//! ordered index of the same prefixes.
//!
//! The LPM table answers what it is fast at: the longest prefix holding an address, one
//! at a time from the writer's own copy, or in batches from a published snapshot while
//! the interpreter runs other threads ([`fibre_lpm::shared`]: readers never wait for
//! the writer). Its values are entry ids, which the table in `table.rs` turns into
//! Python objects.
//!
//! What pytricia's interface asks besides, the LPM table has no fast answer for: the
//! prefixes in order (`keys()`), those under a prefix (`children`), and a prefix's
//! parent. Those come from a `BTreeSet` of the same prefixes ordered by address, then
//! length, which is also pytricia's order (a Patricia tree walked in pre-order); their
//! ids are the LPM table's exact answers. An IPv6 prefix is kept there packed in 17
//! bytes ([`Indexed`]), not as a `Prefix<u128>`, which a `u128` aligns to 32. The set
//! costs some 12 (IPv4) to 26 (IPv6) bytes a prefix, which `memory()` reports.

use fibre_lpm::{shared, Key, LpmReader, LpmWriter, MemoryUsage, Prefix, Table};
use std::collections::BTreeSet;
use std::ops::Bound;

/// A family's prefix as the index keeps it: ordered as (address, length), and small.
pub trait Indexed: Key {
    /// The prefix as stored.
    type Stored: Ord + Copy + Send + Sync;
    /// `p` as stored.
    fn store(p: Prefix<Self>) -> Self::Stored;
    /// The prefix stored as `k`.
    fn restore(k: Self::Stored) -> Prefix<Self>;
}

impl Indexed for u32 {
    // Already 8 bytes.
    type Stored = Prefix<u32>;
    fn store(p: Prefix<u32>) -> Prefix<u32> {
        p
    }
    fn restore(k: Prefix<u32>) -> Prefix<u32> {
        k
    }
}

impl Indexed for u128 {
    // The address's bytes, most significant first, order as the address does.
    type Stored = ([u8; 16], u8);
    fn store(p: Prefix<u128>) -> ([u8; 16], u8) {
        (p.addr().to_be_bytes(), p.len())
    }
    fn restore((addr, len): ([u8; 16], u8)) -> Prefix<u128> {
        Prefix::new_clamped(u128::from_be_bytes(addr), len)
    }
}

/// One family's prefixes and their entry ids.
pub struct Family<K: Indexed> {
    writer: LpmWriter<K>,
    reader: LpmReader<K>,
    index: BTreeSet<K::Stored>,
}

/// The last address of `p`.
fn last<K: Key>(p: &Prefix<K>) -> K {
    let host_bits = u32::from(K::BITS - p.len());
    let host_mask = if host_bits == 0 {
        0
    } else {
        u128::MAX >> (128 - host_bits)
    };
    K::from_u128(p.addr().to_u128() | host_mask)
}

impl<K: Indexed> Family<K> {
    /// A family holding `routes` (distinct prefixes with their ids), built in bulk.
    pub fn build(routes: Vec<(Prefix<K>, u32)>) -> Self {
        let table = Table::build(routes.iter().copied());
        let index = routes.into_iter().map(|(p, _)| K::store(p)).collect();
        let (writer, reader) = shared(table);
        Family {
            writer,
            reader,
            index,
        }
    }

    /// Number of prefixes.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// The id of exactly `p`.
    pub fn exact(&self, p: &Prefix<K>) -> Option<u32> {
        self.writer.table().get(p)
    }

    /// Sets `p` to `id`; returns the id it had.
    pub fn insert(&mut self, p: Prefix<K>, id: u32) -> Option<u32> {
        self.index.insert(K::store(p));
        self.writer.insert(p, id)
    }

    /// Removes `p`; returns its id.
    pub fn remove(&mut self, p: &Prefix<K>) -> Option<u32> {
        let id = self.writer.remove(*p)?;
        self.index.remove(&K::store(*p));
        Some(id)
    }

    /// The id of the longest prefix holding address `key`.
    #[inline]
    pub fn lookup(&self, key: K) -> Option<u32> {
        self.writer.table().lookup(key)
    }

    /// The id of the longest prefix in the table that holds all of `p` (its length at
    /// most `p`'s), as pytricia answers a prefix; `len_of` gives an id's prefix length.
    pub fn best(&self, p: &Prefix<K>, len_of: impl Fn(u32) -> u8) -> Option<u32> {
        let id = self.lookup(p.addr())?;
        if len_of(id) <= p.len() {
            // The longest prefix holding p's first address, and it holds all of p.
            return Some(id);
        }
        self.longest_below(p, p.len() + 1).map(|(_, id)| id)
    }

    /// The longest prefix holding `p` and shorter than `below`, with its id.
    fn longest_below(&self, p: &Prefix<K>, below: u8) -> Option<(Prefix<K>, u32)> {
        let counts = self.writer.table().count_by_len();
        (0..below)
            .rev()
            .filter(|&len| counts[usize::from(len)] > 0)
            .map(|len| Prefix::new_clamped(p.addr(), len))
            .find_map(|q| Some((q, self.exact(&q)?)))
    }

    /// The longest prefix strictly holding `p` (shorter than it), with its id.
    pub fn parent(&self, p: &Prefix<K>) -> Option<(Prefix<K>, u32)> {
        self.longest_below(p, p.len())
    }

    /// The prefixes strictly inside `p`, in order.
    pub fn children(&self, p: &Prefix<K>) -> impl Iterator<Item = Prefix<K>> + '_ {
        let end = K::store(Prefix::host(last(p)));
        let p = *p;
        self.index
            .range((Bound::Excluded(K::store(p)), Bound::Included(end)))
            .map(|&k| K::restore(k))
            .filter(move |q| p.covers(q))
    }

    /// All prefixes and ids, in order (address, then length).
    pub fn iter(&self) -> impl Iterator<Item = (Prefix<K>, u32)> + '_ {
        self.index.iter().map(|&k| {
            let p = K::restore(k);
            let id = self
                .exact(&p)
                .expect("the index and the table hold the same prefixes");
            (p, id)
        })
    }

    /// A reader of the table as it is now: publishes what changed since the last call.
    pub fn reader(&mut self) -> LpmReader<K> {
        self.writer.publish();
        self.reader.clone()
    }

    /// Bytes of the LPM table, and an estimate of the index's (a B-tree's nodes are two
    /// thirds full on average, plus their headers).
    pub fn memory(&self) -> (MemoryUsage, usize) {
        let entry = std::mem::size_of::<K::Stored>();
        (
            self.writer.table().memory(),
            self.index.len() * entry * 3 / 2,
        )
    }
}

impl<K: Indexed> Default for Family<K> {
    fn default() -> Self {
        Family::build(Vec::new())
    }
}
