//! # fibre-lpm: longest-prefix match for IPv4 and IPv6
//!
//! Two engines, each written once and generic over the key width, serve both families:
//!
//! - [`Lpm`], a compressed multibit trie in the manner of Poptrie (a direct-pointing first
//!   level, then 64-way nodes whose children and leaves are packed and found by
//!   popcount); [`trie`](crate::Lpm) explains the layout.
//! - [`RangeLpm`], a B+-tree of address ranges searched with AVX-512 compares, every
//!   lookup the same number of steps, so batches walk in lockstep.
//!
//! Each family uses the engine measured faster for it on full Internet tables
//! ([`Table`]): the trie for IPv4, the range tree for IPv6. Both offer the same
//! operations ([`Engine`]): insert, replace, remove, exact get, scalar and batched
//! lookups, iteration, counts per length, memory accounting, bulk build.
//!
//! - [`mod@shared`]: lock-free readers and one writer, versions published atomically, for
//!   either engine.
//! - [`ReferenceLpm`]: the simple oracle both engines are tested against.
//!
//! No I/O happens here; route files and measurement live in `fibre-bench`.
//!
//! ```
//! use fibre_lpm::{shared, Engine, Lookups, Table};
//! use std::net::Ipv6Addr;
//!
//! // The IPv6 engine, built in bulk, then shared with readers.
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

mod engine;
mod key;
mod prefix;
mod ranges;
mod reference;
pub mod shared;
#[cfg(test)]
mod testing;
mod trie;

pub use engine::{Engine, Lookups, Table, TableSnapshot};
pub use key::Key;
pub use prefix::{Ipv4Prefix, Ipv6Prefix, Prefix, PrefixError};
pub use ranges::{RangeLpm, RangeSnapshot, RANGE_BATCH};
pub use reference::ReferenceLpm;
pub use shared::{shared, LpmReader, LpmReaderFactory, LpmWriter, Op, ReadGuard};
pub use trie::{Lpm, MemoryUsage, Snapshot, BATCH_GROUP, MAX_VALUE};

/// An IPv4 table, with the IPv4 engine (the trie).
pub type Ipv4Lpm = Table<u32>;
/// An IPv6 table, with the IPv6 engine (the range tree).
pub type Ipv6Lpm = Table<u128>;
