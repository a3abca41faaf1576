//! Answers and listings printed as `ip` prints them: JSON with the keys of `ip -d -j`, and
//! text in `ip`'s words.

use crate::layout::Snapshot;
use crate::link::{mac_string, Link, LinkIndex};
use crate::names::*;
use crate::net::{ip_text, Family, IpText};
use crate::nexthop::NexthopKind;
use crate::query::Answer;
use crate::route::{Path, Paths, Route, RouteType};
use crate::rule::{Rule, RuleAction};
use crate::state::State;
use serde_json::{json, Map, Value};

fn name_of(links: &dyn Fn(LinkIndex) -> Option<String>, index: LinkIndex) -> String {
    links(index).unwrap_or_else(|| format!("if{index}"))
}

fn pref_name(p: u8) -> &'static str {
    match p {
        1 => "high",
        3 => "low",
        _ => "medium",
    }
}

/// An answer as `ip -d -j route get` prints it (one object; `ip` wraps it in a list).
pub fn answer_json(snap: &Snapshot, a: &Answer) -> Value {
    let names = |i: LinkIndex| snap.link(i).map(|l| l.name.clone());
    let v6 = Family::of(a.dst) == Family::V6;
    let mut m = Map::new();
    m.insert("type".into(), json!(a.kind.name()));
    m.insert("dst".into(), json!(ip_text(a.dst)));
    if let Some(f) = a.from {
        m.insert("from".into(), json!(ip_text(f)));
    } else if v6 {
        m.insert("from".into(), json!("::"));
    }
    if a.tos != 0 {
        m.insert("tos".into(), json!(format!("0x{:02x}", a.tos)));
    }
    if let Some(g) = a.gateway {
        m.insert("gateway".into(), json!(ip_text(g)));
    }
    m.insert("dev".into(), json!(name_of(&names, a.dev)));
    if let Some(t) = a.table {
        m.insert("table".into(), json!(table_name(t)));
    }
    if v6 {
        m.insert("protocol".into(), json!(protocol_name(a.protocol)));
        m.insert("scope".into(), json!("global"));
    }
    if let Some(s) = a.prefsrc {
        m.insert("prefsrc".into(), json!(ip_text(s)));
    }
    if v6 {
        m.insert("metric".into(), json!(a.metric));
    }
    // `ip route get` prints the flags of the route cache entry, which never carry
    // `linkdown` or `onlink` (`ip route show` does). The cache's multicast flag
    // (`RTCF_MULTICAST`) has the bit of `RTM_F_OFFLOAD_FAILED`, and `ip` names it so.
    let flags: &[&str] = if multicast_v4(a) {
        &["rt_offload_failed"]
    } else {
        &[]
    };
    m.insert("flags".into(), json!(flags));
    if a.mark != 0 && !v6 {
        m.insert("mark".into(), json!(a.mark));
    }
    if !v6 {
        if a.iif.is_none() {
            m.insert("uid".into(), json!(a.uid));
        }
        m.insert("cache".into(), json!(a.cache));
    }
    if let Some(metrics) = metrics_json(a.mtu, a.hoplimit) {
        m.insert("metrics".into(), metrics);
    }
    if let Some(i) = a.iif {
        m.insert("iif".into(), json!(name_of(&names, i)));
    }
    if v6 {
        m.insert("pref".into(), json!(pref_name(a.pref)));
    }
    Value::Object(m)
}

/// Whether an answer is an IPv4 multicast route cache entry.
fn multicast_v4(a: &Answer) -> bool {
    a.kind == RouteType::Multicast && a.dst.is_ipv4()
}

