//! The compiled snapshot against a plain reference. The snapshot answers through compiled
//! structures: one LPM structure per table with links to shorter prefixes for
//! backtracking, IPv4's `local` and `main` merged into one structure while no rule was
//! added or deleted, the rule walk skipped then, `goto` targets resolved ahead. The
//! reference here does none of that: it walks the rules one by one and scans every route
//! of a table for the longest prefixes that hold the destination. Random configurations
//! (routes of every type in several tables, metrics, TOS, IPv4 source routes, rules with
//! selectors and every action, links going down) and random flows must get the same answer from both.

mod common;

use fibre_fib::names::{SCOPE_LINK, TABLE_DEFAULT, TABLE_LOCAL, TABLE_MAIN};
use fibre_fib::{config, Family, LinkIndex, NoRoute, Paths, Query, Route, RouteType, RuleAction};
use fibre_fib::{Rule, State};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::net::IpAddr;

/// A path's gateway (as used) and link (`None` unless unicast: local delivery is by `lo`).
type Hop = (Option<IpAddr>, Option<LinkIndex>);

/// What a flow is answered: the route's type and table and the hops it may take (one,
/// or one of a multipath route's live paths, chosen by the flow's hash), or the error.
type Outcome = Result<(RouteType, Option<u32>, Vec<Hop>), NoRoute>;

enum Found {
    Hit(Route, u8),
    Reject(NoRoute),
    Miss,
}

/// The longest prefixes holding `q.dst` first, each prefix's routes in the kernel's
/// order; the first that fits answers.
fn scan(routes: Vec<Route>, q: &Query) -> Found {
    // IPv4 source routes (fibre's own): a route with a source prefix fits only a flow
    // from inside it, and ranks before the same destination's shorter source prefixes.
    let src = q.src.unwrap_or(Family::of(q.dst).any());
    let mut fitting: Vec<Route> = routes
        .into_iter()
        .filter(|r| r.dst.contains(q.dst) && r.src.contains(src))
        .collect();
    // A stable sort keeps each prefix's routes in order (and local's before main's).
    fitting.sort_by_key(|r| std::cmp::Reverse((r.dst.len(), r.src.len())));
    for r in fitting {
        if r.family() == Family::V4 && r.tos != 0 && r.tos != q.tos & 0x1c {
            continue;
        }
        match r.kind {
            RouteType::Blackhole => return Found::Reject(NoRoute::Invalid),
            RouteType::Unreachable => return Found::Reject(NoRoute::HostUnreachable),
            RouteType::Prohibit => return Found::Reject(NoRoute::Prohibited),
            RouteType::Throw => return Found::Miss,
            _ => {}
        }
        if let Paths::Own(paths) = &r.paths {
            if paths.iter().any(|p| !p.dead) {
                let len = r.dst.len();
                return Found::Hit(r, len);
            }
        }
    }
    Found::Miss
}

fn table(state: &State, family: Family, ids: &[u32]) -> Vec<Route> {
    ids.iter()
        .flat_map(|&t| state.routes(family, Some(t)))
        .collect()
}

fn outcome(r: &Route, table: u32) -> Outcome {
    let Paths::Own(paths) = &r.paths else {
        unreachable!("the configurations have no nexthop objects")
    };
    let unicast = r.kind == RouteType::Unicast;
    let hops = paths
        .iter()
        .filter(|p| !p.dead)
        .map(|p| {
            let via = p.gateway.filter(|g| g.is_ipv6() || p.scope == SCOPE_LINK);
            (via, unicast.then_some(p.dev))
        })
        .collect();
    Ok((r.kind, Some(table), hops))
}

