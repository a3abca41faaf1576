//! Routes: what `ip route` adds, and what the kernel derives from addresses.
//!
//! A route belongs to a table and a family, and is found by its destination prefix (and,
//! for source-specific routes, its source prefix). Among the routes of one prefix the
//! kernel keeps an ordered list: IPv4 by TOS (highest first) then metric (lowest first),
//! IPv6 by metric; the first that fits a flow answers. A route's paths are its nexthops:
//! one, several with weights (multipath), or a nexthop object (`nhid`).

use crate::link::LinkIndex;
use crate::net::{Family, Net};
use crate::nexthop::NexthopId;
use std::net::IpAddr;
use std::sync::Arc;

/// A route's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteType {
    /// Forwarded through its paths.
    Unicast,
    /// Delivered to this host.
    Local,
    /// Delivered as a broadcast (IPv4).
    Broadcast,
    /// Multicast (IPv6's `ff00::/8` in table local).
    Multicast,
    /// Delivered to this host as an anycast address (IPv6's subnet-router anycast address
    /// of each prefix the host has an address in, while forwarding).
    Anycast,
    /// Dropped silently (`Invalid argument` to a query).
    Blackhole,
    /// Refused with host unreachable (`No route to host`).
    Unreachable,
    /// Refused with administratively prohibited (`Permission denied`).
    Prohibit,
    /// Not here: the rule walk goes on to the next rule.
    Throw,
}

impl RouteType {
    /// The name `ip` uses.
    pub fn name(self) -> &'static str {
        match self {
            RouteType::Unicast => "unicast",
            RouteType::Local => "local",
            RouteType::Broadcast => "broadcast",
            RouteType::Multicast => "multicast",
            RouteType::Anycast => "anycast",
            RouteType::Blackhole => "blackhole",
            RouteType::Unreachable => "unreachable",
            RouteType::Prohibit => "prohibit",
            RouteType::Throw => "throw",
        }
    }

    /// The type of a name.
    pub fn parse(text: &str) -> Option<RouteType> {
        Some(match text {
            "unicast" => RouteType::Unicast,
            "local" => RouteType::Local,
            "broadcast" => RouteType::Broadcast,
            "multicast" => RouteType::Multicast,
            "anycast" => RouteType::Anycast,
            "blackhole" => RouteType::Blackhole,
            "unreachable" => RouteType::Unreachable,
            "prohibit" => RouteType::Prohibit,
            "throw" => RouteType::Throw,
            _ => return None,
        })
    }

    /// Whether a route of this type has no paths (it answers by itself).
    pub fn is_reject(self) -> bool {
        matches!(
            self,
            RouteType::Blackhole | RouteType::Unreachable | RouteType::Prohibit | RouteType::Throw
        )
    }

    /// The scope the kernel gives a route of this type when none is given (IPv4).
    pub fn default_scope(self, has_gateway: bool) -> u8 {
        use crate::names::*;
        match self {
            RouteType::Local => SCOPE_HOST,
            RouteType::Broadcast | RouteType::Multicast | RouteType::Anycast => SCOPE_LINK,
            RouteType::Unicast if !has_gateway => SCOPE_LINK,
            _ => SCOPE_UNIVERSE,
        }
    }
}

/// One path of a route: a gateway, a link, or both.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Path {
    /// The gateway (`via`); of either family for IPv4 routes (`via inet6 ...`).
    pub gateway: Option<IpAddr>,
    /// The link (`dev`), resolved when the route was added.
    pub dev: LinkIndex,
    /// The weight in a multipath route (1 to 256).
    pub weight: u16,
    /// `onlink`: the gateway is on the link whatever the routes say.
    pub onlink: bool,
    /// The path's link went down while other paths of its route stayed (`dead`).
    pub dead: bool,
    /// The scope of the path (the kernel's `nh_scope`): `host` for a directly attached
    /// path, `link` for a gateway, `nowhere` for a local route's path.
    pub scope: u8,
}

/// Where a route sends what it matches.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Paths {
    /// No path: reject routes (blackhole, unreachable, prohibit, throw).
    None,
    /// One or more paths of its own: shared, not copied, by the route's copies (a
    /// compiled snapshot's) and by the routes with the same paths (a mirror interns them),
    /// as the kernel shares one `fib_info` among routes.
    Own(Arc<[Path]>),
    /// A nexthop object (`nhid N`), shared with other routes.
    Object(NexthopId),
}

/// A route: its destination prefix and the rest of it, its [`RouteBody`], whose fields
/// it gives as its own (`route.metric`). The state and the snapshots hold bodies alone,
/// under their destination: the routes of many destinations with the same table, type,
/// metric and paths (a full table through a few peers) share one list of bodies, as the
/// kernel's routes share one `fib_info`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// The destination prefix.
    pub dst: Net,
    /// Everything else.
    pub body: RouteBody,
}

/// A route but its destination prefix: what the routes of many destinations share.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RouteBody {
    /// The table.
    pub table: u32,
    /// The source prefix (`from`); the default prefix when the route is not source-specific.
    pub src: Net,
    /// The TOS it matches (IPv4; 0 matches any).
    pub tos: u8,
    /// The metric (`metric`, `priority`, `preference`).
    pub metric: u32,
    /// The protocol that installed it.
    pub protocol: u8,
    /// The scope.
    pub scope: u8,
    /// The type.
    pub kind: RouteType,
    /// The preferred source address (`src`).
    pub prefsrc: Option<IpAddr>,
    /// The path MTU (`mtu`).
    pub mtu: Option<u32>,
    /// The hop limit of what the host sends by it (`hoplimit`, `RTAX_HOPLIMIT`): the
    /// time to live of its IPv4 packets, the hop limit of its IPv6 ones.
    pub hoplimit: Option<u8>,
    /// The paths.
    pub paths: Paths,
    /// IPv6 router preference (`pref low|medium|high`), printed as `ip` does.
    pub pref: u8,
}

impl std::ops::Deref for Route {
    type Target = RouteBody;

    fn deref(&self) -> &RouteBody {
        &self.body
    }
}

impl std::ops::DerefMut for Route {
    fn deref_mut(&mut self) -> &mut RouteBody {
        &mut self.body
    }
}

impl Route {
    /// The route of `body` to `dst`.
    pub fn new(dst: Net, body: RouteBody) -> Route {
        Route { dst, body }
    }

    /// The route's family.
    pub fn family(&self) -> Family {
        self.dst.family()
    }
}

impl RouteBody {
    /// The route's family (its source prefix's, which is its destination's).
    pub fn family(&self) -> Family {
        self.src.family()
    }

    /// The paths of its own (empty for reject routes and nexthop objects).
    pub fn own_paths(&self) -> &[Path] {
        match &self.paths {
            Paths::Own(p) => p,
            _ => &[],
        }
    }
}

impl Paths {
    /// Paths of its own, from a list.
    pub fn own(paths: Vec<Path>) -> Paths {
        Paths::Own(paths.into())
    }

    /// Changes the paths of its own with `edit` (nothing for other paths): a copy of
    /// them is edited and takes their place, so that the route's other copies keep theirs.
    pub fn edit<T>(&mut self, edit: impl FnOnce(&mut Vec<Path>) -> T) -> Option<T> {
        let Paths::Own(paths) = self else {
            return None;
        };
        let mut list = paths.to_vec();
        let out = edit(&mut list);
        *paths = list.into();
        Some(out)
    }
}
