//! Fuzzes the configuration reader: every line type, on a realistic state, with values at
//! and past their edges, with words dropped, doubled, swapped and cut, and with arbitrary
//! text. The project's rule is that bad input gives `FILE:LINE: reason`, never a panic:
//! every line must be applied or refused with a short, one-line reason; every state a
//! line leaves must compile and answer queries without panicking; a file with one bad
//! line must name that line and change nothing. Queries read from garbage words are held
//! to the same rule.
//!
//! The default run takes a few seconds. `FIBRE_FUZZ_SEED=N` runs the seeded sequences
//! from another seed, `FIBRE_FUZZ_LINES=N` makes them longer, and `PROPTEST_CASES=N`
//! runs more random cases of the properties (256 by default). The cargo-fuzz target
//! `config_lines` (`fuzz/`) runs the same checks on libFuzzer's input.

use fibre_fib::config::{self, ConfigError};
use fibre_fib::{parse_query, show, Family, LinkIndex, Query, State};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

/// A router's configuration with something of every kind: veth pairs and a dummy link up,
/// addresses of both families, nexthop objects and groups, routes of several types in
/// several tables, an IPv6 source route, and rules with every selector and action.
const BASE: &str = "
link set lo up
link add a0 address 02:00:00:00:00:a0 type veth peer name a1 address 02:00:00:00:00:a1
link add b0 type veth peer name b1
link add d0 type dummy
link set a0 up
link set a1 up
link set b0 up
link set b1 up
link set d0 up
link set d0 group 7
addr add 10.0.0.1/24 dev a0
addr add 10.0.1.1/24 dev b0
addr add 192.168.5.1/24 dev a1
addr add 172.16.0.1/16 dev d0
-6 addr add 2001:db8::1/64 dev a0 nodad
-6 addr add 2001:db8:1::1/64 dev b0 nodad
nexthop add id 1 via 10.0.0.2 dev a0
nexthop add id 2 via 10.0.1.2 dev b0
nexthop add id 3 group 1/2,3
nexthop add id 4 blackhole
-6 nexthop add id 5 via 2001:db8::2 dev a0
route add default via 10.0.0.2
route add 10.1.0.0/16 via 10.0.0.2 table 10 metric 5
route add 10.2.0.0/16 nhid 3
route add 10.3.0.0/16 nexthop via 10.0.0.2 weight 2 nexthop via 10.0.1.2
route add blackhole 10.9.0.0/16
route add unreachable 10.10.0.0/16 table 10
route add throw 10.11.0.0/16 table 10
route add 10.12.0.0/16 dev d0 tos 0x10 metric 7
-6 route add 2001:db8:100::/48 via 2001:db8::2 dev a0
-6 route add 2001:db8:200::/48 from 2001:db8:1::/48 via 2001:db8:1::2
-6 route add default via 2001:db8::2 metric 100
-6 route add 2001:db8:300::/48 nhid 5
-6 route add prohibit 2001:db8:400::/48 table 10
rule add from 10.0.0.0/24 iif a1 fwmark 0x10/0xf0 ipproto tcp sport 1-1024 dport 80 uidrange 1000-1999 lookup 10 pref 100
rule add to 10.1.0.0/16 lookup 10 pref 200
rule add fwmark 7 goto 300 pref 250
rule add nop pref 300
rule add lookup main suppress_prefixlength 0 pref 400
rule add from 10.9.9.0/24 prohibit pref 500
rule add oif b0 tos 0x10 blackhole pref 600
rule add not to 10.0.0.0/8 fwmark 0x17 unreachable pref 32000
-6 rule add from 2001:db8:1::/48 lookup 10 pref 100
-6 rule add to 2001:db8:200::/48 unreachable pref 110
-6 rule add iif a0 lookup main suppress_ifgroup 7 pref 120
";

/// The base state, built once.
fn base() -> &'static State {
    static BASE_STATE: OnceLock<State> = OnceLock::new();
    BASE_STATE.get_or_init(|| {
        let mut state = State::new();
        if let Err(e) = config::apply_text(&mut state, "base", BASE) {
            panic!("the base configuration must apply: {e}");
        }
        state
    })
}

// ----- vocabulary -----

const LINKS: &[&str] = &["a0", "a1", "b0", "b1", "d0", "lo"];
/// Links the base lacks: some the generated lines may add, some no line can.
const OTHER_LINKS: &[&str] = &[
    "c0",
    "c1",
    "e0",
    "x9",
    "abcdefghijklmnop",
    "abcdefghijklmno",
    "a/b",
    "é0",
    "LO",
    "",
];
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "7",
    "10",
    "63",
    "64",
    "100",
    "255",
    "256",
    "1024",
    "1500",
    "32765",
    "32766",
    "32767",
    "65534",
    "65535",
    "65536",
    "4294967295",
    "4294967296",
    "18446744073709551616",
    "-1",
    "0x10",
    "0xf0",
    "0xffffffff",
    "0x100000000",
    "0x",
    "010",
    "08",
    "+1",
    "1e3",
    "1.5",
    "",
];
const V4: &[&str] = &[
    "10.0.0.1",
    "10.0.0.2",
    "10.0.0.255",
    "10.0.0.0",
    "10.0.1.1",
    "10.0.1.2",
    "10.1.2.3",
    "10.9.9.9",
    "192.168.5.1",
    "192.168.5.9",
    "172.16.0.1",
    "172.16.3.4",
    "127.0.0.1",
    "0.0.0.0",
    "255.255.255.255",
    "224.0.0.1",
    "1.2.3.4",
];
const V6: &[&str] = &[
    "2001:db8::1",
    "2001:db8::2",
    "2001:db8:1::1",
    "2001:db8:1::2",
    "2001:db8:100::5",
    "2001:db8:200::7",
    "::",
    "::1",
    "fe80::1",
    "fe80::2",
    "ff02::1",
    "::ffff:10.0.0.1",
    "2001:db9::1",
];
const NOT_ADDRESSES: &[&str] = &["10.0.0", "10.0.0.256", "2001:db8:::1", "x", "", "/", "1/2"];
const LENGTHS: &[&str] = &[
    "0", "1", "8", "16", "24", "30", "31", "32", "33", "48", "64", "127", "128", "129", "255",
    "256", "-1", "", "1000", "0x10", "08",
];
const TABLES: &[&str] = &[
    "main",
    "local",
    "default",
    "10",
    "100",
    "0",
    "253",
    "254",
    "255",
    "256",
    "4294967295",
    "4294967296",
    "-1",
    "all",
    "foo",
];
const ROUTE_TYPES: &[&str] = &[
    "unicast",
    "local",
    "broadcast",
    "multicast",
    "anycast",
    "blackhole",
    "unreachable",
    "prohibit",
    "throw",
    "nat",
];
const PROTOCOLS: &[&str] = &["boot", "static", "kernel", "bgp", "0", "255", "256", "foo"];
const SCOPES: &[&str] = &[
    "global", "link", "host", "site", "nowhere", "0", "200", "253", "254", "255", "256", "x",
];
const MACS: &[&str] = &[
    "02:00:00:00:00:01",
    "02:00:00:00:00:a0",
    "01:00:5e:00:00:01",
    "00:00:00:00:00:00",
    "ff:ff:ff:ff:ff:ff",
    "2:0:0:0:0:1",
    "02:00:00:00:00",
    "02:00:00:00:00:00:00",
    "020:00:00:00:00:01",
    "zz:00:00:00:00:01",
    "",
];
const RANGES: &[&str] = &[
    "1-1024",
    "80",
    "1",
    "0",
    "65534",
    "65535",
    "0-65535",
    "5-1",
    "1-",
    "-1",
    "-",
    "1000-1999",
    "0-4294967295",
    "4294967295-4294967296",
    "1--2",
];
const FWMARKS: &[&str] = &[
    "0x10/0xf0",
    "7",
    "0",
    "0xffffffff",
    "0x100000000",
    "1/",
    "/1",
    "0x10/0x100000000",
    "1/2/3",
];
const GROUPS: &[&str] = &[
    "1/2,3", "1", "2", "4", "5", "1/5", "1,0", "1,256", "1,257", "1/1", "1/4", "3", "99", "", "/",
    ",", "1,", "1/2/1", "1,-1", "0",
];

