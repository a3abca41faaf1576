//! # fibre-bench: the studies of `fibre bench`
//!
//! The route files they read are `fibre-routefile`'s.
//!
//! - [`addresses`]: matched and uniform address generators.
//! - `method`: the measurement method (repetitions, trimmed mean, dry run, threads).
//! - [`lookups`]: the `fibre bench lookup` measurements of fibre's tables.
//! - `kernel`: the same routes and lookups in the Linux kernel of a private namespace.
//! - `peers`: other longest-prefix-match libraries measured beside fibre; `dpdk`: DPDK's
//!   FIBs, where the build found DPDK.
//! - [`studies`]: the studies of `fibre bench`, and [`report`]: their report and plots.
//! - [`pipeline`]: `fibre bench pipeline`, what the packet path costs a packet, stage by
//!   stage, in memory on the full tables; [`veth`]: the kernel's forwarding and fibre's
//!   on the same veth topology, their loss-free rates, beside [`floor`]: the cheapest way
//!   a frame can cross that router.
//! - [`rules`]: `fibre bench rules`, what policy rules and source-specific routes cost
//!   fibre's full route lookup and the kernel's.

// Unsafe code only in the DPDK peer's calls into DPDK (`dpdk::ffi`, which allows it).
#![deny(unsafe_code)]

// Public: the modules `fibre bench`'s subcommands and the bench's tests drive. Private:
// the measurement method, the kernel's side, the peers and the attribution of costs,
// which the studies use.

pub mod addresses;
mod attribution;
mod dpdk;
pub mod floor;
mod kernel;
pub mod lookups;
mod method;
pub mod mirror;
mod peers;
pub mod pipeline;
pub mod report;
pub mod rules;
pub mod studies;
pub mod veth;
