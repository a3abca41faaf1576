//! # fibre-bench: what fibre measures with, and what it reads routes from
//!
//! - [`source`]: route files (prefix lists, update streams, gzip) with precise errors.
//! - [`addresses`]: matched and uniform address generators.
//! - [`method`]: the seeds' kbench method (repetitions, trimmed mean, dry run, threads).
//! - [`lookups`]: the `fibre bench lookup` measurements of the engine.

#![forbid(unsafe_code)]

pub mod addresses;
pub mod kernel;
pub mod lookups;
pub mod method;
pub mod peers;
pub mod report;
pub mod source;
pub mod studies;
