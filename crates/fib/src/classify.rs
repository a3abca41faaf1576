//! Policy rules compiled for lookups: flat selectors, and an index that finds the next rule
//! a flow can match without testing the rules in between.
//!
//! The kernel walks its rule list one rule at a time, following pointers and testing every
//! selector of every rule; with many rules that walk is the lookup's cost. Here each rule's
//! selectors are plain integers (a prefix is a value and a mask; an absent selector is one
//! that lets everything through), so testing one rule is a few comparisons with no branch
//! on which selectors it has.
//!
//! Past [`INDEX_FROM`] rules, an index of bit sets (one bit per rule, in priority order)
//! narrows the walk: for each indexed selector (source prefix, destination prefix, input
//! link, exact firewall mark, source and destination port ranges, uid range) a flow's
//! value picks the set of rules that selector does not rule out; the rules in all the
//! sets are the candidates, and only they are tested in full. A range selector's sets
//! are found by binary search among the ends of the rules' ranges. A prefix selector's sets are found with an LPM lookup over the rules' prefixes:
//! the rules whose prefix holds an address are exactly those whose prefix covers the
//! longest rule prefix holding it. A rule with `not`, or a selector the index does not
//! key (a partial mark mask), is in every set of that selector, so the candidates are
//! always a superset of the matching rules and the index never changes an answer.

use crate::link::LinkIndex;
use crate::net::{addr_bits, Family, Net};
use crate::query::Query;
use crate::rule::{Rule, RuleAction};
use fibre_lpm::{Ipv4Table, Ipv6Table};

/// The number of rules from which the index is built; below it, testing each rule is as
/// fast.
pub(crate) const INDEX_FROM: usize = 12;

/// What a compiled rule does when its selectors match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Look up a table: its id, and its position among the family's compiled tables
    /// (`None`: no such table, and the walk goes on).
    Lookup { id: u32, table: Option<usize> },
    /// Go on at this rule (`None`: no rule has the target priority, and the walk goes on
    /// with the next rule).
    Goto(Option<usize>),
    /// Go on with the next rule.
    Nop,
    /// Answer `Invalid argument`.
    Blackhole,
    /// Answer `Network is unreachable`.
    Unreachable,
    /// Answer `Permission denied`.
    Prohibit,
}

/// What the rules look at in a flow, as integers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlowKey {
    dst: u128,
    src: u128,
    iif: LinkIndex,
    oif: Option<LinkIndex>,
    mark: u32,
    uid: u32,
    tos: u8,
    ipproto: u8,
    sport: u16,
    dport: u16,
}

impl FlowKey {
    /// The key of a query, with the output link and input link the walk uses (an output
    /// flow's input link is the loopback's index, 1; a gateway check's is 0).
    pub(crate) fn new(q: &Query, oif: Option<LinkIndex>, iif: LinkIndex) -> FlowKey {
        FlowKey {
            dst: addr_bits(q.dst),
            src: q.src.map_or(0, addr_bits),
            iif,
            oif,
            mark: q.mark,
            uid: q.uid,
            tos: q.tos,
            ipproto: q.ipproto,
            sport: q.sport,
            dport: q.dport,
        }
    }
}

/// A rule's selector on a link: none, a link that exists, or a name with no link (which
/// matches no flow).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LinkSelector {
    Any,
    Link(LinkIndex),
    Missing,
}

/// One rule with its selectors as integers.
#[derive(Clone, Debug)]
pub(crate) struct CompiledRule {
    src: (u128, u128),
    dst: (u128, u128),
    iif: LinkSelector,
    oif: LinkSelector,
    mark: u32,
    mark_mask: u32,
    uid: (u32, u32),
    sport: (u32, u32),
    dport: (u32, u32),
    tos: Option<u8>,
    ipproto: Option<u8>,
    invert: bool,
    /// What the rule does.
    pub(crate) action: Action,
    /// `suppress_prefixlength`: answers from prefixes this long or shorter are refused.
    pub(crate) suppress_prefixlength: Option<u8>,
    /// `suppress_ifgroup`: answers through a link of this group are refused.
    pub(crate) suppress_ifgroup: Option<u32>,
}