/// An answer as `ip route get` prints it.
pub fn answer_text(snap: &Snapshot, a: &Answer) -> String {
    let names = |i: LinkIndex| snap.link(i).map(|l| l.name.clone());
    let v6 = Family::of(a.dst) == Family::V6;
    let mut s = String::new();
    if a.kind != crate::route::RouteType::Unicast {
        s += a.kind.name();
        s += " ";
    }
    s += &ip_text(a.dst);
    if let Some(f) = a.from {
        s += &format!(" from {}", IpText(f));
    } else if v6 {
        s += " from ::";
    }
    if a.tos != 0 {
        s += &format!(" tos 0x{:02x}", a.tos);
    }
    if let Some(g) = a.gateway {
        s += &format!(" via {}", IpText(g));
    }
    s += &format!(" dev {}", name_of(&names, a.dev));
    if let Some(t) = a.table.filter(|&t| t != TABLE_MAIN) {
        s += &format!(" table {}", table_name(t));
    }
    if v6 {
        s += &format!(" proto {}", protocol_name(a.protocol));
    }
    if let Some(p) = a.prefsrc {
        s += &format!(" src {}", IpText(p));
    }
    if multicast_v4(a) {
        s += " rt_offload_failed";
    }
    if v6 {
        s += &format!(" metric {}", a.metric);
        s += &metrics_text(a.mtu, a.hoplimit);
    }
    if a.mark != 0 && !v6 {
        s += &format!(" mark 0x{:x}", a.mark);
    }
    if let Some(i) = a.iif {
        s += &format!(" iif {}", name_of(&names, i));
    } else if !v6 {
        s += &format!(" uid {}", a.uid);
    }
    if v6 {
        s += &format!(" pref {}", pref_name(a.pref));
    } else {
        s += "\n    cache";
        if !a.cache.is_empty() {
            s += &format!(" <{}>", a.cache.join(","));
        }
        s += &metrics_text(a.mtu, a.hoplimit);
    }
    s
}

/// A route's metrics as `ip -j` gives them (`metrics`), if it has any.
fn metrics_json(mtu: Option<u32>, hoplimit: Option<u8>) -> Option<Value> {
    let mut m = serde_json::Map::new();
    if let Some(mtu) = mtu {
        m.insert("mtu".into(), json!(mtu));
    }
    if let Some(h) = hoplimit {
        m.insert("hoplimit".into(), json!(h));
    }
    (!m.is_empty()).then(|| json!([Value::Object(m)]))
}

/// A route's metrics as `ip` prints them, each after a space, in the kernel's order.
fn metrics_text(mtu: Option<u32>, hoplimit: Option<u8>) -> String {
    let mut s = String::new();
    if let Some(mtu) = mtu {
        s += &format!(" mtu {mtu}");
    }
    if let Some(h) = hoplimit {
        s += &format!(" hoplimit {h}");
    }
    s
}

/// Whether the kernel flags path `p` of route `r` `linkdown`: its link has no carrier,
/// and it is not a path of this host's own (IPv4: of scope `nowhere`, a local route's;
/// IPv6: of a `local` or `anycast` route), which the kernel never flags.
fn linkdown(state: &State, r: &Route, p: &Path) -> bool {
    let own = match r.family() {
        Family::V4 => p.scope == SCOPE_NOWHERE,
        Family::V6 => matches!(r.kind, RouteType::Local | RouteType::Anycast),
    };
    !own && !state.carrier(p.dev)
}

/// A path's flags in `ip`'s order.
fn path_flags(state: &State, r: &Route, p: &Path) -> Vec<&'static str> {
    let mut flags = Vec::new();
    if p.dead {
        flags.push("dead");
    }
    if p.onlink {
        flags.push("onlink");
    }
    if linkdown(state, r, p) {
        flags.push("linkdown");
    }
    flags
}

/// The paths a route's nexthop object stands for (none for a blackhole), as a route's
/// own paths would be.
fn object_paths(state: &State, id: crate::nexthop::NexthopId) -> Vec<Path> {
    let path = |nh: &crate::nexthop::Nexthop, weight: u16| match &nh.kind {
        NexthopKind::Path {
            gateway,
            dev,
            onlink,
        } => Some(Path {
            gateway: *gateway,
            dev: *dev,
            weight,
            onlink: *onlink,
            dead: false,
            scope: if gateway.is_some() {
                SCOPE_LINK
            } else {
                SCOPE_HOST
            },
        }),
        _ => None,
    };
    match state.nexthop(id) {
        Some(nh) => match &nh.kind {
            NexthopKind::Group(members) => members
                .iter()
                .filter_map(|(m, w)| state.nexthop(*m).and_then(|nh| path(nh, *w)))
                .collect(),
            _ => path(nh, 1).into_iter().collect(),
        },
        None => Vec::new(),
    }
}

