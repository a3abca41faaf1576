//! The configuration file: lines of what follows `ip` on a command line, applied in order.
//!
//! ```text
//! link add a0 type veth peer name a1
//! link set a0 up
//! addr add 10.0.0.1/24 dev a0
//! route add 10.1.0.0/16 via 10.0.0.2 table 100
//! rule add from 10.0.0.0/24 lookup 100 pref 1000
//! -6 route add 2001:db8::/32 via fe80::1 dev a0
//! ```
//!
//! Besides `ip` lines, `sysctl [-w] KEY=VALUE` sets the kernel settings that change route
//! answers: `net.ipv4.fib_multipath_hash_seed`, `net.ipv4.fib_multipath_hash_policy` and
//! `net.ipv6.fib_multipath_hash_policy` (0, L3, or 1, L4).
//!
//! Blank lines and lines starting with `#` are skipped. Each line is checked and applied
//! with the kernel's semantics; the first line that is wrong, unsupported, or refused by
//! those semantics stops the load with `FILE:LINE: reason`, and nothing of the file takes
//! effect (the state is changed only when every line applied).

use crate::link::{parse_mac, AddrGenMode};
use crate::names::*;
use crate::net::{parse_addr, quote, Family, Net};
use crate::nexthop::{Nexthop, NexthopKind};
use crate::route::{Path, Paths, Route, RouteBody, RouteType};
use crate::rule::{Range, Rule, RuleAction};
use crate::state::{Refused, RouteFilter, RouteOp, State, IPV6_USER_METRIC};
use std::fmt;
use std::net::IpAddr;
use std::path::Path as FsPath;

/// A line that could not be applied: where, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (as given).
    pub file: String,
    /// The line number, from 1 (0 when the file could not be read).
    pub line: usize,
    /// Why.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.reason)
        } else {
            write!(f, "{}:{}: {}", self.file, self.line, self.reason)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Reads and applies a configuration file to a fresh state.
pub fn load(path: &FsPath) -> Result<State, ConfigError> {
    let text = read(path)?;
    let mut state = State::new();
    apply_text(&mut state, &path.display().to_string(), &text)?;
    Ok(state)
}

/// Reads a configuration file's text: an error names the file, and the line where the
/// text stops being UTF-8.
pub fn read(path: &FsPath) -> Result<String, ConfigError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| ConfigError {
        file: file.clone(),
        line: 0,
        reason: e.to_string(),
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let upto = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = upto.iter().filter(|&&b| b == b'\n').count() + 1;
        ConfigError {
            file,
            line,
            reason: "not UTF-8 text".into(),
        }
    })
}

/// Applies the lines of `text` (named `file` in errors) to `state`: all of them, or, on the
/// first error, none.
pub fn apply_text(state: &mut State, file: &str, text: &str) -> Result<(), ConfigError> {
    let mut next = state.clone();
    for (i, line) in text.lines().enumerate() {
        apply_line(&mut next, line).map_err(|reason| ConfigError {
            file: file.to_string(),
            line: i + 1,
            reason,
        })?;
    }
    *state = next;
    Ok(())
}

/// Applies one line (the words after `ip`) to `state`. On error the state may be partly
/// changed by this line; [`apply_text`] discards it.
pub fn apply_line(state: &mut State, line: &str) -> Result<(), String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(());
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    if words[0] == "sysctl" {
        return sysctl(state, &words[1..]);
    }
    let mut w = Words {
        words: &words,
        at: 0,
    };
    let mut family = None;
    while let Some(flag) = w.peek().filter(|x| x.starts_with('-')) {
        family = Some(match flag {
            "-4" => Family::V4,
            "-6" => Family::V6,
            _ => return Err(format!("unknown option {}", quote(flag))),
        });
        w.next();
    }
    let object = w.next().ok_or("a line with an option and nothing to do")?;
    match object {
        "link" | "l" | "li" | "lin" => link(state, &mut w),
        "address" | "addr" | "a" | "ad" | "add" | "addre" => address(state, &mut w, family),
        "route" | "r" | "ro" | "rou" | "rout" => route(state, &mut w, family),
        "rule" | "ru" => rule(state, &mut w, family),
        "nexthop" | "nh" | "ne" | "nex" => nexthop(state, &mut w, family),
        other => Err(format!(
            "unknown object {} (link, addr, route, rule, nexthop)",
            quote(other)
        )),
    }
}

