//! The table users make: one type in front of both lookup structures and every
//! instruction-set form, the choice made at run time, as DPDK's `rte_fib` puts one API in
//! front of its algorithms.
//!
//! A [`Table`] holds one of two structures ([`Structure`]):
//!
//! - the **trie**, a compressed multibit trie in the manner of Poptrie (a direct-pointing
//!   first level, then 64-way nodes whose children and leaves are packed and found by
//!   popcount); `trie/mod.rs` explains the layout;
//! - the **range tree**, a B+-tree of address ranges searched with vector compares, every
//!   lookup the same number of steps, so batches walk in lockstep; `ranges/mod.rs`
//!   explains it.
//!
//! and runs its lookups in one [`Form`]: AVX-512, AVX2 or portable code. A table made
//! without saying which takes the fastest form this CPU runs and the structure measured
//! faster for the family with it: the trie for IPv4 (its direct array resolves most of a
//! 32-bit key at once, two to three times faster than the range tree), the range tree
//! for IPv6 where the CPU has AVX2 or AVX-512 (a batched lookup of the full IPv6 table
//! costs about half the trie's), the trie for IPv6 elsewhere (the range tree's portable
//! steps are 2-2.4 times slower than its AVX-512 ones, slower than the trie).
//! Either choice can be forced ([`Table::with_structure`], [`Table::set_form`]), which
//! is how the tests check every structure and form against each other on one machine.

use crate::form::{Form, Runnable, UnsupportedForm};
use crate::key::Key;
use crate::prefix::Prefix;
use crate::ranges::{RangeReleased, RangeSnapshot, RangeTree};
use crate::trie::{Trie, TrieReleased, TrieSnapshot};
use crate::MemoryUsage;
use std::fmt;
use std::str::FromStr;

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

/// The lookup structure of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Structure {
    /// A compressed multibit trie (Poptrie's layout): IPv4's structure.
    Trie,
    /// A B+-tree of address ranges searched with vector compares: IPv6's structure
    /// where the CPU has AVX2 or AVX-512.
    RangeTree,
}

impl Structure {
    /// Both structures.
    pub const ALL: [Structure; 2] = [Structure::Trie, Structure::RangeTree];

    /// The structure measured faster for family `K` with lookups in `form` (see the
    /// module documentation).
    pub fn best<K: Key>(form: Form) -> Structure {
        if K::FAMILY == 6 && form >= Form::Avx2 {
            Structure::RangeTree
        } else {
            Structure::Trie
        }
    }

    /// The structure's name in reports: `trie` or `range tree`.
    pub fn name(self) -> &'static str {
        match self {
            Structure::Trie => "trie",
            Structure::RangeTree => "range tree",
        }
    }
}

impl fmt::Display for Structure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Structure {
    type Err = String;
    /// `trie`, or `range-tree` (or `range tree`).
    fn from_str(s: &str) -> Result<Structure, String> {
        match s {
            "trie" => Ok(Structure::Trie),
            "range-tree" | "range tree" => Ok(Structure::RangeTree),
            _ => Err(format!(
                "unknown structure {s:?} (expected trie or range-tree)"
            )),
        }
    }
}

/// A map from prefixes of one address family to values, with longest-prefix lookups,
/// one at a time or in batches.
///
/// Values are route or nexthop indices up to [`crate::MAX_VALUE`]. To look up while
/// another thread updates, share it with [`crate::shared()`].
///
/// ```
/// use fibre_lpm::{Prefix, Table};
/// let mut t: Table<u32> = Table::new();
/// t.insert("10.0.0.0/8".parse().unwrap(), 1);
/// t.insert("10.1.0.0/16".parse().unwrap(), 2);
/// assert_eq!(t.lookup_addr("10.1.2.3".parse().unwrap()), Some(2));
/// assert_eq!(t.lookup_addr("10.2.0.0".parse().unwrap()), Some(1));
/// assert_eq!(t.lookup_addr("11.0.0.0".parse().unwrap()), None);
/// println!("a {} in the {} form", t.structure(), t.form());
/// ```
#[derive(Clone, Debug)]
pub struct Table<K: Key> {
    inner: Inner<K>,
}