/// Every word of the vocabulary, for soups of words.
fn all_words() -> Vec<&'static str> {
    let keywords: &[&str] = &[
        "sysctl",
        "-4",
        "-6",
        "link",
        "addr",
        "address",
        "route",
        "rule",
        "nexthop",
        "nh",
        "add",
        "del",
        "set",
        "replace",
        "change",
        "append",
        "prepend",
        "flush",
        "type",
        "veth",
        "dummy",
        "peer",
        "name",
        "dev",
        "up",
        "down",
        "mtu",
        "lock",
        "group",
        "addrgenmode",
        "eui64",
        "none",
        "brd",
        "broadcast",
        "+",
        "-",
        "scope",
        "noprefixroute",
        "nodad",
        "metric",
        "valid_lft",
        "forever",
        "label",
        "local",
        "to",
        "from",
        "via",
        "inet",
        "inet6",
        "table",
        "tos",
        "dsfield",
        "proto",
        "src",
        "onlink",
        "nhid",
        "pref",
        "low",
        "high",
        "nexthop",
        "weight",
        "not",
        "iif",
        "oif",
        "fwmark",
        "dscp",
        "ipproto",
        "tcp",
        "udp",
        "sport",
        "dport",
        "uidrange",
        "lookup",
        "goto",
        "nop",
        "suppress_prefixlength",
        "suppress_ifgroup",
        "id",
        "blackhole",
        "mpath",
        "default",
        "all",
        "any",
        "#",
    ];
    let mut all = keywords.to_vec();
    for list in [
        LINKS,
        OTHER_LINKS,
        NUMBERS,
        V4,
        V6,
        NOT_ADDRESSES,
        TABLES,
        ROUTE_TYPES,
        PROTOCOLS,
        SCOPES,
        MACS,
        RANGES,
        FWMARKS,
        GROUPS,
    ] {
        all.extend_from_slice(list);
    }
    all
}

fn pick(rng: &mut SmallRng, xs: &[&str]) -> String {
    xs[rng.gen_range(0..xs.len())].to_string()
}

/// A link name: mostly one that exists.
fn link(rng: &mut SmallRng) -> String {
    match rng.gen_range(0..20) {
        0..=15 => pick(rng, LINKS),
        16 | 17 => pick(rng, NEW_LINKS),
        _ => pick(rng, OTHER_LINKS),
    }
}

/// A name for a new link: mostly one that is free.
fn new_link(rng: &mut SmallRng) -> String {
    if rng.gen_bool(0.8) {
        pick(rng, NEW_LINKS)
    } else {
        link(rng)
    }
}

/// A number: mostly small and sensible, often at or past an edge.
fn number(rng: &mut SmallRng) -> String {
    match rng.gen_range(0..10) {
        0..=3 => rng.gen_range(1..20u32).to_string(),
        4 => rng.gen::<u32>().to_string(),
        5 => rng.gen::<u64>().to_string(),
        _ => pick(rng, NUMBERS),
    }
}

/// An address of `family` (sometimes of the other, sometimes not an address).
fn addr(rng: &mut SmallRng, family: Family) -> String {
    let family = if rng.gen_bool(0.08) {
        other(family)
    } else {
        family
    };
    match (rng.gen_range(0..10), family) {
        (0, _) => pick(rng, NOT_ADDRESSES),
        (1, Family::V4) => Ipv4Addr::from(rng.gen::<u32>()).to_string(),
        (1, Family::V6) => Ipv6Addr::from(rng.gen::<u128>()).to_string(),
        (2, Family::V4) => format!(
            "10.{}.{}.{}",
            rng.gen_range(0..4),
            rng.gen::<u8>(),
            rng.gen::<u8>()
        ),
        (2, Family::V6) => format!(
            "2001:db8:{:x}::{:x}",
            rng.gen_range(0..5u16) * 0x100,
            rng.gen::<u16>()
        ),
        (_, Family::V4) => pick(rng, V4),
        (_, Family::V6) => pick(rng, V6),
    }
}

/// A prefix of `family`: an address with or without a length, or `default`.
fn prefix(rng: &mut SmallRng, family: Family) -> String {
    let a = addr(rng, family);
    match rng.gen_range(0..10) {
        0 => pick(rng, &["default", "all", "any"]),
        1 => a,
        2 => format!("{a}/{}", pick(rng, LENGTHS)),
        _ => {
            let max = if a.contains(':') { 128 } else { 32 };
            format!("{a}/{}", rng.gen_range(0..=max))
        }
    }
}

fn family(rng: &mut SmallRng) -> Family {
    if rng.gen_bool(0.5) {
        Family::V4
    } else {
        Family::V6
    }
}

fn other(f: Family) -> Family {
    match f {
        Family::V4 => Family::V6,
        Family::V6 => Family::V4,
    }
}

/// The option words before the object: none, `-4`, `-6`, sometimes a wrong one.
fn family_flag(rng: &mut SmallRng, f: Family) -> Vec<String> {
    match rng.gen_range(0..20) {
        0 => vec!["-4".into(), "-6".into()],
        1 => vec![pick(rng, &["-x", "-", "--", "-46"])],
        2..=9 => vec![],
        _ => vec![match f {
            Family::V4 => "-4".into(),
            Family::V6 => "-6".into(),
        }],
    }
}

/// Adds `key VALUE`, or, one time in fifteen, `key` alone.
fn opt(
    rng: &mut SmallRng,
    words: &mut Vec<String>,
    key: &str,
    value: impl FnOnce(&mut SmallRng) -> String,
) {
    words.push(key.into());
    if !rng.gen_bool(1.0 / 15.0) {
        words.push(value(rng));
    }
}

/// Whether to add an option (each option's chance).
fn maybe(rng: &mut SmallRng, p: f64) -> bool {
    rng.gen_bool(p)
}

// Values that fit the base configuration, so that sensible lines get past the kernel's
// checks and reach the state's code.

