//! Scenarios checked against the real kernel: the same configuration in a private network
//! namespace and in fibre, `ip -d -j route get` against fibre's answer, field by field.
//! Adapted from what the kernel's own selftests exercise (`fib_rule_tests.sh`,
//! `fib_nexthops.sh`, `fib_tests.sh`).

mod common;

const BASE: &str = "
link set lo up
link add a0 address 02:00:00:00:00:a0 type veth peer name a1 address 02:00:00:00:00:a1
link add b0 address 02:00:00:00:00:b0 type veth peer name b1 address 02:00:00:00:00:b1
link set a0 up
link set a1 up
link set b0 up
link set b1 up
addr add 10.0.0.1/24 dev a0
addr add 10.0.1.1/24 dev b0
addr add 192.168.5.1/24 dev a1
-6 addr add 2001:db8::1/64 dev a0 nodad
-6 addr add 2001:db8:1::1/64 dev b0 nodad
";

fn config(extra: &str) -> String {
    format!("{BASE}\n{extra}")
}

#[test]
#[ignore = "needs root: runs the kernel in a network namespace"]
fn addresses_make_local_broadcast_and_connected_routes() {
    common::check(
        "addr",
        &config(
            "addr add 10.0.0.9/24 dev a0\naddr add 10.7.0.1/32 dev b0\naddr add 10.8.0.1/31 dev b0",
        ),
        &[
            "10.0.0.1",
            "10.0.0.9",
            "10.0.0.255",
            "10.0.0.0",
            "10.0.0.77",
            "10.0.1.5",
            "127.0.0.1",
            "127.9.9.9",
            "10.7.0.1",
            "10.8.0.0",
            "10.8.0.1",
            "192.168.5.255",
            "192.168.5.7",
            "8.8.8.8",
            "255.255.255.255",
            "2001:db8::1",
            "2001:db8::5",
            "2001:db8:1::7",
            "::1",
            "2001:db9::1",
            "10.0.0.77 from 10.0.0.1",
            "10.0.0.77 from 10.0.1.1",
            "10.0.0.77 from 10.9.9.9",
            "10.0.0.77 oif b0",
            "10.1.0.1 oif b0",
            "10.0.0.255 from 10.0.0.2 iif a1",
            "10.0.0.1 from 10.0.0.2 iif a0",
            "10.0.1.7 from 10.0.0.2 iif a0",
            "10.0.0.7 from 10.0.0.2 iif a0",
        ],
    );
}

#[test]
#[ignore = "needs root: runs the kernel in a network namespace"]
fn route_types_metrics_tos_and_tables() {
    common::check(
        "types",
        &config(
            "route add 10.1.0.0/16 via 10.0.0.2
route add 10.1.0.0/16 via 10.0.1.2 metric 10
route add 10.1.1.0/24 via 10.0.1.2 tos 0x10
route add blackhole 10.2.0.0/16
route add unreachable 10.3.0.0/16
route add prohibit 10.4.0.0/16
route add 10.5.0.0/16 via 10.0.0.2 table 100
route add throw 10.5.5.0/24 table 100
route add 10.5.5.0/24 via 10.0.1.2
rule add from all lookup 100 pref 100
route add 10.6.0.0/16 via 10.0.0.2 src 10.0.1.1 mtu 1400
route add 10.7.0.0/16 via 10.0.0.2 hoplimit 33
route replace 10.7.0.0/16 via 10.0.0.2 hoplimit 40
route append 10.7.0.0/16 via 10.0.0.2 hoplimit 41
route add 10.9.0.0/16 dev b0 scope link
route add default via 10.0.0.254
-6 route add 2001:db8:5::/48 via 2001:db8::2
-6 route add 2001:db8:5::/48 via 2001:db8:1::2 metric 100
-6 route add unreachable 2001:db8:6::/48
-6 route add blackhole 2001:db8:7::/48
-6 route add prohibit 2001:db8:8::/48
-6 route add 2001:db8:9::/48 dev b0 metric 5
-6 route add 2001:db8:b::/48 via 2001:db8::2 mtu 1400 hoplimit 35
-6 route add 2001:db8:a::/48 via 2001:db8::2 table 100
-6 rule add lookup 100 pref 100
-6 route add default via 2001:db8:1::2",
        ),
        &[
            "10.1.2.3",
            "10.1.1.3",
            "10.1.1.3 tos 0x10",
            "10.1.1.3 tos 0x08",
            "10.2.0.1",
            "10.3.0.1",
            "10.4.0.1",
            "10.5.0.1",
            "10.5.5.1",
            "10.6.0.1",
            "10.7.0.1",
            "10.9.0.1",
            "8.8.8.8",
            "10.0.0.5",
            "2001:db8:5::1",
            "2001:db8:6::1",
            "2001:db8:7::1",
            "2001:db8:8::1",
            "2001:db8:9::1",
            "2001:db8:a::1",
            "2001:db8:b::1",
            "2001:db9::1",
            "10.1.2.3 from 10.0.1.1",
            "10.1.2.3 oif b0",
            "10.1.2.3 from 10.0.1.2 iif a1",
            "2001:db8:5::1 from 2001:db8::9 iif a1",
        ],
    );
}

