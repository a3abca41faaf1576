//! The router's firewall as fibre sees it: the kernel's nftables ruleset, mirrored over
//! nfnetlink as the routes are over rtnetlink (dumped once, then kept by the
//! notifications of each committed generation), and the gate that keeps fibre never
//! weaker than the kernel: every base chain that forwarded packets meet, every rule that
//! makes the kernel track connections, and every iptables-legacy table (which
//! nf_tables' netlink does not show) closes the family it applies to, unless it is a
//! stateless filter chain fibre evaluates itself ([`eval`]); the daemon refuses to forward
//! a closed family and says which rule and why.
//!
//! - [`message`]: nf_tables messages decoded (tables, chains, rules, generations).
//! - [`ruleset`]: the mirrored ruleset, applied message by message.
//! - [`render`]: a rule's expressions as text, for an operator.
//! - [`build`]: rulesets made in memory, for benchmarks and tests.
//! - [`eval`]: the stateless filter rules, compiled and evaluated as the kernel does.
//! - [`gate`]: what of the ruleset fibre may not bypass, and for which family.
//! - [`lookup`]: a set's elements as the kernel's set backends match them.
//! - [`nfnetlink`]: the nfnetlink sockets: the dump, the subscription, and the legacy
//!   tables.
//! - [`connections`]: the connections the kernel tracks, read over ctnetlink when
//!   fibre takes over.

pub mod build;
pub mod connections;
pub mod eval;
pub mod gate;
pub mod lookup;
pub mod message;
pub mod nfnetlink;
pub mod render;
pub mod ruleset;

pub use gate::{Families, Refusal};
pub use ruleset::Ruleset;
