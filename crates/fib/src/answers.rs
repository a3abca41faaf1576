//! The forwarding lookup's structure: each destination prefix's answer to a flow with no
//! output link ([`DestAnswer`]) encoded as the value of an LPM structure
//! ([`AnswerTable`]), with the hops and path sets the answers name, so that the common
//! lookup is one search; and a filter of addresses that says with one load that an
//! address is surely not among a set ([`AddrFilter`]).

use crate::hop::Hop;
use crate::net::{Family, Net};
use crate::nexthop::NexthopId;
use crate::query::NoRoute;
use crate::route::{Path, RouteType};
use fibre_lpm::{Ipv4Table, Ipv6Table};
use std::collections::HashMap;
use std::net::IpAddr;

/// What a node answers a flow with no output link, decided when the snapshot is compiled:
/// every such flow whose longest match is the node gets the same answer, whatever else it
/// carries, unless the answer depends on the flow ([`DestAnswer::Flow`]). This is what lets a
/// forwarding lookup go from the LPM search straight to its hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DestAnswer {
    /// No route here or above: the walk goes on with the next rule.
    Miss,
    /// A `throw` route: the walk goes on.
    Thrown,
    /// A reject route answers with its error.
    Reject(NoRoute),
    /// A route with one usable path: hop `hop` of the table, from a prefix `len` long.
    One { hop: u32, len: u8 },
    /// A route with several usable paths, `multi[start..start + count]`.
    Multi { start: u32, count: u16, len: u8 },
    /// It depends on the flow (routes for one TOS, IPv6 source routes, broadcast): the
    /// full lookup decides.
    Flow,
}

/// Bits of a [`DestAnswer`] code's payload (a hop or the start of multipath paths).
pub(crate) const ANSWER_PAYLOAD: u32 = 19;

impl DestAnswer {
    /// The answer as an LPM value (at most [`fibre_lpm::MAX_VALUE`]): a 3-bit kind, the
    /// prefix length (8 bits) and a 19-bit payload. Multipath answers keep their paths' count in the table's `multi` (the
    /// entry at `start` holds it); answers too large to encode depend on the flow.
    fn encode(self) -> u32 {
        let code = |kind: u32, len: u8, payload: u32| {
            if payload >= 1 << ANSWER_PAYLOAD {
                5 << 27
            } else {
                kind << 27 | (len as u32) << ANSWER_PAYLOAD | payload
            }
        };
        match self {
            DestAnswer::One { hop, len } => code(0, len, hop),
            DestAnswer::Multi { start, len, .. } => code(1, len, start),
            DestAnswer::Miss => code(2, 0, 0),
            DestAnswer::Thrown => code(3, 0, 0),
            DestAnswer::Reject(e) => code(4, 0, e as u32),
            DestAnswer::Flow => code(5, 0, 0),
        }
    }

    /// The hop of a code whose answer is [`DestAnswer::One`], without decoding the rest.
    #[inline]
    pub(crate) fn one_hop(code: u32) -> Option<u32> {
        (code >> 27 == 0).then_some(code & ((1 << ANSWER_PAYLOAD) - 1))
    }

    /// The answer of a code made by [`DestAnswer::encode`] (a multipath answer's count is 0:
    /// the table's `multi` holds it).
    #[inline]
    pub(crate) fn decode(code: u32) -> DestAnswer {
        let payload = code & ((1 << ANSWER_PAYLOAD) - 1);
        let len = (code >> ANSWER_PAYLOAD & 0xff) as u8;
        match code >> 27 {
            0 => DestAnswer::One { hop: payload, len },
            1 => DestAnswer::Multi {
                start: payload,
                count: 0,
                len,
            },
            2 => DestAnswer::Miss,
            3 => DestAnswer::Thrown,
            4 => DestAnswer::Reject(NoRoute::from_code(payload)),
            _ => DestAnswer::Flow,
        }
    }
}

