//! What the engines' tests share: random prefixes that overlap, probe addresses at and
//! around every route's edges, and the randomized comparison with the reference, for any
//! engine.

use crate::engine::{Engine, Lookups};
use crate::key::Key;
use crate::prefix::Prefix;
use crate::reference::ReferenceLpm;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Random prefixes clustered around a few base addresses so that they overlap; /0,
/// host routes and /64s come often.
pub(crate) fn random_prefix<K: Key>(rng: &mut SmallRng, bases: &[u128]) -> Prefix<K> {
    let base = bases[rng.gen_range(0..bases.len())];
    let noise: u128 = rng.gen::<u128>() >> rng.gen_range(0..128);
    let addr = K::from_u128(base ^ noise);
    let len = match rng.gen_range(0..10) {
        0 => 0,
        1 => K::BITS,
        2 => 64.min(K::BITS),
        _ => rng.gen_range(0..=K::BITS),
    };
    Prefix::new_clamped(addr, len)
}

/// Addresses at and around the edges of every route, a random one inside each, random
/// ones, and the first and last address.
pub(crate) fn probes_for<K: Key>(routes: &[(Prefix<K>, u32)], rng: &mut SmallRng) -> Vec<K> {
    let mut probes = Vec::new();
    for (p, _) in routes {
        let span = if p.len() == K::BITS {
            0
        } else {
            u128::MAX >> (128 - u32::from(K::BITS) + u32::from(p.len()))
        };
        let a = p.addr().to_u128();
        probes.push(p.addr());
        probes.push(K::from_u128(a | span));
        probes.push(K::from_u128(a.wrapping_sub(1)));
        probes.push(K::from_u128((a | span).wrapping_add(1)));
        probes.push(K::from_u128(a | (rng.gen::<u128>() & span)));
    }
    probes.extend((0..64).map(|_| K::from_u128(rng.gen())));
    probes.push(K::from_u128(0));
    probes.push(K::from_u128(u128::MAX));
    probes
}

/// Every probe, scalar and batched, answers as the reference does.
pub(crate) fn check_against_reference<K: Key>(
    t: &impl Lookups<K>,
    r: &ReferenceLpm<K>,
    probes: &[K],
) {
    let mut batch = vec![None; probes.len()];
    t.lookup_batch(probes, &mut batch);
    for (i, &k) in probes.iter().enumerate() {
        let want = r.lookup(k).map(|x| x.1);
        assert_eq!(t.lookup(k), want, "lookup {k:?}");
        assert_eq!(batch[i], want, "batched lookup {k:?}");
    }
}

/// `ops` random inserts, replaces and removes around `bases` random base addresses,
/// checked against the reference every 16 operations with `check` run on the structure,
/// then the whole table and a bulk build of it.
pub(crate) fn random_ops_match_reference<K: Key, E: Engine<K>>(
    seed: u64,
    ops: usize,
    bases: usize,
    check: impl Fn(&E),
) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let bases: Vec<u128> = (0..bases).map(|_| rng.gen()).collect();
    let mut t = E::default();
    let mut r = ReferenceLpm::<K>::new();
    let mut live = Vec::new();
    for step in 0..ops {
        if rng.gen_bool(0.65) || live.is_empty() {
            let p = random_prefix::<K>(&mut rng, &bases);
            let v = rng.gen_range(0..1 << 20);
            assert_eq!(t.insert(p, v), r.insert(p, v), "insert {p}");
            live.push(p);
        } else {
            let p = live.swap_remove(rng.gen_range(0..live.len()));
            assert_eq!(t.remove(&p), r.remove(&p), "remove {p}");
        }
        if step % 16 == 0 {
            check(&t);
            let routes = r.to_sorted_vec();
            check_against_reference(&t, &r, &probes_for(&routes, &mut rng));
        }
    }
    check(&t);
    assert_eq!(t.to_vec(), r.to_sorted_vec());
    assert_eq!(t.len(), r.len());
    assert_eq!(t.count_by_len(), r.count_by_len());
    for (p, v) in r.to_sorted_vec() {
        assert_eq!(t.get(&p), Some(v));
    }
    let probes = probes_for(&r.to_sorted_vec(), &mut rng);
    check_against_reference(&t, &r, &probes);
    let built = E::build(r.to_sorted_vec());
    check(&built);
    check_against_reference(&built, &r, &probes);
}
