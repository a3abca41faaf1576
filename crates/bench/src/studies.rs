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
//! 5. **updates** (`--full`): lookups while the real day of updates is applied.
//!
//! Every engine gets the same routes (values are route indices; in the kernel, route `i`
//! goes via gateway `i mod 64`), the same addresses and the same method. The kernel side
//! needs root; without it the studies run fibre's side and say why the kernel is missing.

use crate::addresses;
use crate::kernel::{KernelFib, KernelTiming};
use crate::lookups::{lookup_figure, measure_fibre, measure_readers, Figure, Mode};
use crate::method::{interleaved, Method, Timing};
use crate::peers::{build_peers, measure_peer, PeerKey};
use crate::source::RouteOp;
use fibre_lpm::{Engine, Key, Prefix, Table};
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

/// Number of progress steps [`run_studies`] will announce.
pub fn step_count(cfg: &StudyConfig, families: usize) -> u64 {
    // Table sizes and the whole table, the threads study, uniform addresses, and with
    // --full the kernel's delete.
    let per_family = cfg.sizes.len() + 1 + 1 + 1 + usize::from(cfg.full);
    let full = if cfg.full { 3 + 3 + 1 } else { 0 };
    (families * per_family + full) as u64
}

/// Runs the studies on the real tables (the IPv4 update stream feeds the updates study of
/// `--full`); returns why the kernel was left out, if it was.
pub fn run_studies(
    v4: &[Prefix<u32>],
    v6: &[Prefix<u128>],
    updates_v4: &[(RouteOp, Prefix<u32>)],
    cfg: &StudyConfig,
    sink: &mut Sink<'_>,
) -> Option<String> {
    let kernel_missing = if cfg.kernel {
        crate::kernel::KernelFib::new().err()
    } else {
        Some("the kernel side was turned off (--no-kernel)".into())
    };
    let with_kernel = kernel_missing.is_none();
    if !v4.is_empty() {
        family_studies(v4, cfg, with_kernel, sink);
    }
    if !v6.is_empty() {
        family_studies(v6, cfg, with_kernel, sink);
    }
    if cfg.full {
        many_study(48, cfg, with_kernel, sink);
        many_study(128, cfg, with_kernel, sink);
        if !v4.is_empty() && !updates_v4.is_empty() {
            updates_study(v4, updates_v4, cfg, with_kernel, sink);
        }
    }
    kernel_missing
}

fn base<K: Key>(study: &str, engine: &str, routes: usize, metric: &str) -> Value {
    json!({"engine": engine, "family": K::FAMILY, "routes": routes, "metric": metric, "study": study})
}

fn merge(mut a: Value, b: Value) -> Value {
    if let (Some(m), Value::Object(e)) = (a.as_object_mut(), b) {
        m.extend(e);
    }
    a
}

fn to_ip<K: Key>(k: K) -> IpAddr {
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
fn sample<K: Key>(all: &[Prefix<K>], n: usize, seed: u64) -> Vec<Prefix<K>> {
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

fn family_studies<K: Key + PeerKey>(
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
            if let (true, Some(k)) = (cfg.full, &kernel) {
                (sink.step)(&format!(
                    "IPv{}: deleting the whole table from the kernel",
                    K::FAMILY
                ));
                let figure = match k.unload(&routes) {
                    Ok(secs) => merge(
                        base::<K>("table-size", "kernel", routes.len(), "delete"),
                        json!({"seconds": secs, "routes_per_sec": rate(routes.len(), secs)}),
                    ),
                    Err(e) => merge(
                        base::<K>("table-size", "kernel", routes.len(), "error"),
                        json!({"error": e.to_string()}),
                    ),
                };
                (sink.emit)(figure);
            }
        }
    }
}

/// bench-many-48 / bench-many-128: random prefixes of one length in 2000::/3.
fn many_study(len: u8, cfg: &StudyConfig, with_kernel: bool, sink: &mut Sink<'_>) {
    let study = format!("many-{len}");
    for size in [10_000usize, 100_000, 1_000_000] {
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

/// Lookups while the real day of IPv4 updates is applied: fibre's shared writer in a
/// thread of its own, and the kernel fed the same stream through `ip -batch`.
fn updates_study(
    rib: &[Prefix<u32>],
    updates: &[(RouteOp, Prefix<u32>)],
    cfg: &StudyConfig,
    with_kernel: bool,
    sink: &mut Sink<'_>,
) {
    (sink.step)("IPv4: lookups while the day of updates is applied");
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
    crate::lookups::bench_family::<u32, Table<u32>>(
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
    let mut batch = String::new();
    for (i, (op, p)) in updates.iter().enumerate() {
        match op {
            RouteOp::Announce => batch.push_str(&format!(
                "route replace {p} via {} dev {}\n",
                fibre_kernel::netns::gateway(4, i % crate::kernel::GATEWAYS),
                fibre_kernel::netns::OUTPUT_DEV
            )),
            RouteOp::Withdraw => batch.push_str(&format!("route del {p}\n")),
        }
    }
    let method = Method {
        repetitions: cfg.repetitions,
        threads: 1,
    };
    let ips = kernel_addresses(&sets[0].keys, cfg);
    let alone = kernel.lookups(4, &ips, method, cfg.kernel_count);
    let under: io::Result<KernelTiming> = std::thread::scope(|s| {
        let ns = kernel.namespace();
        let writer = s.spawn(|| {
            // ip stops at the first failing command (a withdrawal of a missing route),
            // so feed it with -force semantics: one batch, errors ignored.
            let _ = ns.batch_force(&batch);
        });
        let t = kernel.lookups(4, &ips, method, cfg.kernel_count);
        let _ = writer.join();
        t
    });
    for (t, writer) in [(alone, false), (under, true)] {
        let mut f = kernel_figure::<u32>("updates", rib.len(), 1, "matched", t);
        f["writer"] = json!(writer);
        (sink.emit)(f);
    }
}
