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

/// The number under which verdicts are kept: one for each pair of rules and routes
/// the table's packets met (see `Conntrack::epoch`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Epoch(pub(crate) u32);

/// Bits of a stamp below the epoch's number: for each direction, whether kept, and
/// whether in the NEW state.
pub(crate) const FLAGS: u32 = 4;

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

/// The bits of a verdict kept for direction `dir` (0 original, 1 reply) in the NEW state
/// (`new`) or ESTABLISHED.
fn bits(new: bool, dir: usize) -> u32 {
    1 << dir | u32::from(new) << (dir + 2)
}

/// What the table holds of the epochs: the current one, and the rules and routes it
/// numbers.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Epochs {
    pub(crate) current: u32,
    of: (u64, u64),
}

impl Epochs {
    /// The epoch of the rules numbered `rules` and the routes and links numbered
    /// `routes`: the current one while they stay, a new one when either changes; and
    /// whether the numbers came round again (what was kept under the old ones must go).
    pub(crate) fn of(&mut self, rules: u64, routes: u64) -> (Epoch, bool) {
        let mut wrapped = false;
        if self.current == 0 || self.of != (rules, routes) {
            self.of = (rules, routes);
            self.current = self.current.wrapping_add(1 << FLAGS);
            if self.current == 0 {
                self.current = 1 << FLAGS;
                wrapped = true;
            }
        }
        (Epoch(self.current), wrapped)
    }
}

impl Kept {
    /// The links (in, out) the packets of direction `dir` were kept as coming in and
    /// leaving by, if kept under `epoch` in the NEW state (`new`) or ESTABLISHED.
    #[inline]
    pub(crate) fn links(&self, new: bool, dir: usize, epoch: Epoch) -> Option<(u32, u32)> {
        let mine = (1 << dir) | (1 << (dir + 2));
        (self.stamp >> FLAGS << FLAGS == epoch.0 && self.stamp & mine == bits(new, dir))
            .then_some((u32::from(self.links[dir][0]), u32::from(self.links[dir][1])))
    }

    /// Keeps that the packets of direction `dir`, NEW (`new`) or ESTABLISHED, pass every
    /// chain under `epoch`, coming in by `iif` and leaving by `oif`; a verdict the other
    /// direction kept under another epoch goes.
    pub(crate) fn keep(&mut self, new: bool, dir: usize, epoch: Epoch, iif: u16, oif: u16) {
        if self.stamp >> FLAGS << FLAGS != epoch.0 {
            self.stamp = epoch.0;
        }
        let mine = (1 << dir) | (1 << (dir + 2));
        self.stamp = self.stamp & !mine | bits(new, dir);
        self.links[dir] = [iif, oif];
    }
}
