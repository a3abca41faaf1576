//! The neighbour stage over a vector: the TTL or hop limit and the MTU checked, the
//! next hop's MAC address found (without one, the packet goes to the kernel, which
//! resolves it). What a hop of the searched table comes to (its link, MTU and MAC
//! addresses: VPP's adjacency) is made once and kept from vector to vector while the
//! snapshot and the neighbour table stay the same, so that most packets find theirs by
//! the route stage's answer id alone.

use super::address_of_bits;
use super::{address_bits, route::source_scope};
use super::{Dropped, Fate, Handed, Neighbours, Pipeline};
use crate::fragment;
use crate::icmp;
use crate::input::Input;
use crate::pool::Pool;
use fibre_fib::{Hop, LinkIndex, Snapshot, VectorAnswers};
use fibre_headers::ipv6;
use std::time::Instant;

/// Slots of the neighbour stage's cache.
const NEIGHBOUR_SLOTS: usize = 256;

/// The neighbour stage's cache of MAC addresses: a slot per (link, next hop), chosen by
/// a multiplicative hash, each holding the last next hop that fell in it. A router sends
/// through few next hops, so nearly every packet finds its own in a few instructions,
/// where the neighbour table costs a full hash lookup. Kept while the table's
/// [`Neighbours::version`] stays the same.
#[derive(Default)]
pub(super) struct NeighbourCache {
    version: Option<u64>,
    slots: Vec<Option<(LinkIndex, u128, [u8; 6])>>,
}

impl NeighbourCache {
    /// Starts a vector with `neighbours`: what the cache holds goes if the table changed
    /// (or cannot say whether it did).
    fn start(&mut self, neighbours: &impl Neighbours) {
        let version = neighbours.version();
        if self.slots.is_empty() {
            self.slots = vec![None; NEIGHBOUR_SLOTS];
        } else if version.is_none() || version != self.version {
            self.slots.iter_mut().for_each(|s| *s = None);
        }
        self.version = version;
    }

    /// The MAC address of the address whose [`address_bits`] are `bits` on `link`, from
    /// the cache or else from `neighbours`. (The address travels as its bits: an
    /// `IpAddr` made afresh for every packet and read back whole stalls the CPU, its
    /// parts stored separately.)
    #[inline]
    fn mac(
        &mut self,
        neighbours: &impl Neighbours,
        link: LinkIndex,
        bits: u128,
    ) -> Option<[u8; 6]> {
        let h =
            (bits as u64 ^ (bits >> 64) as u64 ^ link as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let slot = (h >> 56) as usize % NEIGHBOUR_SLOTS;
        if let Some((l, b, mac)) = self.slots[slot] {
            if l == link && b == bits {
                return Some(mac);
            }
        }
        let mac = neighbours.mac(link, address_of_bits(bits))?;
        self.slots[slot] = Some((link, bits, mac));
        Some(mac)
    }
}

/// Hops an adjacency table holds at most (a router's tables name a few hundred).
const ADJACENCY_SLOTS: usize = 1 << 16;

/// What the neighbour stage makes of a hop of the searched table, once for all the
/// packets through it (VPP's adjacency): the link it leaves by, the MTU, the MAC
/// addresses.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Adjacency {
    /// The epoch of [`Adjacencies`] it was made in.
    epoch: u64,
    /// The output link.
    dev: LinkIndex,
    /// The route's MTU, or the link's if lower or the route sets none.
    mtu: u32,
    /// The output link's MAC address.
    src_mac: [u8; 6],
    /// The gateway's [`address_bits`]; `None`: the destination is on the link (its
    /// MAC address is each packet's own).
    gateway: Option<u128>,
    /// The gateway's MAC address, if it has one.
    gateway_mac: Option<[u8; 6]>,
}

impl Adjacency {
    /// The adjacency of `hop` in `snap`, through `cache` to `neighbours`; `None` if its
    /// link is not in the snapshot.
    fn new(
        snap: &Snapshot,
        hop: &Hop,
        neighbours: &impl Neighbours,
        cache: &mut NeighbourCache,
    ) -> Option<Adjacency> {
        let link = snap.link(hop.dev)?;
        let gateway = hop.gateway.map(address_bits);
        Some(Adjacency {
            epoch: 0,
            dev: hop.dev,
            mtu: hop.mtu.unwrap_or(link.mtu).min(link.mtu),
            src_mac: link.mac,
            gateway,
            gateway_mac: gateway.and_then(|g| cache.mac(neighbours, hop.dev, g)),
        })
    }
}

