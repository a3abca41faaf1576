//! Microbenchmarks of the lookup structures' hot paths (the trie and the range tree, each
//! on both families, in the fastest form this CPU runs), with criterion's statistics:
//! lookups (one key, and batches of 64) on the shipped full tables and on a one-route
//! table, and an insert and remove pair on a full table.
//!
//! `cargo bench -p fibre-bench --bench lookup` runs them. The figures the project reports
//! come from `fibre bench lookup` (repetitions, trimmed means, a dry run subtracted);
//! these are for comparing two builds of the structures' code on one machine.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fibre_bench::addresses::matched;
use fibre_lpm::{Key, Prefix, Structure, Table};
use fibre_routefile::{final_prefixes, read_route_file};
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

fn build<K: Key>(structure: Structure, prefixes: &[Prefix<K>]) -> Table<K> {
    Table::build_with(
        structure,
        prefixes.iter().enumerate().map(|(i, p)| (*p, i as u32)),
    )
}

fn lookups<K: Key>(c: &mut Criterion, structure: Structure, name: &str, prefixes: &[Prefix<K>]) {
    let table = build(structure, prefixes);
    let keys = matched(prefixes, 1 << 20, 1);
    let mut group = c.benchmark_group(format!(
        "{}/{}/ipv{}/{name}",
        table.structure(),
        table.form(),
        K::FAMILY
    ));
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

fn updates<K: Key>(c: &mut Criterion, structure: Structure, prefixes: &[Prefix<K>]) {
    let mut table = build(structure, prefixes);
    let mut rng = SmallRng::seed_from_u64(2);
    let name = format!("{}/ipv{}/full/remove_insert", structure, K::FAMILY);
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
    for structure in Structure::ALL {
        lookups(c, structure, "full", &v4);
        lookups(c, structure, "full", &v6);
        lookups(c, structure, "one-route", &v4[..1]);
        lookups(c, structure, "one-route", &v6[..1]);
        updates(c, structure, &v4);
        updates(c, structure, &v6);
    }
}

criterion_group!(engine, benches);
criterion_main!(engine);
