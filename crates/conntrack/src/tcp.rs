//! TCP tracked as the kernel's `nf_conntrack_proto_tcp.c` tracks it: a state machine
//! driven by a table (the connection's state × the direction × the kind of segment →
//! the next state), kept as a table below so that it can be held against the kernel's
//! `tcp_conntracks`, and the window checks of "Real Stateful TCP Packet Filtering"
//! (Guido van Rooij), which decide whether a segment lies in what each side may send:
//!
//! ```text
//! td_maxend = max(sack + max(win,1)) seen in reply packets
//! td_maxwin = max(max(win, 1)) + (sack - ack) seen in sent packets
//! td_end    = max(seq + len) seen in sent packets
//!
//! I.   seq <= sender.td_maxend                          (upper bound for data)
//! II.  seq + len >= sender.td_end - receiver.td_maxwin  (lower bound for data)
//! III. sack <= receiver.td_end                          (upper bound for an ack)
//! IV.  sack >= receiver.td_end - MAXACKWINDOW           (lower bound for an ack)
//! ```
//!
//! A segment outside them is invalid (or, where the kernel says so, let pass without
//! changing the connection: "ignored"); the namespace's `nf_conntrack_tcp_be_liberal`,
//! `_loose`, `_max_retrans` and `_ignore_invalid_rst` change the checks as they change
//! the kernel's. What the kernel keeps per connection is kept here, field for field,
//! so that a connection imported from the kernel carries on as it would have there.

use crate::settings::{Settings, TcpTimeouts};

/// The states of a TCP connection, numbered as the kernel numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
#[repr(u8)]
pub enum TcpState {
    /// Nothing seen yet.
    #[default]
    None = 0,
    /// A SYN seen.
    SynSent = 1,
    /// A SYN/ACK seen.
    SynRecv = 2,
    /// The handshake's ACK seen.
    Established = 3,
    /// A FIN seen.
    FinWait = 4,
    /// The FIN acknowledged.
    CloseWait = 5,
    /// FINs seen both ways.
    LastAck = 6,
    /// The last ACK seen.
    TimeWait = 7,
    /// Reset.
    Close = 8,
    /// A SYN seen from each side (a simultaneous open).
    SynSent2 = 9,
}

impl TcpState {
    /// The name `conntrack -L` prints.
    pub fn name(self) -> &'static str {
        [
            "NONE",
            "SYN_SENT",
            "SYN_RECV",
            "ESTABLISHED",
            "FIN_WAIT",
            "CLOSE_WAIT",
            "LAST_ACK",
            "TIME_WAIT",
            "CLOSE",
            "SYN_SENT2",
        ][self as usize]
    }

    /// The state of the kernel's number (as ctnetlink gives it).
    pub fn of(number: u8) -> Option<TcpState> {
        use TcpState::*;
        [
            None,
            SynSent,
            SynRecv,
            Established,
            FinWait,
            CloseWait,
            LastAck,
            TimeWait,
            Close,
            SynSent2,
        ]
        .get(usize::from(number))
        .copied()
    }

    fn timeout(self, t: &TcpTimeouts) -> u64 {
        match self {
            TcpState::None | TcpState::SynSent => t.syn_sent,
            TcpState::SynRecv => t.syn_recv,
            TcpState::Established => t.established,
            TcpState::FinWait => t.fin_wait,
            TcpState::CloseWait => t.close_wait,
            TcpState::LastAck => t.last_ack,
            TcpState::TimeWait => t.time_wait,
            TcpState::Close => t.close,
            TcpState::SynSent2 => t.syn_sent2,
        }
    }
}

/// What the transition table gives: a state, or the kernel's two marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    To(TcpState),
    /// `sIV`: invalid.
    Invalid,
    /// `sIG`: let pass, the connection unchanged (it may be out of step).
    Ignore,
}

/// The kind of a segment, by its flags, as `get_conntrack_index` sorts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Syn = 0,
    SynAck = 1,
    Fin = 2,
    Ack = 3,
    Rst = 4,
    None = 5,
}

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;
const URG: u8 = 0x20;
const ECE: u8 = 0x40;
const CWR: u8 = 0x80;

fn kind(flags: u8) -> Kind {
    if flags & RST != 0 {
        Kind::Rst
    } else if flags & SYN != 0 {
        if flags & ACK != 0 {
            Kind::SynAck
        } else {
            Kind::Syn
        }
    } else if flags & FIN != 0 {
        Kind::Fin
    } else if flags & ACK != 0 {
        Kind::Ack
    } else {
        Kind::None
    }
}

