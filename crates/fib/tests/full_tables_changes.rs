//! Every kind of change on the full tables (1,042,325 IPv4 and 246,175 IPv6 routes from
//! `data/`) is published by a patch, not a compile, and answers as the state compiled
//! anew: IPv4's first rule, a route, an address, a nexthop object carrying 100,000
//! routes standing for another path, a rule added and deleted, a table appearing and going, a link carrying
//! 1,000 routes going down and up. `--nocapture` prints each change's time (the figures
//! that count are `fibre bench mirror`'s, against the kernel).

mod common;

use fibre_fib::{config, Family, Fib, Net, Query, Route, RouteOp, State};
use std::net::IpAddr;
use std::time::Instant;

/// The prefixes of a shipped table.
fn prefixes(name: &str) -> Vec<Net> {
    common::shipped_prefixes(name)
        .iter()
        .filter_map(|p| Net::parse(p, None).ok())
        .collect()
}

const SETUP: &str = "\
link add up0 type veth peer name up1
link set up0 up
link set up1 up
addr add 192.0.2.1/24 dev up0
addr add 2001:db8:ffff::1/64 dev up0
link add fx type veth peer name fy
link set fx up
link set fy up
addr add 10.201.0.1/24 dev fx
nexthop add id 100 via 192.0.2.2 dev up0
";

fn route(dst: Net, dev: u32) -> Route {
    let gateway: IpAddr = if dst.family() == Family::V6 {
        "2001:db8:ffff::2"
    } else {
        "192.0.2.2"
    }
    .parse()
    .expect("an address");
    common::route_via(dst, dev, gateway)
}

#[test]
fn every_change_on_the_full_tables_is_patched() {
    let mut state = State::new();
    config::apply_text(&mut state, "setup", "link set lo up").unwrap();
    config::apply_text(&mut state, "setup", SETUP).unwrap();
    let up0 = state.link_by_name("up0").unwrap().index;
    let mut dsts: Vec<IpAddr> = Vec::new();
    for (i, dst) in prefixes("rib-v4.txt.gz")
        .into_iter()
        .chain(prefixes("rib-v6.txt.gz"))
        .enumerate()
    {
        if i % 10_000 == 0 {
            dsts.push(dst.addr());
        }
        state
            .modify_route(RouteOp::Replace, route(dst, up0))
            .unwrap();
    }
    let mut setup = String::new();
    for i in 0..1000 {
        setup += &format!(
            "route add 10.210.{}.{}/32 via 10.201.0.2\n",
            i / 250,
            i % 250
        );
    }
    for i in 0..100_000 {
        setup += &format!(
            "route add 100.{}.{}.{}/32 nhid 100 table 300\n",
            64 + i / 65_536,
            i / 256 % 256,
            i % 256
        );
    }
    config::apply_text(&mut state, "setup", &setup).unwrap();
    dsts.extend(
        [
            "10.210.0.1",
            "10.210.3.249",
            "100.64.0.1",
            "100.65.134.159",
            "198.18.254.1",
            "192.0.2.1",
            "192.0.2.255",
            "127.0.0.1",
        ]
        .iter()
        .map(|a| a.parse::<IpAddr>().unwrap()),
    );
    let (mut fib, reader) = Fib::new(state);
    let changes = [
        ("a route", "route replace 198.18.255.1/32 via 192.0.2.2"),
        (
            "the first IPv4 rule (parts local from main)",
            "rule add from 10.204.0.0/24 lookup 301 pref 900",
        ),
        ("an address", "addr add 10.202.0.1/24 dev fx"),
        (
            "a nexthop object carrying 100,000 routes",
            "nexthop replace id 100 via 192.0.2.3 dev up0",
        ),
        (
            "a rule added",
            "rule add from 10.203.0.0/24 lookup 300 pref 1000",
        ),
        ("a rule deleted", "rule del pref 1000"),
        (
            "a new table",
            "route add 198.18.254.0/24 via 192.0.2.2 table 400",
        ),
        ("a table gone", "route del 198.18.254.0/24 table 400"),
        ("a link down (1,000 routes through it)", "link set fx down"),
        ("the link up again", "link set fx up"),
    ];
    let mut patched = fib.publications().patched;
    // The second step of each change adds a route none of the checked destinations is
    // in: the answers of the state compiled after the first step stand for both.
    let second = "route replace 198.18.255.2/32 via 192.0.2.2";
    let second_dst = Net::parse("198.18.255.2/32", None).unwrap();
    assert!(dsts.iter().all(|d| !second_dst.contains(*d)));
    for (what, line) in changes {
        // Twice: the writer patches the snapshot published before the current one, so
        // both it and the one after are checked.
        let mut fresh = Vec::new();
        for step in [line, second] {
            let took = Instant::now();
            fib.update(|s, t| {
                config::apply_line(s, step).unwrap();
                t.others();
            });
            let took = took.elapsed();
            patched += 1;
            assert_eq!(fib.publications().patched, patched, "{what}: {step}");
            eprintln!(
                "{what}: {step}: {:.2} ms (with the line's own checks)",
                took.as_secs_f64() * 1e3
            );
            if fresh.is_empty() {
                let compiled = fib.state().snapshot();
                fresh = dsts
                    .iter()
                    .map(|&d| compiled.route(&Query::to(d)))
                    .collect();
            }
            let now = reader.snapshot();
            for (&dst, fresh) in dsts.iter().zip(&fresh) {
                assert_eq!(&now.route(&Query::to(dst)), fresh, "{what}: {step}: {dst}");
            }
        }
    }
}