/// The reference: rules one by one, tables scanned.
fn reference(state: &State, q: &Query) -> Outcome {
    let family = Family::of(q.dst);
    if family == Family::V4 && !state.v4_custom_rules() {
        // No rule ever added: `main` (holding `local` too) and then `default`.
        for (ids, shown) in [
            (&[TABLE_LOCAL, TABLE_MAIN][..], TABLE_MAIN),
            (&[TABLE_DEFAULT][..], TABLE_DEFAULT),
        ] {
            match scan(table(state, family, ids), q) {
                Found::Hit(r, _) => return outcome(&r, shown),
                Found::Reject(e) => return Err(e),
                Found::Miss => {}
            }
        }
        return Err(NoRoute::NetworkUnreachable);
    }
    let rules: &[Rule] = state.rules(family);
    let mut i = 0;
    while i < rules.len() {
        let rule = &rules[i];
        i += 1;
        if !matches(rule, q) {
            continue;
        }
        match rule.action {
            RuleAction::Goto(pref) => {
                if let Some(t) = rules.iter().position(|r| r.pref == pref) {
                    i = t;
                }
            }
            RuleAction::Nop => {}
            RuleAction::Blackhole => return Err(NoRoute::Invalid),
            RuleAction::Unreachable => return Err(NoRoute::NetworkUnreachable),
            RuleAction::Prohibit => return Err(NoRoute::Prohibited),
            RuleAction::Lookup(t) => match scan(table(state, family, &[t]), q) {
                Found::Hit(r, len) => {
                    if rule.suppress_prefixlength.is_some_and(|p| len <= p) {
                        continue;
                    }
                    return outcome(&r, t);
                }
                Found::Reject(e) => return Err(e),
                Found::Miss => {}
            },
        }
    }
    Err(NoRoute::NetworkUnreachable)
}

/// A rule's selectors for a flow this host sends (input link `lo`).
fn matches(rule: &Rule, q: &Query) -> bool {
    let lo = 1;
    let all = rule.iif.as_ref().is_none_or(|l| l.index == Some(lo))
        && rule.oif.is_none()
        && rule.fwmark.is_none_or(|(m, mask)| (m ^ q.mark) & mask == 0)
        && rule.uidrange.is_none_or(|u| u.contains(q.uid))
        && rule
            .src
            .is_none_or(|s| s.contains(q.src.unwrap_or(s.family().any())))
        && rule.dst.is_none_or(|d| d.contains(q.dst))
        && rule.tos.is_none_or(|t| t == q.tos & 0xfc)
        && rule.ipproto.is_none_or(|p| p == q.ipproto)
        && rule.sport.is_none_or(|r| r.contains(q.sport as u32))
        && rule.dport.is_none_or(|r| r.contains(q.dport as u32));
    all != rule.invert
}

const BASE: &str = "
link set lo up
link add a0 type veth peer name a1
link add b0 type veth peer name b1
link set a0 up
link set a1 up
link set b0 up
link set b1 up
addr add 10.0.0.1/24 dev a0
addr add 10.0.1.1/24 dev b0
-6 addr add 2001:db8::1/64 dev a0 nodad
-6 addr add 2001:db8:1::1/64 dev b0 nodad
";

fn pick<'a>(rng: &mut SmallRng, items: &[&'a str]) -> &'a str {
    items[rng.gen_range(0..items.len())]
}

