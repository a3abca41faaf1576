//! Lookups of vectors of flows as a packet path holds them, answered as a packet path
//! consumes them: one `u32` a flow.
//!
//! A packet path reads a vector of packets from one link; [`FlowVector`] is their
//! addresses side by side, and [`Snapshot::lookup_vector_v4`] and
//! [`Snapshot::lookup_vector_v6`] answer it without building a [`Query`] per flow (reading
//! 64-byte queries had cost about as much as the search). The whole query is built only
//! for a flow that needs more than its addresses.
//!
//! The answers are [`VectorAnswers`]: for each flow a `u32` id, as the LPM search itself
//! gives a `u32` a key. Most ids name a hop of the one table the flows were searched in,
//! so that the answer of a flow the search decided is the search's own value, copied 64
//! at a time; the few answers the general way made (and errors) are kept beside them and
//! named by ids from [`VectorAnswers::OTHER`] up. Answering each flow with a 40-byte
//! `Result<HopRef, NoRoute>` had cost a quarter of the search again, in writes and in the
//! consumer's reads, as the `flow_instructions` example counted.

use crate::forward::{AlikeBatch, AlikePlan};
use crate::hop::{Hop, HopRef};
use crate::layout::Snapshot;
use crate::link::LinkIndex;
use crate::net::Family;
use crate::query::BATCH;
use crate::query::{NoRoute, Query};
use crate::quick;
use std::net::{Ipv4Addr, Ipv6Addr};

/// A vector of flows of one family as a packet path holds it: arriving on one link (or
/// sent by this host), each flow's destination and source side by side, as they are
/// read out of the packets' headers. [`Snapshot::lookup_vector_v4`] and
/// [`Snapshot::lookup_vector_v6`] answer it.
#[derive(Clone, Copy, Debug)]
pub struct FlowVector<'a, A> {
    /// The link the flows arrive on; `None`: this host sends them.
    pub iif: Option<LinkIndex>,
    /// Each flow's destination.
    pub dst: &'a [A],
    /// Each flow's source, or none given (empty).
    pub src: &'a [A],
}

impl<A> FlowVector<'_, A> {
    /// The number of flows, once the sources are checked to fit.
    fn check(&self) -> usize {
        let n = self.dst.len();
        assert!(
            self.src.is_empty() || self.src.len() == n,
            "one source for each flow, or none"
        );
        n
    }
}

/// The answers of a vector lookup ([`Snapshot::lookup_vector_v4`],
/// [`Snapshot::lookup_vector_v6`]): flow `i`'s answer is named by `ids()[i]`. An id below
/// [`VectorAnswers::OTHER`] is the index of a hop in [`VectorAnswers::hops`], the table
/// the flows were searched in (most answers: a packet path groups its packets by it, as
/// by an adjacency index); an id from `OTHER` up names an answer made for its flow (an
/// error, or a hop the general way found). Reused from vector to vector
/// ([`VectorAnswers::recycle`]), it allocates only while it grows.
#[derive(Default)]
pub struct VectorAnswers<'s> {
    /// The hops the ids below `OTHER` index.
    hops: &'s [Hop],
    /// Each flow's answer id.
    ids: Vec<u32>,
    /// The answers ids from `OTHER` up name, in order.
    others: Vec<Result<Hop, NoRoute>>,
    /// The lookup's room for a batch, made once (2 kB that each call had filled).
    scratch: Option<Box<Scratch>>,
}

impl std::fmt::Debug for VectorAnswers<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// A batch's queries, keys and what the passes around its search found.
struct Scratch {
    /// The whole queries of a batch that takes the general way.
    flows: Vec<Query>,
    keys: Keys,
    alike: AlikeBatch,
}

/// A batch's addresses as the search takes them.
struct Keys {
    dst4: [u32; BATCH],
    src4: [u32; BATCH],
    dst6: [u128; BATCH],
}

impl<'s> VectorAnswers<'s> {
    /// The first id that names an answer made for its flow rather than a hop of
    /// [`VectorAnswers::hops`].
    pub const OTHER: u32 = 1 << 31;

    /// No answers yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same buffers, emptied, for answers of another snapshot (or the same one).
    pub fn recycle<'t>(mut self) -> VectorAnswers<'t> {
        self.ids.clear();
        self.others.clear();
        VectorAnswers {
            hops: &[],
            ids: self.ids,
            others: self.others,
            scratch: self.scratch,
        }
    }

