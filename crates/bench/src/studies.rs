//! `fibre bench`: studies of lookup cost, fibre, a peer library and the Linux kernel side
//! by side in one run, each figure emitted as it is measured.
//!
//! The studies (after the Linux FIB benchmarks `kbench_mod`, `bench-from-bgp`,
//! `bench-many-48` and `bench-many-128`):
//!
//! 1. **table size**: random samples of the real table (1, 10, ... 100k routes) and the
//!    whole table; matched addresses, one thread. Loading each table is measured too.
//! 2. **threads**: the whole table, 1 thread up to one more than the CPUs (contention).
//! 3. **from BGP**: the whole table, matched and uniform addresses.
//! 4. **many-48 / many-128** (`--full`): random /48 and /128 prefixes, 10k to 1M.
//! 5. **updates** (`--full`): lookups while the real day of updates is applied, for each
//!    family that has a table and an update stream.
//! 6. **dpdk**: the whole table, fibre beside DPDK's `rte_fib` / `rte_fib6` (where the
//!    build found DPDK and its environment starts): one address at a time, batches,
//!    dependent lookups, and the memory each takes; where DPDK cannot run, one figure
//!    says why.
//!
//! Every engine gets the same routes (values are route indices; in the kernel, route `i`
//! goes via gateway `i mod 64`), the same addresses and the same method. The kernel side
//! needs root; without it the studies run fibre's side and say why the kernel is missing.

use crate::addresses;
use crate::dpdk::{raw_keys, Dpdk, DpdkKey};
use crate::kernel::{KernelFib, KernelTiming};
use crate::lookups::{lookup_figure, measure_fibre, measure_readers, Figure, Mode};
use crate::method::{interleaved, Method, Timing};
use crate::peers::{build_peers, measure_peer, PeerKey};
use fibre_lpm::{Key, Prefix, Table};
use fibre_routefile::RouteOp;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::io;
use std::net::IpAddr;
use std::time::Instant;

/// What to run.
#[derive(Clone, Debug)]
pub struct StudyConfig {
    /// Run every study (many-48/128, updates), not only the default set.
    pub full: bool,
    /// Table sizes sampled from the real table (the whole table is always added).
    pub sizes: Vec<usize>,
    /// Highest thread count of the threads study.
    pub max_threads: usize,
    /// Repetitions per measurement.
    pub repetitions: usize,
    /// Addresses per set, fibre and peers.
    pub count: usize,
    /// Lookups per repetition and thread for the kernel (slower by two orders).
    pub kernel_count: u32,
    /// Keys per batched call.
    pub batch: usize,
    /// Seed of samples and addresses.
    pub seed: u64,
    /// Measure the kernel (when possible).
    pub kernel: bool,
    /// Table sizes of the many-48 and many-128 studies (`--full`).
    pub many_sizes: Vec<usize>,
    /// Measure DPDK's FIBs beside fibre (when possible).
    pub dpdk: bool,
}

impl Default for StudyConfig {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        StudyConfig {
            full: false,
            sizes: vec![1, 10, 100, 1_000, 10_000, 100_000],
            max_threads: cpus + 1,
            repetitions: 12,
            count: 1 << 20,
            kernel_count: 1 << 16,
            batch: 64,
            seed: 1,
            kernel: true,
            many_sizes: vec![10_000, 100_000, 1_000_000],
            dpdk: true,
        }
    }
}

/// Where a run reports to.
pub struct Sink<'a> {
    /// Receives every figure.
    pub emit: &'a mut dyn FnMut(Figure),
    /// Told what is being measured next.
    pub step: &'a mut dyn FnMut(&str),
}

/// What the studies run on: the real tables of each family and their update streams
/// (which feed the updates study of `--full`). Any of them may be empty.
#[derive(Clone, Copy, Default)]
pub struct StudyInput<'a> {
    /// The IPv4 table.
    pub v4: &'a [Prefix<u32>],
    /// The IPv6 table.
    pub v6: &'a [Prefix<u128>],
    /// The IPv4 update stream.
    pub updates_v4: &'a [(RouteOp, Prefix<u32>)],
    /// The IPv6 update stream.
    pub updates_v6: &'a [(RouteOp, Prefix<u128>)],
}