/// The kernel's `tcp_conntracks`: `[direction][kind][state]`, states in the order
/// NO, SS, SR, ES, FW, CW, LA, TW, CL, S2.
const TRANSITIONS: [[[Next; 10]; 6]; 2] = {
    use Next::{Ignore as IG, Invalid as IV};
    const NO: Next = Next::To(TcpState::None);
    const SS: Next = Next::To(TcpState::SynSent);
    const SR: Next = Next::To(TcpState::SynRecv);
    const ES: Next = Next::To(TcpState::Established);
    const FW: Next = Next::To(TcpState::FinWait);
    const CW: Next = Next::To(TcpState::CloseWait);
    const LA: Next = Next::To(TcpState::LastAck);
    const TW: Next = Next::To(TcpState::TimeWait);
    const CL: Next = Next::To(TcpState::Close);
    const S2: Next = Next::To(TcpState::SynSent2);
    let _ = NO;
    [
        // ORIGINAL     NO  SS  SR  ES  FW  CW  LA  TW  CL  S2
        [
            /* syn    */ [SS, SS, IG, IG, IG, IG, IG, SS, SS, S2],
            /* synack */ [IV, IV, SR, IV, IV, IV, IV, IV, IV, SR],
            /* fin    */ [IV, IV, FW, FW, LA, LA, LA, TW, CL, IV],
            /* ack    */ [ES, IV, ES, ES, CW, CW, TW, TW, CL, IV],
            /* rst    */ [IV, CL, CL, CL, CL, CL, CL, CL, CL, CL],
            /* none   */ [IV, IV, IV, IV, IV, IV, IV, IV, IV, IV],
        ],
        // REPLY        NO  SS  SR  ES  FW  CW  LA  TW  CL  S2
        [
            /* syn    */ [IV, S2, IV, IV, IV, IV, IV, SS, IV, S2],
            /* synack */ [IV, SR, IG, IG, IG, IG, IG, IG, IG, SR],
            /* fin    */ [IV, IV, FW, FW, LA, LA, LA, TW, CL, IV],
            /* ack    */ [IV, IG, SR, ES, CW, CW, TW, TW, CL, IG],
            /* rst    */ [IV, CL, CL, CL, CL, CL, CL, CL, CL, CL],
            /* none   */ [IV, IV, IV, IV, IV, IV, IV, IV, IV, IV],
        ],
    ]
};

/// The flag combinations `tcp_error` lets pass (PSH, ECE and CWR aside).
fn valid_flags(flags: u8) -> bool {
    [
        SYN,
        SYN | URG,
        SYN | ACK,
        RST,
        RST | ACK,
        FIN | ACK,
        FIN | ACK | URG,
        ACK,
        ACK | URG,
    ]
    .contains(&(flags & !(ECE | CWR | PSH)))
}

// `ip_ct_tcp_state.flags`.
const WINDOW_SCALE: u8 = 0x01;
const SACK_PERM: u8 = 0x02;
const CLOSE_INIT: u8 = 0x04;
const BE_LIBERAL: u8 = 0x08;
const DATA_UNACKNOWLEDGED: u8 = 0x10;
const MAXACK_SET: u8 = 0x20;
// `ip_ct_tcp.last_flags`.
const EXP_CHALLENGE_ACK: u8 = 0x40;
const SIMULTANEOUS_OPEN: u8 = 0x80;

const MAX_WSCALE: u8 = 14;
const MAXACKWINCONST: u32 = 66000;

/// What the tracker knows of one side, as `ip_ct_tcp_state`. Packed to two bytes, so
/// that its 18 bytes take 18 (not 20): a connection's slot stays under 180 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, packed(2))]
pub struct TcpSide {
    /// The highest sequence number sent, plus the segment's length.
    pub end: u32,
    /// The highest sequence number the other side allows (its ack plus window).
    pub maxend: u32,
    /// The largest window seen.
    pub maxwin: u32,
    /// The highest acknowledgement sent.
    pub maxack: u32,
    /// The window scale.
    pub scale: u8,
    /// The kernel's flags for the side.
    pub flags: u8,
}

