//! Lock-free readers: any number of threads look up while one writer updates, by
//! read-copy-update on one copy of a [`Table`]. How, what a reader is promised, and why
//! nothing outside this crate can break that, is documented on [`shared`], the way in.

use crate::form::{Form, UnsupportedForm};
use crate::key::Key;
use crate::prefix::Prefix;
use crate::table::{Table, TableReleased, TableSnapshot};
use arc_swap::{ArcSwap, Guard};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// An update to a shared table.
#[derive(Clone, Debug)]
pub enum Op<K: Key> {
    /// Set a prefix's value.
    Insert(Prefix<K>, u32),
    /// Remove a prefix.
    Remove(Prefix<K>),
    /// Replace the whole table (for example with one built in bulk).
    Replace(Box<Table<K>>),
}

/// What the writer and the readers share.
struct Published<K: Key> {
    current: ArcSwap<TableSnapshot<K>>,
    /// Set when the writer is dropped: no new guards after that.
    closed: AtomicBool,
}

/// The single writer of a shared table.
pub struct LpmWriter<K: Key> {
    table: Table<K>,
    published: Arc<Published<K>>,
    /// Snapshots replaced by a publish, oldest first, each with the blocks released while
    /// its successor was built (blocks it, or an older snapshot, may still reach).
    retired: VecDeque<(Arc<TableSnapshot<K>>, TableReleased)>,
    changed: bool,
}

/// A reader of a shared table. It is cheap to clone; each thread may have its own.
#[derive(Clone)]
pub struct LpmReader<K: Key> {
    published: Arc<Published<K>>,
}

/// Makes readers from any thread (`Send + Sync`).
#[derive(Clone)]
pub struct LpmReaderFactory<K: Key> {
    published: Arc<Published<K>>,
}

/// A published snapshot held by a reader: all lookups through it see one version.
pub struct ReadGuard<K: Key> {
    snapshot: Guard<Arc<TableSnapshot<K>>>,
}

impl<K: Key> std::ops::Deref for ReadGuard<K> {
    type Target = TableSnapshot<K>;
    fn deref(&self) -> &TableSnapshot<K> {
        &self.snapshot
    }
}

/// A shared table starting with `table` (published at once): its writer and a first reader.
/// Any number of threads look up while the one writer updates.
///
/// Read-copy-update on one copy of a [`Table`], of either structure. The writer applies
/// each operation to its table at once, and the table copies, rather than writes,
/// whatever the published snapshot ([`TableSnapshot`]) can reach (each structure's
/// documentation says how: the path from the root to the change, each block at most once
/// per publish). [`LpmWriter::publish`] makes the current state a new snapshot and swaps
/// it in with one atomic pointer store. So:
///
/// - a reader never waits, never takes a lock and never sees a half-applied change: a
///   read guard holds one published snapshot, whole, for as long as it lives;
/// - operations applied between two publishes become visible together;
/// - readers and the writer share every part of the table that did not change, so the
///   readers' caches stay warm while routes change, and the table exists once in memory;
/// - memory is reused only when no reader can reach it: the blocks an update replaced
///   are kept, with the snapshot they belong to, until no guard holds that snapshot or
///   any older one; the writer checks at each publish and never waits for readers.
///
/// A guard costs a few atomic operations (the snapshot pointer is read through
/// `arc-swap`), so a thread that looks up many keys should take one guard for a batch of
/// them, the way a kernel takes `rcu_read_lock` once around a burst of packets.
///
/// # Why readers cannot be broken from outside
///
/// The range tree's readers load whole lines with vector loads, which are sound only
/// because nothing writes a line while a snapshot can reach it (`memory.rs` says how). Two
/// things keep that true, and neither is reachable from safe code outside this crate:
/// publishing a table and reusing what a publish released are done here alone (they are
/// not part of [`Table`]'s public interface), and memory is reused only once the
/// snapshot it was released under is held by nobody, nor any older one. Tests try the
/// attack from outside; neither compiles:
///
/// ```compile_fail
/// use fibre_lpm::Table;
/// let mut table = Table::<u128>::new();
/// let (snapshot, released) = table.publish(); // not public
/// ```
///
/// ```compile_fail
/// use fibre_lpm::{shared, Table};
/// let (mut writer, reader) = shared(Table::<u128>::new());
/// let held = reader.read().unwrap();
/// writer.publish();
/// writer.reclaim(); // no such thing: reclaiming is the writer's own, at each publish
/// ```
///
/// while the same lines through the public interface do:
///
/// ```
/// use fibre_lpm::{shared, Table};
/// let table = Table::<u128>::new();
/// let (mut writer, reader) = shared(table);
/// writer.publish();
/// ```
pub fn shared<K: Key>(mut table: Table<K>) -> (LpmWriter<K>, LpmReader<K>) {
    let (snapshot, released) = table.publish();
    // Nothing was published before: nobody can hold what this releases.
    table.reclaim(released);
    let published = Arc::new(Published {
        current: ArcSwap::from_pointee(snapshot),
        closed: AtomicBool::new(false),
    });
    let reader = LpmReader {
        published: published.clone(),
    };
    let writer = LpmWriter {
        table,
        published,
        retired: VecDeque::new(),
        changed: false,
    };
    (writer, reader)
}

