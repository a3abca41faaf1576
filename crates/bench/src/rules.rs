//! The rules study (`fibre bench rules`): what policy rules and source-specific routes cost
//! a route lookup, fibre's full lookup ([`fibre_fib::Snapshot::lookup`], rules, tables and
//! path choice) against the kernel's (`bpf_fib_lookup`, which walks the rules as a
//! forwarded packet's lookup does), in the same run.
//!
//! Both get the same router: the links and subnets of the kernel's namespace and a sample
//! of the real table in `main`, route `i` via gateway `i mod 64`, loaded from the same
//! `ip` lines (fibre reads them as its configuration). Then, case by case, the same rule
//! lines go to both:
//!
//! - **default**: the three default rules only (fibre: one search of `local` and `main`
//!   merged);
//! - **from**: 10, 100, 1,000 rules `from PREFIX lookup TABLE` that no flow matches
//!   (fibre's rule index rules them out by one LPM search of the source, and such a
//!   flow's walk is the default rules' one search);
//! - **dport**: 10, 100, 1,000 rules `dport PORT lookup TABLE` that no flow matches (ruled
//!   out by the index's port ranges);
//! - **iif**: 10, 100, 1,000 rules `iif fin lookup TABLE` that every flow matches, each
//!   table holding one route that no flow matches: the walk visits every rule and looks
//!   up every table, in fibre as in the kernel (the worst case of a rule set);
//! - **source routes** (IPv6): every tenth destination also has a source-specific route
//!   whose source no flow has, so lookups go through the kernel's subtrees.
//!
//! fibre is asked three ways: one [`Query`] at a time ([`Snapshot::lookup`]), 64 queries
//! a call ([`Snapshot::lookup_batch`]), and 64 flows' addresses a call as a packet path
//! holds them ([`Snapshot::lookup_vector_v4`], [`Snapshot::lookup_vector_v6`]).
//!
//! Flows are matched addresses of the sample arriving on the input link. The plain LPM
//! lookup of the same addresses in the same routes (`fibre_lpm::Table`) is measured too,
//! one repetition in turn with one of the default rules' lookup so that the machine's
//! drift hits both alike: the default-rules figure against it is what routing semantics
//! cost over the bare search. A rule's cost is the difference between the most and the fewest rules of a kind
//! over the difference in rules.

use crate::addresses;
use crate::kernel::{KernelFib, GATEWAYS};
use crate::lookups::{lookup_figure, measure_fibre, Figure, Mode};
use crate::method::{interleaved, measure, Method, Timing};
use crate::studies::merge;
use fibre_fib::{config, FlowVector, NoRoute, Query, Snapshot, State, VectorAnswers};
use fibre_lpm::{Key, Prefix, Table};
use fibre_testbed::netns::{gateway, INPUT_DEV, OUTPUT_DEV};
use serde_json::{json, Value};
use std::fmt::Write;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What to run.
#[derive(Clone, Debug)]
pub struct RulesConfig {
    /// Routes sampled from each family's real table.
    pub routes: usize,
    /// Rule counts of the `from` and `dport` cases.
    pub rule_counts: Vec<usize>,
    /// The cases to run: `default`, `from`, `dport`, `source-routes` (IPv6 only).
    pub cases: Vec<String>,
    /// Repetitions per measurement.
    pub repetitions: usize,
    /// Flows per fibre measurement.
    pub count: usize,
    /// Lookups per repetition for the kernel.
    pub kernel_count: u32,
    /// Seed of the sample and the addresses.
    pub seed: u64,
    /// Measure the kernel (when possible).
    pub kernel: bool,
}

impl Default for RulesConfig {
    fn default() -> Self {
        RulesConfig {
            routes: 100_000,
            rule_counts: vec![10, 100, 1_000],
            cases: ["default", "from", "dport", "iif", "source-routes"]
                .map(String::from)
                .to_vec(),
            repetitions: 12,
            count: 1 << 16,
            kernel_count: 1 << 14,
            seed: 1,
            kernel: true,
        }
    }
}