#[test]
#[ignore = "needs root: runs the kernel in a network namespace"]
fn add_replace_append_prepend_change_del() {
    common::check(
        "ops",
        &config(
            "route add 10.1.0.0/16 via 10.0.0.2
route add 10.1.0.0/16 via 10.0.0.3
route append 10.1.0.0/16 via 10.0.0.4
route prepend 10.1.0.0/16 via 10.0.1.4
route append 10.1.0.0/16 via 10.0.0.4
route change 10.1.0.0/16 via 10.0.0.5
route change 10.77.0.0/16 via 10.0.0.5
route replace 10.2.0.0/16 via 10.0.0.6
route replace 10.2.0.0/16 via 10.0.1.6
route add 10.3.0.0/16 via 10.0.0.7
route add 10.3.0.0/16 via 10.0.1.7 metric 5
route del 10.3.0.0/16 metric 0
route del 10.3.0.0/16 via 10.0.0.7
route del 10.4.0.0/16
route add 10.4.0.0/16 via 10.0.0.9 table 7
route del 10.4.0.0/16
route del 10.4.0.0/16 table 7
route add 10.9.0.0/16 via 10.0.0.1
route add 10.10.0.0/16 via 10.99.0.1
route add 10.11.0.0/16 via 10.0.0.2 dev b0
route add 10.12.0.0/16 via 10.0.0.2 src 10.0.0.99
route add 10.13.0.0/16 via 10.0.0.2 dev b0 onlink
-6 route add 2001:db8:5::/48 via 2001:db8::2
-6 route add 2001:db8:5::/48 via 2001:db8::3
-6 route append 2001:db8:5::/48 via 2001:db8::3
-6 route replace 2001:db8:6::/48 via 2001:db8::2
-6 route replace 2001:db8:6::/48 via 2001:db8:1::2
-6 route add 2001:db8:7::/48 via 2001:db8::1",
        ),
        &[
            "10.1.2.3",
            "10.2.0.1",
            "10.3.0.1",
            "10.4.0.1",
            "10.9.0.1",
            "10.11.0.1",
            "10.13.0.1",
            "2001:db8:5::1",
            "2001:db8:6::1",
        ],
    );
}