/// A TCP connection's tracking state, as `ip_ct_tcp`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tcp {
    /// Each side: the original direction's sender first.
    pub seen: [TcpSide; 2],
    /// The connection's state.
    pub state: TcpState,
    last_dir: u8,
    retrans: u8,
    last_index: u8,
    last_seq: u32,
    last_ack: u32,
    last_end: u32,
    last_win: u16,
    last_wscale: u8,
    last_flags: u8,
}

impl Tcp {
    /// A connection's tracking as ctnetlink creates one from what it exports (the
    /// state, each side's window scale and flags): no window seen either way
    /// (`td_maxwin` 0), so that the first segment each way sets its side's window, as
    /// on a connection picked up mid-stream.
    pub fn imported(state: TcpState, scale: [u8; 2], flags: [u8; 2]) -> Tcp {
        let side = |d: usize| TcpSide {
            scale: scale[d].min(MAX_WSCALE),
            flags: flags[d],
            ..TcpSide::default()
        };
        Tcp {
            seen: [side(0), side(1)],
            state,
            ..Tcp::default()
        }
    }
}

/// A TCP segment as the tracker reads it.
pub(crate) struct Segment<'a> {
    seq: u32,
    ack_seq: u32,
    window: u16,
    flags: u8,
    /// The options, after the fixed 20 bytes.
    options: &'a [u8],
    /// The header's and payload's length (the IP packet's length past the IP headers).
    len: u32,
    header_len: u32,
}

impl<'a> Segment<'a> {
    /// The segment at the start of `l4` (which ends where the IP packet does); `None` if
    /// `tcp_error` finds it malformed (too short, a header length that does not fit,
    /// flags that do not go together).
    pub(crate) fn parse(l4: &'a [u8]) -> Option<Segment<'a>> {
        let h = l4.get(..20)?;
        let header_len = usize::from(h[12] >> 4) * 4;
        if header_len < 20 || l4.len() < header_len {
            return None;
        }
        let flags = h[13];
        if !valid_flags(flags) {
            return None;
        }
        Some(Segment {
            seq: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
            ack_seq: u32::from_be_bytes([h[8], h[9], h[10], h[11]]),
            window: u16::from_be_bytes([h[14], h[15]]),
            flags,
            options: &l4[20..header_len],
            len: l4.len() as u32,
            header_len: header_len as u32,
        })
    }

    fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// `segment_seq_plus_len`.
    fn end(&self) -> u32 {
        self.seq
            .wrapping_add(self.len - self.header_len)
            .wrapping_add(u32::from(self.has(SYN)))
            .wrapping_add(u32::from(self.has(FIN)))
    }

    /// The options each as (kind, data), as `tcp_options` and `tcp_sack` walk them.
    fn each_option(&self, mut f: impl FnMut(u8, &[u8]) -> bool) {
        let mut o = self.options;
        while let Some((&kind, rest)) = o.split_first() {
            match kind {
                0 => return,
                1 => o = rest,
                _ => {
                    let Some(&size) = rest.first() else { return };
                    let size = usize::from(size);
                    if size < 2 || size > o.len() {
                        return;
                    }
                    if !f(kind, &o[2..size]) {
                        return;
                    }
                    o = &o[size..];
                }
            }
        }
    }

    /// `tcp_options`: the window scale and SACK permission a SYN offers.
    fn options_into(&self, side: &mut TcpSide) {
        if self.options.is_empty() {
            return;
        }
        side.scale = 0;
        side.flags &= BE_LIBERAL;
        self.each_option(|kind, data| {
            if kind == 4 && data.is_empty() {
                side.flags |= SACK_PERM;
            } else if kind == 3 && data.len() == 1 {
                side.scale = data[0].min(MAX_WSCALE);
                side.flags |= WINDOW_SCALE;
            }
            true
        });
    }

    /// `tcp_sack`: the highest right edge of the SACK blocks, if above `sack`.
    fn sack(&self, sack: &mut u32) {
        if self.options.len() == 12 && self.options[..4] == [1, 1, 8, 10] {
            return;
        }
        self.each_option(|kind, data| {
            if kind == 5 && data.len() >= 8 && data.len() % 8 == 0 {
                for block in data.chunks_exact(8) {
                    let right = u32::from_be_bytes([block[4], block[5], block[6], block[7]]);
                    if after(right, *sack) {
                        *sack = right;
                    }
                }
                return false;
            }
            true
        });
    }
}

fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

fn after(a: u32, b: u32) -> bool {
    before(b, a)
}

/// What the tracker makes of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// In the connection: refresh it to live this long; `assured`: the connection is
    /// now assured (a valid ACK in ESTABLISHED after SYN_RECV, or an answer to a
    /// connection picked up).
    Accept { timeout: u64, assured: bool },
    /// In the connection, its timer left as it is (a retransmitted SYN before any reply).
    AcceptKeepTimer,
    /// Let pass, the connection unchanged.
    Ignore,
    /// Not part of the connection: the packet is invalid.
    Invalid,
    /// Invalid, and the connection, if it has longer left (and two minutes at least),
    /// lives only this long: a FIN or RST out of the window answering one the other
    /// way (`nf_tcp_handle_invalid`).
    InvalidShorten(u64),
    /// A SYN reopening a closed connection: the connection goes, and the packet starts
    /// a new one.
    Reopen,
    /// An RST before any reply: the connection goes once the packet is through.
    Close,
}