/// `sysctl [-w] KEY=VALUE`: the kernel settings that change route answers (the multipath
/// hash seed and policies), written as the `sysctl` command takes them.
fn sysctl(state: &mut State, words: &[&str]) -> Result<(), String> {
    let words: Vec<&str> = words.iter().copied().filter(|w| *w != "-w").collect();
    let [setting] = words[..] else {
        return Err("sysctl: one KEY=VALUE".into());
    };
    let (key, value) = setting
        .split_once('=')
        .ok_or_else(|| format!("sysctl: {} is not KEY=VALUE", quote(setting)))?;
    let key = key.replace('/', ".");
    let number = |max: u32| -> Result<u32, String> {
        value
            .parse::<u32>()
            .ok()
            .filter(|v| *v <= max)
            .ok_or_else(|| format!("sysctl: {key}: {} is not 0 to {max}", quote(value)))
    };
    let mut mp = state.multipath();
    match key.as_str() {
        "net.ipv4.fib_multipath_hash_seed" => mp.seed = number(u32::MAX)?,
        "net.ipv4.fib_multipath_hash_policy" => mp.policy_v4 = number(1)? as u8,
        "net.ipv6.fib_multipath_hash_policy" => mp.policy_v6 = number(1)? as u8,
        _ => {
            return Err(format!(
                "sysctl: {} is not supported (net.ipv4.fib_multipath_hash_seed, \
                 net.ipv4.fib_multipath_hash_policy, net.ipv6.fib_multipath_hash_policy)",
                quote(&key)
            ))
        }
    }
    state.set_multipath(mp);
    Ok(())
}

struct Words<'a> {
    words: &'a [&'a str],
    at: usize,
}

impl<'a> Words<'a> {
    fn peek(&self) -> Option<&'a str> {
        self.words.get(self.at).copied()
    }
    fn next(&mut self) -> Option<&'a str> {
        let w = self.peek();
        self.at += w.is_some() as usize;
        w
    }
    fn value(&mut self, of: &str) -> Result<&'a str, String> {
        self.next().ok_or_else(|| format!("{of} needs a value"))
    }
    fn number(&mut self, of: &str) -> Result<u32, String> {
        let v = self.value(of)?;
        parse_u32(v).ok_or_else(|| format!("{of}: {} is not a number", quote(v)))
    }
}

fn refused(e: crate::state::Refused) -> String {
    e.0
}

// ----- link -----

