//! The router's stateless filter rules, evaluated as the kernel's `nft_do_chain`
//! evaluates them. Each base chain of type `filter` at the prerouting, forward or
//! postrouting hook of a table of family `ip`, `ip6` or `inet` is compiled, with the
//! chains it jumps or goes to, from the kernel's own expressions into operations on
//! registers, jumps resolved to indexes; fibre's packet path runs them on each packet it
//! forwards, as the kernel would at those hooks.
//!
//! Compiled are the expressions that read the packet and its links and decide:
//! `payload` (network and transport headers), `meta` (length, protocols, links' indexes,
//! names, types and groups, mark, packet type), `cmp`, `bitwise` (mask and xor),
//! `byteorder`, `range`, `lookup` (in sets and maps, verdict maps too),
//! `immediate` (data, and the verdicts accept, drop, continue, return, jump and goto) and
//! `counter` (which fibre does not add to the kernel's counters). Anything else does not
//! compile: the chain is not fibre's to evaluate ([`Refused`] says which rule and why),
//! and the gate closes its families.
//!
//! Registers are the kernel's: 16 bytes of verdict and sixteen 32-bit registers, the
//! four 16-byte registers of old (`NFT_REG_1` to `_4`) overlaying them; values are
//! written as the kernel writes them (host order for `meta`'s numbers, a byte or a
//! half-word zero-padded to 32 bits), so data compiled by `nft` compares alike.
//!
//! What each hook sees, as the kernel has it: prerouting the packet as received (no
//! output link: `meta oif` reads 0, `oifname` "", `oiftype` and `oifgroup` break the
//! rule); forward and postrouting the time to live (hop limit) already taken down by
//! one, with the IPv4 header checksum patched as `ip_decrease_ttl` patches it. Base
//! chains of one hook decide together: a packet passes the hook if none drops it (the
//! order among them changes nothing a stateless rule can see).

mod blocks;

use crate::lookup::Index;
use crate::message::{be32, string, Attributes, ElementData, Expression, Family};
use crate::ruleset::{Ruleset, TableEntry};
use blocks::Blocks;
use fibre_conntrack::nat::{self, Range};
use fibre_conntrack::Connection;
use std::cell::Cell;
use std::collections::HashMap;

/// A link as rules see it.
#[derive(Clone, Copy, Debug)]
pub struct Link<'a> {
    /// Its index.
    pub index: u32,
    /// Its name.
    pub name: &'a str,
    /// Its type (`ARPHRD_ETHER` is 1).
    pub kind: u16,
    /// Its group.
    pub group: u32,
}

/// What the `nat` chains `chains` decide for `frame` (`ip` its IP packet; its time to
/// live read as taken down if `forwarded`).
fn nat_of(
    chains: &[Program],
    frame: &[u8],
    ip: &[u8],
    forwarded: bool,
    iif: Link,
    oif: Option<Link>,
    ct: Option<&Ct>,
) -> NatVerdict {
    let info = Info::of(ip);
    for c in chains {
        match c.decide(frame, &info, forwarded, iif, oif, ct, None) {
            Decision::Drop | Decision::Reject(_) => return NatVerdict::Drop,
            Decision::Nat(t) => return NatVerdict::Bind(t),
            Decision::Accept => {}
        }
    }
    NatVerdict::None
}

/// The length of the Ethernet header a frame begins with (fibre hands frames with a
/// VLAN tag to the kernel).
pub const ETHERNET: usize = 14;

/// A packet to forward, as fibre's packet path holds it before rewriting it.
#[derive(Clone, Copy, Debug)]
pub struct Packet<'a> {
    /// The frame as received, from its Ethernet header on (the padding may follow the
    /// IP packet).
    pub frame: &'a [u8],
    /// The link it came in on.
    pub iif: Link<'a>,
    /// The link it leaves by.
    pub oif: Link<'a>,
}

/// A packet's connection as the rules read it (`ct`): what connection tracking made of
/// it at the prerouting hook.
#[derive(Clone, Copy, Debug)]
pub struct Ct<'a> {
    /// Its state (`ct state`'s bit).
    pub state: u32,
    /// Whether it goes in its connection's reply direction.
    pub reply: bool,
    /// Its connection: none if invalid or untracked.
    pub connection: Option<&'a Connection>,
    /// Where the chains say whether what they read of this packet every packet of
    /// its connection's direction holds alike (none: nobody asks).
    pub steady: Option<&'a Steady>,
}

/// Whether the chains a packet met read only what every packet of its connection's
/// direction holds alike: its addresses, transport protocol and ports, its links, and
/// its connection's state, direction, mark and tuples. The chains are functions of what
/// they read, so with the same chains, links and connection state every such packet
/// meets the same verdict, and the packet path may keep it for them. A read of
/// anything else (the packet's length, any other field of its headers, its link-layer
/// header, its connection's status bits) breaks it. What it takes as held alike, the
/// packet path must make so: the same links in and out, tuples NAT no longer changes,
/// and (where the transport is found past IPv6 extension headers, which the kernel's
/// conntrack and its rules walk apart) packets without them.
#[derive(Debug)]
pub struct Steady(Cell<bool>);

impl Default for Steady {
    fn default() -> Steady {
        Steady(Cell::new(true))
    }
}

impl Steady {
    /// Whether every read so far was of what the connection's direction holds alike.
    pub fn holds(&self) -> bool {
        self.0.get()
    }

    fn breaks(&self) {
        self.0.set(false);
    }
}

/// Whether `len` bytes at `offset` of header `base` (1 network, 2 transport) are the
/// same in every packet of a connection's direction (`info` this packet's): IPv4's
/// protocol and addresses, IPv6's addresses, and the ports of a transport whose first
/// four bytes are its ports, in a packet that is not a later fragment.
fn steady_payload(base: u32, offset: usize, len: usize, info: &Info) -> bool {
    let end = offset + len;
    match (base, info.nfproto) {
        (1, 2) => (offset == 9 && len == 1) || (offset >= 12 && end <= 20),
        (1, _) => offset >= 8 && end <= 40,
        // TCP, UDP, DCCP, SCTP, UDP-Lite.
        (2, _) => {
            info.fragoff == 0 && end <= 4 && matches!(info.l4, Some((6 | 17 | 33 | 132 | 136, _)))
        }
        _ => false,
    }
}

/// Conntrack's own hook at prerouting (`NF_IP_PRI_CONNTRACK`): chains before it see no
/// connection.
pub const CONNTRACK_PRIORITY: i32 = -200;

/// The hooks of the forwarding path, in the order a packet meets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// Before routing (`NF_INET_PRE_ROUTING`, 0).
    Prerouting,
    /// Forwarded (`NF_INET_FORWARD`, 2).
    Forward,
    /// Leaving (`NF_INET_POST_ROUTING`, 4).
    Postrouting,
}

impl Hook {
    /// The hook of the kernel's number, if it is on the forwarding path.
    pub fn of(number: u32) -> Option<Hook> {
        match number {
            0 => Some(Hook::Prerouting),
            2 => Some(Hook::Forward),
            4 => Some(Hook::Postrouting),
            _ => None,
        }
    }

    fn slot(self) -> usize {
        match self {
            Hook::Prerouting => 0,
            Hook::Forward => 1,
            Hook::Postrouting => 2,
        }
    }
}

/// Why a chain could not be compiled: the rule, and what in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The chain the rule is in.
    pub chain: String,
    /// The rule's handle (0: the chain itself).
    pub handle: u64,
    /// What fibre does not evaluate.
    pub what: String,
}

/// Where the kernel's NAT hooks sit: destination NAT at prerouting
/// (`NF_IP_PRI_NAT_DST`), source NAT at postrouting (`NF_IP_PRI_NAT_SRC`). Every `nat`
/// chain of a hook runs there, in its own priority's order among them.
pub const NAT_PRIORITY: [i32; 2] = [-100, 100];

/// Which of a hook's filter chains: all, or those before or after its NAT (a chain at
/// NAT's very priority counts as after it: the kernel puts a hook registered later
/// after one of equal priority, and NAT registers with the family's first `nat`
/// chain).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// All of them.
    Whole,
    /// Those before NAT.
    BeforeNat,
    /// Those after.
    AfterNat,
}

impl Part {
    fn holds(self, priority: i32, nat_at: i32) -> bool {
        match self {
            Part::Whole => true,
            Part::BeforeNat => priority < nat_at,
            Part::AfterNat => priority >= nat_at,
        }
    }
}

/// What a packet's NAT chains decided, for a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NatVerdict {
    /// No rule asked for a binding: the null binding.
    None,
    /// A chain dropped the packet.
    Drop,
    /// A rule asked for this one.
    Bind(Translation),
}

/// A `reject` statement (`nft_reject`): the packet dropped, and answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reject {
    /// `NFTA_REJECT_TYPE`: 0 an ICMP (or ICMPv6) destination unreachable with the
    /// packet's family's `code`, 1 a TCP reset, 2 (`icmpx`) a code that names one for
    /// each family.
    pub kind: u32,
    /// `NFTA_REJECT_ICMP_CODE`.
    pub code: u8,
    /// Whether its table is `inet`: `ip` and `ip6` tables answer no `icmpx` (they drop).
    pub inet: bool,
}

/// `icmpx` codes (`NFT_REJECT_ICMPX_*`: no route, port, host unreachable,
/// administratively prohibited) as each family's code: ICMP's, ICMPv6's.
const ICMPX: [(u8, u8); 4] = [(0, 0), (3, 4), (1, 3), (13, 1)];

impl Reject {
    /// Whether it answers with a TCP reset (`reject with tcp reset`).
    pub fn resets(self) -> bool {
        self.kind == 1
    }

    /// The destination unreachable code a packet of the family (IPv6 if `v6`) is
    /// answered with, as `nft_reject_inet_eval` (or the `ip`/`ip6` one) picks it: `None`
    /// where the kernel sends no ICMP error (a TCP reset, `icmpx` outside `inet`).
    pub fn unreachable_code(self, v6: bool) -> Option<u8> {
        match (self.kind, self.inet) {
            (0, _) => Some(self.code),
            (2, true) => ICMPX
                .get(usize::from(self.code))
                .map(|&(v4, v6_code)| if v6 { v6_code } else { v4 }),
            _ => None,
        }
    }
}

