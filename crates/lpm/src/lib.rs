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
