//! Verdicts kept on connections. The router's chains are functions of what they read
//! of a packet, and most rulesets read only what every packet of a connection's
//! direction holds alike: its addresses and ports, its connection's state, and its links.
//! Once a packet's way through every hook's chains read nothing else and was accepted,
//! the packet path keeps that on its connection's direction, with the number of the
//! rules and routes it was decided under ([`Epoch`]), the state it was in and the links
//! it came in and left by; a later packet of that direction met under the same number,
//! in the same state, by the same links, is accepted without asking the chains again:
//! they would decide the same. Everything else (a change of rules, routes or links,
//! another state, another link in or out) asks them again.
//!
//! Only NEW and ESTABLISHED packets are kept: a RELATED packet's headers are an error's,
//! not its connection's, and INVALID and UNTRACKED ones have no connection.

use crate::table::{Conntrack, State, Tracked};

/// The number under which verdicts are kept: one for each pair of rules and routes
/// the table's packets met (see [`Conntrack::epoch`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Epoch(u32);

/// Bits of a stamp below the epoch's number: for each direction, whether kept, and
/// whether in the NEW state.
const FLAGS: u32 = 4;

/// That the packets of a connection's directions passed every chain: under which
/// epoch, in which state, by which links. One stamp serves both directions (kept under
/// another epoch, a direction is not kept), and the links are held in 16 bits (a
/// verdict by a link whose index is larger is not kept: it is only decided again), so
/// that a connection holds 12 bytes of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    /// The epoch's number (above [`FLAGS`] bits), then for each direction whether kept
    /// (bit 0 original, 1 reply) and whether NEW (bit 2, 3); 0: nothing kept.
    stamp: u32,
    /// For each direction, the links its packets came in by and left by.
    links: [[u16; 2]; 2],
}

/// The bits of `state` for direction `dir`, if a verdict in that state may be kept.
fn bits(state: State, dir: usize) -> Option<u32> {
    match state {
        State::Established => Some(1 << dir),
        State::New => Some(1 << dir | 1 << (dir + 2)),
        _ => None,
    }
}

/// What the table holds of the epochs: the current one, and the rules and routes it
/// numbers.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Epochs {
    current: u32,
    of: (u64, u64),
}

impl Conntrack {
    /// The epoch of the rules numbered `rules` and the routes and links numbered
    /// `routes`: the current one while they stay, a new one when either changes (every
    /// verdict kept before then no longer holds). Shared by whoever shares the table.
    pub fn epoch(&mut self, rules: u64, routes: u64) -> Epoch {
        let e = &mut self.epochs;
        if e.current == 0 || e.of != (rules, routes) {
            e.of = (rules, routes);
            e.current = e.current.wrapping_add(1 << FLAGS);
            if e.current == 0 {
                // Numbers come round again: what was kept under the old ones goes.
                for c in self.slots.iter_mut().flatten() {
                    c.kept = Kept::default();
                }
                self.epochs.current = 1 << FLAGS;
            }
        }
        Epoch(self.epochs.current)
    }

    /// The links (in, out) the packets of `t`'s direction were kept as coming in and
    /// leaving by, if kept under `epoch` in `t`'s state.
    #[inline]
    pub fn kept(&self, t: &Tracked, epoch: Epoch) -> Option<(u32, u32)> {
        self.keeping(t, epoch, false).1
    }

    /// Whether a verdict may be kept for `t`'s direction at all, and the links it was
    /// kept as coming in and leaving by under `epoch` ([`Conntrack::kept`]), from one
    /// look at its connection. Not where its tuples may still change: a NEW connection
    /// not yet bound by NAT where its family `translates` (its first packet is decided on
    /// the tuples before the binding).
    #[inline]
    pub fn keeping(
        &self,
        t: &Tracked,
        epoch: Epoch,
        translates: bool,
    ) -> (bool, Option<(u32, u32)>) {
        let Some(c) = self.connection(t) else {
            return (false, None);
        };
        let both = crate::nat::SRC_NAT_DONE | crate::nat::DST_NAT_DONE;
        if translates && t.state() == State::New && c.status & both != both {
            return (false, None);
        }
        let dir = usize::from(t.reply());
        let Some(want) = bits(t.state(), dir) else {
            return (true, None);
        };
        let k = c.kept;
        let mine = (1 << dir) | (1 << (dir + 2));
        let links = (k.stamp >> FLAGS << FLAGS == epoch.0 && k.stamp & mine == want)
            .then_some((u32::from(k.links[dir][0]), u32::from(k.links[dir][1])));
        (true, links)
    }