/// Links the base lacks that lines add.
const NEW_LINKS: &[&str] = &["c0", "c1", "e0", "e1", "f0"];
const V4_DSTS: &[&str] = &[
    "10.20.0.0/16",
    "10.21.0.0/24",
    "10.20.1.1",
    "10.1.0.0/16",
    "10.2.0.0/16",
    "10.3.0.0/16",
    "10.9.0.0/16",
    "10.12.0.0/16",
    "10.0.0.0/24",
    "192.168.7.0/24",
    "default",
];
const V6_DSTS: &[&str] = &[
    "2001:db8:100::/48",
    "2001:db8:200::/48",
    "2001:db8:300::/48",
    "2001:db8:500::/48",
    "2001:db8:501::/64",
    "2001:db8:600::1",
    "2001:db8::/64",
    "default",
];
/// Gateways and the links they are on.
const V4_PATHS: &[(&str, &str)] = &[
    ("10.0.0.2", "a0"),
    ("10.0.1.2", "b0"),
    ("192.168.5.9", "a1"),
    ("172.16.0.9", "d0"),
];
const V6_PATHS: &[(&str, &str)] = &[
    ("2001:db8::2", "a0"),
    ("2001:db8:1::2", "b0"),
    ("fe80::2", "a0"),
    ("fe80::3", "b0"),
];
/// Addresses and their links, the base's among them.
const V4_ADDRS: &[(&str, &str)] = &[
    ("10.0.0.9/24", "a0"),
    ("10.0.0.1/24", "a0"),
    ("10.0.2.1/24", "b0"),
    ("10.0.1.1/24", "b0"),
    ("10.5.0.1/16", "d0"),
    ("192.168.5.1/24", "a1"),
    ("127.0.0.2/8", "lo"),
    ("10.8.0.1/31", "b1"),
    ("10.7.0.1/32", "d0"),
];
const V6_ADDRS: &[(&str, &str)] = &[
    ("2001:db8::9/64", "a0"),
    ("2001:db8::1/64", "a0"),
    ("2001:db8:1::1/64", "b0"),
    ("2001:db8:5::1/64", "d0"),
    ("2001:db8:6::1/128", "b1"),
    ("fe80::99/64", "a1"),
];
const SANE_TABLES: &[&str] = &["main", "10", "100", "main", "10"];
const SANE_METRICS: &[&str] = &["5", "10", "100", "1024", "0"];

fn pair(rng: &mut SmallRng, xs: &[(&str, &str)]) -> (String, String) {
    let (a, b) = xs[rng.gen_range(0..xs.len())];
    (a.to_string(), b.to_string())
}

fn dst(rng: &mut SmallRng, f: Family, sane: bool) -> String {
    match (sane, f) {
        (true, Family::V4) => pick(rng, V4_DSTS),
        (true, Family::V6) => pick(rng, V6_DSTS),
        (false, _) => prefix(rng, f),
    }
}

/// A gateway and its link.
fn path(rng: &mut SmallRng, f: Family, sane: bool) -> (String, String) {
    match (sane, f) {
        (true, Family::V4) => pair(rng, V4_PATHS),
        (true, Family::V6) => pair(rng, V6_PATHS),
        (false, _) => (addr(rng, f), link(rng)),
    }
}

fn table(rng: &mut SmallRng, sane: bool) -> String {
    pick(rng, if sane { SANE_TABLES } else { TABLES })
}

fn metric(rng: &mut SmallRng, sane: bool) -> String {
    if sane {
        pick(rng, SANE_METRICS)
    } else {
        number(rng)
    }
}

fn link_line(rng: &mut SmallRng, sane: bool) -> Vec<String> {
    let mut w = vec!["link".to_string()];
    match rng.gen_range(0..10) {
        0..=2 => {
            w.push("add".into());
            if maybe(rng, 0.2) {
                w.push("name".into());
            }
            w.push(if sane { new_link(rng) } else { link(rng) });
            if maybe(rng, 0.15) {
                opt(rng, &mut w, "address", |r| pick(r, MACS));
            }
            if maybe(rng, 0.15) {
                opt(rng, &mut w, "mtu", |r| {
                    if sane {
                        pick(r, &["1280", "9000"])
                    } else {
                        number(r)
                    }
                });
            }
            let kind = if sane {
                pick(rng, &["veth", "veth", "dummy"])
            } else {
                pick(rng, &["veth", "dummy", "bridge", ""])
            };
            opt(rng, &mut w, "type", |_| kind);
            if maybe(rng, 0.8) {
                w.push("peer".into());
                opt(rng, &mut w, "name", new_link);
                if maybe(rng, 0.15) {
                    opt(rng, &mut w, "address", |r| pick(r, MACS));
                }
            }
        }
        3..=7 => {
            w.push("set".into());
            if maybe(rng, 0.5) {
                w.push("dev".into());
            }
            w.push(link(rng));
            for _ in 0..rng.gen_range(1..4) {
                match rng.gen_range(0..8) {
                    0 | 1 => w.push("up".into()),
                    2 => w.push("down".into()),
                    3 => opt(rng, &mut w, "mtu", |r| {
                        if sane {
                            pick(r, &["1280", "1400", "9000"])
                        } else {
                            number(r)
                        }
                    }),
                    4 => opt(rng, &mut w, "group", number),
                    5 => opt(rng, &mut w, "address", |r| pick(r, MACS)),
                    6 => opt(rng, &mut w, "addrgenmode", |r| {
                        pick(r, &["eui64", "none", "random", ""])
                    }),
                    _ if sane => w.push("up".into()),
                    _ => w.push(link(rng)),
                }
            }
        }
        _ => {
            w.push(pick(rng, &["del", "delete", "d"]));
            if maybe(rng, 0.5) {
                w.push("dev".into());
            }
            w.push(link(rng));
        }
    }
    w
}

fn addr_line(rng: &mut SmallRng, f: Family, sane: bool) -> Vec<String> {
    let mut w = vec![pick(rng, &["addr", "address", "a"])];
    w.push(pick(
        rng,
        &["add", "add", "add", "del", "del", "replace", "change"],
    ));
    let (local, dev) = match (sane, f) {
        (true, Family::V4) => pair(rng, V4_ADDRS),
        (true, Family::V6) => pair(rng, V6_ADDRS),
        (false, _) => {
            let local = match rng.gen_range(0..10) {
                0 => pick(rng, &["default", "", "10.0.0.5/", "/24"]),
                1..=3 => format!("{}/{}", addr(rng, f), pick(rng, LENGTHS)),
                _ => {
                    let max = if f == Family::V4 { 32 } else { 128 };
                    format!("{}/{}", addr(rng, f), rng.gen_range(0..=max))
                }
            };
            (local, link(rng))
        }
    };
    if maybe(rng, 0.2) {
        opt(rng, &mut w, "local", |_| local);
    } else {
        w.push(local);
    }
    opt(rng, &mut w, "dev", |_| dev);
    for _ in 0..rng.gen_range(0..3) {
        match rng.gen_range(0..8) {
            0 => opt(rng, &mut w, "brd", |r| {
                let a = addr(r, Family::V4);
                pick(r, &["+", "-", a.as_str()])
            }),
            1 => opt(rng, &mut w, "scope", |r| pick(r, SCOPES)),
            2 => w.push("noprefixroute".into()),
            3 => w.push("nodad".into()),
            4 => opt(rng, &mut w, "metric", |r| metric(r, sane)),
            5 => opt(rng, &mut w, "valid_lft", |r| {
                pick(r, &["forever", "10", ""])
            }),
            6 => opt(rng, &mut w, "label", link),
            _ if sane => w.push("nodad".into()),
            _ => w.push(addr(rng, f)),
        }
    }
    w
}