const ANY_RANGE: (u32, u32) = (0, u32::MAX);

fn prefix(net: Option<Net>) -> (u128, u128) {
    net.map_or((0, 0), |n| n.value_and_mask())
}

fn link(l: &Option<crate::rule::RuleLink>) -> LinkSelector {
    match l {
        None => LinkSelector::Any,
        Some(l) => l.index.map_or(LinkSelector::Missing, LinkSelector::Link),
    }
}

fn range(r: Option<crate::rule::Range>) -> (u32, u32) {
    r.map_or(ANY_RANGE, |r| (r.start, r.end))
}

impl CompiledRule {
    /// A rule with no selector and the given action (the walk IPv4 makes before any rule
    /// was added: `main`, then `default`).
    pub(crate) fn always(action: Action) -> CompiledRule {
        CompiledRule {
            src: (0, 0),
            dst: (0, 0),
            iif: LinkSelector::Any,
            oif: LinkSelector::Any,
            mark: 0,
            mark_mask: 0,
            uid: ANY_RANGE,
            sport: ANY_RANGE,
            dport: ANY_RANGE,
            tos: None,
            ipproto: None,
            invert: false,
            action,
            suppress_prefixlength: None,
            suppress_ifgroup: None,
        }
    }

    /// Whether the rule has a selector (or `not`): flows its selectors refuse pass it by.
    pub(crate) fn is_selective(&self) -> bool {
        !(self.src == (0, 0)
            && self.dst == (0, 0)
            && self.iif == LinkSelector::Any
            && self.oif == LinkSelector::Any
            && self.mark_mask == 0
            && self.uid == ANY_RANGE
            && self.sport == ANY_RANGE
            && self.dport == ANY_RANGE
            && self.tos.is_none()
            && self.ipproto.is_none()
            && !self.invert)
    }

    /// Whether the rule's selectors are `other`'s: both match the same flows.
    pub(crate) fn same_selectors(&self, other: &CompiledRule) -> bool {
        self.src == other.src
            && self.dst == other.dst
            && self.iif == other.iif
            && self.oif == other.oif
            && (self.mark & self.mark_mask, self.mark_mask)
                == (other.mark & other.mark_mask, other.mark_mask)
            && self.uid == other.uid
            && self.sport == other.sport
            && self.dport == other.dport
            && self.tos == other.tos
            && self.ipproto == other.ipproto
            && self.invert == other.invert
    }

    /// Whether the rule only looks up a table and takes whatever answer it has.
    pub(crate) fn plain_lookup(&self) -> bool {
        matches!(self.action, Action::Lookup { .. })
            && self.suppress_prefixlength.is_none()
            && self.suppress_ifgroup.is_none()
    }

    /// Whether the rule matches every flow and takes every answer: no selector, no `not`,
    /// no `suppress_*`.
    pub(crate) fn is_unconditional(&self) -> bool {
        !self.is_selective()
            && self.suppress_prefixlength.is_none()
            && self.suppress_ifgroup.is_none()
    }

    /// Whether the rule's selectors match the flow (inverted by `not`), as
    /// `fib_rule_match` and the family's match decide.
    #[inline]
    pub(crate) fn matches(&self, k: &FlowKey) -> bool {
        let links = match self.iif {
            LinkSelector::Any => true,
            LinkSelector::Link(l) => l == k.iif,
            LinkSelector::Missing => false,
        } && match self.oif {
            LinkSelector::Any => true,
            LinkSelector::Link(l) => Some(l) == k.oif,
            LinkSelector::Missing => false,
        };
        let m = links
            & (k.src & self.src.1 == self.src.0)
            & (k.dst & self.dst.1 == self.dst.0)
            & ((k.mark ^ self.mark) & self.mark_mask == 0)
            & (self.uid.0 <= k.uid && k.uid <= self.uid.1)
            & (self.sport.0 <= k.sport as u32 && k.sport as u32 <= self.sport.1)
            & (self.dport.0 <= k.dport as u32 && k.dport as u32 <= self.dport.1)
            & self.tos.is_none_or(|t| t == k.tos & 0xfc)
            & self.ipproto.is_none_or(|p| p == k.ipproto);
        m != self.invert
    }
}