/// One case: its name, rule count, and the `ip` lines it adds (rules, or routes).
struct Case {
    kind: &'static str,
    rules: usize,
    lines: Vec<String>,
}

/// The source fibre's flows come from (no rule or source route holds it); the kernel's
/// probe asks with source 0, which none holds either.
fn flow_source(family: u8) -> IpAddr {
    if family == 4 {
        IpAddr::from([192, 0, 2, 1])
    } else {
        "2001:db8::1".parse().expect("an address")
    }
}

/// The source prefix of rule `i` (10.x and fd10:: space, away from every flow).
fn rule_source(family: u8, i: usize) -> String {
    if family == 4 {
        format!("172.{}.{}.0/24", 16 + i / 65_536, i / 256 % 256)
    } else {
        format!("fd10:0:{:x}::/48", i)
    }
}

fn cases<K: Key>(routes: &[Prefix<K>], cfg: &RulesConfig) -> Vec<Case> {
    let family = K::FAMILY;
    let mut cases = vec![Case {
        kind: "default",
        rules: 0,
        lines: Vec::new(),
    }];
    let rule = |i: usize, selector: String| {
        format!(
            "rule add {selector} lookup {} pref {}",
            1_000 + i,
            1_000 + i
        )
    };
    for &n in &cfg.rule_counts {
        cases.push(Case {
            kind: "from",
            rules: n,
            lines: (0..n)
                .map(|i| rule(i, format!("from {}", rule_source(family, i))))
                .collect(),
        });
    }
    for &n in &cfg.rule_counts {
        cases.push(Case {
            kind: "dport",
            rules: n,
            lines: (0..n)
                .map(|i| rule(i, format!("dport {}", 1_000 + i)))
                .collect(),
        });
    }
    // Rules every flow matches, each looking up a table with one route no flow matches:
    // the walk goes through every rule and every table.
    let unmatched = if family == 4 {
        "198.51.100.0/24"
    } else {
        "fd30::/64"
    };
    for &n in &cfg.rule_counts {
        cases.push(Case {
            kind: "iif",
            rules: n,
            lines: (0..n)
                .flat_map(|i| {
                    [
                        format!("route add {unmatched} dev {OUTPUT_DEV} table {}", 1_000 + i),
                        rule(i, format!("iif {INPUT_DEV}")),
                    ]
                })
                .collect(),
        });
    }
    if family == 6 {
        cases.push(Case {
            kind: "source routes",
            rules: 0,
            lines: routes
                .iter()
                .enumerate()
                .step_by(10)
                .map(|(i, p)| {
                    format!(
                        "route add {p} from fd20::/64 via {} dev {OUTPUT_DEV}",
                        gateway(family, i % GATEWAYS)
                    )
                })
                .collect(),
        });
    }
    cases
}

/// fibre's configuration of the kernel namespace's router and the routes.
fn router_config<K: Key>(routes: &[Prefix<K>]) -> Result<State, String> {
    let mut state = State::new();
    let setup = format!(
        "link add {INPUT_DEV} type veth peer name {OUTPUT_DEV}
link set {INPUT_DEV} up
link set {OUTPUT_DEV} up
addr add 10.199.0.1/24 dev {INPUT_DEV}
addr add 10.200.0.1/16 dev {OUTPUT_DEV}
-6 addr add fd00:200::1/64 dev {OUTPUT_DEV} nodad
"
    );
    config::apply_text(&mut state, "router", &setup).map_err(|e| e.to_string())?;
    let mut lines = String::with_capacity(routes.len() * 48);
    for (i, p) in routes.iter().enumerate() {
        let _ = writeln!(
            lines,
            "{}route add {p} via {} dev {OUTPUT_DEV}",
            if K::FAMILY == 6 { "-6 " } else { "" },
            gateway(K::FAMILY, i % GATEWAYS)
        );
    }
    config::apply_text(&mut state, "routes", &lines).map_err(|e| e.to_string())?;
    Ok(state)
}