/// Why the kernel's side cannot run with `cfg`, if it cannot.
pub fn kernel_missing(cfg: &StudyConfig) -> Option<String> {
    if cfg.kernel {
        KernelFib::new().err()
    } else {
        Some("the kernel side was turned off (--no-kernel)".into())
    }
}

/// Number of progress steps [`run_studies`] will announce for `input`, with the kernel's
/// side or without it (see [`kernel_missing`]).
pub fn step_count(input: &StudyInput<'_>, cfg: &StudyConfig, with_kernel: bool) -> u64 {
    // Per family with a table: each sampled size below the table's, the whole table, the
    // threads study, uniform addresses, DPDK beside fibre and, with --full and the
    // kernel, the kernel's delete; and with --full the updates study when there is a
    // stream for it.
    let family = |routes: usize, updates: usize| {
        if routes == 0 {
            return 0;
        }
        let sizes = cfg.sizes.iter().filter(|&&s| s < routes).count();
        let delete = usize::from(cfg.full && with_kernel);
        let updates = usize::from(cfg.full && updates > 0);
        sizes + 1 + 1 + 1 + 1 + delete + updates
    };
    let many = if cfg.full {
        2 * cfg.many_sizes.len()
    } else {
        0
    };
    (family(input.v4.len(), input.updates_v4.len())
        + family(input.v6.len(), input.updates_v6.len())
        + many) as u64
}

/// Runs the studies on the real tables; returns why the kernel was left out, if it was.
pub fn run_studies(
    input: &StudyInput<'_>,
    cfg: &StudyConfig,
    sink: &mut Sink<'_>,
) -> Option<String> {
    let kernel_missing = kernel_missing(cfg);
    let with_kernel = kernel_missing.is_none();
    if !input.v4.is_empty() {
        family_studies(input.v4, cfg, with_kernel, sink);
    }
    if !input.v6.is_empty() {
        family_studies(input.v6, cfg, with_kernel, sink);
    }
    if cfg.full {
        many_study(48, cfg, with_kernel, sink);
        many_study(128, cfg, with_kernel, sink);
        if !input.v4.is_empty() && !input.updates_v4.is_empty() {
            updates_study(input.v4, input.updates_v4, cfg, with_kernel, sink);
        }
        if !input.v6.is_empty() && !input.updates_v6.is_empty() {
            updates_study(input.v6, input.updates_v6, cfg, with_kernel, sink);
        }
    }
    kernel_missing
}

fn base<K: Key>(study: &str, engine: &str, routes: usize, metric: &str) -> Value {
    json!({"engine": engine, "family": K::FAMILY, "routes": routes, "metric": metric, "study": study})
}

/// `a` with `b`'s fields added (both JSON objects).
pub(crate) fn merge(mut a: Value, b: Value) -> Value {
    if let (Some(m), Value::Object(e)) = (a.as_object_mut(), b) {
        m.extend(e);
    }
    a
}

pub(crate) fn to_ip<K: Key>(k: K) -> IpAddr {
    if K::FAMILY == 4 {
        IpAddr::V4((k.to_u128() as u32).into())
    } else {
        IpAddr::V6(k.to_u128().into())
    }
}

/// The kernel's lookup figure: per lookup by its own clock, throughput by the wall clock,
/// each with the dry run's subtracted (see [`KernelTiming`]), and the four figures the
/// difference comes from; or the error.
fn kernel_figure<K: Key>(
    study: &str,
    routes: usize,
    threads: usize,
    addresses: &str,
    t: io::Result<KernelTiming>,
) -> Value {
    match t {
        Ok(t) => merge(
            merge(
                base::<K>(study, "kernel", routes, "lookup"),
                lookup_figure(Mode::Scalar, threads, addresses, t.net()),
            ),
            json!({"real_clock_ns": t.real.per_op.mean, "dry_clock_ns": t.dry.per_op.mean,
                   "real_wall_ns": t.real.throughput.mean, "dry_wall_ns": t.dry.throughput.mean}),
        ),
        Err(e) => merge(
            base::<K>(study, "kernel", routes, "error"),
            json!({"error": e.to_string()}),
        ),
    }
}

/// The kernel's share of `keys`: its lookups per call, at most.
fn kernel_addresses<K: Key>(keys: &[K], cfg: &StudyConfig) -> Vec<IpAddr> {
    let n = keys.len().min(cfg.kernel_count as usize);
    keys[..n].iter().map(|&k| to_ip(k)).collect()
}

