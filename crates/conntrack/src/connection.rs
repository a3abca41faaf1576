//! A tracked connection and a packet's outcome, as the table and NAT share them: the
//! packet's state for the rules ([`State`]) and fate ([`Fate`]), the connection's tuples,
//! status bits, timer and protocol state ([`Connection`]), and what one worker's table
//! tells another's ([`Forward`]).

use crate::kept::Kept;
use crate::tcp::{Tcp, TcpState};
use crate::tuple::Tuple;

/// A packet's state, as `ct state` matches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Part of no connection the kernel would track.
    Invalid,
    /// A connection's packet once a reply was seen, or a reply.
    Established,
    /// An ICMP error about a connection.
    Related,
    /// The original direction of a connection not yet answered.
    New,
    /// Not tracked (ICMPv6 neighbour discovery and MLD).
    Untracked,
}

impl State {
    /// The state's bit as `ct state` compares it (`NF_CT_STATE_BIT`).
    pub fn bit(self) -> u32 {
        match self {
            State::Invalid => 1,
            State::Established => 2,
            State::Related => 4,
            State::New => 8,
            State::Untracked => 64,
        }
    }

    /// The name `nft` gives it.
    pub fn name(self) -> &'static str {
        match self {
            State::Invalid => "invalid",
            State::Established => "established",
            State::Related => "related",
            State::New => "new",
            State::Untracked => "untracked",
        }
    }
}

/// Why a packet is not fibre's to track.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Untrackable {
    /// A fragment, which the kernel reassembles before tracking.
    Fragment,
    /// A protocol tracked by a tracker of the kernel's that fibre does not have (DCCP,
    /// GRE, SCTP, UDP-Lite).
    Protocol(u8),
}

/// What becomes of a tracked packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fate {
    /// It goes on, with its state.
    Pass,
    /// Dropped: the table is full and no connection could be dropped early to make
    /// room (the kernel's "table full, dropping packet").
    TableFull,
    /// The kernel's to forward.
    Kernel(Untrackable),
    /// Another worker's: its connection lies in that worker's table
    /// ([`Owners`](crate::Owners)).
    Elsewhere(u16),
}

/// Where a tracked packet's connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum At {
    None,
    Entry(u32),
    Pending(u64),
    /// Removed as the packet passed (an RST before any reply): held, by its ticket,
    /// until the vector is settled.
    Gone(u64),
}

/// A packet's outcome: its fate, its state, its direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracked {
    pub(crate) fate: Fate,
    pub(crate) state: State,
    pub(crate) reply: bool,
    pub(crate) at: At,
}

impl Tracked {
    pub(crate) fn of(state: State) -> Tracked {
        Tracked {
            fate: Fate::Pass,
            state,
            reply: false,
            at: At::None,
        }
    }

    pub(crate) fn fate(fate: Fate) -> Tracked {
        Tracked {
            fate,
            ..Tracked::of(State::Invalid)
        }
    }

    /// The packet's state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Whether the packet goes in its connection's reply direction.
    pub fn reply(&self) -> bool {
        self.reply
    }

    /// What becomes of it.
    pub fn outcome(&self) -> Fate {
        self.fate
    }

    /// What a packet the host sends in answer to this one carries (the TCP reset of a
    /// `reject`): its connection, the other way, RELATED (`nf_conntrack_attach`).
    pub fn answer(&self) -> Tracked {
        Tracked {
            state: State::Related,
            reply: !self.reply,
            ..*self
        }
    }
}

/// A time (or a span) in nanoseconds, held in 32-bit halves: a connection holding its
/// times so is aligned to 4 bytes, not 8, and its slot is 4 bytes smaller.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
#[repr(C, packed(4))]
pub struct Nanos(u64);

impl Nanos {
    /// The nanoseconds.
    #[inline]
    pub fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for Nanos {
    #[inline]
    fn from(ns: u64) -> Nanos {
        Nanos(ns)
    }
}

impl std::fmt::Debug for Nanos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}ns", self.get())
    }
}

/// A connection's protocol state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// TCP, with its state machine and windows.
    Tcp(Tcp),
    /// UDP: when, if answered and still alive, it becomes a stream.
    Udp {
        /// Two seconds after the connection began (nanoseconds).
        stream_after: Nanos,
    },
    /// ICMP or ICMPv6 queries and answers.
    Icmp,
    /// Any other protocol.
    Generic,
}

/// `IPS_SEEN_REPLY`.
pub const SEEN_REPLY: u32 = 1 << 1;
/// `IPS_ASSURED`.
pub const ASSURED: u32 = 1 << 2;
/// `IPS_CONFIRMED`.
pub const CONFIRMED: u32 = 1 << 3;

/// A tracked connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// Its tuples: the original direction's, the reply's.
    pub tuples: [Tuple; 2],
    /// The kernel's status bits (`IPS_*`: [`SEEN_REPLY`], [`ASSURED`], [`CONFIRMED`]).
    pub status: u32,
    /// Its mark (`ct mark`).
    pub mark: u32,
    /// When it expires (nanoseconds); until confirmed, how long it will live.
    pub expires: Nanos,
    /// Its protocol's state.
    pub protocol: Protocol,
    /// The link it was masqueraded out of (0: not masqueraded): a packet of it leaving
    /// by another link ends it (`nf_nat_oif_changed`).
    pub masquerade: u32,
    /// The verdict of the chains kept for its directions' packets ([`Kept`](crate::Kept)).
    pub kept: Kept,
}

impl Connection {
    /// Whether the kernel may drop it early to make room (`early_drop`): unassured, or
    /// a TCP connection closing.
    pub(crate) fn droppable(&self) -> bool {
        self.status & ASSURED == 0 || matches!(self.protocol, Protocol::Tcp(ref t) if t.closing())
    }

    /// Whether its reply is its original inverted: no NAT changed it.
    pub fn untranslated(&self) -> bool {
        self.tuples[0].inverted() == Some(self.tuples[1])
    }

    /// Its TCP state, if TCP.
    pub fn tcp_state(&self) -> Option<TcpState> {
        match self.protocol {
            Protocol::Tcp(ref t) => Some(t.state),
            _ => None,
        }
    }
}

/// What one worker's table tells another's of a connection whose tuple hashes there
/// ([`Owners`](crate::Owners)): the tuple, and the worker whose table holds the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forward {
    /// Held from now on.
    Add(Tuple, u16),
    /// No longer held.
    Remove(Tuple, u16),
}
