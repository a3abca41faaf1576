//! `fibre bench lookup`: the engine's figures for one route table, family by family.
//!
//! For each family present it measures, in this order: the bulk build; memory; inserting
//! every route one at a time into an empty table and removing them again; the real update
//! stream if one is given (on the engine, and through the shared writer, which copies
//! what published snapshots can reach instead of writing it); lookups, scalar and batched, on each address set, for
//! 1 up to N threads; and, with an update stream, lookups while a writer thread applies it
//! flat out. Lookups go through the shared table's readers, a read guard taken per 256
//! addresses, as a forwarding thread would take one per burst of packets.
//!
//! Every figure is emitted as one JSON object (see [`Figure`]); the caller prints them.

use crate::addresses;
use crate::method::{interleaved, measure, Method, Stat, Timing};
use fibre_lpm::{
    shared, Form, Key, LpmReader, LpmReaderFactory, Prefix, Structure, Table, UnsupportedForm,
};
use fibre_routefile::RouteOp;
use serde_json::{json, Value};
use std::hint::black_box;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// One measured figure, as a JSON object with at least `engine`, `family`, `routes` and
/// `metric`.
pub type Figure = Value;

/// Addresses looked up per read guard.
const GUARD_SPAN: usize = 256;

/// What to measure.
#[derive(Clone, Debug)]
pub struct LookupConfig {
    /// Highest thread count (every count from 1 up to it is measured).
    pub threads: usize,
    /// Repetitions per measurement.
    pub repetitions: usize,
    /// Addresses generated per address set.
    pub count: usize,
    /// Keys per batched call.
    pub batch: usize,
    /// Seed of the address generators.
    pub seed: u64,
    /// Operations the writer applies between two publishes.
    pub publish_every: usize,
}

impl Default for LookupConfig {
    fn default() -> Self {
        LookupConfig {
            threads: 1,
            repetitions: 12,
            count: addresses::DEFAULT_COUNT,
            batch: 64,
            seed: 1,
            publish_every: 64,
        }
    }
}

/// Which structure and form the measured tables use; `None`: the table's own choice
/// (the family's best structure, the fastest form this CPU runs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Choice {
    structure: Option<Structure>,
    form: Option<Form>,
}

impl Choice {
    /// The given structure and form, if this CPU runs the form.
    pub fn new(
        structure: Option<Structure>,
        form: Option<Form>,
    ) -> Result<Choice, UnsupportedForm> {
        match form {
            Some(f) if !f.is_supported() => Err(UnsupportedForm(f)),
            _ => Ok(Choice { structure, form }),
        }
    }

    /// An empty table of this choice.
    pub fn empty<K: Key>(&self) -> Table<K> {
        self.build([])
    }

    /// A table of this choice holding `routes`, built in bulk.
    pub fn build<K: Key>(&self, routes: impl IntoIterator<Item = (Prefix<K>, u32)>) -> Table<K> {
        let mut t = match self.structure {
            Some(s) => Table::build_with(s, routes),
            None => Table::build(routes),
        };
        if let Some(f) = self.form {
            t.set_form(f)
                .expect("Choice::new checked that this CPU runs the form");
        }
        t
    }
}

/// A named set of addresses to look up.
pub struct AddressSet<K> {
    /// `matched`, `uniform` or a file name.
    pub name: String,
    /// The addresses.
    pub keys: Vec<K>,
}

/// How lookups are issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A loop of single-key lookups.
    Scalar,
    /// Batched calls.
    Batch,
    /// Single-key lookups, each key changed by the previous answer (xor'd with it masked
    /// by an opaque zero), so that no two overlap: the latency of a lookup.
    Dependent,
}

impl Mode {
    /// `scalar`, `batch` or `dependent`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Scalar => "scalar",
            Mode::Batch => "batch",
            Mode::Dependent => "dependent",
        }
    }
}