#[test]
#[ignore = "needs root: runs the kernel in a network namespace"]
fn policy_rules_with_every_selector_and_action() {
    common::check(
        "rules",
        &config(
            "route add default via 10.0.0.2 table 10
route add default via 10.0.1.2 table 20
route add 10.50.0.0/16 via 10.0.1.3 table 30
rule add from 10.0.1.1 lookup 20 pref 100
rule add to 10.60.0.0/16 lookup 20 pref 110
rule add iif a1 lookup 10 pref 120
rule add oif b0 lookup 20 pref 130
rule add fwmark 0x5 lookup 10 pref 140
rule add fwmark 0x10/0xf0 lookup 20 pref 141
rule add tos 0x10 lookup 20 pref 150
rule add ipproto tcp dport 80 lookup 10 pref 160
rule add ipproto udp sport 1000-2000 lookup 20 pref 161
rule add uidrange 1000-1999 lookup 10 pref 170
rule add not to 10.0.0.0/8 lookup 30 pref 180
rule add to 10.70.0.0/16 goto 300 pref 190
rule add to 10.70.1.0/24 lookup 10 pref 200
rule add to 10.70.0.0/16 lookup 20 pref 300
rule add to 10.71.0.0/16 nop pref 310
rule add to 10.72.0.0/16 blackhole pref 320
rule add to 10.73.0.0/16 unreachable pref 330
rule add to 10.74.0.0/16 prohibit pref 340
rule add lookup main suppress_prefixlength 0 pref 350
rule add to 10.80.0.0/16 lookup 10 pref 360
route add default via 10.0.0.200
-6 route add default via 2001:db8::2 table 10
-6 rule add from 2001:db8:1::/64 lookup 10 pref 100
-6 rule add to 2001:db8:70::/48 unreachable pref 110
-6 rule add fwmark 7 lookup 10 pref 120",
        ),
        &[
            "10.50.0.1",
            "10.50.0.1 from 10.0.1.1",
            "10.60.0.1",
            "10.55.0.1 from 10.0.1.2 iif a1",
            "10.55.0.1 oif b0",
            "10.55.0.1 mark 5",
            "10.55.0.1 mark 0x15",
            "10.55.0.1 mark 0x25",
            "10.55.0.1 tos 0x10",
            "10.55.0.1 ipproto tcp dport 80",
            "10.55.0.1 ipproto tcp dport 81",
            "10.55.0.1 ipproto udp sport 1500",
            "10.55.0.1 uid 1500",
            "10.55.0.1 uid 2000",
            "11.0.0.1",
            "10.70.1.1",
            "10.70.2.1",
            "10.71.0.1",
            "10.72.0.1",
            "10.73.0.1",
            "10.74.0.1",
            "10.80.0.1",
            "10.0.0.9",
            "2001:db8:99::1 from 2001:db8:1::1",
            "2001:db8:70::1",
            "2001:db8:99::1 mark 7",
            "2001:db8:99::1",
        ],
    );
}

#[test]
#[ignore = "needs root: runs the kernel in a network namespace"]
fn deleting_the_default_rules_and_rules_naming_missing_links() {
    common::check(
        "defrules",
        &config(
            "route add 10.50.0.0/16 via 10.0.0.2 table 10
rule add lookup 10 pref 10
rule del pref 32766
rule add iif nosuchdev lookup main pref 5
rule add oif b0 lookup main pref 6
-6 rule del pref 0
-6 rule add lookup local pref 1000",
        ),
        &[
            "10.50.0.1",
            "10.0.0.7",
            "10.0.0.7 oif b0",
            "10.0.0.1",
            "2001:db8::1",
            "2001:db8::9",
            "10.61.0.1",
        ],
    );
    // Deleting a rule, even with none ever added, makes the kernel walk the rules:
    // `local` and `main` apart, `local` first.
    common::check(
        "delonly",
        &config("rule del pref 32767"),
        &[
            "10.0.0.1",
            "10.0.0.255",
            "10.0.0.7",
            "10.0.0.7 from 192.0.2.1 iif a1",
            "10.0.0.1 from 192.0.2.1 iif a1",
        ],
    );
}

#[test]
#[ignore = "needs root: runs the kernel in a network namespace"]
fn links_going_down_take_their_routes() {
    common::check(
        "down",
        &config(
            "route add 10.1.0.0/16 via 10.0.0.2
route add 10.2.0.0/16 nexthop via 10.0.0.2 nexthop via 10.0.1.2
route add 10.3.0.0/16 via 10.0.1.2
route add 10.4.0.0/16 dev a0
-6 route add 2001:db8:5::/48 via 2001:db8::2
link set a0 down
link set b1 down",
        ),
        &[
            "10.1.0.1",
            "10.2.0.1",
            "10.3.0.1",
            "10.4.0.1",
            "10.0.0.1",
            "10.0.0.5",
            "10.0.0.255",
            "10.0.1.5",
            "2001:db8:5::1",
            "2001:db8::1",
            "2001:db8:1::5",
        ],
    );
}