/// The offsets of a flow's bit sets in the index, one per indexed selector (source,
/// destination, input link, mark, source port, destination port, uid).
pub(crate) type Sets = [usize; 7];

/// A family's rules, compiled.
#[derive(Clone, Debug)]
pub(crate) struct Rules {
    /// The rules in priority order.
    pub(crate) list: Vec<CompiledRule>,
    index: Option<Index>,
    /// The positions of the rules with a selector ([`CompiledRule::is_selective`]).
    selective: Vec<usize>,
    /// The same as a bit set of the index's shape (empty without an index).
    selective_bits: Vec<u64>,
}

impl Rules {
    /// Compiles rules (in priority order); `table` gives a table id's position among the
    /// family's compiled tables.
    pub(crate) fn compile(rules: &[Rule], table: impl Fn(u32) -> Option<usize>) -> Rules {
        let list: Vec<CompiledRule> = rules
            .iter()
            .map(|r| CompiledRule {
                src: prefix(r.src),
                dst: prefix(r.dst),
                iif: link(&r.iif),
                oif: link(&r.oif),
                mark: r.fwmark.map_or(0, |f| f.0),
                mark_mask: r.fwmark.map_or(0, |f| f.1),
                uid: range(r.uidrange),
                sport: range(r.sport),
                dport: range(r.dport),
                tos: r.tos,
                ipproto: r.ipproto,
                invert: r.invert,
                action: match r.action {
                    RuleAction::Lookup(id) => Action::Lookup {
                        id,
                        table: table(id),
                    },
                    RuleAction::Goto(p) => Action::Goto(rules.iter().position(|t| t.pref == p)),
                    RuleAction::Nop => Action::Nop,
                    RuleAction::Blackhole => Action::Blackhole,
                    RuleAction::Unreachable => Action::Unreachable,
                    RuleAction::Prohibit => Action::Prohibit,
                },
                suppress_prefixlength: r.suppress_prefixlength,
                suppress_ifgroup: r.suppress_ifgroup,
            })
            .collect();
        let index = (list.len() >= INDEX_FROM)
            .then(|| Index::build(rules.first().map_or(Family::V4, |r| r.family), rules));
        Rules::with_index(list, index)
    }

    /// Whether every walk starts by looking up table `id`: the first rule has no selector
    /// and no `suppress_*` and looks it up (IPv4's `local` rule at priority 0, unless it
    /// was deleted or moved). A walk then reaches any other table only where `id` had
    /// no answer.
    pub(crate) fn looks_up_first(&self, id: u32) -> bool {
        self.list.first().is_some_and(|r| {
            r.is_unconditional()
                && matches!(r.action, Action::Lookup { id: first, .. } if first == id)
        })
    }

    /// Rules already compiled, without an index.
    pub(crate) fn of(list: Vec<CompiledRule>) -> Rules {
        Rules::with_index(list, None)
    }

    fn with_index(list: Vec<CompiledRule>, index: Option<Index>) -> Rules {
        let selective: Vec<usize> = (0..list.len())
            .filter(|&i| list[i].is_selective())
            .collect();
        let mut selective_bits = vec![0u64; index.as_ref().map_or(0, |ix| ix.words)];
        if !selective_bits.is_empty() {
            for &i in &selective {
                selective_bits[i / 64] |= 1 << (i % 64);
            }
        }
        Rules {
            list,
            index,
            selective,
            selective_bits,
        }
    }

    /// Whether some rule has a selector.
    #[inline]
    pub(crate) fn has_selective(&self) -> bool {
        !self.selective.is_empty()
    }