// The trie's update side is larger than the range tree's; a table exists once per
// family, and boxing it would add a pointer chase to every lookup on the writer's table.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
enum Inner<K: Key> {
    Trie(Trie<K>),
    Ranges(RangeTree<K>),
}

/// One published version of a [`Table`], as readers hold it ([`crate::ReadGuard`]
/// dereferences to one): lookups only.
#[derive(Debug)]
pub struct TableSnapshot<K: Key> {
    inner: SnapshotInner<K>,
}

#[derive(Debug)]
enum SnapshotInner<K: Key> {
    Trie(TrieSnapshot<K>),
    Ranges(RangeSnapshot<K>),
}

/// What a publish released from a table's memory (see [`mod@crate::shared`]).
#[derive(Debug)]
pub(crate) enum TableReleased {
    Trie(TrieReleased),
    Ranges(RangeReleased),
}

/// `$body` with `$t` bound to the structure inside `$inner` (an [`Inner`]).
macro_rules! each {
    ($inner:expr, $t:ident => $body:expr) => {
        match $inner {
            Inner::Trie($t) => $body,
            Inner::Ranges($t) => $body,
        }
    };
}

/// `$body` with `$s` bound to the structure's snapshot inside `$inner`.
macro_rules! each_snapshot {
    ($inner:expr, $s:ident => $body:expr) => {
        match $inner {
            SnapshotInner::Trie($s) => $body,
            SnapshotInner::Ranges($s) => $body,
        }
    };
}

impl<K: Key> Default for Table<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Key> Table<K> {
    /// An empty table: the structure measured faster for the family, lookups in the
    /// fastest form this CPU runs.
    pub fn new() -> Self {
        Self::with_structure(Structure::best::<K>(Form::best()))
    }

    /// An empty table of the given structure, lookups in the fastest form this CPU runs.
    pub fn with_structure(structure: Structure) -> Self {
        let inner = match structure {
            Structure::Trie => Inner::Trie(Trie::new()),
            Structure::RangeTree => Inner::Ranges(RangeTree::new()),
        };
        Table { inner }
    }

    /// A table holding `routes` (a prefix given twice keeps its last value), built in
    /// bulk: much faster than inserting them one by one.
    ///
    /// # Panics
    /// If a value exceeds [`crate::MAX_VALUE`].
    pub fn build(routes: impl IntoIterator<Item = (Prefix<K>, u32)>) -> Self {
        Self::build_with(Structure::best::<K>(Form::best()), routes)
    }

    /// Like [`Table::build`], with the given structure.
    pub fn build_with(
        structure: Structure,
        routes: impl IntoIterator<Item = (Prefix<K>, u32)>,
    ) -> Self {
        let inner = match structure {
            Structure::Trie => Inner::Trie(Trie::build(routes)),
            Structure::RangeTree => Inner::Ranges(RangeTree::build(routes)),
        };
        Table { inner }
    }

    /// The lookup structure.
    pub fn structure(&self) -> Structure {
        match self.inner {
            Inner::Trie(_) => Structure::Trie,
            Inner::Ranges(_) => Structure::RangeTree,
        }
    }

    /// The instructions lookups use.
    pub fn form(&self) -> Form {
        each!(&self.inner, t => t.form().form())
    }

    /// Makes lookups use `form` (and the snapshots published from now on), if this CPU
    /// runs it; the table is unchanged otherwise.
    pub fn set_form(&mut self, form: Form) -> Result<(), UnsupportedForm> {
        let runnable = Runnable::new(form).ok_or(UnsupportedForm(form))?;
        each!(&mut self.inner, t => t.set_form(runnable));
        Ok(())
    }