fn link(state: &mut State, w: &mut Words) -> Result<(), String> {
    let verb = w.next().ok_or("link: add, set or del?")?;
    match verb {
        "add" | "a" => {
            let mut name = None;
            let (mut mac, mut mtu, mut kind) = (None, None, None);
            let (mut peer, mut peer_mac) = (None, None);
            while let Some(word) = w.next() {
                match word {
                    "name" | "dev" => name = Some(w.value("name")?),
                    "address" => mac = Some(mac_value(w)?),
                    "mtu" => mtu = Some(w.number("mtu")?),
                    "type" => {
                        kind = Some(w.value("type")?);
                        if kind == Some("veth") && w.peek() == Some("peer") {
                            w.next();
                            while let Some(pw) = w.next() {
                                match pw {
                                    "name" => peer = Some(w.value("peer name")?),
                                    "address" => peer_mac = Some(mac_value(w)?),
                                    other => {
                                        return Err(format!(
                                            "link add: unsupported peer option {}",
                                            quote(other)
                                        ))
                                    }
                                }
                            }
                        }
                    }
                    other if name.is_none() && kind.is_none() => name = Some(other),
                    other => return Err(format!("link add: unsupported option {}", quote(other))),
                }
            }
            let name = name.ok_or("link add: a name is needed")?;
            match kind {
                Some("veth") => {
                    let peer = peer.ok_or(
                        "link add: a veth needs `peer name NAME` (fibre does not invent names)",
                    )?;
                    state
                        .add_link(name, mac, Some((peer, peer_mac)), mtu)
                        .map_err(refused)
                }
                Some("dummy") => state.add_link(name, mac, None, mtu).map_err(refused),
                Some(other) => Err(format!(
                    "link add: link type {} is not supported (veth, dummy)",
                    quote(other)
                )),
                None => Err("link add: `type veth` or `type dummy` is needed".into()),
            }
        }
        "set" | "s" => {
            let mut dev = None;
            let mut changes: Vec<(&str, &str)> = Vec::new();
            while let Some(word) = w.next() {
                match word {
                    "dev" => dev = Some(w.value("dev")?),
                    "up" | "down" => changes.push((word, "")),
                    "mtu" | "group" | "address" | "addrgenmode" => {
                        changes.push((word, w.value(word)?))
                    }
                    other if dev.is_none() => dev = Some(other),
                    other => return Err(format!("link set: unsupported option {}", quote(other))),
                }
            }
            let dev = dev.ok_or("link set: which link?")?;
            if changes.is_empty() {
                return Err("link set: nothing to change".into());
            }
            for (what, value) in changes {
                match what {
                    "up" => state.set_link_up(dev, true),
                    "down" => state.set_link_up(dev, false),
                    "mtu" => state.set_link_mtu(
                        dev,
                        parse_u32(value)
                            .ok_or_else(|| format!("mtu: {} is not a number", quote(value)))?,
                    ),
                    "group" => state.set_link_group(
                        dev,
                        parse_u32(value)
                            .ok_or_else(|| format!("group: {} is not a number", quote(value)))?,
                    ),
                    "address" => state.set_link_mac(
                        dev,
                        parse_mac(value)
                            .ok_or_else(|| format!("{} is not a MAC address", quote(value)))?,
                    ),
                    _ => state.set_link_addrgenmode(
                        dev,
                        match value {
                            "eui64" => AddrGenMode::Eui64,
                            "none" => AddrGenMode::None,
                            other => {
                                return Err(format!(
                                    "addrgenmode {} is not supported (eui64, none)",
                                    quote(other)
                                ))
                            }
                        },
                    ),
                }
                .map_err(refused)?;
            }
            Ok(())
        }
        "del" | "delete" | "d" => {
            let mut dev = None;
            while let Some(word) = w.next() {
                match word {
                    "dev" => dev = Some(w.value("dev")?),
                    other if dev.is_none() => dev = Some(other),
                    other => return Err(format!("link del: unsupported option {}", quote(other))),
                }
            }
            state
                .del_link(dev.ok_or("link del: which link?")?)
                .map_err(refused)
        }
        other => Err(format!(
            "link: unsupported command {} (add, set, del)",
            quote(other)
        )),
    }
}

fn mac_value(w: &mut Words) -> Result<[u8; 6], String> {
    let v = w.value("address")?;
    parse_mac(v).ok_or_else(|| format!("{} is not a MAC address", quote(v)))
}

// ----- address -----

fn address(state: &mut State, w: &mut Words, family: Option<Family>) -> Result<(), String> {
    let verb = w.next().ok_or("addr: add or del?")?;
    let (mut local, mut dev, mut brd, mut scope) = (None, None, None, None);
    let (mut noprefixroute, mut metric, mut nodad) = (false, 0, false);
    while let Some(word) = w.next() {
        match word {
            "dev" => dev = Some(w.value("dev")?),
            "local" => local = Some(w.value("local")?),
            "broadcast" | "brd" => brd = Some(w.value("broadcast")?),
            "scope" => {
                let v = w.value("scope")?;
                scope = Some(parse_scope(v).ok_or_else(|| format!("{} is not a scope", quote(v)))?);
            }
            "noprefixroute" => noprefixroute = true,
            "nodad" => nodad = true,
            "home" | "mngtmpaddr" | "optimistic" => {}
            "metric" | "priority" => metric = w.number("metric")?,
            "valid_lft" | "preferred_lft" | "label" => {
                let v = w.value(word)?;
                if word != "label" && v != "forever" {
                    return Err(format!("{word}: only `forever` is supported"));
                }
            }
            other if local.is_none() => local = Some(other),
            other => return Err(format!("addr: unsupported option {}", quote(other))),
        }
    }
    let local = local.ok_or("addr: which address?")?;
    let dev = dev.ok_or("addr: `dev DEV` is needed")?;
    let (addr_text, len_text) = match local.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (local, None),
    };
    let addr = parse_addr(addr_text)?;
    if family.is_some_and(|f| f != Family::of(addr)) {
        return Err(format!("{} is not of the family asked for", quote(local)));
    }
    let len = match len_text {
        Some(l) => l
            .parse::<u8>()
            .ok()
            .filter(|&l| l <= Family::of(addr).bits())
            .ok_or_else(|| format!("invalid prefix length in {}", quote(local)))?,
        None => Family::of(addr).bits(),
    };
    match verb {
        "add" | "a" | "replace" => {
            let broadcast = match brd {
                None => None,
                Some("+") => Net::new(addr, len).map(|n| n.last()).filter(|_| len < 31),
                Some("-") => None,
                Some(b) => Some(parse_addr(b)?),
            };
            state
                .add_address(
                    dev,
                    addr,
                    len,
                    broadcast,
                    scope,
                    noprefixroute,
                    metric,
                    nodad,
                )
                .map_err(refused)
        }
        "del" | "delete" | "d" => state
            .del_address(dev, addr, len_text.map(|_| len))
            .map_err(refused),
        other => Err(format!(
            "addr: unsupported command {} (add, del)",
            quote(other)
        )),
    }
}