/// What the chains of a packet's hooks decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It goes on.
    Accept,
    /// It is dropped.
    Drop,
    /// It is dropped and answered.
    Reject(Reject),
}

/// The compiled filter of a ruleset: for IPv4 and IPv6, the base chains of each hook.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// By family (0 IPv4, 1 IPv6), then hook ([`Hook`] order).
    hooks: [[Vec<Program>; 3]; 2],
    /// The `nat` chains, by family, then prerouting and postrouting, in priority order.
    nat: [[Vec<Program>; 2]; 2],
    /// Whether the family has `nat` chains (so NAT binds each new connection).
    translates: [bool; 2],
    /// A number no other filter built had (0 for the empty one).
    id: u64,
}

/// The number of the next filter built.
static FILTERS_BUILT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Filter {
    /// The filter of every base chain of `ruleset` that forwarded packets meet and that
    /// compiles (those that do not are the gate's to refuse).
    pub fn of(ruleset: &Ruleset) -> Filter {
        let mut filter = Filter {
            id: FILTERS_BUILT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            ..Filter::default()
        };
        for t in ruleset.tables().filter(|t| !t.table.dormant()) {
            let families: &[usize] = match t.table.family {
                Family::Ip => &[0],
                Family::Ip6 => &[1],
                Family::Inet => &[0, 1],
                _ => continue,
            };
            for c in t.chains.values() {
                // A `nat` chain at any hook registers the family's NAT hooks, and so
                // the null bindings of forwarded connections.
                if c.chain.kind.as_deref() == Some("nat") && c.chain.hook.is_some() {
                    for &f in families {
                        filter.translates[f] = true;
                    }
                }
                let Some(hook) = c.chain.hook.as_ref().and_then(|h| Hook::of(h.number)) else {
                    continue;
                };
                if c.chain.kind.as_deref() == Some("nat") {
                    let at = match hook {
                        Hook::Prerouting => 0,
                        Hook::Postrouting => 1,
                        Hook::Forward => continue,
                    };
                    if let Ok(p) = Program::compile(t, &c.chain.name) {
                        for &f in families {
                            filter.nat[f][at].push(p.clone());
                        }
                    }
                    continue;
                }
                if c.chain.kind.as_deref().is_some_and(|k| k != "filter") {
                    continue;
                }
                if let Ok(p) = Program::compile(t, &c.chain.name) {
                    if p.decides_nothing() {
                        continue;
                    }
                    for &f in families {
                        filter.hooks[f][hook.slot()].push(p.clone());
                    }
                }
            }
        }
        for chains in filter.nat.iter_mut().flatten() {
            chains.sort_by_key(|p| p.priority);
        }
        // A family with `nat` chains in a table of another also binds (the kernel's
        // NAT hooks are the family's, registered by any `nat` chain, `inet` too).
        filter
    }

    /// A number that names this filter's content: every filter built gets one no other
    /// had; a clone keeps its original's (they decide alike). What a packet path keeps
    /// of the filter's verdicts it keeps while the number stays.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether new connections of IPv4 (`v6` false) or IPv6 are bound by NAT (the family
    /// has `nat` chains).
    pub fn translates(&self, v6: bool) -> bool {
        self.translates[usize::from(v6)]
    }

    /// What the `nat` chains of `hook` (prerouting or postrouting) decide for the first
    /// packet of a connection, `frame` (as it is at that hook), from `iif` to `oif`.
    pub fn nat(
        &self,
        hook: Hook,
        frame: &[u8],
        iif: Link,
        oif: Option<Link>,
        ct: Option<&Ct>,
    ) -> NatVerdict {
        let Some(ip) = frame.get(ETHERNET..) else {
            return NatVerdict::None;
        };
        let Some(f) = family(ip) else {
            return NatVerdict::None;
        };
        let chains = match hook {
            Hook::Prerouting => &self.nat[f][0],
            Hook::Postrouting => &self.nat[f][1],
            Hook::Forward => return NatVerdict::None,
        };
        let forwarded = hook == Hook::Postrouting;
        nat_of(chains, frame, ip, forwarded, iif, oif, ct)
    }

    /// What the postrouting `nat` chains decide for a packet this host sends out of
    /// `oif`, `frame` as it leaves, carrying connection `ct` whose source is not bound
    /// yet (a TCP reset of a `reject`, which the kernel's NAT puts through them). It
    /// came in by no link: the input link reads as index 0, no name, no type.
    pub fn nat_of_sent(&self, frame: &[u8], oif: Link, ct: Option<&Ct>) -> NatVerdict {
        let Some(ip) = frame.get(ETHERNET..) else {
            return NatVerdict::None;
        };
        let Some(f) = family(ip) else {
            return NatVerdict::None;
        };
        let none = Link {
            index: 0,
            name: "",
            kind: 0,
            group: 0,
        };
        nat_of(&self.nat[f][1], frame, ip, false, none, Some(oif), ct)
    }

    /// The same rules walked one by one, as the kernel walks them, without the blocks
    /// that skip those a packet cannot match: for measuring what the blocks save.
    pub fn walked(&self) -> Filter {
        let mut f = self.clone();
        for p in f.hooks.iter_mut().flatten().flatten() {
            p.blocks = vec![Blocks::default(); p.chains.len()];
        }
        f
    }

    /// Whether IPv4 (`v6` false) or IPv6 packets meet any rule or dropping policy.
    pub fn holds(&self, v6: bool) -> bool {
        self.hooks[usize::from(v6)].iter().any(|h| !h.is_empty())
    }

    /// Whether IPv4 (`v6` false) or IPv6 packets meet filter chains at `hook`: without,
    /// its verdict is to accept, and the packet path need not ask for it.
    pub fn filters_at(&self, hook: Hook, v6: bool) -> bool {
        !self.hooks[usize::from(v6)][hook.slot()].is_empty()
    }

    /// Whether any rule reads a packet's connection (`ct`).
    pub fn reads_connections(&self) -> bool {
        self.hooks.iter().flatten().flatten().any(|p| p.reads_ct)
    }

    /// Whether `frame` (from its Ethernet header on, as received, coming in on `iif`;
    /// its connection `ct`, as tracking made it) passes the prerouting hook.
    pub fn prerouting(&self, frame: &[u8], iif: Link, ct: Option<&Ct>) -> bool {
        self.prerouting_part(frame, iif, ct, Part::Whole)
    }

    /// [`Filter::prerouting`] for the chains of `part`.
    pub fn prerouting_part(&self, frame: &[u8], iif: Link, ct: Option<&Ct>, part: Part) -> bool {
        self.prerouting_verdict(frame, iif, ct, part) == Verdict::Accept
    }

    /// What the prerouting chains of `part` decide for `frame` (as
    /// [`Filter::prerouting`] takes it).
    pub fn prerouting_verdict(
        &self,
        frame: &[u8],
        iif: Link,
        ct: Option<&Ct>,
        part: Part,
    ) -> Verdict {
        let Some(ip) = frame.get(ETHERNET..) else {
            return Verdict::Drop;
        };
        let Some(f) = family(ip) else {
            return Verdict::Drop;
        };
        let chains = &self.hooks[f][0];
        if chains.is_empty() {
            return Verdict::Accept;
        }
        let info = Info::of(ip);
        let steady = ct.and_then(|c| c.steady);
        for c in chains
            .iter()
            .filter(|c| part.holds(c.priority, NAT_PRIORITY[0]))
        {
            // Chains before conntrack's own hook see no connection.
            let ct = ct.filter(|_| c.priority > CONNTRACK_PRIORITY);
            match c.decide(frame, &info, false, iif, None, ct, steady) {
                Decision::Drop => return Verdict::Drop,
                Decision::Reject(r) => return Verdict::Reject(r),
                Decision::Accept | Decision::Nat(_) => {}
            }
        }
        Verdict::Accept
    }

    /// Whether `p` (its connection `ct`) passes the forward and postrouting hooks.
    pub fn forwarding(&self, p: &Packet, ct: Option<&Ct>) -> bool {
        self.forwarding_part(p, ct, Part::Whole)
    }

    /// [`Filter::forwarding`] for the chains of `part` (the forward hook's are all
    /// before NAT, which is at postrouting).
    pub fn forwarding_part(&self, p: &Packet, ct: Option<&Ct>, part: Part) -> bool {
        self.forwarding_verdict(p, ct, part) == Verdict::Accept
    }

    /// What the forward and postrouting chains of `part` decide for `p` (a `reject`
    /// can only be met at forward: the kernel refuses it at postrouting).
    pub fn forwarding_verdict(&self, p: &Packet, ct: Option<&Ct>, part: Part) -> Verdict {
        let Some(ip) = p.frame.get(ETHERNET..) else {
            return Verdict::Drop;
        };
        let Some(f) = family(ip) else {
            return Verdict::Drop;
        };
        let [_, forward, post] = &self.hooks[f];
        if forward.is_empty() && post.is_empty() {
            return Verdict::Accept;
        }
        let info = Info::of(ip);
        let steady = ct.and_then(|c| c.steady);
        for c in forward.iter().filter(|_| part != Part::AfterNat).chain(
            post.iter()
                .filter(|c| part.holds(c.priority, NAT_PRIORITY[1])),
        ) {
            match c.decide(p.frame, &info, true, p.iif, Some(p.oif), ct, steady) {
                Decision::Drop => return Verdict::Drop,
                Decision::Reject(r) => return Verdict::Reject(r),
                Decision::Accept | Decision::Nat(_) => {}
            }
        }
        Verdict::Accept
    }
}

/// 0 for IPv4, 1 for IPv6.
fn family(ip: &[u8]) -> Option<usize> {
    match ip.first().map(|b| b >> 4) {
        Some(4) => Some(0),
        Some(6) => Some(1),
        _ => None,
    }
}