/// `ops` over `seconds` as JSON: null when the time is not positive.
fn rate(ops: usize, seconds: f64) -> Value {
    if seconds > 0.0 {
        json!(ops as f64 / seconds)
    } else {
        Value::Null
    }
}

/// `n` distinct routes of `all`, chosen at random.
pub(crate) fn sample<K: Key>(all: &[Prefix<K>], n: usize, seed: u64) -> Vec<Prefix<K>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut picked: Vec<Prefix<K>> =
        rand::seq::index::sample(&mut rng, all.len(), n.min(all.len()))
            .into_iter()
            .map(|i| all[i])
            .collect();
    picked.sort_unstable();
    picked
}

/// Every engine on one table and one address set; `kernel` is the loaded kernel side.
#[allow(clippy::too_many_arguments)]
fn measure_engines<K: Key + PeerKey>(
    study: &str,
    routes: &[Prefix<K>],
    keys: &[K],
    addresses: &str,
    threads: usize,
    cfg: &StudyConfig,
    kernel: Option<&KernelFib>,
    sink: &mut Sink<'_>,
) {
    let method = Method {
        repetitions: cfg.repetitions,
        threads,
    };
    let table = Table::<K>::build(routes.iter().enumerate().map(|(i, p)| (*p, i as u32)));
    for mode in [Mode::Scalar, Mode::Batch] {
        let t = measure_fibre(table.clone(), keys, mode, method, cfg.batch);
        (sink.emit)(merge(
            base::<K>(study, "fibre", routes.len(), "lookup"),
            lookup_figure(mode, threads, addresses, t),
        ));
    }
    for peer in build_peers(routes) {
        let t = measure_peer(peer.as_ref(), keys, method);
        (sink.emit)(merge(
            base::<K>(study, peer.name(), routes.len(), "lookup"),
            lookup_figure(Mode::Scalar, threads, addresses, t),
        ));
    }
    if let Some(k) = kernel {
        let ips = kernel_addresses(keys, cfg);
        let t = k.lookups(K::FAMILY, &ips, method, cfg.kernel_count);
        (sink.emit)(kernel_figure::<K>(
            study,
            routes.len(),
            threads,
            addresses,
            t,
        ));
    }
}

/// The threads study: every engine on the whole table with 1 up to `cfg.max_threads`
/// threads. fibre's and the peers' thread counts take turns repetition by repetition, so
/// the machine's drift hits them alike; the kernel's are measured one after another (each
/// of its measurements loads a probe program). Every engine's throughput is measured the
/// same way: the threads run at once, and the wall time from the first one's start to the
/// last one's end, over all their lookups, less the dry run's measured the same way.
fn measure_threads<K: Key + PeerKey>(
    routes: &[Prefix<K>],
    keys: &[K],
    cfg: &StudyConfig,
    kernel: Option<&KernelFib>,
    sink: &mut Sink<'_>,
) {
    let counts: Vec<usize> = (1..=cfg.max_threads.max(1)).collect();
    let one = |threads| Method {
        repetitions: 1,
        threads,
    };
    let emit_all = |sink: &mut Sink<'_>, engine: &str, mode: Mode, timings: Vec<Timing>| {
        for (&threads, t) in counts.iter().zip(timings) {
            (sink.emit)(merge(
                base::<K>("threads", engine, routes.len(), "lookup"),
                lookup_figure(mode, threads, "matched", t),
            ));
        }
    };
    let table = Table::<K>::build(routes.iter().enumerate().map(|(i, p)| (*p, i as u32)));
    let (writer, reader) = fibre_lpm::shared(table);
    let readers = reader.factory();
    for mode in [Mode::Scalar, Mode::Batch] {
        let timings = interleaved(cfg.repetitions, counts.len(), |v| {
            measure_readers(&readers, keys, mode, one(counts[v]), cfg.batch)
        });
        emit_all(sink, "fibre", mode, timings);
    }
    drop(writer);
    for peer in build_peers(routes) {
        let timings = interleaved(cfg.repetitions, counts.len(), |v| {
            measure_peer(peer.as_ref(), keys, one(counts[v]))
        });
        emit_all(sink, peer.name(), Mode::Scalar, timings);
    }
    if let Some(k) = kernel {
        let ips = kernel_addresses(keys, cfg);
        for &threads in &counts {
            let method = Method {
                repetitions: cfg.repetitions,
                threads,
            };
            let t = k.lookups(K::FAMILY, &ips, method, cfg.kernel_count);
            (sink.emit)(kernel_figure::<K>(
                "threads",
                routes.len(),
                threads,
                "matched",
                t,
            ));
        }
    }
}