    /// The number of flows answered.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether no flow was answered.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Each flow's answer id.
    #[inline]
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The hops ids below [`VectorAnswers::OTHER`] index: the searched table's, shared
    /// by every vector searched in it.
    #[inline]
    pub fn hops(&self) -> &'s [Hop] {
        self.hops
    }

    /// The answer an id of these answers names.
    ///
    /// # Panics
    /// If `id` is not one of [`VectorAnswers::ids`].
    #[inline]
    pub fn answer(&self, id: u32) -> Result<&Hop, NoRoute> {
        if id < Self::OTHER {
            Ok(&self.hops[id as usize])
        } else {
            self.others[(id - Self::OTHER) as usize]
                .as_ref()
                .map_err(|&e| e)
        }
    }

    /// Flow `i`'s answer.
    ///
    /// # Panics
    /// If there is no flow `i`.
    #[inline]
    pub fn get(&self, i: usize) -> Result<&Hop, NoRoute> {
        self.answer(self.ids[i])
    }

    /// Each flow's answer, in order.
    pub fn iter(&self) -> impl Iterator<Item = Result<&Hop, NoRoute>> + '_ {
        self.ids.iter().map(|&id| self.answer(id))
    }

    /// Ready for `n` answers, ids below `OTHER` indexing `hops` (every id is written
    /// again: only new ones are cleared); the room for a batch.
    fn reset(
        &mut self,
        hops: &'s [Hop],
        n: usize,
    ) -> (&mut [u32], &mut Vec<Result<Hop, NoRoute>>, &mut Scratch) {
        self.hops = hops;
        self.ids.truncate(n);
        self.ids.resize(n, 0);
        self.others.clear();
        let scratch = self.scratch.get_or_insert_with(|| {
            Box::new(Scratch {
                flows: Vec::with_capacity(BATCH),
                keys: Keys {
                    dst4: [0; BATCH],
                    src4: [0; BATCH],
                    dst6: [0; BATCH],
                },
                alike: AlikeBatch::new(),
            })
        });
        (&mut self.ids, &mut self.others, scratch)
    }
}

/// The id of an answer made for its flow, kept in `others`.
fn other(others: &mut Vec<Result<Hop, NoRoute>>, answer: Result<HopRef<'_>, NoRoute>) -> u32 {
    others.push(answer.map(Hop::from));
    VectorAnswers::OTHER + (others.len() - 1) as u32
}

/// The body of [`Snapshot::lookup_vector_v4`].
pub(crate) fn lookup_vector_v4<'s>(
    snap: &'s Snapshot,
    v: &FlowVector<'_, Ipv4Addr>,
    flow: impl Fn(usize) -> Query,
    out: &mut VectorAnswers<'s>,
) {
    let n = v.check();
    let quick = snap
        .alike_way(Family::V4, v.iif)
        .filter(|way| way.c.input.is_some() == (v.src.len() == n));
    lookup_vector(snap, n, quick, flow, out, |way, at, keys, alike, flow| {
        let m = alike.n;
        quick::keys_v4(snap.cpu, &v.dst[at..at + m], &mut keys.dst4);
        if way.c.input.is_some() {
            quick::keys_v4(snap.cpu, &v.src[at..at + m], &mut keys.src4);
        }
        snap.alike_v4(way, &keys.dst4, &keys.src4, flow, alike)
    });
}

/// The body of [`Snapshot::lookup_vector_v6`].
pub(crate) fn lookup_vector_v6<'s>(
    snap: &'s Snapshot,
    v: &FlowVector<'_, Ipv6Addr>,
    flow: impl Fn(usize) -> Query,
    out: &mut VectorAnswers<'s>,
) {
    let n = v.check();
    let quick = snap.alike_way(Family::V6, v.iif);
    lookup_vector(snap, n, quick, flow, out, |way, at, keys, alike, flow| {
        quick::keys_v6(snap.cpu, &v.dst[at..at + alike.n], &mut keys.dst6);
        snap.alike_v6(way, &keys.dst6, flow, alike)
    });
}

/// The `n` flows of a vector, batch by batch: through the passes of flows alike where
/// `quick` allows (`passes(way, at, keys, alike, flow)` converts the addresses of the
/// batch from flow `at` on, `alike.n` of them, and runs them: `false` where the batch
/// is not mostly alike), else the general way.
fn lookup_vector<'s>(
    snap: &'s Snapshot,
    n: usize,
    quick: Option<AlikePlan<'s>>,
    flow: impl Fn(usize) -> Query,
    out: &mut VectorAnswers<'s>,
    passes: impl Fn(&AlikePlan<'s>, usize, &mut Keys, &mut AlikeBatch, &dyn Fn(usize) -> Query) -> bool,
) {
    let (ids, others, room) = out.reset(quick.as_ref().map_or(&[], |w| &w.plain().hops), n);
    let Scratch { flows, keys, alike } = room;
    for at in (0..n).step_by(BATCH) {
        let m = (n - at).min(BATCH);
        let flow = |i: usize| flow(at + i);
        let ids = &mut ids[at..at + m];
        if let Some(way) = &quick {
            if passes(way, at, keys, alike.start(m, 0), &flow) {
                ids_alike(snap, way, alike, flow, ids, others);
                continue;
            }
        }
        ids_general(snap, flow, flows, ids, others);
    }
}

