//! The ICMP stage over a vector: the packets the route and neighbour stages refused for
//! a reason the kernel answers (no route, an unreachable or prohibit route, the TTL run
//! out, over the MTU), and those a rule rejected, made in their own buffers into the
//! ICMP or ICMPv6 error ([`crate::icmp`]) or the TCP reset ([`crate::reset`]) the
//! kernel would send back, within its limits. The stage runs only on vectors that have
//! such packets.

use super::route::query4;
use super::{Fate, Neighbours, Pipeline, Unanswered};
use crate::icmp;
use crate::input::{self, Input, ETHERNET_LEN};
use crate::offload::Offload;
use crate::pool::{BufferId, Pool};
use crate::reset;
use crate::rewrite;
use fibre_conntrack::nat::Manip;
use fibre_conntrack::Conntrack;
use fibre_conntrack::State;
use fibre_fib::NoRoute;
use fibre_fib::{LinkIndex, Query, RouteType, Snapshot};
use fibre_headers::ipv6;
use fibre_headers::EthernetFrame;
use std::net::IpAddr;
use std::time::Instant;

impl Pipeline {
    /// The ICMP stage: the errors and the resets of the vector made and sent on their
    /// way back.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn icmp_stage(
        &mut self,
        table: Option<&mut Conntrack>,
        snap: &Snapshot,
        neighbours: &impl Neighbours,
        iif: LinkIndex,
        pool: &mut Pool,
        packets: &[BufferId],
        fates: &mut [Fate],
    ) {
        let t = Instant::now();
        self.answer(snap, neighbours, iif, pool, packets, fates);
        self.send_resets(table, snap, neighbours, iif, pool, packets, fates);
        self.icmp.add(self.errors.len() + self.resets.len(), t);
    }

    /// The ICMP stage: each packet of `self.errors` made into its error, sent back by the
    /// route to its source, if the kernel would answer it and the limits allow.
    fn answer(
        &mut self,
        snap: &Snapshot,
        neighbours: &impl Neighbours,
        iif: LinkIndex,
        pool: &mut Pool,
        packets: &[BufferId],
        fates: &mut [Fate],
    ) {
        let clock = self.limit.overall().now();
        // In the packets' order, as they came (the route stage found some, the
        // neighbour stage others), so that the limits count them as they came.
        self.errors.sort_unstable_by_key(|e| e.0);
        for &(i, error, mtu) in &self.errors {
            let now = self.times.get(i).copied().unwrap_or(clock);
            let id = packets[i];
            let (back, tos, ipproto, ip_len) = match self.inputs[i] {
                Input::V4(p) => (IpAddr::V4(p.src), p.tos & 0x1e, 1, p.len as usize),
                Input::V6(p) => (IpAddr::V6(p.src), 0, 58, ipv6::HEADER_LEN + p.len as usize),
                _ => continue,
            };
            // The packet as its header says, without the frame's padding (the kernel
            // trims to the total length before it looks).
            let frame = pool.frame(id);
            let ip = &frame[ETHERNET_LEN..(ETHERNET_LEN + ip_len).min(frame.len())];
            if !(if back.is_ipv4() {
                icmp::answers_v4(ip)
            } else {
                icmp::answers_v6(ip)
            }) {
                self.unanswered.not_answered += 1;
                continue;
            }
            let limited = self.limit.applies(error, back.is_ipv6());
            // An IPv4 packet without a route pays its source's toll first (`ip_error`).
            let no_route = matches!(
                error,
                icmp::Error::NetUnreachable
                    | icmp::Error::HostUnreachable
                    | icmp::Error::Prohibited
            );
            if limited && back.is_ipv4() && no_route && !self.limit.route_error(back, now) {
                self.unanswered.rate_limited += 1;
                continue;
            }
            if limited && !self.limit.overall().allows(now) {
                self.unanswered.rate_limited += 1;
                continue;
            }
            // A link-local source is answered on the link the packet came in on.
            let scoped = matches!(back, IpAddr::V6(a) if a.is_unicast_link_local());
            // An IPv6 error about a packet to the host comes from the address the
            // packet came to, routed from it (`icmp6_send`: a rule `from` it applies).
            let own = match self.inputs[i] {
                Input::V6(p) if snap.answers_from_v6(iif, p.dst) => Some(IpAddr::V6(p.dst)),
                _ => None,
            };
            let query = Query {
                tos,
                ipproto,
                src: own,
                oif: scoped.then_some(iif),
                ..Query::to(back)
            };
            let route = match snap.route(&query) {
                Ok(a) if a.kind == RouteType::Unicast => a,
                _ => {
                    self.unanswered.no_route_back += 1;
                    continue;
                }
            };
            let (Some(src), Some(link)) = (own.or(route.prefsrc), snap.link(route.dev)) else {
                self.unanswered.no_route_back += 1;
                continue;
            };
            // An error of a translated connection comes from the address its packet
            // came to, as the kernel's NAT rewrites its error's source (the route
            // stays the one found for the host's own).
            let src = match self.error_sources.iter().find(|e| e.0 == i) {
                Some(&(_, to)) if to.is_ipv4() == src.is_ipv4() => to,
                _ => src,
            };
            if limited {
                if !self.limit.to(back, now) {
                    self.unanswered.rate_limited += 1;
                    continue;
                }
                self.limit.overall().spend();
            }
            let Some(dst_mac) = way_back(
                &mut self.unanswered,
                &mut self.unresolved,
                neighbours,
                &route,
                (iif, pool.frame(id), back),
            ) else {
                continue;
            };
            let size = pool.buffer_size();
            let buffer = pool.resize(id, size);
            let made = match src {
                IpAddr::V4(src) => {
                    self.ip_id = self.ip_id.wrapping_add(1);
                    let ttl = route.hoplimit.unwrap_or(self.hops.ipv4);
                    icmp::answer_v4(buffer, ip_len, error, mtu, src, self.ip_id, ttl)
                }
                IpAddr::V6(src) => {
                    let hop_limit = route.hoplimit.unwrap_or_else(|| self.hops.ipv6(&link.name));
                    icmp::answer_v6(buffer, ip_len, error, mtu, src, hop_limit)
                }
            };
            let Some(len) = made else { continue };
            rewrite::set_macs(pool.resize(id, len), dst_mac, link.mac);
            // The error is whole: nothing of the packet's offload applies to it.
            pool.set_offload(id, Offload::NONE);
            fates[i] = Fate::Icmp(error, route.dev);
        }
    }

    /// The hop limit metric of the route an IPv4 segment rejected with a reset held
    /// (`skb_dst` of the segment, whose `ip4_dst_hoplimit` the reset takes): at
    /// prerouting the route to its source the kernel gives it to reject it
    /// (`nf_reject_fill_skb_dst`; none, and there is no reset), at forward the route it
    /// came to leave by. IPv6 (whose reset takes its own route's): none.
    fn segment_hoplimit(
        &self,
        snap: &Snapshot,
        iif: LinkIndex,
        i: usize,
        at_prerouting: bool,
    ) -> Result<Option<u8>, NoRoute> {
        let Input::V4(p) = &self.inputs[i] else {
            return Ok(None);
        };
        if at_prerouting {
            snap.route(&Query::to(IpAddr::V4(p.src)))
                .map(|a| a.hoplimit)
        } else {
            Ok(snap.route(&query4(iif, p)).ok().and_then(|a| a.hoplimit))
        }
    }

    /// The segments rejected with a TCP reset, each made into its reset and sent back by
    /// the route from its destination to its source, as the kernel's `nf_send_reset`
    /// routes it (`ip_route_me_harder`: a route this host takes, the segment's
    /// destination as the source).
    #[allow(clippy::too_many_arguments)]
    fn send_resets(
        &mut self,
        mut table: Option<&mut Conntrack>,
        snap: &Snapshot,
        neighbours: &impl Neighbours,
        iif: LinkIndex,
        pool: &mut Pool,
        packets: &[BufferId],
        fates: &mut [Fate],
    ) {
        let resets = std::mem::take(&mut self.resets);
        let clock = self.limit.overall().now();
        for &(i, at, tracked, at_prerouting) in &resets {
            let id = packets[i];
            let v6 = match self.inputs[i] {
                Input::V4(_) => false,
                Input::V6(_) => true,
                _ => continue,
            };
            // (An IPv4 segment rejected at prerouting with no route to its source is
            // not answered: `nf_reject_fill_skb_dst` fails.)
            let Ok(segment_hoplimit) = self.segment_hoplimit(snap, iif, i, at_prerouting) else {
                self.unanswered.no_route_back += 1;
                continue;
            };
            let size = pool.buffer_size();
            // The hop count is set once the route back is found.
            let Some(len) = reset::make(pool.resize(id, size), at, v6, self.hops.ipv4) else {
                continue;
            };
            // A reset answering a packet tracking found invalid carries no connection:
            // once the host has a route for it, the kernel's conntrack tracks it as the
            // host's own packet (`LOCAL_OUT`), and NAT translates it as a packet of the
            // connection it belongs to, if one. Being that connection's first packet in
            // its reply direction, it ends the connection.
            let answers_invalid = tracked.is_none_or(|t| t.state() == State::Invalid);
            if let Some(table) = table.as_deref_mut().filter(|_| answers_invalid) {
                if reset_route(snap, pool.frame(id), v6).is_none() {
                    self.unanswered.no_route_back += 1;
                    continue;
                }
                if self.tracked & (1 << u8::from(v6)) != 0 {
                    let now = self.times.get(i).copied().unwrap_or(clock);
                    let ip = &mut pool.frame_mut(id)[ETHERNET_LEN..len];
                    let own = table.track_in_vector(ip, now, true);
                    let translated = !self.rules.translates(v6)
                        || [Manip::Destination, Manip::Source]
                            .into_iter()
                            .all(|m| table.translate(&own, ip, m, false));
                    if !translated {
                        self.unanswered.dropped_by_nat += 1;
                        continue;
                    }
                }
            }
            // Translated by the connection it carries, as the kernel's NAT translates
            // it: from and to where it then goes.
            let tracked = tracked.filter(|_| self.rules.translates(v6));
            if let (Some(t), Some(table)) = (tracked, table.as_deref()) {
                table.translate_answer(&t, &mut pool.frame_mut(id)[ETHERNET_LEN..]);
            }
            let Some(route) = reset_route(snap, pool.frame(id), v6) else {
                self.unanswered.no_route_back += 1;
                continue;
            };
            let Some(link) = snap.link(route.dev) else {
                self.unanswered.no_route_back += 1;
                continue;
            };
            if let (Some(t), Some(table)) = (tracked, table.as_deref_mut()) {
                if !self.reset_leaves(snap, table, &t, pool.frame(id), &route) {
                    self.unanswered.dropped_by_nat += 1;
                    continue;
                }
            }
            let Some(dst_mac) = way_back(
                &mut self.unanswered,
                &mut self.unresolved,
                neighbours,
                &route,
                (iif, pool.frame(id), route.dst),
            ) else {
                continue;
            };
            let frame = pool.resize(id, len);
            // A route's hop limit, else the namespace's (IPv4) or the link's (IPv6):
            // `ip4_dst_hoplimit`, `ip6_dst_hoplimit`. IPv6 takes the reset's own route;
            // IPv4 (`nf_send_reset`) the rejected segment's: at forward, the route it
            // was to leave by, at prerouting the route to its source.
            let hoplimit = if v6 { route.hoplimit } else { segment_hoplimit };
            let hops = match hoplimit {
                Some(h) => h,
                None if v6 => self.hops.ipv6(&link.name),
                None => self.hops.ipv4,
            };
            reset::set_hops(frame, v6, hops);
            rewrite::set_macs(frame, dst_mac, link.mac);
            pool.set_offload(id, Offload::NONE);
            fates[i] = Fate::Reset(route.dev);
        }
        self.resets = resets;
    }
}