/// A family's adjacencies, by the id of the hop of the searched table they were made
/// for ([`VectorAnswers::ids`]). They are kept while what they were made of stays: the
/// snapshot's content ([`Snapshot::serial`]), the table searched, and the neighbour
/// table's [`Neighbours::version`] (with none, for one vector only). A slot is current
/// if it was made in the current epoch, so that starting afresh clears nothing.
#[derive(Default)]
pub(super) struct Adjacencies {
    made_of: Option<(u64, usize, usize, u64)>,
    epoch: u64,
    slots: Vec<Adjacency>,
}

impl Adjacencies {
    /// Starts a vector whose answers name `hops` of the snapshot numbered `serial`,
    /// with the neighbour table at `version`.
    fn start(&mut self, serial: u64, hops: &[Hop], version: Option<u64>) {
        let made_of = version.map(|v| (serial, hops.as_ptr() as usize, hops.len(), v));
        if made_of.is_none() || made_of != self.made_of {
            self.epoch += 1;
            self.made_of = made_of;
        }
        let want = hops.len().min(ADJACENCY_SLOTS);
        if self.slots.len() < want {
            self.slots.resize(want, Adjacency::default());
        }
    }

    /// The current adjacency of hop `id`, if made. (A reference: the pipeline reads a
    /// few of its fields, and a copy of the whole had cost a nanosecond a packet.)
    #[inline]
    fn get(&self, id: u32) -> Option<&Adjacency> {
        self.slots
            .get(id as usize)
            .filter(|a| a.epoch == self.epoch)
    }

    /// Keeps `a` as hop `id`'s adjacency (ids past the slots, answers made for one flow
    /// among them, are not kept).
    fn keep(&mut self, id: u32, a: Adjacency) {
        if let Some(slot) = self.slots.get_mut(id as usize) {
            *slot = Adjacency {
                epoch: self.epoch,
                ..a
            };
        }
    }
}