/// An operation compiled from one expression.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    /// `payload load LEN @ BASE + OFFSET => DREG`: base 0 link layer, 1 network, 2
    /// transport.
    Payload {
        base: u32,
        offset: usize,
        len: usize,
        dreg: usize,
    },
    /// `meta load KEY => DREG`.
    Meta { key: u32, dreg: usize },
    /// `ct load KEY => DREG` (of the connection's direction `dir`, for keys of a
    /// tuple).
    Ct { key: u32, dir: usize, dreg: usize },
    /// `cmp OP SREG DATA`.
    Cmp {
        op: u32,
        sreg: usize,
        data: Vec<u8>,
        /// For data of at most 16 bytes: the data as a big-endian number, to compare as
        /// one number (bytes of one length compare as the big-endian numbers they make).
        short: Option<u128>,
    },
    /// `bitwise DREG = (SREG & MASK) ^ XOR`, over whole 32-bit registers (mask and xor
    /// padded with zeros, as the kernel holds them).
    Bitwise {
        sreg: usize,
        dreg: usize,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    /// `byteorder DREG = ntoh/hton(SREG, LEN, SIZE)`: each `size`-byte unit of `len`
    /// bytes turned around (on a little-endian CPU; on a big-endian one, copied).
    Byteorder {
        sreg: usize,
        dreg: usize,
        len: usize,
        size: usize,
    },
    /// `range OP SREG FROM TO`.
    Range {
        neq: bool,
        sreg: usize,
        from: Vec<u8>,
        to: Vec<u8>,
    },
    /// `immediate DREG DATA`.
    Data { dreg: usize, data: Vec<u8> },
    /// `immediate` of a verdict.
    Verdict(Jump),
    /// `lookup SREG in SET`, inverted if `inv`; a map's data to `dreg`.
    Lookup {
        set: usize,
        sreg: usize,
        dreg: Option<Dest>,
        inv: bool,
    },
    /// `nat`, `masq` or `redir`, in a `nat` chain: the connection's binding.
    Nat(NatOp),
    /// `counter`: nothing fibre evaluates.
    Nothing,
}

/// A NAT statement as compiled: what it asks, and the registers it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NatOp {
    kind: NatKind,
    /// `nat`'s family (`NFPROTO_IPV4` 2, `_IPV6` 10, `_INET` 1); 0 for the others.
    family: u32,
    /// The registers of the first and last address.
    addr: Option<(usize, usize)>,
    /// The registers of the first and last port.
    proto: Option<(usize, usize)>,
    flags: u32,
}

/// What a NAT statement does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NatKind {
    /// `snat`: the source, to the range.
    Snat,
    /// `dnat`: the destination, to the range.
    Dnat,
    /// `masquerade`: the source, to the output link's address.
    Masquerade,
    /// `redirect`: the destination, to this host.
    Redirect,
}

/// A binding a packet's NAT rules asked for: what, and to which range (for masquerade
/// and redirect, the ports and flags only: the address is the link's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// What.
    pub kind: NatKind,
    /// To which range.
    pub range: Range,
}

impl NatOp {
    /// The translation the statement asks for, with the registers `regs`, of a packet
    /// of `family` (0 IPv4): none if the statement is of the other family, which does
    /// nothing.
    fn translation(
        &self,
        regs: &[u8; REGISTER_BYTES],
        family: usize,
        ip: &[u8],
    ) -> Option<Translation> {
        let v6 = family == 1;
        if self.kind == NatKind::Snat || self.kind == NatKind::Dnat {
            let own = if v6 { 10 } else { 2 };
            if self.family != own && self.family != 1 {
                return None;
            }
        }
        let mut range = Range {
            flags: self.flags,
            ..Range::default()
        };
        if let Some((lo, hi)) = self.addr {
            let read = |at: usize| -> [u8; 16] {
                if v6 {
                    regs[at..at + 16].try_into().expect("16 bytes")
                } else {
                    let v4: [u8; 4] = regs[at..at + 4].try_into().expect("4 bytes");
                    std::net::Ipv4Addr::from(v4).to_ipv6_mapped().octets()
                }
            };
            range.min_addr = read(lo);
            range.max_addr = read(hi);
            if self.flags & nat::NETMAP != 0 {
                // Each bit the range's ends share is the range's; the others the
                // packet's own address's (`nft_nat_setup_netmap`).
                let at = match (self.kind, v6) {
                    (NatKind::Snat, false) => 12,
                    (NatKind::Snat, true) => 8,
                    (_, false) => 16,
                    (_, true) => 24,
                };
                let own: [u8; 16] = if v6 {
                    ip.get(at..at + 16)?.try_into().ok()?
                } else {
                    let v4: [u8; 4] = ip.get(at..at + 4)?.try_into().ok()?;
                    std::net::Ipv4Addr::from(v4).to_ipv6_mapped().octets()
                };
                let mut new = [0u8; 16];
                for k in 0..16 {
                    let mask = !(range.min_addr[k] ^ range.max_addr[k]);
                    new[k] = (own[k] & !mask) | (range.min_addr[k] & mask);
                }
                range.min_addr = new;
                range.max_addr = new;
            }
        }
        if let Some((lo, hi)) = self.proto {
            range.min_proto = u16::from_be_bytes([regs[lo], regs[lo + 1]]);
            range.max_proto = u16::from_be_bytes([regs[hi], regs[hi + 1]]);
        }
        Some(Translation {
            kind: self.kind,
            range,
        })
    }
}

/// A verdict an `immediate` sets; chains by their index in the program.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Jump {
    Accept,
    Drop,
    Continue,
    Return,
    /// To the chain, coming back after (`jump`).
    Call(usize),
    /// To the chain, not coming back.
    Goto(usize),
    /// Dropped, and answered (`reject`).
    Reject(Reject),
}

/// The bytes of the registers: 16 of verdict, then sixteen of 4.
const REGISTER_BYTES: usize = 16 + 16 * 4;

/// The kernel's jump stack (`NFT_JUMP_STACK_SIZE`): it refuses to load a ruleset whose
/// jumps go deeper.
const JUMP_STACK: usize = 16;

/// Where register `reg` (as the kernel numbers them) starts, in bytes.
fn register(reg: u32) -> Option<usize> {
    match reg {
        1..=4 => Some(reg as usize * 16),
        8..=23 => Some(16 + (reg as usize - 8) * 4),
        _ => None,
    }
}

/// A data attribute's value (`NFTA_DATA_VALUE`'s bytes).
fn value(nested: &[u8]) -> Option<Vec<u8>> {
    Attributes::read(nested).ok()?.get(1).map(<[u8]>::to_vec)
}

/// `meta` keys compiled: len, protocol, mark, iif, oif, iifname, oifname, iiftype,
/// oiftype, nfproto, l4proto, pkttype, iifgroup, oifgroup.
const META_KEYS: [u32; 14] = [0, 1, 3, 4, 5, 6, 7, 8, 9, 15, 16, 19, 21, 22];

/// `ct` keys compiled: state, direction, status, mark, l3protocol, src, dst, protocol,
/// proto-src, proto-dst, zone, src_ip, dst_ip, src_ip6, dst_ip6. The others read what
/// fibre does not keep (counters, labels, helpers, the time left, the id).
const CT_KEYS: [u32; 15] = [0, 1, 2, 3, 7, 8, 9, 10, 11, 12, 17, 19, 20, 21, 22];

/// The bytes a `ct` load of `key` writes from its register on (an address's 16 at most).
fn ct_width(key: u32) -> usize {
    if matches!(key, 8 | 9 | 21 | 22) {
        16
    } else {
        4
    }
}

/// Whether `e` is a `ct` load (not a `ct ... set` statement, which has a source
/// register).
pub fn reads_ct(e: &Expression) -> bool {
    e.name == "ct" && Attributes::read(&e.data).is_ok_and(|a| a.get(4).is_none())
}

/// The chains a program reaches, by name: each one's index.
type Names<'n> = HashMap<String, usize>;

/// What compiling a base chain gathers: the chains it reaches and the sets it looks up,
/// each by its index in the program.
struct Compiler<'t> {
    table: &'t TableEntry,
    chains: Names<'t>,
    set_names: HashMap<String, usize>,
    sets: Vec<SetCode>,
    /// Whether a rule reads the packet's connection.
    reads_ct: bool,
    /// Whether the base chain is of type `nat`, where NAT statements are.
    nat: bool,
}

impl Compiler<'_> {
    /// The index of the chain named `name`, given one if new.
    fn chain(&mut self, name: String) -> usize {
        let next = self.chains.len();
        *self.chains.entry(name).or_insert(next)
    }

    /// A verdict's code and chain as compiled.
    fn verdict(&mut self, code: i32, chain: Option<String>) -> Result<Jump, String> {
        let target = || chain.clone().ok_or("a jump without its chain".to_string());
        Ok(match code {
            0 => Jump::Drop,
            1 => Jump::Accept,
            -1 => Jump::Continue,
            -5 => Jump::Return,
            -3 => Jump::Call(self.chain(target()?)),
            -4 => Jump::Goto(self.chain(target()?)),
            _ => return Err(format!("the verdict {code}")),
        })
    }

    /// The index of the set named `name`, compiled if new.
    fn set(&mut self, name: &str) -> Result<usize, String> {
        if let Some(&i) = self.set_names.get(name) {
            return Ok(i);
        }
        let set = self
            .table
            .sets
            .get(name)
            .ok_or_else(|| format!("the set {name}, which the table does not hold"))?;
        let index = Index::new(set)?;
        let mut outcomes = Vec::with_capacity(set.elements.len());
        for e in &set.elements {
            outcomes.push(match &e.data {
                None => Outcome::None,
                Some(ElementData::Value(v)) => Outcome::Data(v.clone()),
                Some(ElementData::Verdict(code, chain)) => {
                    Outcome::Verdict(self.verdict(*code, chain.clone())?)
                }
            });
        }
        self.sets.push(SetCode {
            index,
            outcomes,
            data_len: set.data_len as usize,
            verdicts: set.data_type == Some(VERDICT_DATA),
        });
        self.set_names.insert(name.to_string(), self.sets.len() - 1);
        Ok(self.sets.len() - 1)
    }
}

/// `NFT_DATA_VERDICT`: a verdict map's data type.
const VERDICT_DATA: u32 = 0xffff_ff00;

