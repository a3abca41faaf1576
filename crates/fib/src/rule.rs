//! Policy rules (`ip rule`): an ordered list per family, each a set of selectors and an
//! action. A lookup walks the list by priority; the first rule whose selectors match and
//! whose action gives an answer decides.
//!
//! Every family starts with three rules, as the kernel's: 0 `lookup local`, 32766
//! `lookup main`, 32767 `lookup default`; all three may be deleted.

use crate::link::LinkIndex;
use crate::names::{TABLE_DEFAULT, TABLE_LOCAL, TABLE_MAIN};
use crate::net::{Family, Net};

/// What a rule does when its selectors match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleAction {
    /// Look the flow up in a table (`lookup ID`).
    Lookup(u32),
    /// Jump to the first rule of this priority (`goto N`); the walk goes on from there.
    Goto(u32),
    /// Nothing (`nop`).
    Nop,
    /// Drop (`blackhole`): `Invalid argument`.
    Blackhole,
    /// Refuse (`unreachable`): `Network is unreachable`.
    Unreachable,
    /// Refuse (`prohibit`): `Permission denied`.
    Prohibit,
}

/// A link a rule names (`iif`, `oif`): the name always, the index while the link exists.
/// A rule naming a link that does not exist never matches, as in the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleLink {
    /// The name given.
    pub name: String,
    /// The link's index, if a link of that name exists.
    pub index: Option<LinkIndex>,
}

/// An inclusive range of ports or uids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    /// First value.
    pub start: u32,
    /// Last value.
    pub end: u32,
}

impl Range {
    /// Whether `v` lies in the range.
    pub fn contains(&self, v: u32) -> bool {
        self.start <= v && v <= self.end
    }
}

/// A policy rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The family.
    pub family: Family,
    /// The priority (`pref`): lower first.
    pub pref: u32,
    /// `not`: the selectors' result inverted.
    pub invert: bool,
    /// Source prefix (`from`); `None` for `all`.
    pub src: Option<Net>,
    /// Destination prefix (`to`).
    pub dst: Option<Net>,
    /// Input link (`iif`); `lo` matches what this host sends.
    pub iif: Option<RuleLink>,
    /// Output link (`oif`).
    pub oif: Option<RuleLink>,
    /// Firewall mark and mask (`fwmark M/MASK`).
    pub fwmark: Option<(u32, u32)>,
    /// TOS (`tos`), or DSCP (`dscp`, kept shifted into TOS position).
    pub tos: Option<u8>,
    /// IP protocol (`ipproto`).
    pub ipproto: Option<u8>,
    /// Source ports (`sport`).
    pub sport: Option<Range>,
    /// Destination ports (`dport`).
    pub dport: Option<Range>,
    /// Uids (`uidrange`).
    pub uidrange: Option<Range>,
    /// The action.
    pub action: RuleAction,
    /// `suppress_prefixlength N`: refuse answers whose prefix is N bits or shorter.
    pub suppress_prefixlength: Option<u8>,
    /// `suppress_ifgroup G`: refuse answers through a link of group G.
    pub suppress_ifgroup: Option<u32>,
    /// The protocol that added it (`protocol`).
    pub protocol: u8,
}

impl Rule {
    /// A rule of `family` and `pref` that matches everything and does `action`.
    pub fn new(family: Family, pref: u32, action: RuleAction) -> Rule {
        Rule {
            family,
            pref,
            invert: false,
            src: None,
            dst: None,
            iif: None,
            oif: None,
            fwmark: None,
            tos: None,
            ipproto: None,
            sport: None,
            dport: None,
            uidrange: None,
            action,
            suppress_prefixlength: None,
            suppress_ifgroup: None,
            protocol: 0,
        }
    }

    /// The kernel's three rules of a family.
    pub fn defaults(family: Family) -> Vec<Rule> {
        vec![
            Rule::new(family, 0, RuleAction::Lookup(TABLE_LOCAL)),
            Rule::new(family, 32766, RuleAction::Lookup(TABLE_MAIN)),
            Rule::new(family, 32767, RuleAction::Lookup(TABLE_DEFAULT)),
        ]
    }

    /// Whether the rule is one of the kernel's three of its family, whoever is named as
    /// having made it (the kernel reports its own as `proto kernel`).
    pub fn is_default(&self) -> bool {
        Rule::defaults(self.family).iter().any(|d| {
            *d == Rule {
                protocol: d.protocol,
                ..self.clone()
            }
        })
    }

    /// Whether the rule has no selectors: it matches every flow.
    pub fn matches_all(&self) -> bool {
        !self.invert
            && self.src.is_none()
            && self.dst.is_none()
            && self.iif.is_none()
            && self.oif.is_none()
            && self.fwmark.is_none()
            && self.tos.is_none()
            && self.ipproto.is_none()
            && self.sport.is_none()
            && self.dport.is_none()
            && self.uidrange.is_none()
    }
}