/// Runs every measurement for one family on tables of `choice`, passing each figure to
/// `emit` as it is made. `on_step` is called with a short description before each step
/// (for progress display).
pub fn bench_family<K: Key>(
    choice: Choice,
    prefixes: &[Prefix<K>],
    updates: Option<&[(RouteOp, Prefix<K>)]>,
    sets: &[AddressSet<K>],
    cfg: &LookupConfig,
    emit: &mut dyn FnMut(Figure),
    on_step: &mut dyn FnMut(&str),
) {
    let empty = choice.empty::<K>();
    let base = |metric: &str| json!({"engine": "fibre", "structure": empty.structure().name(), "form": empty.form().name(), "family": K::FAMILY, "routes": prefixes.len(), "metric": metric});
    let with = |mut v: Value, extra: Value| {
        if let (Some(m), Value::Object(e)) = (v.as_object_mut(), extra) {
            m.extend(e);
        }
        v
    };
    let routes: Vec<(Prefix<K>, u32)> = prefixes
        .iter()
        .enumerate()
        .map(|(i, p)| (*p, i as u32))
        .collect();

    on_step(&format!("IPv{}: bulk build", K::FAMILY));
    let mut build_secs = Vec::new();
    let mut table = choice.empty::<K>();
    for _ in 0..3 {
        let input = routes.clone();
        let start = Instant::now();
        table = choice.build(input);
        build_secs.push(start.elapsed().as_secs_f64());
    }
    let build = Stat::trimmed(&build_secs);
    emit(with(
        base("build"),
        json!({"seconds": build.mean, "routes_per_sec": prefixes.len() as f64 / build.mean}),
    ));

    let m = table.memory();
    emit(with(
        base("memory"),
        json!({
        "lookup_bytes": m.lookup_bytes,
        "update_bytes": m.update_bytes,
        "bytes_per_route": m.lookup_bytes as f64 / prefixes.len().max(1) as f64,
        "nodes": m.nodes,
        "leaves": m.leaves,
                }),
    ));

    on_step(&format!(
        "IPv{}: incremental inserts and removals",
        K::FAMILY
    ));
    let mut t = choice.empty::<K>();
    let start = Instant::now();
    for &(p, v) in &routes {
        t.insert(p, v);
    }
    let insert_secs = start.elapsed().as_secs_f64();
    let start = Instant::now();
    for (p, _) in &routes {
        t.remove(p);
    }
    let remove_secs = start.elapsed().as_secs_f64();
    emit(with(
        base("insert"),
        json!({"ops": routes.len(), "seconds": insert_secs, "ops_per_sec": routes.len() as f64 / insert_secs}),
    ));
    emit(with(
        base("remove"),
        json!({"ops": routes.len(), "seconds": remove_secs, "ops_per_sec": routes.len() as f64 / remove_secs}),
    ));

    if let Some(updates) = updates {
        on_step(&format!("IPv{}: applying the update stream", K::FAMILY));
        let mut t = table.clone();
        let start = Instant::now();
        apply_updates(&mut t, updates);
        let secs = start.elapsed().as_secs_f64();
        emit(with(
            base("updates"),
            json!({"path": "engine", "ops": updates.len(), "seconds": secs, "ops_per_sec": updates.len() as f64 / secs}),
        ));
        let (mut writer, _reader) = shared(table.clone());
        let start = Instant::now();
        for (i, &(op, p)) in updates.iter().enumerate() {
            match op {
                RouteOp::Announce => writer.insert(p, i as u32),
                RouteOp::Withdraw => writer.remove(p),
            };
            if i % cfg.publish_every == cfg.publish_every - 1 {
                writer.publish();
            }
        }
        writer.publish();
        let secs = start.elapsed().as_secs_f64();
        emit(with(
            base("updates"),
            json!({"path": "shared", "publish_every": cfg.publish_every, "ops": updates.len(), "seconds": secs, "ops_per_sec": updates.len() as f64 / secs}),
        ));
    }

    let interference_table = updates.map(|_| table.clone());
    let (writer, reader) = shared(table);
    let factory = reader.factory();
    // Thread counts take turns, one repetition each, so their figures compare.
    let counts: Vec<usize> = (1..=cfg.threads.max(1)).collect();
    for set in sets {
        for mode in [Mode::Scalar, Mode::Batch] {
            on_step(&format!(
                "IPv{}: {} {} lookups, 1 to {} thread(s)",
                K::FAMILY,
                set.name,
                mode.name(),
                counts.len()
            ));
            let timings = interleaved(cfg.repetitions, counts.len(), |v| {
                let method = Method {
                    repetitions: 1,
                    threads: counts[v],
                };
                lookups(method, &|| factory.reader(), &set.keys, mode, cfg.batch)
            });
            for (&threads, timing) in counts.iter().zip(timings) {
                emit(with(
                    base("lookup"),
                    lookup_fields(mode, threads, &set.name, timing, false),
                ));
            }
        }
    }
    drop((writer, reader));

    // Readers while a writer applies the real update stream flat out, against the same
    // readers with the writer idle. A control in between: the same writer applying the
    // stream to a table of its own, which no reader reads. What that costs the readers
    // (the writer's memory traffic, the machine) any design pays; what the shared writer
    // costs beyond it is the sharing's. The three conditions take turns, one pass each
    // per repetition, so the machine's drift hits all three alike.
    if let (Some(updates), Some(table)) = (updates, interference_table) {
        on_step(&format!(
            "IPv{}: lookups with the writer idle, on its own table, on the shared one",
            K::FAMILY
        ));
        let (samples, rates) = interference(table, updates, &sets[0].keys, cfg);
        for (m, mode) in [Mode::Scalar, Mode::Batch].into_iter().enumerate() {
            for (c, target) in [None, Some("private"), Some("shared")]
                .into_iter()
                .enumerate()
            {
                let [real, dry] = &samples[m][c];
                let per_op = Stat::trimmed(real).minus(Stat::trimmed(dry));
                let t = Timing {
                    per_op,
                    throughput: per_op,
                };
                let mut figure = with(
                    base("lookup"),
                    lookup_fields(mode, 1, &sets[0].name, t, target.is_some()),
                );
                match target {
                    None => figure["baseline"] = json!(true),
                    Some(table) => figure["writer_table"] = json!(table),
                }
                emit(figure);
            }
        }
        for (path, (ops, secs)) in ["private-under-load", "shared-under-load"]
            .iter()
            .zip(rates)
        {
            emit(with(
                base("updates"),
                json!({"path": path, "publish_every": cfg.publish_every, "ops": ops,
                       "seconds": secs, "ops_per_sec": ops as f64 / secs}),
            ));
        }
    }
}