impl<K: Key> LpmWriter<K> {
    /// Sets `prefix` to `value` (visible after [`LpmWriter::publish`]); returns the value
    /// it had.
    ///
    /// # Panics
    /// If `value` exceeds [`crate::MAX_VALUE`].
    pub fn insert(&mut self, prefix: Prefix<K>, value: u32) -> Option<u32> {
        self.changed = true;
        self.table.insert(prefix, value)
    }

    /// Removes `prefix` (visible after [`LpmWriter::publish`]); returns its value.
    pub fn remove(&mut self, prefix: Prefix<K>) -> Option<u32> {
        self.changed = true;
        self.table.remove(&prefix)
    }

    /// Removes every prefix of `prefixes` the table holds, in one batch (visible after
    /// [`LpmWriter::publish`]); returns how many it held.
    pub fn remove_many(&mut self, prefixes: &[Prefix<K>]) -> usize {
        self.changed = true;
        self.table.remove_many(prefixes)
    }

    /// Replaces the whole table (visible after [`LpmWriter::publish`]).
    pub fn replace(&mut self, table: Table<K>) {
        self.changed = true;
        self.table = table;
    }

    /// Makes lookups use `form` from the next publish on, if this CPU runs it.
    pub fn set_form(&mut self, form: Form) -> Result<(), UnsupportedForm> {
        self.table.set_form(form)?;
        self.changed = true;
        Ok(())
    }

    /// Applies any operation.
    pub fn apply(&mut self, op: Op<K>) {
        match op {
            Op::Insert(p, v) => {
                self.insert(p, v);
            }
            Op::Remove(p) => {
                self.remove(p);
            }
            Op::Replace(t) => self.replace(*t),
        }
    }

    /// Makes every operation applied since the last publish visible to readers at once,
    /// then reuses the memory that no reader can reach any more. Never waits.
    pub fn publish(&mut self) {
        if self.changed {
            self.changed = false;
            let (snapshot, released) = self.table.publish();
            // `swap` turns every reader's claim on the old snapshot into a count of its
            // `Arc` before it returns (arc-swap pays its readers' debts), so from here on
            // the count says who holds it.
            let old = self.published.current.swap(Arc::new(snapshot));
            self.retired.push_back((old, released));
        }
        // A snapshot no guard holds (only this queue does), and no older one held either:
        // nothing can reach the blocks released while its successor was built.
        // `Arc::get_mut` checks that with an acquire load, which orders the last reads of
        // the reader that let it go before the writes that reuse the blocks.
        while let Some((snapshot, _)) = self.retired.front_mut() {
            if Arc::get_mut(snapshot).is_none() {
                break;
            }
            let (_, released) = self.retired.pop_front().expect("checked above");
            self.table.reclaim(released);
        }
    }

    /// True if operations were applied and not yet published.
    pub fn has_pending(&self) -> bool {
        self.changed
    }

