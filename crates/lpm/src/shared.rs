//! Lock-free readers: any number of threads look up while one writer updates.
//!
//! The table is kept twice (left-right concurrency). Readers always read the copy that is
//! published; the writer applies its operations to the other copy, publishes it with one
//! atomic pointer swap, waits until no reader is still inside the old copy, then replays
//! the same operations there. So:
//!
//! - a reader never waits, never takes a lock and never sees a half-applied change: every
//!   read guard shows one published version, whole;
//! - operations queued between two [`LpmWriter::publish`] calls become visible together;
//! - memory is never freed under a reader: the retired copy is reused only after every
//!   reader has left it.
//!
//! The price is two copies of the table and each update applied twice. Readers announce
//! themselves once per [`LpmReader::read`] guard (an atomic increment on a cache line of
//! their own), so a thread that looks up many keys should take one guard for a batch of
//! them, the way a kernel takes `rcu_read_lock` once around a burst of packets.

use crate::key::Key;
use crate::prefix::Prefix;
use crate::trie::Lpm;
use left_right::{Absorb, ReadGuard, ReadHandle, ReadHandleFactory, WriteHandle};
use std::sync::Arc;

/// An update to a shared table.
#[derive(Clone, Debug)]
pub enum Op<K: Key> {
    /// Set a prefix's value.
    Insert(Prefix<K>, u32),
    /// Remove a prefix.
    Remove(Prefix<K>),
    /// Replace the whole table (for example with one built in bulk).
    Replace(Arc<Lpm<K>>),
}

impl<K: Key> Absorb<Op<K>> for Lpm<K> {
    fn absorb_first(&mut self, op: &mut Op<K>, _other: &Self) {
        match op {
            Op::Insert(p, v) => {
                self.insert(*p, *v);
            }
            Op::Remove(p) => {
                self.remove(p);
            }
            Op::Replace(t) => *self = Lpm::clone(t),
        }
    }

    fn sync_with(&mut self, first: &Self) {
        *self = first.clone();
    }
}

/// The single writer of a shared table.
pub struct LpmWriter<K: Key> {
    handle: WriteHandle<Lpm<K>, Op<K>>,
}

/// A reader of a shared table; clone it (or use [`LpmReaderFactory`]) for each thread.
pub struct LpmReader<K: Key> {
    handle: ReadHandle<Lpm<K>>,
}

/// Makes readers from any thread (`Send + Sync`).
#[derive(Clone)]
pub struct LpmReaderFactory<K: Key> {
    factory: ReadHandleFactory<Lpm<K>>,
}

/// A shared table starting with `table`: its writer and a first reader.
pub fn shared<K: Key>(table: Lpm<K>) -> (LpmWriter<K>, LpmReader<K>) {
    let (mut w, r) = left_right::new_from_empty::<Lpm<K>, Op<K>>(table);
    w.publish();
    (LpmWriter { handle: w }, LpmReader { handle: r })
}

impl<K: Key> LpmWriter<K> {
    /// Queues setting `prefix` to `value` (visible after [`LpmWriter::publish`]).
    pub fn insert(&mut self, prefix: Prefix<K>, value: u32) {
        assert!(value <= crate::MAX_VALUE, "value {value} exceeds MAX_VALUE");
        self.handle.append(Op::Insert(prefix, value));
    }

    /// Queues removing `prefix`.
    pub fn remove(&mut self, prefix: Prefix<K>) {
        self.handle.append(Op::Remove(prefix));
    }

    /// Queues replacing the whole table.
    pub fn replace(&mut self, table: Lpm<K>) {
        self.handle.append(Op::Replace(Arc::new(table)));
    }

    /// Queues any operation.
    pub fn apply(&mut self, op: Op<K>) {
        if let Op::Insert(_, v) = op {
            assert!(v <= crate::MAX_VALUE, "value {v} exceeds MAX_VALUE");
        }
        self.handle.append(op);
    }

    /// Makes every queued operation visible to readers at once. Waits for readers still
    /// inside the copy published before the last one (never for new readers).
    pub fn publish(&mut self) {
        self.handle.publish();
    }

    /// True if operations are queued and not yet published.
    pub fn has_pending(&self) -> bool {
        self.handle.has_pending_operations()
    }

    /// The published table, as readers see it.
    pub fn published(&self) -> ReadGuard<'_, Lpm<K>> {
        self.handle
            .enter()
            .expect("the writer is alive while it is borrowed")
    }

    /// A new reader.
    pub fn reader(&self) -> LpmReader<K> {
        LpmReader {
            handle: self.handle.clone(),
        }
    }
}

impl<K: Key> LpmReader<K> {
    /// A guard on the published table: all lookups through it see one version. Returns
    /// `None` once the writer is gone.
    pub fn read(&self) -> Option<ReadGuard<'_, Lpm<K>>> {
        self.handle.enter()
    }

    /// One lookup in the published table (takes and releases a guard).
    pub fn lookup(&self, key: K) -> Option<u32> {
        self.read()?.lookup(key)
    }

    /// A factory to make readers on other threads.
    pub fn factory(&self) -> LpmReaderFactory<K> {
        LpmReaderFactory {
            factory: self.handle.factory(),
        }
    }
}

impl<K: Key> Clone for LpmReader<K> {
    fn clone(&self) -> Self {
        LpmReader {
            handle: self.handle.clone(),
        }
    }
}

impl<K: Key> LpmReaderFactory<K> {
    /// A new reader.
    pub fn reader(&self) -> LpmReader<K> {
        LpmReader {
            handle: self.factory.handle(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Prefix<u32> {
        s.parse().unwrap()
    }

    #[test]
    fn queued_operations_become_visible_together_on_publish() {
        let (mut w, r) = shared(Lpm::<u32>::new());
        w.insert(p("10.0.0.0/8"), 1);
        w.insert(p("10.1.0.0/16"), 2);
        assert_eq!(
            r.lookup(0x0A01_0000),
            None,
            "nothing is visible before publish"
        );
        w.publish();
        assert_eq!(r.lookup(0x0A01_0000), Some(2));
        w.remove(p("10.1.0.0/16"));
        w.publish();
        assert_eq!(r.lookup(0x0A01_0000), Some(1));
        // Both copies converge: a second publish replays onto the other copy.
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
        w.publish();
        assert_eq!(r.read().unwrap().len(), 1);
    }

    #[test]
    fn readers_end_when_the_writer_is_dropped() {
        let (w, r) = shared(Lpm::<u32>::new());
        let r2 = r.factory().reader();
        drop(w);
        assert!(r.read().is_none());
        assert!(r2.lookup(1).is_none());
    }
}
