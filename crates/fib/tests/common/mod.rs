//! The judge: the real kernel in a private network namespace, given the same configuration
//! as fibre, asked the same queries with `ip -d -j route get`, compared field by field.

#![allow(dead_code)]

use fibre_fib::{config, show, State};
use fibre_testbed::netns::Namespace;
use serde_json::Value;
use std::io::Write;
use std::process::Command;

/// The prefixes of a shipped table (`data/ris-2026-05-11/NAME`, gzip), as its lines give
/// them.
pub fn shipped_prefixes(name: &str) -> Vec<String> {
    let path = format!(
        "{}/../../data/ris-2026-05-11/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let out = Command::new("gzip")
        .args(["-dc", &path])
        .output()
        .expect("gzip runs");
    assert!(out.status.success(), "{path}");
    String::from_utf8(out.stdout)
        .expect("text")
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

/// A unicast route to `dst` in `main` through `gateway` on link `dev`, as a mirror holds
/// one a routing daemon added (protocol boot, IPv6's user metric).
pub fn route_via(dst: fibre_fib::Net, dev: u32, gateway: std::net::IpAddr) -> fibre_fib::Route {
    use fibre_fib::{Family, Net, Path, Paths, Route, RouteBody, RouteType};
    let v6 = dst.family() == Family::V6;
    let body = RouteBody {
        table: 254,
        src: Net::default_of(dst.family()),
        tos: 0,
        metric: if v6 { 1024 } else { 0 },
        protocol: 3,
        scope: 0,
        kind: RouteType::Unicast,
        prefsrc: None,
        mtu: None,
        hoplimit: None,
        paths: Paths::own(vec![Path {
            gateway: Some(gateway),
            dev,
            weight: 1,
            onlink: false,
            dead: false,
            scope: 0,
        }]),
        pref: 0,
    };
    Route::new(dst, body)
}

/// The multipath hash seed of both sides, so that they choose the same paths.
pub const SEED: &str = "3141592653";

/// A fresh fibre state with the namespace's multipath hash seed.
pub fn seeded_state() -> State {
    let mut state = State::new();
    config::apply_line(
        &mut state,
        &format!("sysctl net.ipv4.fib_multipath_hash_seed={SEED}"),
    )
    .expect("the seed");
    state
}

/// A namespace prepared as fibre assumes: forwarding on, no duplicate address detection
/// (fibre's addresses are usable at once, as with `nodad`).
pub fn namespace(tag: &str) -> Namespace {
    let ns = Namespace::create(tag).expect("creating a network namespace (needs root)");
    for (k, v) in [
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv6.conf.all.forwarding", "1"),
        ("net.ipv6.conf.all.accept_dad", "0"),
        ("net.ipv6.conf.default.accept_dad", "0"),
        ("net.ipv4.fib_multipath_hash_seed", SEED),
    ] {
        ns.sysctl(k, v).expect("sysctl in the namespace");
    }
    ns
}

/// Applies one line to the kernel (`ip -n NS LINE`): `Ok` or ip's message.
pub fn kernel_line(ns: &Namespace, line: &str) -> Result<(), String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    if words.first() == Some(&"sysctl") {
        let setting = words.iter().find(|w| w.contains('=')).ok_or("KEY=VALUE")?;
        let (k, v) = setting.split_once('=').expect("has =");
        return ns.sysctl(k, v).map_err(|e| e.to_string());
    }
    let out = Command::new("ip")
        .args(["-n", ns.name()])
        .args(&words)
        .output()
        .expect("running ip");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// A line one side accepted and the other refused: the line, the kernel's result, fibre's.
pub type Disagreement = (String, Result<(), String>, Result<(), String>);

/// What happened to each line on each side.
#[derive(Debug)]
pub struct Applied {
    /// fibre's state after the lines both sides accepted.
    pub state: State,
    /// Lines one side accepted and the other refused: (line, kernel's result, fibre's).
    pub disagreements: Vec<Disagreement>,
}

/// Applies `lines` to the kernel and to fibre, one by one. A line both refuse is skipped;
/// a line only one side refuses is recorded (and undone on neither side: the test fails).
pub fn apply_both(ns: &Namespace, lines: &[String]) -> Applied {
    let mut state = seeded_state();
    let mut disagreements = Vec::new();
    for line in lines {
        let k = kernel_line(ns, line);
        let mut next = state.clone();
        let f = config::apply_line(&mut next, line);
        // A line both refuse may still have changed something in the kernel (an IPv6
        // multipath delete removes the paths it found): fibre keeps what it did too.
        if f.is_ok() || k.is_err() {
            state = next;
        }
        if k.is_ok() != f.is_ok() {
            disagreements.push((line.clone(), k, f));
        }
    }
    settle(ns, &state);
    Applied {
        state,
        disagreements,
    }
}

/// Waits until the kernel's links have the carrier fibre says they have (the kernel
/// reports carrier changes from a worker, and IPv6 configures a link only after).
pub fn settle(ns: &Namespace, state: &State) {
    for _ in 0..100 {
        let out = ns.ip(&["-j", "link", "show"]).unwrap_or_default();
        let links: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        let ready = state
            .links()
            .filter(|l| l.kind != fibre_fib::LinkKind::Loopback)
            .all(|l| {
                let k = links
                    .as_array()
                    .and_then(|a| a.iter().find(|x| x["ifname"] == l.name.as_str()));
                let oper = k.and_then(|k| k["operstate"].as_str()).unwrap_or("");
                state.carrier(l.index) == (oper == "UP")
            });
        if ready {
            std::thread::sleep(std::time::Duration::from_millis(50));
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The kernel's answers to `queries` (`ip -d -j route get` words), in order: the JSON
/// object, or the error words.
pub fn kernel_answers(ns: &Namespace, queries: &[String]) -> Vec<Result<Value, String>> {
    let mut file = tempfile(ns.name());
    for q in queries {
        writeln!(file.1, "route get {q}").unwrap();
    }
    file.1.flush().unwrap();
    let out = Command::new("ip")
        .args(["-n", ns.name(), "-d", "-j", "-force", "-batch", &file.0])
        .output()
        .expect("running ip -batch");
    let _ = std::fs::remove_file(&file.0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Failed lines: "RTNETLINK answers: X" then "Command failed FILE:N".
    let mut failed = std::collections::HashMap::new();
    let mut last_error = String::new();
    for line in stderr.lines() {
        if let Some(n) = line
            .rsplit(':')
            .next()
            .filter(|_| line.starts_with("Command failed"))
        {
            failed.insert(n.trim().parse::<usize>().unwrap(), last_error.clone());
        } else {
            last_error = line.trim_start_matches("RTNETLINK answers: ").to_string();
        }
    }
    let mut objects = stdout.lines().filter(|l| !l.trim().is_empty());
    (1..=queries.len())
        .map(|n| match failed.get(&n) {
            Some(e) => Err(e.clone()),
            None => {
                let line = objects.next().expect("one answer a successful query");
                let v: Value = serde_json::from_str(line).expect("ip prints JSON");
                Ok(v[0].clone())
            }
        })
        .collect()
}

fn tempfile(tag: &str) -> (String, std::fs::File) {
    let path = std::env::temp_dir().join(format!("{tag}-queries.txt"));
    let f = std::fs::File::create(&path).unwrap();
    (path.display().to_string(), f)
}

/// `flows` looked up in batches of flows alike (one family, one input link, with or
/// without an output link and a source), as a packet path batches them: the batches
/// that take the lookup's quickest way. The answers in the flows' order.
pub fn batched_in_groups(
    snap: &fibre_fib::Snapshot,
    flows: &[fibre_fib::Query],
) -> Vec<Result<fibre_fib::Hop, fibre_fib::NoRoute>> {
    let mut order: Vec<usize> = (0..flows.len()).collect();
    order.sort_by_key(|&i| {
        let q = &flows[i];
        (q.dst.is_ipv6(), q.iif, q.oif.is_some(), q.src.is_some())
    });
    let sorted: Vec<fibre_fib::Query> = order.iter().map(|&i| flows[i].clone()).collect();
    let mut out = vec![Err(fibre_fib::NoRoute::NetworkUnreachable); flows.len()];
    snap.lookup_batch(&sorted, &mut out);
    in_vectors(snap, &sorted, &out);
    let mut answers = vec![Err(fibre_fib::NoRoute::NetworkUnreachable); flows.len()];
    for (k, &i) in order.iter().enumerate() {
        answers[i] = out[k].map(fibre_fib::Hop::from);
    }
    answers
}

/// An IPv4 address, or none.
fn v4(a: &std::net::IpAddr) -> Option<std::net::Ipv4Addr> {
    match a {
        std::net::IpAddr::V4(a) => Some(*a),
        std::net::IpAddr::V6(_) => None,
    }
}

/// An IPv6 address, or none.
fn v6(a: &std::net::IpAddr) -> Option<std::net::Ipv6Addr> {
    match a {
        std::net::IpAddr::V6(a) => Some(*a),
        std::net::IpAddr::V4(_) => None,
    }
}

/// Looks up again, as vectors of addresses ([`fibre_fib::Snapshot::lookup_vector_v4`],
/// `_v6`), each run of `sorted` flows that a vector holds (one family and input link, no
/// output link, a source of the family for each arriving flow and none for the others),
/// and panics where a vector's answer is not `answers`' for the same flow.
fn in_vectors(
    snap: &fibre_fib::Snapshot,
    sorted: &[fibre_fib::Query],
    answers: &[Result<fibre_fib::HopRef<'_>, fibre_fib::NoRoute>],
) {
    use fibre_fib::{FlowVector, Hop, VectorAnswers};
    use std::net::IpAddr;
    let fits = |q: &fibre_fib::Query| {
        q.oif.is_none()
            && match q.iif {
                Some(_) => q.src.is_some_and(|s| s.is_ipv6() == q.dst.is_ipv6()),
                None => q.src.is_none(),
            }
    };
    let mut at = 0;
    while at < sorted.len() {
        let first = &sorted[at];
        let run = sorted[at..]
            .iter()
            .take_while(|q| q.dst.is_ipv6() == first.dst.is_ipv6() && q.iif == first.iif)
            .count();
        let held: Vec<usize> = (at..at + run).filter(|&i| fits(&sorted[i])).collect();
        at += run;
        if held.is_empty() {
            continue;
        }
        let mut out = VectorAnswers::new();
        let flow = |k: usize| sorted[held[k]].clone();
        let addrs = |pick: fn(&fibre_fib::Query) -> Option<IpAddr>| -> Vec<IpAddr> {
            held.iter().filter_map(|&i| pick(&sorted[i])).collect()
        };
        let (dst, src) = (addrs(|q| Some(q.dst)), addrs(|q| q.src));
        let iif = first.iif;
        match first.dst {
            IpAddr::V4(_) => {
                let dst: Vec<_> = dst.iter().filter_map(v4).collect();
                let src: Vec<_> = src.iter().filter_map(v4).collect();
                let v = FlowVector {
                    iif,
                    dst: &dst,
                    src: &src,
                };
                snap.lookup_vector_v4(&v, flow, &mut out);
            }
            IpAddr::V6(_) => {
                let dst: Vec<_> = dst.iter().filter_map(v6).collect();
                let src: Vec<_> = src.iter().filter_map(v6).collect();
                let v = FlowVector {
                    iif,
                    dst: &dst,
                    src: &src,
                };
                snap.lookup_vector_v6(&v, flow, &mut out);
            }
        }
        assert_eq!(out.len(), held.len());
        for (&i, vector) in held.iter().zip(out.iter()) {
            assert_eq!(
                vector.copied(),
                answers[i].map(Hop::from),
                "{:?}: as a vector of addresses and batched",
                sorted[i]
            );
        }
    }
}

/// One of fibre's answers: the JSON `ip` would print, and the (gateway, link name) paths
/// its flow hash chose among.
pub type FibreAnswer = Result<Value, String>;

/// fibre's answers to the same queries, shaped the same way. The forwarding lookup
/// ([`fibre_fib::Snapshot::lookup`], one flow and batched) must agree with the answer, or
/// the answer is an error that names both.
pub fn fibre_answers(state: &State, queries: &[String]) -> Vec<FibreAnswer> {
    let snap = state.snapshot();
    let parsed: Vec<Result<fibre_fib::Query, String>> = queries
        .iter()
        .map(|q| {
            let words: Vec<&str> = q.split_whitespace().collect();
            fibre_fib::parse_query(&words, |n| {
                snap.links().find(|l| l.name == n).map(|l| l.index)
            })
            .map_err(|e| format!("bad query: {e}"))
        })
        .collect();
    let flows: Vec<fibre_fib::Query> = parsed.iter().filter_map(|q| q.clone().ok()).collect();
    let mut batched = vec![Err(fibre_fib::NoRoute::NetworkUnreachable); flows.len()];
    snap.lookup_batch(&flows, &mut batched);
    let grouped = batched_in_groups(&snap, &flows);
    let mut batched = batched.into_iter().zip(grouped);
    parsed
        .into_iter()
        .map(|query| {
            let query = query?;
            let hop = snap.lookup(&query);
            let (in_batch, in_group) = batched.next().expect("one batched answer per flow");
            let from_answer = snap.route(&query).map(|a| fibre_fib::Hop {
                kind: a.kind,
                table: a.table,
                dev: a.dev,
                gateway: a.gateway,
                mtu: a.mtu,
            });
            let hop = hop.map(fibre_fib::Hop::from);
            let in_batch = in_batch.map(fibre_fib::Hop::from);
            if hop != from_answer || in_batch != hop || in_group != hop {
                return Err(format!(
                    "lookup {hop:?}, batched {in_batch:?}, batched in groups {in_group:?}, \
                     route {from_answer:?}"
                ));
            }
            snap.route(&query)
                .map(|a| show::answer_json(&snap, &a))
                .map_err(|e| e.words().to_string())
        })
        .collect()
}

/// The queries whose answers differ, with both answers, at most `limit` of them.
pub fn mismatches(
    queries: &[String],
    kernel: &[Result<Value, String>],
    fibre: &[FibreAnswer],
    limit: usize,
) -> (usize, Vec<String>) {
    let mut count = 0;
    let mut shown = Vec::new();
    for ((q, k), f) in queries.iter().zip(kernel).zip(fibre) {
        if !agree(k, f) {
            count += 1;
            if shown.len() < limit {
                shown.push(format!(
                    "route get {q}\n    kernel: {}\n    fibre:  {}",
                    k.as_ref().map_or_else(|e| e.clone(), |v| v.to_string()),
                    f.as_ref().map_or_else(|e| e.clone(), |v| v.to_string())
                ));
            }
        }
    }
    (count, shown)
}

/// Whether fibre's answer is the kernel's: equal in every field, the path of a multipath
/// route included (both hash with the same seed).
fn agree(k: &Result<Value, String>, f: &FibreAnswer) -> bool {
    match (k, f) {
        (Err(a), Err(b)) => a == b,
        (Ok(kv), Ok(fv)) => kv == fv,
        _ => false,
    }
}

/// Both sides' routes of every table, IPv4 and IPv6, as `ip -d -j route show table all`
/// lists them (each as its JSON text) and as `ip route show table all` prints them (each
/// line), sorted (the kernel lists tables in its hash order): the kernel's, then fibre's.
pub fn listings(ns: &Namespace, state: &State) -> (Vec<String>, Vec<String>) {
    let mut kernel = Vec::new();
    for family in ["-4", "-6"] {
        let out = ns
            .ip(&["-d", "-j", family, "route", "show", "table", "all"])
            .unwrap_or_default();
        let routes: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        for r in routes.as_array().into_iter().flatten() {
            kernel.push(r.to_string());
        }
    }
    let mut fibre = Vec::new();
    for family in [fibre_fib::Family::V4, fibre_fib::Family::V6] {
        for r in state.routes(family, None) {
            fibre.push(show::route_json(state, &r).to_string());
        }
    }
    // And as `ip route show table all` prints them, line by line (a multipath route's
    // paths on lines of their own).
    for family in ["-4", "-6"] {
        let out = ns
            .ip(&[family, "route", "show", "table", "all"])
            .unwrap_or_default();
        kernel.extend(out.lines().map(|l| l.trim().to_string()));
    }
    for family in [fibre_fib::Family::V4, fibre_fib::Family::V6] {
        for r in state.routes(family, None) {
            let text = show::route_text(state, &r);
            fibre.extend(text.lines().map(|l| l.trim().to_string()));
        }
    }
    kernel.sort();
    fibre.sort();
    (kernel, fibre)
}

/// The routes (JSON texts and text lines) only one side lists: (the kernel's, fibre's).
pub fn listing_differences(ns: &Namespace, state: &State) -> (Vec<String>, Vec<String>) {
    let (kernel, fibre) = listings(ns, state);
    let only_kernel = kernel
        .iter()
        .filter(|r| !fibre.contains(r))
        .cloned()
        .collect();
    let only_fibre = fibre
        .iter()
        .filter(|r| !kernel.contains(r))
        .cloned()
        .collect();
    (only_kernel, only_fibre)
}

/// Applies a configuration to both sides, asks both the queries, and panics with every
/// difference (refusals, answers, and the routes each lists).
pub fn check(tag: &str, config: &str, queries: &[&str]) {
    let ns = namespace(tag);
    let lines: Vec<String> = config
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    let applied = apply_both(&ns, &lines);
    let queries: Vec<String> = queries.iter().map(|q| q.to_string()).collect();
    let k = kernel_answers(&ns, &queries);
    let f = fibre_answers(&applied.state, &queries);
    let (n, shown) = mismatches(&queries, &k, &f, 20);
    let mut report = String::new();
    let (only_kernel, only_fibre) = listing_differences(&ns, &applied.state);
    for r in &only_kernel {
        report += &format!("the kernel lists {r}\n");
    }
    for r in &only_fibre {
        report += &format!("fibre lists      {r}\n");
    }
    for (line, k, f) in &applied.disagreements {
        report += &format!("line `{line}`: kernel {k:?}, fibre {f:?}\n");
    }
    if n > 0 {
        report += &format!(
            "{n} of {} answers differ:\n{}\n",
            queries.len(),
            shown.join("\n")
        );
    }
    assert!(
        report.is_empty(),
        "{tag}: fibre and the kernel disagree\n{report}"
    );
}
