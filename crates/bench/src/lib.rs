//! # fibre-bench: what fibre measures with, and what it reads routes from
//!
//! - [`source`]: route files (prefix lists, update streams, gzip) with precise errors.
//! - [`addresses`]: matched and uniform address generators.
//! - [`method`]: the measurement method (threads, repetitions, trimmed mean, dry run).
//! - [`lookups`]: the `fibre bench lookup` measurements of the engine.

pub mod addresses;
pub mod kernel;
pub mod lookups;
pub mod method;
pub mod peers;
pub mod report;
pub mod source;
pub mod studies;