/// The LPM structure of the forwarding lookup: each destination prefix's answer to a flow
/// with no output link (see [`DestAnswer`]), encoded in the value, so that the search gives the
/// answer with no further memory access but to the hop it names.
#[derive(Clone, Debug, Default)]
pub(crate) struct AnswerTable {
    v4: Option<Ipv4Table>,
    v6: Option<Ipv6Table>,
    /// The distinct hops the answers point at (a table's routes share a few).
    pub(crate) hops: Vec<Hop>,
    /// Each hop's output link if it is of a unicast route, else 0 (no link's index): an
    /// IPv4 flow arriving on that link and sent back out of it has its source looked up
    /// (`Snapshot::sends_back`). Dense, for the hop pass's gathers (`quick`).
    pub(crate) backs: Vec<u32>,
    /// The paths of answers with several: hop and weight (the first entry of each answer's
    /// run holds the count).
    pub(crate) multi: Vec<(u32, u16)>,
    /// The nexthop object each hop goes through, if any (see [`ObjectHop`]).
    objects: Vec<Option<NexthopId>>,
    /// Each hop's number in `hops`, so that answers through the same hop share it.
    /// (Hashed by `foldhash`: every answer of a table is numbered here as it is compiled,
    /// and the standard SipHash took a tenth of a full table's compile.)
    numbers: HashMap<ObjectHop, u32, foldhash::fast::RandomState>,
    /// Each list of paths' start in `multi`, so that answers with the same paths share it.
    lists: HashMap<Vec<(u32, u16)>, u32, foldhash::fast::RandomState>,
}

/// Takes prefixes `dsts` out of a family's pair of LPM structures, in one batch each.
pub(crate) fn remove_all(v4: &mut Option<Ipv4Table>, v6: &mut Option<Ipv6Table>, dsts: &[Net]) {
    let (v4_dsts, v6_dsts) = crate::net::by_family(dsts);
    if let (Some(t), false) = (v4, v4_dsts.is_empty()) {
        t.remove_many(&v4_dsts);
    }
    if let (Some(t), false) = (v6, v6_dsts.is_empty()) {
        t.remove_many(&v6_dsts);
    }
}

/// A hop's entry in [`AnswerTable::backs`]: its output link if it is of a unicast route,
/// else 0.
fn back_of(hop: &Hop) -> u32 {
    if hop.kind == RouteType::Unicast {
        hop.dev
    } else {
        0
    }
}

/// A hop as a [`AnswerTable`] numbers it: with the nexthop object its route goes through,
/// if any. The hops of an object's routes are theirs alone, so that when the object comes
/// to stand for another single path, its hops are rewritten in place
/// ([`AnswerTable::follow_object`]) rather than the answers of every route that uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ObjectHop {
    /// The hop.
    pub(crate) hop: Hop,
    /// The nexthop object of the route it was made from.
    pub(crate) object: Option<NexthopId>,
}

/// A prefix's answer with its hops themselves rather than their numbers in a
/// [`AnswerTable`]: what is decided before the table numbers them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Unnumbered {
    /// The answer of the next shorter prefix (a node none of whose routes answers).
    Up,
    /// An answer with no hop.
    Fixed(DestAnswer),
    /// One path, from a prefix this long.
    One(ObjectHop, u8),
    /// Several paths (hop and weight), from a prefix this long.
    Multi(Vec<(ObjectHop, u16)>, u8),
}

impl AnswerTable {
    /// The number of `hop` among the table's hops (a new one is added).
    fn number(&mut self, hop: ObjectHop) -> u32 {
        if let Some(&n) = self.numbers.get(&hop) {
            return n;
        }
        let n = self.hops.len() as u32;
        self.hops.push(hop.hop);
        self.backs.push(back_of(&hop.hop));
        self.objects.push(hop.object);
        self.numbers.insert(hop, n);
        n
    }

    /// Nexthop object `object` now stands for the single path `path` (it stood for a single
    /// path before too): each hop through it is made again through `path` by `remake` (its
    /// route's type, table and MTU kept). Every answer naming such a hop is then the answer
    /// the routes give through the new path: a route's selection depends on its paths only
    /// by whether one is alive, and one was and is.
    pub(crate) fn follow_object(
        &mut self,
        object: NexthopId,
        path: &Path,
        remake: impl Fn(&Hop, &Path) -> Hop,
    ) {
        for n in 0..self.hops.len() {
            if self.objects[n] != Some(object) {
                continue;
            }
            let old = ObjectHop {
                hop: self.hops[n],
                object: Some(object),
            };
            let new = ObjectHop {
                hop: remake(&old.hop, path),
                object: Some(object),
            };
            if self.numbers.get(&old) == Some(&(n as u32)) {
                self.numbers.remove(&old);
            }
            self.numbers.insert(new, n as u32);
            self.hops[n] = new.hop;
            self.backs[n] = back_of(&new.hop);
        }
    }