// ----- route -----

fn route(state: &mut State, w: &mut Words, family: Option<Family>) -> Result<(), String> {
    let verb = w
        .next()
        .ok_or("route: add, del, replace, change, append, prepend or flush?")?;
    let op = match verb {
        "add" | "a" => Some(RouteOp::Add),
        "replace" => Some(RouteOp::Replace),
        "change" | "chg" => Some(RouteOp::Change),
        "append" => Some(RouteOp::Append),
        "prepend" => Some(RouteOp::Prepend),
        "del" | "delete" | "d" => None,
        "flush" => return route_flush(state, w, family),
        other => return Err(format!("route: unsupported command {}", quote(other))),
    };
    let spec = RouteSpec::parse(state, w, family, op.is_none())?;
    match op {
        Some(op) => state.modify_route(op, spec.route()?).map_err(refused),
        None if spec.family == Family::V6 && !spec.multipath.is_empty() => {
            // `ip6_route_multipath_del`: each path is deleted as a route through its
            // gateway; one not found is an error, the others go all the same.
            let mut last = Ok(());
            for p in &spec.multipath {
                let mut filter = spec.filter();
                filter.gateway = p.gateway;
                filter.dev = if p.dev != 0 { Some(p.dev) } else { spec.dev };
                if let Err(e) = state.del_route(spec.family, &filter) {
                    last = Err(refused(e));
                }
            }
            last
        }
        None => state
            .del_route(spec.family, &spec.filter())
            .map_err(refused),
    }
}

fn route_flush(state: &mut State, w: &mut Words, family: Option<Family>) -> Result<(), String> {
    let mut table = None;
    while let Some(word) = w.next() {
        match word {
            "table" => {
                let v = w.value("table")?;
                table = Some(parse_table(v).ok_or_else(|| format!("{} is not a table", quote(v)))?);
            }
            other => {
                return Err(format!(
                    "route flush: only `table ID` is supported, not {}",
                    quote(other)
                ))
            }
        }
    }
    let table = table.ok_or("route flush: `table ID` is needed")?;
    for f in family.map_or(vec![Family::V4, Family::V6], |f| vec![f]) {
        state.flush_table(f, table);
    }
    Ok(())
}

/// The words of one `ip route` line.
struct RouteSpec {
    family: Family,
    kind: Option<RouteType>,
    dst: Option<Net>,
    src: Option<Net>,
    table: Option<u32>,
    tos: u8,
    metric: Option<u32>,
    protocol: Option<u8>,
    scope: Option<u8>,
    prefsrc: Option<IpAddr>,
    mtu: Option<u32>,
    hoplimit: Option<u8>,
    gateway: Option<IpAddr>,
    dev: Option<u32>,
    onlink: bool,
    nhid: Option<u32>,
    multipath: Vec<Path>,
    pref: u8,
}

fn dev_index(state: &State, name: &str) -> Result<u32, String> {
    state
        .link_by_name(name)
        .map(|l| l.index)
        .ok_or_else(|| format!("Cannot find device {}", quote(name)))
}

