//! The mirror of the ruleset against the real kernel, as root: a network namespace, a
//! ruleset loaded with `nft -f`, the dump compared with what `nft -j -a list ruleset`
//! lists, then changes made with `nft` one commit at a time, each applied from its
//! notifications and compared with a fresh dump; and the gate on the kernel's own
//! ruleset.

use fibre_firewall::gate::{closed, quiet, refusals, Families, Legacy};
use fibre_firewall::message::Message;
use fibre_firewall::nfnetlink::{dump, Batch, Events};
use fibre_firewall::Ruleset;
use fibre_testbed::netns::Namespace;
use serde_json::Value;

/// Runs `nft` in `ns` with `args`, `stdin` fed to it; what it printed.
fn nft(ns: &Namespace, args: &[&str], stdin: &str) -> String {
    ns.nft(args, stdin)
        .expect("nft runs (the nftables package)")
}

/// Each chain's rule handles in order, and each base chain's hook and policy, as `nft
/// -j -a` lists them: (family, table, chain) -> (hook, policy, handles).
type Listing = std::collections::BTreeMap<
    (String, String, String),
    (Option<String>, Option<String>, Vec<u64>),
>;

fn listed_by_nft(ns: &Namespace) -> Listing {
    listing(&serde_json::from_str(&nft(ns, &["-j", "-a", "list", "ruleset"], "")).unwrap())
}

fn listed_by_fibre(r: &Ruleset) -> Listing {
    listing(&r.to_json())
}

/// The listing of a ruleset shaped as `nft -j` shapes it (fibre's `to_json` is).
fn listing(v: &Value) -> Listing {
    let mut out = Listing::new();
    for item in v["nftables"].as_array().unwrap() {
        let s = |o: &Value, k: &str| o[k].as_str().unwrap_or_default().to_string();
        if let Some(c) = item.get("chain") {
            out.insert(
                (s(c, "family"), s(c, "table"), s(c, "name")),
                (
                    c["hook"].as_str().map(str::to_string),
                    c["policy"].as_str().map(str::to_string),
                    vec![],
                ),
            );
        }
        if let Some(r) = item.get("rule") {
            out.get_mut(&(s(r, "family"), s(r, "table"), s(r, "chain")))
                .unwrap()
                .2
                .push(r["handle"].as_u64().unwrap());
        }
    }
    out
}

/// Applies what `events` has up to the end of the next committed batch.
fn apply_next_commit(events: &mut Events, mirror: &mut Ruleset) {
    loop {
        match events.receive().unwrap() {
            Batch::Messages(messages, bad) => {
                assert_eq!(bad, 0, "malformed notifications");
                let end = matches!(messages.last(), Some((Message::NewGen(_), _)));
                for (m, flags) in messages {
                    mirror.apply(m, flags);
                }
                if end {
                    return;
                }
            }
            Batch::Overflow => panic!("the notifications overflowed"),
        }
    }
}

/// Each set's elements, in order of their bytes (a dump and the notifications need not
/// give them in one order): (family, table, set) -> elements.
fn elements_of(r: &Ruleset) -> std::collections::BTreeMap<(String, String, String), Vec<String>> {
    r.tables()
        .flat_map(|t| t.sets.values())
        .map(|s| {
            let mut e: Vec<String> = s.elements.iter().map(|e| format!("{e:?}")).collect();
            e.sort();
            ((s.family.name(), s.table.clone(), s.name.clone()), e)
        })
        .collect()
}

const RULESET: &str = r#"
table inet fw {
  set blocked { type ipv4_addr; flags interval; elements = { 192.0.2.0/24 } }
  chain filter_forward { type filter hook forward priority 0; policy accept;
    ip daddr 10.2.0.2 icmp type echo-request drop
    ip saddr @blocked log drop comment "no documentation addresses"
    jump sub
  }
  chain sub { tcp dport 22 accept; }
  chain nat_postrouting { type nat hook postrouting priority 100; oifname "rb" masquerade; }
  chain input { type filter hook input priority 0; policy drop; iifname "lo" accept; }
}
table ip6 quiet { chain pass { type filter hook forward priority 0; policy accept; }; }
"#;