/// The ids of a batch of flows alike, as the passes around the one search found
/// them (`a`): the search's hop where it decided, else an answer made.
#[inline]
fn ids_alike<'s>(
    snap: &'s Snapshot,
    way: &AlikePlan<'s>,
    a: &AlikeBatch,
    flow: impl Fn(usize) -> Query,
    ids: &mut [u32],
    others: &mut Vec<Result<Hop, NoRoute>>,
) {
    let n = a.n;
    if a.quick.count_ones() as usize == n {
        // Every flow (the common case): the search's hops are the answers.
        ids.copy_from_slice(&a.hops[..n]);
        return;
    }
    for (i, id) in ids.iter_mut().enumerate() {
        *id = match a.quick >> i & 1 {
            1 => a.hops[i],
            _ => other(others, snap.answer_slow(way, a, i, &flow(i))),
        };
    }
}

/// The ids of a batch of flows looked up the general way, round by round (the passes
/// of flows alike were tried, or have no way), their queries made in `flows`.
fn ids_general(
    snap: &Snapshot,
    flow: impl Fn(usize) -> Query,
    flows: &mut Vec<Query>,
    ids: &mut [u32],
    others: &mut Vec<Result<Hop, NoRoute>>,
) {
    flows.clear();
    flows.extend((0..ids.len()).map(flow));
    let mut answers = [Err(NoRoute::NetworkUnreachable); BATCH];
    snap.lookup_rounds(flows, &mut answers[..ids.len()]);
    for (id, &answer) in ids.iter_mut().zip(&answers) {
        *id = other(others, answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use crate::state::State;
    use std::net::IpAddr;

    /// Two links, 200 routes via a gateway on `a1`, a blackhole and an unreachable
    /// route; flows arrive on `a0`.
    fn snapshot() -> Snapshot {
        let mut text = String::from(
            "link add a0 type veth peer name a1
link set a0 up
link set a1 up
addr add 10.0.0.1/24 dev a0
addr add 10.0.1.1/24 dev a1
-6 addr add 2001:db8::1/64 dev a0 nodad
-6 addr add 2001:db8:1::1/64 dev a1 nodad
route add blackhole 10.250.0.0/16
route add unreachable 10.251.0.0/16
-6 route add unreachable 2001:db8:ff::/48
",
        );
        for i in 0..200 {
            text.push_str(&format!(
                "route add 10.{}.{}.0/24 via 10.0.1.2\n",
                1 + i / 100,
                i % 100
            ));
            text.push_str(&format!(
                "-6 route add 2001:db8:2:{i:x}::/64 via 2001:db8:1::2\n"
            ));
        }
        let mut state = State::new();
        config::apply_text(&mut state, "test", &text).expect("configuration");
        state.snapshot()
    }

    /// The index of link `a0`, which flows arrive on.
    fn a0(snap: &Snapshot) -> LinkIndex {
        snap.links().find(|l| l.name == "a0").expect("a0").index
    }

    /// The query of an IPv4 or IPv6 flow arriving on `a0` (`iif`) from `src` to `dst`.
    fn arriving(iif: LinkIndex, dst: IpAddr, src: IpAddr) -> Query {
        Query {
            iif: Some(iif),
            src: Some(src),
            ..Query::to(dst)
        }
    }

    /// Looks up `flows` (IPv4, arriving on `a0`) as one vector into `out`, and checks
    /// each answer against `lookup`.
    fn vector_v4<'s>(snap: &'s Snapshot, flows: &[Query], out: &mut VectorAnswers<'s>) {
        let v4 = |a: IpAddr| match a {
            IpAddr::V4(a) => a,
            IpAddr::V6(_) => panic!("IPv4 flows"),
        };
        let dst: Vec<Ipv4Addr> = flows.iter().map(|q| v4(q.dst)).collect();
        let src: Vec<Ipv4Addr> = flows.iter().map(|q| v4(q.src.unwrap())).collect();
        let v = FlowVector {
            iif: Some(a0(snap)),
            dst: &dst,
            src: &src,
        };
        snap.lookup_vector_v4(&v, |i| flows[i].clone(), out);
        assert_eq!(out.len(), flows.len());
        for (i, q) in flows.iter().enumerate() {
            assert_eq!(out.get(i).copied(), snap.lookup(q).map(Hop::from), "{q:?}");
        }
    }

    #[test]
    fn flows_the_search_decides_are_named_by_the_searched_table_s_hops() {
        let snap = snapshot();
        let src: IpAddr = "10.0.0.9".parse().unwrap();
        // 150 flows: past two batches, the last one short.
        let flows: Vec<Query> = (0..150)
            .map(|i| {
                arriving(
                    a0(&snap),
                    format!("10.{}.{}.7", 1 + i / 100, i % 100).parse().unwrap(),
                    src,
                )
            })
            .collect();
        let mut out = VectorAnswers::new();
        vector_v4(&snap, &flows, &mut out);
        assert!(out.ids().iter().all(|&id| id < VectorAnswers::OTHER));
        let gateway = Some("10.0.1.2".parse().unwrap());
        assert!(out
            .ids()
            .iter()
            .all(|&id| out.hops()[id as usize].gateway == gateway));
        assert!(out
            .iter()
            .all(|h| h.is_ok_and(|h| snap.link(h.dev).unwrap().name == "a1")));
    }

    #[test]
    fn errors_and_flows_needing_more_are_answers_made_beside_them() {
        let snap = snapshot();
        let src: IpAddr = "10.0.0.9".parse().unwrap();
        let mut flows: Vec<Query> = (0..60)
            .map(|i| arriving(a0(&snap), format!("10.1.{i}.1").parse().unwrap(), src))
            .collect();
        // A blackhole, an unreachable destination, no route, a martian source, this
        // host's address as the source, and a flow to this host.
        let odd = [
            ("10.250.0.1", "10.0.0.9", Err(NoRoute::Invalid)),
            ("10.251.0.1", "10.0.0.9", Err(NoRoute::HostUnreachable)),
            ("192.0.2.1", "10.0.0.9", Err(NoRoute::NetworkUnreachable)),
            ("10.1.0.1", "127.0.0.1", Err(NoRoute::Invalid)),
            ("10.1.0.1", "10.0.1.1", Err(NoRoute::Invalid)),
        ];
        for (d, s, _) in odd {
            flows.push(arriving(a0(&snap), d.parse().unwrap(), s.parse().unwrap()));
        }
        flows.push(arriving(a0(&snap), "10.0.0.1".parse().unwrap(), src));
        let mut out = VectorAnswers::new();
        vector_v4(&snap, &flows, &mut out);
        assert!(out.ids()[..60].iter().all(|&id| id < VectorAnswers::OTHER));
        for (k, (_, _, answer)) in odd.iter().enumerate() {
            assert!(out.ids()[60 + k] >= VectorAnswers::OTHER);
            assert_eq!(out.get(60 + k).copied(), *answer);
        }
        let local = out.get(65).expect("a local route");
        assert_eq!(local.kind, crate::route::RouteType::Local);
    }

    #[test]
    fn answers_recycled_for_another_snapshot_hold_only_its_answers() {
        let first = snapshot();
        let src: IpAddr = "10.0.0.9".parse().unwrap();
        let flows: Vec<Query> = (0..70)
            .map(|i| arriving(a0(&first), format!("10.1.{i}.1").parse().unwrap(), src))
            .collect();
        let mut out = VectorAnswers::new();
        vector_v4(&first, &flows, &mut out);
        let second = snapshot();
        let mut out = out.recycle();
        assert!(out.is_empty());
        vector_v4(&second, &flows[..3], &mut out);
        assert_eq!(out.len(), 3);
        let searched = |s: &Snapshot| {
            s.alike_way(Family::V4, Some(a0(s)))
                .unwrap()
                .plain()
                .hops
                .as_ptr()
        };
        assert_eq!(out.hops().as_ptr(), searched(&second));
        assert_ne!(out.hops().as_ptr(), searched(&first));
    }

    #[test]
    fn ipv6_vectors_answer_as_lookup() {
        let snap = snapshot();
        let src: Ipv6Addr = "2001:db8::9".parse().unwrap();
        let dst: Vec<Ipv6Addr> = (0..100)
            .map(|i| match i {
                97 => "2001:db8:ff::1".parse().unwrap(),
                98 => "fe80::1".parse().unwrap(),
                99 => "2001:db8::1".parse().unwrap(),
                _ => format!("2001:db8:2:{i:x}::5").parse().unwrap(),
            })
            .collect();
        let src = vec![src; dst.len()];
        let flows: Vec<Query> = dst
            .iter()
            .map(|&d| arriving(a0(&snap), IpAddr::V6(d), IpAddr::V6(src[0])))
            .collect();
        let mut out = VectorAnswers::new();
        let v = FlowVector {
            iif: Some(a0(&snap)),
            dst: &dst,
            src: &src,
        };
        snap.lookup_vector_v6(&v, |i| flows[i].clone(), &mut out);
        for (i, q) in flows.iter().enumerate() {
            assert_eq!(out.get(i).copied(), snap.lookup(q).map(Hop::from), "{q:?}");
        }
        assert!(out.ids()[..97].iter().all(|&id| id < VectorAnswers::OTHER));
        assert_eq!(out.get(97).copied(), Err(NoRoute::HostUnreachable));
    }
}
