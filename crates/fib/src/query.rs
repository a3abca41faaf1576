//! Route queries and their answers: what `ip route get` asks and what it is told.

use crate::link::LinkIndex;
use crate::route::RouteType;
use std::fmt;
use std::net::IpAddr;

/// A flow to route: the words of `ip route get`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    /// The destination.
    pub dst: IpAddr,
    /// The source (`from`), if given.
    pub src: Option<IpAddr>,
    /// The input link (`iif`): the flow arrives there and is forwarded. `None`: this host
    /// sends it.
    pub iif: Option<LinkIndex>,
    /// The output link (`oif`) the flow must leave by.
    pub oif: Option<LinkIndex>,
    /// The firewall mark (`mark`).
    pub mark: u32,
    /// The TOS byte (`tos`, `dsfield`).
    pub tos: u8,
    /// The IP protocol (`ipproto`), 0 when not given.
    pub ipproto: u8,
    /// The source port (`sport`).
    pub sport: u16,
    /// The destination port (`dport`).
    pub dport: u16,
    /// The uid (`uid`).
    pub uid: u32,
    /// The source may be an address this host does not have (the kernel's
    /// `FLOWI_FLAG_ANYSRC`, which netfilter's `ip_route_me_harder` sets: a reset sent
    /// from a forwarded segment's destination is routed so, a rule `from` it applying).
    pub any_source: bool,
}

impl Query {
    /// A query for `dst` and nothing else.
    pub fn to(dst: IpAddr) -> Query {
        Query {
            dst,
            src: None,
            iif: None,
            oif: None,
            mark: 0,
            tos: 0,
            ipproto: 0,
            sport: 0,
            dport: 0,
            uid: 0,
            any_source: false,
        }
    }
}

/// Why a query has no route: the kernel's error, printed as `ip` prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NoRoute {
    /// No rule gave an answer, or a rule said `unreachable` (`ENETUNREACH`).
    NetworkUnreachable,
    /// An `unreachable` route (`EHOSTUNREACH`).
    HostUnreachable,
    /// A `prohibit` route or rule (`EACCES`).
    Prohibited,
    /// A `blackhole` route or rule, or a query the kernel refuses (`EINVAL`).
    Invalid,
    /// The output link is down, or the input link is (`ENETDOWN`).
    NetworkDown,
    /// An input link that does not exist (`ENODEV`).
    NoDevice,
}

impl NoRoute {
    /// The error of a number `e as u32` gave (an unknown number: `Invalid`).
    pub(crate) fn from_code(code: u32) -> NoRoute {
        [
            NoRoute::NetworkUnreachable,
            NoRoute::HostUnreachable,
            NoRoute::Prohibited,
            NoRoute::Invalid,
            NoRoute::NetworkDown,
            NoRoute::NoDevice,
        ]
        .into_iter()
        .find(|e| *e as u32 == code)
        .unwrap_or(NoRoute::Invalid)
    }

    /// The words `ip` prints after `RTNETLINK answers: `.
    pub fn words(self) -> &'static str {
        match self {
            NoRoute::NetworkUnreachable => "Network is unreachable",
            NoRoute::HostUnreachable => "No route to host",
            NoRoute::Prohibited => "Permission denied",
            NoRoute::Invalid => "Invalid argument",
            NoRoute::NetworkDown => "Network is down",
            NoRoute::NoDevice => "No such device",
        }
    }
}

impl fmt::Display for NoRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RTNETLINK answers: {}", self.words())
    }
}

impl std::error::Error for NoRoute {}

/// The route a query takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The type of the route that answered.
    pub kind: RouteType,
    /// The query's destination.
    pub dst: IpAddr,
    /// The query's source, when given (or when the flow arrived on `iif`).
    pub from: Option<IpAddr>,
    /// The gateway of the chosen path.
    pub gateway: Option<IpAddr>,
    /// The link the flow leaves by (`lo` for local delivery).
    pub dev: LinkIndex,
    /// The table that answered (`None` when no table did: an `oif` query the tables could
    /// not route, which the kernel sends out of `oif` anyway).
    pub table: Option<u32>,
    /// The source address the host would use.
    pub prefsrc: Option<IpAddr>,
    /// The answering route's metric (printed for IPv6).
    pub metric: u32,
    /// The answering route's protocol (printed for IPv6).
    pub protocol: u8,
    /// The answering route's IPv6 preference.
    pub pref: u8,
    /// The answering route's TOS, when it has one.
    pub tos: u8,
    /// The route's MTU metric.
    pub mtu: Option<u32>,
    /// The route's hop limit metric: what the host sends by it leaves with it.
    pub hoplimit: Option<u8>,
    /// The input link, for forwarded flows.
    pub iif: Option<LinkIndex>,
    /// The path's link has no carrier (`linkdown`).
    pub linkdown: bool,
    /// The gateway is on-link by decree (`onlink`).
    pub onlink: bool,
    /// The query's mark (printed when not zero).
    pub mark: u32,
    /// The query's uid (printed for IPv4 queries this host sends).
    pub uid: u32,
    /// The route cache's flags `ip` prints (`local`, `brd`, `redirect`).
    pub cache: Vec<&'static str>,
}