#[test]
#[ignore = "needs root: runs the kernel in a network namespace"]
fn nexthop_objects_and_groups() {
    common::check(
        "nh",
        &config(
            "nexthop add id 1 via 10.0.0.2 dev a0
nexthop add id 2 via 10.0.1.2 dev b0
nexthop add id 3 group 1/2
nexthop add id 4 blackhole
nexthop add id 5 dev b0
route add 10.1.0.0/16 nhid 1
route add 10.2.0.0/16 nhid 3
route add 10.3.0.0/16 nhid 4
route add 10.4.0.0/16 nhid 5
nexthop replace id 1 via 10.0.0.3 dev a0
nexthop add id 6 via 2001:db8::2 dev a0
-6 route add 2001:db8:5::/48 nhid 6
nexthop del id 2",
        ),
        &[
            "10.1.0.1",
            "10.2.0.1",
            "10.3.0.1",
            "10.4.0.1",
            "2001:db8:5::1",
        ],
    );
}

/// Each difference the random comparison (`kernel_random.rs`) found, kept as a scenario.
#[test]
#[ignore = "needs root: runs the kernel in a network namespace"]
fn differences_the_random_comparison_found() {
    common::check(
        "found",
        &config(
            "# A link losing its carrier takes its nexthop objects (and groups lose them).
nexthop add id 1 via 10.0.0.2 dev a0
nexthop add id 2 via 10.0.1.2 dev b0
nexthop add id 3 group 1/2
link set b1 down
route add 10.9.0.0/16 nhid 2
route add 10.8.0.0/16 nhid 3
link set b1 up
# IPv4 `route get` without a protocol is asked as UDP.
rule add ipproto udp prohibit pref 100
rule add dport 0 prohibit pref 101
rule add sport 1-65535 prohibit pref 102
rule add uidrange 9-3 prohibit pref 103
# An IPv6 gateway is checked in the route's own table first, before the rules.
-6 rule add to 2001:db8::/64 prohibit pref 200
-6 route add 2001:db8:3::/48 via 2001:db8::4
# ... and then through the rules with no suppress_prefixlength: a route via a gateway
# in table 10 refuses it.
-6 route add ::/0 via fe80::2 dev a0 table 10
-6 rule add lookup 10 suppress_prefixlength 16 pref 300
-6 route add 2001:db8:4::/48 via 2001:db8:1::4 table 10
-6 route add 2001:db8:4::/48 via 2001:db8:1::4
# IPv6 deletes do not compare the type; a reject route duplicates another.
-6 route add unreachable 2001:db8:7::/48
-6 route del blackhole 2001:db8:7::/48
-6 route add prohibit 2001:db8:8::/48
-6 route prepend blackhole 2001:db8:8::/48
-6 route change 2001:db8:9::/48 via 2001:db8::2
# Rule deletes compare neither a goto target nor `not`.
rule add fwmark 7 goto 400 pref 150
rule add lookup main pref 400
rule del goto 390 pref 150
-6 rule add not fwmark 9 lookup 20 pref 160
-6 rule del fwmark 9 lookup 20 pref 160
# A rule exists already if the new one's source, destination and TOS are not given.
rule add to 10.3.0.0/16 lookup 20 pref 170
rule add lookup 20 pref 170
# A nexthop object needs its link's carrier.
link set a1 down
nexthop add id 9 via 10.0.0.9 dev a0
link set a1 up
# An IPv4 gateway that is one of our addresses picks the source from its subnet.
addr add 10.0.0.5/24 dev b0
route add 10.4.0.0/16 via 10.0.0.5
# IPv6 source-specific routes: a destination whose sources do not hold the flow's is
# passed over (its own routes too); a source given makes `oif` a preference.
-6 route replace 2001:db8:a::/48 dev b0 metric 10
-6 route replace 2001:db8:a::/48 from 2001:db8:1::/64 via 2001:db8::2
-6 route replace 2001:db8::/32 via 2001:db8:1::3
-6 route del 2001:db8:b::/48 from 2001:db8::/48
# IPv6 paths through a link that comes up without its carrier stay dead.
-6 route add 2001:db8:c::/48 nexthop via 2001:db8::2 nexthop via 2001:db8:1::3
link set b1 down
link set b0 down
link set b0 up
-6 route del 2001:db8:c::/48 nexthop via 2001:db8::2 nexthop via 2001:db8::7",
        ),
        &[
            "10.8.0.1",
            "10.8.0.1 ipproto tcp",
            "10.9.0.1 ipproto tcp",
            "10.8.0.1 ipproto udp dport 53",
            "10.0.1.9 mark 7 ipproto tcp",
            "2001:db8:3::1",
            "2001:db8:4::1",
            "2001:db8:7::1",
            "2001:db8:8::1",
            "2001:db8:9::1",
            "2001:db8::9 mark 9",
            "10.4.0.1",
            "10.3.0.1 mark 3",
            "2001:db8:a::1",
            "2001:db8:a::1 from 2001:db8:1::1",
            "2001:db8:a::1 from 2001:db8::1",
            "2001:db8:a::1 from 2001:db8:1::1 oif b0",
            "2001:db8:c::1",
            "2001:db8:c::1 oif b0",
        ],
    );
}