/// The status bits the tracker reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Status {
    pub seen_reply: bool,
    pub assured: bool,
}

impl Tcp {
    /// `tcp_new`: the state of a connection a segment opens, or `None` if it cannot open
    /// one (invalid).
    pub(crate) fn new(s: &Segment, settings: &Settings) -> Option<Tcp> {
        let mut t = Tcp::default();
        match TRANSITIONS[0][kind(s.flags) as usize][0] {
            Next::To(TcpState::SynSent) => {
                t.seen[0].end = s.end();
                t.seen[0].maxwin = u32::from(s.window).max(1);
                t.seen[0].maxend = t.seen[0].end;
                s.options_into(&mut t.seen[0]);
            }
            Next::To(_) if settings.tcp_loose => {
                t.seen[0].end = s.end();
                t.seen[0].maxwin = u32::from(s.window).max(1);
                t.seen[0].maxend = t.seen[0].end.wrapping_add(t.seen[0].maxwin);
                t.seen[0].flags = SACK_PERM | BE_LIBERAL;
                t.seen[1].flags = SACK_PERM | BE_LIBERAL;
            }
            _ => return None,
        }
        t.last_index = Kind::None as u8;
        Some(t)
    }

    /// Whether the kernel may drop the connection early to make room
    /// (`tcp_can_early_drop`).
    pub(crate) fn closing(&self) -> bool {
        matches!(
            self.state,
            TcpState::FinWait
                | TcpState::LastAck
                | TcpState::TimeWait
                | TcpState::Close
                | TcpState::CloseWait
        )
    }