fn line(rng: &mut SmallRng, with_rules: bool) -> String {
    let v6 = rng.gen_bool(0.3);
    if with_rules && rng.gen_bool(0.25) {
        let mut s = format!("{}rule add", if v6 { "-6 " } else { "" });
        if rng.gen_bool(0.1) {
            s += " not";
        }
        s += pick(
            rng,
            &[
                "",
                " fwmark 1",
                " fwmark 0x10/0xf0",
                " ipproto tcp",
                " dport 80",
                " uidrange 1000-1999",
                " iif lo",
                " oif a0",
            ],
        );
        if !v6 && rng.gen_bool(0.2) {
            s += &format!(" to 10.{}.0.0/16", rng.gen_range(1..4));
        }
        if !v6 && rng.gen_bool(0.1) {
            s += " tos 0x10";
        }
        let pref = rng.gen_range(1..60) * 10;
        s += &match rng.gen_range(0..10) {
            0 => format!(" goto {}", pref + 10 * rng.gen_range(1..4)),
            1 => " nop".into(),
            2 => " blackhole".into(),
            3 => " prohibit".into(),
            4 => " unreachable".into(),
            5 => format!(
                " lookup {} suppress_prefixlength {}",
                pick(rng, &["main", "10"]),
                pick(rng, &["0", "8", "16", "24"])
            ),
            _ => format!(
                " lookup {}",
                pick(rng, &["10", "20", "main", "local", "default"])
            ),
        };
        return s + &format!(" pref {pref}");
    }
    if rng.gen_bool(0.03) {
        return format!(
            "link set {} {}",
            pick(rng, &["b0", "b1"]),
            pick(rng, &["up", "down"])
        );
    }
    let op = pick(
        rng,
        &["add", "add", "add", "replace", "append", "prepend", "del"],
    );
    let table = pick(
        rng,
        &[
            "",
            "",
            " table 10",
            " table 20",
            " table default",
            " table local",
        ],
    );
    let kind = pick(
        rng,
        &[
            "",
            "",
            "",
            "",
            "blackhole ",
            "unreachable ",
            "prohibit ",
            "throw ",
        ],
    );
    let metric = pick(rng, &["", "", " metric 5", " metric 10"]);
    if v6 {
        let len = pick(rng, &["16", "32", "48", "64", "128", "0"]);
        let dst = format!(
            "2001:db8:{:x}::{:x}/{len}",
            rng.gen_range(2..6),
            rng.gen_range(0..3)
        );
        let via = if kind.is_empty() {
            pick(rng, &[" via 2001:db8::2", " via 2001:db8:1::3", " dev b0"])
        } else {
            ""
        };
        format!("-6 route {op} {kind}{dst}{via}{table}{metric}")
    } else {
        let dst = if rng.gen_bool(0.15) {
            // Prefixes the addresses' own routes have too: local, broadcast, connected.
            pick(
                rng,
                &[
                    "10.0.0.1/32",
                    "10.0.0.0/24",
                    "10.0.0.255/32",
                    "10.0.0.0/32",
                    "0.0.0.0/0",
                ],
            )
            .to_string()
        } else {
            let len = *[0u8, 8, 16, 20, 24, 28, 32]
                .get(rng.gen_range(0..7))
                .expect("in range");
            let addr =
                u32::from_be_bytes([10, rng.gen_range(0..4), rng.gen_range(0..4), rng.gen()]);
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            format!("{}/{len}", std::net::Ipv4Addr::from(addr & mask))
        };
        let via = if kind.is_empty() {
            pick(
                rng,
                &[" via 10.0.0.2", " via 10.0.1.3", " dev a0", " dev b0"],
            )
        } else {
            ""
        };
        let tos = pick(rng, &["", "", "", " tos 0x10"]);
        let from = pick(
            rng,
            &[
                "",
                "",
                "",
                "",
                " from 10.0.0.0/24",
                " from 10.0.0.1",
                " from 10.0.0.0/16",
                " from 10.0.1.0/24",
                " from 0.0.0.0/1",
            ],
        );
        format!("route {op} {kind}{dst}{from}{via}{table}{tos}{metric}")
    }
}

fn flow(rng: &mut SmallRng) -> Query {
    let dst: IpAddr = if rng.gen_bool(0.3) {
        format!(
            "2001:db8:{:x}::{:x}",
            rng.gen_range(0..6),
            rng.gen_range(0..4)
        )
        .parse()
        .expect("address")
    } else if rng.gen_bool(0.2) {
        IpAddr::from([
            10,
            0,
            0,
            *[0, 1, 2, 255].get(rng.gen_range(0..4)).expect("in range"),
        ])
    } else {
        IpAddr::from([10, rng.gen_range(0..4), rng.gen_range(0..4), rng.gen()])
    };
    let mut q = Query::to(dst);
    if dst.is_ipv4() && rng.gen_bool(0.4) {
        // One of the host's own addresses: what source routes choose by.
        q.src = Some(IpAddr::from([10, 0, rng.gen_range(0..2), 1]));
    }
    q.mark = *[0, 1, 0x15].get(rng.gen_range(0..3)).expect("in range");
    q.uid = if rng.gen_bool(0.3) { 1500 } else { 0 };
    if rng.gen_bool(0.2) {
        q.tos = 0x10;
    }
    if rng.gen_bool(0.3) {
        q.ipproto = 6;
        q.dport = if rng.gen_bool(0.5) { 80 } else { 443 };
    }
    q
}

