//! The conntrack stage, and NAT at both its hooks: what the kernel's netfilter does to a
//! forwarded packet of a family whose connections it tracks.
//!
//! Before routing, each such packet of the vector, in the order they came: tracked
//! ([`fibre_conntrack`]); put through the prerouting filter chains before NAT (priority
//! under -100); for a new connection of a family with `nat` chains, its destination
//! bound by them (`dnat`; the null binding if none asks); translated by its
//! connection's binding; through the chains after NAT. Routing then takes the
//! translated destination, as the kernel routes again after destination NAT. A packet
//! `redirect`ed, or bound to an address of this host, is for the host: it goes to the
//! kernel as it came, which does the same to it.
//!
//! After the neighbour stage, the filter stage ([`Pipeline::filter_vector`]) puts each
//! to send through the forward chains and the postrouting ones before NAT, binds a new
//! connection's source by the postrouting `nat` chains (`snat`, `masquerade` to the
//! output link's address), translates the source, runs the chains after NAT, and
//! confirms the connection ([`Pipeline::leave`]). A packet that goes to the kernel or
//! is answered with an error instead (a `reject`'s too) has its destination translated
//! back first: the kernel, and the error, see the packet as it came, and the error comes
//! from the address it came to, as the kernel's NAT translates an error by the
//! connection it carries.
//!
//! Where a packet's connection keeps the chains' verdict for its direction
//! ([`fibre_conntrack::Kept`]), under the vector's epoch, in its state, by its links,
//! neither stage asks the chains: they would accept it. Where they accept a packet
//! having read only what its direction's packets hold alike, the filter stage keeps
//! that once the connection is confirmed ([`Conntrack::keeping`] says where it may).

use super::{Dropped, Fate, Handed, Pipeline};
use crate::input::{self, Input, ETHERNET_LEN};
use crate::pool::{BufferId, Pool};
use fibre_headers::{EthernetFrame, Ipv6Packet};

use fibre_conntrack::nat::{self, Manip, Range};
use fibre_conntrack::{Conntrack, State, Tracked};
use fibre_fib::{LinkIndex, Snapshot};
use fibre_firewall::{Ct, Hook, Link, NatKind, NatVerdict, Packet, Part, Steady, Verdict};
use std::net::IpAddr;

/// The connections from which a table outgrows a core's second-level cache (a slot
/// and its handles are some 200 bytes): from there on, the conntrack stage reads each
/// vector's connections ahead of tracking its packets ([`Conntrack::warm`]).
const WARM_FROM: usize = 16_384;

/// A link as the rules see it.
pub(super) fn view(snap: &Snapshot, index: LinkIndex) -> Link<'_> {
    let l = snap.link(index);
    Link {
        index,
        name: l.map_or("", |l| l.name.as_str()),
        // fibre forwards between Ethernet links only.
        kind: 1,
        group: l.map_or(0, |l| l.group),
    }
}

/// Whether the chains read a tracked IPv6 packet `frame` as they read its
/// connection's other packets (always for IPv4): not with extension headers (the
/// kernel's conntrack steps over an authentication header, which the chains take for
/// the transport: a packet with one and a packet without are one connection's, and read
/// apart).
fn plain(frame: &[u8], v6: bool) -> bool {
    // TCP, UDP, ICMPv6, SCTP, DCCP, UDP-Lite straight after the fixed header.
    !v6 || matches!(
        EthernetFrame::new_checked(frame)
            .ok()
            .and_then(|eth| Ipv6Packet::new_checked(eth.into_payload()).ok())
            .map(|h| h.next_header()),
        Some(6 | 17 | 58 | 132 | 33 | 136)
    )
}

/// What the conntrack stage found of a packet's kept verdict, for the filter stage.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Keeping {
    /// Whether the prerouting chains' verdict holds for every packet of its
    /// connection's direction (kept, or read from nothing else).
    steady: bool,
    /// The links (in, out) its direction was kept as coming in and leaving by under the
    /// vector's epoch, if any (still so for the whole epoch).
    kept: Option<(u32, u32)>,
}