/// Loads `routes` into a fresh kernel namespace, emitting the cost.
fn load_kernel<K: Key>(
    study: &str,
    routes: &[Prefix<K>],
    sink: &mut Sink<'_>,
) -> Option<KernelFib> {
    let k = KernelFib::new().ok()?;
    match k.load(routes) {
        Ok(cost) => {
            let memory = match &cost.slab {
                Ok(bytes) => json!({"slab_bytes": bytes,
                                    "bytes_per_route": *bytes as f64 / routes.len().max(1) as f64}),
                Err(why) => json!({"slab_bytes": null, "bytes_per_route": null, "slab_note": why}),
            };
            (sink.emit)(merge(
                merge(
                    base::<K>(study, "kernel", routes.len(), "load"),
                    json!({"seconds": cost.seconds, "routes_per_sec": rate(routes.len(), cost.seconds)}),
                ),
                memory,
            ));
            Some(k)
        }
        Err(e) => {
            (sink.emit)(merge(
                base::<K>(study, "kernel", routes.len(), "error"),
                json!({"error": e.to_string()}),
            ));
            None
        }
    }
}

fn fibre_load<K: Key>(study: &str, routes: &[Prefix<K>], sink: &mut Sink<'_>) {
    let start = Instant::now();
    let t = Table::<K>::build(routes.iter().enumerate().map(|(i, p)| (*p, i as u32)));
    let secs = start.elapsed().as_secs_f64();
    let mut inc = Table::<K>::default();
    let start = Instant::now();
    for (i, p) in routes.iter().enumerate() {
        inc.insert(*p, i as u32);
    }
    let inc_secs = start.elapsed().as_secs_f64();
    let start = Instant::now();
    for p in routes {
        inc.remove(p);
    }
    let remove_secs = start.elapsed().as_secs_f64();
    let m = t.memory();
    (sink.emit)(merge(
        base::<K>(study, "fibre", routes.len(), "load"),
        json!({"seconds": secs, "routes_per_sec": rate(routes.len(), secs),
               "insert_per_sec": rate(routes.len(), inc_secs),
               "remove_per_sec": rate(routes.len(), remove_secs),
               "lookup_bytes": m.lookup_bytes, "update_bytes": m.update_bytes,
               "bytes_per_route": (m.lookup_bytes + m.update_bytes) as f64 / routes.len().max(1) as f64}),
    ));
}

/// Loads `routes` into every engine (timing it) and measures matched lookups on one
/// thread; returns the loaded kernel and the addresses, for more studies of the table.
fn load_and_measure<K: Key + PeerKey>(
    study: &str,
    routes: &[Prefix<K>],
    cfg: &StudyConfig,
    with_kernel: bool,
    sink: &mut Sink<'_>,
) -> (Option<KernelFib>, Vec<K>) {
    fibre_load(study, routes, sink);
    let kernel = if with_kernel {
        load_kernel(study, routes, sink)
    } else {
        None
    };
    let keys = addresses::matched(routes, cfg.count, cfg.seed);
    measure_engines(
        study,
        routes,
        &keys,
        "matched",
        1,
        cfg,
        kernel.as_ref(),
        sink,
    );
    (kernel, keys)
}

