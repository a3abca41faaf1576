//! Address translation applied through the connection table: a connection's binding
//! chosen and registered ([`Conntrack::bind`], [`Conntrack::masquerade`]), asked of every
//! worker's connections while it is chosen, and its packets rewritten by it, both ways
//! ([`Conntrack::translate`], [`Conntrack::untranslate`]). What a binding is and how a
//! packet is rewritten is [`crate::nat`]'s.

use crate::connection::{State, Tracked};
use crate::nat::*;
use crate::table::Conntrack;
use crate::tuple::{self, Tuple};
use std::net::IpAddr;

/// The table, asked while a binding is chosen.
struct Asking<'t> {
    table: &'t mut Conntrack,
    now: u64,
}

impl Ports for Asking<'_> {
    fn used(&mut self, tuple: &Tuple) -> bool {
        tuple.inverted().is_some_and(|reply| {
            self.table.find(&reply, self.now).is_some() || self.table.registry().taken(&reply)
        })
    }

    fn random(&mut self) -> u16 {
        // xorshift64*.
        let mut x = self.table.random;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.table.random = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 48) as u16
    }
}

impl Conntrack {
    /// Whether a tracked packet's connection has its binding for `m` chosen
    /// (`nf_nat_initialized`): NAT rules are not asked again.
    pub fn bound(&self, t: &Tracked, m: Manip) -> bool {
        self.connection(t)
            .is_none_or(|c| c.status & m.done_bit() != 0)
    }

    /// Chooses a new connection's binding for `m` (`nf_nat_setup_info`): to `range`, or,
    /// with none, the null binding the kernel gives a connection no rule translates
    /// (which still moves its port off one another connection holds). Nothing for a
    /// connection already bound, or entered.
    pub fn bind(&mut self, t: &Tracked, m: Manip, range: Option<&Range>, now: u64) {
        if !self.unconfirmed(t) || self.bound(t, m) {
            return;
        }
        let Some(c) = self.connection(t) else { return };
        let reply = c.tuples[1];
        let Some(current) = reply.inverted() else {
            return;
        };
        let null;
        let range = match range {
            Some(r) => r,
            None => {
                let addr = match m {
                    Manip::Source => reply.dst,
                    Manip::Destination => reply.src,
                };
                null = Range {
                    flags: MAP_IPS,
                    min_addr: addr,
                    max_addr: addr,
                    ..Range::default()
                };
                &null
            }
        };
        let new = self.unique_tuple(&current, range, m, now);
        let Some(c) = self.connection_mut(t) else {
            return;
        };
        let reply = new.inverted().filter(|_| new != current);
        if let Some(r) = reply {
            c.tuples[1] = r;
            c.status |= m.nat_bit();
        }
        c.status |= m.done_bit();
        match (reply, m) {
            (None, _) => {}
            (Some(_), Manip::Source) => self.stats.source_translated += 1,
            (Some(_), Manip::Destination) => self.stats.destination_translated += 1,
        }
    }

    /// Notes that a new connection is masqueraded out of link `oif`.
    pub fn masquerade(&mut self, t: &Tracked, oif: u32) {
        if let Some(c) = self.connection_mut(t) {
            c.masquerade = oif;
        }
    }

    /// Whether a packet of a masqueraded connection, in its original direction, leaves
    /// by another link than the one it was masqueraded out of (`nf_nat_oif_changed`):
    /// the kernel ends the connection ([`Conntrack::end`]) and drops the packet.
    #[inline]
    pub fn left_its_link(&self, t: &Tracked, oif: u32) -> bool {
        // (ICMP errors RELATED to it are not held to it, as the kernel's error path.)
        t.state() != State::Related
            && !t.reply()
            && self
                .connection(t)
                .is_some_and(|c| c.masquerade != 0 && c.masquerade != oif)
    }

    /// Ends the masqueraded connections whose link and address `kept` no longer keeps
    /// (the link down, the address gone: the kernel's masquerade notifiers): how many.
    /// Their replies go to the kernel again.
    pub fn end_masqueraded(&mut self, kept: impl Fn(u32, std::net::IpAddr) -> bool) -> usize {
        let ended: Vec<u32> = self
            .slots_where(|c| c.masquerade != 0 && !kept(c.masquerade, c.tuples[1].destination()));
        for &slot in &ended {
            self.remove(slot);
        }
        ended.len()
    }

    /// Ends a tracked packet's connection, if entered.
    pub fn end(&mut self, t: &Tracked) {
        if let Some(slot) = self.slot_of(t) {
            self.remove(slot);
        }
    }

    /// `get_unique_tuple`: the tuple `original` becomes within `range`, unique.
    fn unique_tuple(&mut self, original: &Tuple, range: &Range, m: Manip, now: u64) -> Tuple {
        let mut asking = Asking { table: self, now };
        if m == Manip::Source && range.flags & PROTO_RANDOM_ALL == 0 {
            if in_range(original, m, range) {
                if !asking.used(original) {
                    return *original;
                }
            } else {
                let mapped =
                    asking
                        .table
                        .mapped_from(original)
                        .into_iter()
                        .find_map(|(address, port)| {
                            let r = Tuple {
                                src: address,
                                src_port: port,
                                ..*original
                            };
                            in_range(&r, m, range).then_some(r)
                        });
                if let Some(r) = mapped {
                    if !asking.used(&r) {
                        return r;
                    }
                }
            }
        }
        let mut t = *original;
        choose(&mut t, range, m, &mut asking);
        t
    }