fn route_line(rng: &mut SmallRng, f: Family, sane: bool) -> Vec<String> {
    let mut w = vec![pick(rng, &["route", "r", "ro"])];
    if rng.gen_range(0..25) == 0 {
        w.push("flush".into());
        if maybe(rng, 0.9) {
            opt(rng, &mut w, "table", |r| table(r, sane));
        }
        return w;
    }
    let verb = pick(
        rng,
        &[
            "add", "add", "add", "replace", "change", "append", "prepend", "del", "del", "delete",
        ],
    );
    // A delete names a few fields; an add many.
    let options = if verb.starts_with("del") && sane {
        rng.gen_range(0..2)
    } else {
        rng.gen_range(0..4)
    };
    w.push(verb);
    if maybe(rng, 0.15) {
        w.push(if sane {
            pick(
                rng,
                &[
                    "unicast",
                    "blackhole",
                    "unreachable",
                    "prohibit",
                    "throw",
                    "local",
                ],
            )
        } else {
            pick(rng, ROUTE_TYPES)
        });
    }
    if maybe(rng, 0.1) {
        opt(rng, &mut w, "to", |r| dst(r, f, sane));
    } else if maybe(rng, 0.97) {
        w.push(dst(rng, f, sane));
    }
    let multipath = maybe(rng, 0.12);
    let (gw, dev) = path(rng, f, sane);
    match rng.gen_range(0..10) {
        _ if multipath => {}
        0..=5 => {
            if maybe(rng, 0.05) {
                w.push("via".into());
                w.push(pick(rng, &["inet", "inet6"]));
                w.push(gw);
            } else {
                opt(rng, &mut w, "via", |_| gw);
            }
            if maybe(rng, 0.5) {
                opt(rng, &mut w, "dev", |_| dev);
            }
        }
        6 | 7 => opt(rng, &mut w, "dev", |_| dev),
        8 => opt(rng, &mut w, "nhid", |r| {
            if sane {
                r.gen_range(1..8).to_string()
            } else {
                pick(r, &["0", "99", "4294967295", "4294967296", "-1"])
            }
        }),
        _ => {}
    }
    for _ in 0..options {
        match rng.gen_range(0..14) {
            0 | 1 => opt(rng, &mut w, "table", |r| table(r, sane)),
            2 | 3 => {
                let key = pick(rng, &["metric", "priority", "preference"]);
                opt(rng, &mut w, &key, |r| metric(r, sane));
            }
            4 if sane && f == Family::V6 => {}
            4 => opt(rng, &mut w, "tos", |r| {
                pick(r, &["0", "0x10", "8", "255", "256", "-1", "x"])
            }),
            5 => opt(rng, &mut w, "proto", |r| pick(r, PROTOCOLS)),
            6 => opt(rng, &mut w, "scope", |r| pick(r, SCOPES)),
            7 => opt(rng, &mut w, "src", |r| {
                if sane && f == Family::V4 {
                    pick(r, &["10.0.0.1", "10.0.1.1", "192.168.5.1"])
                } else if sane {
                    pick(r, &["2001:db8::1", "2001:db8:1::1"])
                } else {
                    addr(r, f)
                }
            }),
            8 => {
                w.push("mtu".into());
                if maybe(rng, 0.3) {
                    w.push("lock".into());
                }
                w.push(if sane { "1400".into() } else { number(rng) });
            }
            9 => w.push("onlink".into()),
            10 => opt(rng, &mut w, "nhid", |r| r.gen_range(0..9).to_string()),
            11 => opt(rng, &mut w, "pref", |r| {
                pick(r, &["low", "medium", "high", "x"])
            }),
            12 => opt(rng, &mut w, "from", |r| {
                if sane {
                    pick(r, &["2001:db8:1::/48", "2001:db8:2::/64", "::/0"])
                } else {
                    prefix(r, f)
                }
            }),
            _ if sane => opt(rng, &mut w, "table", |r| table(r, sane)),
            _ => w.push(pick(rng, ROUTE_TYPES)),
        }
    }
    if multipath {
        for _ in 0..rng.gen_range(1..4) {
            let (gw, dev) = path(rng, f, sane);
            w.push("nexthop".into());
            if maybe(rng, 0.9) {
                opt(rng, &mut w, "via", |_| gw);
            }
            if maybe(rng, 0.4) {
                opt(rng, &mut w, "dev", |_| dev);
            }
            if maybe(rng, 0.4) {
                opt(rng, &mut w, "weight", |r| {
                    if sane {
                        r.gen_range(1..5).to_string()
                    } else {
                        pick(r, &["1", "0", "256", "257", "65536", "x"])
                    }
                });
            }
            if maybe(rng, 0.05) {
                w.push("onlink".into());
            }
        }
    }
    w
}

fn rule_line(rng: &mut SmallRng, f: Family, sane: bool) -> Vec<String> {
    let mut w = vec![pick(rng, &["rule", "ru"])];
    if rng.gen_range(0..30) == 0 {
        w.push("flush".into());
        return w;
    }
    w.push(pick(rng, &["add", "add", "add", "del", "delete"]));
    let src = |r: &mut SmallRng| match (sane, f) {
        (true, Family::V4) => pick(r, &["10.0.0.0/24", "10.9.9.0/24", "192.168.5.0/24"]),
        (true, Family::V6) => pick(r, &["2001:db8:1::/48", "2001:db8::/64"]),
        (false, _) => prefix(r, f),
    };
    for _ in 0..rng.gen_range(0..5) {
        match rng.gen_range(0..17) {
            0 => w.push("not".into()),
            1 | 2 => opt(rng, &mut w, "from", src),
            3 => opt(rng, &mut w, "to", |r| dst(r, f, sane)),
            4 => {
                let key = pick(rng, &["iif", "dev"]);
                opt(rng, &mut w, &key, link);
            }
            5 => opt(rng, &mut w, "oif", link),
            6 => opt(rng, &mut w, "fwmark", |r| pick(r, FWMARKS)),
            7 => {
                let key = pick(rng, &["tos", "dsfield"]);
                opt(rng, &mut w, &key, |r| {
                    pick(r, &["0x10", "0", "255", "256", "x"])
                });
            }
            8 => opt(rng, &mut w, "dscp", |r| {
                pick(r, &["0", "10", "63", "64", "4294967296"])
            }),
            9 => opt(rng, &mut w, "ipproto", |r| {
                pick(
                    r,
                    &["tcp", "udp", "icmp", "ipv6-icmp", "0", "255", "256", "x"],
                )
            }),
            10 => opt(rng, &mut w, "sport", |r| pick(r, RANGES)),
            11 => opt(rng, &mut w, "dport", |r| pick(r, RANGES)),
            12 => opt(rng, &mut w, "uidrange", |r| pick(r, RANGES)),
            13 => {
                let key = pick(rng, &["suppress_prefixlength", "sup_pl"]);
                opt(rng, &mut w, &key, |r| {
                    if sane {
                        pick(r, &["0", "8", "24", "128"])
                    } else {
                        number(r)
                    }
                });
            }
            14 => opt(rng, &mut w, "suppress_ifgroup", number),
            15 => opt(rng, &mut w, "protocol", |r| pick(r, PROTOCOLS)),
            _ => opt(rng, &mut w, "fwmark", number),
        }
    }
    let pref: u32 = rng.gen_range(1..1000);
    match rng.gen_range(0..12) {
        0..=4 => {
            let key = pick(rng, &["lookup", "table"]);
            opt(rng, &mut w, &key, |r| table(r, sane));
        }
        5 => opt(rng, &mut w, "goto", |r| {
            if sane {
                (pref + r.gen_range(0..50)).to_string()
            } else {
                number(r)
            }
        }),
        6 => w.push("nop".into()),
        7 => w.push(pick(rng, &["blackhole", "unreachable", "prohibit"])),
        _ => {}
    }
    if maybe(rng, 0.7) {
        let pref = if sane { pref.to_string() } else { number(rng) };
        let key = pick(rng, &["pref", "priority", "order"]);
        opt(rng, &mut w, &key, |_| pref);
    }
    w
}