/// Applies a case's lines to a copy of `base`.
fn with_case(base: &State, family: u8, case: &Case) -> Result<State, String> {
    let mut state = base.clone();
    let flag = if family == 6 { "-6 " } else { "" };
    let text: String = case.lines.iter().map(|l| format!("{flag}{l}\n")).collect();
    config::apply_text(&mut state, case.kind, &text).map_err(|e| e.to_string())?;
    Ok(state)
}

/// How fibre is asked: one [`Query`] at a time, a batch of them, or a vector of
/// addresses as a packet path holds them ([`Snapshot::lookup_vector_v4`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Scalar,
    Batch,
    Vector,
}

impl Way {
    /// The figure's `mode`.
    fn mode(self) -> &'static str {
        match self {
            Way::Scalar => "scalar",
            Way::Batch => "batch",
            Way::Vector => "vector",
        }
    }
}

/// The flows' addresses side by side, as [`Snapshot::lookup_vector_v4`] and
/// [`Snapshot::lookup_vector_v6`] take them.
enum Addresses {
    V4(Vec<Ipv4Addr>, Vec<Ipv4Addr>),
    V6(Vec<Ipv6Addr>, Vec<Ipv6Addr>),
}

impl Addresses {
    fn of(flows: &[Query]) -> Addresses {
        let v4 = |a: Option<IpAddr>| match a {
            Some(IpAddr::V4(a)) => a,
            _ => Ipv4Addr::UNSPECIFIED,
        };
        let v6 = |a: Option<IpAddr>| match a {
            Some(IpAddr::V6(a)) => a,
            _ => Ipv6Addr::UNSPECIFIED,
        };
        if flows.first().is_some_and(|q| q.dst.is_ipv6()) {
            Addresses::V6(
                flows.iter().map(|q| v6(Some(q.dst))).collect(),
                flows.iter().map(|q| v6(q.src)).collect(),
            )
        } else {
            Addresses::V4(
                flows.iter().map(|q| v4(Some(q.dst))).collect(),
                flows.iter().map(|q| v4(q.src)).collect(),
            )
        }
    }
}

/// fibre's full lookups of `flows` (arriving on one link), asked `way`, dry run
/// subtracted.
fn measure_snapshot(
    snap: &Snapshot,
    flows: &[Query],
    addresses: &Addresses,
    way: Way,
    method: Method,
) -> Timing {
    const N: usize = fibre_fib::BATCH;
    let iif = flows.first().and_then(|q| q.iif);
    let real = measure(
        method,
        |_| vec![Err(NoRoute::NetworkUnreachable); N],
        |out, _| {
            let mut acc = 0u32;
            let mut sum = |out: &[Result<_, NoRoute>]| {
                for h in out {
                    let h: &Result<fibre_fib::HopRef, NoRoute> = h;
                    acc = acc.wrapping_add(h.as_ref().map_or(0, |h| h.dev));
                }
            };
            match (way, addresses) {
                (Way::Scalar, _) => {
                    for q in flows {
                        acc = acc.wrapping_add(snap.lookup(q).map_or(0, |h| h.dev));
                    }
                }
                (Way::Batch, _) => {
                    for chunk in flows.chunks(N) {
                        let out = &mut out[..chunk.len()];
                        snap.lookup_batch(chunk, out);
                        sum(out);
                    }
                }
                // A vector's answers are a `u32` a flow naming its hop, as the bare
                // search's are: the reader takes those, as it takes the search's.
                (Way::Vector, Addresses::V4(dst, src)) => {
                    let mut answers = VectorAnswers::new();
                    for (k, (dst, src)) in dst.chunks(N).zip(src.chunks(N)).enumerate() {
                        let v = FlowVector { iif, dst, src };
                        snap.lookup_vector_v4(&v, |i| flows[k * N + i].clone(), &mut answers);
                        acc = answers.ids().iter().fold(acc, |a, &id| a.wrapping_add(id));
                    }
                }
                (Way::Vector, Addresses::V6(dst, src)) => {
                    let mut answers = VectorAnswers::new();
                    for (k, (dst, src)) in dst.chunks(N).zip(src.chunks(N)).enumerate() {
                        let v = FlowVector { iif, dst, src };
                        snap.lookup_vector_v6(&v, |i| flows[k * N + i].clone(), &mut answers);
                        acc = answers.ids().iter().fold(acc, |a, &id| a.wrapping_add(id));
                    }
                }
            }
            black_box(acc);
            flows.len() as u64
        },
    );
    let dry = measure(
        method,
        |_| (),
        |_, _| {
            let mut acc = 0u32;
            match (way, addresses) {
                (Way::Vector, Addresses::V4(dst, _)) => {
                    for d in dst {
                        acc = acc.wrapping_add(u32::from(*black_box(d)));
                    }
                }
                (Way::Vector, Addresses::V6(dst, _)) => {
                    for d in dst {
                        acc = acc.wrapping_add(u128::from(*black_box(d)) as u32);
                    }
                }
                _ => {
                    for q in flows {
                        acc = acc.wrapping_add(black_box(q).mark);
                    }
                }
            }
            black_box(acc);
            flows.len() as u64
        },
    );
    real.minus(dry)
}