impl RouteSpec {
    fn parse(
        state: &State,
        w: &mut Words,
        family: Option<Family>,
        delete: bool,
    ) -> Result<RouteSpec, String> {
        let mut s = RouteSpec {
            family: family.unwrap_or(Family::V4),
            kind: None,
            dst: None,
            src: None,
            table: None,
            tos: 0,
            metric: None,
            protocol: None,
            scope: None,
            prefsrc: None,
            mtu: None,
            hoplimit: None,
            gateway: None,
            dev: None,
            onlink: false,
            nhid: None,
            multipath: Vec::new(),
            pref: 0,
        };
        let mut dst_text = None;
        while let Some(word) = w.next() {
            match word {
                "to" => dst_text = Some(w.value("to")?),
                "from" => {
                    let v = w.value("from")?;
                    s.src = Some(Net::parse(v, family)?);
                }
                "tos" | "dsfield" => {
                    let v = w.value(word)?;
                    s.tos = parse_u32(v)
                        .and_then(|t| u8::try_from(t).ok())
                        .ok_or_else(|| format!("{} is not a TOS", quote(v)))?;
                }
                "table" => {
                    let v = w.value("table")?;
                    s.table =
                        Some(parse_table(v).ok_or_else(|| format!("{} is not a table", quote(v)))?);
                }
                "metric" | "priority" | "preference" => s.metric = Some(w.number(word)?),
                "proto" | "protocol" => {
                    let v = w.value(word)?;
                    s.protocol = Some(
                        parse_protocol(v)
                            .ok_or_else(|| format!("{} is not a protocol", quote(v)))?,
                    );
                }
                "scope" => {
                    let v = w.value("scope")?;
                    s.scope =
                        Some(parse_scope(v).ok_or_else(|| format!("{} is not a scope", quote(v)))?);
                }
                "src" => s.prefsrc = Some(parse_addr(w.value("src")?)?),
                "mtu" => {
                    if w.peek() == Some("lock") {
                        w.next();
                    }
                    s.mtu = Some(w.number("mtu")?);
                }
                "hoplimit" => {
                    if w.peek() == Some("lock") {
                        w.next();
                    }
                    let v: u32 = w.number("hoplimit")?;
                    // 0 leaves it unset, as the kernel takes it.
                    s.hoplimit = match u8::try_from(v) {
                        Ok(h) => (h != 0).then_some(h),
                        Err(_) => return Err(format!("\"hoplimit\" value is invalid: {v}")),
                    };
                }
                "via" => s.gateway = Some(via_value(w)?),
                "dev" | "oif" => s.dev = Some(dev_index(state, w.value("dev")?)?),
                "onlink" => s.onlink = true,
                "nhid" => s.nhid = Some(w.number("nhid")?),
                "pref" => {
                    s.pref = match w.value("pref")? {
                        "low" => 3,
                        "medium" => 0,
                        "high" => 1,
                        other => return Err(format!("pref {} (low, medium, high)", quote(other))),
                    }
                }
                "nexthop" => {
                    let mut p = Path {
                        gateway: None,
                        dev: 0,
                        weight: 1,
                        onlink: false,
                        dead: false,
                        scope: 0,
                    };
                    while let Some(nw) = w.peek() {
                        match nw {
                            "via" => {
                                w.next();
                                p.gateway = Some(via_value(w)?);
                            }
                            "dev" => {
                                w.next();
                                p.dev = dev_index(state, w.value("dev")?)?;
                            }
                            "weight" => {
                                w.next();
                                let v = w.number("weight")?;
                                if !(1..=256).contains(&v) {
                                    return Err(format!("weight {v} (1 to 256)"));
                                }
                                p.weight = v as u16;
                            }
                            "onlink" => {
                                w.next();
                                p.onlink = true;
                            }
                            "nexthop" => break,
                            other => {
                                return Err(format!(
                                    "Error: \"nexthop\" or end of line is expected instead of {}",
                                    quote(other)
                                ))
                            }
                        }
                    }
                    if p.gateway.is_none() && p.dev == 0 {
                        return Err("nexthop: `via` or `dev` is needed".into());
                    }
                    s.multipath.push(p);
                }
                other => {
                    if let Some(k) = RouteType::parse(other) {
                        if s.kind.is_some() || dst_text.is_some() {
                            return Err(format!("route: unexpected {}", quote(other)));
                        }
                        s.kind = Some(k);
                    } else if dst_text.is_none() {
                        dst_text = Some(other);
                    } else {
                        return Err(format!("route: unsupported option {}", quote(other)));
                    }
                }
            }
        }
        // The family: asked for, or that of the destination, or of the gateway.
        let guess = family
            .or_else(|| {
                dst_text
                    .filter(|d| !matches!(*d, "default" | "all" | "any"))
                    .and_then(|d| d.split('/').next()?.parse::<IpAddr>().ok().map(Family::of))
            })
            .or_else(|| s.src.map(|n| n.family()))
            .or_else(|| s.gateway.map(Family::of))
            .or_else(|| s.multipath.iter().find_map(|p| p.gateway.map(Family::of)))
            .unwrap_or(Family::V4);
        s.family = guess;
        match dst_text {
            Some(d) => {
                let net = Net::parse(d, Some(guess))?;
                let given: Option<IpAddr> = d.split('/').next().and_then(|a| a.parse().ok());
                if guess == Family::V4 && given.is_some_and(|a| a != net.addr()) {
                    return Err("Error: Invalid prefix for given prefix length.".into());
                }
                s.dst = Some(net);
            }
            None if !delete => return Err("route: a destination is needed".into()),
            None => {}
        }
        if let Some(src) = s.src {
            if src.family() != guess {
                return Err("route: `from` is of another family".into());
            }
        }
        if let Some(p) = s.prefsrc {
            if Family::of(p) != guess {
                return Err("route: `src` is of another family".into());
            }
        }
        if s.tos != 0 && guess == Family::V6 {
            return Err("route: `tos` is for IPv4 routes".into());
        }
        Ok(s)
    }

