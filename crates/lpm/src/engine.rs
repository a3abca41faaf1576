//! What every longest-prefix-match engine offers, and which one each family uses.
//!
//! fibre has two engines, both written once and generic over the key width: the trie
//! ([`Lpm`]) and the range tree ([`RangeLpm`]). Each family uses the one measured faster
//! for it on full Internet tables: the trie for IPv4 (its direct array resolves most of
//! a 32-bit key at once), the range tree for IPv6 (a batched lookup of the shipped table
//! costs 55-65% of the trie's; `fibre bench lookup --structure` and the `lookup_profile`
//! example measure both).
//! The range tree's steps are AVX-512 compares, or AVX2 ones (four where AVX-512 takes
//! two; still faster than the trie, measured with both built for AVX2): built for a CPU
//! with neither, its portable steps are 2-2.4x slower and IPv6 tables use the trie too.
//! [`Key::Table`] names the choice, [`Table`] spells it, and [`Engine`] is the interface
//! code generic over the family uses, as the command line and the benchmarks do.

use crate::key::Key;
use crate::prefix::Prefix;
use crate::ranges::{RangeLpm, RangeReleased, RangeSnapshot};
use crate::trie::{Lpm, MemoryUsage, Released, Snapshot};

/// The engine a family's tables use: [`Lpm`] for IPv4, [`RangeLpm`] for IPv6.
pub type Table<K> = <K as Key>::Table;
/// A published version of a family's table, as readers hold it.
pub type TableSnapshot<K> = <Table<K> as Engine<K>>::Snapshot;

/// Lookups in a table or in one published version of it.
pub trait Lookups<K: Key> {
    /// The value of the longest prefix containing `key`, if any.
    fn lookup(&self, key: K) -> Option<u32>;
    /// Looks up every key of `keys`, writing the answers to the same positions of `out`.
    ///
    /// # Panics
    /// If `out` is shorter than `keys`.
    fn lookup_batch(&self, keys: &[K], out: &mut [Option<u32>]);
    /// Number of prefixes.
    fn len(&self) -> usize;
    /// True if there is no prefix.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A longest-prefix-match table: updates, exact queries, lookups, and what sharing with
/// readers needs (see [`mod@crate::shared`]).
pub trait Engine<K: Key>:
    Lookups<K> + Default + Clone + Send + Sync + std::fmt::Debug + sealed::Sealed + 'static
{
    /// The lookup structure's name, for reports: "trie" or "range tree".
    const STRUCTURE: &'static str;
    /// One published version, as readers see it.
    type Snapshot: Lookups<K> + Send + Sync + std::fmt::Debug + 'static;
    /// A table holding `routes` (later duplicates replace earlier ones), built in bulk.
    fn build(routes: impl IntoIterator<Item = (Prefix<K>, u32)>) -> Self;
    /// Sets `prefix` to `value`; returns the value it had.
    ///
    /// # Panics
    /// If `value` exceeds [`crate::MAX_VALUE`].
    fn insert(&mut self, prefix: Prefix<K>, value: u32) -> Option<u32>;
    /// Removes `prefix`; returns its value.
    fn remove(&mut self, prefix: &Prefix<K>) -> Option<u32>;
    /// The value of exactly `prefix`.
    fn get(&self, prefix: &Prefix<K>) -> Option<u32>;
    /// True if exactly `prefix` is in the table.
    fn contains(&self, prefix: &Prefix<K>) -> bool {
        self.get(prefix).is_some()
    }
    /// Removes every prefix.
    fn clear(&mut self) {
        *self = Self::default();
    }
    /// Number of prefixes of each length, indexed by length.
    fn count_by_len(&self) -> &[usize];
    /// All prefixes and values, sorted by address, then length.
    fn to_vec(&self) -> Vec<(Prefix<K>, u32)>;
    /// Bytes used, by purpose.
    fn memory(&self) -> MemoryUsage;
    /// Rebuilds the lookup structure tightly packed (the same prefixes and values).
    fn compact(&mut self);

    /// What a publish releases, to reuse once no reader can reach it ([`crate::shared`]'s
    /// business, not a user's).
    #[doc(hidden)]
    type Released: Send + 'static;
    /// The version readers get: a snapshot sharing the table's memory, and what was
    /// released since the last publish. From then on the table copies what it changes.
    #[doc(hidden)]
    fn publish(&mut self) -> (Self::Snapshot, Self::Released);
    /// Reuses memory that no reader can reach any more.
    #[doc(hidden)]
    fn reclaim(&mut self, released: Self::Released);
}

pub(crate) mod sealed {
    /// Only this crate's engines are engines: sharing with readers rests on how they
    /// copy on write.
    pub trait Sealed {}
}

/// [`Lookups`] and [`Engine`] by the engine's own methods of the same names.
macro_rules! engine {
    ($table:ident, $snapshot:ident, $released:ident, $structure:literal) => {
        impl<K: Key> Lookups<K> for $table<K> {
            #[inline]
            fn lookup(&self, key: K) -> Option<u32> {
                $table::lookup(self, key)
            }
            #[inline]
            fn lookup_batch(&self, keys: &[K], out: &mut [Option<u32>]) {
                $table::lookup_batch(self, keys, out)
            }
            fn len(&self) -> usize {
                $table::len(self)
            }
        }

        impl<K: Key> Lookups<K> for $snapshot<K> {
            #[inline]
            fn lookup(&self, key: K) -> Option<u32> {
                $snapshot::lookup(self, key)
            }
            #[inline]
            fn lookup_batch(&self, keys: &[K], out: &mut [Option<u32>]) {
                $snapshot::lookup_batch(self, keys, out)
            }
            fn len(&self) -> usize {
                $snapshot::len(self)
            }
        }

        impl<K: Key> sealed::Sealed for $table<K> {}

        impl<K: Key> Engine<K> for $table<K> {
            const STRUCTURE: &'static str = $structure;
            type Snapshot = $snapshot<K>;
            fn build(routes: impl IntoIterator<Item = (Prefix<K>, u32)>) -> Self {
                $table::build(routes)
            }
            fn insert(&mut self, prefix: Prefix<K>, value: u32) -> Option<u32> {
                $table::insert(self, prefix, value)
            }
            fn remove(&mut self, prefix: &Prefix<K>) -> Option<u32> {
                $table::remove(self, prefix)
            }
            fn get(&self, prefix: &Prefix<K>) -> Option<u32> {
                $table::get(self, prefix)
            }
            fn count_by_len(&self) -> &[usize] {
                $table::count_by_len(self)
            }
            fn to_vec(&self) -> Vec<(Prefix<K>, u32)> {
                $table::to_vec(self)
            }
            fn memory(&self) -> MemoryUsage {
                $table::memory(self)
            }
            fn compact(&mut self) {
                $table::compact(self)
            }
            type Released = $released;
            fn publish(&mut self) -> ($snapshot<K>, $released) {
                $table::publish(self)
            }
            fn reclaim(&mut self, released: $released) {
                $table::reclaim(self, released)
            }
        }
    };
}

engine!(Lpm, Snapshot, Released, "trie");
engine!(RangeLpm, RangeSnapshot, RangeReleased, "range tree");
