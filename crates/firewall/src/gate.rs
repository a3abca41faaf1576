//! What of the router's firewall fibre may not bypass. fibre does not evaluate rules, track
//! connections or translate addresses yet; forwarding around any of them would let pass
//! what the kernel drops and send what the kernel changes. So every part of the ruleset
//! that forwarded packets meet, or that changes how the kernel handles them, closes the
//! IP families it applies to, and the daemon refuses to forward those families, naming
//! each such part:
//!
//! - a base chain of family `ip`, `ip6` or `inet` at prerouting, forward or postrouting
//!   (or `inet` ingress on a forwarded link): each of its rules, its policy if it drops,
//!   the chain itself if it is a `nat` chain;
//! - a base chain of family `netdev` on a forwarded link (ingress or egress): the same;
//! - anywhere in `ip`, `ip6` or `inet`, a `nat` chain or a rule with an expression that
//!   makes the kernel track connections (`ct`, `nat`, `masq`, `redir`, `notrack`,
//!   `connlimit`, `synproxy`, `flow_offload`, `objref`, `tproxy`, `socket`): the kernel
//!   then tracks every packet of the family, forwarded ones too, and reassembles their
//!   fragments;
//! - a table of iptables-legacy (`/proc/net/ip_tables_names`,
//!   `/proc/net/ip6_tables_names`), whose rules nf_tables' netlink does not show.
//!
//! A dormant table is off, and closes nothing; a base chain with no rules and policy
//! accept changes nothing, and closes nothing.

use crate::message::{Family, Rule};
use crate::render;
use crate::ruleset::Ruleset;
use serde_json::{json, Value};

/// Expressions whose presence makes the kernel track the family's connections.
pub const TRACKING: [&str; 11] = [
    "ct",
    "nat",
    "masq",
    "redir",
    "notrack",
    "connlimit",
    "synproxy",
    "flow_offload",
    "objref",
    "tproxy",
    "socket",
];

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
        format!(
            "{at}: {} ({}; {})",
            self.rule,
            self.why,
            self.families.name()
        )
    }

    /// As JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "families": self.families.name(), "family": self.family, "table": self.table,
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
    for t in ruleset.tables() {
        let families = Families::of(t.table.family);
        if t.table.dormant() || !families.any() {
            continue;
        }
        let refusal = |chain: &str, handle, rule: String, why: String| Refusal {
            families,
            family: t.table.family.name(),
            table: t.table.name.clone(),
            chain: Some(chain.to_string()),
            handle,
            rule,
            why,
        };
        for c in t.chains.values() {
            let on_path = c.chain.hook.as_ref().filter(|h| {
                let on_link = h.devices.iter().any(|d| links.contains(d));
                match t.table.family {
                    Family::Netdev => on_link,
                    _ => matches!(h.number, 0 | 2 | 4) || (h.number == 5 && on_link),
                }
            });
            let name = &c.chain.name;
            let nat = c.chain.kind.as_deref() == Some("nat");
            if let Some(h) = on_path {
                let at = format!(
                    "{} hook, priority {}",
                    render::hook_name(t.table.family, h.number),
                    h.priority
                );
                if nat {
                    out.push(refusal(
                        name,
                        None,
                        format!("type nat chain at the {at}"),
                        "fibre does not translate addresses yet".into(),
                    ));
                }
                for r in &c.rules {
                    out.push(refusal(
                        name,
                        Some(r.handle),
                        render::rule(r),
                        format!(
                            "a rule forwarded packets meet at the {at}; fibre does not \
                             evaluate rules yet"
                        ),
                    ));
                }
                if c.chain.policy == Some(0) {
                    out.push(refusal(
                        name,
                        None,
                        "policy drop".into(),
                        format!("the {at} drops what no rule accepts"),
                    ));
                }
            } else if t.table.family != Family::Netdev {
                if nat {
                    out.push(refusal(
                        name,
                        None,
                        "type nat chain".into(),
                        "the kernel then tracks every connection of the family, forwarded \
                         ones too, and reassembles their fragments"
                            .into(),
                    ));
                }
                for r in c.rules.iter().filter(|r| tracks(r)) {
                    out.push(refusal(
                        name,
                        Some(r.handle),
                        render::rule(r),
                        "it makes the kernel track every connection of the family, \
                         forwarded ones too, and reassemble their fragments"
                            .into(),
                    ));
                }
            }
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

/// Whether a rule makes the kernel track connections.
fn tracks(r: &Rule) -> bool {
    r.expressions
        .iter()
        .any(|e| TRACKING.contains(&e.name.as_str()))
}

/// The families `refusals` close together.
pub fn closed(refusals: &[Refusal]) -> Families {
    refusals.iter().fold(Families::NONE, |f, r| f | r.families)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::tests::{base_chain, message, nla, rule};
    use crate::message::{read, Read, NEWCHAIN, NEWTABLE};

    fn apply(r: &mut Ruleset, bytes: &[u8]) {
        let Ok(Read::Message(m, flags)) = read(bytes) else {
            panic!("{:?}", read(bytes));
        };
        r.apply(m, flags);
    }

    fn table(family: u8, name: &str, flags: u32) -> Vec<u8> {
        let mut attrs = nla(1, format!("{name}\0").as_bytes());
        attrs.extend(nla(2, &flags.to_be_bytes()));
        message(NEWTABLE, family, 0, &attrs)
    }

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
        apply(
            &mut r,
            &rule(10, "v6", "in", 5, &["ct", "cmp", "immediate"]),
        );
        assert_eq!(closed_by(&r), Families::BOTH);
        // A dormant table closes nothing.
        apply(&mut r, &table(10, "v6", 1));
        apply(&mut r, &table(2, "v4", 1));
        assert_eq!(closed_by(&r), Families::NONE);
    }

    #[test]
    fn policies_nat_chains_and_devices() {
        let mut r = Ruleset::new();
        apply(&mut r, &table(1, "fw", 0));
        // A dropping policy at postrouting, with no rule, closes both.
        apply(&mut r, &base_chain(1, "fw", "post", 4, 0));
        assert_eq!(closed_by(&r), Families::BOTH);
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
        apply(&mut r, &rule(2, "t", "sub", 3, &["masq"]));
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