    /// `nf_conntrack_tcp_packet`, from the state lock on: segment `s` in direction `dir`
    /// (0 original, 1 reply).
    pub(crate) fn packet(
        &mut self,
        s: &Segment,
        dir: usize,
        status: Status,
        settings: &Settings,
    ) -> Verdict {
        let old = self.state;
        let index = kind(s.flags);
        let mut next = TRANSITIONS[dir][index as usize][old as usize];
        let mut old_state = old;
        let mut skip_window = false;
        // The `switch (new_state)` of the kernel, case by case.
        match next {
            Next::To(TcpState::SynSent) if old >= TcpState::TimeWait => {
                if (self.seen[dir].flags | self.seen[1 - dir].flags) & CLOSE_INIT != 0
                    || (usize::from(self.last_dir) == dir && self.last_index == Kind::Rst as u8)
                {
                    return Verdict::Reopen;
                }
                if let Some(v) = self.ignored(s, dir, index, old, &mut next, &mut old_state) {
                    return v;
                }
            }
            Next::Ignore => {
                if let Some(v) = self.ignored(s, dir, index, old, &mut next, &mut old_state) {
                    return v;
                }
            }
            Next::Invalid => return Verdict::Invalid,
            // An RFC 5961 challenge ACK does not acknowledge the last FIN.
            Next::To(TcpState::TimeWait)
                if old == TcpState::LastAck
                    && index == Kind::Ack
                    && usize::from(self.last_dir) != dir
                    && self.last_index == Kind::Syn as u8
                    && self.last_flags & EXP_CHALLENGE_ACK != 0 =>
            {
                self.last_flags &= !EXP_CHALLENGE_ACK;
                return Verdict::Ignore;
            }
            Next::To(TcpState::SynSent2) => self.last_flags |= SIMULTANEOUS_OPEN,
            Next::To(TcpState::SynRecv)
                if dir == 1 && index == Kind::Ack && self.last_flags & SIMULTANEOUS_OPEN != 0 =>
            {
                next = Next::To(TcpState::Established);
            }
            Next::To(TcpState::Close) if index == Kind::Rst => {
                let r = self.reset(s, dir, old, status, settings);
                if r.invalid {
                    return Verdict::Invalid;
                }
                skip_window = r.skip_window;
                if r.keep_state {
                    next = Next::To(old);
                }
            }
            _ => {}
        }
        let Next::To(new) = next else {
            unreachable!("invalid and ignored segments have returned")
        };
        if !skip_window {
            match self.in_window(s, dir, index, settings) {
                Window::Ignore => return Verdict::Ignore,
                Window::Invalid => return self.invalid(dir, index, status, settings),
                Window::Accept => {}
            }
        }
        self.last_index = index as u8;
        self.last_dir = dir as u8;
        self.state = new;
        if old_state != new && new == TcpState::FinWait {
            self.seen[dir].flags |= CLOSE_INIT;
        }
        let t = &settings.tcp;
        let for_state = new.timeout(t);
        let timeout =
            if u32::from(self.retrans) >= settings.tcp_max_retrans && for_state > t.max_retrans {
                t.max_retrans
            } else if index == Kind::Rst {
                t.close
            } else if (self.seen[0].flags | self.seen[1].flags) & DATA_UNACKNOWLEDGED != 0
                && for_state > t.unacknowledged
            {
                t.unacknowledged
            } else if self.last_win == 0 && for_state > t.max_retrans {
                t.max_retrans
            } else {
                for_state
            };
        if !status.seen_reply {
            if s.has(RST) {
                return Verdict::Close;
            }
            if index == Kind::Syn && old_state == TcpState::SynSent {
                return Verdict::AcceptKeepTimer;
            }
            if new == TcpState::Established && timeout > t.unacknowledged {
                return Verdict::Accept {
                    timeout: t.unacknowledged,
                    assured: false,
                };
            }
            return Verdict::Accept {
                timeout,
                assured: false,
            };
        }
        let assured = !status.assured
            && matches!(old_state, TcpState::SynRecv | TcpState::Established)
            && new == TcpState::Established;
        Verdict::Accept { timeout, assured }
    }

    /// `nf_tcp_handle_invalid`: an assured connection notes a FIN or RST out of the
    /// window, or, when it answers one the other way, is to live no longer than
    /// unacknowledged data would.
    fn invalid(&mut self, dir: usize, index: Kind, status: Status, settings: &Settings) -> Verdict {
        if !status.assured || !matches!(index, Kind::Rst | Kind::Fin) {
            return Verdict::Invalid;
        }
        let last = self.last_index;
        if usize::from(self.last_dir) != dir && (last == Kind::Fin as u8 || last == Kind::Rst as u8)
        {
            return Verdict::InvalidShorten(settings.tcp.unacknowledged);
        }
        self.last_index = index as u8;
        self.last_dir = dir as u8;
        Verdict::Invalid
    }

    /// The `TCP_CONNTRACK_IGNORE` case (and SYN_SENT's fall into it): `Some` verdict to
    /// return, or `None` to go on with the state it resynchronised to.
    fn ignored(
        &mut self,
        s: &Segment,
        dir: usize,
        index: Kind,
        old: TcpState,
        next: &mut Next,
        old_state: &mut TcpState,
    ) -> Option<Verdict> {
        if index == Kind::SynAck
            && self.last_index == Kind::Syn as u8
            && usize::from(self.last_dir) != dir
            && s.ack_seq == self.last_end
        {
            // The SYN/ACK answers a SYN ignored before: both ends are in step, the
            // tracker takes their state from what it noted of that SYN.
            *old_state = TcpState::SynSent;
            *next = Next::To(TcpState::SynRecv);
            let last = usize::from(self.last_dir);
            self.seen[last].end = self.last_end;
            self.seen[last].maxend = self.last_end;
            self.seen[last].maxwin = u32::from(self.last_win).max(1);
            self.seen[last].scale = self.last_wscale;
            self.last_flags &= !EXP_CHALLENGE_ACK;
            self.seen[last].flags = self.last_flags;
            let this = &mut self.seen[dir];
            this.end = 0;
            this.maxend = 0;
            this.maxwin = 0;
            this.maxack = 0;
            this.scale = 0;
            this.flags &= BE_LIBERAL;
            return None;
        }
        self.last_index = index as u8;
        self.last_dir = dir as u8;
        self.last_seq = s.seq;
        self.last_end = s.end();
        self.last_win = s.window;
        if index == Kind::Syn && dir == 0 {
            let mut seen = TcpSide::default();
            self.last_flags = 0;
            self.last_wscale = 0;
            s.options_into(&mut seen);
            if seen.flags & WINDOW_SCALE != 0 {
                self.last_flags |= WINDOW_SCALE;
                self.last_wscale = seen.scale;
            }
            if seen.flags & SACK_PERM != 0 {
                self.last_flags |= SACK_PERM;
            }
            if old == TcpState::LastAck {
                self.last_flags |= EXP_CHALLENGE_ACK;
            }
        }
        if old == TcpState::SynSent && index == Kind::Ack && dir == 1 {
            self.last_ack = s.ack_seq;
        }
        Some(Verdict::Ignore)
    }