fn run(seed: u64, with_rules: bool) -> (usize, Vec<String>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut state = State::new();
    for l in BASE.lines().map(str::trim).filter(|l| !l.is_empty()) {
        config::apply_line(&mut state, l).expect("base configuration");
    }
    for _ in 0..300 {
        let l = line(&mut rng, with_rules);
        let mut next = state.clone();
        if config::apply_line(&mut next, &l).is_ok() {
            state = next;
        }
    }
    let snapshot = state.snapshot();
    let mut differ = Vec::new();
    let n = 5_000;
    let flows: Vec<Query> = (0..n).map(|_| flow(&mut rng)).collect();
    let mut batched = vec![Err(NoRoute::NetworkUnreachable); n];
    snapshot.lookup_batch(&flows, &mut batched);
    let grouped = common::batched_in_groups(&snapshot, &flows);
    for ((q, in_batch), in_group) in flows.iter().zip(&batched).zip(&grouped) {
        let hop = snapshot.lookup(q);
        if (hop != *in_batch || hop.map(fibre_fib::Hop::from) != *in_group) && differ.len() < 5 {
            differ.push(format!(
                "{q:?}\n  lookup:  {hop:?}\n  batched: {in_batch:?}\n  in groups: {in_group:?}"
            ));
        }
        let q = q.clone();
        let fast = snapshot.route(&q).map(|a| {
            let hop = (a.gateway, (a.kind == RouteType::Unicast).then_some(a.dev));
            (a.kind, a.table, hop)
        });
        let cut = fast.as_ref().map(|(k, t, (gateway, _))| (*k, *t, *gateway));
        if cut != hop.as_ref().map(|h| (h.kind, h.table, h.gateway)) && differ.len() < 5 {
            differ.push(format!("{q:?}\n  route:  {fast:?}\n  lookup: {hop:?}"));
        }
        let slow = reference(&state, &q);
        let same = match (&fast, &slow) {
            (Ok((k, t, hop)), Ok((rk, rt, hops))) => k == rk && t == rt && hops.contains(hop),
            (Err(a), Err(b)) => a == b,
            _ => false,
        };
        if !same && differ.len() < 5 {
            differ.push(format!(
                "{q:?}\n  snapshot:  {fast:?}\n  reference: {slow:?}"
            ));
        }
    }
    (n, differ)
}

#[test]
fn merged_default_rule_lookups_answer_as_the_plain_walk() {
    let mut total = 0;
    for seed in 0..20 {
        let (n, differ) = run(seed, false);
        total += n;
        assert!(differ.is_empty(), "seed {seed}:\n{}", differ.join("\n"));
    }
    assert_eq!(total, 100_000);
}

#[test]
fn rule_walks_answer_as_the_plain_walk() {
    let mut total = 0;
    for seed in 100..120 {
        let (n, differ) = run(seed, true);
        total += n;
        assert!(differ.is_empty(), "seed {seed}:\n{}", differ.join("\n"));
    }
    assert_eq!(total, 100_000);
}

/// IPv4 source routes, which the kernel lacks: the longest destination first, then the
/// longest source prefix holding the flow's source, then the destination's source-less
/// routes; `route del` with `from` removes only the route of that source prefix.
#[test]
fn ipv4_source_routes_choose_by_destination_then_source() {
    let mut state = State::new();
    let config = "
        route add 10.8.0.0/16 via 10.0.0.2
        route add 10.8.0.0/16 from 10.0.1.0/24 via 10.0.1.2
        route add 10.8.0.0/16 from 10.0.1.1 via 10.0.1.3
        route add unreachable 10.8.1.0/24 from 10.0.0.0/24
    ";
    for l in BASE.lines().chain(config.lines()).map(str::trim) {
        if !l.is_empty() {
            config::apply_line(&mut state, l).expect("configuration");
        }
    }
    let via = |state: &State, dst: [u8; 4], src: Option<[u8; 4]>| {
        let mut q = Query::to(IpAddr::from(dst));
        q.src = src.map(IpAddr::from);
        let snapshot = state.snapshot();
        let hop = snapshot.lookup(&q).map(|h| h.gateway);
        let answer = snapshot.route(&q).map(|a| a.gateway);
        assert_eq!(hop, answer, "lookup and route differ for {q:?}");
        answer
    };
    let gw = |a: [u8; 4]| Ok(Some(IpAddr::from(a)));
    assert_eq!(via(&state, [10, 8, 0, 9], None), gw([10, 0, 0, 2]));
    assert_eq!(
        via(&state, [10, 8, 0, 9], Some([10, 0, 0, 1])),
        gw([10, 0, 0, 2])
    );
    assert_eq!(
        via(&state, [10, 8, 0, 9], Some([10, 0, 1, 1])),
        gw([10, 0, 1, 3])
    );
    // The /24's unreachable route is for sources in 10.0.0.0/24 only; others fall back
    // to the /16's routes.
    assert_eq!(
        via(&state, [10, 8, 1, 9], Some([10, 0, 0, 1])),
        Err(NoRoute::HostUnreachable)
    );
    assert_eq!(
        via(&state, [10, 8, 1, 9], Some([10, 0, 1, 1])),
        gw([10, 0, 1, 3])
    );
    assert_eq!(via(&state, [10, 8, 1, 9], None), gw([10, 0, 0, 2]));
    config::apply_line(&mut state, "route del 10.8.0.0/16 from 10.0.1.1").expect("del");
    assert_eq!(
        via(&state, [10, 8, 0, 9], Some([10, 0, 1, 1])),
        gw([10, 0, 1, 2])
    );
    config::apply_line(&mut state, "route del 10.8.0.0/16").expect("del");
    assert_eq!(
        via(&state, [10, 8, 0, 9], Some([10, 0, 1, 1])),
        gw([10, 0, 1, 2])
    );
    assert_eq!(
        via(&state, [10, 8, 0, 9], None),
        Err(NoRoute::NetworkUnreachable)
    );
}

