//! Both structures against the reference on the real full tables, with the real day of
//! BGP updates applied on top, their lookups in every form this CPU runs, and lock-free
//! readers checked while a writer applies that day.

use fibre_bench::addresses;
use fibre_bench::lookups::apply_updates;
use fibre_lpm::{shared, Form, Key, Prefix, ReferenceLpm, Structure, Table};
use fibre_routefile::{final_prefixes, read_route_file, RouteOp};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/ris-2026-05-11")
        .join(name)
}

fn reference_with_updates<K: Key>(
    rib: &[Prefix<K>],
    updates: &[(RouteOp, Prefix<K>)],
) -> ReferenceLpm<K> {
    let mut r = ReferenceLpm::new();
    for (i, p) in rib.iter().enumerate() {
        r.insert(*p, i as u32);
    }
    for (i, &(op, p)) in updates.iter().enumerate() {
        match op {
            RouteOp::Announce => r.insert(p, i as u32),
            RouteOp::Withdraw => r.remove(&p),
        };
    }
    r
}

fn full_table_with_a_day_of_updates<K: Key>(
    structure: Structure,
    rib: Vec<(RouteOp, Prefix<K>)>,
    updates: Vec<(RouteOp, Prefix<K>)>,
    expected_routes: usize,
) {
    let rib = final_prefixes(&rib);
    assert_eq!(rib.len(), expected_routes);
    let mut t = Table::build_with(
        structure,
        rib.iter().enumerate().map(|(i, p)| (*p, i as u32)),
    );
    assert_eq!(t.len(), rib.len());
    // Before the updates: every prefix is found exactly and answers its own addresses.
    let probes = addresses::matched(&rib, 200_000, 3);
    let mut batch = vec![None; probes.len()];
    let mut r0 = ReferenceLpm::new();
    for (i, p) in rib.iter().enumerate() {
        r0.insert(*p, i as u32);
    }
    t.lookup_batch(&probes, &mut batch);
    for (i, &k) in probes.iter().enumerate() {
        let want = r0.lookup(k).map(|x| x.1);
        assert_eq!(t.lookup(k), want);
        assert_eq!(batch[i], want);
    }
    // The day of updates, applied incrementally, equals the reference afterwards.
    apply_updates(&mut t, &updates);
    let r = reference_with_updates(&rib, &updates);
    assert_eq!(t.len(), r.len());
    assert_eq!(t.count_by_len(), r.count_by_len());
    let after = r.to_sorted_vec();
    assert_eq!(
        t.to_vec(),
        after,
        "the table holds exactly the reference's routes"
    );
    let after_prefixes: Vec<_> = after.iter().map(|x| x.0).collect();
    let mut probes = addresses::matched(&after_prefixes, 200_000, 4);
    probes.extend(updates.iter().map(|u| u.1.addr()).step_by(7));
    probes.extend(addresses::uniform::<K>(50_000, 5));
    let mut batch = vec![None; probes.len()];
    let forms: Vec<Form> = Form::ALL.into_iter().filter(|f| f.is_supported()).collect();
    for &form in &forms {
        t.set_form(form).unwrap();
        t.lookup_batch(&probes, &mut batch);
        for (i, &k) in probes.iter().enumerate() {
            let want = r.lookup(k).map(|x| x.1);
            assert_eq!(t.lookup(k), want, "{form}: lookup of {k:?}");
            assert_eq!(batch[i], want, "{form}: batched lookup of {k:?}");
        }
    }
    // A bulk build of the final state answers the same.
    let rebuilt = Table::build_with(structure, after);
    for &k in probes.iter().step_by(3) {
        assert_eq!(rebuilt.lookup(k), t.lookup(k));
    }
}

#[test]
fn ipv4_full_table_with_a_day_of_updates_matches_reference() {
    let rib = read_route_file(&data("rib-v4.txt.gz"), false).unwrap();
    let upd = read_route_file(&data("updates-v4.txt.gz"), false).unwrap();
    assert_eq!(upd.v4.len(), 1_393_421);
    for structure in Structure::ALL {
        full_table_with_a_day_of_updates(structure, rib.v4.clone(), upd.v4.clone(), 1_042_325);
    }
}

#[test]
fn ipv6_full_table_with_a_day_of_updates_matches_reference() {
    let rib = read_route_file(&data("rib-v6.txt.gz"), false).unwrap();
    let upd = read_route_file(&data("updates-v6.txt.gz"), false).unwrap();
    assert_eq!(upd.v6.len(), 1_238_235);
    for structure in Structure::ALL {
        full_table_with_a_day_of_updates(structure, rib.v6.clone(), upd.v6.clone(), 246_175);
    }
}

