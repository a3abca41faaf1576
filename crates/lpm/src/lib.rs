//! # fibre-lpm: longest-prefix match for IPv4 and IPv6
//!
//! A [`Table`] maps prefixes of one address family (`Table<u32>` for IPv4,
//! `Table<u128>` for IPv6) to values and finds the longest prefix containing an address,
//! one at a time or in batches whose memory reads overlap. A full Internet table takes a
//! few MiB and a lookup a few nanoseconds.
//!
//! Behind the one type are two lookup structures ([`Structure`]), each written once for
//! both families: a compressed multibit trie (Poptrie's layout), and a B+-tree of address
//! ranges searched with vector compares. And the code lookups spend their time in is
//! compiled in three [`Form`]s (AVX-512, AVX2, portable), so one build runs on every
//! x86-64 CPU. A table takes, when it is made, the fastest form this CPU runs and the
//! structure measured faster for its family with it; both can be forced.
//!
//! - [`shared`]: lock-free readers and one writer, versions published atomically.
//! - [`ReferenceLpm`]: the simple oracle the structures are tested against.
//!
//! No I/O happens here; route files and measurement live in `fibre-bench`.
//!
//! ```
//! use fibre_lpm::{shared, Table};
//! use std::net::Ipv6Addr;
//!
//! // An IPv6 table, built in bulk, then shared with readers.
//! let table = Table::<u128>::build([("2001:db8::/32".parse().unwrap(), 7)]);
//! let (mut writer, reader) = shared(table);
//! writer.insert("2001:db8:1::/48".parse().unwrap(), 8);
//! let addr: Ipv6Addr = "2001:db8:1::1".parse().unwrap();
//! assert_eq!(reader.lookup(addr.into()), Some(7), "not published yet");
//! writer.publish();
//! // A guard holds one version for a burst of lookups.
//! let guard = reader.read().expect("the writer is alive");
//! let mut out = [None; 2];
//! guard.lookup_batch(&[addr.into(), 0], &mut out);
//! assert_eq!(out, [Some(8), None]);
//! ```

mod form;
mod key;
mod memory;
mod prefix;
mod ranges;
mod reference;
mod shared;
mod table;
#[cfg(test)]
mod testing;
mod trie;

pub use form::{Form, UnsupportedForm, FORM_CAP_VARIABLE};
pub use key::Key;
pub use prefix::{quote, Ipv4Prefix, Ipv6Prefix, Prefix, PrefixError, QUOTE_CHARS};
pub use reference::ReferenceLpm;
pub use shared::{shared, LpmReader, LpmReaderFactory, LpmWriter, Op, ReadGuard};
pub use table::{Lookups, Structure, Table, TableSnapshot};

/// The README's examples, compiled and run as tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;

/// An IPv4 table.
pub type Ipv4Table = Table<u32>;
/// An IPv6 table.
pub type Ipv6Table = Table<u128>;

/// The largest value a prefix can map to: `2^31 - 2`. (The trie stores values plus one,
/// 0 meaning no route, and marks references to nodes with the top bit; the range tree
/// marks references to second-stage trees with it and keeps `2^31 - 1` for no route.)
pub const MAX_VALUE: u32 = (1 << 31) - 2;

/// Keys a batched lookup walks together: [`Table::lookup_batch`] is fastest on batches of
/// this size or more.
pub const BATCH: usize = 64;

/// Bytes used by a table, by purpose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Bytes that lookups read (free blocks included).
    pub lookup_bytes: usize,
    /// Bytes only updates use: the prefixes themselves, free lists, copy-on-write
    /// bookkeeping.
    pub update_bytes: usize,
    /// Nodes in the node array (free ones included): the trie's 24-byte nodes, or the
    /// range tree's 128-byte ones.
    pub nodes: usize,
    /// Leaves in the leaf array (free ones included): the trie's 4-byte leaves, or the
    /// range tree's 64-byte ones.
    pub leaves: usize,
    /// Nodes and leaves sitting in free blocks.
    pub free_slots: usize,
}