/// Flows arriving on a link (`iif`), which the reference does not model: an IPv4 flow's
/// source is checked as the kernel checks it, an IPv6 flow prefers routes leaving by its
/// link, on the plain answers where those decide, by the full walk otherwise. The forwarding lookup, one flow at a time and batched, must give what
/// the full answer gives, with and without rules, for sources that are this host's,
/// broadcast, on a link, routed elsewhere or routed nowhere.
#[test]
fn arriving_flows_answer_alike_one_by_one_batched_and_in_full() {
    let sources: [IpAddr; 7] = [
        IpAddr::from([10, 0, 0, 1]),
        IpAddr::from([10, 0, 0, 255]),
        IpAddr::from([10, 0, 0, 7]),
        IpAddr::from([10, 0, 1, 7]),
        IpAddr::from([10, 2, 3, 4]),
        IpAddr::from([192, 0, 2, 1]),
        IpAddr::from([127, 0, 0, 1]),
    ];
    let sources6: [IpAddr; 5] = [
        "2001:db8::1".parse().expect("address"),
        "2001:db8:1::7".parse().expect("address"),
        "fe80::1".parse().expect("address"),
        "ff02::1".parse().expect("address"),
        "::1".parse().expect("address"),
    ];
    let mut compared = 0;
    for seed in 200..230 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut state = State::new();
        for l in BASE.lines().map(str::trim).filter(|l| !l.is_empty()) {
            config::apply_line(&mut state, l).expect("base configuration");
        }
        for _ in 0..200 {
            let l = line(&mut rng, seed % 2 == 1);
            let mut next = state.clone();
            if config::apply_line(&mut next, &l).is_ok() {
                state = next;
            }
        }
        let snapshot = state.snapshot();
        let links: Vec<LinkIndex> = ["lo", "a0", "a1", "b0"]
            .iter()
            .map(|n| snapshot.links().find(|l| l.name == *n).expect("link").index)
            .collect();
        let flows: Vec<Query> = (0..2_000)
            .map(|_| {
                let mut q = flow(&mut rng);
                q.iif = Some(links[rng.gen_range(0..links.len())]);
                if q.dst.is_ipv4() {
                    q.src = rng
                        .gen_bool(0.9)
                        .then(|| sources[rng.gen_range(0..sources.len())]);
                } else {
                    q.src = rng
                        .gen_bool(0.5)
                        .then(|| sources6[rng.gen_range(0..sources6.len())]);
                    if rng.gen_bool(0.1) {
                        q.dst = sources6[rng.gen_range(0..sources6.len())];
                    }
                }
                q
            })
            .collect();
        let mut batched = vec![Err(NoRoute::NetworkUnreachable); flows.len()];
        snapshot.lookup_batch(&flows, &mut batched);
        let grouped = common::batched_in_groups(&snapshot, &flows);
        for ((q, in_batch), in_group) in flows.iter().zip(&batched).zip(&grouped) {
            let hop = snapshot.lookup(q);
            let full = snapshot
                .route(q)
                .map(|a| (a.kind, a.table, a.dev, a.gateway));
            let cut = hop.map(|h| (h.kind, h.table, h.dev, h.gateway));
            assert_eq!(hop, *in_batch, "seed {seed}: {q:?} one by one and batched");
            assert_eq!(
                hop.map(fibre_fib::Hop::from),
                *in_group,
                "seed {seed}: {q:?} one by one and batched with flows alike"
            );
            assert_eq!(cut, full, "seed {seed}: {q:?} lookup and route");
            compared += 1;
        }
    }
    assert_eq!(compared, 60_000);
}