/// A route as `ip -d -j route show` lists it.
pub fn route_json(state: &State, r: &Route) -> Value {
    let names = |i: LinkIndex| state.link(i).map(|l| l.name.clone());
    let v6 = r.family() == Family::V6;
    let object = match r.paths {
        Paths::Object(id) => state.nexthop(id),
        _ => None,
    };
    let paths: Vec<Path> = match &r.paths {
        Paths::Own(p) => p.to_vec(),
        Paths::Object(id) => object_paths(state, *id),
        _ => Vec::new(),
    };
    let blackhole_object = object.is_some_and(|nh| nh.kind == NexthopKind::Blackhole);
    let mut m = Map::new();
    let kind = if blackhole_object {
        RouteType::Blackhole
    } else {
        r.kind
    };
    m.insert("type".into(), json!(kind.name()));
    m.insert(
        "dst".into(),
        json!(if r.dst.is_default() {
            "default".to_string()
        } else if r.dst.is_host() {
            ip_text(r.dst.addr())
        } else {
            r.dst.to_string()
        }),
    );
    if !r.src.is_default() {
        m.insert("from".into(), json!(r.src.to_string()));
    }
    if r.tos != 0 {
        m.insert("tos".into(), json!(format!("0x{:02x}", r.tos)));
    }
    if let Paths::Object(id) = r.paths {
        m.insert("nhid".into(), json!(id));
    }
    if paths.len() == 1 {
        if let Some(g) = paths[0].gateway {
            m.insert("gateway".into(), json!(ip_text(g)));
        }
        m.insert("dev".into(), json!(name_of(&names, paths[0].dev)));
    } else if paths.is_empty() && (blackhole_object || (v6 && kind.is_reject())) {
        // What the kernel sends nowhere it sends by the loopback.
        m.insert("dev".into(), json!(loopback_name(state)));
    }
    m.insert("table".into(), json!(table_name(r.table)));
    m.insert("protocol".into(), json!(protocol_name(r.protocol)));
    m.insert("scope".into(), json!(scope_name(r.scope)));
    if let Some(s) = r.prefsrc {
        m.insert("prefsrc".into(), json!(ip_text(s)));
    }
    if v6 || r.metric != 0 {
        m.insert("metric".into(), json!(r.metric));
    }
    let flags = match paths.as_slice() {
        [p] => path_flags(state, r, p),
        // An IPv4 route all of whose paths are down is flagged as a whole.
        [_, _, ..] if !v6 && paths.iter().all(|p| linkdown(state, r, p)) => vec!["linkdown"],
        _ => Vec::new(),
    };
    m.insert("flags".into(), json!(flags));
    if let Some(metrics) = metrics_json(r.mtu, r.hoplimit) {
        m.insert("metrics".into(), metrics);
    }
    if v6 {
        m.insert("pref".into(), json!(pref_name(r.pref)));
    }
    if let Some(nh) = object {
        m.insert("nh_info".into(), nexthop_json_with(state, nh, true));
    }
    if paths.len() > 1 {
        let hops: Vec<Value> = paths
            .iter()
            .map(|p| {
                let mut h = Map::new();
                if let Some(g) = p.gateway {
                    h.insert("gateway".into(), json!(ip_text(g)));
                }
                h.insert("dev".into(), json!(name_of(&names, p.dev)));
                h.insert("weight".into(), json!(p.weight));
                h.insert("flags".into(), json!(path_flags(state, r, p)));
                Value::Object(h)
            })
            .collect();
        m.insert("nexthops".into(), json!(hops));
    }
    Value::Object(m)
}

/// The loopback link's name.
fn loopback_name(state: &State) -> String {
    state
        .links()
        .find(|l| l.kind == crate::link::LinkKind::Loopback)
        .map_or_else(|| "lo".to_string(), |l| l.name.clone())
}