/// Multipath with the kernel's hash: the same seed on both sides, policies L3 and L4 in
/// turn, weighted IPv4 and IPv6 paths and a nexthop group, flows with and without ports
/// and sources (an IPv4 flow from an address of one link prefers that link's paths).
/// Every answer must name the kernel's own path.
#[test]
#[ignore = "needs root: runs the kernel in a network namespace"]
fn multipath_takes_the_kernel_s_path_for_every_flow() {
    let routes = "route add 10.9.0.0/16 nexthop via 10.0.0.2 nexthop via 10.0.0.3 weight 2 nexthop via 10.0.1.4
-6 addr add 2001:db8::1/64 dev a0 nodad
-6 addr add 2001:db8:1::1/64 dev b0 nodad
-6 route add 2001:db8:9::/48 nexthop via 2001:db8::2 nexthop via 2001:db8::3 weight 3 nexthop via 2001:db8:1::4
nexthop add id 1 via 10.0.0.2 dev a0
nexthop add id 2 via 10.0.1.2 dev b0
nexthop add id 3 group 1/2,3
route add 10.10.0.0/16 nhid 3";
    let mut queries = Vec::new();
    for i in 0..150u32 {
        let (a, b) = (i * 7 % 256, i * 13 % 256);
        queries.push(format!("10.9.{a}.{b}"));
        queries.push(format!(
            "10.10.{a}.{b} ipproto tcp sport {} dport 443",
            1000 + i
        ));
        queries.push(format!("10.9.{a}.{b} from 10.0.{}.1", i % 2));
        queries.push(format!(
            "10.9.{b}.{a} ipproto udp sport {} dport {}",
            5000 + i,
            53 + i
        ));
        queries.push(format!("2001:db8:9:{a:x}::{b:x}"));
        queries.push(format!(
            "2001:db8:9:{b:x}::{a:x} ipproto tcp sport {} dport 80",
            2000 + i
        ));
    }
    let queries: Vec<&str> = queries.iter().map(String::as_str).collect();
    for policy in ["0", "1"] {
        let policies = format!(
            "sysctl -w net.ipv4.fib_multipath_hash_policy={policy}\n\
             sysctl -w net.ipv6.fib_multipath_hash_policy={policy}\n"
        );
        common::check(
            &format!("mp{policy}"),
            &config(&format!("{policies}{routes}")),
            &queries,
        );
    }
}