/// Parses the words of `ip route get` (`ADDR [from ADDR] [iif DEV] [oif DEV] [mark N]
/// [tos T] [ipproto P] [sport N] [dport N] [uid N]`), naming links through `link`.
pub fn parse_query(
    words: &[&str],
    link: impl Fn(&str) -> Option<LinkIndex>,
) -> Result<Query, String> {
    use crate::names::{parse_ipproto, parse_u32};
    use crate::net::{parse_addr, quote};
    let mut dst = None;
    let mut q = Query::to(IpAddr::from([0, 0, 0, 0]));
    let mut it = words.iter().copied();
    let number = |w: Option<&str>, of: &str| -> Result<u32, String> {
        let v = w.ok_or_else(|| format!("{of} needs a value"))?;
        parse_u32(v).ok_or_else(|| format!("{of}: {} is not a number", quote(v)))
    };
    let dev = |w: Option<&str>, of: &str| -> Result<LinkIndex, String> {
        let v = w.ok_or_else(|| format!("{of} needs a value"))?;
        link(v).ok_or_else(|| format!("Cannot find device {}", quote(v)))
    };
    while let Some(w) = it.next() {
        match w {
            "to" => dst = Some(parse_addr(it.next().ok_or("to needs a value")?)?),
            "from" => q.src = Some(parse_addr(it.next().ok_or("from needs a value")?)?),
            "iif" => q.iif = Some(dev(it.next(), "iif")?),
            "oif" => q.oif = Some(dev(it.next(), "oif")?),
            "mark" => q.mark = number(it.next(), "mark")?,
            "tos" | "dsfield" => {
                q.tos = u8::try_from(number(it.next(), "tos")?)
                    .map_err(|_| "tos above 255".to_string())?
            }
            "ipproto" => {
                let v = it.next().ok_or("ipproto needs a value")?;
                q.ipproto = parse_ipproto(v)
                    .ok_or_else(|| format!("{} is not an IP protocol", quote(v)))?;
            }
            "sport" => {
                q.sport = u16::try_from(number(it.next(), "sport")?)
                    .map_err(|_| "sport above 65535".to_string())?
            }
            "dport" => {
                q.dport = u16::try_from(number(it.next(), "dport")?)
                    .map_err(|_| "dport above 65535".to_string())?
            }
            "uid" => q.uid = number(it.next(), "uid")?,
            other if dst.is_none() => {
                let a = other.split('/').next().unwrap_or(other);
                dst = Some(parse_addr(a)?);
            }
            other => return Err(format!("unsupported word {}", quote(other))),
        }
    }
    q.dst = dst.ok_or("a destination is needed")?;
    if q.iif.is_some() {
        // A `route get` arriving on a link: IPv4 routes it as a packet, whose uid is 0
        // whatever the query says (`ip_route_input_slow`); IPv6 takes the query's uid,
        // and with none the invalid uid (`INVALID_UID`), which no `uidrange` holds.
        if q.dst.is_ipv4() {
            q.uid = 0;
        } else if !words.contains(&"uid") {
            q.uid = u32::MAX;
        }
    }
    if q.iif.is_none() && q.src == Some(IpAddr::from([0, 0, 0, 0])) {
        // The kernel reads an IPv4 source of 0.0.0.0 as none for a flow this host sends.
        q.src = None;
    }
    if !words.contains(&"ipproto") && q.dst.is_ipv4() {
        // The kernel asks an IPv4 `route get` without a protocol as UDP (rules with
        // `ipproto udp` match it); IPv6 leaves the protocol 0.
        q.ipproto = 17;
    }
    Ok(q)
}

/// Flows a batch keeps together through rules and tables.
pub const BATCH: usize = 64;
