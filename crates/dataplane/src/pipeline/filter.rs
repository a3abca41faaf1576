//! The filter stage over a vector: the router's filter rules ([`fibre_firewall::eval`])
//! at the prerouting, forward and postrouting hooks, for the packets to send, and at
//! prerouting for those to answer with an error; what they drop is neither sent nor
//! answered, what they reject is answered as the kernel answers it. The stage runs only
//! while the rules hold something or connections are tracked.

use super::{connections, Handed};
use super::{Dropped, Fate, Pipeline};
use crate::icmp;
use crate::input::{Input, ETHERNET_LEN};
use crate::pool::{BufferId, Pool};
use crate::reset;
use crate::rewrite;
use fibre_conntrack::Conntrack;
use fibre_conntrack::Tracked;
use fibre_fib::{LinkIndex, Snapshot};
use fibre_firewall::Verdict;
use fibre_firewall::{Hook, Part};
use fibre_headers::ipv6;
use std::time::Instant;

impl Pipeline {
    /// The filter stage: the vector's packets to send (`next`) and to answer through
    /// the rules, translated back where NAT asks it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn filter_stage(
        &mut self,
        mut table: Option<&mut Conntrack>,
        snap: &Snapshot,
        iif: LinkIndex,
        pool: &mut Pool,
        packets: &[BufferId],
        fates: &mut [Fate],
        next: &mut Vec<(usize, [u8; 6], [u8; 6])>,
    ) {
        let t = Instant::now();
        let checked =
            self.filter_vector(table.as_deref_mut(), snap, iif, pool, packets, fates, next);
        if let Some(table) = table.as_deref() {
            if self.rules.translates(false) || self.rules.translates(true) {
                self.untranslate(table, pool, packets, fates);
            }
        }
        self.filter.add(checked, t);
    }

    /// The filter stage: each packet to send (`next`) and each to answer with an error
    /// (`self.errors`), in the order they came, tracked (if its family's connections
    /// are) as the kernel's conntrack tracks it at prerouting, then put through the
    /// router's rules at prerouting, as received; each to send through them at forward
    /// and postrouting too, as those hooks see it, and its new connection confirmed if
    /// it passed. A packet they drop is neither sent nor answered, and gives back the
    /// buffers taken for its fragments. How many packets it put through the rules.
    #[allow(clippy::too_many_arguments)]
    fn filter_vector(
        &mut self,
        mut table: Option<&mut Conntrack>,
        snap: &Snapshot,
        iif: LinkIndex,
        pool: &mut Pool,
        packets: &[BufferId],
        fates: &mut [Fate],
        next: &mut Vec<(usize, [u8; 6], [u8; 6])>,
    ) -> usize {
        let input = connections::view(snap, iif);
        let clock = self.limit.overall().now();
        // In the order they came: a connection's packets change it in turn.
        let mut order = std::mem::take(&mut self.filter_order);
        order.clear();
        order.extend(next.iter().map(|n| (n.0, true)));
        order.extend(self.errors.iter().map(|e| (e.0, false)));
        // The kernel's prerouting chains see every packet before it is routed: those
        // routed to the host, or dropped by their route without an answer, too. (Where
        // their connections are tracked they met them in the conntrack stage.) One they
        // stop counts as filtered, one they reject is answered, unless the kernel has
        // its own copy (live, a packet for the host reaches the kernel as it came:
        // this answers it where no kernel is, offline).
        for (v6, list) in [(false, &self.v4), (true, &self.v6)] {
            if (table.is_some() && self.tracked & (1 << u8::from(v6)) != 0)
                || !self.rules.filters_at(Hook::Prerouting, v6)
            {
                continue;
            }
            order.extend(list.iter().filter_map(|&i| {
                matches!(
                    fates[i],
                    Fate::Kernel(Handed::Local) | Fate::Drop(Dropped::NoRoute(_))
                )
                .then_some((i, false))
            }));
        }
        order.sort_unstable_by_key(|o| o.0);
        // (A packet dropped by its route may be in both.)
        order.dedup_by_key(|o| o.0);
        let mut failed = std::mem::take(&mut self.failed);
        failed.clear();
        let mut rejects = std::mem::take(&mut self.rejects);
        rejects.clear();
        for &(i, to_send) in &order {
            let out = fates[i].output().filter(|_| to_send);
            let tracked = self.tracks.get(i).copied().flatten();
            // What the hooks decided, and whether at forward (where the packet's time
            // to live was taken down before the chains).
            let (verdict, forwarded) = match (tracked, table.as_deref_mut()) {
                // Tracked: the prerouting hook is behind it (the conntrack stage).
                (Some(t), Some(table)) => match out {
                    None => (Verdict::Accept, false),
                    Some(out) => {
                        let now = self.times.get(i).copied().unwrap_or(clock);
                        let new = table.unconfirmed(&t);
                        let verdict =
                            self.leave(snap, table, &t, i, input, out, pool, packets[i], now);
                        if verdict == Verdict::Accept && new {
                            self.claim(table, snap, &t);
                        }
                        (verdict, true)
                    }
                },
                _ => {
                    let frame = pool.frame(packets[i]);
                    match self
                        .rules
                        .prerouting_verdict(frame, input, None, Part::Whole)
                    {
                        Verdict::Accept => match out {
                            Some(out) => {
                                let p = fibre_firewall::Packet {
                                    frame,
                                    iif: input,
                                    oif: connections::view(snap, out),
                                };
                                (self.rules.forwarding_verdict(&p, None, Part::Whole), true)
                            }
                            None => (Verdict::Accept, false),
                        },
                        verdict => {
                            if !self.kernel_rejects_at_prerouting {
                                (verdict, false)
                            } else {
                                (Verdict::Drop, false)
                            }
                        }
                    }
                }
            };
            if verdict != Verdict::Accept {
                failed.push(i);
            }
            if let Verdict::Reject(r) = verdict {
                let id = packets[i];
                let offload = pool.offload(id);
                let vouched = offload.checksum.is_some() || offload.checksum_valid;
                if forwarded {
                    // The kernel's forward hook sees the time to live taken down.
                    let frame = pool.frame_mut(id);
                    match self.inputs[i] {
                        Input::V4(_) => rewrite::decrement_ttl(frame),
                        _ => rewrite::decrement_hop_limit(frame),
                    };
                }
                match self.rejection(i, r, pool.frame(id), vouched) {
                    Some(Rejection::Error(error)) => rejects.push((i, error, 0)),
                    Some(Rejection::Reset(at)) => {
                        self.resets.push((i, at, tracked, !forwarded));
                        // The reset closes the connection it answers.
                        if let (Some(t), Some(table)) = (tracked, table.as_deref_mut()) {
                            let now = self.times.get(i).copied().unwrap_or(clock);
                            table.set_closing(&t, now);
                        }
                    }
                    None => {}
                }
            }
        }
        if let Some(t) = table {
            self.release(t);
        }
        let checked = order.len();
        if !failed.is_empty() {
            next.retain(|n| !failed.contains(&n.0));
            self.errors.retain(|e| !failed.contains(&e.0));
        }
        self.errors.extend_from_slice(&rejects);
        for &i in &failed {
            if let Fate::Fragmented(_) = fates[i] {
                if let Some(k) = self.cut.iter().position(|c| c.0 == i) {
                    let (_, _, later) = self.cut.remove(k);
                    pool.free(&self.spare[later]);
                }
            }
            fates[i] = Fate::Drop(Dropped::Filtered);
        }
        self.filter_order = order;
        self.failed = failed;
        self.rejects = rejects;
        checked
    }

    /// The error that answers packet `i` (`frame`, as the hook that rejected it sees
    /// it; its checksum not to be checked if `vouched`: left to finish by its sender, or
    /// checked by its link), rejected by `r`: the
    /// unreachable of the code `r` gives its family, if the kernel would send one
    /// ([`icmp::reject_answers`]).
    pub(crate) fn rejection(
        &self,
        i: usize,
        r: fibre_firewall::Reject,
        frame: &[u8],
        vouched: bool,
    ) -> Option<Rejection> {
        let (v6, ip_len) = match self.inputs[i] {
            Input::V4(p) => (false, p.len as usize),
            Input::V6(p) => (true, ipv6::HEADER_LEN + p.len as usize),
            _ => return None,
        };
        let ip = frame.get(ETHERNET_LEN..(ETHERNET_LEN + ip_len).min(frame.len()))?;
        if r.resets() {
            return reset::answers(ip, v6, vouched).map(Rejection::Reset);
        }
        let code = r.unreachable_code(v6)?;
        icmp::reject_answers(ip, v6, vouched)
            .then_some(Rejection::Error(icmp::Error::Rejected(code)))
    }

    /// A packet the prerouting chains stopped with `verdict`: if rejected, its answer
    /// kept to make after the filter stage, unless the kernel, which sees its own copy,
    /// answers it itself. Whether it is answered with a TCP reset (which closes its
    /// connection, whoever sends it).
    pub(crate) fn reject_at_prerouting(
        &mut self,
        i: usize,
        verdict: Verdict,
        frame: &[u8],
        vouched: bool,
        tracked: Tracked,
    ) -> bool {
        let Verdict::Reject(r) = verdict else {
            return false;
        };
        match self.rejection(i, r, frame, vouched) {
            Some(Rejection::Error(error)) if !self.kernel_rejects_at_prerouting => {
                self.rejected.push((i, error, 0));
                false
            }
            Some(Rejection::Reset(at)) => {
                if !self.kernel_rejects_at_prerouting {
                    self.resets.push((i, at, Some(tracked), true));
                }
                true
            }
            _ => false,
        }
    }
}

/// How a rejected packet is answered.
pub(crate) enum Rejection {
    /// With this ICMP or ICMPv6 error.
    Error(icmp::Error),
    /// With a TCP reset; its TCP header starts here in the IP packet.
    Reset(usize),
}