    /// Sets `prefix` to `value`; returns the value it had.
    ///
    /// # Panics
    /// If `value` exceeds [`crate::MAX_VALUE`].
    pub fn insert(&mut self, prefix: Prefix<K>, value: u32) -> Option<u32> {
        each!(&mut self.inner, t => t.insert(prefix, value))
    }

    /// Removes `prefix`; returns its value.
    pub fn remove(&mut self, prefix: &Prefix<K>) -> Option<u32> {
        each!(&mut self.inner, t => t.remove(prefix))
    }

    /// Removes every prefix of `prefixes` the table holds; returns how many it held. The
    /// same as removing them one at a time, but the trie recompiles each node they touch
    /// once: a link's thousand host routes under a few prefixes go several times faster.
    pub fn remove_many(&mut self, prefixes: &[Prefix<K>]) -> usize {
        each!(&mut self.inner, t => t.remove_many(prefixes))
    }

    /// The value of exactly `prefix` (not a longest-prefix match).
    pub fn get(&self, prefix: &Prefix<K>) -> Option<u32> {
        each!(&self.inner, t => t.get(prefix))
    }

    /// True if exactly `prefix` is in the table.
    pub fn contains(&self, prefix: &Prefix<K>) -> bool {
        self.get(prefix).is_some()
    }

    /// Number of prefixes.
    pub fn len(&self) -> usize {
        each!(&self.inner, t => t.len())
    }

    /// True if the table holds no prefix.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of prefixes of each length, indexed by length (`0..=32` or `0..=128`).
    pub fn count_by_len(&self) -> &[usize] {
        each!(&self.inner, t => t.count_by_len())
    }

    /// All prefixes and values, sorted by address, then length.
    pub fn to_vec(&self) -> Vec<(Prefix<K>, u32)> {
        each!(&self.inner, t => t.to_vec())
    }

    /// Bytes used, by purpose.
    pub fn memory(&self) -> MemoryUsage {
        each!(&self.inner, t => t.memory())
    }

    /// Rebuilds the lookup structure tightly packed (the same prefixes, values, structure
    /// and form).
    pub fn compact(&mut self) {
        each!(&mut self.inner, t => t.compact())
    }

    /// Removes every prefix (the structure and form stay).
    pub fn clear(&mut self) {
        each!(&mut self.inner, t => t.clear())
    }

    /// The value of the longest prefix containing `key`, if any.
    #[inline]
    pub fn lookup(&self, key: K) -> Option<u32> {
        each!(&self.inner, t => t.lookup(key))
    }

    /// [`Table::lookup`] of a standard library address.
    #[inline]
    pub fn lookup_addr(&self, addr: K::Addr) -> Option<u32> {
        self.lookup(addr.into())
    }

    /// Looks up every key of `keys`, writing the answers to the same positions of `out`,
    /// [`crate::BATCH`] at a time with their memory reads overlapped: use batches of that
    /// size or more for full speed.
    ///
    /// # Panics
    /// If `out` is shorter than `keys`.
    pub fn lookup_batch(&self, keys: &[K], out: &mut [Option<u32>]) {
        each!(&self.inner, t => t.lookup_batch(keys, out))
    }

    /// This table as readers will see it, and what was released since the last publish;
    /// the table copies what it changes from then on. Only [`crate::shared`] publishes:
    /// what is released must not be reclaimed while a reader holds the snapshot.
    pub(crate) fn publish(&mut self) -> (TableSnapshot<K>, TableReleased) {
        let (inner, released) = match &mut self.inner {
            Inner::Trie(t) => {
                let (s, r) = t.publish();
                (SnapshotInner::Trie(s), TableReleased::Trie(r))
            }
            Inner::Ranges(t) => {
                let (s, r) = t.publish();
                (SnapshotInner::Ranges(s), TableReleased::Ranges(r))
            }
        };
        (TableSnapshot { inner }, released)
    }

