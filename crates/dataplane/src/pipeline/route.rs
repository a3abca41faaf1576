//! The route stage over a vector: each family's flows searched in the FIB together
//! ([`Snapshot::lookup_vector_v4`]), rules and all, each flow as it arrived on the
//! link; a packet with a unicast hop goes on to the neighbour stage, one this host
//! takes goes to the kernel, one the routes refuse is answered or dropped as the
//! kernel would.

use super::{Dropped, Fate, Handed, Pipeline};
use crate::icmp;
use crate::input::{Input, Packet4, Packet6};
use fibre_fib::{FlowVector, LinkIndex, NoRoute, Query, RouteType, Snapshot, VectorAnswers};
use std::net::IpAddr;
use std::time::Instant;

impl Pipeline {
    /// Routes the vector's IPv4 and IPv6 packets (sorted by the input stage), arrived
    /// on `iif`, with the routes of `snap`; returns each family's answers, which the
    /// neighbour stage reads.
    pub(super) fn route_stage<'s>(
        &mut self,
        snap: &'s Snapshot,
        iif: LinkIndex,
        fates: &mut [Fate],
    ) -> (VectorAnswers<'s>, VectorAnswers<'s>) {
        let t = Instant::now();
        self.errors.clear();
        self.forward4.clear();
        self.forward6.clear();
        let mut answers4 = self.answers4.take().unwrap_or_default().recycle();
        let mut answers6 = self.answers6.take().unwrap_or_default().recycle();
        let inputs = &self.inputs;
        if !self.v4.is_empty() {
            let v4 = &self.v4;
            let flow = FlowVector {
                iif: Some(iif),
                dst: &self.dst4,
                src: &self.src4,
            };
            snap.lookup_vector_v4(
                &flow,
                |k| match &inputs[v4[k]] {
                    Input::V4(p) => query4(iif, p),
                    _ => Query::to(IpAddr::V4(self.dst4[k])),
                },
                &mut answers4,
            );
            for (k, &i) in self.v4.iter().enumerate() {
                route_fate(&answers4, k, i, &mut self.forward4, fates, &mut self.errors);
            }
        }
        if !self.v6.is_empty() {
            let v6 = &self.v6;
            let flow = FlowVector {
                iif: Some(iif),
                dst: &self.dst6,
                src: &self.src6,
            };
            snap.lookup_vector_v6(
                &flow,
                |k| match &inputs[v6[k]] {
                    Input::V6(p) => query6(iif, p),
                    _ => Query::to(IpAddr::V6(self.dst6[k])),
                },
                &mut answers6,
            );
            let before = self.errors.len();
            for (k, &i) in self.v6.iter().enumerate() {
                route_fate(&answers6, k, i, &mut self.forward6, fates, &mut self.errors);
            }
            if self.kernel_answers_ipv6_rejects {
                self.errors.truncate(before);
            }
        }
        let routed = self.v4.len() + self.v6.len();
        self.route.add(routed, t);
        (answers4, answers6)
    }
}

/// The FIB's answer for flow `k` of a family's `answers`, packet `i`: a hop to forward
/// through (the packet and the answer's id go to `forward`), or its fate (and the error
/// that answers it, if the kernel answers it).
#[inline]
fn route_fate(
    answers: &VectorAnswers<'_>,
    k: usize,
    i: usize,
    forward: &mut Vec<(usize, u32)>,
    fates: &mut [Fate],
    errors: &mut Vec<(usize, icmp::Error, u32)>,
) {
    let id = answers.ids()[k];
    match answers.answer(id) {
        Ok(hop) if hop.kind == RouteType::Unicast => forward.push((i, id)),
        Ok(_) => fates[i] = Fate::Kernel(Handed::Local),
        Err(e) => {
            fates[i] = Fate::Drop(Dropped::NoRoute(e));
            let error = match e {
                NoRoute::NetworkUnreachable => icmp::Error::NetUnreachable,
                NoRoute::HostUnreachable => icmp::Error::HostUnreachable,
                NoRoute::Prohibited => icmp::Error::Prohibited,
                _ => return,
            };
            errors.push((i, error, 0));
        }
    }
}

/// IPv6's check of a forwarded packet's source (`ip6_forward`), for one that leaves by
/// another link than it came in on: `None` if it may leave; `Some(true)` if it may not
/// and is answered (a link-local source), `Some(false)` if it is dropped unanswered (the
/// unspecified address).
pub(super) fn source_scope(input: &Input, iif: LinkIndex, oif: LinkIndex) -> Option<bool> {
    let Input::V6(p) = input else { return None };
    if iif == oif {
        return None;
    }
    if p.src.is_unspecified() {
        Some(false)
    } else if p.src.is_unicast_link_local() {
        Some(true)
    } else {
        None
    }
}

/// The whole query of an IPv4 packet arriving on `iif` (rules on TOS, protocol and ports,
/// and the multipath hash, read them).
pub(super) fn query4(iif: LinkIndex, p: &Packet4) -> Query {
    let (sport, dport) = p.ports.unwrap_or((0, 0));
    Query {
        src: Some(IpAddr::V4(p.src)),
        iif: Some(iif),
        tos: p.tos,
        ipproto: p.protocol,
        sport,
        dport,
        ..Query::to(IpAddr::V4(p.dst))
    }
}

/// The whole query of an IPv6 packet arriving on `iif`.
fn query6(iif: LinkIndex, p: &Packet6) -> Query {
    let (sport, dport) = p.ports.unwrap_or((0, 0));
    Query {
        src: Some(IpAddr::V6(p.src)),
        iif: Some(iif),
        tos: p.traffic_class,
        ipproto: p.next_header,
        sport,
        dport,
        ..Query::to(IpAddr::V6(p.dst))
    }
}
