//! The router's firewall as fibre sees it: the kernel's nftables ruleset, mirrored over
//! nfnetlink as the routes are over rtnetlink (dumped once, then kept by the
//! notifications of each committed generation), and the gate that keeps fibre never
//! weaker than the kernel: every base chain that forwarded packets meet, every rule that
//! makes the kernel track connections, and every iptables-legacy table (which
//! nf_tables' netlink does not show) closes the family it applies to, unless it is a
//! stateless filter chain fibre evaluates itself ([`Filter`]); the daemon refuses to
//! forward a closed family and says which rule and why.
//!
//! - [`message`]: nf_tables messages decoded (tables, chains, rules, generations).
//! - [`Ruleset`] (`ruleset`): the mirrored ruleset, applied message by message.
//! - [`render`]: a rule's expressions as text, for an operator.
//! - [`build`]: rulesets made in memory, for benchmarks and tests.
//! - [`Filter`] (`eval`): the stateless filter rules, compiled and evaluated as the kernel
//!   does, a [`Packet`] at a time.
//! - [`gate`]: what of the ruleset fibre may not bypass, and for which family.
//! - `lookup`: a set's elements as the kernel's set backends match them.
//! - [`nfnetlink`]: the nfnetlink sockets: the dump, the subscription, and the legacy
//!   tables.
//! - [`connections`]: the connections the kernel tracks, read over ctnetlink when
//!   fibre takes over.

// Public as a namespace: builders named after the expressions they build
// (`build::cmp`, `build::payload`, `build::verdict`).
pub mod build;
// Public as a namespace: its `dump` and `Dump` share their names with `nfnetlink`'s.
pub mod connections;
mod eval;
// Public as a namespace: its functions read with its name (`gate::refusals`,
// `gate::closed`, `gate::quiet`).
pub mod gate;
mod lookup;
// Public as a namespace: nf_tables' constants and messages, named as nf_tables names them
// (`message::NEWRULE`, `message::Family`), among them a chain's `message::Hook`, which
// the hook a packet is at (`Hook`) is not.
pub mod message;
// Public as a namespace: its `dump` and `Dump` share their names with `connections`', its
// `Batch` and `Events` with the routing mirror's (`fibre_mirror::netlink`).
pub mod nfnetlink;
// Public as a namespace: its functions read with its name (`render::rule`,
// `render::expression`).
pub mod render;
mod ruleset;

pub use eval::{
    Ct, Filter, Hook, Link, NatKind, NatVerdict, Packet, Part, Program, Refused, Reject, Steady,
    Translation, Verdict,
};
pub use gate::{Families, Refusal};
pub use ruleset::{ChainEntry, Ruleset, TableEntry};