    /// Keeps that the packets of `t`'s direction, in its state, pass every chain under
    /// `epoch`, coming in by `iif` and leaving by `oif` (unless either's index takes
    /// more than 16 bits: then nothing is kept).
    pub fn keep(&mut self, t: &Tracked, epoch: Epoch, iif: u32, oif: u32) {
        let dir = usize::from(t.reply());
        let Some(want) = bits(t.state(), dir) else {
            return;
        };
        let (Ok(iif), Ok(oif)) = (u16::try_from(iif), u16::try_from(oif)) else {
            return;
        };
        if let Some(c) = self.connection_mut(t) {
            let k = &mut c.kept;
            if k.stamp >> FLAGS << FLAGS != epoch.0 {
                // The other direction's was kept under another epoch: it goes.
                k.stamp = epoch.0;
            }
            let mine = (1 << dir) | (1 << (dir + 2));
            k.stamp = k.stamp & !mine | want;
            k.links[dir] = [iif, oif];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Settings;

    fn udp(sport: u16, reply: bool) -> Vec<u8> {
        let (a, b) = ([10, 0, 0, 2], [10, 2, 0, 2]);
        let (src, dst, sp, dp) = if reply {
            (b, a, 53, sport)
        } else {
            (a, b, sport, 53)
        };
        let mut ip = vec![0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0];
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&dst);
        ip.extend_from_slice(&sp.to_be_bytes());
        ip.extend_from_slice(&dp.to_be_bytes());
        ip.extend_from_slice(&[0, 8, 0, 0]);
        ip
    }

    #[test]
    fn a_kept_verdict_holds_for_its_epoch_state_direction_and_link_only() {
        let mut table = Conntrack::new(Settings::kernel_defaults());
        let e = table.epoch(1, 1);
        assert_eq!(
            table.epoch(1, 1),
            e,
            "the same rules and routes: the same epoch"
        );
        let first = table.track(&udp(1000, false), 0, false);
        assert_eq!(first.state(), State::New);
        assert!(table.confirm(&first));
        let again = table.track(&udp(1000, false), 1, false);
        assert_eq!(table.kept(&again, e), None);
        table.keep(&again, e, 2, 7);
        assert_eq!(table.kept(&again, e), Some((2, 7)));
        // A link whose index takes more than 16 bits: not kept (the verdict is decided
        // again), and what was kept goes on holding.
        table.keep(&again, e, 70_000, 7);
        table.keep(&again, e, 2, 1 << 20);
        assert_eq!(table.kept(&again, e), Some((2, 7)));
        // The other direction is not kept; its reply makes the connection ESTABLISHED,
        // a state not kept either way.
        let reply = table.track(&udp(1000, true), 2, false);
        assert_eq!(reply.state(), State::Established);
        assert_eq!(table.kept(&reply, e), None);
        let on = table.track(&udp(1000, false), 3, false);
        assert_eq!(on.state(), State::Established);
        assert_eq!(table.kept(&on, e), None, "kept when NEW, not now");
        table.keep(&on, e, 2, 7);
        assert_eq!(table.kept(&on, e), Some((2, 7)));
        // Other rules, or other routes: a new epoch, nothing kept under it.
        let other = table.epoch(2, 1);
        assert_ne!(other, e);
        assert_eq!(table.kept(&on, other), None);
        let routes = table.epoch(2, 2);
        assert_ne!(routes, other);
        assert_eq!(table.kept(&on, routes), None);
        // Both directions under one epoch; one kept under the next ends the other's.
        let back = table.track(&udp(1000, true), 5, false);
        table.keep(&on, routes, 2, 7);
        table.keep(&back, routes, 7, 2);
        assert_eq!(table.kept(&on, routes), Some((2, 7)));
        assert_eq!(table.kept(&back, routes), Some((7, 2)));
        let next = table.epoch(3, 3);
        table.keep(&back, next, 7, 2);
        assert_eq!(table.kept(&back, next), Some((7, 2)));
        assert_eq!(table.kept(&on, next), None);
        // Another connection knows nothing of this one's.
        let second = table.track(&udp(1001, false), 4, false);
        assert_eq!(table.kept(&second, routes), None);
    }

    /// A connection ended in a vector leaves its slot empty until the vector ends: a
    /// later packet of the vector that had found it there meets no other connection
    /// (its stamp, its bindings) in it.
    #[test]
    fn a_slot_given_back_in_a_vector_is_taken_in_the_next_only() {
        let mut table = Conntrack::new(Settings::kernel_defaults());
        let a = table.track(&udp(1000, false), 0, false);
        assert!(table.confirm(&a));
        table.settle();
        let a = table.track_in_vector(&udp(1000, false), 1, false);
        let again = table.track_in_vector(&udp(1000, false), 1, false);
        table.end(&a);
        let b = table.track_in_vector(&udp(1001, false), 1, false);
        assert!(table.confirm(&b));
        assert_eq!(
            table.connection(&again),
            None,
            "the slot holds no one this vector"
        );
        assert_eq!(table.len(), 1);
        table.settle();
        let c = table.track_in_vector(&udp(1002, false), 2, false);
        assert!(table.confirm(&c));
        assert_eq!(table.len(), 2);
        assert_eq!(table.slots.len(), 2, "the slot taken again");
    }

    /// One look at the connection says what the two questions say: whether a verdict
    /// may be kept (not for a NEW connection NAT has not bound where the family
    /// translates) and what is kept.
    #[test]
    fn keeping_is_whether_it_may_be_kept_and_what_is() {
        let mut table = Conntrack::new(Settings::kernel_defaults());
        let e = table.epoch(1, 1);
        // One connection NAT bound both ways (to nothing), one it never bound.
        let first = table.track(&udp(1000, false), 0, false);
        for m in [crate::nat::Manip::Destination, crate::nat::Manip::Source] {
            table.bind(&first, m, None, 0);
        }
        assert!(table.confirm(&first));
        let unbound = table.track(&udp(1001, false), 0, false);
        assert!(table.confirm(&unbound));
        let again = table.track(&udp(1000, false), 1, false);
        assert_eq!(again.state(), State::New);
        assert_eq!(table.keeping(&again, e, true), (true, None));
        table.keep(&again, e, 2, 7);
        assert_eq!(table.keeping(&again, e, true), (true, Some((2, 7))));
        assert_eq!(table.keeping(&again, e, true).1, table.kept(&again, e));
        let other = table.epoch(2, 1);
        assert_eq!(table.keeping(&again, other, true), (true, None));
        let stranger = table.track(&udp(1001, false), 2, false);
        assert_eq!(table.keeping(&stranger, other, false), (true, None));
        table.keep(&stranger, other, 3, 4);
        assert_eq!(table.keeping(&stranger, other, false), (true, Some((3, 4))));
        assert_eq!(
            table.keeping(&stranger, other, true),
            (false, None),
            "NEW and not bound where the family translates"
        );
        // An ESTABLISHED packet's tuples are settled, bound or not.
        let reply = table.track(&udp(1001, true), 3, false);
        assert_eq!(reply.state(), State::Established);
        assert_eq!(table.keeping(&reply, other, true), (true, None));
        let lone = table.track(&udp(1002, false), 4, false);
        table.settle();
        assert_eq!(table.keeping(&lone, other, false), (false, None), "gone");
    }

    #[test]
    fn numbers_come_round_without_an_old_verdict_holding() {
        let mut table = Conntrack::new(Settings::kernel_defaults());
        let e = table.epoch(1, 1);
        let t = table.track(&udp(1000, false), 0, false);
        assert!(table.confirm(&t));
        let t = table.track(&udp(1000, false), 1, false);
        table.keep(&t, e, 2, 3);
        // The count made to wrap: the epoch after it must not find the old stamp.
        table.epochs.current = u32::MAX >> FLAGS << FLAGS;
        let wrapped = table.epoch(9, 9);
        assert_eq!(wrapped, Epoch(1 << FLAGS));
        assert_eq!(table.kept(&t, wrapped), None);
    }
}
