//! Verdicts kept on connections. The router's chains are functions of what they read
//! of a packet, and most rulesets read only what every packet of a connection's
//! direction holds alike: its addresses and ports, its links, its connection's state.
//! Once a packet's way through every hook's chains read nothing else and was accepted,
//! the packet path keeps that on its connection's direction, with the number of the
//! rules and routes it was decided under ([`Epoch`]), the state it was in and the link
//! it left by; a later packet of that direction met under the same number, in the same
//! state, leaving by the same link, is accepted without asking the chains again: they
//! would decide the same. Everything else (a change of rules, routes or links, another
//! state, another link) asks them again.
//!
//! Only NEW and ESTABLISHED packets are kept: a RELATED packet's headers are an error's,
//! not its connection's, and INVALID and UNTRACKED ones have no connection.

use crate::table::{Conntrack, State, Tracked};

/// The number under which verdicts are kept: one for each pair of rules and routes
/// the table's packets met (see [`Conntrack::epoch`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Epoch(u32);

/// That the packets of one direction of a connection passed every chain: under which
/// epoch, in which state, leaving by which link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    /// The epoch's number (even, never 0), its lowest bit set for the NEW state; 0 for
    /// nothing kept.
    stamp: u32,
    /// The link its packets left by.
    oif: u32,
}

/// The stamp of `epoch` for `state`, if a verdict in that state may be kept.
fn stamp(epoch: Epoch, state: State) -> Option<u32> {
    match state {
        State::Established => Some(epoch.0),
        State::New => Some(epoch.0 | 1),
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
            e.current = e.current.wrapping_add(2);
            if e.current == 0 {
                // Numbers come round again: what was kept under the old ones goes.
                for c in self.slots.iter_mut().flatten() {
                    c.kept = [Kept::default(); 2];
                }
                self.epochs.current = 2;
            }
        }
        Epoch(self.epochs.current)
    }

    /// The link the packets of `t`'s direction were kept as leaving by, if kept under
    /// `epoch` in `t`'s state.
    pub fn kept(&self, t: &Tracked, epoch: Epoch) -> Option<u32> {
        let s = stamp(epoch, t.state())?;
        let k = self.connection(t)?.kept[usize::from(t.reply())];
        (k.stamp == s).then_some(k.oif)
    }

    /// Keeps that the packets of `t`'s direction, in its state, pass every chain under
    /// `epoch`, leaving by `oif`.
    pub fn keep(&mut self, t: &Tracked, epoch: Epoch, oif: u32) {
        let Some(stamp) = stamp(epoch, t.state()) else {
            return;
        };
        if let Some(c) = self.connection_mut(t) {
            c.kept[usize::from(t.reply())] = Kept { stamp, oif };
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
        table.keep(&again, e, 7);
        assert_eq!(table.kept(&again, e), Some(7));
        // The other direction is not kept; its reply makes the connection ESTABLISHED,
        // a state not kept either way.
        let reply = table.track(&udp(1000, true), 2, false);
        assert_eq!(reply.state(), State::Established);
        assert_eq!(table.kept(&reply, e), None);
        let on = table.track(&udp(1000, false), 3, false);
        assert_eq!(on.state(), State::Established);
        assert_eq!(table.kept(&on, e), None, "kept when NEW, not now");
        table.keep(&on, e, 7);
        assert_eq!(table.kept(&on, e), Some(7));
        // Other rules, or other routes: a new epoch, nothing kept under it.
        let other = table.epoch(2, 1);
        assert_ne!(other, e);
        assert_eq!(table.kept(&on, other), None);
        let routes = table.epoch(2, 2);
        assert_ne!(routes, other);
        assert_eq!(table.kept(&on, routes), None);
        // Another connection knows nothing of this one's.
        let second = table.track(&udp(1001, false), 4, false);
        assert_eq!(table.kept(&second, routes), None);
    }

    #[test]
    fn numbers_come_round_without_an_old_verdict_holding() {
        let mut table = Conntrack::new(Settings::kernel_defaults());
        let e = table.epoch(1, 1);
        let t = table.track(&udp(1000, false), 0, false);
        assert!(table.confirm(&t));
        let t = table.track(&udp(1000, false), 1, false);
        table.keep(&t, e, 3);
        // The count made to wrap: the epoch after it must not find the old stamp.
        table.epochs.current = u32::MAX - 1;
        let wrapped = table.epoch(9, 9);
        assert_eq!(wrapped, Epoch(2));
        assert_eq!(table.kept(&t, wrapped), None);
    }
}