/// A set as a program looks it up: its index, and each element's data.
#[derive(Clone, Debug)]
struct SetCode {
    index: Index,
    outcomes: Vec<Outcome>,
    /// A map's data length.
    data_len: usize,
    /// Whether its data are verdicts.
    verdicts: bool,
}

/// What a map gives for an element.
#[derive(Clone, Debug)]
enum Outcome {
    None,
    Data(Vec<u8>),
    Verdict(Jump),
}

/// Where a map's data go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dest {
    /// The verdict register: a verdict map.
    Verdict,
    /// A data register, at this byte.
    Register(usize),
}

/// Compiles one expression with what `c` gathers; why not, if it cannot be.
fn compile(e: &Expression, c: &mut Compiler) -> Result<Op, String> {
    let a = Attributes::read(&e.data).map_err(|e| e.to_string())?;
    let u = |k| a.u32(k).ok().flatten();
    let reg = |k| u(k).and_then(register);
    let unsupported = || format!("`{}` as used here", e.name);
    let fits = |at: usize, len: usize| at + len <= REGISTER_BYTES;
    let op = match e.name.as_str() {
        "payload" => match (u(2), u(3), u(4), reg(1)) {
            // No source register: a load, not a `payload set` statement.
            (Some(base @ 0..=2), Some(offset), Some(len), Some(dreg))
                if a.get(5).is_none() && len > 0 && fits(dreg, (len as usize).div_ceil(4) * 4) =>
            {
                Op::Payload {
                    base,
                    offset: offset as usize,
                    len: len as usize,
                    dreg,
                }
            }
            _ => return Err(unsupported()),
        },
        "meta" => match (u(2), reg(1)) {
            (Some(key), Some(dreg))
                if META_KEYS.contains(&key)
                    && fits(dreg, if matches!(key, 6 | 7) { 16 } else { 4 }) =>
            {
                Op::Meta { key, dreg }
            }
            (Some(key), _) => return Err(format!("`meta` key {key}")),
            _ => return Err(unsupported()),
        },
        "ct" => match (
            u(2),
            reg(1),
            a.get(4),
            a.get(3).and_then(|d| d.first().copied()),
        ) {
            (Some(key), Some(dreg), None, dir)
                if CT_KEYS.contains(&key) && fits(dreg, ct_width(key)) =>
            {
                c.reads_ct = true;
                Op::Ct {
                    key,
                    dir: usize::from(dir.unwrap_or(0) == 1),
                    dreg,
                }
            }
            (_, _, Some(_), _) => return Err("`ct ... set`".into()),
            (Some(key), _, _, _) => return Err(format!("`ct` key {key}")),
            _ => return Err(unsupported()),
        },
        "cmp" => match (u(2), reg(1), a.get(3).and_then(value)) {
            (Some(op @ 0..=5), Some(sreg), Some(data)) if fits(sreg, data.len()) => {
                let short = (!data.is_empty() && data.len() <= 16).then(|| be_number(&data));
                Op::Cmp {
                    op,
                    sreg,
                    data,
                    short,
                }
            }
            _ => return Err(unsupported()),
        },
        "bitwise" => {
            let (mask, xor) = (a.get(4).and_then(value), a.get(5).and_then(value));
            match (u(6).unwrap_or(0), reg(1), reg(2), u(3), mask, xor) {
                (0, Some(sreg), Some(dreg), Some(len), Some(mut mask), Some(mut xor))
                    if len > 0
                        && mask.len() == len as usize
                        && xor.len() == len as usize
                        && fits(sreg, (len as usize).div_ceil(4) * 4)
                        && fits(dreg, (len as usize).div_ceil(4) * 4) =>
                {
                    let words = (len as usize).div_ceil(4) * 4;
                    mask.resize(words, 0);
                    xor.resize(words, 0);
                    Op::Bitwise {
                        sreg,
                        dreg,
                        mask,
                        xor,
                    }
                }
                _ => return Err(unsupported()),
            }
        }
        "byteorder" => match (reg(1), reg(2), u(3), u(4), u(5)) {
            (Some(sreg), Some(dreg), Some(0 | 1), Some(len), Some(size @ (2 | 4 | 8)))
                if fits(sreg, len as usize) && fits(dreg, len as usize) =>
            {
                Op::Byteorder {
                    sreg,
                    dreg,
                    len: len as usize,
                    size: size as usize,
                }
            }
            _ => return Err(unsupported()),
        },
        "range" => match (
            u(2),
            reg(1),
            a.get(3).and_then(value),
            a.get(4).and_then(value),
        ) {
            (Some(op @ 0..=1), Some(sreg), Some(from), Some(to))
                if from.len() == to.len() && fits(sreg, from.len()) =>
            {
                Op::Range {
                    neq: op == 1,
                    sreg,
                    from,
                    to,
                }
            }
            _ => return Err(unsupported()),
        },
        "immediate" => {
            let data = a.get(2).ok_or_else(unsupported)?;
            let d = Attributes::read(data).map_err(|e| e.to_string())?;
            match (u(1), d.get(1), d.get(2)) {
                (Some(0), None, Some(v)) => {
                    let v = Attributes::read(v).map_err(|e| e.to_string())?;
                    let code = v
                        .get(1)
                        .and_then(|c| be32(c).ok())
                        .ok_or_else(unsupported)? as i32;
                    let chain = v.get(2).and_then(|c| string(c).ok());
                    Op::Verdict(c.verdict(code, chain)?)
                }
                (Some(r), Some(bytes), None) => {
                    let dreg = register(r).ok_or_else(unsupported)?;
                    if bytes.is_empty() || !fits(dreg, bytes.len().div_ceil(4) * 4) {
                        return Err(unsupported());
                    }
                    Op::Data {
                        dreg,
                        data: bytes.to_vec(),
                    }
                }
                _ => return Err(unsupported()),
            }
        }
        "lookup" => {
            let name = a.string(1).ok().flatten().ok_or_else(unsupported)?;
            let inv = u(5).unwrap_or(0) & 1 != 0;
            let set = c.set(&name)?;
            let code = &c.sets[set];
            let sreg = reg(2).ok_or_else(unsupported)?;
            if !fits(sreg, code.index.key_len) || code.index.key_len == 0 {
                return Err(unsupported());
            }
            let dreg = match u(3) {
                None => None,
                Some(0) if code.verdicts && !inv => Some(Dest::Verdict),
                Some(r) => match register(r) {
                    Some(d)
                        if !code.verdicts && !inv && fits(d, code.data_len.next_multiple_of(4)) =>
                    {
                        Some(Dest::Register(d))
                    }
                    _ => return Err(unsupported()),
                },
            };
            Op::Lookup {
                set,
                sreg,
                dreg,
                inv,
            }
        }
        "counter" => Op::Nothing,
        // `reject`: type 1, ICMP code 2. One in a `nat` chain, which binds rather than
        // filters, is refused.
        "reject" if !c.nat => {
            let kind = u(1).ok_or_else(unsupported)?;
            let code = match a.get(2) {
                Some([code]) => *code,
                None => 0,
                Some(_) => return Err(unsupported()),
            };
            match kind {
                0..=2 => Op::Verdict(Jump::Reject(Reject {
                    kind,
                    code,
                    inet: c.table.table.family == Family::Inet,
                })),
                _ => return Err(unsupported()),
            }
        }
        "nat" | "masq" | "redir" if c.nat => {
            // The attributes: `nat`'s type 1, family 2, addresses 3 and 4, ports 5
            // and 6, flags 7; `masq`'s flags 1, ports 2 and 3; `redir`'s ports 1 and
            // 2, flags 3.
            let (kind, family, addr_at, proto_at, flags_at) = match e.name.as_str() {
                "nat" => (
                    match u(1) {
                        Some(0) => NatKind::Snat,
                        Some(1) => NatKind::Dnat,
                        _ => return Err(unsupported()),
                    },
                    u(2).unwrap_or(0),
                    Some(3),
                    5,
                    7,
                ),
                "masq" => (NatKind::Masquerade, 0, None, 2, 1),
                _ => (NatKind::Redirect, 0, None, 1, 3),
            };
            let pair = |first: u16| -> Result<Option<(usize, usize)>, String> {
                match reg(first) {
                    None => Ok(None),
                    Some(lo) => {
                        let hi = match u(first + 1) {
                            Some(r) => register(r).ok_or_else(unsupported)?,
                            None => lo,
                        };
                        if !fits(lo, 16) && !fits(lo, 4) || !fits(hi, 4) {
                            return Err(unsupported());
                        }
                        Ok(Some((lo, hi)))
                    }
                }
            };
            let addr = match addr_at {
                Some(at) => pair(at)?,
                None => None,
            };
            let proto = pair(proto_at)?;
            if addr.is_some_and(|(lo, hi)| family == 10 && (!fits(lo, 16) || !fits(hi, 16))) {
                return Err(unsupported());
            }
            let given = u(flags_at);
            let mut flags = 0;
            if addr.is_some() {
                flags |= nat::MAP_IPS;
            }
            if proto.is_some() && kind != NatKind::Masquerade {
                flags |= nat::PROTO_SPECIFIED;
            }
            flags = match (kind, given) {
                // `redir`'s flags, when given, are all its flags.
                (NatKind::Redirect, Some(f)) => f,
                (_, Some(f)) => flags | f,
                (_, None) => flags,
            };
            if flags & nat::PROTO_OFFSET != 0 {
                return Err("`nat` with a port offset".into());
            }
            Op::Nat(NatOp {
                kind,
                family,
                addr,
                proto,
                flags,
            })
        }
        other => return Err(format!("`{other}`")),
    };
    Ok(op)
}

/// A base chain and the chains it reaches, compiled: each chain's rules' operations.
#[derive(Clone, Debug)]
pub struct Program {
    /// By index; the base chain is 0.
    chains: Vec<Vec<Vec<Op>>>,
    /// The sets its rules look up, by index.
    sets: Vec<SetCode>,
    /// Each chain's blocks of rules skipped by a field they require.
    blocks: Vec<Blocks>,
    /// The base chain's policy: accept when true.
    accept: bool,
    /// The base chain's priority.
    priority: i32,
    /// Whether a rule reads the packet's connection (`ct`).
    reads_ct: bool,
}

