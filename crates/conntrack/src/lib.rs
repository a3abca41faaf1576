//! Connection tracking as the Linux kernel's `nf_conntrack` does it, for the packets
//! fibre forwards: the same tuples both ways, the same states (NEW, ESTABLISHED,
//! RELATED, INVALID, UNTRACKED), TCP tracked with the kernel's state table and window
//! checks, UDP streams, ICMP and ICMPv6 queries and the errors RELATED to a connection
//! by the packet they quote, the same timeouts and limits, read from the namespace's
//! sysctls. The router's rules read a packet's state (`ct state`, `ct status`, ...)
//! from it, as the kernel's read its conntrack.
//!
//! - [`connection`]: a tracked connection and a packet's outcome.
//! - [`table`]: the connection table and a packet's way through it.
//! - [`nat`]: address translation: bindings chosen, packets rewritten.
//! - [`translation`]: address translation applied through the table.
//! - [`owners`]: which worker's table holds a connection.
//! - [`registry`]: what NAT asks of every worker's connections.
//! - [`kept`]: the chains' verdicts kept on connections for their later packets.
//! - [`tcp`]: the TCP state machine and windows.
//! - [`mod@tuple`]: a packet's tuple, as the kernel reads it.
//! - [`settings`]: the namespace's conntrack sysctls.

pub mod connection;
pub mod kept;
pub mod nat;
pub mod owners;
pub mod registry;
pub mod settings;
pub mod table;
pub mod tcp;
pub mod translation;
pub mod tuple;

pub use connection::{Connection, Fate, Forward, Nanos, Protocol, State, Tracked, Untrackable};
pub use kept::{Epoch, Kept};
pub use owners::Owners;
pub use settings::Settings;
pub use table::Conntrack;
pub use tuple::Tuple;