/// Lookup passes per mode (scalar, batch), condition (writer idle, on its own table, on
/// the shared one) and kind (real, dry), in ns per lookup; and the writer's operations
/// and busy seconds on each table.
type Interference = ([[[Vec<f64>; 2]; 3]; 2], [(u64, f64); 2]);

/// Measures one reader (on the first CPU) while a writer thread (on the last) is idle,
/// applies `updates` to a table of its own, or applies them to the shared table the
/// reader reads, publishing every `cfg.publish_every` operations.
fn interference<K: Key>(
    table: Table<K>,
    updates: &[(RouteOp, Prefix<K>)],
    keys: &[K],
    cfg: &LookupConfig,
) -> Interference {
    const IDLE: u8 = 0;
    const STOP: u8 = 3;
    let mut private = table.clone();
    let (mut writer, reader) = shared(table);
    let state = AtomicU8::new(IDLE);
    let cpus = core_affinity::get_core_ids().unwrap_or_default();
    let every = cfg.publish_every.max(1);
    std::thread::scope(|s| {
        let (state, cpus) = (&state, &cpus);
        let writer_thread = s.spawn(move || {
            if let Some(&cpu) = cpus.last() {
                core_affinity::set_for_current(cpu);
            }
            let mut pos = [0usize; 2];
            let mut rates = [(0u64, 0f64); 2];
            loop {
                let target = match state.load(Ordering::Acquire) {
                    STOP => break,
                    IDLE => {
                        std::thread::sleep(Duration::from_micros(200));
                        continue;
                    }
                    c => usize::from(c - 1),
                };
                let start = Instant::now();
                for _ in 0..256 {
                    let i = pos[target];
                    let (op, p) = updates[i];
                    match (target, op) {
                        (0, RouteOp::Announce) => private.insert(p, i as u32),
                        (0, RouteOp::Withdraw) => private.remove(&p),
                        (_, RouteOp::Announce) => writer.insert(p, i as u32),
                        (_, RouteOp::Withdraw) => writer.remove(p),
                    };
                    if target == 1 && i % every == every - 1 {
                        writer.publish();
                    }
                    pos[target] = (i + 1) % updates.len();
                }
                rates[target].0 += 256;
                rates[target].1 += start.elapsed().as_secs_f64();
            }
            writer.publish();
            rates
        });
        let reader_thread = s.spawn(move || {
            if let Some(&cpu) = cpus.first() {
                core_affinity::set_for_current(cpu);
            }
            let mut samples: [[[Vec<f64>; 2]; 3]; 2] = Default::default();
            let mut out = vec![None; cfg.batch];
            for _ in 0..cfg.repetitions.max(1) {
                for (m, mode) in [Mode::Scalar, Mode::Batch].into_iter().enumerate() {
                    for (c, sample) in samples[m].iter_mut().enumerate() {
                        state.store(c as u8, Ordering::Release);
                        if c != usize::from(IDLE) {
                            // Let the writer get going.
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        for (kind, real) in [true, false].into_iter().enumerate() {
                            let start = Instant::now();
                            let n = run(&reader, keys, 0, mode, &mut out, real);
                            sample[kind].push(start.elapsed().as_nanos() as f64 / n as f64);
                        }
                    }
                }
            }
            state.store(STOP, Ordering::Release);
            samples
        });
        let samples = reader_thread.join().expect("reader thread panicked");
        let rates = writer_thread.join().expect("writer thread panicked");
        (samples, rates)
    })
}

/// Why a per-lookup figure (`ns_per_lookup`) that is not positive is no figure.
pub const PER_LOOKUP_NOTE: &str = "the dry run took as long as the lookups or longer, so \
    what is left of the difference is noise: no figure";
/// Why a throughput figure (`throughput_ns`) that is not positive is no figure.
pub const THROUGHPUT_NOTE: &str = "the dry run's wall time was as long as the lookups' or \
    longer, so what is left of the difference is noise: no figure";
/// Why a figure smaller than its own mean deviation is no figure.
pub const NOISE_NOTE: &str = "the difference between the lookups and the dry run came out \
    smaller than its own mean deviation, so it cannot be told from noise: no figure";

/// Puts `value` under `key` if it is a positive, finite number of nanoseconds at least
/// its mean deviation `dev`; otherwise null under `key` and why under `key_note`
/// (`not_positive` if it is not positive). Every figure here is a difference (the real
/// run less the dry run), which noise can make zero or negative, or leave too small to
/// tell from noise: such a figure cannot be trusted, and must not be printed as one.
fn put_figure(figure: &mut Value, key: &str, value: f64, dev: f64, not_positive: &str) {
    let note = if !(value.is_finite() && value > 0.0) {
        not_positive
    } else if value < dev {
        NOISE_NOTE
    } else {
        figure[key] = json!(value);
        return;
    };
    figure[key] = Value::Null;
    figure[format!("{key}_note")] = json!(note);
}

fn lookup_fields(mode: Mode, threads: usize, addresses: &str, t: Timing, writer: bool) -> Value {
    let mut f = json!({
        "mode": mode.name(),
        "threads": threads,
        "addresses": addresses,
        "mean_dev": t.per_op.mean_dev,
        "throughput_mean_dev": t.throughput.mean_dev,
        "writer": writer,
    });
    let (p, th) = (t.per_op, t.throughput);
    put_figure(&mut f, "ns_per_lookup", p.mean, p.mean_dev, PER_LOOKUP_NOTE);
    put_figure(
        &mut f,
        "throughput_ns",
        th.mean,
        th.mean_dev,
        THROUGHPUT_NOTE,
    );
    f["lookups_per_sec"] = match f["throughput_ns"].as_f64() {
        Some(ns) => json!(1e9 / ns),
        None => Value::Null,
    };
    f
}

/// Applies an update stream to a table: announcements insert (value = position in the
/// stream), withdrawals remove.
pub fn apply_updates<K: Key>(t: &mut Table<K>, updates: &[(RouteOp, Prefix<K>)]) {
    for (i, &(op, p)) in updates.iter().enumerate() {
        match op {
            RouteOp::Announce => {
                t.insert(p, i as u32);
            }
            RouteOp::Withdraw => {
                t.remove(&p);
            }
        }
    }
}

/// Measures fibre's lookups of `keys` in `table` through the shared table's readers, as
/// `fibre bench lookup` does (dry run subtracted).
pub fn measure_fibre<K: Key>(
    table: Table<K>,
    keys: &[K],
    mode: Mode,
    method: Method,
    batch: usize,
) -> Timing {
    let (writer, reader) = shared(table);
    let t = measure_readers(&reader.factory(), keys, mode, method, batch);
    drop(writer);
    t
}

/// Like [`measure_fibre`], through readers of an existing shared table.
pub fn measure_readers<K: Key>(
    readers: &LpmReaderFactory<K>,
    keys: &[K],
    mode: Mode,
    method: Method,
    batch: usize,
) -> Timing {
    lookups(method, &|| readers.reader(), keys, mode, batch)
}

/// The JSON fields of a lookup figure.
pub fn lookup_figure(mode: Mode, threads: usize, addresses: &str, t: Timing) -> Value {
    lookup_fields(mode, threads, addresses, t, false)
}

/// Measures lookups of `keys` (dry run subtracted), each thread starting at its own
/// offset in the address list.
fn lookups<K: Key>(
    method: Method,
    reader: &(dyn Fn() -> LpmReader<K> + Sync),
    keys: &[K],
    mode: Mode,
    batch: usize,
) -> Timing {
    let chunks = keys.len().div_ceil(GUARD_SPAN);
    let start_of = |thread: usize| thread * chunks / method.threads.max(1);
    let real = measure(
        method,
        |thread| (reader(), vec![None; batch], start_of(thread)),
        |(r, out, first), _| run(r, keys, *first, mode, out, true),
    );
    let dry = measure(
        method,
        |thread| (reader(), vec![None; batch], start_of(thread)),
        |(r, out, first), _| run(r, keys, *first, mode, out, false),
    );
    real.minus(dry)
}

/// One pass over all keys starting at chunk `first`; with `real == false`, everything but
/// the lookups (the dry run).
#[inline(never)]
fn run<K: Key>(
    reader: &LpmReader<K>,
    keys: &[K],
    first: usize,
    mode: Mode,
    out: &mut [Option<u32>],
    real: bool,
) -> u64 {
    let mut acc = 0u32;
    // Dependent lookups: the previous answer, and the opaque zero it is masked with.
    let (mut answer, zero) = (0u32, black_box(0u32));
    let (head, tail) = keys.split_at((first * GUARD_SPAN).min(keys.len()));
    for chunk in tail.chunks(GUARD_SPAN).chain(head.chunks(GUARD_SPAN)) {
        let guard = reader.read().expect("the writer outlives the benchmark");
        let table: &fibre_lpm::TableSnapshot<K> = &guard;
        match (mode, real) {
            (Mode::Scalar, true) => {
                for &k in chunk {
                    acc = acc.wrapping_add(table.lookup(k).unwrap_or(0));
                }
            }
            (Mode::Scalar, false) => {
                for &k in chunk {
                    acc = acc.wrapping_add(black_box(k).to_u128() as u32);
                }
            }
            (Mode::Dependent, _) => {
                for &k in chunk {
                    let k = K::from_u128(k.to_u128() ^ u128::from(answer & zero));
                    answer = if real {
                        table.lookup(k).unwrap_or(0)
                    } else {
                        k.to_u128() as u32
                    };
                    acc = acc.wrapping_add(answer);
                }
            }
            (Mode::Batch, _) => {
                for sub in chunk.chunks(out.len()) {
                    let out = &mut out[..sub.len()];
                    if real {
                        table.lookup_batch(sub, out);
                    } else {
                        for (o, &k) in out.iter_mut().zip(black_box(sub)) {
                            *o = Some(k.to_u128() as u32);
                        }
                    }
                    for o in out.iter() {
                        acc = acc.wrapping_add(o.unwrap_or(0));
                    }
                }
            }
        }
    }
    black_box(acc);
    keys.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(per_op: f64, throughput: f64) -> Timing {
        Timing {
            per_op: Stat {
                mean: per_op,
                mean_dev: 0.5,
            },
            throughput: Stat {
                mean: throughput,
                mean_dev: 0.25,
            },
        }
    }

    #[test]
    fn figures_that_are_not_positive_are_null_with_a_note() {
        let f = lookup_figure(Mode::Scalar, 2, "matched", timing(12.5, 6.25));
        assert_eq!(f["ns_per_lookup"], 12.5);
        assert_eq!(f["throughput_ns"], 6.25);
        assert_eq!(f["lookups_per_sec"], 1.6e8);
        assert!(f.get("ns_per_lookup_note").is_none() && f.get("throughput_ns_note").is_none());
        for (per_op, throughput) in [(-0.3, 4.0), (0.0, -2.0), (f64::NAN, f64::INFINITY)] {
            let f = lookup_figure(Mode::Batch, 1, "matched", timing(per_op, throughput));
            assert!(f["ns_per_lookup"].is_null(), "{f}");
            assert_eq!(f["ns_per_lookup_note"], PER_LOOKUP_NOTE);
            if throughput > 0.0 && throughput.is_finite() {
                assert_eq!(f["throughput_ns"], throughput);
            } else {
                assert!(f["throughput_ns"].is_null() && f["lookups_per_sec"].is_null());
                assert_eq!(f["throughput_ns_note"], THROUGHPUT_NOTE);
            }
            let text = f.to_string();
            assert!(!text.contains("-0.3") && !text.contains("-2"), "{text}");
        }
        // Positive, but within its own mean deviation (0.5 and 0.25 here).
        let f = lookup_figure(Mode::Scalar, 1, "matched", timing(0.4, 0.3));
        assert!(f["ns_per_lookup"].is_null(), "{f}");
        assert_eq!(f["ns_per_lookup_note"], NOISE_NOTE);
        assert_eq!(f["throughput_ns"], 0.3);
    }
}