impl Program {
    /// Compiles the base chain `base` of `table`, and every chain it jumps or goes to;
    /// if any rule there does not compile, each one that does not.
    pub fn compile(table: &TableEntry, base: &str) -> Result<Program, Vec<Refused>> {
        let missing = |chain: &str| Refused {
            chain: chain.to_string(),
            handle: 0,
            what: "a chain the ruleset does not hold".into(),
        };
        let entry = table.chains.get(base).ok_or_else(|| vec![missing(base)])?;
        let mut refused = Vec::new();
        let mut c = Compiler {
            table,
            chains: HashMap::from([(base.to_string(), 0)]),
            set_names: HashMap::new(),
            sets: Vec::new(),
            reads_ct: false,
            nat: entry.chain.kind.as_deref() == Some("nat"),
        };
        let mut chains: Vec<Option<Vec<Vec<Op>>>> = vec![None];
        let mut k = 0;
        while k < c.chains.len() {
            let name = c
                .chains
                .iter()
                .find(|(_, &i)| i == k)
                .map(|(n, _)| n.clone())
                .expect("every index has its name");
            let rules = match table.chains.get(&name) {
                Some(c) => &c.rules[..],
                None => {
                    refused.push(missing(&name));
                    &[]
                }
            };
            let mut compiled = Vec::with_capacity(rules.len());
            for r in rules {
                let ops = r
                    .expressions
                    .iter()
                    .map(|e| compile(e, &mut c))
                    .collect::<Result<Vec<Op>, String>>();
                match ops {
                    Ok(ops) => compiled.push(ops),
                    Err(what) => refused.push(Refused {
                        chain: name.clone(),
                        handle: r.handle,
                        what,
                    }),
                }
            }
            chains.resize(c.chains.len(), None);
            chains[k] = Some(compiled);
            k += 1;
        }
        let priority = entry.chain.hook.as_ref().map_or(0, |h| h.priority);
        let prerouting = entry.chain.hook.as_ref().is_some_and(|h| h.number == 0);
        if c.reads_ct && prerouting && priority == CONNTRACK_PRIORITY {
            refused.push(Refused {
                chain: base.to_string(),
                handle: 0,
                what: format!(
                    "`ct` at priority {CONNTRACK_PRIORITY}, conntrack's own, where the kernel \
                     runs first whichever of the two hooks was registered first"
                ),
            });
        }
        if !refused.is_empty() {
            return Err(refused);
        }
        let chains: Vec<Vec<Vec<Op>>> = chains.into_iter().map(Option::unwrap_or_default).collect();
        Ok(Program {
            blocks: chains
                .iter()
                .map(|rules| Blocks::new(rules, &c.sets))
                .collect(),
            chains,
            sets: c.sets,
            accept: entry.chain.policy != Some(0),
            priority,
            reads_ct: c.reads_ct,
        })
    }

    /// Whether it accepts every packet whatever it holds: no rules, policy accept.
    fn decides_nothing(&self) -> bool {
        self.accept && self.chains[0].is_empty()
    }

    /// Whether the chain accepts `frame` (its IP packet described by `info`; with its
    /// time to live taken down if `forwarded`) from `iif` to `oif`, its connection `ct`.
    #[cfg(test)]
    fn accepts(
        &self,
        frame: &[u8],
        info: &Info,
        forwarded: bool,
        iif: Link,
        oif: Option<Link>,
        ct: Option<&Ct>,
    ) -> bool {
        !matches!(
            self.decide(frame, info, forwarded, iif, oif, ct, None),
            Decision::Drop | Decision::Reject(_)
        )
    }

    /// What the chain decides for `frame`, as [`Program::accepts`] has it; a NAT
    /// statement reached accepts, asking for its binding.
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &self,
        frame: &[u8],
        info: &Info,
        forwarded: bool,
        iif: Link,
        oif: Option<Link>,
        ct: Option<&Ct>,
        steady: Option<&Steady>,
    ) -> Decision {
        let at = At {
            frame,
            ip: &frame[ETHERNET..],
            info,
            forwarded,
            iif,
            oif,
            ct,
            steady,
            nat: Cell::new(None),
        };
        let accept = || match at.nat.get() {
            Some(t) => Decision::Nat(t),
            None => Decision::Accept,
        };
        let mut regs = [0u8; REGISTER_BYTES];
        let mut stack = [(0usize, 0usize); JUMP_STACK];
        let mut depth = 0;
        let (mut chain, mut next) = (0, 0);
        loop {
            let rules = &self.chains[chain];
            let blocks = &self.blocks[chain];
            let mut went = false;
            loop {
                next = blocks.next_candidate(next, &self.sets, &at);
                let Some(rule) = rules.get(next) else { break };
                next += 1;
                match run(rule, &self.sets, &at, &mut regs) {
                    None | Some(Jump::Continue) => {}
                    Some(Jump::Accept) => return accept(),
                    Some(Jump::Drop) => return Decision::Drop,
                    Some(Jump::Reject(r)) => return Decision::Reject(*r),
                    Some(Jump::Return) => break,
                    Some(Jump::Call(c)) => {
                        if depth == JUMP_STACK {
                            // The kernel's own answer to a stack overrun.
                            return Decision::Drop;
                        }
                        stack[depth] = (chain, next);
                        depth += 1;
                        (chain, next, went) = (*c, 0, true);
                        break;
                    }
                    Some(Jump::Goto(c)) => {
                        (chain, next, went) = (*c, 0, true);
                        break;
                    }
                }
            }
            if went {
                continue;
            }
            if depth == 0 {
                return if self.accept {
                    Decision::Accept
                } else {
                    Decision::Drop
                };
            }
            depth -= 1;
            (chain, next) = stack[depth];
        }
    }
}

/// A packet at a hook.
struct At<'a> {
    /// From the Ethernet header on.
    frame: &'a [u8],
    /// From the IP header on.
    ip: &'a [u8],
    info: &'a Info,
    forwarded: bool,
    iif: Link<'a>,
    oif: Option<Link<'a>>,
    /// Its connection, as tracking made it (none before conntrack's hook).
    ct: Option<&'a Ct<'a>>,
    /// Told of each read of what its connection's packets may hold otherwise.
    steady: Option<&'a Steady>,
    /// The binding a NAT statement asked for.
    nat: Cell<Option<Translation>>,
}

/// What a chain decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    Accept,
    Drop,
    /// Drop, and answer.
    Reject(Reject),
    /// Accept, with this binding.
    Nat(Translation),
}

/// What the kernel finds of a packet before the rules (`nft_set_pktinfo`).
struct Info {
    /// The packet's length as the kernel holds it, trimmed to the IP header's (IPv4's
    /// total length; IPv6's 40 and the payload length).
    len: usize,
    /// The transport protocol and its header's offset, when found.
    l4: Option<(u8, usize)>,
    /// The fragment offset (not 0: not the first fragment).
    fragoff: u16,
    /// `NFPROTO_IPV4` or `NFPROTO_IPV6`.
    nfproto: u8,
}

impl Info {
    fn of(ip: &[u8]) -> Info {
        if family(ip) == Some(1) && ip.len() >= 40 {
            let len = 40 + usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            let len = len.min(ip.len());
            let found = if 40 + usize::from(u16::from_be_bytes([ip[4], ip[5]])) <= ip.len() {
                ipv6_transport(&ip[..len])
            } else {
                None
            };
            return Info {
                len,
                l4: found.map(|(proto, off, _)| (proto, off)),
                fragoff: found.map_or(0, |(_, _, f)| f),
                nfproto: 10,
            };
        }
        let total = match ip.get(2..4) {
            Some(t) if ip.len() >= 20 => usize::from(u16::from_be_bytes([t[0], t[1]])),
            _ => 0,
        };
        let len = total.min(ip.len());
        let ihl = ip.first().map_or(0, |b| usize::from(b & 0xf) * 4);
        let whole = ip.len() >= 20 && ihl >= 20 && total <= ip.len() && total >= ihl;
        Info {
            len,
            l4: whole.then(|| (ip[9], ihl)),
            fragoff: if whole {
                u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff
            } else {
                0
            },
            nfproto: 2,
        }
    }
}

/// IPv6's transport protocol, its header's offset and the fragment offset, as
/// `ipv6_find_hdr` finds them for nf_tables (no target, `IP6_FH_F_AUTH`): past
/// hop-by-hop, routing, fragment and destination options headers; an authentication
/// header is taken for the transport's. A later fragment's transport offset is 0, as
/// the kernel leaves it.
fn ipv6_transport(ip: &[u8]) -> Option<(u8, usize, u16)> {
    // Extension headers walked past (`ipv6_ext_hdr`, but for "no next header" and the
    // authentication header, where the walk stops).
    let walked = |n: u8| matches!(n, 0 | 43 | 44 | 60);
    let mut next = ip[6];
    let mut at = 40;
    while walked(next) {
        let h = ip.get(at..at + 2)?;
        let len = if next == 44 {
            let f = ip.get(at + 2..at + 4)?;
            let off = u16::from_be_bytes([f[0], f[1]]) & !7;
            if off != 0 {
                // Returned from here, `ipv6_find_hdr` leaves the offset it was given:
                // nf_tables' transport offset stays 0.
                return (!walked(h[0]) && h[0] != 51).then_some((h[0], 0, off));
            }
            8
        } else {
            (usize::from(h[1]) + 1) * 8
        };
        next = h[0];
        at += len;
    }
    (at <= usize::from(u16::MAX)).then_some((next, at, 0))
}