fn family_studies<K: Key + PeerKey + DpdkKey>(
    full: &[Prefix<K>],
    cfg: &StudyConfig,
    with_kernel: bool,
    sink: &mut Sink<'_>,
) {
    let mut sizes: Vec<usize> = cfg
        .sizes
        .iter()
        .copied()
        .filter(|&s| s < full.len())
        .collect();
    sizes.push(full.len());
    for &size in &sizes {
        (sink.step)(&format!("IPv{}: table size {size}", K::FAMILY));
        let routes = if size == full.len() {
            full.to_vec()
        } else {
            sample(full, size, cfg.seed ^ size as u64)
        };
        let (kernel, keys) = load_and_measure("table-size", &routes, cfg, with_kernel, sink);
        if size == full.len() {
            (sink.step)(&format!(
                "IPv{}: full table, 1 to {} threads",
                K::FAMILY,
                cfg.max_threads
            ));
            measure_threads(&routes, &keys, cfg, kernel.as_ref(), sink);
            (sink.step)(&format!("IPv{}: full table, uniform addresses", K::FAMILY));
            let uniform = addresses::uniform::<K>(cfg.count, cfg.seed);
            measure_engines(
                "from-bgp",
                &routes,
                &uniform,
                "uniform",
                1,
                cfg,
                kernel.as_ref(),
                sink,
            );
            dpdk_study(&routes, &keys, cfg, sink);
            if cfg.full && with_kernel {
                (sink.step)(&format!(
                    "IPv{}: deleting the whole table from the kernel",
                    K::FAMILY
                ));
                // Nothing to delete if the table did not load (its error is emitted).
                let figure = kernel.as_ref().map(|k| match k.unload(&routes) {
                    Ok(secs) => merge(
                        base::<K>("table-size", "kernel", routes.len(), "delete"),
                        json!({"seconds": secs, "routes_per_sec": rate(routes.len(), secs)}),
                    ),
                    Err(e) => merge(
                        base::<K>("table-size", "kernel", routes.len(), "error"),
                        json!({"error": e.to_string()}),
                    ),
                });
                if let Some(figure) = figure {
                    (sink.emit)(figure);
                }
            }
        }
    }
}

/// Addresses whose answers the DPDK study checks against fibre's before measuring.
const DPDK_CHECKED: usize = 1 << 16;

