//! The whole real tables with rules, against the kernel: every IPv4 and IPv6 route of the
//! shipped BGP tables in `main` (through eight gateways each), a few thousand of them in
//! two more tables, and rules of every kind in front; then 20,000 queries (addresses
//! inside real routes and anywhere, with marks, ports and sources that the rules select
//! on) asked of the kernel (`ip route get`) and of fibre (`route` and `lookup`), compared
//! field by field.

mod common;

use fibre_fib::config;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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

/// The rules, the same words for both (IPv6 ones start with `-6`).
const RULES: &str = "
rule add fwmark 7 lookup 100 pref 100
rule add from 10.0.1.0/24 lookup 200 pref 110
rule add to 20.0.0.0/8 prohibit pref 120
rule add ipproto tcp dport 8000-8099 lookup 200 pref 130
rule add not fwmark 9 goto 150 pref 140
rule add fwmark 5 unreachable pref 145
rule add lookup main suppress_prefixlength 0 pref 150
rule add dport 53 lookup 100 pref 160
-6 rule add fwmark 7 lookup 100 pref 100
-6 rule add from 2001:db8:1::/64 lookup 200 pref 110
-6 rule add to 2a00::/12 prohibit pref 120
-6 rule add ipproto udp dport 53 lookup 200 pref 130
-6 rule add lookup main suppress_prefixlength 0 pref 150
";

/// The route lines of a family: all of `main`, and every 300th prefix in tables 100 and
/// 200 through the other link.
fn routes(prefixes: &[String], v6: bool) -> (String, Vec<String>) {
    let (gw_a, gw_b) = if v6 {
        ("2001:db8::", "2001:db8:1::")
    } else {
        ("10.0.0.", "10.0.1.")
    };
    let mut main = String::with_capacity(prefixes.len() * 48);
    let mut others = Vec::new();
    for (i, p) in prefixes.iter().enumerate() {
        main += &format!("route add {p} via {gw_a}{} dev a0\n", 2 + i % 8);
        if i % 300 == 0 {
            let table = if i % 600 == 0 { 100 } else { 200 };
            let flag = if v6 { "-6 " } else { "" };
            others.push(format!(
                "{flag}route add {p} via {gw_b}{} dev b0 table {table}",
                2 + i % 5
            ));
        }
    }
    (main, others)
}

fn queries(rng: &mut SmallRng, v4: &[String], v6: &[String]) -> Vec<String> {
    let inside = |rng: &mut SmallRng, p: &str| -> IpAddr {
        let net = fibre_fib::Net::parse(p, None).expect("a real prefix");
        let host = rng.gen::<u128>() >> net.len().min(127);
        match net.addr() {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(
                u32::from(a) | (host as u32 >> net.len().min(31)),
            )),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) | host)),
        }
    };
    (0..20_000)
        .map(|i| {
            let v6_query = i % 3 == 0;
            let dst = match (v6_query, rng.gen_range(0..4)) {
                // Unicast space only (multicast is not routed here).
                (false, 0) => IpAddr::V4(Ipv4Addr::from(rng.gen_range(1 << 24..224 << 24))),
                (true, 0) => IpAddr::V6(Ipv6Addr::from(0x2000u128 << 112 | rng.gen::<u128>() >> 4)),
                (false, _) => {
                    let p = &v4[rng.gen_range(0..v4.len())];
                    inside(rng, p)
                }
                (true, _) => {
                    let p = &v6[rng.gen_range(0..v6.len())];
                    inside(rng, p)
                }
            };
            let mut q = dst.to_string();
            if rng.gen_bool(0.15) {
                q += &format!(" mark {}", [5, 7, 9][rng.gen_range(0..3)]);
            }
            if rng.gen_bool(0.2) {
                let proto = ["tcp", "udp"][rng.gen_range(0..2)];
                q += &format!(
                    " ipproto {proto} dport {}",
                    [53, 8050, 443][rng.gen_range(0..3)]
                );
            }
            if rng.gen_bool(0.15) {
                q += if v6_query {
                    " from 2001:db8:1::1"
                } else {
                    " from 10.0.1.1"
                };
            }
            q
        })
        .filter(|q| !q.starts_with("0.") && !q.starts_with("127."))
        .collect()
}

#[test]
#[ignore = "needs root: loads the whole real tables into the kernel of a network namespace"]
fn the_whole_real_tables_with_rules_answer_as_the_kernel() {
    let ns = common::namespace("full");
    let lines = |text: &str| -> Vec<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    };
    let applied = common::apply_both(&ns, &lines(BASE));
    assert!(
        applied.disagreements.is_empty(),
        "{:?}",
        applied.disagreements
    );
    let mut state = applied.state;
    let (v4, v6) = (
        common::shipped_prefixes("rib-v4.txt.gz"),
        common::shipped_prefixes("rib-v6.txt.gz"),
    );
    assert!(v4.len() > 1_000_000 && v6.len() > 200_000);
    for (prefixes, family) in [(&v4, 4u8), (&v6, 6u8)] {
        let (main, others) = routes(prefixes, family == 6);
        ns.batch_family(family, &main)
            .expect("the kernel takes the table");
        let text: String = main
            .lines()
            .map(|l| {
                if family == 6 {
                    format!("-6 {l}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        config::apply_text(&mut state, "table", &text).expect("fibre takes the table");
        for l in &others {
            let k = common::kernel_line(&ns, l);
            let f = config::apply_line(&mut state, l);
            assert!(k.is_ok() && f.is_ok(), "{l}: kernel {k:?}, fibre {f:?}");
        }
    }
    for line in lines(RULES) {
        common::kernel_line(&ns, &line).unwrap_or_else(|e| panic!("{line}: {e}"));
        config::apply_line(&mut state, &line).unwrap_or_else(|e| panic!("{line}: {e}"));
    }
    let mut rng = SmallRng::seed_from_u64(11);
    let queries = queries(&mut rng, &v4, &v6);
    let kernel = common::kernel_answers(&ns, &queries);
    let fibre = common::fibre_answers(&state, &queries);
    let (n, shown) = common::mismatches(&queries, &kernel, &fibre, 20);
    assert_eq!(
        n,
        0,
        "{n} of {} answers differ:\n{}",
        queries.len(),
        shown.join("\n")
    );
    let answered = kernel.iter().filter(|k| k.is_ok()).count();
    assert!(answered > 10_000, "only {answered} queries had a route");
}
