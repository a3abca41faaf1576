//! Lock-free readers: any number of threads look up while one writer updates.
//!
//! Read-copy-update on one copy of the table, for either engine ([`crate::Engine`]). The
//! writer applies each operation to its table at once, and the table copies, rather than
//! writes, whatever the published snapshot ([`crate::Snapshot`], [`crate::RangeSnapshot`])
//! can reach (each engine's documentation says how: the path from the root to the
//! change, each block at most once per publish). [`LpmWriter::publish`]
//! makes the current state a new snapshot and swaps it in with one atomic pointer store.
//! So:
//!
//! - a reader never waits, never takes a lock and never sees a half-applied change: a
//!   read guard holds one published snapshot, whole, for as long as it lives;
//! - operations applied between two publishes become visible together;
//! - readers and the writer share every part of the table that did not change, so the
//!   readers' caches stay warm while routes change, and the table exists once in memory;
//! - memory is reused only when no reader can reach it: the blocks an update replaced
//!   are kept, with the snapshot they belong to, until no guard holds that snapshot or
//!   any older one; the writer checks at each publish and never waits for readers.
//!
//! A guard costs a few atomic operations (the snapshot pointer is read through
//! `arc-swap`), so a thread that looks up many keys should take one guard for a batch of
//! them, the way a kernel takes `rcu_read_lock` once around a burst of packets.

use crate::engine::{Engine, Lookups, Table};
use crate::key::Key;
use crate::prefix::Prefix;
use arc_swap::{ArcSwap, Guard};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// An update to a shared table.
#[derive(Clone, Debug)]
pub enum Op<K: Key, E: Engine<K> = Table<K>> {
    /// Set a prefix's value.
    Insert(Prefix<K>, u32),
    /// Remove a prefix.
    Remove(Prefix<K>),
    /// Replace the whole table (for example with one built in bulk).
    Replace(Box<E>),
}

/// What the writer and the readers share.
struct Published<K: Key, E: Engine<K>> {
    current: ArcSwap<E::Snapshot>,
    /// Set when the writer is dropped: no new guards after that.
    closed: AtomicBool,
}

/// The single writer of a shared table.
pub struct LpmWriter<K: Key, E: Engine<K> = Table<K>> {
    table: E,
    published: Arc<Published<K, E>>,
    /// Snapshots replaced by a publish, oldest first, each with the blocks released while
    /// its successor was built (blocks it, or an older snapshot, may still reach).
    retired: VecDeque<(Arc<E::Snapshot>, E::Released)>,
    changed: bool,
}

/// A reader of a shared table. It is cheap to clone; each thread may have its own.
#[derive(Clone)]
pub struct LpmReader<K: Key, E: Engine<K> = Table<K>> {
    published: Arc<Published<K, E>>,
}

/// Makes readers from any thread (`Send + Sync`).
#[derive(Clone)]
pub struct LpmReaderFactory<K: Key, E: Engine<K> = Table<K>> {
    published: Arc<Published<K, E>>,
}

/// A published snapshot held by a reader: all lookups through it see one version.
pub struct ReadGuard<K: Key, E: Engine<K> = Table<K>> {
    snapshot: Guard<Arc<E::Snapshot>>,
}

impl<K: Key, E: Engine<K>> std::ops::Deref for ReadGuard<K, E> {
    type Target = E::Snapshot;
    fn deref(&self) -> &E::Snapshot {
        &self.snapshot
    }
}