    /// Rewrites a tracked packet `ip` as its connection's binding says at the hook that
    /// rewrites `m` (`nf_nat_packet`): the source at postrouting, the destination at
    /// prerouting, whichever direction it goes. An ICMP error RELATED to a connection
    /// has the packet it quotes rewritten too. False: the packet is to be dropped.
    /// `partial`: its transport checksum is left for the link to finish.
    #[inline]
    pub fn translate(&self, t: &Tracked, ip: &mut [u8], m: Manip, partial: bool) -> bool {
        // (Most packets are not rewritten at a hook: told so here, without a call.)
        t.state() != State::Related && !self.rewrites(t, m)
            || self.translate_packet(t, ip, m, partial)
    }

    /// [`Conntrack::translate`] of a packet its connection's binding may rewrite.
    fn translate_packet(&self, t: &Tracked, ip: &mut [u8], m: Manip, partial: bool) -> bool {
        let Some(c) = self.connection(t) else {
            return true;
        };
        let dir = usize::from(t.reply());
        let mut bit = m.nat_bit();
        if dir == 1 {
            bit ^= SRC_NAT | DST_NAT;
        }
        let related = t.state() == State::Related;
        if !related && c.status & bit == 0 {
            return true;
        }
        if !related {
            if let Some(n) = plain_network(ip, &c.tuples[dir]) {
                // (`manip_as` for TCP and UDP, whose status bit is checked above.)
                rewrite_ported(&c.tuples[1 - dir], ip, &n, m, partial);
                return true;
            }
        }
        let Ok(n) = tuple::network(ip) else {
            return true;
        };
        if related {
            // A redirect about a connection NAT has not finished with, or translated,
            // is dropped, before anything else.
            let done = SRC_NAT_DONE | DST_NAT_DONE;
            let redirect = !n.v6 && ip.get(n.transport) == Some(&5);
            if redirect && (c.status & done != done || c.status & (SRC_NAT | DST_NAT) != 0) {
                return false;
            }
            return c.status & bit == 0 || icmp_error(ip, &n, &c.tuples, dir, m, partial);
        }
        manip_as(c, dir, ip, &n, m, partial);
        true
    }

    /// Rewrites `ip`, a TCP reset the host sends for a `reject` of `t`'s packet, as the
    /// kernel's NAT rewrites it: the reset carries the packet's connection the other way
    /// ([`Tracked::answer`], `nf_ct_attach`), and the bindings apply to it as to a packet
    /// of that direction (`nf_nat_packet`), the destination at output, the source at
    /// postrouting. (A binding the hooks make for it changes the other direction only:
    /// the connection's bindings made so far are all that apply.)
    pub fn translate_answer(&self, t: &Tracked, ip: &mut [u8]) {
        let Some(c) = self.connection(t) else { return };
        let Ok(n) = tuple::network(ip) else { return };
        let dir = usize::from(t.answer().reply());
        for m in [Manip::Destination, Manip::Source] {
            manip_as(c, dir, ip, &n, m, false);
        }
    }

    /// Whether [`Conntrack::translate`] rewrites `t`'s packet at the hook that rewrites
    /// `m`: its connection's binding for `m` changed the packet's direction.
    #[inline]
    pub fn rewrites(&self, t: &Tracked, m: Manip) -> bool {
        self.connection(t).is_some_and(|c| {
            let mut bit = m.nat_bit();
            if t.reply() {
                bit ^= SRC_NAT | DST_NAT;
            }
            c.status & bit != 0
        })
    }

    /// Undoes [`Conntrack::translate`] of the destination: the packet as it came, for
    /// the kernel to be handed or an error to quote. (An ICMP error is left as it is.)
    pub fn untranslate(&self, t: &Tracked, ip: &mut [u8], partial: bool) {
        if self.error_source(t).is_none() {
            return;
        }
        let Some(c) = self.connection(t) else { return };
        if let Ok(n) = tuple::network(ip) {
            manip(
                ip,
                &n,
                &c.tuples[usize::from(t.reply())],
                Manip::Destination,
                partial,
            );
        }
    }

    /// Where an ICMP error answering `t`'s packet comes from, if NAT has it come from
    /// elsewhere than the host chose: where the packet was going before NAT changed
    /// its destination, as the kernel's NAT makes the error's outer header "look like
    /// the reply to an incoming packet" (`nf_nat_icmp_reply_translation`), whether or
    /// not the packet itself was translated yet.
    pub fn error_source(&self, t: &Tracked) -> Option<IpAddr> {
        let c = self.connection(t)?;
        let dir = usize::from(t.reply());
        let bit = if dir == 1 { SRC_NAT } else { DST_NAT };
        if c.status & bit == 0 || t.state() == State::Related {
            return None;
        }
        Some(c.tuples[dir].destination())
    }
}