fn nexthop_line(rng: &mut SmallRng, f: Family, sane: bool) -> Vec<String> {
    let mut w = vec![pick(rng, &["nexthop", "nh"])];
    w.push(pick(
        rng,
        &["add", "add", "add", "replace", "del", "delete", "show"],
    ));
    let id = if sane {
        rng.gen_range(1..12).to_string()
    } else {
        number(rng)
    };
    opt(rng, &mut w, "id", |_| id);
    let (gw, dev) = path(rng, f, sane);
    match rng.gen_range(0..6) {
        0..=2 => {
            opt(rng, &mut w, "via", |_| gw);
            opt(rng, &mut w, "dev", |_| dev);
        }
        3 => opt(rng, &mut w, "dev", |_| dev),
        4 => opt(rng, &mut w, "group", |r| {
            if sane {
                pick(r, &["1/2", "1,2/2,3", "6/7", "1", "5", "6", "1/6", "4"])
            } else {
                pick(r, GROUPS)
            }
        }),
        _ => w.push("blackhole".into()),
    }
    for _ in 0..rng.gen_range(0..2) {
        match rng.gen_range(0..6) {
            0 => w.push("onlink".into()),
            1 => opt(rng, &mut w, "type", |r| {
                pick(r, &["mpath", "resilient", ""])
            }),
            2 => opt(rng, &mut w, "proto", |r| pick(r, PROTOCOLS)),
            3 if !sane => w.push("blackhole".into()),
            4 if !sane => opt(rng, &mut w, "group", |r| pick(r, GROUPS)),
            5 if !sane => opt(rng, &mut w, "via", |r| addr(r, f)),
            _ => {}
        }
    }
    w
}

/// A line of the base configuration with its command changed (an add made a delete, a
/// replace, a change...), so that lines meet objects that exist.
fn replayed(rng: &mut SmallRng) -> String {
    let lines: Vec<&str> = BASE.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut w: Vec<String> = lines[rng.gen_range(0..lines.len())]
        .split_whitespace()
        .map(String::from)
        .collect();
    let at = w.iter().position(|x| x == "add" || x == "set");
    if let Some(at) = at {
        let object = w[at - 1].clone();
        w[at] = match object.as_str() {
            "route" => pick(
                rng,
                &["del", "replace", "change", "append", "prepend", "add"],
            ),
            "rule" => pick(rng, &["del", "add"]),
            "nexthop" => pick(rng, &["del", "replace", "add"]),
            "addr" => pick(rng, &["del", "add", "replace"]),
            _ if w[at] == "set" => "set".into(),
            _ => pick(rng, &["del", "add"]),
        };
        if object == "link" && w[at] == "set" {
            let last = w.len() - 1;
            w[last] = pick(rng, &["up", "down"]);
        }
    }
    w.join(" ")
}

/// A `sysctl` line: the multipath settings fibre takes, with values in and past range,
/// other keys, broken shapes.
fn sysctl_line(rng: &mut SmallRng) -> String {
    let key = pick(
        rng,
        &[
            "net.ipv4.fib_multipath_hash_seed",
            "net.ipv4.fib_multipath_hash_policy",
            "net.ipv6.fib_multipath_hash_policy",
            "net/ipv4/fib_multipath_hash_policy",
            "net.ipv4.ip_forward",
            "",
        ],
    );
    let value = pick(
        rng,
        &[
            "0",
            "1",
            "2",
            "3",
            "4294967295",
            "4294967296",
            "-1",
            "x",
            "",
        ],
    );
    let w = pick(rng, &["", "-w "]);
    match rng.gen_range(0..6) {
        0 => format!("sysctl {w}{key}"),
        1 => format!("sysctl {w}{key}={value} {key}={value}"),
        2 => "sysctl".into(),
        _ => format!("sysctl {w}{key}={value}"),
    }
}

/// A line shaped as the configuration expects, of any type, with random values: mostly
/// values that fit the base configuration, often values at or past their edges.
fn valid_shaped(rng: &mut SmallRng) -> String {
    if rng.gen_range(0..10) == 0 {
        return replayed(rng);
    }
    if rng.gen_range(0..40) == 0 {
        return sysctl_line(rng);
    }
    let f = family(rng);
    let sane = rng.gen_bool(0.6);
    let mut w = if sane { vec![] } else { family_flag(rng, f) };
    if sane && f == Family::V6 {
        w.push("-6".into());
    }
    w.extend(match rng.gen_range(0..20) {
        0..=2 => link_line(rng, sane),
        3..=5 => addr_line(rng, f, sane),
        6..=11 => route_line(rng, f, sane),
        12..=15 => rule_line(rng, f, sane),
        _ => nexthop_line(rng, f, sane),
    });
    // Now and then a keyword given twice or a keyword left without its value at the end.
    if !sane && rng.gen_range(0..6) == 0 && w.len() > 2 {
        let i = rng.gen_range(1..w.len());
        let again = w[i].clone();
        w.push(again);
    }
    w.join(" ")
}

/// A valid-shaped line with words dropped, doubled, swapped, replaced, or cut short.
fn mutated(rng: &mut SmallRng) -> String {
    let line = valid_shaped(rng);
    let mut w: Vec<String> = line.split(' ').map(String::from).collect();
    for _ in 0..rng.gen_range(1..4) {
        let n = w.len();
        match rng.gen_range(0..7) {
            0 if n > 1 => {
                w.remove(rng.gen_range(0..n));
            }
            1 => {
                let i = rng.gen_range(0..n);
                let x = w[i].clone();
                w.insert(i, x);
            }
            2 if n > 1 => {
                let (i, j) = (rng.gen_range(0..n), rng.gen_range(0..n));
                w.swap(i, j);
            }
            3 => {
                let i = rng.gen_range(0..n);
                w[i] = pick(rng, &all_words());
            }
            4 => {
                let i = rng.gen_range(0..=n);
                w.insert(i, pick(rng, &all_words()));
            }
            5 => {
                // One word cut at a character.
                let i = rng.gen_range(0..n);
                let chars: Vec<char> = w[i].chars().collect();
                let cut = rng.gen_range(0..=chars.len());
                w[i] = chars[..cut].iter().collect();
            }
            _ => {}
        }
    }
    let joined = w.join(" ");
    if rng.gen_bool(0.3) {
        // The whole line cut at a character.
        let chars: Vec<char> = joined.chars().collect();
        let cut = rng.gen_range(0..=chars.len());
        chars[..cut].iter().collect()
    } else {
        joined
    }
}

