//! # fibre-lpm: longest-prefix match for IPv4 and IPv6
//!
//! One engine, generic over the key width, serves both families: [`Lpm<u32>`] for IPv4
//! and [`Lpm<u128>`] for IPv6 run the same code. It is a compressed multibit trie in the
//! manner of Poptrie (a direct-pointing first level, then 64-way nodes whose children and
//! leaves are packed and found by popcount); [`trie`](crate::Lpm) explains the layout.
//!
//! - [`Lpm`]: insert, replace, remove, exact [`Lpm::get`], [`Lpm::lookup`],
//!   [`Lpm::lookup_batch`], iteration, counts per length, [`Lpm::memory`], bulk [`Lpm::build`].
//! - [`mod@shared`]: lock-free readers and one writer, versions published atomically.
//! - [`ReferenceLpm`]: the simple oracle the engine is tested against.
//!
//! No I/O happens here; route files and measurement live in `fibre-bench`.

mod engine;
mod key;
mod prefix;
mod ranges;
mod reference;
pub mod shared;
mod trie;

pub use engine::{Engine, Lookups, Table, TableSnapshot};
pub use key::Key;
pub use prefix::{Ipv4Prefix, Ipv6Prefix, Prefix, PrefixError};
pub use ranges::{RangeLpm, RangeSnapshot, RANGE_BATCH};
pub use reference::ReferenceLpm;
pub use shared::{shared, LpmReader, LpmReaderFactory, LpmWriter, Op, ReadGuard};
pub use trie::{Lpm, MemoryUsage, Snapshot, BATCH_GROUP, MAX_VALUE};

/// An IPv4 table.
pub type Ipv4Lpm = Lpm<u32>;
/// An IPv6 table.
pub type Ipv6Lpm = Lpm<u128>;