/// A route as `ip route show` lists it.
pub fn route_text(state: &State, r: &Route) -> String {
    let v = route_json(state, r);
    let get = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let mut s = String::new();
    let kind = get("type").unwrap_or_default();
    if kind != "unicast" {
        s += &kind;
        s += " ";
    }
    s += &get("dst").unwrap_or_default();
    if let Some(f) = get("from") {
        s += &format!(" from {f}");
    }
    if let Some(t) = get("tos") {
        s += &format!(" tos {t}");
    }
    if let Paths::Object(id) = r.paths {
        s += &format!(" nhid {id}");
    }
    if let Some(g) = get("gateway") {
        s += &format!(" via {g}");
    }
    if let Some(d) = get("dev") {
        s += &format!(" dev {d}");
    }
    if r.table != TABLE_MAIN {
        s += &format!(" table {}", table_name(r.table));
    }
    if r.protocol != PROTO_BOOT {
        s += &format!(" proto {}", protocol_name(r.protocol));
    }
    if r.scope != SCOPE_UNIVERSE {
        s += &format!(" scope {}", scope_name(r.scope));
    }
    if let Some(p) = r.prefsrc {
        s += &format!(" src {}", IpText(p));
    }
    if r.family() == Family::V6 || r.metric != 0 {
        s += &format!(" metric {}", r.metric);
    }
    let words = |flags: Option<&Value>| -> String {
        let flags = flags.and_then(|f| f.as_array()).into_iter().flatten();
        flags
            .filter_map(|f| f.as_str())
            .map(|f| format!(" {f}"))
            .collect()
    };
    s += &words(v.get("flags"));
    s += &metrics_text(r.mtu, r.hoplimit);
    if r.family() == Family::V6 {
        s += &format!(" pref {}", pref_name(r.pref));
    }
    for hop in v
        .get("nexthops")
        .and_then(|h| h.as_array())
        .into_iter()
        .flatten()
    {
        s += "\n\tnexthop";
        if let Some(g) = hop.get("gateway").and_then(|g| g.as_str()) {
            s += &format!(" via {g}");
        }
        s += &format!(
            " dev {} weight {}",
            hop.get("dev").and_then(|d| d.as_str()).unwrap_or("?"),
            hop.get("weight").and_then(|w| w.as_u64()).unwrap_or(1)
        );
        s += &words(hop.get("flags"));
    }
    s
}

/// A rule as `ip -j rule show` lists it.
pub fn rule_json(r: &Rule) -> Value {
    let mut m = Map::new();
    m.insert("priority".into(), json!(r.pref));
    if r.invert {
        m.insert("not".into(), json!(null));
    }
    match r.src {
        Some(s) => {
            m.insert("src".into(), json!(ip_text(s.addr())));
            if !s.is_host() {
                m.insert("srclen".into(), json!(s.len()));
            }
        }
        None => {
            m.insert("src".into(), json!("all"));
        }
    }
    if let Some(d) = r.dst {
        m.insert("dst".into(), json!(ip_text(d.addr())));
        if !d.is_host() {
            m.insert("dstlen".into(), json!(d.len()));
        }
    }
    if let Some(t) = r.tos {
        m.insert("tos".into(), json!(format!("0x{t:02x}")));
    }
    if let Some((mark, mask)) = r.fwmark {
        m.insert("fwmark".into(), json!(format!("0x{mark:x}")));
        if mask != u32::MAX {
            m.insert("fwmask".into(), json!(format!("0x{mask:x}")));
        }
    }
    if let Some(l) = &r.iif {
        m.insert("iif".into(), json!(l.name));
    }
    if let Some(l) = &r.oif {
        m.insert("oif".into(), json!(l.name));
    }
    if let Some(u) = r.uidrange {
        m.insert("uid_start".into(), json!(u.start));
        m.insert("uid_end".into(), json!(u.end));
    }
    if let Some(p) = r.ipproto {
        m.insert("ipproto".into(), json!(ipproto_name(p)));
    }
    if let Some(p) = r.sport {
        m.insert("sport".into(), json!(p.start));
        if p.end != p.start {
            m.insert("sport_end".into(), json!(p.end));
        }
    }
    if let Some(p) = r.dport {
        m.insert("dport".into(), json!(p.start));
        if p.end != p.start {
            m.insert("dport_end".into(), json!(p.end));
        }
    }
    match r.action {
        RuleAction::Lookup(t) => {
            m.insert("table".into(), json!(table_name(t)));
        }
        RuleAction::Goto(p) => {
            m.insert("action".into(), json!("goto"));
            m.insert("target".into(), json!(p));
        }
        RuleAction::Nop => {
            m.insert("action".into(), json!("nop"));
        }
        RuleAction::Blackhole => {
            m.insert("action".into(), json!("blackhole"));
        }
        RuleAction::Unreachable => {
            m.insert("action".into(), json!("unreachable"));
        }
        RuleAction::Prohibit => {
            m.insert("action".into(), json!("prohibit"));
        }
    }
    if let Some(p) = r.suppress_prefixlength {
        m.insert("suppress_prefixlen".into(), json!(p));
    }
    if let Some(g) = r.suppress_ifgroup {
        m.insert("suppress_ifgroup".into(), json!(g.to_string()));
    }
    // `ip rule` shows a rule's protocol unless it is unset or the kernel's own.
    if r.protocol != 0 && r.protocol != PROTO_KERNEL {
        m.insert("protocol".into(), json!(protocol_name(r.protocol)));
    }
    Value::Object(m)
}