/// The study's router and flows: a sample of `cfg.routes` routes of `table`, the router
/// holding them (routes via 64 gateways out of one link), and `cfg.count` flows to
/// matched addresses of the sample arriving on the other link.
pub struct Workload<K: Key> {
    /// The sampled routes.
    pub routes: Vec<Prefix<K>>,
    /// The flows' destinations.
    pub keys: Vec<K>,
    /// The router's state with the routes and only the default rules.
    pub router: State,
    /// The flows, each from one source arriving on the input link.
    pub flows: Vec<Query>,
}

impl<K: Key> Workload<K> {
    /// The workload of `table` as `cfg` asks.
    pub fn new(table: &[Prefix<K>], cfg: &RulesConfig) -> Result<Workload<K>, String> {
        let routes = crate::studies::sample(table, cfg.routes, cfg.seed);
        let keys = addresses::matched(&routes, cfg.count, cfg.seed);
        let router = router_config(&routes)?;
        let fin = router
            .links()
            .find(|l| l.name == INPUT_DEV)
            .map(|l| l.index)
            .ok_or("no input link")?;
        let flows = keys
            .iter()
            .map(|&k| {
                let mut q = Query::to(crate::studies::to_ip(k));
                q.src = Some(flow_source(K::FAMILY));
                q.iif = Some(fin);
                q
            })
            .collect();
        Ok(Workload {
            routes,
            keys,
            router,
            flows,
        })
    }
}

fn base<K: Key>(engine: &str, routes: usize, case: &Case) -> Value {
    json!({"study": "rules", "engine": engine, "family": K::FAMILY, "routes": routes,
           "metric": "lookup", "case": case.kind, "rules": case.rules})
}