    /// The writer's table: every operation applied so far, published or not.
    pub fn table(&self) -> &Table<K> {
        &self.table
    }

    /// The published table, as readers see it.
    pub fn published(&self) -> ReadGuard<K> {
        ReadGuard {
            snapshot: self.published.current.load(),
        }
    }

    /// Published snapshots still held by a reader (or not yet found free), whose memory
    /// cannot be reused yet.
    pub fn retired_snapshots(&self) -> usize {
        self.retired.len()
    }

    /// A new reader.
    pub fn reader(&self) -> LpmReader<K> {
        LpmReader {
            published: self.published.clone(),
        }
    }
}

impl<K: Key> Drop for LpmWriter<K> {
    fn drop(&mut self) {
        self.published.closed.store(true, Ordering::Release);
    }
}

impl<K: Key> LpmReader<K> {
    /// A guard on the published table: all lookups through it see one version. Returns
    /// `None` once the writer is gone.
    pub fn read(&self) -> Option<ReadGuard<K>> {
        if self.published.closed.load(Ordering::Acquire) {
            return None;
        }
        Some(ReadGuard {
            snapshot: self.published.current.load(),
        })
    }

    /// One lookup in the published table (takes and releases a guard).
    pub fn lookup(&self, key: K) -> Option<u32> {
        self.read()?.lookup(key)
    }

    /// A factory to make readers on other threads.
    pub fn factory(&self) -> LpmReaderFactory<K> {
        LpmReaderFactory {
            published: self.published.clone(),
        }
    }
}