    /// Reuses what a publish released, once no reader can reach it (memory released by
    /// another structure, before a [`crate::LpmWriter::replace`], is left alone).
    pub(crate) fn reclaim(&mut self, released: TableReleased) {
        match (&mut self.inner, released) {
            (Inner::Trie(t), TableReleased::Trie(r)) => t.reclaim(r),
            (Inner::Ranges(t), TableReleased::Ranges(r)) => t.reclaim(r),
            _ => {}
        }
    }

    /// Checks the structure inside, with what the publishes in `retired` released still
    /// waiting for readers (tests).
    #[cfg(test)]
    pub(crate) fn check_structure(&self, retired: &[&TableReleased]) {
        match &self.inner {
            Inner::Trie(t) => {
                let counted = retired
                    .iter()
                    .filter_map(|r| match r {
                        TableReleased::Trie(r) => Some(t.slots_of(r)),
                        TableReleased::Ranges(_) => None,
                    })
                    .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
                t.check_invariants_with(counted)
            }
            Inner::Ranges(t) => {
                let counted = retired
                    .iter()
                    .filter_map(|r| match r {
                        TableReleased::Ranges(r) => Some(t.lines_of(r)),
                        TableReleased::Trie(_) => None,
                    })
                    .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
                t.check_invariants_with(counted)
            }
        }
    }
}

impl<K: Key> FromIterator<(Prefix<K>, u32)> for Table<K> {
    fn from_iter<I: IntoIterator<Item = (Prefix<K>, u32)>>(iter: I) -> Self {
        Self::build(iter)
    }
}

impl<K: Key> TableSnapshot<K> {
    /// The value of the longest prefix containing `key`, if any.
    #[inline]
    pub fn lookup(&self, key: K) -> Option<u32> {
        each_snapshot!(&self.inner, s => s.lookup(key))
    }

    /// [`TableSnapshot::lookup`] of a standard library address.
    #[inline]
    pub fn lookup_addr(&self, addr: K::Addr) -> Option<u32> {
        self.lookup(addr.into())
    }

    /// Looks up every key of `keys`, writing the answers to the same positions of `out`,
    /// as [`Table::lookup_batch`] does.
    ///
    /// # Panics
    /// If `out` is shorter than `keys`.
    pub fn lookup_batch(&self, keys: &[K], out: &mut [Option<u32>]) {
        each_snapshot!(&self.inner, s => s.lookup_batch(keys, out))
    }

    /// Number of prefixes in this version.
    pub fn len(&self) -> usize {
        each_snapshot!(&self.inner, s => s.len())
    }

    /// True if this version holds no prefix.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The lookup structure.
    pub fn structure(&self) -> Structure {
        match self.inner {
            SnapshotInner::Trie(_) => Structure::Trie,
            SnapshotInner::Ranges(_) => Structure::RangeTree,
        }
    }

    /// The instructions lookups use.
    pub fn form(&self) -> Form {
        each_snapshot!(&self.inner, s => s.form().form())
    }
}

impl<K: Key> Lookups<K> for Table<K> {
    #[inline]
    fn lookup(&self, key: K) -> Option<u32> {
        Table::lookup(self, key)
    }
    #[inline]
    fn lookup_batch(&self, keys: &[K], out: &mut [Option<u32>]) {
        Table::lookup_batch(self, keys, out)
    }
    fn len(&self) -> usize {
        Table::len(self)
    }
}