/// The DPDK study: the whole table in fibre and in DPDK's FIB of the family, the same
/// matched addresses, one thread; one address at a time, batches and dependent lookups,
/// the engines and modes taking turns repetition by repetition so that the machine's
/// drift hits them alike; and the memory of each. DPDK's answers are checked against
/// fibre's first (for the first `DPDK_CHECKED` addresses): a peer that answers wrong is
/// skipped, with the count, since its figures would mean nothing. Where DPDK cannot run
/// (or `cfg.dpdk` is off), one `skipped` figure says why and fibre's side is measured
/// alone.
fn dpdk_study<K: Key + DpdkKey>(
    routes: &[Prefix<K>],
    keys: &[K],
    cfg: &StudyConfig,
    sink: &mut Sink<'_>,
) {
    (sink.step)(&format!("IPv{}: full table, fibre beside DPDK", K::FAMILY));
    let study = "dpdk";
    let table = Table::<K>::build(routes.iter().enumerate().map(|(i, p)| (*p, i as u32)));
    let m = table.memory();
    (sink.emit)(merge(
        base::<K>(study, "fibre", routes.len(), "memory"),
        json!({"lookup_bytes": m.lookup_bytes, "update_bytes": m.update_bytes,
               "total_bytes": m.lookup_bytes + m.update_bytes}),
    ));
    let dpdk = if cfg.dpdk {
        Dpdk::<K>::build(routes).and_then(|d| {
            let wrong = keys
                .iter()
                .take(DPDK_CHECKED)
                .filter(|&&k| d.lookup(k) != table.lookup(k))
                .count();
            if wrong == 0 {
                Ok(d)
            } else {
                Err(format!(
                    "DPDK peer skipped: its answers differ from fibre's for {wrong} of {} \
                     addresses",
                    keys.len().min(DPDK_CHECKED)
                ))
            }
        })
    } else {
        Err("DPDK peer skipped: turned off (--no-dpdk)".to_string())
    };
    let modes = [Mode::Scalar, Mode::Batch, Mode::Dependent];
    let (writer, reader) = fibre_lpm::shared(table);
    let readers = reader.factory();
    let one = Method {
        repetitions: 1,
        threads: 1,
    };
    let raw = dpdk.as_ref().map(|_| raw_keys(keys)).unwrap_or_default();
    let variants = if dpdk.is_ok() { 6 } else { 3 };
    let timings = interleaved(cfg.repetitions, variants, |v| match (&dpdk, v) {
        (_, v) if v < 3 => measure_readers(&readers, keys, modes[v], one, cfg.batch),
        (Ok(d), v) => d.measure(&raw, modes[v - 3], one, cfg.batch),
        (Err(_), _) => unreachable!("three variants without DPDK"),
    });
    drop(writer);
    // Each figure's ns per lookup as emitted: null where the run could not trust it.
    let mut ns = Vec::new();
    for (v, t) in timings.iter().enumerate() {
        let engine = if v < 3 { "fibre" } else { "dpdk" };
        let f = merge(
            base::<K>(study, engine, routes.len(), "lookup"),
            lookup_figure(modes[v % 3], 1, "matched", *t),
        );
        ns.push(f["ns_per_lookup"].as_f64());
        (sink.emit)(f);
    }
    match &dpdk {
        Ok(d) => {
            (sink.emit)(merge(
                base::<K>(study, "dpdk", routes.len(), "memory"),
                json!({"tables_bytes": d.memory.tables_bytes, "total_bytes": d.memory.heap_bytes,
                       "num_tbl8": d.memory.num_tbl8, "tbl8_needed": d.memory.tbl8_needed,
                       "tables_needed_bytes": d.memory.needed_bytes, "build_seconds": d.build_seconds,
                       "lookup_fn": if d.vector { "avx512" } else { "scalar" },
                       "structure": if K::FAMILY == 4 { "rte_fib DIR-24-8" } else { "rte_fib6 trie" },
                       "next_hop_bytes": 4, "dpdk_version": crate::dpdk::version()}),
            ));
            // DPDK's time over fibre's (above 1: fibre ahead), and fibre's memory over
            // DPDK's; null where a figure is missing.
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if a > 0.0 && b > 0.0 && a.is_finite() && b.is_finite() => {
                    json!(a / b)
                }
                _ => Value::Null,
            };
            let mut r = base::<K>(study, "dpdk", routes.len(), "ratio");
            for (i, mode) in modes.iter().enumerate() {
                r[mode.name()] = ratio(ns[i + 3], ns[i]);
            }
            r["memory_lookup"] = ratio(
                Some(m.lookup_bytes as f64),
                Some(d.memory.tables_bytes as f64),
            );
            r["memory_lookup_needed"] = ratio(
                Some(m.lookup_bytes as f64),
                Some(d.memory.needed_bytes as f64),
            );
            r["memory_total"] = ratio(
                Some((m.lookup_bytes + m.update_bytes) as f64),
                Some(d.memory.heap_bytes as f64),
            );
            r["cpu"] = json!(crate::report::cpu_model());
            (sink.emit)(r);
        }
        Err(why) => (sink.emit)(merge(
            base::<K>(study, "dpdk", routes.len(), "skipped"),
            json!({"reason": why}),
        )),
    }
}

/// bench-many-48 / bench-many-128: random prefixes of one length in 2000::/3.
fn many_study(len: u8, cfg: &StudyConfig, with_kernel: bool, sink: &mut Sink<'_>) {
    let study = format!("many-{len}");
    for &size in &cfg.many_sizes {
        (sink.step)(&format!("IPv6: {size} random /{len} prefixes"));
        let mut rng = SmallRng::seed_from_u64(cfg.seed ^ u64::from(len) ^ size as u64);
        let mut routes: Vec<Prefix<u128>> = (0..size)
            .map(|_| Prefix::new_clamped((rng.gen::<u128>() >> 3) | (1 << 125), len))
            .collect();
        routes.sort_unstable();
        routes.dedup();
        load_and_measure(&study, &routes, cfg, with_kernel, sink);
    }
}

