//! What safe code outside the crate can do to readers, tried through the public API only:
//! publish several times, keep one version on another thread, let go of an older one
//! there meanwhile (so that what that one held is reused while the other is read), keep
//! changing and publishing (so that the writer copies, releases and reuses memory), and
//! check that the version held never changes under its reader. Both structures, every
//! form this CPU runs.
//!
//! (The other half, publishing or reclaiming by hand, does not compile: see the
//! `compile_fail` example in the documentation of `fibre_lpm::shared`.)

use fibre_lpm::{shared, Form, Prefix, Structure, Table};
use std::sync::atomic::{AtomicBool, Ordering};

fn prefix(i: u32) -> Prefix<u128> {
    // Clustered /48s and /64s under two /32s, so updates share blocks and copy them.
    let base: u128 = if i.is_multiple_of(2) {
        0x2001_0db8
    } else {
        0x2001_0db9
    } << 96;
    if i.is_multiple_of(3) {
        Prefix::new_clamped(base | u128::from(i) << 64, 64)
    } else {
        Prefix::new_clamped(base | u128::from(i) << 80, 48)
    }
}

fn held_version_never_changes(structure: Structure, form: Form) {
    let mut table = Table::with_structure(structure);
    table.set_form(form).expect("a form this CPU runs");
    for i in 0..2000 {
        table.insert(prefix(i), i);
    }
    let (mut writer, reader) = shared(table);
    let keys: Vec<u128> = (0..3000).map(|i| prefix(i).addr() | 0x1234).collect();
    // Versions 1 to 3, each changing routes; the reader holds 2 and 3.
    let mut older = None;
    for version in 1..=3u32 {
        for i in (version..3000).step_by(5) {
            writer.insert(prefix(i), i + version * 100_000);
        }
        writer.publish();
        if version == 2 {
            older = Some(reader.read().expect("the writer is alive"));
        }
    }
    let older = older.expect("version 2 is held");
    let held = reader.read().expect("the writer is alive");
    let mut expected = vec![None; keys.len()];
    held.lookup_batch(&keys, &mut expected);
    assert!(expected.iter().filter(|v| v.is_some()).count() >= 2000);
    let publishes_after = 40u32;
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let checker = s.spawn(|| {
            let mut older = Some(older);
            let mut out = vec![None; keys.len()];
            let mut rounds = 0;
            while !done.load(Ordering::Acquire) || rounds < 3 {
                held.lookup_batch(&keys, &mut out);
                assert_eq!(
                    out, expected,
                    "{structure}, {form}: the held version changed"
                );
                for (&k, &want) in keys.iter().zip(&expected).step_by(17) {
                    assert_eq!(held.lookup(k), want);
                }
                rounds += 1;
                if rounds == 2 {
                    // Let go of version 2 while version 3 is still read: what was
                    // released on the way to 3 may now be reused, and will be, under
                    // this reader's feet, at the writer's next publish.
                    older = None;
                }
            }
            drop(older);
        });
        for round in 0..publishes_after {
            for i in 0..3000 {
                if (i + round) % 3 == 0 {
                    writer.remove(prefix(i));
                } else {
                    writer.insert(prefix(i), i + round * 10_000);
                }
            }
            writer.publish();
        }
        done.store(true, Ordering::Release);
        checker.join().expect("the checking thread");
    });
    // Versions 3 to 42 were replaced; 3, still held, keeps itself and every later one
    // waiting, while versions 0 to 2 were reclaimed (2 once the checker let go of it).
    writer.publish();
    assert_eq!(
        writer.retired_snapshots(),
        publishes_after as usize,
        "versions 3 onwards wait for their readers, the older ones were reclaimed"
    );
    drop(held);
    writer.publish();
    assert_eq!(writer.retired_snapshots(), 0, "and they go once let go of");
    let now = reader.read().expect("the writer is alive");
    for (i, &k) in keys.iter().enumerate().step_by(7) {
        assert_eq!(now.lookup(k), writer.table().lookup(k), "key {i}");
    }
}

#[test]
fn a_version_held_on_another_thread_never_changes() {
    for structure in Structure::ALL {
        for form in Form::ALL.into_iter().filter(|f| f.is_supported()) {
            held_version_never_changes(structure, form);
        }
    }
}