/// What rules read of a tracked packet's connection (told to `steady` whether they
/// read only what its direction's packets hold alike, if asked).
pub(super) fn ct_of<'c>(table: &'c Conntrack, t: &Tracked, steady: Option<&'c Steady>) -> Ct<'c> {
    Ct {
        state: t.state().bit(),
        reply: t.reply(),
        connection: table.connection(t),
        steady,
    }
}

impl Pipeline {
    /// The conntrack stage over the vector's packets of tracked families (`self.v4` and
    /// `self.v6` hold the vector's IP packets, `mac` the link's address): each one's
    /// fate set if it goes no further, its outcome kept in `self.tracks` if it does.
    /// How many packets it tracked.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn conntrack_vector(
        &mut self,
        table: &mut Conntrack,
        snap: &Snapshot,
        iif: LinkIndex,
        mac: [u8; 6],
        pool: &mut Pool,
        packets: &[BufferId],
        fates: &mut [Fate],
    ) -> usize {
        self.tracks.clear();
        self.tracks.resize(packets.len(), None);
        self.keeping.clear();
        self.keeping.resize(packets.len(), Keeping::default());
        self.epoch = table.epoch(self.rules.id(), snap.serial());
        table.settle();
        // What the other workers' tables told this one, before any packet is tracked.
        if let Some(m) = self
            .mailboxes
            .as_ref()
            .and_then(|m| m.get(usize::from(table.owners().me)))
        {
            m.take_forwards(|f| table.forward(f));
        }
        self.release(table);
        let clock = self.limit.overall().now();
        let input = view(snap, iif);
        // (Lists of the pipeline's, their room kept from vector to vector.)
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        let (v4, v6) = (self.tracked & 1 != 0, self.tracked & 2 != 0);
        if v4 {
            order.extend(&self.v4);
        }
        if v6 {
            order.extend(&self.v6);
        }
        // (Each family's list is in the vector's order already.)
        if v4 && v6 && !self.v4.is_empty() && !self.v6.is_empty() {
            order.sort_unstable();
        }
        // A table past the caches: the vector's lookups made together first, their
        // misses overlapping, so that tracking each then finds its connection cached.
        if table.len() >= WARM_FROM {
            table.warm(
                order
                    .iter()
                    .map(|&i| &pool.frame(packets[i])[ETHERNET_LEN..]),
            );
        }
        // The packets that go no further than this stage.
        let mut stopped = std::mem::take(&mut self.stopped);
        stopped.clear();
        stopped.resize(packets.len(), false);
        // Whether what routing reads changed for any packet.
        let mut changed = false;
        for &i in &order {
            let id = packets[i];
            let v6 = matches!(self.inputs[i], Input::V6(_));
            let now = self.times.get(i).copied().unwrap_or(clock);
            // A checksum its sender left to finish (`CHECKSUM_PARTIAL`), or one the
            // link checked and vouched for (`DATA_VALID`: `CHECKSUM_UNNECESSARY`), is
            // not checked, as the kernel's `nf_checksum` and `reject` do not check it
            // (`skb_csum_unnecessary`); any other is. (NAT's rewrite tells the first
            // apart: such a checksum is the pseudo-header's alone.)
            let offload = pool.offload(id);
            let partial = offload.checksum.is_some();
            let vouched = partial || offload.checksum_valid;
            let tracked = table.track_in_vector(&pool.frame(id)[ETHERNET_LEN..], now, vouched);
            let fate = match tracked.outcome() {
                fibre_conntrack::Fate::TableFull => Some(Fate::Drop(Dropped::ConntrackFull)),
                fibre_conntrack::Fate::Kernel(why) => Some(Fate::Kernel(Handed::Untrackable(why))),
                // A translated connection's reply, another worker's.
                fibre_conntrack::Fate::Elsewhere(w) => Some(Fate::Handoff(w)),
                fibre_conntrack::Fate::Pass => None,
            };
            if let Some(fate) = fate {
                fates[i] = fate;
                stopped[i] = true;
                continue;
            }
            if i % 16 == 0 {
                table.expire(now, 16);
            }
            // Kept for its connection's direction: the chains would accept it. (Where
            // the family meets no filter chain there is nothing to keep, nor to ask.)
            // (Where a verdict kept for its connection's direction may stand for its
            // own, or its own be kept: what the chains read of it is what they read of
            // its direction's other packets.)
            let (keepable, links) = if self.rules.holds(v6) && plain(pool.frame(id), v6) {
                table.keeping(&tracked, self.epoch, self.rules.translates(v6))
            } else {
                (false, None)
            };
            let kept = links.is_some_and(|(came_by, _)| came_by == iif);
            let steady = Steady::default();
            let verdict = self.prerouting(
                table,
                &tracked,
                (pool.frame(id), v6),
                input,
                Part::BeforeNat,
                (kept, &steady),
            );
            let fate = if verdict != Verdict::Accept {
                // (A connection NAT changed: its error comes from where it was going.)
                if let Some(to) = table
                    .error_source(&tracked)
                    .filter(|_| verdict != Verdict::Drop)
                {
                    self.error_sources.push((i, to));
                }
                if self.reject_at_prerouting(i, verdict, pool.frame(id), vouched, tracked) {
                    table.set_closing(&tracked, now);
                }
                Some(Fate::Drop(Dropped::Filtered))
            } else if self.rules.translates(v6) {
                self.destination_nat(table, &tracked, input, pool.frame_mut(id), partial, now)
            } else {
                None
            };
            if let Some(fate) = fate {
                fates[i] = fate;
                stopped[i] = true;
                changed = true;
                continue;
            }
            if self.rules.translates(v6) && table.rewrites(&tracked, Manip::Destination) {
                changed = true;
                // Its destination changed: what routing reads, read again. One
                // translated to what the input stage would not route (a multicast or
                // broadcast destination) is dropped, with the input stage's reason.
                input::classify_into(pool.frame(id), mac, &mut self.inputs[i]);
                let refused = match self.inputs[i] {
                    Input::V4(_) | Input::V6(_) => None,
                    Input::Drop(d) => Some(Dropped::Input(d)),
                    Input::Kernel(_) => Some(Dropped::Filtered),
                };
                if let Some(d) = refused {
                    fates[i] = Fate::Drop(d);
                    stopped[i] = true;
                    continue;
                }
            }
            let verdict = self.prerouting(
                table,
                &tracked,
                (pool.frame(id), v6),
                input,
                Part::AfterNat,
                (kept, &steady),
            );
            if let Verdict::Reject(_) = verdict {
                // Its error quotes it as it came, from where it came to.
                table.untranslate(&tracked, &mut pool.frame_mut(id)[ETHERNET_LEN..], partial);
                if let Some(to) = table.error_source(&tracked) {
                    self.error_sources.push((i, to));
                }
            }
            if verdict != Verdict::Accept {
                if self.reject_at_prerouting(i, verdict, pool.frame(id), vouched, tracked) {
                    table.set_closing(&tracked, now);
                }
                fates[i] = Fate::Drop(Dropped::Filtered);
                stopped[i] = true;
                continue;
            }
            self.tracks[i] = Some(tracked);
            self.keeping[i] = Keeping {
                steady: keepable && (kept || steady.holds()),
                kept: links,
            };
        }
        // The vector's IP packets now: those that go on, with what routing reads.
        if changed || stopped.contains(&true) {
            self.v4.retain(|&i| !stopped[i]);
            self.v6.retain(|&i| !stopped[i]);
            // Refilled in place (their room kept from vector to vector).
            self.dst4.clear();
            self.src4.clear();
            self.dst6.clear();
            self.src6.clear();
            for &i in self.v4.iter().chain(&self.v6) {
                match &self.inputs[i] {
                    Input::V4(p) => (self.dst4.push(p.dst), self.src4.push(p.src)),
                    Input::V6(p) => (self.dst6.push(p.dst), self.src6.push(p.src)),
                    // (Stopped above.)
                    _ => ((), ()),
                };
            }
        }
        let tracked = order.len();
        self.order = order;
        self.stopped = stopped;
        tracked
    }

    /// What the prerouting chains of `part` decide for a tracked packet `frame` (IPv6 if
    /// `v6`) from `input`: accept, without asking, where its family has none or where its
    /// verdict is `kept`; else `steady` is told whether they read anything its
    /// direction's packets may hold otherwise.
    fn prerouting(
        &self,
        table: &Conntrack,
        tracked: &Tracked,
        (frame, v6): (&[u8], bool),
        input: Link,
        part: Part,
        (kept, steady): (bool, &Steady),
    ) -> Verdict {
        if kept || !self.rules.filters_at(Hook::Prerouting, v6) {
            return Verdict::Accept;
        }
        let ct = ct_of(table, tracked, Some(steady));
        self.rules.prerouting_verdict(frame, input, Some(&ct), part)
    }

    /// Destination NAT at prerouting for a tracked packet `frame`: a new connection
    /// bound by the prerouting `nat` chains, then the packet translated. Its fate if it
    /// goes no further.
    fn destination_nat(
        &self,
        table: &mut Conntrack,
        tracked: &Tracked,
        input: Link,
        frame: &mut [u8],
        partial: bool,
        now: u64,
    ) -> Option<Fate> {
        // The chains see a connection's first packets only (the kernel's `IP_CT_NEW`),
        // until it is bound.
        if tracked.state() == State::New && !table.bound(tracked, Manip::Destination) {
            let verdict = self.rules.nat(
                Hook::Prerouting,
                frame,
                input,
                None,
                Some(&ct_of(table, tracked, None)),
            );
            match verdict {
                NatVerdict::Drop => return Some(Fate::Drop(Dropped::Filtered)),
                // For this host: the kernel redirects it itself.
                NatVerdict::Bind(t) if t.kind == NatKind::Redirect => {
                    return Some(Fate::Kernel(Handed::Local));
                }
                NatVerdict::Bind(t) => {
                    table.bind(tracked, Manip::Destination, Some(&t.range), now);
                }
                NatVerdict::None => table.bind(tracked, Manip::Destination, None, now),
            }
        }
        if !table.translate(
            tracked,
            &mut frame[ETHERNET_LEN..],
            Manip::Destination,
            partial,
        ) {
            return Some(Fate::Drop(Dropped::Filtered));
        }
        None
    }

    /// What the forward and postrouting hooks decide for a tracked packet to send out of
    /// `out`: the chains before NAT, its connection's source bound (a new one) and
    /// translated, the chains after NAT, its connection confirmed (a connection
    /// masqueraded out of a link it no longer leaves by ends here). The packet is
    /// changed in `pool` as it leaves. A drop for anything that stops it (a `reject` at
    /// forward too). Where the chains' verdict is kept for its connection's direction
    /// leaving by `out`, they are not asked; where they accept it having read only what
    /// its direction's packets hold alike, as at prerouting, that is kept.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn leave(
        &mut self,
        snap: &Snapshot,
        table: &mut Conntrack,
        tracked: &Tracked,
        i: usize,
        input: Link,
        out: LinkIndex,
        pool: &mut Pool,
        id: BufferId,
        now: u64,
    ) -> Verdict {
        // (Looked up where the chains read it: a kept verdict reads nothing.)
        let oif = || view(snap, out);
        let v6 = matches!(self.inputs[i], Input::V6(_));
        let Keeping {
            steady: steady_before,
            kept: links,
        } = self.keeping.get(i).copied().unwrap_or_default();
        let kept = steady_before && links == Some((input.index, out));
        self.verdicts_kept += u64::from(kept);
        let steady = Steady::default();
        let forwarded = self.rules.filters_at(Hook::Forward, v6) && !kept;
        let leaving = self.rules.filters_at(Hook::Postrouting, v6) && !kept;
        if forwarded || leaving {
            let verdict = self.rules.forwarding_verdict(
                &Packet {
                    frame: pool.frame(id),
                    iif: input,
                    oif: oif(),
                },
                Some(&ct_of(table, tracked, Some(&steady))),
                Part::BeforeNat,
            );
            if verdict != Verdict::Accept {
                return verdict;
            }
        }
        if self.rules.translates(v6) {
            if table.left_its_link(tracked, out) {
                table.end(tracked);
                return Verdict::Drop;
            }
            if tracked.state() == State::New && !table.bound(tracked, Manip::Source) {
                let verdict = self.rules.nat(
                    Hook::Postrouting,
                    pool.frame(id),
                    input,
                    Some(oif()),
                    Some(&ct_of(table, tracked, None)),
                );
                match verdict {
                    NatVerdict::Drop => return Verdict::Drop,
                    NatVerdict::Bind(t) if t.kind == NatKind::Masquerade => {
                        let masquerade =
                            self.masquerade(snap, table, tracked, i, input, out, t.range);
                        let Some(range) = masquerade else {
                            return Verdict::Drop;
                        };
                        table.bind(tracked, Manip::Source, range.as_ref(), now);
                    }
                    NatVerdict::Bind(t) => table.bind(tracked, Manip::Source, Some(&t.range), now),
                    NatVerdict::None => table.bind(tracked, Manip::Source, None, now),
                }
            }
            let partial = pool.offload(id).checksum.is_some();
            let frame = pool.frame_mut(id);
            if !table.translate(tracked, &mut frame[ETHERNET_LEN..], Manip::Source, partial) {
                return Verdict::Drop;
            }
        }
        let pass = !leaving
            || self.rules.forwarding_part(
                &Packet {
                    frame: pool.frame(id),
                    iif: input,
                    oif: oif(),
                },
                Some(&ct_of(table, tracked, Some(&steady))),
                Part::AfterNat,
            );
        if pass && table.confirm(tracked) {
            if !kept && steady_before && steady.holds() {
                table.keep(tracked, self.epoch, input.index, out);
            }
            Verdict::Accept
        } else {
            Verdict::Drop
        }
    }

    #[allow(clippy::too_many_arguments)]
    /// The range a connection masqueraded out of `out` is bound to: `masquerade`'s
    /// ports and flags, and the output link's address toward the next hop
    /// (`nf_nat_masquerade_ipv4`, `_ipv6`). `Some(None)`: an IPv4 connection from
    /// 0.0.0.0 is not masqueraded (the null binding instead); `None`: the link has no
    /// address to give, and the kernel drops the packet.
    fn masquerade(
        &self,
        snap: &Snapshot,
        table: &mut Conntrack,
        tracked: &Tracked,
        i: usize,
        input: Link,
        out: LinkIndex,
        asked: Range,
    ) -> Option<Option<Range>> {
        let toward = match &self.inputs[i] {
            Input::V4(p) => {
                if p.src.is_unspecified() {
                    return Some(None);
                }
                let hop = snap.route(&super::route::query4(input.index, p)).ok();
                hop.and_then(|a| a.gateway).unwrap_or(IpAddr::V4(p.dst))
            }
            Input::V6(p) => IpAddr::V6(p.dst),
            _ => return None,
        };
        let address = match snap.masquerade_source(out, toward)? {
            IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            IpAddr::V6(a) => a.octets(),
        };
        table.masquerade(tracked, out);
        Some(Some(Range {
            flags: asked.flags | nat::MAP_IPS,
            min_addr: address,
            max_addr: address,
            ..asked
        }))
    }

    /// Whether a TCP reset this host sends for a `reject` of `t`'s packet, `frame` as it
    /// leaves by `route`, gets past the kernel's NAT at postrouting (`nf_nat_inet_fn`
    /// on the connection the reset carries): a connection whose source is not bound yet
    /// has the reset put through the postrouting `nat` chains, which may drop it (a
    /// masquerade out of a link with no address to give drops it too); one masqueraded
    /// out of another link than the reset leaves by, going its original way, is ended
    /// and the reset dropped.
    pub(super) fn reset_leaves(
        &self,
        snap: &Snapshot,
        table: &mut Conntrack,
        t: &Tracked,
        frame: &[u8],
        route: &fibre_fib::Answer,
    ) -> bool {
        let answer = t.answer();
        let Some(c) = table.connection(&answer) else {
            return true;
        };
        if !table.bound(&answer, Manip::Source) {
            let ct = ct_of(table, &answer, None);
            return match self
                .rules
                .nat_of_sent(frame, view(snap, route.dev), Some(&ct))
            {
                NatVerdict::Drop => false,
                NatVerdict::Bind(b) if b.kind == NatKind::Masquerade => {
                    let v6 = frame.get(12..14) == Some(&[0x86, 0xdd]);
                    input::addresses(frame, v6).is_some_and(|(dst, _)| {
                        let toward = route.gateway.unwrap_or(dst);
                        snap.masquerade_source(route.dev, toward).is_some()
                    })
                }
                _ => true,
            };
        }
        if !answer.reply() && c.masquerade != 0 && c.masquerade != route.dev {
            table.end(&answer);
            return false;
        }
        true
    }

    /// Claims from the kernel's stack the frames of `t`'s connection, just confirmed,
    /// that arrive at an address of this host NAT gave ([`crate::claims`]), when the
    /// vector's are to be claimed: after what ended before is given back, so that a
    /// connection that takes an ended one's tuple keeps its claim.
    pub(super) fn claim(&mut self, table: &mut Conntrack, snap: &Snapshot, t: &Tracked) {
        if !self.claiming || self.claims.is_none() {
            return;
        }
        self.release(table);
        let Some(c) = table.connection(t) else { return };
        let Some(claims) = &self.claims else { return };
        use fibre_conntrack::nat::{DST_NAT, SRC_NAT};
        for (bit, dir) in [(SRC_NAT, 1), (DST_NAT, 0)] {
            let tuple = c.tuples[dir];
            let local = c.status & bit != 0
                && snap
                    .route(&fibre_fib::Query::to(tuple.destination()))
                    .is_ok_and(|a| a.kind == fibre_fib::RouteType::Local);
            if local {
                match claims.claim(&tuple) {
                    Ok(()) => self.claimed += 1,
                    Err(_) => self.claims_failed += 1,
                }
            }
        }
    }

    /// Gives back to the kernel the frames of the translated connections that ended
    /// since last time.
    pub(super) fn release(&mut self, table: &mut Conntrack) {
        self.released.clear();
        table.drain_released(&mut self.released);
        if let Some(claims) = &self.claims {
            for tuple in &self.released {
                claims.release(tuple);
            }
        }
    }

    /// Undoes destination NAT on the vector's tracked packets that go to the kernel or
    /// are answered with an error: each as it came; an error's source is then the
    /// address the packet came to (`self.error_sources`).
    pub(super) fn untranslate(
        &mut self,
        table: &Conntrack,
        pool: &mut Pool,
        packets: &[BufferId],
        fates: &[Fate],
    ) {
        // (Most vectors have none of either: nothing to look through.)
        if self.errors.is_empty() && !fates.iter().any(|f| matches!(f, Fate::Kernel(_))) {
            return;
        }
        for (i, t) in self.tracks.iter().enumerate() {
            let Some(t) = t else { continue };
            // An error, a reject's too, is translated back as the kernel's NAT
            // translates an error RELATED to the connection its packet made, confirmed
            // or not (the kernel's error carries its packet's connection).
            let answered = self.errors.iter().any(|e| e.0 == i);
            let back = matches!(fates[i], Fate::Kernel(_)) || answered;
            if back && t.state() != State::Related {
                let partial = pool.offload(packets[i]).checksum.is_some();
                let ip = &mut pool.frame_mut(packets[i])[ETHERNET_LEN..];
                table.untranslate(t, ip, partial);
                if let Some(to) = table.error_source(t).filter(|_| answered) {
                    self.error_sources.push((i, to));
                }
            }
        }
    }
}
impl Pipeline {
    /// Tells the other workers' tables what they are to learn of the connections the
    /// vector entered or ended: before the caller sends its packets, so before any
    /// reply to them can come.
    pub(super) fn tell_other_workers(&mut self, table: &mut Conntrack) {
        let Some(mailboxes) = &self.mailboxes else {
            return;
        };
        if table.has_outbox() {
            self.told.clear();
            table.drain_outbox(&mut self.told);
            for &(to, f) in &self.told {
                if let Some(m) = mailboxes.get(usize::from(to)) {
                    m.tell(f);
                }
            }
        }
    }
}