    /// The answer `u` with its hops numbered in this table; `up` is the answer of the
    /// next shorter prefix.
    pub(crate) fn numbered(&mut self, u: Unnumbered, up: DestAnswer) -> DestAnswer {
        match u {
            Unnumbered::Up => up,
            Unnumbered::Fixed(p) => p,
            Unnumbered::One(hop, len) => DestAnswer::One {
                hop: self.number(hop),
                len,
            },
            Unnumbered::Multi(paths, len) => {
                let count = paths.len();
                let list: Vec<(u32, u16)> = paths
                    .into_iter()
                    .map(|(h, w)| (self.number(h), w))
                    .collect();
                let start = match self.lists.get(&list) {
                    Some(&start) => start,
                    None => {
                        // The first entry holds the count, the paths follow.
                        let start = self.multi.len() as u32;
                        self.multi.push((count as u32, 0));
                        self.multi.extend_from_slice(&list);
                        self.lists.insert(list, start);
                        start
                    }
                };
                DestAnswer::Multi {
                    start,
                    count: count as u16,
                    len,
                }
            }
        }
    }

    /// The hops of answer `p` of this table, as [`Unnumbered`] (`Miss` and `Thrown` are
    /// kept as they are).
    pub(crate) fn unnumbered(&self, p: DestAnswer) -> Unnumbered {
        match p {
            DestAnswer::One { hop, len } => Unnumbered::One(self.object_hop(hop), len),
            DestAnswer::Multi { start, len, .. } => {
                let start = start as usize;
                let count = self.multi[start].0 as usize;
                Unnumbered::Multi(
                    self.multi[start + 1..start + 1 + count]
                        .iter()
                        .map(|&(hop, weight)| (self.object_hop(hop), weight))
                        .collect(),
                    len,
                )
            }
            other => Unnumbered::Fixed(other),
        }
    }

    /// Hop number `n` with its object.
    fn object_hop(&self, n: u32) -> ObjectHop {
        ObjectHop {
            hop: self.hops[n as usize],
            object: self.objects[n as usize],
        }
    }

    /// Makes the LPM structure of `answers`, each a destination prefix's, all of one
    /// family (the hops they name numbered already).
    pub(crate) fn fill(
        &mut self,
        family: Family,
        answers: impl Iterator<Item = (Net, DestAnswer)>,
    ) {
        let codes = answers.map(|(d, p)| (d, p.encode()));
        match family {
            Family::V4 => {
                self.v4 = Some(Ipv4Table::build(
                    codes.map(|(d, c)| (d.v4().expect("IPv4"), c)),
                ))
            }
            Family::V6 => {
                self.v6 = Some(Ipv6Table::build(
                    codes.map(|(d, c)| (d.v6().expect("IPv6"), c)),
                ))
            }
        }
    }

    /// Sets the answer of prefix `dst` (`None`: it has none, the search takes a shorter
    /// prefix's).
    pub(crate) fn set(&mut self, dst: Net, answer: Option<DestAnswer>) {
        match (dst.v4(), dst.v6()) {
            (Some(p), _) => {
                let t = self.v4.get_or_insert_with(Ipv4Table::new);
                match answer {
                    Some(a) => t.insert(p, a.encode()),
                    None => t.remove(&p),
                };
            }
            (_, Some(p)) => {
                let t = self.v6.get_or_insert_with(Ipv6Table::new);
                match answer {
                    Some(a) => t.insert(p, a.encode()),
                    None => t.remove(&p),
                };
            }
            _ => {}
        }
    }

    /// Takes the answers of prefixes `dsts` out, as [`AnswerTable::set`] to `None` does
    /// for each, in one batch (each node of the search they share changed once).
    pub(crate) fn unset_all(&mut self, dsts: &[Net]) {
        remove_all(&mut self.v4, &mut self.v6, dsts);
    }

    /// Whether the table has numbered so many hops or paths that patches should give way
    /// to a fresh compile, which numbers only those in use.
    pub(crate) fn numbers_run_short(&self) -> bool {
        self.hops.len() >= 1 << (ANSWER_PAYLOAD - 1)
            || self.multi.len() >= 1 << (ANSWER_PAYLOAD - 1)
    }

    /// The answer for `dst`.
    #[inline]
    pub(crate) fn plain(&self, dst: IpAddr) -> DestAnswer {
        let code = match dst {
            IpAddr::V4(a) => self.v4.as_ref().and_then(|t| t.lookup(u32::from(a))),
            IpAddr::V6(a) => self.v6.as_ref().and_then(|t| t.lookup(u128::from(a))),
        };
        code.map_or(DestAnswer::Miss, DestAnswer::decode)
    }

