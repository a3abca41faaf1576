//! Nexthop objects (`ip nexthop`): a path, a blackhole, or a group of other objects with
//! weights, shared by every route that names it with `nhid`. Changing an object changes
//! where all of those routes go, at once.

use crate::link::LinkIndex;
use crate::net::Family;
use std::net::IpAddr;

/// A nexthop object's id (`id N`, 1 and up).
pub type NexthopId = u32;

/// What a nexthop object is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NexthopKind {
    /// One path: a gateway on a link, or a link.
    Path {
        /// The gateway (`via`).
        gateway: Option<IpAddr>,
        /// The link (`dev`).
        dev: LinkIndex,
        /// `onlink`.
        onlink: bool,
    },
    /// Drops what is sent to it.
    Blackhole,
    /// A group of other objects, each with a weight (1 to 256): multipath.
    Group(Vec<(NexthopId, u16)>),
}

/// A nexthop object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nexthop {
    /// The id.
    pub id: NexthopId,
    /// The family (a group's is its members').
    pub family: Family,
    /// What it is.
    pub kind: NexthopKind,
    /// The protocol that made it.
    pub protocol: u8,
}
