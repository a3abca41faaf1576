//! Fuzzes the engine: bytes become inserts, removes and lookups on both families, each
//! checked against the reference; the whole table is compared at the end.
#![no_main]

use fibre_lpm::{Key, Lpm, Prefix, ReferenceLpm};
use libfuzzer_sys::fuzz_target;

fn run<K: Key>(data: &[u8], key_bytes: usize) {
    let mut t = Lpm::<K>::new();
    let mut r = ReferenceLpm::<K>::new();
    let mut keys = Vec::new();
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
        match op[0] % 4 {
            0 | 1 => assert_eq!(t.insert(p, u32::from(op[0])), r.insert(p, u32::from(op[0]))),
            2 => assert_eq!(t.remove(&p), r.remove(&p)),
            _ => assert_eq!(t.lookup(key), r.lookup(key).map(|x| x.1)),
        }
    }
    let mut out = vec![None; keys.len()];
    t.lookup_batch(&keys, &mut out);
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(out[i], r.lookup(k).map(|x| x.1));
    }
    assert_eq!(t.to_vec(), r.to_sorted_vec());
}

fuzz_target!(|data: &[u8]| {
    if let Some((&family, rest)) = data.split_first() {
        if family & 1 == 0 {
            run::<u32>(rest, 4);
        } else {
            run::<u128>(rest, 16);
        }
    }
});
