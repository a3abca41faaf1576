//! Microbenchmarks of both engines' hot paths (the trie and the range tree, each on both
//! families), with criterion's statistics: lookups (one key, and batches of 64) on the
//! shipped full tables and on a one-route table, and an insert and remove pair on a full
//! table.
//!
//! `cargo bench -p fibre-lpm` runs them. The figures the project reports come from
//! `fibre bench lookup` (the seeds' method, against the kernel and peers in the same run);
//! these are for comparing two builds of the engine's code on one machine.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fibre_bench::addresses::matched;
use fibre_bench::source::{final_prefixes, read_route_file};
use fibre_lpm::{Engine, Key, Lpm, Prefix, RangeLpm};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::path::PathBuf;

/// The prefixes of a shipped route file, both families.
fn shipped(name: &str) -> (Vec<Prefix<u32>>, Vec<Prefix<u128>>) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/ris-2026-05-11")
        .join(name);
    let routes = read_route_file(&path, false).unwrap_or_else(|e| panic!("{e}"));
    (final_prefixes(&routes.v4), final_prefixes(&routes.v6))
}

fn lookups<K: Key, E: Engine<K>>(c: &mut Criterion, name: &str, prefixes: &[Prefix<K>]) {
    let table = E::build(prefixes.iter().enumerate().map(|(i, p)| (*p, i as u32)));
    let keys = matched(prefixes, 1 << 20, 1);
    let mut group = c.benchmark_group(format!("{}/ipv{}/{name}", E::STRUCTURE, K::FAMILY));
    group.throughput(Throughput::Elements(1));
    let mut next = 0;
    group.bench_function("scalar", |b| {
        b.iter(|| {
            next = (next + 1) & (keys.len() - 1);
            black_box(table.lookup(keys[next]))
        })
    });
    group.throughput(Throughput::Elements(64));
    let mut out = [None; 64];
    let mut at = 0;
    group.bench_function("batch64", |b| {
        b.iter(|| {
            at = (at + 64) & (keys.len() - 1);
            table.lookup_batch(&keys[at..at + 64], &mut out);
            black_box(&out);
        })
    });
    group.finish();
}

fn updates<K: Key, E: Engine<K>>(c: &mut Criterion, prefixes: &[Prefix<K>]) {
    let mut table = E::build(prefixes.iter().enumerate().map(|(i, p)| (*p, i as u32)));
    let mut rng = SmallRng::seed_from_u64(2);
    let name = format!("{}/ipv{}/full/remove_insert", E::STRUCTURE, K::FAMILY);
    c.bench_function(&name, |b| {
        b.iter_batched(
            || prefixes[rng.gen_range(0..prefixes.len())],
            |p| {
                let v = table.remove(&p);
                table.insert(p, v.unwrap_or(0));
            },
            BatchSize::SmallInput,
        )
    });
}

fn benches(c: &mut Criterion) {
    let (v4, _) = shipped("rib-v4.txt.gz");
    let (_, v6) = shipped("rib-v6.txt.gz");
    lookups::<_, Lpm<u32>>(c, "full", &v4);
    lookups::<_, Lpm<u128>>(c, "full", &v6);
    lookups::<_, RangeLpm<u32>>(c, "full", &v4);
    lookups::<_, RangeLpm<u128>>(c, "full", &v6);
    lookups::<_, Lpm<u32>>(c, "one-route", &v4[..1]);
    lookups::<_, Lpm<u128>>(c, "one-route", &v6[..1]);
    lookups::<_, RangeLpm<u32>>(c, "one-route", &v4[..1]);
    lookups::<_, RangeLpm<u128>>(c, "one-route", &v6[..1]);
    updates::<_, Lpm<u32>>(c, &v4);
    updates::<_, Lpm<u128>>(c, &v6);
    updates::<_, RangeLpm<u32>>(c, &v4);
    updates::<_, RangeLpm<u128>>(c, &v6);
}

criterion_group!(engine, benches);
criterion_main!(engine);
