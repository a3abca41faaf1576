//! The range engine (`RangeLpm`) beside the trie on the shipped tables: memory, build
//! time, and lookups, checked against the trie and timed in the same run.
//!
//! `cargo run --release -p fibre-bench --example range_engine`

mod experiment;

use experiment::Candidate;
use fibre_lpm::{Key, RangeLpm};
use std::time::Instant;

struct Engine<K: Key>(RangeLpm<K>);

impl<K: Key> Candidate for Engine<K> {
    type Key = K;
    fn lookup(&self, key: K) -> Option<u32> {
        self.0.lookup(key)
    }
    fn lookup_batch(&self, keys: &[K], out: &mut [Option<u32>]) {
        self.0.lookup_batch(keys, out)
    }
    fn describe(&self) -> String {
        let m = self.0.memory();
        format!(
            "{} leaves, {} nodes, {:.2} MiB lookup, {:.2} MiB update side",
            m.leaves,
            m.nodes,
            m.lookup_bytes as f64 / 1048576.0,
            m.update_bytes as f64 / 1048576.0
        )
    }
}

fn run<K: Key>(prefixes: &[fibre_lpm::Prefix<K>], table: &fibre_lpm::Lpm<K>, keys: &[K]) {
    experiment::announce(prefixes, table);
    let t = Instant::now();
    let engine = RangeLpm::build(prefixes.iter().enumerate().map(|(i, p)| (*p, i as u32)));
    println!("range engine built in {:.3} s", t.elapsed().as_secs_f64());
    let engine = Engine(engine);
    experiment::compare("range engine", &engine, table, keys, keys, 3);
    let few = keys[..2048].repeat(512);
    println!("2,048 distinct addresses:");
    experiment::compare("range engine", &engine, table, &few, &few, 2);
}

fn main() {
    let (prefixes, table, keys) = experiment::shipped_ipv6();
    run(&prefixes, &table, &keys);
    let (prefixes, table, keys) = experiment::shipped_ipv4();
    run(&prefixes, &table, &keys);
}