/// Runs a rule's operations; the verdict it set, if any (`None`: on to the next rule,
/// whether it matched to its end or broke off).
fn run<'p>(
    rule: &'p [Op],
    sets: &'p [SetCode],
    p: &At,
    regs: &mut [u8; REGISTER_BYTES],
) -> Option<&'p Jump> {
    for op in rule {
        match op {
            Op::Payload {
                base,
                offset,
                len,
                dreg,
            } => {
                // A load of 1, 2 or 4 bytes at an offset they divide takes the kernel's
                // fast path (`nft_payload_fast_eval`), which reads a later fragment's
                // transport bytes too; any other breaks on a later fragment
                // (`nft_payload_eval`). The link layer's bytes are the frame's from its
                // Ethernet header on (the kernel's mac header), into the IP packet.
                let fast = matches!(len, 1 | 2 | 4) && offset % len == 0;
                let (bytes, start, end) = match base {
                    0 => (p.frame, *offset, ETHERNET + p.info.len),
                    1 => (p.ip, *offset, p.info.len),
                    _ => match p.info.l4 {
                        Some((_, thoff)) if fast || p.info.fragoff == 0 => {
                            (p.ip, thoff + offset, p.info.len)
                        }
                        _ => return None,
                    },
                };
                if let Some(s) = p
                    .steady
                    .filter(|_| !steady_payload(*base, *offset, *len, p.info))
                {
                    s.breaks();
                }
                if start + len > end {
                    return None;
                }
                // The last register written is zeroed first, as the kernel does.
                let b = &bytes[start..start + len];
                match len {
                    1 => regs[*dreg..dreg + 4].copy_from_slice(&[b[0], 0, 0, 0]),
                    2 => regs[*dreg..dreg + 4].copy_from_slice(&[b[0], b[1], 0, 0]),
                    4 => regs[*dreg..dreg + 4].copy_from_slice(&[b[0], b[1], b[2], b[3]]),
                    _ => {
                        regs[dreg + len..(dreg + len).div_ceil(4) * 4].fill(0);
                        regs[*dreg..dreg + len].copy_from_slice(b);
                    }
                }
                let out = &mut regs[*dreg..dreg + len];
                // What the network header holds at the forward and postrouting hooks.
                if p.forwarded {
                    match base {
                        1 => taken_down(p.ip, start, out),
                        0 if start + len > ETHERNET => {
                            let skip = ETHERNET.saturating_sub(start);
                            taken_down(p.ip, start + skip - ETHERNET, &mut out[skip..]);
                        }
                        _ => {}
                    }
                }
            }
            Op::Meta { key, dreg } => {
                // All but the length are the links', the family's or the transport's
                // (the same for a direction's packets where the packet path keeps
                // verdicts: see `Steady`).
                if let Some(s) = p.steady.filter(|_| *key == 0) {
                    s.breaks();
                }
                let r = &mut regs[*dreg..];
                let word = |r: &mut [u8], v: u32| r[..4].copy_from_slice(&v.to_ne_bytes());
                let half = |r: &mut [u8], v: [u8; 2]| {
                    r[..4].fill(0);
                    r[..2].copy_from_slice(&v);
                };
                let byte = |r: &mut [u8], v: u8| {
                    r[..4].fill(0);
                    r[0] = v;
                };
                let name = |r: &mut [u8], n: &str| {
                    r[..16].fill(0);
                    let b = n.as_bytes();
                    let k = b.len().min(15);
                    r[..k].copy_from_slice(&b[..k]);
                };
                match key {
                    0 => word(r, p.info.len as u32),
                    1 => half(
                        r,
                        if p.info.nfproto == 2 {
                            [0x08, 0]
                        } else {
                            [0x86, 0xdd]
                        },
                    ),
                    // The mark: nothing sets it on a packet fibre forwards.
                    3 => word(r, 0),
                    4 => word(r, p.iif.index),
                    5 => word(r, p.oif.map_or(0, |l| l.index)),
                    6 => name(r, p.iif.name),
                    7 => name(r, p.oif.map_or("", |l| l.name)),
                    8 => half(r, p.iif.kind.to_ne_bytes()),
                    9 => half(r, p.oif?.kind.to_ne_bytes()),
                    15 => byte(r, p.info.nfproto),
                    16 => byte(r, p.info.l4?.0),
                    // PACKET_HOST: a forwarded packet was sent to this host's MAC.
                    19 => byte(r, 0),
                    21 => word(r, p.iif.group),
                    22 => word(r, p.oif?.group),
                    _ => return None,
                }
            }
            Op::Ct { key, dir, dreg } => {
                // All but the status bits stay while the state does.
                if let Some(s) = p.steady.filter(|_| *key == 2) {
                    s.breaks();
                }
                if !ct_load(p.ct, *key, *dir, &mut regs[*dreg..]) {
                    return None;
                }
            }
            Op::Cmp {
                op,
                sreg,
                data,
                short,
            } => {
                use std::cmp::Ordering::*;
                let d = match short {
                    Some(value) => be_number(&regs[*sreg..sreg + data.len()]).cmp(value),
                    None => regs[*sreg..sreg + data.len()].cmp(&data[..]),
                };
                let holds = match op {
                    0 => d == Equal,
                    1 => d != Equal,
                    2 => d == Less,
                    3 => d != Greater,
                    4 => d == Greater,
                    _ => d != Less,
                };
                if !holds {
                    return None;
                }
            }
            Op::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
            } => {
                let mut src = [0u8; REGISTER_BYTES];
                let n = mask.len();
                src[..n].copy_from_slice(&regs[*sreg..sreg + n]);
                for k in 0..n {
                    regs[dreg + k] = (src[k] & mask[k]) ^ xor[k];
                }
            }
            Op::Byteorder {
                sreg,
                dreg,
                len,
                size,
            } => {
                let mut units = [0u8; REGISTER_BYTES];
                let n = len / size * size;
                units[..n].copy_from_slice(&regs[*sreg..sreg + n]);
                if cfg!(target_endian = "little") {
                    for unit in units[..n].chunks_mut(*size) {
                        unit.reverse();
                    }
                }
                regs[*dreg..dreg + n].copy_from_slice(&units[..n]);
            }
            Op::Range {
                neq,
                sreg,
                from,
                to,
            } => {
                let v = &regs[*sreg..sreg + from.len()];
                let inside = v >= &from[..] && v <= &to[..];
                if inside == *neq {
                    return None;
                }
            }
            Op::Data { dreg, data } => {
                let n = data.len();
                regs[dreg + n..(dreg + n).div_ceil(4) * 4].fill(0);
                regs[*dreg..dreg + n].copy_from_slice(data);
            }
            Op::Verdict(j) => return Some(j),
            Op::Lookup {
                set,
                sreg,
                dreg,
                inv,
            } => {
                // As `nft_lookup_eval` (with the fix for inverted lookups of Linux
                // 6.18): a miss falls to the catch-all element, if any; then the
                // lookup is inverted if asked; what is not found ends the rule.
                let s = &sets[*set];
                let element = s
                    .index
                    .find(&regs[*sreg..sreg + s.index.key_len])
                    .or(s.index.catchall());
                if element.is_some() == *inv {
                    return None;
                }
                match (dreg, element.map(|e| &s.outcomes[e as usize])) {
                    // A verdict ends the rule, but `continue`, which goes on with it.
                    (Some(Dest::Verdict), Some(Outcome::Verdict(j))) if *j != Jump::Continue => {
                        return Some(j);
                    }
                    (Some(Dest::Register(d)), Some(Outcome::Data(v))) => {
                        let n = s.data_len.min(v.len());
                        regs[d + n..(d + n).div_ceil(4) * 4].fill(0);
                        regs[*d..d + n].copy_from_slice(&v[..n]);
                    }
                    _ => {}
                }
            }
            Op::Nat(op) => {
                let family = usize::from(p.info.nfproto == 10);
                if let Some(t) = op.translation(regs, family, p.ip) {
                    p.nat.set(Some(t));
                    return Some(&Jump::Accept);
                }
            }
            Op::Nothing => {}
        }
    }
    None
}

/// `ct load KEY` into `r`, as `nft_ct_get_eval` writes it: false if the rule breaks (no
/// connection, for any key but the state; an address of the other family).
fn ct_load(ct: Option<&Ct>, key: u32, dir: usize, r: &mut [u8]) -> bool {
    let word = |r: &mut [u8], v: u32| r[..4].copy_from_slice(&v.to_ne_bytes());
    let byte = |r: &mut [u8], v: u8| {
        r[..4].fill(0);
        r[0] = v;
    };
    let half = |r: &mut [u8], v: [u8; 2]| {
        r[..4].fill(0);
        r[..2].copy_from_slice(&v);
    };
    if key == 0 {
        // No connection before conntrack's hook: the kernel reads invalid.
        word(r, ct.map_or(1, |c| c.state));
        return true;
    }
    let Some((ct, c)) = ct.and_then(|ct| Some((ct, ct.connection?))) else {
        return false;
    };
    let tuple = &c.tuples[dir];
    match key {
        1 => byte(r, u8::from(ct.reply)),
        2 => word(r, c.status),
        3 => word(r, c.mark),
        7 => byte(r, if tuple.v6 { 10 } else { 2 }),
        10 => byte(r, tuple.protocol),
        11 => half(r, tuple.src_port.to_be_bytes()),
        12 => half(r, tuple.dst_port.to_be_bytes()),
        17 => half(r, [0, 0]),
        8 | 9 | 19 | 20 | 21 | 22 => {
            let address = if matches!(key, 8 | 19 | 21) {
                &tuple.src
            } else {
                &tuple.dst
            };
            match (key, tuple.v6) {
                (8 | 9, true) | (21 | 22, true) => r[..16].copy_from_slice(address),
                (8 | 9, false) | (19 | 20, false) => r[..4].copy_from_slice(&address[12..]),
                _ => return false,
            }
        }
        _ => return false,
    }
    true
}

/// Up to 16 bytes as the big-endian number they make, read by their length at once
/// where it is 1, 2, 4 or 16 (a read wider than what was written would wait on it).
#[inline(always)]
fn be_number(b: &[u8]) -> u128 {
    match b.len() {
        1 => u128::from(b[0]),
        2 => u128::from(u16::from_be_bytes([b[0], b[1]])),
        4 => u128::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
        16 => u128::from_be_bytes(b.try_into().expect("16 bytes")),
        _ => b.iter().fold(0, |n, &x| n << 8 | u128::from(x)),
    }
}

