//! Fuzzes both structures: bytes become inserts, removes (one at a time and in batches),
//! lookups and publishes on both families and both structures (trie and range tree, in
//! the fastest form this CPU runs), through the shared writer, each checked against the
//! reference. Published snapshots are held while later updates copy around them, and
//! must still answer as the reference did when they were published; the whole table is
//! compared at the end.
#![no_main]

use fibre_lpm::{shared, Key, Prefix, ReadGuard, ReferenceLpm, Structure, Table};
use libfuzzer_sys::fuzz_target;

/// A held snapshot and the reference as it was when the snapshot was published.
type Held<K> = (ReadGuard<K>, ReferenceLpm<K>);

fn check<K: Key>(guard: &ReadGuard<K>, r: &ReferenceLpm<K>, keys: &[K]) {
    let mut out = vec![None; keys.len()];
    guard.lookup_batch(keys, &mut out);
    for (i, &k) in keys.iter().enumerate() {
        let want = r.lookup(k).map(|x| x.1);
        assert_eq!(out[i], want, "batched lookup in a held snapshot");
        assert_eq!(guard.lookup(k), want, "lookup in a held snapshot");
    }
}

fn run<K: Key>(structure: Structure, data: &[u8], key_bytes: usize) {
    let (mut w, reader) = shared(Table::<K>::with_structure(structure));
    let mut r = ReferenceLpm::<K>::new();
    let mut keys = Vec::new();
    let mut held: Vec<Held<K>> = Vec::new();
    for op in data.chunks(key_bytes + 2) {
        if op.len() < key_bytes + 2 {
            break;
        }
        let mut k = 0u128;
        for &b in &op[2..] {
            k = k << 8 | u128::from(b);
        }
        // Reuse earlier keys often, so prefixes overlap and removals hit.
        let key = if op[0] & 0x80 != 0 && !keys.is_empty() {
            keys[usize::from(op[1]) % keys.len()]
        } else {
            K::from_u128(k)
        };
        keys.push(key);
        let len = op[1] % (K::BITS + 1);
        let p = Prefix::new_clamped(key, len);
        match op[0] % 5 {
            0 | 1 => assert_eq!(w.insert(p, u32::from(op[0])), r.insert(p, u32::from(op[0]))),
            // A batch: prefixes of the last few keys, of lengths from this one on (nested,
            // short and long ones together).
            2 if op[0] & 0x40 != 0 => {
                let batch: Vec<Prefix<K>> = keys
                    .iter()
                    .rev()
                    .take(usize::from(op[1] % 32) + 1)
                    .enumerate()
                    .map(|(i, &k)| {
                        let len = (usize::from(len) + 7 * i) % (usize::from(K::BITS) + 1);
                        Prefix::new_clamped(k, len as u8)
                    })
                    .collect();
                let mut named = batch.clone();
                named.sort_unstable();
                named.dedup();
                let held = named.iter().filter(|p| r.remove(p).is_some()).count();
                assert_eq!(w.remove_many(&batch), held, "a batch of removals");
            }
            2 => assert_eq!(w.remove(p), r.remove(&p)),
            3 => assert_eq!(w.table().lookup(key), r.lookup(key).map(|x| x.1)),
            _ => {
                w.publish();
                if held.len() == 4 {
                    held.remove(usize::from(op[1]) % 4);
                }
                held.push((reader.read().expect("the writer is alive"), r.clone()));
            }
        }
    }
    for (guard, reference) in &held {
        check(guard, reference, &keys);
    }
    drop(held);
    w.publish();
    check(&reader.read().expect("the writer is alive"), &r, &keys);
    assert_eq!(
        w.retired_snapshots(),
        0,
        "nothing held, everything reclaimed"
    );
    assert_eq!(w.table().to_vec(), r.to_sorted_vec());
}

fuzz_target!(|data: &[u8]| {
    if let Some((&family, rest)) = data.split_first() {
        match family & 3 {
            0 => run::<u32>(Structure::Trie, rest, 4),
            1 => run::<u128>(Structure::Trie, rest, 16),
            2 => run::<u32>(Structure::RangeTree, rest, 4),
            _ => run::<u128>(Structure::RangeTree, rest, 16),
        }
    }
});
