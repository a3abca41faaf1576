//! What NAT asks of every worker's connections, held once for all of them: which
//! tuples are held (`nf_nat_used_tuple`, and the clash a connection meets as it is
//! entered), and the sources already mapped (`nf_nat_bysource`).
//!
//! With a table for each worker ([`crate::owners`]), a binding chosen by one worker
//! must not take a tuple another's connection holds, as the kernel's one table would
//! refuse it. So the connections of the families NAT translates (every one of them,
//! translated or not, and a translated connection of any family) enter the registry
//! too, as they enter their table, and leave it with their table. It is taken (a lock)
//! when a connection of those families is made, bound or ended: never for a packet of
//! a connection entered.
//!
//! It holds 64-bit hashes of the tuples, not the tuples (a connection costs it some 20
//! bytes, and 40 more if its source is translated): two tuples whose hashes are equal
//! (one pair in 2^64) are taken for one, which can only move a port choice.

use crate::table::Connection;
use crate::tuple::{Tuple, TupleHash};
use hashbrown::HashTable;

/// What `c`'s source is mapped to: its reply tuple's inverse's source (address, and
/// port or ICMP identifier).
fn mapped_to(c: &Connection) -> Option<([u8; 16], u16)> {
    let r = c.tuples[1].inverted()?;
    Some((r.src, r.src_port))
}

/// A source already mapped: its hash, when it was mapped, what it was mapped to.
#[derive(Clone, Copy, Debug)]
struct Mapped {
    source: u64,
    order: u32,
    address: [u8; 16],
    port: u16,
}

/// The registry of one namespace's connections (see the module's comment).
pub struct Registry {
    hash: TupleHash,
    /// The hashes of the tuples held (a multiset: one entry a tuple).
    tuples: HashTable<u64>,
    /// The mapped sources of the connections whose source is translated.
    by_source: HashTable<Mapped>,
    /// The order of the next mapped source.
    entered: u32,
}

impl Default for Registry {
    fn default() -> Registry {
        Registry {
            hash: TupleHash::new(),
            tuples: HashTable::new(),
            by_source: HashTable::new(),
            entered: 0,
        }
    }
}

impl Registry {
    /// The bytes its tables hold (their allocations, whether used or not).
    pub fn memory(&self) -> usize {
        self.tuples.allocation_size() + self.by_source.allocation_size()
    }

    /// Whether a connection holds `t`.
    pub fn taken(&self, t: &Tuple) -> bool {
        let h = self.hash.of(t);
        self.tuples.find(h, |&e| e == h).is_some()
    }

    /// Tuples held.
    pub fn len(&self) -> usize {
        self.tuples.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.tuples.is_empty()
    }

    /// Mapped sources held.
    pub fn sources(&self) -> usize {
        self.by_source.len()
    }

    fn source_hash(&self, t: &Tuple) -> u64 {
        let mut source = *t;
        source.dst = [0; 16];
        source.dst_port = 0;
        self.hash.of(&source)
    }

    /// Enters `c`'s tuples, and its mapped source if `source_translated`.
    pub(crate) fn enter(&mut self, c: &Connection, source_translated: bool) {
        for t in &c.tuples {
            let h = self.hash.of(t);
            self.tuples.insert_unique(h, h, |&e| e);
        }
        if let Some(to) = source_translated.then(|| mapped_to(c)).flatten() {
            self.entered = self.entered.wrapping_add(1);
            let mapped = Mapped {
                source: self.source_hash(&c.tuples[0]),
                order: self.entered,
                address: to.0,
                port: to.1,
            };
            self.by_source
                .insert_unique(mapped.source, mapped, |m| m.source);
        }
    }

    /// Enters `c` as [`Registry::enter`] does, unless another connection holds either
    /// of its tuples (then false, nothing entered): one look and one entry, so that two
    /// workers cannot both find a tuple free and both take it.
    pub(crate) fn enter_unless_taken(&mut self, c: &Connection, source_translated: bool) -> bool {
        if c.tuples.iter().any(|t| self.taken(t)) {
            return false;
        }
        self.enter(c, source_translated);
        true
    }

    /// Takes `c`'s tuples (and its mapped source) out again.
    pub(crate) fn leave(&mut self, c: &Connection, source_translated: bool) {
        for t in &c.tuples {
            let h = self.hash.of(t);
            if let Ok(e) = self.tuples.find_entry(h, |&e| e == h) {
                e.remove();
            }
        }
        if let Some((address, port)) = source_translated.then(|| mapped_to(c)).flatten() {
            let source = self.source_hash(&c.tuples[0]);
            if let Ok(e) = self.by_source.find_entry(source, |m| {
                m.source == source && m.address == address && m.port == port
            }) {
                e.remove();
            }
        }
    }

    /// What the connections from `original`'s source (address, port, protocol) had it
    /// mapped to, the newest first: address and port.
    pub(crate) fn mapped_from(&self, original: &Tuple) -> Vec<([u8; 16], u16)> {
        let source = self.source_hash(original);
        let mut found: Vec<&Mapped> = self
            .by_source
            .iter_hash(source)
            .filter(|m| m.source == source)
            .collect();
        found.sort_unstable_by_key(|m| std::cmp::Reverse(m.order));
        found.iter().map(|m| (m.address, m.port)).collect()
    }
}
