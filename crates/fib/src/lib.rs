//! Routing as Linux defines it, on fibre's LPM engines.
//!
//! A router's route query is more than a longest-prefix match: policy rules pick tables by
//! source, marks, ports and links; routes have types, metrics, TOS, scopes and preferred
//! sources; paths are gateways and links, several with weights, or shared nexthop objects;
//! addresses bring local, broadcast and connected routes with them, and links going down
//! take routes away. This crate holds all of that as the kernel does and answers every
//! query as `ip route get` would.
//!
//! - [`State`] is the routing state and the kernel's rules for changing it (`state`), made
//!   of [`Link`]s and [`Address`]es (`link`), [`Route`]s (`route`), [`Rule`]s (`rule`) and
//!   [`Nexthop`] objects (`nexthop`).
//! - [`config`] reads a file of `ip` command lines into a state: all of it or, with
//!   `FILE:LINE: reason`, none.
//! - [`parse_query`] reads a query in the words of `ip route get`; [`names`] holds
//!   iproute2's names of tables, protocols and scopes.
//! - [`Snapshot`] is a state compiled for lookups: every table one LPM structure, rules
//!   resolved (`layout`; compiled by `compile`, patched in place by `patch`). Its methods
//!   are listed in one place (`snapshot`), each a call into the module that does the
//!   work. [`Snapshot::route`] answers a [`Query`] with an [`Answer`] or the kernel's error
//!   ([`NoRoute`]) by the kernel's full walk (`walk`; `special` for IPv4's multicast and
//!   broadcast destinations); `source` picks the source address. A dump's two families
//!   are compiled apart and joined ([`Half`]).
//! - [`Snapshot::lookup`] and [`Snapshot::lookup_batch`] (`forward`) answer what a packet
//!   needs, a [`Hop`] (`hop`; by reference, a [`HopRef`]), with the same semantics and
//!   no allocation: every destination's answer to a flow with no output link is decided
//!   when the snapshot is compiled and stored as the value of an LPM structure (`answers`),
//!   so the common lookup is one search; rules
//!   compile to integer selectors with a bit-set index (`classify`), and batches of
//!   [`BATCH`] flows stay batched through rules and tables. The passes around the one
//!   search of flows alike are vector code where the CPU has AVX2 (`quick`, the crate's
//!   only `unsafe`).
//! - [`Snapshot::lookup_vector_v4`] and [`Snapshot::lookup_vector_v6`] (`vector`) answer a
//!   packet path's vector of flows ([`FlowVector`]) with a `u32` a flow
//!   ([`VectorAnswers`]): most name a hop of the searched table, as an adjacency index.
//! - [`Fib`] publishes a state to [`FibReader`]s on any threads (`publish`): a batch of
//!   changes becomes visible to all of them at once, with no lock and no wait.
//! - [`Exceptions`] (`exception`) hold what the network taught about single destinations
//!   (path MTUs, redirects) outside the lookup structure: bounded, expiring, sharded with
//!   no global lock; [`FibReader::lookup`] applies them.
//! - [`show`] prints answers and listings as `ip` does, text or JSON.
//!
//! ```
//! use fibre_fib::{config, Query};
//! let mut state = fibre_fib::State::new();
//! config::apply_text(&mut state, "example", "\
//! link add a0 type veth peer name a1
//! link set a0 up
//! link set a1 up
//! addr add 10.0.0.1/24 dev a0
//! route add 10.1.0.0/16 via 10.0.0.2 table 100
//! rule add to 10.1.0.0/16 lookup 100 pref 1000
//! ").unwrap();
//! let snap = state.snapshot();
//! let a = snap.route(&Query::to("10.1.2.3".parse().unwrap())).unwrap();
//! assert_eq!(a.gateway, Some("10.0.0.2".parse().unwrap()));
//! assert_eq!(a.table, Some(100));
//! assert_eq!(a.prefsrc, Some("10.0.0.1".parse().unwrap()));
//! ```

// The one module with `unsafe`, each block with why it is sound: `quick`'s AVX2 form.
#![deny(unsafe_code)]

mod answers;
mod chunked;
mod classify;
mod compile;
// Public as a namespace: the configuration file's functions read with its name
// (`config::load`, `config::apply_text`, `config::apply_line`).
pub mod config;
mod exception;
mod forward;
mod hop;
mod layout;
mod link;
mod multipath;
// Public as a namespace of constants: iproute2's names of numbers and their parsers
// (`names::TABLE_MAIN`, `names::SCOPE_LINK`, `names::parse_table`).
pub mod names;
mod net;
mod nexthop;
mod patch;
mod publish;
mod query;
#[allow(unsafe_code)]
mod quick;
mod route;
mod rule;
// Public as a namespace: its printers read with its name, as `ip ... show` prints
// (`show::route_text`, `show::answer_json`).
pub mod show;
mod snapshot;
mod source;
mod special;
mod state;
mod vector;
mod walk;

pub use compile::Half;
pub use exception::{Exception, Exceptions, Learned};
pub use hop::{Hop, HopRef};
pub use layout::{Snapshot, SnapshotMemory};
pub use link::{parse_mac, AddrGenMode, Address, Link, LinkIndex, LinkKind};
pub use multipath::Multipath;
pub use net::{Family, Net};
pub use nexthop::{Nexthop, NexthopId, NexthopKind};
pub use patch::Touched;
pub use publish::{Fib, FibReader, Publications};
pub use query::{parse_query, Answer, NoRoute, Query, BATCH};
pub use route::{Path, Paths, Route, RouteBody, RouteType};
pub use rule::{Range, Rule, RuleAction, RuleLink};
pub use state::{Dumping, Refused, RouteFilter, RouteOp, State};
pub use vector::{FlowVector, VectorAnswers};