/// Readers look up a fixed set of probe addresses under one read guard while the writer
/// applies the real update stream, publishing every `EVERY` operations. A marker prefix
/// (outside the data) holds the version number, so each reader knows which version its
/// guard shows; its answers must equal the reference's at exactly that version, and the
/// versions it sees never go back. Bounded by operation counts, not by time.
fn readers_see_whole_published_versions<K: Key>(
    structure: Structure,
    rib: Vec<(RouteOp, Prefix<K>)>,
    updates: Vec<(RouteOp, Prefix<K>)>,
    marker: Prefix<K>,
) {
    const OPS: usize = 60_000;
    const EVERY: usize = 50;
    const PROBES: usize = 512;
    let rib = final_prefixes(&rib);
    let updates = &updates[..OPS.min(updates.len())];
    assert!(rib.iter().all(|p| !p.covers(&marker) && !marker.covers(p)));
    // Probes: addresses of prefixes the stream touches, so answers do change.
    let probes: Vec<K> = updates
        .iter()
        .step_by(updates.len() / PROBES)
        .map(|u| u.1.addr())
        .take(PROBES)
        .collect();
    // Expected answers per version, from the reference.
    let mut r = ReferenceLpm::new();
    for (i, p) in rib.iter().enumerate() {
        r.insert(*p, i as u32);
    }
    let answers = |r: &ReferenceLpm<K>| {
        probes
            .iter()
            .map(|&k| r.lookup(k).map(|x| x.1))
            .collect::<Vec<_>>()
    };
    let mut expected = vec![answers(&r)];
    for (v, batch) in updates.chunks(EVERY).enumerate() {
        for (j, &(op, p)) in batch.iter().enumerate() {
            let value = (v * EVERY + j) as u32;
            match op {
                RouteOp::Announce => r.insert(p, value),
                RouteOp::Withdraw => r.remove(&p),
            };
        }
        expected.push(answers(&r));
    }
    let mut table = Table::build_with(
        structure,
        rib.iter().enumerate().map(|(i, p)| (*p, i as u32)),
    );
    table.insert(marker, 0);
    let (mut writer, reader) = shared(table);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let r = reader.factory();
                let (done, expected, probes) = (&done, &expected, &probes);
                s.spawn(move || {
                    let reader = r.reader();
                    let mut out = vec![None; probes.len()];
                    let (mut last, mut checks, mut seen) =
                        (0, 0usize, std::collections::BTreeSet::new());
                    while !done.load(Ordering::Acquire) || checks < 50 {
                        let guard = reader.read().unwrap();
                        let version = guard.lookup(marker.addr()).unwrap() as usize;
                        guard.lookup_batch(probes, &mut out);
                        let scalar: Vec<_> = probes.iter().map(|&k| guard.lookup(k)).collect();
                        drop(guard);
                        assert!(version >= last, "versions never go back");
                        assert_eq!(
                            out, expected[version],
                            "batched answers at version {version}"
                        );
                        assert_eq!(scalar, expected[version], "answers at version {version}");
                        last = version;
                        seen.insert(version);
                        checks += 1;
                    }
                    (checks, seen.len())
                })
            })
            .collect();
        for (v, batch) in updates.chunks(EVERY).enumerate() {
            for (j, &(op, p)) in batch.iter().enumerate() {
                match op {
                    RouteOp::Announce => writer.insert(p, (v * EVERY + j) as u32),
                    RouteOp::Withdraw => writer.remove(p),
                };
            }
            writer.insert(marker, v as u32 + 1);
            writer.publish();
        }
        done.store(true, Ordering::Release);
        for r in readers {
            let (checks, versions) = r.join().unwrap();
            assert!(checks >= 50 && versions >= 1);
        }
    });
    // Afterwards the published table holds the final state, and with no reader holding
    // an old snapshot, every block released on the way has been reused or freed.
    writer.publish();
    assert_eq!(writer.retired_snapshots(), 0);
    let final_answers: Vec<_> = probes.iter().map(|&k| reader.lookup(k)).collect();
    assert_eq!(&final_answers, expected.last().unwrap());
}

#[test]
fn ipv4_readers_see_whole_versions_while_the_real_stream_is_applied() {
    let rib = read_route_file(&data("rib-v4.txt.gz"), false).unwrap();
    let upd = read_route_file(&data("updates-v4.txt.gz"), false).unwrap();
    let marker = "255.255.255.255/32".parse().unwrap();
    for structure in Structure::ALL {
        readers_see_whole_published_versions(structure, rib.v4.clone(), upd.v4.clone(), marker);
    }
}

#[test]
fn ipv6_readers_see_whole_versions_while_the_real_stream_is_applied() {
    let rib = read_route_file(&data("rib-v6.txt.gz"), false).unwrap();
    let upd = read_route_file(&data("updates-v6.txt.gz"), false).unwrap();
    let marker = "ff0e::1/128".parse().unwrap();
    for structure in Structure::ALL {
        readers_see_whole_published_versions(structure, rib.v6.clone(), upd.v6.clone(), marker);
    }
}