    /// Whether a rule with a selector matches the flow (`sets`: its bit sets, from
    /// [`Rules::sets`]). While none does, the flow's walk is that of the rules without
    /// selectors, the same for every such flow.
    #[inline]
    pub(crate) fn any_selective_match(&self, key: &FlowKey, sets: Option<Sets>) -> bool {
        let (Some(sets), Some(ix)) = (sets, self.index.as_ref()) else {
            return self.selective.iter().any(|&i| self.list[i].matches(key));
        };
        for (w, &selective) in self.selective_bits.iter().enumerate() {
            let mut word = selective;
            for set in sets {
                word &= ix.bits[set + w];
            }
            while word != 0 {
                if self.list[w * 64 + word.trailing_zeros() as usize].matches(key) {
                    return true;
                }
                word &= word - 1;
            }
        }
        false
    }

    /// The flow's candidates, to find its matching rules in order.
    #[inline]
    pub(crate) fn candidates<'a>(&'a self, key: &'a FlowKey) -> Candidates<'a> {
        self.candidates_with(key, self.sets(key))
    }

    /// The flow's bit sets in the index (`None` without an index).
    #[inline]
    pub(crate) fn sets(&self, key: &FlowKey) -> Option<Sets> {
        self.index.as_ref().map(|ix| ix.sets(key))
    }

    /// The flow's candidates with its bit sets found before.
    #[inline]
    pub(crate) fn candidates_with<'a>(
        &'a self,
        key: &'a FlowKey,
        sets: Option<Sets>,
    ) -> Candidates<'a> {
        Candidates {
            rules: self,
            key,
            sets,
        }
    }

    /// Bytes the compiled rules and their index take.
    pub(crate) fn memory(&self) -> usize {
        self.list.len() * std::mem::size_of::<CompiledRule>()
            + self.index.as_ref().map_or(0, Index::memory)
            + self.selective.len() * std::mem::size_of::<usize>()
            + self.selective_bits.len() * 8
    }
}

/// A flow's way through the rules.
pub(crate) struct Candidates<'a> {
    rules: &'a Rules,
    key: &'a FlowKey,
    /// The offsets of the flow's bit sets in the index.
    sets: Option<Sets>,
}

impl Candidates<'_> {
    /// The first rule at or after `from` whose selectors match the flow.
    #[inline]
    pub(crate) fn next(&self, from: usize) -> Option<usize> {
        let list = &self.rules.list;
        let (Some(sets), Some(ix)) = (self.sets, self.rules.index.as_ref()) else {
            return (from..list.len()).find(|&i| list[i].matches(self.key));
        };
        let words = ix.words;
        let mut w = from / 64;
        let mut below = !0u64 << (from % 64);
        while w < words {
            let mut word = below;
            for set in sets {
                word &= ix.bits[set + w];
            }
            while word != 0 {
                let i = w * 64 + word.trailing_zeros() as usize;
                if list[i].matches(self.key) {
                    return Some(i);
                }
                word &= word - 1;
            }
            w += 1;
            below = !0;
        }
        None
    }
}

/// An LPM structure over the rules' prefixes of one selector.
#[derive(Clone, Debug)]
enum PrefixIndex {
    /// No rule selects by this prefix: every address has the set of no prefix.
    Unused,
    V4(Ipv4Table),
    V6(Ipv6Table),
}

/// The bit sets of the rules each selector value lets through.
#[derive(Clone, Debug)]
struct Index {
    /// Words of one set.
    words: usize,
    /// All sets, one after the other; a set is named by the offset of its first word.
    bits: Vec<u64>,
    src: PrefixIndex,
    /// The set of a source no rule prefix holds.
    src_none: usize,
    dst: PrefixIndex,
    dst_none: usize,
    /// The set of each input link (by index; past the end, or `usize::MAX`: `iif_none`).
    iif: Vec<usize>,
    iif_none: usize,
    /// The sets of marks that rules select with a full mask, by mark.
    marks: Vec<(u32, usize)>,
    marks_none: usize,
    /// Source port, destination port, uid.
    ranges: [RangeIndex; 3],
}