    /// The RST case of the kernel's switch.
    fn reset(
        &self,
        s: &Segment,
        dir: usize,
        old: TcpState,
        status: Status,
        settings: &Settings,
    ) -> Reset {
        let mut r = Reset::default();
        if self.closing() {
            r.skip_window = true;
            return r;
        }
        let other = &self.seen[1 - dir];
        let established = old == TcpState::Established && status.assured;
        if other.flags & MAXACK_SET != 0 && self.last_index != Kind::Syn as u8 {
            let seq = s.seq;
            if seq == 0 && !established {
                return r;
            }
            if before(seq, other.maxack) && !settings.tcp_ignore_invalid_rst {
                r.invalid = true;
                return r;
            }
            if !established || seq == other.maxack {
                return r;
            }
            if self.last_index == Kind::Ack as u8
                && usize::from(self.last_dir) == dir
                && seq == self.last_end
            {
                return r;
            }
            // Keeps its state, for a challenge ACK.
            r.keep_state = true;
        }
        // An RST answering a SYN or ACK let through, or a challenge ACK, skips the
        // window check.
        // An RST answering a SYN the other side sent (the kernel's fix of 2025 that
        // checks `last_dir`), or an ACK of a half-open connection.
        let answers_let_through = ((status.seen_reply
            && self.last_index == Kind::Syn as u8
            && usize::from(self.last_dir) != dir)
            || (!status.assured && self.last_index == Kind::Ack as u8))
            && s.ack_seq == self.last_end;
        let answers_challenge = old == TcpState::SynSent
            && self.last_index == Kind::Ack as u8
            && self.last_dir == 1
            && s.seq == self.last_ack;
        r.skip_window = answers_let_through || answers_challenge;
        r
    }

    /// `tcp_init_sender`.
    fn init_sender(&mut self, s: &Segment, dir: usize, end: u32, win: u32) {
        let (a, b) = self.seen.split_at_mut(1);
        let (sender, receiver) = if dir == 0 {
            (&mut a[0], &mut b[0])
        } else {
            (&mut b[0], &mut a[0])
        };
        sender.end = end;
        sender.maxend = end;
        sender.maxwin = win.max(1);
        s.options_into(sender);
        if dir == 1 && !(sender.flags & WINDOW_SCALE != 0 && receiver.flags & WINDOW_SCALE != 0) {
            sender.scale = 0;
            receiver.scale = 0;
        }
    }