/// Characters that are hard on a reader of words: separators, controls, quotes, wide ones.
const ODD_CHARS: &[char] = &[
    ' ',
    '\t',
    '\r',
    '\u{0b}',
    '\u{0c}',
    '\u{85}',
    '\u{a0}',
    '\u{2028}',
    '\u{3000}',
    '\0',
    '\u{1b}',
    '#',
    '/',
    ',',
    '-',
    ':',
    '.',
    '"',
    '\\',
    'é',
    '\u{301}',
    '\u{200b}',
    '\u{feff}',
    '\u{10ffff}',
    '\u{e000}',
    '😀',
    'ß',
    'ǅ',
];

/// Arbitrary text: random characters, odd ones often, some very long words.
fn arbitrary(rng: &mut SmallRng) -> String {
    match rng.gen_range(0..5) {
        0 => {
            let bytes: Vec<u8> = (0..rng.gen_range(0..80)).map(|_| rng.gen()).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        1 => {
            // A real line with a very long word in it.
            let mut w: Vec<String> = valid_shaped(rng).split(' ').map(String::from).collect();
            let i = rng.gen_range(0..=w.len());
            let c = ODD_CHARS[rng.gen_range(0..ODD_CHARS.len())];
            let long: String = std::iter::repeat_n(c, rng.gen_range(100..5000)).collect();
            let word = if rng.gen_bool(0.5) {
                long
            } else {
                format!("10.0.0.1/{long}")
            };
            w.insert(i, word);
            w.join(" ")
        }
        2 => {
            // A real line with odd characters strewn in.
            let mut chars: Vec<char> = valid_shaped(rng).chars().collect();
            for _ in 0..rng.gen_range(1..5) {
                let i = rng.gen_range(0..=chars.len());
                chars.insert(i, ODD_CHARS[rng.gen_range(0..ODD_CHARS.len())]);
            }
            chars.into_iter().collect()
        }
        3 => {
            let words = all_words();
            (0..rng.gen_range(0..12))
                .map(|_| words[rng.gen_range(0..words.len())])
                .collect::<Vec<_>>()
                .join(" ")
        }
        _ => (0..rng.gen_range(0..40))
            .map(|_| {
                if rng.gen_bool(0.3) {
                    ODD_CHARS[rng.gen_range(0..ODD_CHARS.len())]
                } else {
                    char::from_u32(rng.gen_range(0..0x11_0000)).unwrap_or('?')
                }
            })
            .collect(),
    }
}

/// One generated line: valid-shaped, mutated or arbitrary.
fn any_line(rng: &mut SmallRng) -> String {
    match rng.gen_range(0..10) {
        0..=5 => valid_shaped(rng),
        6..=8 => mutated(rng),
        _ => arbitrary(rng),
    }
}

// ----- the checks -----

/// What an error must be: something, on one line, printable, short enough to read after
/// `FILE:LINE: `.
fn check_reason(reason: &str, input: &str) {
    let shown = || input.chars().take(100).collect::<String>();
    assert!(
        !reason.trim().is_empty(),
        "an empty reason for {:?}",
        shown()
    );
    assert!(
        !reason.chars().any(char::is_control),
        "a reason of more than one line or with control characters for {:?}: {reason:?}",
        shown()
    );
    assert!(
        reason.chars().count() < 300,
        "a reason of {} characters for {:?}: {reason:?}",
        reason.chars().count(),
        shown()
    );
}

/// A random address to query: one the configuration speaks of, or any.
fn query_addr(rng: &mut SmallRng, f: Family) -> IpAddr {
    match (rng.gen_range(0..3), f) {
        (0, Family::V4) => IpAddr::V4(Ipv4Addr::from(rng.gen::<u32>())),
        (0, Family::V6) => IpAddr::V6(Ipv6Addr::from(rng.gen::<u128>())),
        (1, Family::V4) => IpAddr::from([10, rng.gen_range(0..13), rng.gen(), rng.gen()]),
        (1, Family::V6) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
            b[4] = rng.gen_range(0..5);
            b[15] = rng.gen();
            IpAddr::from(b)
        }
        (_, Family::V4) => pick(rng, V4).parse().unwrap(),
        (_, Family::V6) => pick(rng, V6).parse().unwrap(),
    }
}

/// A random query: either family, with `from`, `oif`, `iif`, `mark` and the rest now and
/// then (a `from` of the other family, links that do not exist).
fn random_query(rng: &mut SmallRng) -> Query {
    let f = family(rng);
    let mut q = Query::to(query_addr(rng, f));
    let link = |rng: &mut SmallRng| -> LinkIndex {
        if rng.gen_bool(0.9) {
            rng.gen_range(1..9)
        } else {
            [0, 9, 10, 11, 1000, u32::MAX][rng.gen_range(0..6)]
        }
    };
    if rng.gen_bool(0.4) {
        let sf = if rng.gen_bool(0.05) { family(rng) } else { f };
        q.src = Some(query_addr(rng, sf));
    }
    if rng.gen_bool(0.2) {
        q.oif = Some(link(rng));
    }
    if rng.gen_bool(0.2) {
        q.iif = Some(link(rng));
    }
    if rng.gen_bool(0.3) {
        q.mark = [0, 7, 0x10, 0x17, 0xf0, u32::MAX, rng.gen()][rng.gen_range(0..7)];
    }
    if rng.gen_bool(0.2) {
        q.tos = [0, 0x10, 0x1c, 0xff][rng.gen_range(0..4)];
    }
    if rng.gen_bool(0.3) {
        q.ipproto = [1, 6, 17, 58, 0, 255][rng.gen_range(0..6)];
        q.sport = [0, 1, 80, 1024, 65535, rng.gen()][rng.gen_range(0..6)];
        q.dport = [0, 1, 80, 1024, 65535, rng.gen()][rng.gen_range(0..6)];
    }
    if rng.gen_bool(0.2) {
        q.uid = [0, 999, 1000, 1999, u32::MAX][rng.gen_range(0..5)];
    }
    q
}

/// Compiles the state and asks it `n` random queries, printing each answer as `ip` does.
fn query_state(state: &State, rng: &mut SmallRng, n: usize) {
    let snap = state.snapshot();
    for _ in 0..n {
        let q = random_query(rng);
        if let Ok(a) = snap.route(&q) {
            show::answer_text(&snap, &a);
            show::answer_json(&snap, &a);
        }
    }
}

/// Everything a state holds, as text: links, addresses, routes, rules and nexthops as
/// `ip` lists them, and the state's own debug form (every field).
fn listing(state: &State) -> String {
    let mut out = String::new();
    for l in state.links() {
        out += &format!(
            "{}\n{}\n",
            show::link_json(state, l),
            show::addr_json(state, l)
        );
    }
    for a in state.addresses() {
        out += &show::addr_text(state, a);
        out.push('\n');
    }
    for f in [Family::V4, Family::V6] {
        for r in state.routes(f, None) {
            out += &show::route_text(state, &r);
            out.push('\n');
        }
        for r in state.rules(f) {
            out += &show::rule_text(r);
            out.push('\n');
        }
    }
    for nh in state.nexthops() {
        out += &format!("{}\n", show::nexthop_json(state, nh));
    }
    out + &format!("{state:?}")
}

