//! # fibre-kernel: what fibre's own code asks of the Linux kernel
//!
//! The system calls and kernel interfaces the daemon and the packet path use, each
//! wrapped once, with its `unsafe` said sound where it is:
//!
//! - [`bpf`]: eBPF instruction encoding, maps, program loading and attaching, and
//!   `BPF_PROG_TEST_RUN`, so that fibre's XDP and traffic-control programs are assembled
//!   in Rust and cargo alone builds them.
//! - [`privileges`]: capabilities cut to those named, after setup.
//! - [`memory`]: this process's resident memory.
//! - [`priority`]: the lowest real-time priority for the threads that follow the kernel.
//! - [`sockopt`]: the netlink sockets' receive buffers; a Unix socket's peer.
//! - [`netns`]: a network namespace entered by name, the one way fibre enters one.
//!
//! Nothing here builds namespaces, runs `ip` or `nft`, or sends test frames: that is the
//! test and bench harness, `fibre-testbed`, which production code does not link.

pub mod bpf;
pub mod memory;
pub mod netns;
pub mod priority;
pub mod privileges;
pub mod sockopt;
