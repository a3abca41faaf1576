//! The kernel probe is a lookup, not only a timer: in a private namespace holding a
//! sample of the real table, every route with a gateway of its own, the probe's answer
//! for each address must be the gateway `ip route get` names (or "no route" where it
//! finds none), and the route fibre's structures (the trie and the range tree, in every
//! form this CPU runs) find for the same address.
//! Needs root and iproute2: ignored otherwise (`cargo test -- --include-ignored` as root).

use fibre_bench::addresses;
use fibre_lpm::{Form, Key, Prefix, Structure, Table};
use fibre_routefile::{final_prefixes, read_route_file};
use fibre_testbed::netns::{gateway, unavailable_reason, Namespace, INPUT_DEV, OUTPUT_DEV};
use fibre_testbed::probe::{ret, FibProbe};
use std::net::IpAddr;
use std::path::PathBuf;

const ROUTES: usize = 400;

fn sample<K: Key>(all: &[Prefix<K>]) -> Vec<Prefix<K>> {
    all.iter()
        .step_by(all.len() / ROUTES)
        .take(ROUTES)
        .copied()
        .collect()
}

fn check_family<K: Key>(ns: &Namespace, routes: &[Prefix<K>], to_ip: impl Fn(K) -> IpAddr) {
    let family = K::FAMILY;
    let mut batch = String::new();
    for (i, p) in routes.iter().enumerate() {
        batch.push_str(&format!(
            "route add {p} via {} dev {OUTPUT_DEV}\n",
            gateway(family, i)
        ));
    }
    ns.batch(&batch).expect("routes load");
    let indexed = || routes.iter().enumerate().map(|(i, p)| (*p, i as u32));
    let trie = Table::build_with(Structure::Trie, indexed());
    let mut others: Vec<Table<K>> = Vec::new();
    for structure in Structure::ALL {
        for form in Form::ALL.into_iter().filter(|f| f.is_supported()) {
            let mut t = Table::build_with(structure, indexed());
            t.set_form(form).unwrap();
            others.push(t);
        }
    }
    let mut keys = addresses::matched(routes, 300, 11);
    // Uniform addresses, away from the namespace's own subnets (10/8, fd00::/8).
    keys.extend(
        addresses::uniform::<K>(200, 12)
            .into_iter()
            .filter(|&k| !matches!(to_ip(k), IpAddr::V4(a) if a.octets()[0] == 10))
            .take(100),
    );
    let addrs: Vec<IpAddr> = keys.iter().map(|&k| to_ip(k)).collect();
    let probe = FibProbe::new(family, &addrs).expect("probe loads");
    let ifindex = ns.ifindex(INPUT_DEV).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            ns.enter().unwrap();
            // One run per address, in order, from the cursor's start at 0.
            probe.run(true, ifindex, probe.len()).unwrap();
        });
    });
    let out_ifindex = ns.ifindex(OUTPUT_DEV).unwrap();
    let (mut routed, mut unrouted) = (0, 0);
    for (i, (&k, &addr)) in keys.iter().zip(&addrs).enumerate() {
        let answer = probe.answer(i as u32).unwrap();
        let kernel = ns.route_get(addr).unwrap();
        let fibre = trie.lookup(k).map(|r| gateway(family, r as usize));
        for t in &others {
            assert_eq!(
                t.lookup(k).map(|r| gateway(family, r as usize)),
                fibre,
                "{addr}: the {} in the {} form agrees with the trie",
                t.structure(),
                t.form()
            );
        }
        match kernel {
            None => {
                assert_eq!(
                    answer.code,
                    ret::NOT_FWDED,
                    "{addr}: the kernel has no route"
                );
                assert_eq!(
                    fibre, None,
                    "{addr}: fibre finds a route the kernel does not"
                );
                unrouted += 1;
            }
            Some(gw) => {
                assert_eq!(answer.code, ret::SUCCESS, "{addr}: {answer:?}");
                assert_eq!(
                    Some(answer.nexthop),
                    gw,
                    "{addr}: probe against ip route get"
                );
                assert_eq!(answer.ifindex, out_ifindex, "{addr}");
                assert_eq!(fibre, gw, "{addr}: fibre against the kernel");
                routed += 1;
            }
        }
    }
    assert!(routed >= 300, "every matched address is routed ({routed})");
    assert!(
        unrouted > 0 || family == 6,
        "some uniform IPv4 addresses have no route"
    );
    eprintln!("IPv{family}: {routed} routed and {unrouted} unrouted addresses agree");
}

#[test]
#[ignore = "needs root: loads routes into a network namespace and runs a BPF program"]
fn probe_answers_what_ip_route_get_answers() {
    if let Some(why) = unavailable_reason() {
        panic!("{why}");
    }
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/ris-2026-05-11");
    let v4 = final_prefixes(
        &read_route_file(&data.join("rib-v4.txt.gz"), false)
            .unwrap()
            .v4,
    );
    let v6 = final_prefixes(
        &read_route_file(&data.join("rib-v6.txt.gz"), false)
            .unwrap()
            .v6,
    );
    let ns = Namespace::create("test").expect("namespace");
    ns.setup_router(ROUTES).expect("router setup");
    check_family(&ns, &sample(&v4), |k: u32| IpAddr::V4(k.into()));
    check_family(&ns, &sample(&v6), |k: u128| IpAddr::V6(k.into()));
}