/// Lookups while the real day of updates of one family is applied: fibre's shared writer
/// in a thread of its own (for IPv6 the range tree's, which copies whole blocks, so its
/// readers are the ones to watch), and the kernel fed the same stream through `ip -batch`.
fn updates_study<K: Key>(
    rib: &[Prefix<K>],
    updates: &[(RouteOp, Prefix<K>)],
    cfg: &StudyConfig,
    with_kernel: bool,
    sink: &mut Sink<'_>,
) {
    (sink.step)(&format!(
        "IPv{}: lookups while the day of updates is applied",
        K::FAMILY
    ));
    let keys = addresses::matched(rib, cfg.count, cfg.seed);
    let lookup_cfg = crate::lookups::LookupConfig {
        threads: 1,
        repetitions: cfg.repetitions,
        count: cfg.count,
        batch: cfg.batch,
        seed: cfg.seed,
        publish_every: 64,
    };
    let sets = [crate::lookups::AddressSet {
        name: "matched".into(),
        keys,
    }];
    // Of the lookups, only the pair this study is about: the baseline with the writer idle,
    // and the same readers while it applies the stream.
    let mut emit = |f: Figure| {
        if f["metric"] != "lookup" || f["writer"] == true || f["baseline"] == true {
            (sink.emit)(merge(f, json!({"study": "updates"})));
        }
    };
    crate::lookups::bench_family::<K>(
        crate::lookups::Choice::default(),
        rib,
        Some(updates),
        &sets,
        &lookup_cfg,
        &mut emit,
        &mut |_| {},
    );
    if !with_kernel {
        return;
    }
    let Some(kernel) = load_kernel("updates", rib, sink) else {
        return;
    };
    let (batch, ops, absent) = kernel_update_batch(rib, updates);
    let method = Method {
        repetitions: cfg.repetitions,
        threads: 1,
    };
    let ips = kernel_addresses(&sets[0].keys, cfg);
    let alone = kernel.lookups(K::FAMILY, &ips, method, cfg.kernel_count);
    let (under, applied): (io::Result<KernelTiming>, io::Result<f64>) = std::thread::scope(|s| {
        let ns = kernel.namespace();
        let writer = s.spawn(|| {
            // -force carries on past a failing command, should one fail.
            let start = Instant::now();
            ns.batch_force(&batch)
                .map(|()| start.elapsed().as_secs_f64())
        });
        let t = kernel.lookups(K::FAMILY, &ips, method, cfg.kernel_count);
        (t, writer.join().expect("the writer thread panicked"))
    });
    for (t, writer) in [(alone, false), (under, true)] {
        let mut f = kernel_figure::<K>("updates", rib.len(), 1, "matched", t);
        f["writer"] = json!(writer);
        (sink.emit)(f);
    }
    (sink.emit)(match applied {
        Ok(secs) => merge(
            base::<K>("updates", "kernel", rib.len(), "updates"),
            json!({"path": "ip -batch", "ops": ops, "absent_withdrawals_left_out": absent,
                   "seconds": secs, "ops_per_sec": rate(ops, secs)}),
        ),
        Err(e) => merge(
            base::<K>("updates", "kernel", rib.len(), "error"),
            json!({"error": e.to_string()}),
        ),
    });
}