#[test]
#[ignore = "needs root: a network namespace and nft"]
fn the_mirror_follows_the_kernels_ruleset_commit_by_commit() {
    let ns = Namespace::create("fw-mirror").unwrap();
    ns.ip(&["link", "add", "v0", "type", "veth", "peer", "name", "v1"])
        .unwrap();
    ns.enter().unwrap();
    let mut events = Events::subscribe().unwrap();
    nft(&ns, &["-f", "-"], RULESET);
    let d = dump().unwrap();
    assert_eq!(d.malformed, 0);
    assert!(d.unavailable.is_none());
    let mut mirror = d.ruleset;
    assert_eq!(listed_by_fibre(&mirror), listed_by_nft(&ns));
    assert_eq!(mirror.counts(), (2, 5, 6));
    // The interval 192.0.2.0/24: its start, its end flagged, and the end `nft` puts at
    // the first key (nothing below the first interval).
    let blocked = &elements_of(&mirror)[&("inet".into(), "fw".into(), "blocked".into())];
    assert_eq!(blocked.len(), 3, "{blocked:?}");
    // The ruleset's own load, already in the dump, queued as notifications too: applying
    // them again changes nothing.
    apply_next_commit(&mut events, &mut mirror);
    assert_eq!(listed_by_fibre(&mirror), listed_by_nft(&ns));

    let first = listed_by_nft(&ns)[&("inet".into(), "fw".into(), "filter_forward".into())]
        .2
        .clone();
    let changes: Vec<Vec<String>> = vec![
        vec!["add rule inet fw filter_forward udp dport 53 accept".into()],
        vec!["insert rule inet fw filter_forward udp dport 54 accept".into()],
        vec![format!(
            "add rule inet fw filter_forward position {} udp dport 55 accept",
            first[0]
        )],
        vec![format!(
            "insert rule inet fw filter_forward position {} udp dport 56 accept",
            first[1]
        )],
        vec![format!(
            "replace rule inet fw filter_forward handle {} ip daddr 10.2.0.3 drop",
            first[0]
        )],
        vec![format!(
            "delete rule inet fw filter_forward handle {}",
            first[1]
        )],
        vec![
            "add chain inet fw extra".into(),
            "add rule inet fw extra counter".into(),
        ],
        vec!["flush chain inet fw sub".into()],
        vec!["delete chain inet fw extra".into()],
        vec![
            "add table ip t2".into(),
            "add chain ip t2 c { type filter hook prerouting priority -150; }".into(),
            "add rule ip t2 c meta mark set 1".into(),
        ],
        vec!["add set inet fw s2 { type ipv4_addr; }".into()],
        vec!["add element inet fw blocked { 198.51.100.0/24, 203.0.113.7 }".into()],
        vec!["delete element inet fw blocked { 192.0.2.0/24 }".into()],
        vec![
            "add map inet fw ports { type inet_service : verdict; elements = { 22 : accept, 23 : jump sub } }".into(),
            "add rule inet fw filter_forward tcp dport vmap @ports".into(),
            "add rule inet fw filter_forward ip saddr . tcp dport { 10.0.0.0/8 . 1000-2000 } drop".into(),
        ],
        vec!["add element inet fw ports { 24 : drop }".into()],
        vec!["flush set inet fw blocked".into()],
        vec!["add counter inet fw pkts".into()],
        vec![
            "delete counter inet fw pkts".into(),
            "delete set inet fw s2".into(),
        ],
        vec![
            "add table netdev nd".into(),
            "add chain netdev nd in { type filter hook ingress device v0 priority 0; }".into(),
            "add rule netdev nd in counter".into(),
        ],
        vec!["delete table netdev nd".into()],
        vec!["delete table inet fw".into()],
    ];
    for change in changes {
        nft(&ns, &["-f", "-"], &change.join("\n"));
        apply_next_commit(&mut events, &mut mirror);
        assert_eq!(
            listed_by_fibre(&mirror),
            listed_by_nft(&ns),
            "after {change:?}"
        );
        let fresh = dump().unwrap().ruleset;
        assert_eq!(mirror.to_json(), fresh.to_json(), "after {change:?}");
        assert_eq!(
            elements_of(&mirror),
            elements_of(&fresh),
            "after {change:?}"
        );
        // A range of concatenations keeps its last key (`NFTA_SET_ELEM_KEY_END`).
        if change.iter().any(|c| c.contains("1000-2000")) {
            let ends = mirror
                .tables()
                .flat_map(|t| t.sets.values())
                .flat_map(|s| &s.elements)
                .filter(|e| e.key_end.is_some())
                .count();
            assert_eq!(ends, 1, "after {change:?}");
        }
        assert_eq!(mirror.orphans, 0);
    }
}

