//! What of the router's firewall fibre may not bypass. fibre evaluates the filter and
//! `nat` chains of the forwarding path ([`Filter`](crate::Filter)), tracks connections
//! where the ruleset has the kernel track them, and translates them as their `nat` chains
//! bind them; forwarding around anything else would let pass what the kernel drops and send
//! what the kernel changes. So every part of the ruleset that forwarded packets meet and
//! fibre does not evaluate, or that changes how the kernel handles them, closes the IP
//! families it applies to, and the daemon refuses to forward those families, naming
//! each such part:
//!
//! - a base chain of family `ip`, `ip6` or `inet` at prerouting, forward or postrouting
//!   that does not compile: each rule that does not compile (in it or a chain it
//!   reaches), named with what fibre lacks; `inet` ingress on a forwarded link: each of
//!   its rules, its policy if it drops;
//! - a filter chain at postrouting that fibre evaluates: the ICMP errors fibre sends of
//!   its families (which meet it, unevaluated);
//! - a base chain of family `netdev` on a forwarded link (ingress or egress): the same;
//! - anywhere in `ip`, `ip6` or `inet`, a rule with an expression that makes the kernel
//!   track connections in a way fibre does not follow (`ct ... set`, `notrack`,
//!   `connlimit`, `synproxy`, `flow_offload`, `objref`, `tproxy`, `socket`); a `ct` load
//!   fibre evaluates, and NAT in a `nat` chain, only have fibre track the family's
//!   forwarded packets too ([`tracked`]);
//! - a table of iptables-legacy (`/proc/net/ip_tables_names`,
//!   `/proc/net/ip6_tables_names`), whose rules nf_tables' netlink does not show.
//!
//! A dormant table is off, and closes nothing; a base chain with no rules and policy
//! accept changes nothing, and closes nothing.

use crate::eval;
use crate::message::{device_is, Expression, Family, UNREADABLE};
use crate::render;
use crate::ruleset::Ruleset;
use serde_json::{json, Value};

/// Expressions whose presence makes the kernel track the family's connections (or
/// reassemble its fragments): `match` and `target` are iptables-nft's, whose
/// extensions may (`conntrack`, `connmark`, `CT`, `socket`, `TPROXY`, ...); and what
/// is nested in a `dynset` but cannot be read.
pub const TRACKING: [&str; 13] = [
    "ct",
    "nat",
    "masq",
    "redir",
    "notrack",
    "connlimit",
    "synproxy",
    "flow_offload",
    "tproxy",
    "socket",
    "match",
    "target",
    UNREADABLE,
];

/// Objects whose making has the kernel track connections: ct helper (3), connlimit
/// (5), ct timeout (7), ct expectation (9), synproxy (10).
pub const TRACKING_OBJECTS: [u32; 5] = [3, 5, 7, 9, 10];

/// IPv4, IPv6, or both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Families {
    /// IPv4.
    pub v4: bool,
    /// IPv6.
    pub v6: bool,
}

impl Families {
    /// Both.
    pub const BOTH: Families = Families { v4: true, v6: true };
    /// Neither.
    pub const NONE: Families = Families {
        v4: false,
        v6: false,
    };

    /// Bit 0 for IPv4, bit 1 for IPv6.
    pub fn bits(self) -> u8 {
        u8::from(self.v4) | u8::from(self.v6) << 1
    }

    /// Whether either.
    pub fn any(self) -> bool {
        self.v4 || self.v6
    }

    /// The families of an nf_tables table (`netdev` meets both).
    pub fn of(family: Family) -> Families {
        match family {
            Family::Ip => Families {
                v4: true,
                v6: false,
            },
            Family::Ip6 => Families {
                v4: false,
                v6: true,
            },
            Family::Inet | Family::Netdev => Families::BOTH,
            _ => Families::NONE,
        }
    }

    /// As words: `IPv4`, `IPv6`, `IPv4 and IPv6`.
    pub fn name(self) -> &'static str {
        match (self.v4, self.v6) {
            (true, true) => "IPv4 and IPv6",
            (true, false) => "IPv4",
            (false, true) => "IPv6",
            _ => "none",
        }
    }
}