impl<K: Key> Lookups<K> for TableSnapshot<K> {
    #[inline]
    fn lookup(&self, key: K) -> Option<u32> {
        TableSnapshot::lookup(self, key)
    }
    #[inline]
    fn lookup_batch(&self, keys: &[K], out: &mut [Option<u32>]) {
        TableSnapshot::lookup_batch(self, keys, out)
    }
    fn len(&self) -> usize {
        TableSnapshot::len(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::ReferenceLpm;
    use crate::testing::{check_against_reference, probes_for, random_prefix};
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn the_default_structure_is_the_family_s_best_on_this_cpu() {
        assert_eq!(Table::<u32>::new().structure(), Structure::Trie);
        let v6 = Table::<u128>::new();
        let want = if Form::best() >= Form::Avx2 {
            Structure::RangeTree
        } else {
            Structure::Trie
        };
        assert_eq!(v6.structure(), want);
        assert_eq!(v6.form(), Form::best());
        assert_eq!(Table::<u128>::build([]).structure(), want);
    }

    #[test]
    fn structures_parse_and_print() {
        for s in Structure::ALL {
            assert_eq!(s.name().parse::<Structure>(), Ok(s));
        }
        assert_eq!("range-tree".parse::<Structure>(), Ok(Structure::RangeTree));
        assert!("tree".parse::<Structure>().is_err());
    }

    #[test]
    fn every_form_is_set_where_this_cpu_runs_it_and_refused_where_not() {
        let mut t = Table::<u32>::new();
        let before = t.form();
        for f in Form::ALL {
            if f.is_supported() {
                assert_eq!(t.set_form(f), Ok(()));
                assert_eq!(t.form(), f);
            } else {
                assert_eq!(t.set_form(f), Err(UnsupportedForm(f)));
                assert_eq!(t.form(), Form::Portable, "the last form set stays");
            }
            t.set_form(Form::Portable).unwrap();
        }
        t.set_form(before).unwrap();
    }

    /// Every structure in every form this CPU runs answers as the reference, on random
    /// overlapping routes of both families, one key at a time and in batches, on the
    /// table and on a published snapshot (whose form is the table's).
    fn every_structure_and_form<K: Key>(seed: u64) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let bases: Vec<u128> = (0..4).map(|_| rng.gen()).collect();
        let routes: Vec<(Prefix<K>, u32)> = (0..if cfg!(miri) { 12 } else { 3000 })
            .map(|i| (random_prefix::<K>(&mut rng, &bases), i))
            .collect();
        let mut reference = ReferenceLpm::new();
        for &(p, v) in &routes {
            reference.insert(p, v);
        }
        let probes = probes_for(&reference.to_sorted_vec(), &mut rng);
        for structure in Structure::ALL {
            let mut t = Table::build_with(structure, routes.iter().copied());
            for form in Form::ALL.into_iter().filter(|f| f.is_supported()) {
                t.set_form(form).unwrap();
                assert_eq!((t.structure(), t.form()), (structure, form));
                check_against_reference(&t, &reference, &probes);
                let (snapshot, _) = t.clone().publish();
                assert_eq!(snapshot.form(), form);
                assert_eq!(snapshot.structure(), structure);
                check_against_reference(&snapshot, &reference, &probes);
            }
        }
    }

    #[test]
    fn every_structure_in_every_form_this_cpu_runs_answers_as_the_reference() {
        for seed in 0..if cfg!(miri) { 1 } else { 3 } {
            every_structure_and_form::<u32>(seed);
            every_structure_and_form::<u128>(seed);
        }
    }

    #[test]
    fn compact_clear_and_clone_keep_structure_and_form() {
        let mut t = Table::<u128>::with_structure(Structure::Trie);
        t.set_form(Form::Portable).unwrap();
        t.insert("2001:db8::/32".parse().unwrap(), 1);
        let copy = t.clone();
        t.compact();
        assert_eq!((t.structure(), t.form()), (Structure::Trie, Form::Portable));
        assert_eq!(copy.form(), Form::Portable);
        t.clear();
        assert!(t.is_empty());
        assert_eq!((t.structure(), t.form()), (Structure::Trie, Form::Portable));
        let mut r = Table::<u128>::with_structure(Structure::RangeTree);
        r.set_form(Form::Portable).unwrap();
        r.insert("2001:db8::/32".parse().unwrap(), 1);
        r.compact();
        r.clear();
        assert_eq!(
            (r.structure(), r.form()),
            (Structure::RangeTree, Form::Portable)
        );
    }
}