#[test]
#[ignore = "needs root: a network namespace and nft"]
fn the_kernels_ruleset_closes_what_fibre_may_not_bypass() {
    let ns = Namespace::create("fw-gate").unwrap();
    ns.enter().unwrap();
    let links = ["ra".to_string(), "rb".to_string()];
    // No ruleset: nothing closed.
    let r = dump().unwrap().ruleset;
    assert_eq!(
        closed(&refusals(&r, &links, &Legacy::default())),
        Families::NONE
    );
    nft(&ns, &["-f", "-"], RULESET);
    let r = dump().unwrap().ruleset;
    let got = refusals(&r, &links, &Legacy::default());
    assert_eq!(closed(&got), Families::BOTH);
    // The forward chain's rule that logs (fibre evaluates the others, and the nat
    // chain's masquerade); not the input chain's, nor the empty ip6 chain.
    let at: Vec<(String, Option<u64>)> = got
        .iter()
        .map(|g| (g.chain.clone().unwrap_or_default(), g.handle))
        .collect();
    assert_eq!(
        at.iter().filter(|(c, _)| c == "filter_forward").count(),
        1,
        "{at:?}"
    );
    assert_eq!(
        at.iter().filter(|(c, _)| c == "nat_postrouting").count(),
        0,
        "{at:?}"
    );
    assert!(
        at.iter().all(|(c, _)| c != "input" && c != "pass"),
        "{at:?}"
    );
    let comment = got
        .iter()
        .find(|g| g.rule.contains("no documentation addresses"))
        .expect("the comment names the rule");
    assert!(comment.rule.contains("[ lookup"), "{}", comment.rule);
    assert!(comment.why.contains("`log`"), "{}", comment.why);
    // Made dormant, the table's chains meet nothing, and its nat chain (which fibre
    // follows) closes nothing; a connection's mark set in it (which fibre does not
    // follow) still has the kernel track connections its way: both close.
    nft(&ns, &["add table inet fw { flags dormant; }"], "");
    let r = dump().unwrap().ruleset;
    assert_eq!(
        closed(&refusals(&r, &links, &Legacy::default())),
        Families::NONE
    );
    nft(
        &ns,
        &["-f", "-"],
        "add chain inet fw marks\nadd rule inet fw marks ct mark set 1\n",
    );
    let r = dump().unwrap().ruleset;
    let got = refusals(&r, &links, &Legacy::default());
    assert_eq!(closed(&got), Families::BOTH);
    assert!(
        got.iter().all(|g| g.chain.as_deref() == Some("marks")),
        "{got:?}"
    );
    // Without it, the dormant table closes nothing.
    nft(
        &ns,
        &["-f", "-"],
        "flush chain inet fw marks\ndelete chain inet fw marks\n",
    );
    let r = dump().unwrap().ruleset;
    assert_eq!(
        closed(&refusals(&r, &links, &Legacy::default())),
        Families::NONE
    );
    // An output chain with a rule closes fibre's ICMP errors of its family only.
    nft(
        &ns,
        &["-f", "-"],
        "table ip out { chain o { type filter hook output priority 0; ip daddr 192.0.2.1 drop; }; }",
    );
    let r = dump().unwrap().ruleset;
    let got = refusals(&r, &links, &Legacy::default());
    assert_eq!(closed(&got), Families::NONE);
    assert_eq!(
        quiet(&got),
        Families {
            v4: true,
            v6: false
        }
    );
}