    fn route(&self) -> Result<Route, String> {
        let family = self.family;
        let kind = self.kind.unwrap_or(RouteType::Unicast);
        let dst = self.dst.expect("checked for adds");
        let has_gw = self.gateway.is_some() || !self.multipath.is_empty() || self.nhid.is_some();
        if self.gateway.is_some_and(|g| Family::of(g) != family) && family == Family::V6 {
            return Err("route: an IPv6 route needs an IPv6 gateway".into());
        }
        let paths = if let Some(id) = self.nhid {
            if self.gateway.is_some() || self.dev.is_some() || !self.multipath.is_empty() {
                return Err(
                    "Error: Nexthop specification and nexthop id are mutually exclusive.".into(),
                );
            }
            Paths::Object(id)
        } else if !self.multipath.is_empty() {
            if self.gateway.is_some() {
                return Err("route: `via` and `nexthop` together".into());
            }
            let mut v = self.multipath.clone();
            for p in v.iter_mut() {
                if p.dev == 0 {
                    p.dev = self.dev.unwrap_or(0);
                }
            }
            Paths::own(v)
        } else if kind.is_reject() {
            Paths::None
        } else {
            match (self.gateway, self.dev) {
                (None, None) if family == Family::V4 => {
                    return Err("Error: Device for nexthop is not up.".into())
                }
                (None, None) => return Err("RTNETLINK answers: No such device".into()),
                (gateway, dev) => Paths::own(vec![Path {
                    gateway,
                    dev: dev.unwrap_or(0),
                    weight: 1,
                    onlink: self.onlink,
                    dead: false,
                    scope: 0,
                }]),
            }
        };
        let metric = self.metric.unwrap_or(if family == Family::V6 {
            IPV6_USER_METRIC
        } else {
            0
        });
        let scope = match family {
            Family::V4 => self.scope.unwrap_or(kind.default_scope(has_gw)),
            Family::V6 => SCOPE_UNIVERSE,
        };
        let table = self.table.unwrap_or(if kind == RouteType::Local {
            TABLE_LOCAL
        } else {
            TABLE_MAIN
        });
        Ok(Route::new(
            dst,
            RouteBody {
                table,
                src: self.src.unwrap_or(Net::default_of(family)),
                tos: self.tos,
                metric,
                protocol: self.protocol.unwrap_or(PROTO_BOOT),
                scope,
                kind,
                prefsrc: self.prefsrc,
                mtu: self.mtu,
                hoplimit: self.hoplimit,
                paths,
                pref: self.pref,
            },
        ))
    }

    fn filter(&self) -> RouteFilter {
        RouteFilter {
            table: self.table.or(if self.kind == Some(RouteType::Local) {
                Some(TABLE_LOCAL)
            } else {
                None
            }),
            dst: self.dst,
            src: self.src,
            tos: self.tos,
            metric: self.metric.unwrap_or(0),
            kind: self.kind,
            scope: self.scope,
            protocol: self.protocol,
            prefsrc: self.prefsrc,
            gateway: self
                .gateway
                .or_else(|| self.multipath.first().and_then(|p| p.gateway)),
            dev: self.dev,
            nhid: self.nhid,
        }
    }
}

fn via_value(w: &mut Words) -> Result<IpAddr, String> {
    let mut v = w.value("via")?;
    if matches!(v, "inet" | "inet6") {
        v = w.value("via")?;
    }
    parse_addr(v)
}

// ----- rule -----

