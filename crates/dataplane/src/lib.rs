//! # fibre-dataplane: the packet path
//!
//! Frames come in from Linux interfaces, are checked, routed with `fibre-fib`, rewritten
//! and sent out, a vector of them at a time, each stage counting what it costs per
//! packet. This crate grows stage by stage; what it has so far:
//!
//! - [`input`]: a received frame checked as the kernel's `ip_rcv` and `ipv6_rcv` check it,
//!   and sorted: a packet to route (with what the route lookup needs), one for the kernel
//!   (ARP, neighbour discovery, multicast, what fibre does not handle), or one dropped,
//!   with the reason counted.
//! - [`rewrite`]: a forwarded packet's TTL or hop limit taken down by one, the IPv4
//!   checksum updated incrementally, its MAC addresses set.
//! - `fragment`: an IPv4 packet over the MTU without DF cut into fragments, as the
//!   kernel cuts it.
//! - `segment`: a TCP or UDP packet its sender left whole for a device to cut (GSO)
//!   cut into its segments as the kernel cuts it, for a way out that cannot carry it.
//! - [`icmp`]: the ICMP and ICMPv6 errors a router answers what it cannot forward with
//!   (time exceeded, unreachable, packet too big), and the kernel's limits on them.
//! - `reset`: the TCP resets a firewall's `reject with tcp reset` answers with.
//! - [`pool`]: packet buffers made once, taken and given back in bulk.
//! - [`pipeline`]: the stages over a vector of packets from one link (input, route,
//!   neighbour, rewrite), each packet's fate counted.
//! - [`runtime`]: what each stage costs per packet, as VPP's `show runtime` shows it.
//! - [`neighbour`]: fixed neighbour entries from `neigh add` lines, for runs offline.
//! - [`capture`]: pcap and pcapng files in, pcapng out (a block per output link), for
//!   runs offline.
//! - [`packet`]: frames out of (and, for tests and tools, into) a Linux link through an
//!   `AF_PACKET` socket, a vector per system call.
//! - [`offload`]: what a sender left for a device to finish (a partial checksum,
//!   segments to cut), read from and written to the virtio-net header `AF_PACKET`
//!   carries, or finished by fibre where the way out cannot carry it.
//! - `ring`: frames in from a Linux link through an `AF_PACKET` socket's
//!   `TPACKET_V3` receive ring, without a system call while frames flow.
//! - `xdp`: the XDP program each forwarded link runs, assembled here: what is the
//!   kernel's passes on to it, the rest goes to fibre's AF_XDP sockets.
//! - `xsk`: AF_XDP sockets over a worker's pool, frames received and sent in place.
//! - `claims`: the traffic-control program that keeps from the kernel's stack the
//!   replies of connections fibre translated to an address of this host.
//! - `express`: the traffic-control program that redirects, inside the kernel, frames
//!   to destinations whose forwarding a worker has already decided, and its maps.
//! - [`worker`]: forwarding threads, pinned, reading the forwarded links through AF_XDP
//!   sockets (or, where a link takes no XDP program, `AF_PACKET` receive rings in a
//!   fanout group), with the FIB's and the neighbour table's current versions taken
//!   once per vector.
//! - [`handoff`]: packets a worker hands the worker that owns their connection, and
//!   the mailboxes they go through.
//! - [`workers`]: the workers as a whole: every receive queue served, each worker on
//!   its CPU, a worker that fails noticed, counted and started again.
//! - [`offline`]: a capture through the pipeline, what is sent written out: `fibre
//!   forward`.
//!
//! The wire formats are read and written through the typed views of `fibre-headers`
//! (checked once, fields named), in the manner of smoltcp's; the tests hold them to
//! `etherparse`, which builds and reads the packets they use.
//!
//! The modules a user of the crate drives (the daemon, the `fibre` commands, the
//! benchmarks) are public; those that work inside a worker (the programs loaded in the
//! kernel, the AF_XDP and ring sockets, fragmentation, segmentation, resets) are
//! private, with the two types the daemon names re-exported here.

pub mod capture;
mod claims;
mod express;
mod fragment;
pub mod handoff;
pub mod icmp;
pub mod input;
pub mod neighbour;
pub mod offline;
pub mod offload;
pub mod packet;
pub mod pipeline;
pub mod pool;
mod reset;
pub mod rewrite;
mod ring;
pub mod runtime;
mod segment;
pub mod worker;
pub mod workers;
mod xdp;
mod xsk;

pub use express::Generation;
pub use xdp::LocalDestinations;