/// Applies one line to `state` as a file's line is applied: kept when accepted, undone
/// when refused. A panic is reported with the line and the lines that led there.
fn apply_checked(state: &mut State, line: &str, history: &[String]) -> Result<(), String> {
    let mut next = state.clone();
    let result = catch_unwind(AssertUnwindSafe(|| config::apply_line(&mut next, line)));
    let result = match result {
        Ok(r) => r,
        Err(_) => panic!(
            "apply_line panicked on {line:?}\nafter the base configuration and:\n{}",
            history.join("\n")
        ),
    };
    match &result {
        Ok(()) => *state = next,
        Err(reason) => check_reason(reason, line),
    }
    result
}

/// Runs `lines` from the base state, each accepted line followed by queries.
fn run_lines(lines: &[String], rng: &mut SmallRng) -> Vec<(String, bool)> {
    let mut state = base().clone();
    let mut history = Vec::new();
    let mut results = Vec::new();
    for line in lines {
        let ok = apply_checked(&mut state, line, &history).is_ok();
        if ok {
            history.push(line.clone());
            let r = catch_unwind(AssertUnwindSafe(|| query_state(&state, rng, 6)));
            if r.is_err() {
                panic!(
                    "a snapshot or a query panicked after the base configuration and:\n{}",
                    history.join("\n")
                );
            }
        }
        results.push((line.clone(), ok));
    }
    results
}