/// A rule as `ip rule show` lists it.
pub fn rule_text(r: &Rule) -> String {
    let mut s = format!("{}:\t", r.pref);
    if r.invert {
        s += "not ";
    }
    s += &match r.src {
        Some(n) if n.is_host() => format!("from {}", n.addr()),
        Some(n) => format!("from {n}"),
        None => "from all".into(),
    };
    if let Some(d) = r.dst {
        s += &if d.is_host() {
            format!(" to {}", d.addr())
        } else {
            format!(" to {d}")
        };
    }
    if let Some(t) = r.tos {
        s += &format!(" tos 0x{t:02x}");
    }
    if let Some((mark, mask)) = r.fwmark {
        s += &format!(" fwmark 0x{mark:x}");
        if mask != u32::MAX {
            s += &format!("/0x{mask:x}");
        }
    }
    if let Some(l) = &r.iif {
        s += &format!(" iif {}", l.name);
    }
    if let Some(l) = &r.oif {
        s += &format!(" oif {}", l.name);
    }
    if let Some(u) = r.uidrange {
        s += &format!(" uidrange {}-{}", u.start, u.end);
    }
    if let Some(p) = r.ipproto {
        s += &format!(" ipproto {}", ipproto_name(p));
    }
    for (word, range) in [("sport", r.sport), ("dport", r.dport)] {
        if let Some(p) = range {
            s += &if p.start == p.end {
                format!(" {word} {}", p.start)
            } else {
                format!(" {word} {}-{}", p.start, p.end)
            };
        }
    }
    s += &match r.action {
        RuleAction::Lookup(t) => format!(" lookup {}", table_name(t)),
        RuleAction::Goto(p) => format!(" goto {p}"),
        RuleAction::Nop => " nop".into(),
        RuleAction::Blackhole => " blackhole".into(),
        RuleAction::Unreachable => " unreachable".into(),
        RuleAction::Prohibit => " prohibit".into(),
    };
    if let Some(p) = r.suppress_prefixlength {
        s += &format!(" suppress_prefixlength {p}");
    }
    if let Some(g) = r.suppress_ifgroup {
        s += &format!(" suppress_ifgroup {g}");
    }
    if r.protocol != 0 && r.protocol != PROTO_KERNEL {
        s += &format!(" proto {}", protocol_name(r.protocol));
    }
    s
}

/// A nexthop object as `ip -j nexthop show` lists it.
pub fn nexthop_json(state: &State, nh: &crate::nexthop::Nexthop) -> Value {
    nexthop_json_with(state, nh, false)
}

/// A nexthop object as `ip -j nexthop show` lists it, or with `detail` as `ip -d -j`
/// does (every object's scope and protocol; how a route's `nh_info` shows it).
fn nexthop_json_with(state: &State, nh: &crate::nexthop::Nexthop, detail: bool) -> Value {
    let mut m = Map::new();
    m.insert("id".into(), json!(nh.id));
    match &nh.kind {
        NexthopKind::Path {
            gateway,
            dev,
            onlink,
        } => {
            if let Some(g) = gateway {
                m.insert("gateway".into(), json!(ip_text(*g)));
            }
            m.insert(
                "dev".into(),
                json!(state.link(*dev).map_or(String::new(), |l| l.name.clone())),
            );
            m.insert(
                "scope".into(),
                json!(if gateway.is_some() { "link" } else { "host" }),
            );
            m.insert(
                "flags".into(),
                json!(if *onlink { vec!["onlink"] } else { vec![] }),
            );
        }
        NexthopKind::Blackhole => {
            if detail {
                m.insert("scope".into(), json!("global"));
            }
            m.insert("blackhole".into(), json!(null));
            m.insert("flags".into(), json!([]));
        }
        NexthopKind::Group(members) => {
            let g: Vec<Value> = members
                .iter()
                .map(|(id, w)| {
                    if *w == 1 {
                        json!({ "id": id })
                    } else {
                        json!({ "id": id, "weight": w })
                    }
                })
                .collect();
            m.insert("group".into(), json!(g));
            if detail {
                m.insert("scope".into(), json!("global"));
            }
            m.insert("flags".into(), json!([]));
        }
    }
    if detail || nh.protocol != PROTO_UNSPEC {
        // Before the flags, as `ip` prints it.
        let flags = m.remove("flags").unwrap_or(json!([]));
        m.insert("protocol".into(), json!(protocol_name(nh.protocol)));
        m.insert("flags".into(), flags);
    }
    Value::Object(m)
}