impl<K: Key> LpmReaderFactory<K> {
    /// A new reader.
    pub fn reader(&self) -> LpmReader<K> {
        LpmReader {
            published: self.published.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::ReferenceLpm;
    use crate::Structure;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    fn p(s: &str) -> Prefix<u32> {
        s.parse().unwrap()
    }

    #[test]
    fn operations_become_visible_together_on_publish() {
        let (mut w, r) = shared(Table::<u32>::new());
        w.insert(p("10.0.0.0/8"), 1);
        w.insert(p("10.1.0.0/16"), 2);
        assert_eq!(
            r.lookup(0x0A01_0000),
            None,
            "nothing is visible before publish"
        );
        assert!(w.has_pending());
        w.publish();
        assert_eq!(r.lookup(0x0A01_0000), Some(2));
        assert_eq!(w.remove(p("10.1.0.0/16")), Some(2));
        assert_eq!(
            r.lookup(0x0A01_0000),
            Some(2),
            "still the published version"
        );
        w.publish();
        assert_eq!(r.lookup(0x0A01_0000), Some(1));
        assert_eq!(w.published().len(), 1);
    }

    #[test]
    fn replace_swaps_the_whole_table() {
        for (from, to) in [
            (Structure::Trie, Structure::RangeTree),
            (Structure::RangeTree, Structure::Trie),
        ] {
            let (mut w, r) = shared(Table::<u128>::with_structure(from));
            w.insert("2001:db8::/48".parse().unwrap(), 1);
            w.publish();
            let held = r.read().unwrap();
            let t = Table::build_with(to, [("2001:db8::/32".parse().unwrap(), 7)]);
            w.replace(t);
            w.publish();
            assert_eq!(r.lookup(0x2001_0db8 << 96), Some(7));
            assert_eq!(r.read().unwrap().len(), 1);
            assert_eq!(r.read().unwrap().structure(), to);
            assert_eq!(held.lookup(0x2001_0db8 << 96), Some(1), "the old version");
            drop(held);
            w.insert("2001:db8::/64".parse().unwrap(), 2);
            w.publish();
            assert_eq!(
                w.retired_snapshots(),
                0,
                "the old structure's memory let go"
            );
            assert_eq!(r.lookup(0x2001_0db8 << 96), Some(2));
        }
    }

    #[test]
    fn readers_end_when_the_writer_is_dropped() {
        let (mut w, r) = shared(Table::<u32>::new());
        w.insert(p("10.0.0.0/8"), 1);
        w.publish();
        let held = r.read().unwrap();
        let r2 = r.factory().reader();
        drop(w);
        assert!(r.read().is_none());
        assert!(r2.lookup(1).is_none());
        assert_eq!(
            held.lookup(0x0A00_0001),
            Some(1),
            "a held guard stays valid"
        );
    }

    /// Random updates published at random points, while old snapshots are held: every
    /// held snapshot keeps answering exactly as its version did, the table stays sound,
    /// and memory released by updates is reused once its snapshots are dropped.
    fn held_snapshots_keep_their_version<K: Key>(
        structure: Structure,
        seed: u64,
        universe: &[Prefix<K>],
    ) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (mut w, r) = shared(Table::<K>::with_structure(structure));
        let mut reference = ReferenceLpm::new();
        let probes: Vec<K> = (0..if cfg!(miri) { 24 } else { 400 })
            .map(|i| {
                let q = universe[i % universe.len()];
                let host_bits = u32::from(K::BITS - q.len());
                let host = if host_bits == 0 {
                    0
                } else {
                    rng.gen::<u128>() >> (128 - host_bits)
                };
                K::from_u128(q.addr().to_u128() | host)
            })
            .collect();
        let answers = |reference: &ReferenceLpm<K>| -> Vec<Option<u32>> {
            probes
                .iter()
                .map(|&k| reference.lookup(k).map(|x| x.1))
                .collect()
        };
        type Held<K> = (ReadGuard<K>, Vec<Option<u32>>);
        let mut held: Vec<Held<K>> = Vec::new();
        let rounds = if cfg!(miri) { 12 } else { 300 };
        for round in 0..rounds {
            for _ in 0..rng.gen_range(1..40) {
                let q = universe[rng.gen_range(0..universe.len())];
                if rng.gen_bool(0.6) {
                    let v = rng.gen_range(0..1000);
                    assert_eq!(w.insert(q, v), reference.insert(q, v));
                } else {
                    assert_eq!(w.remove(q), reference.remove(&q));
                }
            }
            w.publish();
            if rng.gen_bool(0.3) {
                held.push((r.read().unwrap(), answers(&reference)));
            }
            if !held.is_empty() && rng.gen_bool(0.25) {
                held.remove(rng.gen_range(0..held.len()));
            }
            for (guard, expected) in &held {
                let got: Vec<_> = probes.iter().map(|&k| guard.lookup(k)).collect();
                assert_eq!(&got, expected, "a held snapshot changed (round {round})");
                let mut batch = vec![None; probes.len()];
                guard.lookup_batch(&probes, &mut batch);
                assert_eq!(&batch, expected, "batched, held snapshot (round {round})");
            }
            let now: Vec<_> = probes.iter().map(|&k| r.lookup(k)).collect();
            assert_eq!(now, answers(&reference), "the published version");
            if round % 50 == 0 {
                let retired: Vec<&TableReleased> = w.retired.iter().map(|(_, r)| r).collect();
                w.table.check_structure(&retired);
            }
        }
        drop(held);
        w.publish();
        assert_eq!(
            w.retired_snapshots(),
            0,
            "nothing held: everything reclaimed"
        );
        w.table.check_structure(&[]);
        // With nobody holding snapshots, released blocks are reused one publish later:
        // the arrays stop growing.
        let before = w.table().memory();
        for _ in 0..if cfg!(miri) { 8 } else { 200 } {
            for _ in 0..20 {
                let q = universe[rng.gen_range(0..universe.len())];
                if rng.gen_bool(0.5) {
                    w.insert(q, rng.gen_range(0..1000));
                } else {
                    w.remove(q);
                }
            }
            w.publish();
        }
        let after = w.table().memory();
        assert!(
            after.nodes + after.leaves <= (before.nodes + before.leaves) * 3 / 2 + 2048,
            "released memory is reused: {before:?} then {after:?}"
        );
    }

    /// Readers on two threads check, under each guard, that every answer is the answer of
    /// exactly the version a marker prefix names, while the writer updates and publishes.
    /// Small enough for Miri, which checks the publication for data races.
    #[test]
    fn readers_on_threads_see_whole_versions() {
        for structure in Structure::ALL {
            readers_on_threads_see_whole_versions_of(structure);
        }
    }

    fn readers_on_threads_see_whole_versions_of(structure: Structure) {
        use std::sync::atomic::AtomicBool;
        let rounds = if cfg!(miri) { 12 } else { 400 };
        let universe = universe::<u32>(7, 40);
        let marker = p("255.255.255.255/32");
        let probes: Vec<u32> = universe
            .iter()
            .map(|q| q.addr() | ((!0u32).checked_shr(u32::from(q.len())).unwrap_or(0) / 3))
            .collect();
        // The ops of each round, and the answers after it.
        let mut rng = SmallRng::seed_from_u64(11);
        let mut reference = ReferenceLpm::new();
        let mut plan = Vec::new();
        let answers = |r: &ReferenceLpm<u32>| -> Vec<Option<u32>> {
            probes.iter().map(|&k| r.lookup(k).map(|x| x.1)).collect()
        };
        let mut expected = vec![answers(&reference)];
        for _ in 0..rounds {
            let ops: Vec<(Prefix<u32>, Option<u32>)> = (0..4)
                .map(|_| {
                    let q = universe[rng.gen_range(0..universe.len())];
                    (q, rng.gen_bool(0.6).then(|| rng.gen_range(0..100)))
                })
                .collect();
            for &(q, v) in &ops {
                match v {
                    Some(v) => reference.insert(q, v),
                    None => reference.remove(&q),
                };
            }
            expected.push(answers(&reference));
            plan.push(ops);
        }
        let mut table = Table::with_structure(structure);
        table.insert(marker, 0);
        let (mut w, r) = shared(table);
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    let (r, done, expected, probes) = (r.clone(), &done, &expected, &probes);
                    s.spawn(move || {
                        let (mut last, mut checks) = (0, 0);
                        while !done.load(Ordering::Acquire) || checks < 3 {
                            let guard = r.read().expect("the writer is alive");
                            let version = guard.lookup(0xFFFF_FFFF).expect("marker") as usize;
                            let got: Vec<_> = probes.iter().map(|&k| guard.lookup(k)).collect();
                            assert!(version >= last, "versions never go back");
                            assert_eq!(
                                got, expected[version],
                                "{structure}: answers at version {version}"
                            );
                            last = version;
                            checks += 1;
                        }
                    })
                })
                .collect();
            for (round, ops) in plan.iter().enumerate() {
                for &(q, v) in ops {
                    match v {
                        Some(v) => w.insert(q, v),
                        None => w.remove(q),
                    };
                }
                w.insert(marker, round as u32 + 1);
                w.publish();
            }
            done.store(true, Ordering::Release);
            for h in readers {
                h.join().expect("reader panicked");
            }
        });
    }

    fn universe<K: Key>(seed: u64, n: usize) -> Vec<Prefix<K>> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut out = vec![Prefix::new_clamped(K::default(), 0)];
        while out.len() < n {
            // Clusters under a few roots, so paths share nodes and blocks get copied.
            let base = (rng.gen_range(0..4u128) << (u32::from(K::BITS) - 10))
                | (rng.gen::<u128>() >> 110 << (u32::from(K::BITS) - 30));
            let len = rng.gen_range(1..=K::BITS);
            out.push(Prefix::new_clamped(K::from_u128(base), len));
        }
        out
    }

    #[test]
    fn ipv4_held_snapshots_keep_their_version() {
        for seed in 0..if cfg!(miri) { 1 } else { 4 } {
            for structure in Structure::ALL {
                held_snapshots_keep_their_version::<u32>(structure, seed, &universe(seed, 300));
            }
        }
    }

    #[test]
    fn ipv6_held_snapshots_keep_their_version() {
        for seed in 0..if cfg!(miri) { 1 } else { 4 } {
            for structure in Structure::ALL {
                held_snapshots_keep_their_version::<u128>(structure, seed, &universe(seed, 300));
            }
        }
    }
}