#[test]
#[ignore = "needs root: runs the kernel in a network namespace"]
fn flows_arriving_on_a_link_as_the_kernel_routes_them() {
    // IPv6 looks such a flow up preferring routes that leave by its input link (strictly
    // for link-local and loopback destinations), with no check of its source, even when
    // the link is down. Its uid: for IPv4 always 0 (a packet's), for IPv6 the query's,
    // and with none the invalid uid, which no `uidrange` holds.
    common::check(
        "input",
        &config(
            "-6 addr add 2001:db8:9::1/64 dev a1 nodad
-6 addr add 2001:db8:9::2/64 dev b0 nodad
-6 route add 2001:db8:5::/64 dev a1 metric 100
-6 route append 2001:db8:5::/64 dev b0 metric 100
-6 route add 2001:db8:6::/64 via 2001:db8::2 metric 100
-6 route append 2001:db8:6::/64 via 2001:db8:1::2 metric 100
-6 route add 2001:db8:7::/64 via 2001:db8::2
-6 rule add to 2001:db8:7::/64 uidrange 0-0 prohibit pref 100
route add 10.70.0.0/16 via 10.0.0.2
rule add to 10.70.0.0/16 uidrange 0-0 prohibit pref 100
link set b1 down",
        ),
        &[
            "2001:db8:9::7",
            "2001:db8:9::7 iif a1",
            "2001:db8:9::7 iif b0",
            "2001:db8:9::7 iif a0",
            "2001:db8:9::7 from 2001:db8::5 iif b0",
            "2001:db8:5::7",
            "2001:db8:5::7 iif a1",
            "2001:db8:5::7 iif b0",
            "2001:db8:5::7 iif a0",
            "2001:db8:5::7 iif b1",
            "2001:db8:6::7 iif a0",
            "2001:db8:6::7 from 2001:db8:1::5 iif b0",
            "2001:db8:6::8 from 2001:db8:1::5 iif a1",
            "fe80::1 iif a1",
            "fe80::1 iif b0",
            "::1 iif a0",
            "2001:db8::1 iif b0",
            "2001:db8::1 iif b1",
            "2001:db8:1:: iif a0",
            "2001:db8:7::1",
            "2001:db8:7::1 iif a0",
            "2001:db8:7::1 iif a0 uid 0",
            "2001:db8:8::1 from fe80::1 iif a0",
            "10.70.0.1",
            "10.70.0.1 from 10.0.1.5 iif b1",
            "10.70.0.1 from 10.0.1.5 iif a1 uid 1500",
            "2001:db8:7::1 iif a0 uid 1500",
        ],
    );
}

#[test]
#[ignore = "needs root: runs the kernel in a network namespace"]
fn ipv6_addresses_on_links_without_carrier() {
    // A `nodad` address has its local route at once, even on a link that is down; its
    // prefix route and the link's multicast route come with the link being up, carrier
    // or not; the rest of IPv6 (link-local) waits for the carrier.
    let links =
        "link add c0 address 02:00:00:00:00:c0 type veth peer name c1 address 02:00:00:00:00:c1
link add d0 address 02:00:00:00:00:d0 type veth peer name d1 address 02:00:00:00:00:d1
link set c0 up
-6 addr add 2001:db8:c::1/64 dev c0 nodad
-6 addr add 2001:db8:d::1/64 dev d0 nodad
-6 addr add 2001:db8:e::1/64 dev d0 nodad noprefixroute";
    let queries = [
        "2001:db8:c::1",
        "2001:db8:c::7",
        "2001:db8:d::1",
        "2001:db8:d::7",
        "2001:db8:e::1",
        "2001:db8:e::7",
        "ff02::1 oif c0",
        "ff02::1 oif d0",
        "2001:db8:d::1 from 2001:db8::5 iif a1",
        "2001:db8:d::7 from 2001:db8::5 iif a1",
    ];
    common::check("nocarrier", &config(links), &queries);
    common::check(
        "upnocarrier",
        &config(&format!("{links}\nlink set d0 up")),
        &queries,
    );
    common::check(
        "carrier",
        &config(&format!(
            "{links}\nlink set d0 up\nlink set d1 up\nlink set c1 up"
        )),
        &queries,
    );
}