/// The object and command a line names, when both are known (for counting what the run
/// reached).
fn object_of(line: &str) -> Option<String> {
    let mut words = line.split_whitespace().skip_while(|w| w.starts_with('-'));
    let object = match words.next()? {
        "link" | "l" | "li" | "lin" => "link",
        "address" | "addr" | "a" | "ad" | "add" | "addre" => "addr",
        "route" | "r" | "ro" | "rou" | "rout" => "route",
        "rule" | "ru" => "rule",
        "nexthop" | "nh" | "ne" | "nex" => "nexthop",
        _ => return None,
    };
    let verb = words.next()?;
    let verbs = [
        "add", "set", "del", "replace", "change", "append", "prepend", "flush",
    ];
    verbs.contains(&verb).then(|| format!("{object} {verb}"))
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Seeded sequences from the base state (restarted every 50 lines, so that deletes do not
/// empty it): no panic, short one-line reasons, and every command of every object
/// accepted somewhere in the run, so the generator is known to reach past the parser
/// into the state's code.
#[test]
fn seeded_sequences_of_every_line_type() {
    let seed = env_number("FIBRE_FUZZ_SEED", 0x5eed_f1b3);
    let total = env_number("FIBRE_FUZZ_LINES", 6000) as usize;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut done = 0;
    while done < total {
        let lines: Vec<String> = (0..50.min(total - done))
            .map(|_| any_line(&mut rng))
            .collect();
        done += lines.len();
        for (line, ok) in run_lines(&lines, &mut rng) {
            if let Some(kind) = object_of(&line) {
                let c = counts.entry(kind).or_default();
                if ok {
                    c.0 += 1;
                } else {
                    c.1 += 1;
                }
            }
        }
    }
    let want = [
        "link add",
        "link set",
        "link del",
        "addr add",
        "addr del",
        "route add",
        "route replace",
        "route change",
        "route append",
        "route prepend",
        "route del",
        "route flush",
        "rule add",
        "rule del",
        "rule flush",
        "nexthop add",
        "nexthop replace",
        "nexthop del",
    ];
    eprintln!("seed {seed}, {total} lines; (accepted, refused) by command: {counts:?}");
    if total >= 6000 {
        for kind in want {
            let (ok, refused) = counts.get(kind).copied().unwrap_or_default();
            assert!(
                ok > 0,
                "seed {seed}: `{kind}` lines: {ok} accepted, {refused} refused; the generator \
                 should reach past the parser (counts: {counts:?})"
            );
        }
    }
}

/// Edge lines of every type, each alone on the base state: no panic, and a short
/// one-line reason when refused. These are refused whatever the state.
#[test]
fn edge_values_are_refused_with_a_reason() {
    let refused = [
        "addr add 10.0.0.5/33 dev a0",
        "-6 addr add 2001:db8::5/129 dev a0",
        "addr add 10.0.0.5/-1 dev a0",
        "addr add 10.0.0.5/ dev a0",
        "addr add 10.0.0.5/24 dev",
        "addr add 10.0.0.5/24",
        "-6 addr add 10.0.0.5/24 dev a0",
        "route add 10.5.0.0/33 dev a0",
        "-6 route add 2001:db8:5::/129 dev a0",
        "route add 10.5.0.0/16 via 10.0.0.2 table 0",
        "route add 10.5.0.0/16 via 10.0.0.2 table 4294967296",
        "route add 10.5.0.0/16 via 10.0.0.2 metric 4294967296",
        "route add 10.5.0.0/16 via 10.0.0.2 metric -1",
        "route add 10.5.0.0/16 via 10.0.0.2 tos 256",
        "route add 10.5.0.0/16 via",
        "route add 10.5.0.0/16 via 10.0.0.2 dev nosuchlink",
        "route add 10.5.0.0/16 nexthop via 10.0.0.2 weight 257",
        "route add 10.5.0.0/16 nexthop via 10.0.0.2 weight 0",
        "route add 10.5.0.0/16 nhid 4294967296",
        "route add 10.5.0.0/16 via 10.0.0.2 proto 256",
        "route add 10.5.0.0/16 via 10.0.0.2 scope 256",
        "route add 10.5.0.0/16 via 10.0.0.2 pref x",
        "route flush",
        "route flush table 0",
        "rule add lookup 0",
        "rule add sport 0-80 lookup 10",
        "rule add dport 1-65535 lookup 10",
        "rule add sport 5-1 lookup 10",
        "rule add uidrange 2-1 lookup 10",
        "rule add fwmark 0x100000000 lookup 10",
        "rule add fwmark 1/0x100000000 lookup 10",
        "rule add dscp 64 lookup 10",
        "rule add tos 256 lookup 10",
        "rule add ipproto 256 lookup 10",
        "rule add suppress_prefixlength 256 lookup main",
        "rule add pref 4294967296 lookup 10",
        "rule add goto 5 pref 10",
        "rule add lookup",
        "nexthop add id 0 blackhole",
        "nexthop add id 4294967296 blackhole",
        "nexthop add id 9 group 1,257",
        "nexthop add id 9 group 1,0",
        "nexthop add id 9 group 1/1",
        "nexthop add id 9 group 99",
        "nexthop add id 9 group 3",
        "nexthop add id 9 group",
        "nexthop add id 9 via 10.0.0.2",
        "nexthop add id 9 blackhole via 10.0.0.2 dev a0",
        "nexthop add id 1 blackhole",
        "nexthop del id 99",
        "nexthop add",
        "link add x0 type veth peer name x0",
        "link add abcdefghijklmnop type dummy",
        "link add x0 type dummy mtu 65536",
        "link add x0 type dummy mtu 67",
        "link add x0 type veth",
        "link add x0 type bridge",
        "link set a0 mtu 65536",
        "link set a0 mtu 4294967296",
        "link set a0 address 01:00:5e:00:00:01",
        "link set a0 address 02:00:00:00:00",
        "link set a0 group 4294967296",
        "link set a0",
        "link set nosuchlink up",
        "link del lo",
        "link del nosuchlink",
        "-5 route add default dev a0",
        "frobnicate",
        "-4",
    ];
    // Words that are long, or that escape to several times their length.
    let escaped = "\u{1b}".repeat(300);
    let invisible = "\u{feff}".repeat(300);
    let long = "x".repeat(100_000);
    let odd = [
        format!("rule {escaped}"),
        format!("route add 10.0.0.1/{invisible}"),
        format!("route add 10.5.0.0/16 dev d{escaped}0"),
        format!("addr add 10.0.0.9/24 dev {long}"),
        format!("link set {invisible} up"),
        format!("nexthop add id 9 via 10.0.0.2 dev {escaped}"),
        format!("rule add iif {long} lookup {long}"),
        format!("{long} {long}"),
    ];
    for line in refused
        .iter()
        .copied()
        .chain(odd.iter().map(String::as_str))
    {
        let mut state = base().clone();
        match apply_checked(&mut state, line, &[]) {
            Ok(()) => panic!(
                "{:?} was accepted",
                line.chars().take(100).collect::<String>()
            ),
            Err(reason) => check_reason(&reason, line),
        }
    }
}

/// The reason a file with `bad` at line `at` gives, and whether the state was left alone.
fn bad_line_in_file(good: &[String], at: usize, bad: &str) {
    let mut lines: Vec<&str> = good.iter().map(String::as_str).collect();
    lines.insert(at, bad);
    let text = lines.join("\n");
    let mut state = base().clone();
    let before = listing(&state);
    let e: ConfigError = match config::apply_text(&mut state, "fuzz.conf", &text) {
        Ok(()) => panic!(
            "a file with {bad:?} at line {} was accepted:\n{text}",
            at + 1
        ),
        Err(e) => e,
    };
    assert_eq!(
        e.line,
        at + 1,
        "the wrong line named for {bad:?} in:\n{text}\n{e}"
    );
    assert_eq!(e.file, "fuzz.conf");
    assert_eq!(e.to_string(), format!("fuzz.conf:{}: {}", at + 1, e.reason));
    check_reason(&e.reason, bad);
    assert_eq!(
        before,
        listing(&state),
        "a refused file changed the state:\n{text}"
    );
    // Without the bad line the same file applies, and as its lines do one by one.
    let mut whole = base().clone();
    config::apply_text(&mut whole, "fuzz.conf", &good.join("\n")).unwrap_or_else(|e| {
        panic!(
            "lines accepted one by one are refused together: {e}\n{}",
            good.join("\n")
        )
    });
    let mut by_line = base().clone();
    for l in good {
        config::apply_line(&mut by_line, l).expect("accepted before");
    }
    assert_eq!(listing(&whole), listing(&by_line));
}

/// Lines refused whatever came before them.
const ALWAYS_BAD: &[&str] = &[
    "route add 10.5.0.0/33 dev a0",
    "-6 route add 2001:db8::/129 via 2001:db8::2",
    "addr add 10.0.0.9/24 dev nosuchlink",
    "link set nosuchlink up",
    "rule add sport 0-80 lookup 10",
    "nexthop add id 0 blackhole",
    "frobnicate the router",
    "route add 10.5.0.0/16 via 10.0.0.2 table 4294967296",
    "link add abcdefghijklmnop type dummy",
    "-6 nexthop add id 9 group 1,257",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(env_number("PROPTEST_CASES", 256) as u32))]

    /// Random sequences of any line (fresh seeds every run, shrunk to the fewest lines on
    /// failure): the properties of the seeded run.
    #[test]
    fn random_sequences_never_panic(seeds in prop::collection::vec(any::<u64>(), 1..24), q in any::<u64>()) {
        let lines: Vec<String> = seeds
            .iter()
            .map(|s| any_line(&mut SmallRng::seed_from_u64(*s)))
            .collect();
        run_lines(&lines, &mut SmallRng::seed_from_u64(q));
    }

    /// Any text at all, as a line and as a file.
    #[test]
    fn arbitrary_text_never_panics(text in any::<String>(), bytes in prop::collection::vec(any::<u8>(), 0..120)) {
        for t in [text, String::from_utf8_lossy(&bytes).into_owned()] {
            let mut state = base().clone();
            apply_checked(&mut state, &t, &[])
                .map(|()| query_state(&state, &mut SmallRng::seed_from_u64(1), 4))
                .ok();
            let mut state = base().clone();
            if let Err(e) = config::apply_text(&mut state, "fuzz.conf", &t) {
                assert!(e.line >= 1 && e.line <= t.lines().count(), "line {} of {t:?}", e.line);
                check_reason(&e.reason, &t);
            }
        }
    }

    /// A file with one bad line among accepted ones names that line and changes nothing.
    #[test]
    fn a_file_with_a_bad_line_changes_nothing(seeds in prop::collection::vec(any::<u64>(), 1..24), at in any::<prop::sample::Index>(), bad in prop::sample::select(ALWAYS_BAD)) {
        let lines: Vec<String> = seeds
            .iter()
            .map(|s| valid_shaped(&mut SmallRng::seed_from_u64(*s)))
            .collect();
        let good: Vec<String> = run_lines(&lines, &mut SmallRng::seed_from_u64(0))
            .into_iter()
            .filter(|(_, ok)| *ok)
            .map(|(l, _)| l)
            .collect();
        bad_line_in_file(&good, at.index(good.len() + 1), bad);
    }

    /// `route get` words that are garbage: a query or a short one-line reason, and a
    /// query read is answered without a panic.
    #[test]
    fn garbage_queries_never_panic(
        words in prop::collection::vec(
            prop_oneof![
                prop::sample::select(vec![
                    "to", "from", "iif", "oif", "mark", "tos", "dsfield", "ipproto", "sport",
                    "dport", "uid", "tcp", "udp", "a0", "b1", "lo", "nosuch", "10.1.2.3",
                    "2001:db8:100::1", "10.0.0.0/24", "::/0", "0", "255", "256", "65535", "65536",
                    "4294967295", "4294967296", "-1", "0x10", "", "/", "fe80::1%a0", "a\u{1b}0",
                ]).prop_map(String::from),
                any::<String>(),
            ],
            0..10,
        )
    ) {
        let snap = base().snapshot();
        let refs: Vec<&str> = words.iter().map(String::as_str).collect();
        let lookup = |n: &str| snap.links().find(|l| l.name == n).map(|l| l.index);
        match catch_unwind(AssertUnwindSafe(|| parse_query(&refs, lookup))) {
            Err(_) => panic!("parse_query panicked on {refs:?}"),
            Ok(Ok(q)) => {
                if let Ok(a) = snap.route(&q) {
                    show::answer_text(&snap, &a);
                }
            }
            Ok(Err(reason)) => check_reason(&reason, &refs.join(" ")),
        }
    }
}