/// A link as `ip -j link show` lists it (the fields fibre holds).
pub fn link_json(state: &State, l: &Link) -> Value {
    let mut flags = Vec::new();
    if l.kind == crate::link::LinkKind::Loopback {
        flags.push("LOOPBACK");
    } else {
        flags.push("BROADCAST");
        flags.push("MULTICAST");
    }
    if l.up {
        flags.push("UP");
    }
    if state.carrier(l.index) {
        flags.push("LOWER_UP");
    }
    let mut m = Map::new();
    m.insert("ifindex".into(), json!(l.index));
    m.insert("ifname".into(), json!(l.name));
    if let crate::link::LinkKind::Veth { peer } = l.kind {
        m.insert(
            "link".into(),
            json!(state.link(peer).map_or(String::new(), |p| p.name.clone())),
        );
    }
    m.insert("flags".into(), json!(flags));
    m.insert("mtu".into(), json!(l.mtu));
    m.insert(
        "operstate".into(),
        json!(if l.kind == crate::link::LinkKind::Loopback {
            "UNKNOWN"
        } else if state.carrier(l.index) {
            "UP"
        } else {
            "DOWN"
        }),
    );
    m.insert(
        "group".into(),
        json!(if l.group == 0 {
            "default".to_string()
        } else {
            l.group.to_string()
        }),
    );
    m.insert(
        "link_type".into(),
        json!(if l.kind == crate::link::LinkKind::Loopback {
            "loopback"
        } else {
            "ether"
        }),
    );
    m.insert("address".into(), json!(mac_string(l.mac)));
    m.insert("kind".into(), json!(l.kind.name()));
    Value::Object(m)
}

/// The addresses of a link as `ip -j addr show` lists them (`addr_info`).
pub fn addr_json(state: &State, l: &Link) -> Value {
    let infos: Vec<Value> = state
        .addresses()
        .iter()
        .filter(|a| a.link == l.index)
        .map(|a| {
            let mut m = Map::new();
            m.insert("family".into(), json!(a.family().name()));
            m.insert("local".into(), json!(ip_text(a.local)));
            m.insert("prefixlen".into(), json!(a.len));
            if let Some(b) = a.broadcast {
                m.insert("broadcast".into(), json!(ip_text(b)));
            }
            m.insert("scope".into(), json!(scope_name(a.scope)));
            if a.secondary {
                m.insert("secondary".into(), json!(true));
            }
            if a.noprefixroute {
                m.insert("noprefixroute".into(), json!(true));
            }
            Value::Object(m)
        })
        .collect();
    json!({ "ifindex": l.index, "ifname": l.name, "addr_info": infos })
}

/// The text of an address (`inet 10.0.0.1/24 brd 10.0.0.255 scope global a0`).
pub fn addr_text(state: &State, a: &crate::link::Address) -> String {
    let mut s = format!("    {} {}/{}", a.family().name(), a.local, a.len);
    if let Some(b) = a.broadcast {
        s += &format!(" brd {b}");
    }
    s += &format!(" scope {}", scope_name(a.scope));
    if a.secondary {
        s += " secondary";
    }
    if a.noprefixroute {
        s += " noprefixroute";
    }
    if a.family() == Family::V4 {
        s += &format!(" {}", state.link(a.link).map_or("?", |l| &l.name));
    }
    s
}