#[test]
#[ignore = "needs root: runs the kernel in a network namespace"]
fn destinations_that_are_not_unicast() {
    // Multicast, broadcast, the unspecified address and the other special ranges, sent by
    // this host and arriving on a link.
    let queries = [
        "224.0.0.1",
        "224.0.0.251",
        "239.1.2.3",
        "233.252.0.1 oif a0",
        "224.0.0.1 from 10.0.0.1",
        "224.0.0.1 from 10.0.0.5 iif a1",
        "239.1.2.3 from 192.168.5.9 iif a1",
        "255.255.255.255",
        "255.255.255.255 oif a0",
        "255.255.255.255 from 10.0.0.1",
        "255.255.255.255 from 192.168.5.9 iif a1",
        "10.0.0.255",
        "10.0.0.255 from 192.168.5.9 iif a1",
        "192.168.5.255 from 192.168.5.9 iif a1",
        "127.255.255.255",
        "127.0.0.0",
        "0.0.0.0",
        "0.0.0.0 oif a0",
        "0.0.0.0 from 192.168.5.9 iif a1",
        "0.1.2.3",
        "240.0.0.1",
        "240.0.0.1 from 192.168.5.9 iif a1",
        "169.254.1.1",
        "100.64.0.1",
        "::",
        "::1",
        ":: from 2001:db8::1",
        ":: from 2001:db8::5 iif a1",
        "ff02::1",
        "ff02::1 oif a0",
        "ff05::2",
        "ff0e::1",
        "ff02::1 from 2001:db8::5 iif a1",
        "fe80::1",
        "fe80::1 oif a0",
        "::ffff:10.0.0.5",
        "::10.0.0.5",
        "64:ff9b::1",
        "fc00::1",
        "2002::1",
        "224.0.0.1 oif lo",
        "224.0.0.1 oif b0",
        "239.1.1.1 oif b0",
        "239.1.1.1 from 10.0.1.1",
        "224.0.0.1 from 10.9.9.9",
        "255.255.255.255 from 10.9.9.9",
        "224.0.0.1 from 127.0.0.1",
        "224.0.0.1 from 127.0.0.1 oif a0",
        "255.255.255.255 from 127.0.0.5",
        "224.0.0.1 from 10.0.0.5 iif b1",
        "224.0.0.1 from 10.0.0.5 iif lo",
        "224.0.0.1 iif a1",
        "224.0.0.2 iif a1",
        "239.0.0.1 iif a1",
        "224.0.0.1 from 10.0.0.1 iif a1",
        "224.0.0.1 from 127.0.0.1 iif a1",
        "224.0.0.1 from 0.0.0.0 iif a1",
        "255.255.255.255 iif a1",
        "255.255.255.255 from 10.0.0.1 iif a1",
        "255.255.255.255 from 127.0.0.1 iif a1",
        "255.255.255.255 from 127.0.0.5 iif a1",
        "255.255.255.255 from 0.1.2.3 iif a1",
        "255.255.255.255 from 224.1.1.1 iif a1",
        "0.0.0.0 from 10.0.1.1",
        "0.0.0.0 from 10.0.1.1 oif a0",
        "0.0.0.0 oif b1",
        "0.0.0.0 oif b0",
        "0.0.0.0 iif a1",
        "0.0.0.0 from 0.0.0.0 iif b1",
        "255.255.255.255 oif b1",
        "255.255.255.255 oif lo",
        "::ffff:10.0.0.5",
        "ff02::1 iif a1",
        ":: iif a1",
        "239.1.1.1 from 127.0.0.1",
        "239.1.1.1 oif lo",
        "224.0.0.1 from 0.0.0.0",
        "255.255.255.255 from 0.0.0.0",
        "0.0.0.0 from 0.0.0.0",
        "8.8.8.8 from 0.0.0.0",
    ];
    let base = "link set b1 down\n-6 route add default via 2001:db8::2";
    // Through a default route (whose gateway and metrics a multicast does not take).
    common::check(
        "special",
        &config(&format!("{base}\nroute add default via 10.0.0.2 mtu 1400")),
        &queries,
    );
    // Through a route of the multicast range itself, which keeps them; and with a rule,
    // the kernel looks the sources of arriving broadcasts up.
    common::check(
        "specialmc",
        &config(&format!(
            "{base}\nroute add 224.0.0.0/4 via 10.0.1.2 mtu 1300\nroute add default via 10.0.0.2
rule add from 10.0.0.5 prohibit pref 100\nroute add 10.0.0.5 dev b0 table 7
rule add to 10.0.0.5 lookup 7 pref 200"
        )),
        &queries,
    );
    // No route: only what names its link or source goes.
    common::check("specialnone", &config(base), &queries);
}
