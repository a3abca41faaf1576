//! Connection tracking as the Linux kernel's `nf_conntrack` does it, for the packets
//! fibre forwards: the same tuples both ways, the same states (NEW, ESTABLISHED,
//! RELATED, INVALID, UNTRACKED), TCP tracked with the kernel's state table and window
//! checks, UDP streams, ICMP and ICMPv6 queries and the errors RELATED to a connection
//! by the packet they quote, the same timeouts and limits, read from the namespace's
//! sysctls. The router's rules read a packet's state (`ct state`, `ct status`, ...)
//! from it, as the kernel's read its conntrack.
//!
//! - [`Connection`] (`connection`): a tracked connection, and a packet's outcome
//!   ([`Tracked`]).
//! - [`Conntrack`] (`table`): the connection table and a packet's way through it.
//! - [`nat`]: address translation: bindings chosen, packets rewritten.
//! - `translation`: address translation applied through the table.
//! - [`Owners`] (`owners`): which worker's table holds a connection.
//! - [`Registry`] (`registry`): what NAT asks of every worker's connections.
//! - [`Kept`] (`kept`): the chains' verdicts kept on connections for their later packets.
//! - [`Tcp`] (`tcp`): the TCP state machine and windows.
//! - [`Tuple`] ([`mod@tuple`]): a packet's tuple, as the kernel reads it.
//! - [`Settings`] (`settings`): the namespace's conntrack sysctls.

mod connection;
mod kept;
// Public as a namespace: the kernel's NAT range flags and NAT status bits, named as the
// kernel names them (`nat::PERSISTENT`, `nat::SRC_NAT`), and a NAT's `nat::Range`.
pub mod nat;
mod owners;
mod registry;
mod settings;
mod table;
mod tcp;
mod translation;
// Public as a namespace of constants: the protocol numbers a tuple holds (`tuple::TCP`,
// `tuple::ICMPV6`), and those tracked by the kernel alone (`tuple::UNTRACKED_HERE`).
pub mod tuple;

pub use connection::{
    Connection, Fate, Forward, Nanos, Protocol, State, Tracked, Untrackable, ASSURED, CONFIRMED,
    SEEN_REPLY,
};
pub use kept::{Epoch, Kept};
pub use owners::Owners;
pub use registry::Registry;
pub use settings::{Settings, TcpTimeouts};
pub use table::{Conntrack, Stats, RELEASED_MAX};
pub use tcp::{Tcp, TcpSide, TcpState};
pub use tuple::Tuple;
