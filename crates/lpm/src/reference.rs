//! The reference: a longest-prefix match too simple to be wrong.
//!
//! One hash map from prefix to value; a lookup tries every prefix length that holds at
//! least one route, longest first. It is slow and obviously correct, and the fast structures
//! is tested and fuzzed against it.

use crate::key::Key;
use crate::prefix::Prefix;
use std::collections::HashMap;

/// A slow, obviously correct prefix map used as the oracle in tests and fuzzing.
#[derive(Clone, Debug, Default)]
pub struct ReferenceLpm<K: Key> {
    routes: HashMap<Prefix<K>, u32>,
    per_len: Vec<usize>,
}

impl<K: Key> ReferenceLpm<K> {
    /// An empty map.
    pub fn new() -> Self {
        ReferenceLpm {
            routes: HashMap::new(),
            per_len: vec![0; usize::from(K::BITS) + 1],
        }
    }

    /// Sets the value of `prefix`, returning the previous one.
    pub fn insert(&mut self, prefix: Prefix<K>, value: u32) -> Option<u32> {
        let old = self.routes.insert(prefix, value);
        if old.is_none() {
            self.per_len[usize::from(prefix.len())] += 1;
        }
        old
    }

    /// Removes `prefix`, returning its value.
    pub fn remove(&mut self, prefix: &Prefix<K>) -> Option<u32> {
        let old = self.routes.remove(prefix);
        if old.is_some() {
            self.per_len[usize::from(prefix.len())] -= 1;
        }
        old
    }

    /// The value of exactly `prefix`.
    pub fn get(&self, prefix: &Prefix<K>) -> Option<u32> {
        self.routes.get(prefix).copied()
    }

    /// The longest prefix containing `key`, and its value.
    pub fn lookup(&self, key: K) -> Option<(Prefix<K>, u32)> {
        (0..=K::BITS)
            .rev()
            .filter(|&len| self.per_len[usize::from(len)] > 0)
            .find_map(|len| {
                let p = Prefix::new_clamped(key, len);
                self.routes.get(&p).map(|&v| (p, v))
            })
    }

    /// Number of prefixes.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// True if there are no prefixes.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// All prefixes and values, sorted by address then length.
    pub fn to_sorted_vec(&self) -> Vec<(Prefix<K>, u32)> {
        let mut v: Vec<_> = self.routes.iter().map(|(p, v)| (*p, *v)).collect();
        v.sort_unstable();
        v
    }

    /// Number of prefixes of each length, indexed by length.
    pub fn count_by_len(&self) -> &[usize] {
        &self.per_len
    }
}