/// A range selector's sets: the values cut into intervals at every rule range's ends, each
/// interval with the set of rules whose range holds it (and those with no range).
#[derive(Clone, Debug)]
struct RangeIndex {
    /// The first value of every interval but the first (which starts at 0).
    starts: Vec<u32>,
    /// Each interval's set.
    sets: Vec<usize>,
}

impl RangeIndex {
    #[inline]
    fn set(&self, v: u32) -> usize {
        self.sets[self.starts.partition_point(|&s| s <= v)]
    }
}

/// The range selectors the index keys: source port, destination port, uid.
fn range_selector(r: &Rule, which: usize) -> Option<(u32, u32)> {
    let sel = match which {
        0 => r.sport,
        1 => r.dport,
        _ => r.uidrange,
    };
    sel.filter(|_| !r.invert).map(|x| (x.start, x.end))
}

impl Index {
    fn build(family: Family, rules: &[Rule]) -> Index {
        let words = rules.len().div_ceil(64);
        let mut bits: Vec<u64> = Vec::new();
        // Adds the set of the rules `keep` lets through; returns its offset.
        let mut add = |keep: &dyn Fn(&Rule) -> bool| {
            let at = bits.len();
            bits.resize(at + words, 0);
            for (i, r) in rules.iter().enumerate() {
                if keep(r) {
                    bits[at + i / 64] |= 1 << (i % 64);
                }
            }
            at
        };
        // A prefix selector: one set per distinct prefix, found by LPM.
        let mut prefix_index = |sel: &dyn Fn(&Rule) -> Option<Net>| {
            let mut nets: Vec<Net> = rules.iter().filter(|r| !r.invert).filter_map(sel).collect();
            nets.sort();
            nets.dedup();
            let none = add(&|r: &Rule| r.invert || sel(r).is_none());
            let sets: Vec<usize> = nets
                .iter()
                .map(|n| add(&|r: &Rule| r.invert || sel(r).is_none_or(|s| s.covers(n))))
                .collect();
            let entries = nets.iter().zip(&sets);
            let table = match family {
                _ if nets.is_empty() => PrefixIndex::Unused,
                Family::V4 => PrefixIndex::V4(Ipv4Table::build(
                    entries.map(|(n, s)| (n.v4().expect("an IPv4 rule's prefix"), *s as u32)),
                )),
                Family::V6 => PrefixIndex::V6(Ipv6Table::build(
                    entries.map(|(n, s)| (n.v6().expect("an IPv6 rule's prefix"), *s as u32)),
                )),
            };
            (table, none)
        };
        let (src, src_none) = prefix_index(&|r: &Rule| r.src);
        let (dst, dst_none) = prefix_index(&|r: &Rule| r.dst);
        // The input link.
        let iif_of = |r: &Rule| match link(&r.iif) {
            LinkSelector::Link(l) if !r.invert => Some(l),
            _ => None,
        };
        let iif_any = |r: &Rule| r.invert || r.iif.is_none();
        let iif_none = add(&iif_any);
        let mut links: Vec<LinkIndex> = rules.iter().filter_map(iif_of).collect();
        links.sort();
        links.dedup();
        let mut iif = vec![iif_none; links.last().map_or(0, |&l| l as usize + 1)];
        for l in links {
            iif[l as usize] = add(&|r: &Rule| iif_any(r) || iif_of(r) == Some(l));
        }
        // Exact marks.
        let mark_of = |r: &Rule| match r.fwmark {
            Some((mark, u32::MAX)) if !r.invert => Some(mark),
            _ => None,
        };
        let mark_any = |r: &Rule| mark_of(r).is_none();
        let marks_none = add(&mark_any);
        let mut values: Vec<u32> = rules.iter().filter_map(mark_of).collect();
        values.sort();
        values.dedup();
        let marks = values
            .into_iter()
            .map(|m| (m, add(&|r: &Rule| mark_any(r) || mark_of(r) == Some(m))))
            .collect();
        let ranges = [0, 1, 2].map(|which| {
            let mut starts: Vec<u32> = rules
                .iter()
                .filter_map(|r| range_selector(r, which))
                .flat_map(|(a, b)| [Some(a), b.checked_add(1)])
                .flatten()
                .filter(|&v| v > 0)
                .collect();
            starts.sort_unstable();
            starts.dedup();
            let sets = std::iter::once(0)
                .chain(starts.iter().copied())
                .map(|v| {
                    add(&|r: &Rule| range_selector(r, which).is_none_or(|(a, b)| a <= v && v <= b))
                })
                .collect();
            RangeIndex { starts, sets }
        });
        Index {
            words,
            bits,
            src,
            src_none,
            dst,
            dst_none,
            iif,
            iif_none,
            marks,
            marks_none,
            ranges,
        }
    }