    /// `tcp_in_window`.
    fn in_window(&mut self, s: &Segment, dir: usize, index: Kind, settings: &Settings) -> Window {
        let mut seq = s.seq;
        let mut ack = s.ack_seq;
        let mut sack = ack;
        let win_raw = s.window;
        let mut win = u32::from(win_raw);
        let mut end = s.end();
        if self.seen[1 - dir].flags & SACK_PERM != 0 {
            s.sack(&mut sack);
        }
        if self.seen[dir].maxwin == 0 {
            if s.has(SYN) {
                self.init_sender(s, dir, end, win);
                if !s.has(ACK) {
                    return Window::Accept;
                }
            } else {
                let scale = self.seen[dir].scale;
                let sender = &mut self.seen[dir];
                sender.end = end;
                let swin = win << scale;
                sender.maxwin = swin.max(1);
                sender.maxend = end.wrapping_add(sender.maxwin);
                let receiver = &mut self.seen[1 - dir];
                if receiver.maxwin == 0 {
                    receiver.end = sack;
                    receiver.maxend = sack;
                } else if sack == receiver.end.wrapping_add(1) {
                    receiver.end = receiver.end.wrapping_add(1);
                }
            }
        } else if s.has(SYN)
            && after(end, self.seen[dir].end)
            && matches!(self.state, TcpState::SynSent | TcpState::SynRecv)
        {
            self.init_sender(s, dir, end, win);
            if dir == 1 && !s.has(ACK) {
                return Window::Accept;
            }
        }
        if !s.has(ACK) || (s.flags & (ACK | RST) == ACK | RST && ack == 0) {
            ack = self.seen[1 - dir].end;
            sack = ack;
        }
        if s.has(RST) && seq == 0 && self.state == TcpState::SynSent {
            seq = self.seen[dir].end;
            end = seq;
        }
        let liberal = self.seen[dir].flags & BE_LIBERAL != 0 || settings.tcp_be_liberal;
        let judge = |w: Window| if liberal { Window::Accept } else { w };
        let sender = self.seen[dir];
        let receiver = self.seen[1 - dir];
        let max_ack_window = sender.maxwin.max(MAXACKWINCONST);
        let seq_ok = before(seq, sender.maxend.wrapping_add(1));
        if !seq_ok {
            let overshot = end.wrapping_sub(sender.maxend).wrapping_add(1);
            let ack_ok = after(
                sack,
                receiver.end.wrapping_sub(max_ack_window).wrapping_sub(1),
            );
            let in_recv_win = receiver.maxwin != 0
                && after(
                    end,
                    sender.end.wrapping_sub(receiver.maxwin).wrapping_sub(1),
                );
            if in_recv_win
                && ack_ok
                && overshot <= receiver.maxwin
                && before(sack, receiver.end.wrapping_add(1))
            {
                self.seen[dir].end = end;
                self.seen[dir].flags |= DATA_UNACKNOWLEDGED;
                return judge(Window::Ignore);
            }
            return judge(Window::Invalid);
        }
        if !before(sack, receiver.end.wrapping_add(1)) {
            return judge(Window::Invalid);
        }
        let in_recv_win = receiver.maxwin == 0
            || after(
                end,
                sender.end.wrapping_sub(receiver.maxwin).wrapping_sub(1),
            );
        if !in_recv_win {
            return judge(Window::Ignore);
        }
        if !after(
            sack,
            receiver.end.wrapping_sub(max_ack_window).wrapping_sub(1),
        ) {
            return judge(Window::Ignore);
        }
        if !s.has(SYN) {
            win <<= sender.scale;
        }
        let swin = win.wrapping_add(sack.wrapping_sub(ack));
        let sender = &mut self.seen[dir];
        if sender.maxwin < swin {
            sender.maxwin = swin;
        }
        if after(end, sender.end) {
            sender.end = end;
            sender.flags |= DATA_UNACKNOWLEDGED;
        }
        if s.has(ACK) {
            if sender.flags & MAXACK_SET == 0 {
                sender.maxack = ack;
                sender.flags |= MAXACK_SET;
            } else if after(ack, sender.maxack) {
                sender.maxack = ack;
            }
        }
        let sender_maxend = sender.maxend;
        let receiver = &mut self.seen[1 - dir];
        if receiver.maxwin != 0 && after(end, sender_maxend) {
            receiver.maxwin = receiver
                .maxwin
                .wrapping_add(end.wrapping_sub(sender_maxend));
        }
        if after(sack.wrapping_add(win), receiver.maxend.wrapping_sub(1)) {
            receiver.maxend = sack.wrapping_add(win);
            if win == 0 {
                receiver.maxend = receiver.maxend.wrapping_add(1);
            }
        }
        if ack == receiver.end {
            receiver.flags &= !DATA_UNACKNOWLEDGED;
        }
        if index == Kind::Ack {
            if usize::from(self.last_dir) == dir
                && self.last_seq == seq
                && self.last_ack == ack
                && self.last_end == end
                && self.last_win == win_raw
            {
                self.retrans = self.retrans.saturating_add(1);
            } else {
                self.last_dir = dir as u8;
                self.last_seq = seq;
                self.last_ack = ack;
                self.last_end = end;
                self.last_win = win_raw;
                self.retrans = 0;
            }
        }
        Window::Accept
    }
}

/// What `tcp_in_window` makes of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Window {
    Accept,
    Ignore,
    Invalid,
}