impl Pipeline {
    /// The neighbour stage over both families' packets to forward, with the answers
    /// the route stage found for them; those that may leave go to `next` with their
    /// MAC addresses.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn neighbour_stage(
        &mut self,
        snap: &Snapshot,
        neighbours: &impl Neighbours,
        iif: LinkIndex,
        answers4: VectorAnswers<'_>,
        answers6: VectorAnswers<'_>,
        pool: &mut Pool,
        fates: &mut [Fate],
        next: &mut Vec<(usize, [u8; 6], [u8; 6])>,
    ) {
        let routed = self.v4.len() + self.v6.len();
        let t = Instant::now();

        next.clear();
        self.unresolved.clear();
        self.cut.clear();
        self.spare.clear();
        self.fragments.clear();
        self.neighbour_cache.start(neighbours);
        let version = neighbours.version();
        let mut forward = std::mem::take(&mut self.forward4);
        self.adjacencies[0].start(snap.serial(), answers4.hops(), version);
        self.neighbour_family(
            snap, neighbours, iif, &answers4, &forward, pool, fates, next, 0,
        );
        self.forward4 = forward;
        forward = std::mem::take(&mut self.forward6);
        self.adjacencies[1].start(snap.serial(), answers6.hops(), version);
        self.neighbour_family(
            snap, neighbours, iif, &answers6, &forward, pool, fates, next, 1,
        );
        self.forward6 = forward;
        self.answers4 = Some(answers4.recycle());
        self.answers6 = Some(answers6.recycle());
        self.neighbour.add(routed, t);
    }

    /// The neighbour stage over one family's packets to forward (`forward`: each one's
    /// index and its answer's id in `answers`), through the family's adjacencies
    /// (`self.adjacencies[family]`, made here for hops that have none yet); those that
    /// may leave go to `next` with their MAC addresses. An IPv4 packet to cut into
    /// fragments gets its later fragments' buffers from `pool` here, before anything in
    /// it changes: one the pool cannot serve is dropped as it came.
    #[allow(clippy::too_many_arguments)]
    fn neighbour_family(
        &mut self,
        snap: &Snapshot,
        neighbours: &impl Neighbours,
        iif: LinkIndex,
        answers: &VectorAnswers<'_>,
        forward: &[(usize, u32)],
        pool: &mut Pool,
        fates: &mut [Fate],
        next: &mut Vec<(usize, [u8; 6], [u8; 6])>,
        family: usize,
    ) {
        for &(i, id) in forward {
            let (hops_left, len, df, v6) = match &self.inputs[i] {
                Input::V4(p) => (p.ttl, p.len as u32, p.df, false),
                Input::V6(p) => (
                    p.hop_limit,
                    ipv6::HEADER_LEN as u32 + p.len as u32,
                    true,
                    true,
                ),
                _ => continue,
            };
            let made;
            let adjacency = if let Some(a) = self.adjacencies[family].get(id) {
                a
            } else {
                let a = match answers.answer(id) {
                    Ok(hop) => Adjacency::new(snap, hop, neighbours, &mut self.neighbour_cache),
                    Err(_) => None,
                };
                let Some(a) = a else {
                    fates[i] = Fate::Drop(Dropped::NoLink);
                    continue;
                };
                self.adjacencies[family].keep(id, a);
                made = a;
                &made
            };
            let mtu = if v6 {
                // IPv6 links carry 1280 bytes at least (`ip6_forward`).
                adjacency.mtu.max(1280)
            } else {
                adjacency.mtu
            };
            // A packet left whole by its sender fits if its segments do.
            let over = match self.segment_lens[i] {
                0 => len > mtu,
                segment => segment > mtu,
            };
            fates[i] = if hops_left <= 1 {
                self.errors.push((i, icmp::Error::TimeExceeded, 0));
                Fate::Drop(Dropped::TtlExpired)
            } else if let Some(refused) = source_scope(&self.inputs[i], iif, adjacency.dev) {
                if refused {
                    self.errors.push((i, icmp::Error::BeyondScope, 0));
                }
                Fate::Drop(Dropped::SourceScope)
            } else if over && df {
                self.errors.push((i, icmp::Error::TooBig, mtu));
                Fate::Drop(Dropped::TooBig)
            } else if over && self.segment_lens[i] != 0 {
                Fate::Drop(Dropped::SegmentsOverMtu)
            } else {
                let (via, mac) = match adjacency.gateway {
                    Some(g) => (g, adjacency.gateway_mac),
                    None => {
                        let dst = match &self.inputs[i] {
                            Input::V4(p) => p.dst.to_ipv6_mapped().to_bits(),
                            Input::V6(p) => p.dst.to_bits(),
                            _ => continue,
                        };
                        (
                            dst,
                            self.neighbour_cache.mac(neighbours, adjacency.dev, dst),
                        )
                    }
                };
                match mac {
                    Some(m) if over => {
                        let (dev, src_mac) = (adjacency.dev, adjacency.src_mac);
                        if self.reserve(pool, i, len, mtu) {
                            next.push((i, m, src_mac));
                            Fate::Fragmented(dev)
                        } else {
                            Fate::Drop(Dropped::NoBufferToFragment)
                        }
                    }
                    Some(m) => {
                        next.push((i, m, adjacency.src_mac));
                        Fate::Out(adjacency.dev)
                    }
                    None => {
                        let via = address_of_bits(via);
                        let wanted = (adjacency.dev, via);
                        if !self.unresolved.contains(&wanted) && self.unresolved.len() < 64 {
                            self.unresolved.push(wanted);
                        }
                        Fate::Kernel(Handed::Unresolved)
                    }
                }
            };
        }
    }

    /// Takes from `pool` the buffers packet `i` (`len` bytes, to an MTU of `mtu`) needs
    /// for its later fragments and records it to be cut; false, with nothing taken, if
    /// the pool has too few or the MTU leaves no room for a fragment.
    fn reserve(&mut self, pool: &mut Pool, i: usize, len: u32, mtu: u32) -> bool {
        let Some(pieces) = fragment::pieces(len as usize, mtu as usize) else {
            return false;
        };
        let later = pieces.count() - 1;
        let first = self.spare.len();
        if pool.alloc(later, &mut self.spare) < later {
            pool.free(&self.spare[first..]);
            self.spare.truncate(first);
            return false;
        }
        self.cut.push((i, mtu, first..self.spare.len()));
        true
    }
}
