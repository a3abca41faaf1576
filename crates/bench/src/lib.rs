//! # fibre-bench: the studies of `fibre bench`
//!
//! The route files they read are `fibre-routefile`'s.
//!
//! - [`addresses`]: matched and uniform address generators.
//! - [`method`]: the measurement method (repetitions, trimmed mean, dry run, threads).
//! - [`lookups`]: the `fibre bench lookup` measurements of fibre's tables.
//! - [`kernel`]: the same routes and lookups in the Linux kernel of a private namespace.
//! - [`peers`]: other longest-prefix-match libraries measured beside fibre.
//! - [`studies`]: the studies of `fibre bench`, and [`report`]: their report and plots.
//! - [`pipeline`]: `fibre bench pipeline`, what the packet path costs a packet, stage by
//!   stage, in memory on the full tables; [`veth`]: the kernel's forwarding and fibre's
//!   on the same veth topology, their loss-free rates, beside [`floor`]: the cheapest way
//!   a frame can cross that router.
//! - [`rules`]: `fibre bench rules`, what policy rules and source-specific routes cost
//!   fibre's full route lookup and the kernel's.

#![forbid(unsafe_code)]

pub mod addresses;
pub mod attribution;
pub mod floor;
pub mod kernel;
pub mod lookups;
pub mod method;
pub mod mirror;
pub mod peers;
pub mod pipeline;
pub mod report;
pub mod rules;
pub mod studies;
pub mod veth;