/// What the RST case decides.
#[derive(Clone, Copy, Debug, Default)]
struct Reset {
    /// An RST out of sequence: invalid.
    invalid: bool,
    /// Past the window check (an answer to what was let through).
    skip_window: bool,
    /// The connection keeps its state.
    keep_state: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(flags: u8, seq: u32, ack: u32, window: u16, payload: u32) -> Vec<u8> {
        let mut s = vec![0u8; 20 + payload as usize];
        s[4..8].copy_from_slice(&seq.to_be_bytes());
        s[8..12].copy_from_slice(&ack.to_be_bytes());
        s[12] = 5 << 4;
        s[13] = flags;
        s[14..16].copy_from_slice(&window.to_be_bytes());
        s
    }

    fn run(t: &mut Tcp, bytes: &[u8], dir: usize, seen_reply: bool) -> Verdict {
        let s = Segment::parse(bytes).unwrap();
        let status = Status {
            seen_reply,
            assured: false,
        };
        t.packet(&s, dir, status, &Settings::kernel_defaults())
    }

    #[test]
    fn a_handshake_establishes_and_a_close_ends_in_time_wait() {
        let settings = Settings::kernel_defaults();
        let syn = segment(SYN, 1000, 0, 65535, 0);
        let mut t = Tcp::new(&Segment::parse(&syn).unwrap(), &settings).unwrap();
        assert!(matches!(
            run(&mut t, &syn, 0, false),
            Verdict::Accept { .. }
        ));
        assert_eq!(t.state, TcpState::SynSent);
        run(&mut t, &segment(SYN | ACK, 5000, 1001, 65535, 0), 1, false);
        assert_eq!(t.state, TcpState::SynRecv);
        run(&mut t, &segment(ACK, 1001, 5001, 65535, 0), 0, true);
        assert_eq!(t.state, TcpState::Established);
        run(&mut t, &segment(ACK | PSH, 1001, 5001, 65535, 100), 0, true);
        run(&mut t, &segment(ACK, 5001, 1101, 65535, 0), 1, true);
        run(&mut t, &segment(FIN | ACK, 1101, 5001, 65535, 0), 0, true);
        assert_eq!(t.state, TcpState::FinWait);
        run(&mut t, &segment(FIN | ACK, 5001, 1102, 65535, 0), 1, true);
        assert_eq!(t.state, TcpState::LastAck);
        run(&mut t, &segment(ACK, 1102, 5002, 65535, 0), 0, true);
        assert_eq!(t.state, TcpState::TimeWait);
    }

    #[test]
    fn data_beyond_the_window_is_invalid_and_bad_flags_do_not_parse() {
        let settings = Settings::kernel_defaults();
        let syn = segment(SYN, 1000, 0, 1000, 0);
        let mut t = Tcp::new(&Segment::parse(&syn).unwrap(), &settings).unwrap();
        run(&mut t, &syn, 0, false);
        run(&mut t, &segment(SYN | ACK, 5000, 1001, 1000, 0), 1, false);
        run(&mut t, &segment(ACK, 1001, 5001, 1000, 0), 0, true);
        assert_eq!(
            run(
                &mut t,
                &segment(ACK, 1001 + 100_000, 5001, 1000, 10),
                0,
                true
            ),
            Verdict::Invalid
        );
        assert_eq!(
            run(
                &mut t,
                &segment(ACK, 1001, 5001 + 100_000, 1000, 0),
                0,
                true
            ),
            Verdict::Invalid
        );
        assert!(Segment::parse(&segment(SYN | FIN, 1, 0, 1, 0)).is_none());
        assert!(Segment::parse(&segment(0, 1, 0, 1, 0)).is_none());
        assert!(Segment::parse(&segment(ACK, 1, 0, 1, 0)[..19]).is_none());
    }

    #[test]
    fn a_syn_ack_cannot_open_and_an_ack_opens_only_when_loose() {
        let mut settings = Settings::kernel_defaults();
        let synack = segment(SYN | ACK, 1, 1, 1, 0);
        assert!(Tcp::new(&Segment::parse(&synack).unwrap(), &settings).is_none());
        let ack = segment(ACK, 1, 1, 1, 0);
        assert!(Tcp::new(&Segment::parse(&ack).unwrap(), &settings).is_some());
        settings.tcp_loose = false;
        assert!(Tcp::new(&Segment::parse(&ack).unwrap(), &settings).is_none());
    }
}
