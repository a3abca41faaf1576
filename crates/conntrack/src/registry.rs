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
//! It holds 64-bit hashes of the tuples, not the tuples: two tuples whose hashes are
//! equal (one pair in 2^64) are taken for one, which can only move a port choice. A
//! connection no NAT changed holds its original tuple and its inverse, and is held
//! under one hash that stands for both (a symmetric hash, exact: a tuple's and its
//! inverse's alike, no other's; some 9 bytes of the table at a million); a translated
//! one under each tuple's own, and 40 bytes more if its source is translated.

use crate::connection::Connection;
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
    /// The hashes the connections are held under (a multiset).
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

    /// Whether a connection holds `t`: a translated one under `t`'s own hash, or one
    /// no NAT changed under the hash that stands for `t` and its inverse.
    pub fn taken(&self, t: &Tuple) -> bool {
        let words = t.words();
        [self.hash.of_words(&words), self.hash.symmetric(&words)]
            .into_iter()
            .any(|h| self.tuples.find(h, |&e| e == h).is_some())
    }

    /// The hashes `c` is held under (see the module's comment): the first `n`.
    fn hashes(&self, c: &Connection) -> ([u64; 2], usize) {
        if c.untranslated() {
            ([self.hash.symmetric(&c.tuples[0].words()), 0], 1)
        } else {
            (c.tuples.map(|t| self.hash.of(&t)), 2)
        }
    }

    /// Hashes held: one for each connection no NAT changed, two for each translated.
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
        let (hashes, n) = self.hashes(c);
        for &h in &hashes[..n] {
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
        let (hashes, n) = self.hashes(c);
        for &h in &hashes[..n] {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuple::{ICMPV6, UDP};
    use crate::{Kept, Protocol};

    fn connection(original: Tuple, reply: Tuple) -> Connection {
        Connection {
            tuples: [original, reply],
            status: 0,
            mark: 0,
            expires: Default::default(),
            protocol: Protocol::Generic,
            masquerade: 0,
            kept: Kept::default(),
        }
    }

    fn tuple(src: u8, src_port: u16, dst: u8, dst_port: u16, protocol: u8) -> Tuple {
        Tuple {
            src: [src; 16],
            dst: [dst; 16],
            src_port,
            dst_port,
            protocol,
            v6: true,
        }
    }

    /// A connection no NAT changed is held once, and takes its two tuples and no
    /// other (not its ports crossed, not an ICMP answer going its query's way); a
    /// translated one takes its two tuples (not its original's inverse); each leaves
    /// as it came.
    #[test]
    fn each_connection_takes_its_tuples_and_no_other() {
        let mut r = Registry::default();
        let plain = tuple(1, 1000, 2, 53, UDP);
        let echo = tuple(1, 7, 2, u16::from_be_bytes([128, 0]), ICMPV6);
        for t in [plain, echo] {
            r.enter(&connection(t, t.inverted().unwrap()), false);
        }
        assert_eq!(r.len(), 2, "one hash each");
        let translated = tuple(3, 4000, 2, 53, UDP);
        let reply = tuple(2, 53, 9, 5000, UDP);
        r.enter(&connection(translated, reply), true);
        assert_eq!((r.len(), r.sources()), (4, 1));
        for t in [plain, echo, translated, reply] {
            assert!(r.taken(&t), "{t:?}");
            assert!(t == translated || t == reply || r.taken(&t.inverted().unwrap()));
        }
        let crossed = tuple(1, 53, 2, 1000, UDP);
        let answer_same_way = tuple(1, 7, 2, u16::from_be_bytes([129, 0]), ICMPV6);
        for t in [crossed, answer_same_way, translated.inverted().unwrap()] {
            assert!(!r.taken(&t), "{t:?}");
        }
        assert_eq!(r.mapped_from(&translated), vec![([9; 16], 5000)]);
        r.leave(&connection(plain, plain.inverted().unwrap()), false);
        r.leave(&connection(translated, reply), true);
        assert!(!r.taken(&plain) && !r.taken(&reply) && r.taken(&echo));
        assert_eq!((r.len(), r.sources()), (1, 0));
    }
}
