//! # fibre-kernel: the Linux kernel's FIB, seen from fibre
//!
//! - [`netns`]: a private network namespace set up as a router (veth pair, gateways,
//!   forwarding), filled with routes through `ip -batch`.
//! - [`bpf`]: eBPF instruction encoding, maps, program loading and `BPF_PROG_TEST_RUN`.
//! - [`probe`]: the kernel's route lookup (`bpf_fib_lookup`) run from an XDP program on
//!   addresses from a map, timed by the kernel, dry run beside it, answers readable.
//! - [`privileges`]: capabilities cut to those named, after setup.
//! - [`memory`]: this process's resident memory.
//! - [`sockopt`]: the netlink sockets' receive buffers; a Unix socket's peer.
//! - [`wire`]: raw frames into and out of a link with packet sockets, for tests and
//!   benchmarks that ask the kernel.
//!
//! Everything here needs root; [`netns::unavailable_reason`] says plainly why the kernel
//! side cannot run when it cannot.

pub mod bpf;
pub mod memory;
pub mod netns;
pub mod privileges;
pub mod probe;
pub mod sockopt;
pub mod wire;