    /// The hop of an IPv4 destination whose answer is one hop, without decoding the rest.
    #[inline]
    pub(crate) fn one_hop_v4(&self, dst: u32) -> Option<u32> {
        let code = self.v4.as_ref()?.lookup(dst)?;
        DestAnswer::one_hop(code).filter(|&h| (h as usize) < self.hops.len())
    }

    /// [`AnswerTable::one_hop_v4`] for an IPv6 destination.
    #[inline]
    pub(crate) fn one_hop_v6(&self, dst: u128) -> Option<u32> {
        let code = self.v6.as_ref()?.lookup(dst)?;
        DestAnswer::one_hop(code).filter(|&h| (h as usize) < self.hops.len())
    }

    /// The answers' codes for many destinations of one family, as bits (IPv4 in the low 32).
    pub(crate) fn lookup_batch(
        &self,
        family: Family,
        keys4: &[u32],
        keys6: &[u128],
        out: &mut [Option<u32>],
    ) {
        match family {
            Family::V4 => match &self.v4 {
                Some(lpm) => lpm.lookup_batch(keys4, out),
                None => out[..keys4.len()].fill(None),
            },
            Family::V6 => match &self.v6 {
                Some(lpm) => lpm.lookup_batch(keys6, out),
                None => out[..keys6.len()].fill(None),
            },
        }
    }

    pub(crate) fn memory(&self) -> usize {
        let bytes = |m: fibre_lpm::MemoryUsage| m.lookup_bytes + m.update_bytes;
        self.v4.as_ref().map_or(0, |t| bytes(t.memory()))
            + self.v6.as_ref().map_or(0, |t| bytes(t.memory()))
            + self.hops.len() * std::mem::size_of::<Hop>()
            + self.backs.len() * 4
            + self.objects.len() * std::mem::size_of::<Option<NexthopId>>()
            + self.multi.len() * 8
            + self.numbers.len() * (std::mem::size_of::<ObjectHop>() + 4)
            + self.lists.keys().map(|l| l.len() * 8 + 32).sum::<usize>()
    }
}

/// A set of IPv4 addresses that can say "surely not in it" with one load: a bit for each
/// of 1,024 hash buckets, set where some address of the set falls. What it may hold is
/// looked for in the set itself.
#[derive(Debug, Default, Clone)]
pub(crate) struct AddrFilter {
    words: [u32; AddrFilter::WORDS],
}

impl AddrFilter {
    /// Bits of a bucket's number.
    pub(crate) const BUCKET_BITS: u32 = 10;
    /// The multiplier of the hash (Fibonacci hashing: its top bits are the bucket).
    pub(crate) const MULTIPLIER: u32 = 0x9e37_79b1;
    const WORDS: usize = (1 << Self::BUCKET_BITS) / 32;

    #[inline]
    fn bucket(a: u32) -> usize {
        (a.wrapping_mul(Self::MULTIPLIER) >> (32 - Self::BUCKET_BITS)) as usize
    }

    pub(crate) fn insert(&mut self, a: u32) {
        let b = Self::bucket(a);
        self.words[b / 32] |= 1 << (b % 32);
    }

    /// Whether `a` may be in the set (false: it surely is not).
    #[inline]
    pub(crate) fn may_hold(&self, a: u32) -> bool {
        let b = Self::bucket(a);
        self.words[b / 32] & 1 << (b % 32) != 0
    }

    /// The filter's bits: bucket `b` is bit `b % 32` of word `b / 32`.
    #[inline]
    pub(crate) fn words(&self) -> &[u32; AddrFilter::WORDS] {
        &self.words
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_answers_survive_their_encoding_as_lpm_values() {
        let max = (1 << ANSWER_PAYLOAD) - 1;
        let cases = [
            DestAnswer::One { hop: 0, len: 0 },
            DestAnswer::One { hop: max, len: 128 },
            DestAnswer::Multi {
                start: 7,
                count: 0,
                len: 24,
            },
            DestAnswer::Miss,
            DestAnswer::Thrown,
            DestAnswer::Reject(NoRoute::Prohibited),
            DestAnswer::Reject(NoRoute::NoDevice),
            DestAnswer::Flow,
        ];
        for p in cases {
            let code = p.encode();
            assert!(code <= fibre_lpm::MAX_VALUE, "{p:?}");
            assert_eq!(DestAnswer::decode(code), p);
        }
        // A hop past the payload's reach leaves the answer to the full lookup.
        let far = DestAnswer::One {
            hop: max + 1,
            len: 8,
        };
        assert_eq!(DestAnswer::decode(far.encode()), DestAnswer::Flow);
    }
}