/// The MAC address an answer to `back` (the packet `frame`'s source) goes to by
/// `route`: its next hop's; the packet's own sender's where the way back is the way it
/// came. `None` where the next hop is unresolved: counted in `unanswered`, and put in
/// `unresolved` for the kernel to be asked to resolve, so that the next answers go (the
/// kernel would queue this one).
fn way_back(
    unanswered: &mut Unanswered,
    unresolved: &mut Vec<(LinkIndex, IpAddr)>,
    neighbours: &impl Neighbours,
    route: &fibre_fib::Answer,
    (iif, frame, back): (LinkIndex, &[u8], IpAddr),
) -> Option<[u8; 6]> {
    let hop = route.gateway.unwrap_or(back);
    match neighbours.mac(route.dev, hop) {
        Some(m) => Some(m),
        None if route.dev == iif => EthernetFrame::new_checked(frame).ok().map(|e| e.source()),
        None => {
            unanswered.unresolved += 1;
            if !unresolved.contains(&(route.dev, hop)) && unresolved.len() < 64 {
                unresolved.push((route.dev, hop));
            }
            None
        }
    }
}

/// The route a reset made in `frame` (IPv6 if `v6`) leaves by: from the rejected
/// segment's destination, whosever address it is, as the kernel's `ip_route_me_harder`
/// routes it (`FLOWI_FLAG_ANYSRC`: a rule `from` it applies); none unless unicast.
fn reset_route(snap: &Snapshot, frame: &[u8], v6: bool) -> Option<fibre_fib::Answer> {
    let (back, from) = input::addresses(frame, v6)?;
    let route = snap.route(&Query {
        src: Some(from),
        ipproto: 6,
        any_source: true,
        ..Query::to(back)
    });
    route.ok().filter(|a| a.kind == RouteType::Unicast)
}