impl std::ops::BitOr for Families {
    type Output = Families;
    fn bitor(self, o: Families) -> Families {
        Families {
            v4: self.v4 || o.v4,
            v6: self.v6 || o.v6,
        }
    }
}

/// One part of the ruleset fibre may not bypass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The IP families it closes.
    pub families: Families,
    /// Whether it closes only the ICMP errors fibre sends for those families (a chain
    /// at the output hook, which forwarded packets do not meet but errors do).
    pub errors_only: bool,
    /// Its table's family as `nft` names it (`iptables-legacy` for a legacy table).
    pub family: String,
    /// Its table.
    pub table: String,
    /// Its chain, if it is in one.
    pub chain: Option<String>,
    /// The rule's handle, if it is a rule.
    pub handle: Option<u64>,
    /// The rule's expressions, or what of the chain it is.
    pub rule: String,
    /// Why fibre may not bypass it.
    pub why: String,
}

impl Refusal {
    /// Where it is and why, in one line.
    pub fn describe(&self) -> String {
        let mut at = format!("{} table {}", self.family, self.table);
        if let Some(c) = &self.chain {
            at += &format!(" chain {c}");
        }
        if let Some(h) = self.handle {
            at += &format!(" handle {h}");
        }
        let closes = if self.errors_only {
            format!("{}: fibre's ICMP errors", self.families.name())
        } else {
            self.families.name().to_string()
        };
        format!("{at}: {} ({}; {closes})", self.rule, self.why)
    }

    /// As JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "families": self.families.name(), "errors_only": self.errors_only,
            "family": self.family, "table": self.table,
            "chain": self.chain, "handle": self.handle, "rule": self.rule, "why": self.why,
        })
    }
}

/// The tables of iptables-legacy in the namespace, by family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Legacy {
    /// `ip_tables_names`.
    pub v4: Vec<String>,
    /// `ip6_tables_names`.
    pub v6: Vec<String>,
}