fn rule(state: &mut State, w: &mut Words, family: Option<Family>) -> Result<(), String> {
    let verb = w.next().ok_or("rule: add, del or flush?")?;
    let add = match verb {
        "add" | "a" => true,
        "del" | "delete" | "d" => false,
        "flush" => {
            for f in family.map_or(vec![Family::V4, Family::V6], |f| vec![f]) {
                state.flush_rules(f);
            }
            return Ok(());
        }
        other => {
            return Err(format!(
                "rule: unsupported command {} (add, del, flush)",
                quote(other)
            ))
        }
    };
    let mut r = Rule::new(
        family.unwrap_or(Family::V4),
        0,
        RuleAction::Lookup(TABLE_MAIN),
    );
    let (mut pref_given, mut action_given) = (false, false);
    let (mut src_text, mut dst_text) = (None, None);
    let range = |v: &str, of: &str| -> Result<Range, String> {
        let (a, b) = v.split_once('-').unwrap_or((v, v));
        let a =
            parse_u32(a).ok_or_else(|| format!("{of}: {} is not a number or range", quote(v)))?;
        let b =
            parse_u32(b).ok_or_else(|| format!("{of}: {} is not a number or range", quote(v)))?;
        // The kernel's checks, in its words: ports 1 to 65534, a range not reversed.
        let port = of != "uidrange";
        if a > b || port && (a == 0 || b >= 0xffff) {
            let what = if port { of } else { "uid" };
            return Err(Refused::explained(&format!("Invalid {what} range")).to_string());
        }
        Ok(Range { start: a, end: b })
    };
    while let Some(word) = w.next() {
        match word {
            "not" => r.invert = true,
            "from" => src_text = Some(w.value("from")?),
            "to" => dst_text = Some(w.value("to")?),
            "iif" | "dev" => r.iif = Some(state.rule_link(w.value("iif")?)),
            "oif" => r.oif = Some(state.rule_link(w.value("oif")?)),
            "fwmark" => {
                let v = w.value("fwmark")?;
                let (m, mask) = v.split_once('/').unwrap_or((v, "0xffffffff"));
                let m =
                    parse_u32(m).ok_or_else(|| format!("fwmark {} is not a number", quote(v)))?;
                let mask = parse_u32(mask)
                    .ok_or_else(|| format!("fwmark mask {} is not a number", quote(v)))?;
                r.fwmark = Some((m, mask));
            }
            "tos" | "dsfield" => {
                let v = w.value(word)?;
                let t = parse_u32(v)
                    .and_then(|t| u8::try_from(t).ok())
                    .ok_or_else(|| format!("{} is not a TOS", quote(v)))?;
                r.tos = Some(t);
            }
            "dscp" => {
                let v = w.number("dscp")?;
                if v > 63 {
                    return Err(format!("dscp {v} (0 to 63)"));
                }
                r.tos = Some((v as u8) << 2);
            }
            "ipproto" => {
                let v = w.value("ipproto")?;
                r.ipproto = Some(
                    parse_ipproto(v)
                        .ok_or_else(|| format!("{} is not an IP protocol", quote(v)))?,
                );
            }
            "sport" => r.sport = Some(range(w.value("sport")?, "sport")?),
            "dport" => r.dport = Some(range(w.value("dport")?, "dport")?),
            "uidrange" => r.uidrange = Some(range(w.value("uidrange")?, "uidrange")?),
            "pref" | "priority" | "order" => {
                r.pref = w.number(word)?;
                pref_given = true;
            }
            "lookup" | "table" => {
                let v = w.value(word)?;
                r.action = RuleAction::Lookup(
                    parse_table(v).ok_or_else(|| format!("{} is not a table", quote(v)))?,
                );
                action_given = true;
            }
            "goto" => {
                r.action = RuleAction::Goto(w.number("goto")?);
                action_given = true;
            }
            "nop" => {
                r.action = RuleAction::Nop;
                action_given = true;
            }
            "blackhole" | "unreachable" | "prohibit" => {
                r.action = match word {
                    "blackhole" => RuleAction::Blackhole,
                    "unreachable" => RuleAction::Unreachable,
                    _ => RuleAction::Prohibit,
                };
                action_given = true;
            }
            "suppress_prefixlength" | "sup_pl" => {
                let v = w.number(word)?;
                r.suppress_prefixlength =
                    Some(u8::try_from(v).map_err(|_| format!("suppress_prefixlength {v}"))?);
            }
            "suppress_ifgroup" | "sup_group" => r.suppress_ifgroup = Some(w.number(word)?),
            "protocol" | "proto" => {
                let v = w.value(word)?;
                r.protocol =
                    parse_protocol(v).ok_or_else(|| format!("{} is not a protocol", quote(v)))?;
            }
            other => return Err(format!("rule: unsupported option {}", quote(other))),
        }
    }
    let guess = family
        .or_else(|| {
            src_text
                .filter(|t| *t != "all")
                .and_then(|t| t.split('/').next()?.parse::<IpAddr>().ok().map(Family::of))
        })
        .or_else(|| {
            dst_text
                .filter(|t| *t != "all")
                .and_then(|t| t.split('/').next()?.parse::<IpAddr>().ok().map(Family::of))
        })
        .unwrap_or(Family::V4);
    r.family = guess;
    for (text, slot) in [(src_text, &mut r.src), (dst_text, &mut r.dst)] {
        if let Some(t) = text {
            let n = Net::parse(t, Some(guess))?;
            // A prefix of length 0 is no selector at all (`from all`), whatever its bits.
            *slot = Some(n).filter(|n| n.len() > 0);
        }
    }
    if add {
        if r.action == RuleAction::Lookup(0) {
            return Err("rule: table 0".into());
        }
        state.add_rule(r, pref_given).map_err(refused)
    } else {
        state
            .del_rule(guess, &r, pref_given, action_given)
            .map_err(refused)
    }
}

