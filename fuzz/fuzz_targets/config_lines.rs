//! Fuzzes the configuration reader: any text, split into lines and applied one by one to
//! a router's base configuration, gives accepted lines or a short one-line reason, never
//! a panic (the project's rule: bad input gives `FILE:LINE: reason`); every state a line
//! leaves compiles and answers queries about the addresses the line names; the same text
//! as a file applies all or nothing, naming the line that stopped it; the words of each
//! line read as a `route get` query give a query or a reason. The integration test
//! `crates/fib/tests/config_fuzz.rs` checks the same on generated lines.
#![no_main]

use fibre_fib::{config, parse_query, Query, Snapshot, State};
use libfuzzer_sys::fuzz_target;
use std::net::IpAddr;
use std::sync::OnceLock;

/// Links up, addresses of both families, nexthop objects and a group, routes in two
/// tables, an IPv6 source route, and rules with selectors and actions.
const BASE: &str = "
link set lo up
link add a0 type veth peer name a1
link add b0 type veth peer name b1
link add d0 type dummy
link set a0 up
link set a1 up
link set b0 up
link set b1 up
link set d0 up
addr add 10.0.0.1/24 dev a0
addr add 10.0.1.1/24 dev b0
addr add 172.16.0.1/16 dev d0
-6 addr add 2001:db8::1/64 dev a0 nodad
-6 addr add 2001:db8:1::1/64 dev b0 nodad
nexthop add id 1 via 10.0.0.2 dev a0
nexthop add id 2 via 10.0.1.2 dev b0
nexthop add id 3 group 1/2,3
nexthop add id 4 blackhole
route add default via 10.0.0.2
route add 10.1.0.0/16 via 10.0.0.2 table 10 metric 5
route add 10.2.0.0/16 nhid 3
route add 10.3.0.0/16 nexthop via 10.0.0.2 weight 2 nexthop via 10.0.1.2
route add unreachable 10.10.0.0/16 table 10
-6 route add 2001:db8:100::/48 via 2001:db8::2 dev a0
-6 route add 2001:db8:200::/48 from 2001:db8:1::/48 via 2001:db8:1::2
rule add from 10.0.0.0/24 iif a1 fwmark 0x10/0xf0 ipproto tcp dport 80 lookup 10 pref 100
rule add fwmark 7 goto 300 pref 250
rule add nop pref 300
rule add lookup main suppress_prefixlength 0 pref 400
-6 rule add from 2001:db8:1::/48 lookup 10 pref 100
";

fn base() -> &'static State {
    static STATE: OnceLock<State> = OnceLock::new();
    STATE.get_or_init(|| {
        let mut state = State::new();
        config::apply_text(&mut state, "base", BASE).expect("the base configuration applies");
        state
    })
}

/// An error's reason: something, on one line, printable, short.
fn check_reason(reason: &str) {
    assert!(!reason.trim().is_empty(), "an empty reason");
    assert!(
        !reason.chars().any(char::is_control),
        "a reason with a line break or a control character: {reason:?}"
    );
    assert!(
        reason.chars().count() < 300,
        "a reason of {} characters: {reason:?}",
        reason.chars().count()
    );
}

/// Queries about the addresses a line names (and a few fixed ones): alone, from one of
/// the base's addresses, out of and into its links, with a mark.
fn query(snap: &Snapshot, line: &str) {
    let named = line
        .split_whitespace()
        .filter_map(|w| w.split('/').next()?.parse::<IpAddr>().ok())
        .take(4);
    let fixed = ["10.1.2.3", "10.3.0.9", "8.8.8.8", "2001:db8:200::1", "::1"]
        .map(|a| a.parse::<IpAddr>().expect("literal"));
    for dst in named.chain(fixed) {
        let from: IpAddr = if dst.is_ipv4() {
            "10.0.0.1".parse().expect("literal")
        } else {
            "2001:db8:1::1".parse().expect("literal")
        };
        let mut q = Query::to(dst);
        let _ = snap.route(&q);
        q.src = Some(from);
        q.mark = 7;
        let _ = snap.route(&q);
        q.oif = Some(3);
        let _ = snap.route(&q);
        q.oif = None;
        q.iif = Some(2);
        let _ = snap.route(&q);
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() > 1 << 16 {
        return;
    }
    let text = String::from_utf8_lossy(data);
    // Line by line: a refused line is undone, as a file's refused line undoes the file.
    let mut state = base().clone();
    let mut snap = state.snapshot();
    let mut first_refused = None;
    for (n, line) in text.lines().take(64).enumerate() {
        let mut next = state.clone();
        match config::apply_line(&mut next, line) {
            Ok(()) => {
                state = next;
                snap = state.snapshot();
            }
            Err(reason) => {
                first_refused.get_or_insert(n + 1);
                check_reason(&reason);
            }
        }
        query(&snap, line);
        let words: Vec<&str> = line.split_whitespace().collect();
        match parse_query(&words, |n| {
            snap.links().find(|l| l.name == n).map(|l| l.index)
        }) {
            Ok(q) => {
                let _ = snap.route(&q);
            }
            Err(reason) => check_reason(&reason),
        }
    }
    if text.lines().count() > 64 {
        return;
    }
    // As a file: all of it, as the lines applied one by one, or none of it.
    let mut whole = base().clone();
    match config::apply_text(&mut whole, "fuzz.conf", &text) {
        Ok(()) => {
            assert_eq!(
                first_refused, None,
                "a file applied with a line refused alone"
            );
            assert_eq!(format!("{whole:?}"), format!("{state:?}"));
        }
        Err(e) => {
            assert_eq!(
                Some(e.line),
                first_refused,
                "the file stopped elsewhere: {e}"
            );
            assert_eq!(e.to_string(), format!("fuzz.conf:{}: {}", e.line, e.reason));
            check_reason(&e.reason);
            assert_eq!(format!("{whole:?}"), format!("{:?}", base()));
        }
    }
});