/// Everything of `ruleset` and `legacy` fibre may not bypass when it forwards between
/// the links named `links`, in the ruleset's order.
pub fn refusals(ruleset: &Ruleset, links: &[String], legacy: &Legacy) -> Vec<Refusal> {
    let mut out = Vec::new();
    let on_link = |devices: &[String]| {
        devices
            .iter()
            .any(|d| links.iter().any(|l| device_is(d, l)))
    };
    for t in ruleset.tables() {
        let family = t.table.family;
        // Who a rule or object that tracks connections affects: `ip` IPv4, `ip6`
        // IPv6, any other family (`inet`, `bridge`, ...) both.
        let tracked = match family {
            Family::Ip | Family::Ip6 => Families::of(family),
            _ => Families::BOTH,
        };
        let refusal = |families, chain: Option<&str>, handle, rule: String, why: String| Refusal {
            families,
            errors_only: false,
            family: family.name(),
            table: t.table.name.clone(),
            chain: chain.map(str::to_string),
            handle,
            rule,
            why,
        };
        // Rules (and nat chains, handle 0) already refused where packets meet them.
        let mut refused = std::collections::HashSet::new();
        // What forwarded packets meet, while the table is not dormant.
        for c in t.chains.values().filter(|_| !t.table.dormant()) {
            let Some(h) = &c.chain.hook else { continue };
            let met = match family {
                Family::Netdev => on_link(&h.devices),
                Family::Ip | Family::Ip6 | Family::Inet => {
                    matches!(h.number, 0 | 2 | 4) || (h.number == 5 && on_link(&h.devices))
                }
                _ => false,
            };
            // The output hook meets the ICMP errors fibre sends for what it forwards.
            let errors =
                !met && matches!(family, Family::Ip | Family::Ip6 | Family::Inet) && h.number == 3;
            if !met && !errors {
                continue;
            }
            let at = format!(
                "{} hook, priority {}",
                render::hook_name(family, h.number),
                h.priority
            );
            let families = Families::of(family);
            let name = Some(c.chain.name.as_str());
            let mut found = Vec::new();
            if errors && c.chain.kind.as_deref() == Some("route") {
                found.push(refusal(
                    families,
                    name,
                    None,
                    format!("type route chain at the {at}"),
                    "it may reroute the ICMP errors fibre sends".into(),
                ));
            }
            // A filter chain of the forwarding path's hooks that compiles, fibre
            // evaluates; its rules close only the ICMP errors fibre sends, which meet a
            // postrouting chain and which fibre does not put through it.
            let evaluated = met
                && matches!(family, Family::Ip | Family::Ip6 | Family::Inet)
                && eval::Hook::of(h.number).is_some()
                && c.chain
                    .kind
                    .as_deref()
                    .is_none_or(|k| k == "filter" || k == "nat");
            if evaluated {
                match eval::Program::compile(t, &c.chain.name) {
                    Ok(_) => {
                        // (A `nat` chain never meets them: NAT translates an ICMP error
                        // by the connection it quotes, without its chains.)
                        let filter = c.chain.kind.as_deref() != Some("nat");
                        if filter
                            && h.number == 4
                            && (!c.rules.is_empty() || c.chain.policy == Some(0))
                        {
                            let mut f = refusal(
                                families,
                                name,
                                None,
                                format!("filter chain at the {at}"),
                                "the ICMP errors fibre sends meet it, and fibre does not put \
                                 them through it"
                                    .into(),
                            );
                            f.errors_only = true;
                            out.push(f);
                        }
                    }
                    Err(why) => {
                        for r in why {
                            let rule = t
                                .chains
                                .get(&r.chain)
                                .and_then(|c| c.rules.iter().find(|x| x.handle == r.handle));
                            refused.insert((r.chain.clone(), r.handle));
                            out.push(refusal(
                                families,
                                Some(&r.chain),
                                rule.map(|x| x.handle),
                                rule.map_or_else(|| r.what.clone(), render::rule),
                                format!(
                                    "reached from the {at}; fibre does not evaluate {}",
                                    r.what
                                ),
                            ));
                        }
                    }
                }
                continue;
            }
            for r in &c.rules {
                if met {
                    refused.insert((c.chain.name.clone(), r.handle));
                }
                found.push(refusal(
                    families,
                    name,
                    Some(r.handle),
                    render::rule(r),
                    if met {
                        format!(
                            "a rule forwarded packets meet at the {at}; fibre does not \
                             evaluate rules here yet"
                        )
                    } else {
                        format!("a rule the ICMP errors fibre sends meet at the {at}")
                    },
                ));
            }
            if c.chain.policy == Some(0) {
                found.push(refusal(
                    families,
                    name,
                    None,
                    "policy drop".into(),
                    format!("the {at} drops what no rule accepts"),
                ));
            }
            for mut f in found {
                f.errors_only = errors;
                out.push(f);
            }
        }
        // What makes the kernel track connections, dormant or not: the expressions
        // took their hold on conntrack when they were made.
        let why = "it makes the kernel track every connection of the family, forwarded ones \
                   too, and reassemble their fragments";
        for c in t.chains.values() {
            let name = Some(c.chain.name.as_str());
            for r in &c.rules {
                if tracks_beyond_reading(&r.expressions)
                    && !refused.contains(&(c.chain.name.clone(), r.handle))
                {
                    out.push(refusal(
                        tracked,
                        name,
                        Some(r.handle),
                        render::rule(r),
                        why.into(),
                    ));
                }
            }
        }
        for set in t.sets.values().filter(|s| tracks(&s.expressions)) {
            let names: Vec<&str> = set.expressions.iter().map(|e| e.name.as_str()).collect();
            out.push(refusal(
                tracked,
                None,
                None,
                format!("set {} with per-element {}", set.name, names.join(", ")),
                why.into(),
            ));
        }
        for o in t
            .objects
            .values()
            .filter(|o| TRACKING_OBJECTS.contains(&o.kind))
        {
            out.push(refusal(
                tracked,
                None,
                None,
                format!("object {} of type {}", o.name, o.kind),
                why.into(),
            ));
        }
        for f in t.flowtables.values().filter(|f| on_link(&f.devices)) {
            out.push(refusal(
                tracked,
                None,
                None,
                format!("flowtable {} on {}", f.name, f.devices.join(", ")),
                "its flows are forwarded, and translated, at the links' ingress, ahead of \
                 fibre's rules"
                    .into(),
            ));
        }
    }
    for (names, families) in [
        (
            &legacy.v4,
            Families {
                v4: true,
                v6: false,
            },
        ),
        (
            &legacy.v6,
            Families {
                v4: false,
                v6: true,
            },
        ),
    ] {
        for name in names {
            out.push(Refusal {
                families,
                errors_only: false,
                family: "iptables-legacy".into(),
                table: name.clone(),
                chain: None,
                handle: None,
                rule: "a table of iptables-legacy".into(),
                why: "its rules are not shown over nf_tables' netlink".into(),
            });
        }
    }
    out
}