// ----- nexthop -----

fn nexthop(state: &mut State, w: &mut Words, family: Option<Family>) -> Result<(), String> {
    let verb = w.next().ok_or("nexthop: add, replace or del?")?;
    let (mut id, mut gateway, mut dev, mut onlink) = (None, None, None, false);
    let (mut blackhole, mut group, mut protocol) = (false, None, PROTO_UNSPEC);
    while let Some(word) = w.next() {
        match word {
            "id" => id = Some(w.number("id")?),
            "via" => gateway = Some(via_value(w)?),
            "dev" => dev = Some(dev_index(state, w.value("dev")?)?),
            "onlink" => onlink = true,
            "blackhole" => blackhole = true,
            "proto" | "protocol" => {
                let v = w.value(word)?;
                protocol =
                    parse_protocol(v).ok_or_else(|| format!("{} is not a protocol", quote(v)))?;
            }
            "group" => {
                let v = w.value("group")?;
                let mut members = Vec::new();
                for m in v.split('/') {
                    let (i, wt) = m.split_once(',').unwrap_or((m, "1"));
                    let i = parse_u32(i)
                        .ok_or_else(|| format!("group member {} is not an id", quote(m)))?;
                    let wt = parse_u32(wt)
                        .filter(|x| (1..=256).contains(x))
                        .ok_or_else(|| format!("group weight in {} (1 to 256)", quote(m)))?;
                    members.push((i, wt as u16));
                }
                group = Some(members);
            }
            "type" => {
                let v = w.value("type")?;
                if v != "mpath" {
                    return Err(format!(
                        "nexthop group type {} is not supported (mpath)",
                        quote(v)
                    ));
                }
            }
            other => return Err(format!("nexthop: unsupported option {}", quote(other))),
        }
    }
    let id = id.ok_or("nexthop: `id N` is needed")?;
    match verb {
        "del" | "delete" | "d" => state.del_nexthop(id).map_err(refused),
        "add" | "a" | "replace" => {
            let fam = family.or(gateway.map(Family::of)).unwrap_or(Family::V4);
            let kind = match (blackhole, group) {
                (true, None) if gateway.is_none() && dev.is_none() => NexthopKind::Blackhole,
                (false, Some(g)) if gateway.is_none() && dev.is_none() => NexthopKind::Group(g),
                (false, None) => NexthopKind::Path {
                    gateway,
                    dev: dev.ok_or(
                        "Error: Device attribute required for non-blackhole and non-fdb nexthops.",
                    )?,
                    onlink,
                },
                _ => return Err("nexthop: a blackhole, a group, or a path: not several".into()),
            };
            state
                .add_nexthop(
                    Nexthop {
                        id,
                        family: fam,
                        kind,
                        protocol,
                    },
                    verb == "replace",
                )
                .map_err(refused)
        }
        other => Err(format!(
            "nexthop: unsupported command {} (add, replace, del)",
            quote(other)
        )),
    }
}