/// A shared table starting with `table` (published at once): its writer and a first reader.
pub fn shared<K: Key, E: Engine<K>>(mut table: E) -> (LpmWriter<K, E>, LpmReader<K, E>) {
    let (snapshot, released) = table.publish();
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

impl<K: Key, E: Engine<K>> LpmWriter<K, E> {
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

    /// Replaces the whole table (visible after [`LpmWriter::publish`]).
    pub fn replace(&mut self, table: E) {
        self.changed = true;
        self.table = table;
    }

    /// Applies any operation.
    pub fn apply(&mut self, op: Op<K, E>) {
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
            let old = self.published.current.swap(Arc::new(snapshot));
            self.retired.push_back((old, released));
        }
        // A snapshot no guard holds (only this queue does), and no older one held either:
        // nothing can reach the blocks released while its successor was built.
        while self
            .retired
            .front()
            .is_some_and(|(s, _)| Arc::strong_count(s) == 1)
        {
            let (_, released) = self.retired.pop_front().expect("checked above");
            self.table.reclaim(released);
        }
    }

    /// True if operations were applied and not yet published.
    pub fn has_pending(&self) -> bool {
        self.changed
    }

    /// The writer's table: every operation applied so far, published or not.
    pub fn table(&self) -> &E {
        &self.table
    }

    /// The published table, as readers see it.
    pub fn published(&self) -> ReadGuard<K, E> {
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
    pub fn reader(&self) -> LpmReader<K, E> {
        LpmReader {
            published: self.published.clone(),
        }
    }
}

impl<K: Key, E: Engine<K>> Drop for LpmWriter<K, E> {
    fn drop(&mut self) {
        self.published.closed.store(true, Ordering::Release);
    }
}

impl<K: Key, E: Engine<K>> LpmReader<K, E> {
    /// A guard on the published table: all lookups through it see one version. Returns
    /// `None` once the writer is gone.
    pub fn read(&self) -> Option<ReadGuard<K, E>> {
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
    pub fn factory(&self) -> LpmReaderFactory<K, E> {
        LpmReaderFactory {
            published: self.published.clone(),
        }
    }
}

impl<K: Key, E: Engine<K>> LpmReaderFactory<K, E> {
    /// A new reader.
    pub fn reader(&self) -> LpmReader<K, E> {
        LpmReader {
            published: self.published.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::ReferenceLpm;
    use crate::{Lpm, RangeLpm};

    /// What the tests check of an engine's structure.
    trait Checked<K: Key>: Engine<K> {
        /// Checks the structure, with `retired` (leaves or slots, nodes or pages) still
        /// waiting for readers.
        fn check(&self, retired: (usize, usize));
        /// What one publish released, counted as `check` counts it.
        fn counted(&self, released: &Self::Released) -> (usize, usize);
    }

    impl<K: Key> Checked<K> for Lpm<K> {
        fn check(&self, retired: (usize, usize)) {
            self.check_invariants_with(retired)
        }
        fn counted(&self, released: &Self::Released) -> (usize, usize) {
            self.slots_of(released)
        }
    }

    impl<K: Key> Checked<K> for RangeLpm<K> {
        fn check(&self, retired: (usize, usize)) {
            self.check_invariants_with(retired)
        }
        fn counted(&self, released: &Self::Released) -> (usize, usize) {
            self.lines_of(released)
        }
    }
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    fn p(s: &str) -> Prefix<u32> {
        s.parse().unwrap()
    }

    #[test]
    fn operations_become_visible_together_on_publish() {
        let (mut w, r) = shared(Lpm::<u32>::new());
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
        let (mut w, r) = shared(Lpm::<u128>::new());
        let t = Lpm::build([("2001:db8::/32".parse().unwrap(), 7)]);
        w.replace(t);
        w.publish();
        assert_eq!(r.lookup(0x2001_0db8 << 96), Some(7));
        assert_eq!(r.read().unwrap().len(), 1);
    }

    #[test]
    fn readers_end_when_the_writer_is_dropped() {
        let (mut w, r) = shared(Lpm::<u32>::new());
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
    fn held_snapshots_keep_their_version<K: Key, E: Checked<K>>(seed: u64, universe: &[Prefix<K>]) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (mut w, r) = shared::<K, E>(E::default());
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
        type Held<K, E> = (ReadGuard<K, E>, Vec<Option<u32>>);
        let mut held: Vec<Held<K, E>> = Vec::new();
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
                let retired = w
                    .retired
                    .iter()
                    .map(|(_, r)| w.table.counted(r))
                    .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
                w.table.check(retired);
            }
        }
        drop(held);
        w.publish();
        assert_eq!(
            w.retired_snapshots(),
            0,
            "nothing held: everything reclaimed"
        );
        w.table.check((0, 0));
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
        let mut table = Lpm::new();
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
                            assert_eq!(got, expected[version], "answers at version {version}");
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
            held_snapshots_keep_their_version::<u32, Lpm<u32>>(seed, &universe(seed, 300));
            held_snapshots_keep_their_version::<u32, RangeLpm<u32>>(seed, &universe(seed, 300));
        }
    }

    #[test]
    fn ipv6_held_snapshots_keep_their_version() {
        for seed in 0..if cfg!(miri) { 1 } else { 4 } {
            held_snapshots_keep_their_version::<u128, Lpm<u128>>(seed, &universe(seed, 300));
            held_snapshots_keep_their_version::<u128, RangeLpm<u128>>(seed, &universe(seed, 300));
        }
    }
}