/// Whether expressions (or those nested in them) make the kernel track connections.
fn tracks(expressions: &[Expression]) -> bool {
    expressions
        .iter()
        .flat_map(Expression::names)
        .any(|n| TRACKING.contains(&n.as_str()))
}

/// Whether `expressions` hold something that tracks connections beyond reading them
/// (a `ct ... set`, NAT, `notrack`, ...): a `ct` load changes nothing of a connection
/// (where forwarded packets meet one fibre does not evaluate, the chain is refused).
fn tracks_beyond_reading(expressions: &[Expression]) -> bool {
    expressions
        .iter()
        .filter(|e| !eval::reads_ct(e))
        .flat_map(Expression::names)
        .any(|n| TRACKING.contains(&n.as_str()) && !NAT.contains(&n.as_str()))
}

/// NAT statements: the kernel takes them only in `nat` chains, which bind a
/// connection's first packet; those forwarded packets meet fibre evaluates (or refuses,
/// rule by rule), and those of other hooks bind only what the host sends or receives.
const NAT: [&str; 3] = ["nat", "masq", "redir"];

/// The families whose connections the kernel tracks because of `ruleset` (a rule, a
/// set, an object or a `nat` chain that makes it, in any table, dormant or not: each
/// took its hold on conntrack when it was made): fibre tracks their forwarded packets
/// too, and hands their fragments, which the kernel reassembles, to the kernel.
pub fn tracked(ruleset: &Ruleset) -> Families {
    let mut out = Families::NONE;
    for t in ruleset.tables() {
        let families = match t.table.family {
            Family::Ip | Family::Ip6 => Families::of(t.table.family),
            _ => Families::BOTH,
        };
        let tracking = t.chains.values().any(|c| {
            c.chain.kind.as_deref() == Some("nat") || c.rules.iter().any(|r| tracks(&r.expressions))
        }) || t.sets.values().any(|s| tracks(&s.expressions))
            || t.objects
                .values()
                .any(|o| TRACKING_OBJECTS.contains(&o.kind));
        if tracking {
            out = out | families;
        }
    }
    out
}

/// The families `refusals` close to forwarding together.
pub fn closed(refusals: &[Refusal]) -> Families {
    refusals
        .iter()
        .filter(|r| !r.errors_only)
        .fold(Families::NONE, |f, r| f | r.families)
}

