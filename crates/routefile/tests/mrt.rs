//! MRT reading checked against `bgpdump`'s decodings of the same files (shipped beside
//! them in data/mrt), including a dump cut in the middle of a record.

use fibre_routefile::{open_maybe_gz, read_mrt, read_route_file, AnyPrefix, MrtRoute, RouteOp};
use std::io::BufRead;
use std::net::IpAddr;
use std::path::PathBuf;

fn mrt(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/mrt")
        .join(name)
}

fn routes_of(name: &str) -> (Vec<MrtRoute>, Option<String>) {
    let path = mrt(name);
    let mut routes = Vec::new();
    let summary = read_mrt(open_maybe_gz(&path).unwrap(), &path, |r| routes.push(r)).unwrap();
    assert_eq!(summary.routes, routes.len());
    (routes, summary.broken.map(|e| e.to_string()))
}

/// (peer, prefix, next hop) of each `B` line of `bgpdump -m` output; the next hop is
/// column `next_hop_field` (8, or 9 when ADD-PATH's path id follows the prefix).
fn bgpdump(name: &str, next_hop_field: usize) -> Vec<(IpAddr, AnyPrefix, Option<IpAddr>)> {
    open_maybe_gz(&mrt(name))
        .unwrap()
        .lines()
        .map(|l| l.unwrap())
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            assert_eq!(f[2], "B", "{l}");
            // bgpdump's placeholders for "no next hop" (a locally originated route).
            let next_hop = match f[next_hop_field] {
                "255.255.255.255" | "::" => None,
                nh => Some(nh.parse().unwrap()),
            };
            (f[3].parse().unwrap(), f[5].parse().unwrap(), next_hop)
        })
        .collect()
}

fn as_tuples(routes: &[MrtRoute]) -> Vec<(IpAddr, AnyPrefix, Option<IpAddr>)> {
    routes
        .iter()
        .map(|r| {
            assert_eq!(r.op, RouteOp::Announce);
            (r.peer, r.prefix, r.next_hop)
        })
        .collect()
}

#[test]
fn table_dump_v2_rib_matches_bgpdump_entry_for_entry() {
    let (routes, broken) = routes_of("rib.20140523.0600_first9073records.bz2");
    assert_eq!(broken, None, "the dump is cut at a record boundary");
    let expected = bgpdump("rib.20140523.0600_first9073records.bgpdump-m.txt.gz", 8);
    assert_eq!(expected.len(), 270_005);
    assert_eq!(as_tuples(&routes), expected);
}

#[test]
fn a_dump_cut_mid_record_keeps_what_came_before_and_says_where() {
    let (whole, _) = routes_of("rib.20140523.0600_first9073records.bz2");
    let (cut, broken) = routes_of("rib.20140523.0600_truncated-mid-record.bz2");
    let broken = broken.expect("the truncation is reported");
    assert!(
        broken
            .contains("rib.20140523.0600_truncated-mid-record.bz2: MRT data breaks off near byte"),
        "{broken}"
    );
    assert!(
        broken.contains(&format!("after {} routes", cut.len())),
        "{broken}"
    );
    assert!(
        cut.len() > 10_000,
        "a megabyte of dump holds many entries: {}",
        cut.len()
    );
    assert_eq!(
        cut[..],
        whole[..cut.len()],
        "the entries before the break are the dump's own"
    );
    // Through the route-file reader, as `--routes` uses it.
    let file = read_route_file(&mrt("rib.20140523.0600_truncated-mid-record.bz2"), false).unwrap();
    assert_eq!(file.v4.len() + file.v6.len(), cut.len());
    assert!(file.broken.is_some());
}

#[test]
fn add_path_ribs_match_bgpdump() {
    for family in ["ipv4", "ipv6"] {
        let (routes, broken) = routes_of(&format!("test_data_bview.{family}_unicast_add_path.gz"));
        assert_eq!(broken, None);
        let expected = bgpdump(
            &format!("test_expect_bview.{family}_unicast_add_path.gz.bgp.gz"),
            9,
        );
        assert_eq!(as_tuples(&routes), expected, "{family}");
    }
}

#[test]
fn bgp4mp_updates_give_announcements_and_withdrawals_of_both_families() {
    let file = read_route_file(&mrt("bgp4mp-et-2024-09-14.bz2"), false).unwrap();
    assert!(file.broken.is_none());
    for ops in [
        file.v4.iter().map(|x| x.0).collect::<Vec<_>>(),
        file.v6.iter().map(|x| x.0).collect(),
    ] {
        assert!(ops.contains(&RouteOp::Announce), "{ops:?}");
    }
    assert!(
        file.v4.iter().chain([]).any(|x| x.0 == RouteOp::Withdraw)
            || file.v6.iter().any(|x| x.0 == RouteOp::Withdraw)
    );
}

#[test]
fn lab_dumps_of_every_kind_read_whole() {
    let mut seen = 0;
    for entry in std::fs::read_dir(mrt("")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("mrtparse-") {
            continue;
        }
        let file = read_route_file(&path, false).unwrap_or_else(|e| panic!("{e}"));
        assert!(file.broken.is_none(), "{name}: {:?}", file.broken);
        if name.contains("rib_table-v2") {
            // RIB_GENERIC records, which the decoder does not support, are skipped and
            // reported, and the records around them read.
            assert!(file.skipped > 0, "{name}");
            assert!(
                file.skipped_examples[0]
                    .reason
                    .contains("not currently supported"),
                "{:?}",
                file.skipped_examples
            );
        }
        if name.contains("rib_table-mp") {
            // OpenBGPD's table-mp dump is made of BGP4MP_ENTRY records (subtype 2, long
            // obsolete), which the decoder does not read: every one is skipped and named.
            assert!(file.v4.is_empty() && file.v6.is_empty());
            assert!(file.skipped > 0);
            assert!(
                file.skipped_examples[0]
                    .reason
                    .contains("bgp4mp subtype: 2"),
                "{:?}",
                file.skipped_examples
            );
        } else {
            assert!(
                !file.v4.is_empty() || !file.v6.is_empty(),
                "{name} gave no routes"
            );
        }
        seen += 1;
    }
    assert_eq!(seen, 10, "every lab dump shipped in data/mrt");
}
