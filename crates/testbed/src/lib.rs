//! # fibre-testbed: the test and bench harness, not for production
//!
//! What fibre's tests and benchmarks need to ask the real kernel for its answer: a
//! private network namespace configured with `ip` and `nft`, the kernel's FIB lookup
//! timed from an XDP program, raw frames written onto a link and read off another. The
//! daemon and the packet path never link it; they ask the kernel through `fibre-kernel`,
//! which this crate builds on (the probe's eBPF, entering a namespace).
//!
//! - [`netns`]: a private network namespace, deleted on drop, optionally set up as a
//!   router (veth pair, gateways, forwarding), filled with routes through `ip -batch`,
//!   and its `ip route get`.
//! - [`probe`]: the kernel's route lookup (`bpf_fib_lookup`) run from an XDP program on
//!   addresses from a map, timed by the kernel, dry run beside it, answers readable.
//! - [`wire`]: raw frames into and out of a link with packet sockets, with the losses
//!   below IP counted so that a test cannot mistake them for the kernel's drops.
//!
//! Two users beside tests and benchmarks: `fibre bench` (the kernel measured beside
//! fibre) and `fibre forward --ruleset`, which has `nft` read a ruleset in a scratch
//! namespace. Everything here needs root and iproute2; [`netns::unavailable_reason`]
//! says plainly why the kernel side cannot run when it cannot.

pub mod netns;
pub mod probe;
pub mod wire;