    fn prefix_set(index: &PrefixIndex, none: usize, addr: u128) -> usize {
        let found = match index {
            PrefixIndex::Unused => None,
            PrefixIndex::V4(t) => t.lookup(addr as u32),
            PrefixIndex::V6(t) => t.lookup(addr),
        };
        found.map_or(none, |s| s as usize)
    }

    #[inline]
    fn sets(&self, k: &FlowKey) -> Sets {
        [
            Self::prefix_set(&self.src, self.src_none, k.src),
            Self::prefix_set(&self.dst, self.dst_none, k.dst),
            self.iif
                .get(k.iif as usize)
                .copied()
                .unwrap_or(self.iif_none),
            self.marks
                .binary_search_by_key(&k.mark, |m| m.0)
                .map_or(self.marks_none, |i| self.marks[i].1),
            self.ranges[0].set(k.sport as u32),
            self.ranges[1].set(k.dport as u32),
            self.ranges[2].set(k.uid),
        ]
    }

    fn memory(&self) -> usize {
        let lpm = |p: &PrefixIndex| {
            let m = match p {
                PrefixIndex::Unused => return 0,
                PrefixIndex::V4(t) => t.memory(),
                PrefixIndex::V6(t) => t.memory(),
            };
            m.lookup_bytes + m.update_bytes
        };
        self.bits.len() * 8
            + lpm(&self.src)
            + lpm(&self.dst)
            + self.iif.len() * 8
            + self.marks.len() * 16
            + self
                .ranges
                .iter()
                .map(|r| r.starts.len() * 4 + r.sets.len() * 8)
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::{Range, RuleLink};
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::net::IpAddr;

    fn net(rng: &mut SmallRng, family: Family) -> Net {
        let (addr, len): (IpAddr, u8) = match family {
            Family::V4 => (
                IpAddr::from([10, rng.gen_range(0..4), rng.gen_range(0..4), rng.gen()]),
                *[0, 8, 12, 16, 20, 24, 32].get(rng.gen_range(0..7)).unwrap(),
            ),
            Family::V6 => (
                IpAddr::from([
                    0x2001,
                    0xdb8,
                    rng.gen_range(0..4),
                    rng.gen_range(0..4),
                    0,
                    0,
                    0,
                    1,
                ]),
                *[0, 32, 40, 48, 64, 128].get(rng.gen_range(0..6)).unwrap(),
            ),
        };
        Net::new(addr, len).unwrap()
    }

    fn rule(rng: &mut SmallRng, family: Family, pref: u32) -> Rule {
        let mut r = Rule::new(family, pref, RuleAction::Nop);
        r.invert = rng.gen_bool(0.1);
        if rng.gen_bool(0.4) {
            r.src = Some(net(rng, family));
        }
        if rng.gen_bool(0.4) {
            r.dst = Some(net(rng, family));
        }
        if rng.gen_bool(0.2) {
            let index = [Some(1), Some(2), Some(7), None][rng.gen_range(0..4)];
            r.iif = Some(RuleLink {
                name: "x".into(),
                index,
            });
        }
        if rng.gen_bool(0.1) {
            r.oif = Some(RuleLink {
                name: "y".into(),
                index: Some(2),
            });
        }
        if rng.gen_bool(0.3) {
            let mask = [u32::MAX, 0xf0, 0][rng.gen_range(0..3)];
            r.fwmark = Some((rng.gen_range(0..4) & mask, mask));
        }
        if rng.gen_bool(0.1) {
            r.tos = Some(0x10);
        }
        if rng.gen_bool(0.1) {
            r.ipproto = Some(6);
        }
        if rng.gen_bool(0.1) {
            r.dport = Some(Range { start: 80, end: 90 });
        }
        if rng.gen_bool(0.2) {
            let start = rng.gen_range(0..1000);
            r.sport = Some(Range {
                start,
                end: start + rng.gen_range(0..3),
            });
        }
        if rng.gen_bool(0.1) {
            r.uidrange = Some(Range {
                start: 1000,
                end: 1999,
            });
        }
        r
    }

    fn key(rng: &mut SmallRng, family: Family) -> FlowKey {
        let mut q = Query::to(net(rng, family).addr());
        if rng.gen_bool(0.7) {
            q.src = Some(net(rng, family).addr());
        }
        q.mark = rng.gen_range(0..4);
        q.tos = [0, 0x10][rng.gen_range(0..2)];
        q.ipproto = [0, 6, 17][rng.gen_range(0..3)];
        q.dport = [0, 80, 85, 443][rng.gen_range(0..4)];
        q.uid = [0, 1500][rng.gen_range(0..2)];
        q.sport = [0, 1, 999, 1001, rng.gen_range(0..1003)][rng.gen_range(0..5)];
        let oif = [None, Some(2), Some(3)][rng.gen_range(0..3)];
        FlowKey::new(&q, oif, rng.gen_range(0..9))
    }

    /// The index finds, from every position, the same next matching rule as testing the
    /// rules one by one; and a rule matches as the selectors say.
    #[test]
    fn the_index_finds_the_rules_a_plain_walk_finds() {
        let mut checked = 0;
        for seed in 0..40u64 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let family = if seed % 2 == 0 {
                Family::V4
            } else {
                Family::V6
            };
            let n = [INDEX_FROM, 63, 64, 65, 300][seed as usize % 5];
            let rules: Vec<Rule> = (0..n).map(|i| rule(&mut rng, family, i as u32)).collect();
            let compiled = Rules::compile(&rules, |_| None);
            assert!(compiled.index.is_some());
            let plain = Rules::of(compiled.list.clone());
            for _ in 0..300 {
                let k = key(&mut rng, family);
                let (a, b) = (compiled.candidates(&k), plain.candidates(&k));
                for from in 0..=n {
                    assert_eq!(
                        a.next(from),
                        b.next(from),
                        "seed {seed}, from {from}, {k:?}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 1_000_000);
    }

    #[test]
    fn a_rule_matches_as_its_selectors_say() {
        let mut r = Rule::new(Family::V4, 5, RuleAction::Nop);
        r.src = Some(Net::parse("10.1.0.0/16", None).unwrap());
        r.fwmark = Some((0x10, 0xf0));
        let c = Rules::compile(std::slice::from_ref(&r), |_| None);
        let mut q = Query::to("192.0.2.1".parse().unwrap());
        q.src = Some("10.1.2.3".parse().unwrap());
        q.mark = 0x1f;
        assert!(c.list[0].matches(&FlowKey::new(&q, None, 1)));
        q.mark = 0x20;
        assert!(!c.list[0].matches(&FlowKey::new(&q, None, 1)));
        q.mark = 0x10;
        q.src = Some("10.2.0.1".parse().unwrap());
        assert!(!c.list[0].matches(&FlowKey::new(&q, None, 1)));
        r.invert = true;
        let c = Rules::compile(std::slice::from_ref(&r), |_| None);
        assert!(c.list[0].matches(&FlowKey::new(&q, None, 1)));
    }
}