/// Runs the study on one family's real table; every figure goes to `emit` as it is
/// measured, `step` hears what comes next.
pub fn rules_study<K: Key>(
    table: &[Prefix<K>],
    cfg: &RulesConfig,
    emit: &mut dyn FnMut(Figure),
    step: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let family = K::FAMILY;
    step(&format!("IPv{family}: loading {} routes", cfg.routes));
    let Workload {
        routes,
        keys,
        router,
        flows,
    } = Workload::new(table, cfg)?;
    let method = Method {
        repetitions: cfg.repetitions,
        threads: 1,
    };
    let wanted = |kind: &str| cfg.cases.iter().any(|c| c.replace('-', " ") == kind);
    let all_cases = cases(&routes, cfg);
    // The bare LPM search, for reference, measured in turn with the default rules'
    // lookup (one repetition of each at a time), so that the machine's drift hits both
    // alike: their ratio is what routing semantics cost.
    let lpm = Table::<K>::build(routes.iter().enumerate().map(|(i, p)| (*p, i as u32)));
    let none = Case {
        kind: "lpm",
        rules: 0,
        lines: Vec::new(),
    };
    let default_snap = match all_cases.iter().find(|c| c.kind == "default") {
        Some(case) if wanted("default") => Some(with_case(&router, family, case)?.snapshot()),
        _ => None,
    };
    let once = Method {
        repetitions: 1,
        threads: 1,
    };
    let addresses = Addresses::of(&flows);
    let modes = [Mode::Scalar, Mode::Batch];
    let ways = [Way::Scalar, Way::Batch, Way::Vector];
    let variants = modes.len()
        + if default_snap.is_some() {
            ways.len()
        } else {
            0
        };
    let timings = interleaved(cfg.repetitions, variants, |v| match &default_snap {
        Some(snap) if v >= modes.len() => {
            measure_snapshot(snap, &flows, &addresses, ways[v - modes.len()], once)
        }
        _ => measure_fibre(lpm.clone(), &keys, modes[v], once, fibre_fib::BATCH),
    });
    for (mode, t) in modes.iter().zip(&timings) {
        emit(merge(
            base::<K>("lpm", routes.len(), &none),
            lookup_figure(*mode, 1, "matched", *t),
        ));
    }
    let default_timings = &timings[modes.len()..];
    let kernel = if cfg.kernel {
        let k = KernelFib::new()?;
        k.load(&routes).map_err(|e| e.to_string())?;
        Some(k)
    } else {
        None
    };
    let kernel_ips: Vec<IpAddr> = keys
        .iter()
        .take(cfg.kernel_count as usize)
        .map(|&k| crate::studies::to_ip(k))
        .collect();
    for case in all_cases.into_iter().filter(|c| wanted(c.kind)) {
        step(&format!("IPv{family}: {} {}", case.rules, case.kind));
        let state = with_case(&router, family, &case)?;
        let snap = state.snapshot();
        // fibre answers each flow as it answers `ip route get`.
        for q in flows.iter().step_by(97) {
            let hop = snap.lookup(q);
            let answer = snap.route(q).map(|a| (a.dev, a.gateway));
            if hop.map(|h| (h.dev, h.gateway)) != answer {
                return Err(format!("lookup and route disagree on {q:?}"));
            }
        }
        for (k, way) in ways.into_iter().enumerate() {
            let t = match default_timings.get(k) {
                // Measured with the bare search above.
                Some(t) if case.kind == "default" => *t,
                _ => measure_snapshot(&snap, &flows, &addresses, way, method),
            };
            let mode = if way == Way::Scalar {
                Mode::Scalar
            } else {
                Mode::Batch
            };
            let mut figure = lookup_figure(mode, 1, "matched", t);
            figure["mode"] = json!(way.mode());
            emit(merge(base::<K>("fibre", routes.len(), &case), figure));
        }
        if let Some(k) = &kernel {
            let text: String = case.lines.iter().map(|l| format!("{l}\n")).collect();
            k.namespace()
                .batch_family(family, &text)
                .map_err(|e| e.to_string())?;
            let t = k.lookups(family, &kernel_ips, method, cfg.kernel_count);
            let figure = match t {
                Ok(t) => merge(
                    base::<K>("kernel", routes.len(), &case),
                    lookup_figure(Mode::Scalar, 1, "matched", t.net()),
                ),
                Err(e) => merge(
                    base::<K>("kernel", routes.len(), &case),
                    json!({"metric": "error", "error": e.to_string()}),
                ),
            };
            emit(figure);
            // Undo the case: rules by priority, routes by their own words.
            let undo: String = case
                .lines
                .iter()
                .map(|l| {
                    if let Some(r) = l.strip_prefix("rule add ") {
                        let pref = r.rsplit(' ').next().unwrap_or("");
                        format!("rule del pref {pref}\n")
                    } else {
                        format!("{}\n", l.replacen("route add", "route del", 1))
                    }
                })
                .collect();
            k.namespace()
                .batch_family(family, &undo)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The study's report: per family, each case's ns per lookup for fibre (one flow at a
/// time and batched) and the kernel, their ratio, and the cost per rule.
pub fn markdown(figures: &[Value]) -> String {
    let mut out = String::new();
    let ns = |f: Option<&Value>| -> Option<f64> { f?["ns_per_lookup"].as_f64() };
    let show = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.1}"));
    for family in [4u64, 6] {
        let of = |engine: &str, mode: &str, kind: &str, rules: u64| {
            figures.iter().find(|f| {
                f["study"] == "rules"
                    && f["metric"] == "lookup"
                    && f["family"] == family
                    && f["engine"] == engine
                    && f["mode"] == mode
                    && f["case"] == kind
                    && f["rules"] == rules
            })
        };
        let Some(any) = figures
            .iter()
            .find(|f| f["study"] == "rules" && f["family"] == family)
        else {
            continue;
        };
        let _ = writeln!(
            out,
            "### IPv{family}, {} routes\n\nns per lookup, one thread, matched addresses arriving \
             on the input link; dry run subtracted. fibre: one query at a time; batch: 64 \
             queries a call; vector: 64 flows' addresses a call, as a packet path holds \
             them.\n\n\
             | case | rules | fibre | fibre batch | fibre vector | kernel | kernel / fibre |\n\
             |---|---:|---:|---:|---:|---:|---:|",
            any["routes"]
        );
        let (lpm, lpm_batch) = (
            ns(of("lpm", "scalar", "lpm", 0)),
            ns(of("lpm", "batch", "lpm", 0)),
        );
        let _ = writeln!(
            out,
            "| plain LPM (no rules, no route semantics) | – | {} | {} | – | – | – |",
            show(lpm),
            show(lpm_batch)
        );
        let mut kinds: Vec<(String, u64)> = Vec::new();
        for f in figures
            .iter()
            .filter(|f| f["study"] == "rules" && f["family"] == family && f["engine"] != "lpm")
        {
            let k = (
                f["case"].as_str().unwrap_or("").to_string(),
                f["rules"].as_u64().unwrap_or(0),
            );
            if !kinds.contains(&k) {
                kinds.push(k);
            }
        }
        for (kind, rules) in &kinds {
            let fibre = ns(of("fibre", "scalar", kind, *rules));
            let batch = ns(of("fibre", "batch", kind, *rules));
            let vector = ns(of("fibre", "vector", kind, *rules));
            let kernel = ns(of("kernel", "scalar", kind, *rules));
            let ratio = match (kernel, fibre) {
                (Some(k), Some(f)) if f > 0.0 => format!("**{:.0}×**", k / f),
                _ => "–".into(),
            };
            let _ = writeln!(
                out,
                "| {kind} | {rules} | {} | {} | {} | {} | {ratio} |",
                show(fibre),
                show(batch),
                show(vector),
                show(kernel)
            );
        }
        let _ = writeln!(out);
        let default = |engine: &str, mode: &str| ns(of(engine, mode, "default", 0));
        let against = |d: Option<f64>, l: Option<f64>| match (d, l) {
            (Some(d), Some(l)) => format!("{:+.0}%", (d / l - 1.0) * 100.0),
            _ => "–".into(),
        };
        if default("fibre", "scalar").is_some() {
            let _ = writeln!(
                out,
                "Default rules against the plain LPM lookup: {} one at a time, {} batched, \
                 {} as a vector.",
                against(default("fibre", "scalar"), lpm),
                against(default("fibre", "batch"), lpm_batch),
                against(default("fibre", "vector"), lpm_batch),
            );
        }
        // A rule's cost: between the fewest and the most rules of a kind, so that both
        // figures come from the rule walk (the default rules take a shorter way).
        for kind in ["from", "dport", "iif"] {
            let counts: Vec<u64> = kinds.iter().filter(|k| k.0 == kind).map(|k| k.1).collect();
            let (Some(&few), Some(&most)) = (counts.iter().min(), counts.iter().max()) else {
                continue;
            };
            if most == few {
                continue;
            }
            let per_rule = |engine: &str| -> Option<f64> {
                let many = ns(of(engine, "scalar", kind, most))?;
                Some((many - ns(of(engine, "scalar", kind, few))?) / (most - few) as f64)
            };
            let _ = writeln!(
                out,
                "Cost per `{kind}` rule ({few} to {most} rules): fibre {} ns, kernel {} ns.",
                per_rule("fibre").map_or("–".into(), |v| format!("{v:.3}")),
                per_rule("kernel").map_or("–".into(), |v| format!("{v:.1}")),
            );
        }
        let _ = writeln!(out);
    }
    out
}