/// The families whose ICMP errors from fibre `refusals` close (those closed to
/// forwarding included).
pub fn quiet(refusals: &[Refusal]) -> Families {
    refusals.iter().fold(Families::NONE, |f, r| f | r.families)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::tests::{base_chain, message, nla, rule};
    use crate::message::NEWCHAIN;
    use crate::ruleset::tests::{apply, table};

    fn netdev_chain(table: &str, name: &str, dev: &str) -> Vec<u8> {
        let mut attrs = nla(1, format!("{table}\0").as_bytes());
        attrs.extend(nla(3, format!("{name}\0").as_bytes()));
        let mut h = nla(1, &0u32.to_be_bytes());
        h.extend(nla(2, &0u32.to_be_bytes()));
        h.extend(nla(3, format!("{dev}\0").as_bytes()));
        attrs.extend(nla(4 | 0x8000, &h));
        attrs.extend(nla(5, &1u32.to_be_bytes()));
        message(NEWCHAIN, 5, 0, &attrs)
    }

    fn regular_chain(family: u8, table: &str, name: &str) -> Vec<u8> {
        let mut attrs = nla(1, format!("{table}\0").as_bytes());
        attrs.extend(nla(3, format!("{name}\0").as_bytes()));
        message(NEWCHAIN, family, 0, &attrs)
    }

    fn closed_by(r: &Ruleset) -> Families {
        closed(&refusals(
            r,
            &["ra".into(), "rb".into()],
            &Legacy::default(),
        ))
    }

    #[test]
    fn tcp_resets_close_nothing_even_where_nat_translates() {
        use crate::build::{self, masquerade, ChainSpec};
        let chain = |nat: bool, hook: u32, rules| ChainSpec {
            nat,
            name: if nat { "nat" } else { "filter" }.into(),
            hook: Some((hook, 1)),
            rules,
        };
        let resets = vec![vec![build::reject(1, 0)], vec![build::reject(2, 3)]];
        for r in [
            build::ruleset(Family::Ip, "t", vec![chain(false, 2, resets.clone())]),
            build::ruleset(
                Family::Inet,
                "t",
                vec![
                    chain(false, 2, resets.clone()),
                    chain(true, 4, vec![vec![masquerade()]]),
                ],
            ),
        ] {
            let found = refusals(&r, &[], &Legacy::default());
            assert!(found.is_empty(), "{found:?}");
        }
    }

    #[test]
    fn what_forwarded_packets_meet_closes_their_families() {
        let mut r = Ruleset::new();
        // An empty accepting forward chain changes nothing.
        apply(&mut r, &table(2, "v4", 0));
        apply(&mut r, &base_chain(2, "v4", "fwd", 2, 1));
        assert_eq!(closed_by(&r), Families::NONE);
        // A rule in it closes IPv4 only.
        apply(
            &mut r,
            &rule(2, "v4", "fwd", 3, &["payload", "cmp", "immediate"]),
        );
        let got = refusals(&r, &[], &Legacy::default());
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].handle, got[0].chain.as_deref()),
            (Some(3), Some("fwd"))
        );
        assert!(got[0].describe().contains("ip table v4 chain fwd handle 3"));
        assert_eq!(
            closed_by(&r),
            Families {
                v4: true,
                v6: false
            }
        );
        // An input chain's rules are the host's: forwarded packets do not meet them,
        // unless they make the kernel track connections.
        apply(&mut r, &table(10, "v6", 0));
        apply(&mut r, &base_chain(10, "v6", "in", 1, 0));
        apply(&mut r, &rule(10, "v6", "in", 4, &["payload", "cmp"]));
        assert_eq!(
            closed_by(&r),
            Families {
                v4: true,
                v6: false
            }
        );
        // Reading connections there only has fibre track the family's too.
        apply(
            &mut r,
            &rule(10, "v6", "in", 5, &["ct", "cmp", "immediate"]),
        );
        assert_eq!(
            closed_by(&r),
            Families {
                v4: true,
                v6: false
            }
        );
        assert_eq!(
            tracked(&r),
            Families {
                v4: false,
                v6: true
            }
        );
        apply(&mut r, &rule(10, "v6", "in", 6, &["notrack"]));
        assert_eq!(closed_by(&r), Families::BOTH);
        // A dormant table's chains meet nothing, but what tracks connections in it
        // still does: the kernel took conntrack when the rule was made.
        apply(&mut r, &table(10, "v6", 1));
        apply(&mut r, &table(2, "v4", 1));
        assert_eq!(
            closed_by(&r),
            Families {
                v4: false,
                v6: true
            }
        );
    }

    fn expression_list(exprs: &[Vec<u8>]) -> Vec<u8> {
        exprs.iter().flat_map(|e| nla(1 | 0x8000, e)).collect()
    }

    fn named(name: &str, data: &[u8]) -> Vec<u8> {
        let mut e = nla(1, format!("{name}\0").as_bytes());
        e.extend(nla(2 | 0x8000, data));
        e
    }

    #[test]
    fn tracking_hides_nowhere() {
        // A dynset whose elements count connections (`add @s { ip saddr ct count over
        // 5 }`), in a regular chain: the nested `connlimit` tracks.
        let mut r = Ruleset::new();
        apply(&mut r, &table(2, "t", 0));
        apply(&mut r, &regular_chain(2, "t", "sub"));
        let dynset = named("dynset", &nla(7 | 0x8000, &named("connlimit", &[])));
        let mut attrs = nla(1, b"t\0");
        attrs.extend(nla(2, b"sub\0"));
        attrs.extend(nla(3, &5u64.to_be_bytes()));
        attrs.extend(nla(4 | 0x8000, &expression_list(&[dynset])));
        apply(&mut r, &message(crate::message::NEWRULE, 2, 0, &attrs));
        assert_eq!(
            closed_by(&r),
            Families {
                v4: true,
                v6: false
            }
        );
        // iptables-nft's compat expressions, in a bridge table (whose conntrack is
        // both families').
        let mut r = Ruleset::new();
        apply(&mut r, &table(7, "br", 0));
        apply(&mut r, &regular_chain(7, "br", "c"));
        apply(&mut r, &rule(7, "br", "c", 2, &["match"]));
        assert_eq!(closed_by(&r), Families::BOTH);
        // A ct helper object, with no rule using it yet.
        let mut r = Ruleset::new();
        apply(&mut r, &table(10, "t6", 0));
        let mut attrs = nla(1, b"t6\0");
        attrs.extend(nla(2, b"ftp\0"));
        attrs.extend(nla(3, &3u32.to_be_bytes()));
        apply(&mut r, &message(crate::message::NEWOBJ, 10, 0, &attrs));
        assert_eq!(
            closed_by(&r),
            Families {
                v4: false,
                v6: true
            }
        );
    }

    #[test]
    fn devices_prefixes_flowtables_and_the_output_hook() {
        let devs = |names: &[(u16, &str)]| -> Vec<u8> {
            names
                .iter()
                .flat_map(|(k, n)| nla(*k, format!("{n}\0").as_bytes()))
                .collect()
        };
        let netdev = |name: &str, d: &[(u16, &str)], del: bool| {
            let mut attrs = nla(1, b"dev\0");
            attrs.extend(nla(3, format!("{name}\0").as_bytes()));
            let mut h = nla(1, &0u32.to_be_bytes());
            h.extend(nla(2, &0u32.to_be_bytes()));
            h.extend(nla(4 | 0x8000, &devs(d)));
            attrs.extend(nla(4 | 0x8000, &h));
            let kind = if del {
                crate::message::DELCHAIN
            } else {
                NEWCHAIN
            };
            message(kind, 5, 0, &attrs)
        };
        let mut r = Ruleset::new();
        apply(&mut r, &table(5, "dev", 0));
        // A prefix (`"r*"`) matches the forwarded links.
        apply(&mut r, &netdev("in", &[(1, "eth0"), (2, "r")], false));
        apply(&mut r, &rule(5, "dev", "in", 2, &["immediate"]));
        assert_eq!(closed_by(&r), Families::BOTH);
        // The prefix taken off the hook: the chain stays on eth0, closing nothing.
        apply(&mut r, &netdev("in", &[(2, "r")], true));
        assert_eq!(closed_by(&r), Families::NONE);
        // A link added to the hook: only the one added is named; eth0 stays.
        apply(&mut r, &netdev("in", &[(1, "ra")], false));
        assert_eq!(closed_by(&r), Families::BOTH);
        let hook = &r.tables().next().unwrap().chains["in"].chain.hook;
        assert_eq!(hook.as_ref().unwrap().devices.len(), 2);
        // A flowtable on a forwarded link.
        let mut r = Ruleset::new();
        apply(&mut r, &table(1, "f", 0));
        let mut attrs = nla(1, b"f\0");
        attrs.extend(nla(2, b"ft\0"));
        let mut h = nla(1, &0u32.to_be_bytes());
        h.extend(nla(3 | 0x8000, &devs(&[(1, "rb")])));
        attrs.extend(nla(3 | 0x8000, &h));
        apply(&mut r, &message(crate::message::NEWFLOWTABLE, 1, 0, &attrs));
        assert_eq!(closed_by(&r), Families::BOTH);
        // An output chain with a rule closes fibre's ICMP errors only.
        let mut r = Ruleset::new();
        apply(&mut r, &table(2, "o", 0));
        apply(&mut r, &base_chain(2, "o", "out", 3, 1));
        apply(
            &mut r,
            &rule(2, "o", "out", 2, &["payload", "cmp", "immediate"]),
        );
        let got = refusals(&r, &[], &Legacy::default());
        assert_eq!(closed(&got), Families::NONE);
        assert_eq!(
            quiet(&got),
            Families {
                v4: true,
                v6: false
            }
        );
        assert!(
            got[0].describe().contains("IPv4: fibre's ICMP errors"),
            "{}",
            got[0].describe()
        );
    }

    #[test]
    fn policies_nat_chains_and_devices() {
        let mut r = Ruleset::new();
        apply(&mut r, &table(1, "fw", 0));
        // A dropping policy at postrouting, with no rule, fibre evaluates: it closes
        // only the ICMP errors fibre sends, which meet it unevaluated.
        apply(&mut r, &base_chain(1, "fw", "post", 4, 0));
        assert_eq!(closed_by(&r), Families::NONE);
        let got = refusals(&r, &[], &Legacy::default());
        assert_eq!((quiet(&got), got.len()), (Families::BOTH, 1));
        // A rule there fibre does not evaluate closes both, named with what it lacks.
        apply(&mut r, &rule(1, "fw", "post", 7, &["payload", "cmp"]));
        assert_eq!(closed_by(&r), Families::BOTH);
        let got = refusals(&r, &[], &Legacy::default());
        assert_eq!(got[0].handle, Some(7), "{got:?}");
        assert!(
            got[0]
                .why
                .contains("does not evaluate `payload` as used here"),
            "{got:?}"
        );
        let mut r = Ruleset::new();
        apply(&mut r, &table(5, "dev", 0));
        // netdev ingress on a link fibre does not forward: not met.
        apply(&mut r, &netdev_chain("dev", "in", "eth9"));
        apply(&mut r, &rule(5, "dev", "in", 2, &["immediate"]));
        assert_eq!(closed_by(&r), Families::NONE);
        apply(&mut r, &netdev_chain("dev", "in2", "ra"));
        apply(&mut r, &rule(5, "dev", "in2", 3, &["immediate"]));
        assert_eq!(closed_by(&r), Families::BOTH);
        // A regular chain's rules are met only through jumps (themselves rules of a
        // base chain), unless they track.
        let mut r = Ruleset::new();
        apply(&mut r, &table(2, "t", 0));
        apply(&mut r, &regular_chain(2, "t", "sub"));
        apply(&mut r, &rule(2, "t", "sub", 2, &["payload", "cmp"]));
        assert_eq!(closed_by(&r), Families::NONE);
        // NAT in a regular chain binds only what a nat chain that jumps there meets
        // (compiled, or refused, with it); a `notrack` changes how the kernel tracks
        // the family wherever it is.
        apply(&mut r, &rule(2, "t", "sub", 3, &["masq"]));
        assert_eq!(closed_by(&r), Families::NONE);
        apply(&mut r, &rule(2, "t", "sub", 4, &["notrack"]));
        assert_eq!(
            closed_by(&r),
            Families {
                v4: true,
                v6: false
            }
        );
    }

    #[test]
    fn legacy_tables_close_their_family() {
        let legacy = Legacy {
            v4: vec![],
            v6: vec!["filter".into()],
        };
        let got = refusals(&Ruleset::new(), &[], &legacy);
        assert_eq!(
            closed(&got),
            Families {
                v4: false,
                v6: true
            }
        );
        assert_eq!(got[0].family, "iptables-legacy");
    }
}