/// The update stream as `ip -batch` commands for a kernel holding `rib`: announcements
/// replace (route `i` of the stream via gateway `i mod GATEWAYS`), withdrawals delete.
/// Withdrawals of prefixes the table does not hold at that point are left out: `ip` would
/// fail on them (fibre's writer takes them as no-ops), and a stream's worth of error
/// messages can fill the pipe `ip` writes them to. Returns the commands, their number and
/// the number of withdrawals left out.
fn kernel_update_batch<K: Key>(
    rib: &[Prefix<K>],
    updates: &[(RouteOp, Prefix<K>)],
) -> (String, usize, usize) {
    let mut present: std::collections::HashSet<Prefix<K>> = rib.iter().copied().collect();
    let mut batch = String::with_capacity(updates.len() * 48);
    let (mut ops, mut absent) = (0, 0);
    for (i, &(op, p)) in updates.iter().enumerate() {
        match op {
            RouteOp::Announce => {
                present.insert(p);
                batch.push_str(&format!(
                    "route replace {p} via {} dev {}\n",
                    fibre_testbed::netns::gateway(K::FAMILY, i % crate::kernel::GATEWAYS),
                    fibre_testbed::netns::OUTPUT_DEV
                ));
            }
            RouteOp::Withdraw if present.remove(&p) => {
                batch.push_str(&format!("route del {p}\n"));
            }
            RouteOp::Withdraw => {
                absent += 1;
                continue;
            }
        }
        ops += 1;
    }
    (batch, ops, absent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4_table() -> Vec<Prefix<u32>> {
        let mut v: Vec<Prefix<u32>> = (0..300u32)
            .map(|i| Prefix::new_clamped((20 + i % 50) << 24 | (i / 50) << 16, 16))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    fn v6_table() -> Vec<Prefix<u128>> {
        let mut v: Vec<Prefix<u128>> = (0..200u128)
            .map(|i| Prefix::new_clamped(0x2a00u128 << 112 | i << 80, 48))
            .collect();
        v.sort_unstable();
        v
    }

    fn stream<K: Key>(table: &[Prefix<K>]) -> Vec<(RouteOp, Prefix<K>)> {
        table
            .iter()
            .take(40)
            .flat_map(|&p| [(RouteOp::Withdraw, p), (RouteOp::Announce, p)])
            .collect()
    }

    #[test]
    fn the_kernel_update_batch_leaves_out_withdrawals_of_absent_routes() {
        let p = |s: &str| s.parse::<Prefix<u128>>().unwrap();
        let rib = [p("2001:db8::/32")];
        let updates = [
            (RouteOp::Withdraw, p("2001:db9::/32")),
            (RouteOp::Announce, p("2001:db9::/32")),
            (RouteOp::Withdraw, p("2001:db9::/32")),
            (RouteOp::Withdraw, p("2001:db9::/32")),
            (RouteOp::Withdraw, p("2001:db8::/32")),
        ];
        let (batch, ops, absent) = kernel_update_batch(&rib, &updates);
        assert_eq!((ops, absent), (3, 2));
        assert_eq!(
            batch,
            "route replace 2001:db9::/32 via fd00:200::3 dev fout\n\
             route del 2001:db9::/32\n\
             route del 2001:db8::/32\n"
        );
    }

    /// Runs the studies without the kernel; returns the steps announced and the figures.
    fn run(input: &StudyInput<'_>, cfg: &StudyConfig) -> (Vec<String>, Vec<Figure>) {
        let (mut steps, mut figures) = (Vec::new(), Vec::new());
        let missing = run_studies(
            input,
            cfg,
            &mut Sink {
                emit: &mut |f| figures.push(f),
                step: &mut |s| steps.push(s.to_string()),
            },
        );
        assert!(missing.is_some(), "the kernel side is off");
        (steps, figures)
    }

    #[test]
    fn step_count_matches_the_steps_announced_and_updates_cover_both_families() {
        let (v4, v6) = (v4_table(), v6_table());
        let (u4, u6) = (stream(&v4), stream(&v6));
        let cfg = StudyConfig {
            full: true,
            // 1000 is larger than either table: no step of its own.
            sizes: vec![1, 10, 1000],
            max_threads: 2,
            repetitions: 3,
            count: 2048,
            kernel_count: 1024,
            kernel: false,
            many_sizes: vec![64],
            // The DPDK study's step is announced whether DPDK runs or not.
            dpdk: false,
            ..StudyConfig::default()
        };
        let full = StudyInput {
            v4: &v4,
            v6: &v6,
            updates_v4: &u4,
            updates_v6: &u6,
        };
        let cases = [
            ("everything", full, true),
            (
                "IPv4 updates only",
                StudyInput {
                    updates_v6: &[],
                    ..full
                },
                true,
            ),
            (
                "IPv6 updates only",
                StudyInput {
                    updates_v4: &[],
                    ..full
                },
                true,
            ),
            ("no IPv4 table", StudyInput { v4: &[], ..full }, true),
            ("not --full", full, false),
        ];
        for (name, input, is_full) in cases {
            let cfg = StudyConfig {
                full: is_full,
                ..cfg.clone()
            };
            let (steps, figures) = run(&input, &cfg);
            assert_eq!(
                steps.len() as u64,
                step_count(&input, &cfg, false),
                "{name}: {steps:#?}"
            );
            let updates = |fam: u8| {
                figures
                    .iter()
                    .filter(|f| f["study"] == "updates" && f["family"] == fam)
                    .filter(|f| f["metric"] == "lookup")
                    .count()
            };
            // Per family with a table and a stream: scalar and batch, each with the writer
            // idle, on its own table and on the shared one.
            let expect = |table: usize, stream: usize| {
                if is_full && table > 0 && stream > 0 {
                    6
                } else {
                    0
                }
            };
            assert_eq!(
                updates(4),
                expect(input.v4.len(), input.updates_v4.len()),
                "{name}"
            );
            assert_eq!(
                updates(6),
                expect(input.v6.len(), input.updates_v6.len()),
                "{name}"
            );
        }
    }
}