/// Bytes `out` of the network header from `start` as the forward and postrouting hooks
/// read them: the time to live (IPv4 byte 8) or hop limit (IPv6 byte 7) one less, and
/// the IPv4 header checksum (bytes 10 and 11) patched to match, as `ip_decrease_ttl`
/// patches it.
fn taken_down(ip: &[u8], start: usize, out: &mut [u8]) {
    if start >= 12 {
        return;
    }
    let mut patched = [0u8; 12];
    let n = 12.min(ip.len());
    patched[..n].copy_from_slice(&ip[..n]);
    if family(ip) == Some(1) {
        patched[7] = patched[7].wrapping_sub(1);
    } else if n == 12 {
        patched[8] = patched[8].wrapping_sub(1);
        // `ip_decrease_ttl` word for word: the checksum as the CPU reads it, plus
        // `htons(0x0100)`, plus one where that reached 0xffff.
        let mut check = u32::from(u16::from_ne_bytes([patched[10], patched[11]]));
        check += u32::from(u16::from_ne_bytes(0x0100u16.to_be_bytes()));
        check += u32::from(check >= 0xffff);
        patched[10..12].copy_from_slice(&(check as u16).to_ne_bytes());
    }
    for (k, b) in out.iter_mut().enumerate() {
        if let Some(&v) = patched.get(start + k) {
            *b = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{cmp, ct, meta, payload, ruleset, verdict, ChainSpec};

    fn chain(name: &str, hook: Option<(u32, u32)>, rules: Vec<Vec<Expression>>) -> ChainSpec {
        ChainSpec {
            nat: false,
            name: name.into(),
            hook,
            rules,
        }
    }

    /// The one table of a ruleset of `chains`.
    fn table(chains: Vec<ChainSpec>) -> TableEntry {
        ruleset(Family::Inet, "t", chains)
            .tables()
            .next()
            .unwrap()
            .clone()
    }

    fn udp4(dst: [u8; 4], port: u16, ttl: u8) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 28, 0, 0, 0x40, 0, ttl, 17, 0, 0, 10, 0, 0, 2];
        p.extend_from_slice(&dst);
        p.extend_from_slice(&[0x30, 0x39]);
        p.extend_from_slice(&port.to_be_bytes());
        p.extend_from_slice(&[0, 8, 0, 0]);
        p
    }
    /// An IPv4 packet in an Ethernet frame.
    fn frame(ip: &[u8]) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
        f.extend_from_slice(ip);
        f
    }

    fn link(index: u32, name: &str) -> Link<'_> {
        Link {
            index,
            name,
            kind: 1,
            group: 0,
        }
    }

    #[test]
    fn a_reject_drops_and_names_the_answer_of_each_family() {
        use crate::build::reject;
        // Forward: to 10.2.0.2 `reject with icmpx admin-prohibited`; the rest
        // `reject` (icmpx port-unreachable) after a rule that accepts port 53.
        let rules = vec![
            vec![
                payload(1, 16, 4, 1),
                cmp(0, 1, &[10, 2, 0, 2]),
                reject(2, 3),
            ],
            vec![
                payload(2, 2, 2, 1),
                cmp(0, 1, &53u16.to_be_bytes()),
                verdict(1, None),
            ],
            vec![reject(2, 1)],
        ];
        let r = ruleset(Family::Inet, "t", vec![chain("fwd", Some((2, 0)), rules)]);
        let f = Filter::of(&r);
        let (iif, oif) = (link(2, "ra"), link(3, "rb"));
        let verdict = |ip: &[u8]| {
            let fr = frame(ip);
            let p = Packet {
                frame: &fr,
                iif,
                oif,
            };
            (
                f.forwarding_verdict(&p, None, Part::Whole),
                f.forwarding(&p, None),
            )
        };
        let Verdict::Reject(r) = verdict(&udp4([10, 2, 0, 2], 53, 64)).0 else {
            panic!("not rejected")
        };
        assert_eq!(
            (r.unreachable_code(false), r.unreachable_code(true)),
            (Some(13), Some(1))
        );
        assert_eq!(
            verdict(&udp4([10, 2, 0, 3], 53, 64)),
            (Verdict::Accept, true)
        );
        let (Verdict::Reject(r), false) = verdict(&udp4([10, 2, 0, 3], 54, 64)) else {
            panic!("not rejected, or passed")
        };
        assert_eq!(
            (r.unreachable_code(false), r.unreachable_code(true)),
            (Some(3), Some(4))
        );
        // The other codes of `icmpx`; an ICMP code is the packet's family's as given;
        // `icmpx` in an `ip` table answers nothing.
        let code = |kind, code, inet| Reject { kind, code, inet }.unreachable_code(false);
        assert_eq!((code(2, 0, true), code(2, 2, true)), (Some(0), Some(1)));
        assert_eq!(code(0, 10, false), Some(10));
        assert_eq!(code(2, 1, false), None);
        // A TCP reset is no unreachable; a reject in a nat chain is not compiled.
        assert!(Reject {
            kind: 1,
            code: 0,
            inet: true
        }
        .resets());
        assert_eq!(code(1, 0, true), None);
        for (nat, e, compiles) in [
            (false, reject(1, 0), true),
            (true, reject(1, 0), false),
            (true, reject(2, 1), false),
        ] {
            let r = ruleset(
                Family::Inet,
                "t",
                vec![ChainSpec {
                    nat,
                    name: "c".into(),
                    hook: Some((if nat { 0 } else { 2 }, 0)),
                    rules: vec![vec![e]],
                }],
            );
            let t = r.tables().next().unwrap();
            assert_eq!(Program::compile(t, "c").is_ok(), compiles, "nat {nat}");
        }
    }

    #[test]
    fn rules_decide_as_the_kernel_walks_them() {
        let t = table(vec![
            chain(
                "fwd",
                Some((2, 0)),
                vec![
                    // ip daddr 10.2.0.2 udp dport 53 drop
                    vec![
                        payload(1, 16, 4, 1),
                        cmp(0, 1, &[10, 2, 0, 2]),
                        payload(2, 2, 2, 1),
                        cmp(0, 1, &53u16.to_be_bytes()),
                        verdict(0, None),
                    ],
                    // ip ttl 63 jump sub (the forward hook sees the ttl taken down)
                    vec![
                        payload(1, 8, 1, 1),
                        cmp(0, 1, &[63]),
                        verdict(-3, Some("sub")),
                    ],
                    // meta oifname "rb" accept
                    vec![
                        meta(7, 1),
                        cmp(0, 1, b"rb\0\0\0\0\0\0\0\0\0\0\0\0\0\0"),
                        verdict(1, None),
                    ],
                ],
            ),
            chain(
                "sub",
                None,
                vec![
                    vec![
                        payload(2, 2, 2, 1),
                        cmp(0, 1, &99u16.to_be_bytes()),
                        verdict(0, None),
                    ],
                    vec![verdict(-5, None)],
                ],
            ),
        ]);
        let c = Program::compile(&t, "fwd").unwrap();
        let v = |ip: Vec<u8>| {
            let info = Info::of(&ip);
            c.accepts(
                &frame(&ip),
                &info,
                true,
                link(2, "ra"),
                Some(link(3, "rb")),
                None,
            )
        };
        assert!(!v(udp4([10, 2, 0, 2], 53, 64)));
        assert!(v(udp4([10, 2, 0, 3], 53, 64)));
        // TTL 64 arrives, 63 at the hook: into `sub`, dropped there by port 99.
        assert!(!v(udp4([10, 2, 0, 3], 99, 64)));
        // TTL 65: not into `sub`; out by rb: accepted.
        assert!(v(udp4([10, 2, 0, 3], 99, 65)));
        // A packet too short for its transport header breaks the rules that read it.
        let mut cut = udp4([10, 2, 0, 2], 53, 64);
        cut[3] = 22;
        assert!(v(cut));
        // Something fibre does not evaluate is refused, naming the rule (handle 2:
        // the chain took 1).
        let limit = Expression {
            name: "limit".into(),
            data: vec![],
        };
        let odd = table(vec![chain("fwd", Some((2, 1)), vec![vec![limit]])]);
        let r = Program::compile(&odd, "fwd").unwrap_err();
        assert_eq!((r[0].handle, r[0].what.as_str()), (2, "`limit`"));
        // A jump to a chain the table does not hold is refused too.
        let lost = table(vec![chain(
            "fwd",
            Some((2, 1)),
            vec![vec![verdict(-3, Some("x"))]],
        )]);
        assert_eq!(Program::compile(&lost, "fwd").unwrap_err()[0].chain, "x");
    }

    /// Blocks skip only what cannot match: over random chains of rules that require
    /// fields equal to constants (the addresses, the port, the time to live, the
    /// protocol), with jumps, returns and rules that require nothing, and random
    /// packets, the verdict with blocks is the verdict of every rule walked.
    #[test]
    fn blocks_decide_as_walking_every_rule_does() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut blocked = 0;
        for round in 0..200 {
            let rule = |rng: &mut rand::rngs::SmallRng, jumps: bool| {
                let mut e = Vec::new();
                if rng.gen_bool(0.5) {
                    e.extend([meta(16, 1), cmp(0, 1, &[if rng.gen() { 6 } else { 17 }])]);
                }
                match rng.gen_range(0..5) {
                    0 => e.extend([
                        payload(1, 12, 4, 1),
                        cmp(0, 1, &[10, 0, 0, rng.gen_range(0..4)]),
                    ]),
                    1 => e.extend([
                        payload(1, 16, 4, 2),
                        cmp(0, 2, &[10, 9, 0, rng.gen_range(0..4)]),
                    ]),
                    2 => e.extend([payload(2, 2, 2, 9), cmp(0, 9, &[0, rng.gen_range(0..6)])]),
                    3 => e.extend([payload(1, 8, 1, 1), cmp(0, 1, &[rng.gen_range(60..64)])]),
                    _ => {}
                }
                if rng.gen_bool(0.2) {
                    e.extend([payload(1, 8, 1, 1), cmp(3, 1, &[rng.gen_range(60..66)])]);
                }
                e.push(match rng.gen_range(0..6) {
                    0 => verdict(1, None),
                    1 => verdict(0, None),
                    2 => verdict(-1, None),
                    3 if jumps => verdict(-3, Some("sub")),
                    4 if !jumps => verdict(-5, None),
                    _ => crate::build::counter(),
                });
                e
            };
            let n = rng.gen_range(0..80);
            let base: Vec<Vec<Expression>> = (0..n).map(|_| rule(&mut rng, true)).collect();
            let sub: Vec<Vec<Expression>> = (0..rng.gen_range(0..30))
                .map(|_| rule(&mut rng, false))
                .collect();
            let t = table(vec![
                chain("fwd", Some((2, u32::from(round % 2 == 0))), base),
                chain("sub", None, sub),
            ]);
            let fast = Program::compile(&t, "fwd").unwrap();
            let mut walk = fast.clone();
            walk.blocks = vec![Blocks::default(); walk.chains.len()];
            blocked += fast
                .blocks
                .iter()
                .filter(|b| **b != Blocks::default())
                .count();
            for _ in 0..200 {
                let mut ip = udp4(
                    [10, 9, 0, rng.gen_range(0..4)],
                    rng.gen_range(0..6),
                    rng.gen_range(60..66),
                );
                ip[9] = if rng.gen() { 6 } else { 17 };
                ip[15] = rng.gen_range(0..4);
                let info = Info::of(&ip);
                let f = frame(&ip);
                let v = |p: &Program| {
                    p.accepts(&f, &info, true, link(2, "ra"), Some(link(3, "rb")), None)
                };
                assert_eq!(v(&fast), v(&walk), "round {round}, {ip:02x?}");
            }
        }
        assert!(blocked > 50, "{blocked}");
    }

    /// What `Steady` vouches for holds: over random chains reading fields a
    /// connection's packets hold alike (addresses, protocol, ports, the output link's
    /// name) and fields they may not (the time to live, the type of service, the length,
    /// the UDP length, the link layer's destination), each packet whose way read only the
    /// former is decided as every packet that differs from it in the latter only; and
    /// both kinds of way are met.
    #[test]
    fn a_steady_verdict_is_every_alike_packets_verdict() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
        let (mut steady_ways, mut unsteady_ways) = (0, 0);
        for round in 0..150 {
            let rule = |rng: &mut rand::rngs::SmallRng, jumps: bool| {
                let mut e = Vec::new();
                for _ in 0..rng.gen_range(1..3) {
                    match rng.gen_range(0..9) {
                        0 => e.extend([payload(1, 12, 4, 1), cmp(0, 1, &[10, 0, 0, 2])]),
                        1 => e.extend([
                            payload(1, 16, 4, 2),
                            cmp(rng.gen_range(0..2), 2, &[10, 9, 0, rng.gen_range(0..4)]),
                        ]),
                        2 => e.extend([payload(2, 2, 2, 9), cmp(0, 9, &[0, rng.gen_range(0..4)])]),
                        3 => e.extend([meta(16, 1), cmp(0, 1, &[17])]),
                        4 => e.extend([meta(7, 1), cmp(1, 1, b"rb\0\0\0\0\0\0\0\0\0\0\0\0\0\0")]),
                        // The unsteady: ttl, tos, length, UDP length, MAC destination.
                        5 => e.extend([payload(1, 8, 1, 1), cmp(4, 1, &[rng.gen_range(60..66)])]),
                        6 => e.extend([payload(1, 1, 1, 1), cmp(0, 1, &[rng.gen_range(0..2)])]),
                        7 => e.extend([
                            meta(0, 1),
                            cmp(2, 1, &(rng.gen_range(28u32..32)).to_ne_bytes()),
                        ]),
                        _ => e.extend([
                            payload(if rng.gen() { 2 } else { 0 }, 4, 2, 1),
                            cmp(0, 1, &[0, rng.gen_range(7..10)]),
                        ]),
                    }
                }
                e.push(match rng.gen_range(0..5) {
                    0 => verdict(1, None),
                    1 => verdict(0, None),
                    2 if jumps => verdict(-3, Some("sub")),
                    3 if !jumps => verdict(-5, None),
                    _ => crate::build::counter(),
                });
                e
            };
            let base: Vec<Vec<Expression>> = (0..rng.gen_range(1..40))
                .map(|_| rule(&mut rng, true))
                .collect();
            let sub: Vec<Vec<Expression>> = (0..rng.gen_range(0..10))
                .map(|_| rule(&mut rng, false))
                .collect();
            let t = table(vec![
                chain("fwd", Some((2, u32::from(round % 2 == 0))), base),
                chain("sub", None, sub),
            ]);
            let c = Program::compile(&t, "fwd").unwrap();
            let decide = |ip: &[u8], mac: u8, steady: Option<&Steady>| {
                // (Byte 5 is the destination's last, which the link-layer rules read.)
                let mut f = frame(ip);
                f[5] = mac;
                let info = Info::of(ip);
                c.decide(
                    &f,
                    &info,
                    true,
                    link(2, "ra"),
                    Some(link(3, "rb")),
                    None,
                    steady,
                )
            };
            for _ in 0..50 {
                let mut ip = udp4([10, 9, 0, rng.gen_range(0..4)], rng.gen_range(0..4), 64);
                let vary = |rng: &mut rand::rngs::SmallRng, ip: &mut Vec<u8>| {
                    ip[8] = rng.gen_range(60..66);
                    ip[1] = rng.gen_range(0..2);
                    ip[24..26].copy_from_slice(&[0, rng.gen_range(7..10)]);
                    let extra = rng.gen_range(0..4);
                    ip.resize(28 + extra, 0);
                    ip[2..4].copy_from_slice(&(28 + extra as u16).to_be_bytes());
                };
                vary(&mut rng, &mut ip);
                let steady = Steady::default();
                let d = decide(&ip, rng.gen_range(7..10), Some(&steady));
                if !steady.holds() {
                    unsteady_ways += 1;
                    continue;
                }
                steady_ways += 1;
                for _ in 0..20 {
                    let mut alike = ip.clone();
                    vary(&mut rng, &mut alike);
                    assert_eq!(
                        decide(&alike, rng.gen_range(7..10), None),
                        d,
                        "round {round}: {ip:02x?} and {alike:02x?}"
                    );
                }
            }
        }
        assert!(
            steady_ways > 1000 && unsteady_ways > 1000,
            "{steady_ways} {unsteady_ways}"
        );
    }

    #[test]
    fn connections_are_read_as_nft_ct_get_eval_reads_them() {
        use fibre_conntrack::{Conntrack, Settings};
        // Forward: ct state established accept; ct direction reply drop; ct original
        // proto-dst 53 accept; policy drop.
        let rules = vec![
            vec![
                ct(0, 1, None),
                cmp(0, 1, &2u32.to_ne_bytes()),
                verdict(1, None),
            ],
            vec![ct(1, 1, None), cmp(0, 1, &[1]), verdict(0, None)],
            vec![
                ct(12, 1, Some(0)),
                cmp(0, 1, &53u16.to_be_bytes()),
                verdict(1, None),
            ],
        ];
        let r = ruleset(Family::Inet, "t", vec![chain("fwd", Some((2, 0)), rules)]);
        let f = Filter::of(&r);
        assert!(f.reads_connections());
        let mut table = Conntrack::new(Settings::kernel_defaults());
        let mut ip = udp4([10, 2, 0, 2], 53, 64);
        let (iif, oif) = (link(2, "ra"), link(3, "rb"));
        let decide = |table: &mut Conntrack, ip: &[u8]| {
            let t = table.track(ip, 1, true);
            let pass = {
                let ct = Ct {
                    state: t.state().bit(),
                    reply: t.reply(),
                    connection: table.connection(&t),
                    steady: None,
                };
                let fr = frame(ip);
                f.forwarding(
                    &Packet {
                        frame: &fr,
                        iif,
                        oif,
                    },
                    Some(&ct),
                )
            };
            if pass {
                table.confirm(&t);
            }
            pass
        };
        // New, to port 53: accepted by its original destination port.
        assert!(decide(&mut table, &ip));
        // The reply: established, accepted before the direction's rule.
        let mut reply = ip.clone();
        reply[12..16].copy_from_slice(&[10, 2, 0, 2]);
        reply[16..20].copy_from_slice(&[10, 0, 0, 2]);
        reply[20..24].copy_from_slice(&[0, 53, 0x30, 0x39]);
        assert!(decide(&mut table, &reply));
        // A new flow to port 99: neither established nor to 53: the policy drops it,
        // and it leaves no connection behind.
        ip[22..24].copy_from_slice(&99u16.to_be_bytes());
        assert!(!decide(&mut table, &ip));
        assert_eq!(table.len(), 1);
        // Without a connection (before conntrack's hook), `ct state` reads invalid and
        // the other keys break the rule.
        let fr = frame(&ip);
        assert!(!f.forwarding(
            &Packet {
                frame: &fr,
                iif,
                oif
            },
            None
        ));
    }

    #[test]
    fn the_taken_down_ttl_and_checksum_are_what_the_kernel_writes() {
        let mut ip = udp4([10, 2, 0, 2], 53, 64);
        let sum = checksum(&ip[..20]);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        let mut out = [0u8; 4];
        taken_down(&ip, 8, &mut out);
        let mut after = ip.clone();
        after[8] -= 1;
        after[10..12].fill(0);
        let sum = checksum(&after[..20]);
        assert_eq!(out, [63, 17, (sum >> 8) as u8, sum as u8]);
    }

    #[test]
    fn ipv6_headers_are_walked_as_the_kernel_walks_them() {
        let mut ip = vec![0x60, 0, 0, 0, 0, 16, 0, 64];
        ip.extend([0; 32]);
        // Hop-by-hop options (8 bytes), then UDP.
        ip.extend([17, 0, 1, 4, 0, 0, 0, 0]);
        ip.extend([0, 1, 0, 2, 0, 8, 0, 0]);
        assert_eq!(ipv6_transport(&ip), Some((17, 48, 0)));
        // An authentication header is taken for the transport's.
        ip[6] = 51;
        assert_eq!(ipv6_transport(&ip), Some((51, 40, 0)));
        // A later fragment: its protocol, and the transport offset the kernel leaves
        // at 0.
        ip[6] = 44;
        ip[40..48].copy_from_slice(&[17, 0, 0, 8, 0, 0, 0, 1]);
        assert_eq!(ipv6_transport(&ip), Some((17, 0, 8)));
        let info = Info::of(&ip);
        assert_eq!((info.l4, info.fragoff), (Some((17, 0)), 8));
    }

    fn checksum(h: &[u8]) -> u16 {
        let mut s: u32 = h
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    }
}
