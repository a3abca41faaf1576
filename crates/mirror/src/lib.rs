//! A mirror of a Linux kernel's routing state over rtnetlink, published to lock-free
//! readers.
//!
//! A forwarding plane beside Linux must know what the kernel knows, at once and exactly,
//! without polling. The mirror subscribes first ([`netlink::Events`]: links, addresses,
//! routes and rules of both families), then dumps each kind ([`netlink::dump`]), applying
//! each message to a [`fibre_fib::State`] in mirror mode as it is read (a dump the kernel
//! marks interrupted is made again, from a fresh state), and applies what queued
//! meanwhile. From then on each batch
//! of notifications is applied incrementally and published as one version
//! ([`Mirror::apply`]); an overflow of the subscribed socket (`ENOBUFS`) is answered by
//! dumping again ([`Mirror::resync`]), counted, so that no update is lost silently.
//!
//! - [`netlink`]: the sockets and the wire format (`netlink-packet-route`'s).
//! - `convert`: messages as fibre's links, addresses, routes and rules.
//! - [`Mirror`] (`mirrored`): the state kept and published, with its counters
//!   ([`Stats`]).
//! - [`Neighbours`] (`neigh`): neighbour entries, kept beside the routing state.
//! - [`NexthopMessage`] (`nexthop`): nexthop objects' messages, which the netlink crates
//!   do not decode yet.

#![forbid(unsafe_code)]

mod convert;
mod mirrored;
mod neigh;
// Public as a namespace: the rtnetlink sockets' constants and functions read with its
// name (`netlink::dump`, `netlink::RECEIVE_BUFFER`), and its `Batch` and `Events` share
// their names with the firewall's (`fibre_firewall::nfnetlink`), used beside them.
pub mod netlink;
mod nexthop;

pub use convert::Skip;
pub use mirrored::{Mirror, Stats};
pub use neigh::{lladdr_text, NeighState, Neighbour, Neighbours};
pub use nexthop::NexthopMessage;
