//! Where a lookup's time goes: memory or instructions.
//!
//! `cargo run --release -p fibre-bench --example lookup_profile [ROUTE_FILE...]` times
//! matched lookups in both structures (the trie and the range tree), in the fastest form
//! this CPU runs (`FORM=portable|avx2|avx512` forces one), for each family's table
//! (the shipped full tables by default) with four
//! working sets: all 2^20 addresses distinct, then 65,536, 2,048 and 128 distinct ones
//! repeated. With 128 everything the lookups read stays in the first-level cache, so that
//! column is what the instructions cost; the gap to the first column is what memory costs.
//! Best of 7 passes, ns per lookup, batched and scalar. `ONLY=4` or `ONLY=6` in the
//! environment times just that family's own structure (the IPv4 trie, the IPv6 range tree),
//! for comparing two builds run in turn: on a noisy machine, the best of several runs of
//! each is what compares.
//!
//! With `--count` it instead runs 65,536 matched lookups once each way through functions
//! that are never inlined, for an instruction counter, which gives the same figure on a
//! noisy machine every time:
//!
//! ```text
//! cargo build --release -p fibre-bench --example lookup_profile
//! FORM=avx2 valgrind --tool=callgrind target/release/examples/lookup_profile --count data/ris-2026-05-11/rib-v6.txt.gz
//! callgrind_annotate --inclusive=yes callgrind.out.* | grep '=> .*lookup_profile::'
//! ```
//!
//! valgrind does not know AVX-512, hence the AVX2 form; divide by 65,536. Compare counts
//! from this program only: the same lookup code compiled into another program can differ
//! by 10%.

use fibre_bench::addresses;
use fibre_bench::source::{final_prefixes, read_route_file};
use fibre_lpm::{Form, Key, Prefix, Structure, Table};
use std::path::PathBuf;
use std::time::Instant;

#[inline(never)]
fn batch<K: Key>(t: &Table<K>, keys: &[K], out: &mut [Option<u32>]) {
    t.lookup_batch(keys, out);
}

#[inline(never)]
fn scalar<K: Key>(t: &Table<K>, keys: &[K], out: &mut [Option<u32>]) {
    for (k, o) in keys.iter().zip(out.iter_mut()) {
        *o = t.lookup(*k);
    }
}

/// Best ns per lookup of 7 passes over `keys`.
fn best_of<K: Key>(t: &Table<K>, keys: &[K], f: fn(&Table<K>, &[K], &mut [Option<u32>])) -> f64 {
    let mut out = vec![None; keys.len()];
    (0..7)
        .map(|_| {
            let start = Instant::now();
            f(t, keys, &mut out);
            std::hint::black_box(&out);
            start.elapsed().as_secs_f64() * 1e9 / keys.len() as f64
        })
        .fold(f64::MAX, f64::min)
}

fn profile<K: Key>(structure: Structure, form: Form, prefixes: &[Prefix<K>], count_only: bool) {
    if prefixes.is_empty() {
        return;
    }
    let mut t = Table::build_with(
        structure,
        prefixes.iter().enumerate().map(|(i, p)| (*p, i as u32)),
    );
    t.set_form(form).expect("checked in main");
    if count_only {
        let keys = addresses::matched(prefixes, 1 << 16, 1);
        let (mut a, mut b) = (vec![None; keys.len()], vec![None; keys.len()]);
        batch(&t, &keys, &mut a);
        scalar(&t, &keys, &mut b);
        assert_eq!(a, b, "batched and scalar lookups agree");
        return;
    }
    let all = addresses::matched(prefixes, 1 << 20, 1);
    print!(
        "IPv{} {:>9} routes, {:>10} ({}):",
        K::FAMILY,
        prefixes.len(),
        structure,
        form
    );
    for distinct in [1 << 20, 1 << 16, 1 << 11, 1 << 7] {
        let keys: Vec<K> = (0..all.len()).map(|i| all[i % distinct]).collect();
        print!(
            " | {distinct:>7} distinct: batch {:6.2} scalar {:6.2}",
            best_of(&t, &keys, batch),
            best_of(&t, &keys, scalar)
        );
    }
    println!();
}

fn main() {
    let mut count_only = false;
    let mut files: Vec<PathBuf> = Vec::new();
    for arg in std::env::args().skip(1) {
        if arg == "--count" {
            count_only = true;
        } else {
            files.push(arg.into());
        }
    }
    if files.is_empty() {
        let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/ris-2026-05-11");
        files = vec![data.join("rib-v4.txt.gz"), data.join("rib-v6.txt.gz")];
    }
    let only = std::env::var("ONLY").unwrap_or_default();
    if !["", "4", "6"].contains(&only.as_str()) {
        eprintln!("ONLY={only}: expected 4 or 6");
        std::process::exit(2);
    }
    let form = match std::env::var("FORM").map(|f| f.parse::<Form>()) {
        Err(_) => Form::best(),
        Ok(Ok(f)) if f.is_supported() => f,
        Ok(Ok(f)) => {
            eprintln!("FORM={f}: {}", fibre_lpm::UnsupportedForm(f));
            std::process::exit(2);
        }
        Ok(Err(e)) => {
            eprintln!("FORM: {e}");
            std::process::exit(2);
        }
    };
    for f in &files {
        let routes = read_route_file(f, false).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1)
        });
        let (v4, v6) = (final_prefixes(&routes.v4), final_prefixes(&routes.v6));
        if only.is_empty() || only == "4" {
            profile(Structure::Trie, form, &v4, count_only);
        }
        if only.is_empty() {
            profile(Structure::RangeTree, form, &v4, count_only);
            profile(Structure::Trie, form, &v6, count_only);
        }
        if only.is_empty() || only == "6" {
            profile(Structure::RangeTree, form, &v6, count_only);
        }
    }
}
