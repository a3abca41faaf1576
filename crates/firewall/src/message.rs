//! nf_tables messages (`NFNL_SUBSYS_NFTABLES` over `NETLINK_NETFILTER`), which no netlink
//! crate decodes: the framing and the attributes are `netlink-packet-core`'s
//! (`NlasIterator`); this module reads the `nfgenmsg` header and the attributes of
//! tables, chains, rules and generations, and keeps each rule's expressions whole (their
//! name and their attributes as the kernel sent them) for what reads them next.

use netlink_packet_core::NlasIterator;

/// `NFNL_SUBSYS_NFTABLES`: the high byte of an nf_tables message's type.
pub const SUBSYS_NFTABLES: u8 = 10;
/// `NFNLGRP_NFTABLES`: the group announcing every committed change.
pub const GROUP_NFTABLES: u32 = 7;

/// `NFT_MSG_NEWTABLE`.
pub const NEWTABLE: u8 = 0;
/// `NFT_MSG_GETTABLE`.
pub const GETTABLE: u8 = 1;
/// `NFT_MSG_DELTABLE`.
pub const DELTABLE: u8 = 2;
/// `NFT_MSG_NEWCHAIN`.
pub const NEWCHAIN: u8 = 3;
/// `NFT_MSG_GETCHAIN`.
pub const GETCHAIN: u8 = 4;
/// `NFT_MSG_DELCHAIN`.
pub const DELCHAIN: u8 = 5;
/// `NFT_MSG_NEWRULE`.
pub const NEWRULE: u8 = 6;
/// `NFT_MSG_GETRULE`.
pub const GETRULE: u8 = 7;
/// `NFT_MSG_DELRULE`.
pub const DELRULE: u8 = 8;
/// `NFT_MSG_NEWSET`.
pub const NEWSET: u8 = 9;
/// `NFT_MSG_GETSET`.
pub const GETSET: u8 = 10;
/// `NFT_MSG_DELSET`.
pub const DELSET: u8 = 11;
/// `NFT_MSG_NEWSETELEM`.
pub const NEWSETELEM: u8 = 12;
/// `NFT_MSG_GETSETELEM`.
pub const GETSETELEM: u8 = 13;
/// `NFT_MSG_DELSETELEM`.
pub const DELSETELEM: u8 = 14;
/// `NFT_MSG_NEWGEN`: the end of a committed batch, with its generation.
pub const NEWGEN: u8 = 15;
/// `NFT_MSG_GETGEN`.
pub const GETGEN: u8 = 16;
/// `NFT_MSG_NEWOBJ`.
pub const NEWOBJ: u8 = 18;
/// `NFT_MSG_GETOBJ`.
pub const GETOBJ: u8 = 19;
/// `NFT_MSG_DELOBJ`.
pub const DELOBJ: u8 = 20;
/// `NFT_MSG_NEWFLOWTABLE`.
pub const NEWFLOWTABLE: u8 = 22;
/// `NFT_MSG_GETFLOWTABLE`.
pub const GETFLOWTABLE: u8 = 23;
/// `NFT_MSG_DELFLOWTABLE`.
pub const DELFLOWTABLE: u8 = 24;
/// `NFT_MSG_DESTROYTABLE` .. `NFT_MSG_DESTROYFLOWTABLE`: announced as removals too.
const DESTROY: std::ops::RangeInclusive<u8> = 26..=32;

/// `NLM_F_APPEND` in a rule's notification: added at the chain's end.
pub const NLM_F_APPEND: u16 = 0x800;

/// The size of `struct nfgenmsg`.
const NFGENMSG: usize = 4;
/// The size of `struct nlmsghdr`.
const NLMSGHDR: usize = 16;

/// An nf_tables family (`NFPROTO_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// `inet`: IPv4 and IPv6.
    Inet,
    /// `ip`.
    Ip,
    /// `arp`.
    Arp,
    /// `netdev`: a device's ingress or egress.
    Netdev,
    /// `bridge`.
    Bridge,
    /// `ip6`.
    Ip6,
    /// Another value.
    Other(u8),
}

impl Family {
    /// From `nfgen_family`.
    pub fn from_u8(v: u8) -> Family {
        match v {
            1 => Family::Inet,
            2 => Family::Ip,
            3 => Family::Arp,
            5 => Family::Netdev,
            7 => Family::Bridge,
            10 => Family::Ip6,
            v => Family::Other(v),
        }
    }

    /// As `nfgen_family`.
    pub fn to_u8(self) -> u8 {
        match self {
            Family::Inet => 1,
            Family::Ip => 2,
            Family::Arp => 3,
            Family::Netdev => 5,
            Family::Bridge => 7,
            Family::Ip6 => 10,
            Family::Other(v) => v,
        }
    }

    /// The family as `nft` names it.
    pub fn name(&self) -> String {
        match self {
            Family::Inet => "inet".into(),
            Family::Ip => "ip".into(),
            Family::Arp => "arp".into(),
            Family::Netdev => "netdev".into(),
            Family::Bridge => "bridge".into(),
            Family::Ip6 => "ip6".into(),
            Family::Other(v) => format!("family {v}"),
        }
    }
}

/// A table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// Its family.
    pub family: Family,
    /// Its name.
    pub name: String,
    /// `NFT_TABLE_F_*`: dormant (1), owned by a process (2), persisting it (4).
    pub flags: u32,
    /// Its handle.
    pub handle: u64,
}

impl Table {
    /// Whether its chains are off (`flags dormant`).
    pub fn dormant(&self) -> bool {
        self.flags & 1 != 0
    }
}

/// Where a base chain hooks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hook {
    /// The hook's number in its family (`NF_INET_PRE_ROUTING` 0, `LOCAL_IN` 1,
    /// `FORWARD` 2, `LOCAL_OUT` 3, `POST_ROUTING` 4, `INGRESS` 5; netdev `INGRESS` 0,
    /// `EGRESS` 1).
    pub number: u32,
    /// Its priority.
    pub priority: i32,
    /// The devices it is on (netdev and inet ingress chains); a name ending in `*` is
    /// a prefix (`NFTA_DEVICE_PREFIX`), matching every device it begins.
    pub devices: Vec<String>,
}

/// Whether a hook's device (a name, or a prefix ending in `*`) is the link `name`.
pub fn device_is(device: &str, name: &str) -> bool {
    match device.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => device == name,
    }
}

/// A chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// Its table's family.
    pub family: Family,
    /// Its table.
    pub table: String,
    /// Its name.
    pub name: String,
    /// Its handle.
    pub handle: u64,
    /// Where it hooks: a base chain's; `None` for a chain reached by jumps.
    pub hook: Option<Hook>,
    /// A base chain's policy: accept (1) or drop (0).
    pub policy: Option<u32>,
    /// A base chain's type: `filter`, `nat` or `route`.
    pub kind: Option<String>,
}

/// A set or map, with its elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    /// Its table's family.
    pub family: Family,
    /// Its table.
    pub table: String,
    /// Its name (`__set0`, ... for an anonymous set).
    pub name: String,
    /// The expressions each element carries (`NFTA_SET_EXPR`, `NFTA_SET_EXPRESSIONS`).
    pub expressions: Vec<Expression>,
    /// `NFT_SET_*`: anonymous 0x1, constant 0x2, interval 0x4, map 0x8, timeout 0x10,
    /// eval 0x20 (updated from the packet path), object 0x40, concat 0x80.
    pub flags: u32,
    /// The key's length in bytes (each field of a concatenation takes a multiple of 4).
    pub key_len: u32,
    /// A map's data type (`NFT_DATA_VERDICT`, 0xffffff00, for a verdict map).
    pub data_type: Option<u32>,
    /// A map's data length in bytes.
    pub data_len: u32,
    /// The lengths of a concatenation's fields (`NFTA_SET_DESC_CONCAT`), in bytes.
    pub fields: Vec<u32>,
    /// Its elements, as the kernel announced them.
    pub elements: Vec<Element>,
}

/// `NFT_SET_ELEM_INTERVAL_END`: the element ends an interval (the key is the first
/// past it).
pub const ELEMENT_INTERVAL_END: u32 = 1;
/// `NFT_SET_ELEM_CATCHALL`: the element matches what no other does (`*`).
pub const ELEMENT_CATCHALL: u32 = 2;

/// An element of a set or map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Element {
    /// Its key (none for a catch-all).
    pub key: Vec<u8>,
    /// The last key of its range, for a set of ranges of concatenations.
    pub key_end: Option<Vec<u8>>,
    /// `NFT_SET_ELEM_*`.
    pub flags: u32,
    /// A map element's data.
    pub data: Option<ElementData>,
    /// Its timeout, in milliseconds, if it has one.
    pub timeout: Option<u64>,
    /// What is left of its timeout, in milliseconds, when announced.
    pub expiration: Option<u64>,
}

/// A map element's data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ElementData {
    /// Bytes.
    Value(Vec<u8>),
    /// A verdict: its code, and the chain of a jump or goto.
    Verdict(i32, Option<String>),
}

impl Element {
    /// Whether it is the same element as `other` (key, end and flags alike).
    pub fn same(&self, other: &Element) -> bool {
        self.key == other.key && self.key_end == other.key_end && self.flags == other.flags
    }
}

/// A stateful object (`ct helper`, `ct timeout`, `counter`, `quota`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    /// Its table's family.
    pub family: Family,
    /// Its table.
    pub table: String,
    /// Its name.
    pub name: String,
    /// `NFT_OBJECT_*`: counter 1, quota 2, ct helper 3, limit 4, connlimit 5, tunnel 6,
    /// ct timeout 7, secmark 8, ct expectation 9, synproxy 10.
    pub kind: u32,
}

/// A flowtable: the devices whose flows it offloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flowtable {
    /// Its table's family.
    pub family: Family,
    /// Its table.
    pub table: String,
    /// Its name.
    pub name: String,
    /// Its devices (a name ending in `*` is a prefix).
    pub devices: Vec<String>,
}

/// One expression of a rule, as the kernel sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expression {
    /// Its name (`payload`, `cmp`, `immediate`, `ct`, `nat`, ...).
    pub name: String,
    /// Its attributes (`NFTA_EXPR_DATA`'s content), undecoded.
    pub data: Vec<u8>,
}

/// A rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Its table's family.
    pub family: Family,
    /// Its table.
    pub table: String,
    /// Its chain.
    pub chain: String,
    /// Its handle.
    pub handle: u64,
    /// The handle of the rule it follows, when the kernel says (a notification of a rule
    /// not first in its chain, and every dumped rule but the first).
    pub position: Option<u64>,
    /// Its expressions, in order.
    pub expressions: Vec<Expression>,
    /// Its comment (`comment "..."`), if it has one.
    pub comment: Option<String>,
}

/// A decoded nf_tables message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// A table made or changed.
    NewTable(Table),
    /// A table removed, with everything in it.
    DelTable(Family, String),
    /// A chain made or changed (for a chain there already: devices added to its hook).
    NewChain(Chain),
    /// A chain removed: family, table, name; or, when devices are named, those
    /// devices taken off its hook.
    DelChain(Family, String, String, Vec<String>),
    /// A set made or changed.
    NewSet(Set),
    /// A set removed: family, table, name.
    DelSet(Family, String, String),
    /// Elements added to a set: family, table, set, elements.
    NewElements(Family, String, String, Vec<Element>),
    /// Elements removed from a set: family, table, set, elements.
    DelElements(Family, String, String, Vec<Element>),
    /// An object made or changed.
    NewObject(Object),
    /// An object removed: family, table, name.
    DelObject(Family, String, String),
    /// A flowtable made (or devices added to it).
    NewFlowtable(Flowtable),
    /// A flowtable removed: family, table, name; or, when devices are named, those
    /// devices taken off it.
    DelFlowtable(Family, String, String, Vec<String>),
    /// A rule added or replaced.
    NewRule(Rule),
    /// A rule removed: family, table, chain, handle.
    DelRule(Family, String, String, u64),
    /// The end of a committed batch: the new generation.
    NewGen(u32),
    /// Another nf_tables message (sets, elements, objects, flowtables): its type.
    Other(u8),
}

/// What one netlink message was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// An nf_tables message, with its header's flags.
    Message(Message, u16),
    /// The end of a dump.
    Done,
    /// An acknowledgement or a message of another subsystem.
    Ignored,
}

/// Why a message could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// The kernel's error (`NLMSG_ERROR` with a code).
    Kernel(i32),
    /// The bytes do not make the message they say.
    Bytes(&'static str),
}

/// Reads one netlink message (its whole bytes, header included).
pub fn read(bytes: &[u8]) -> Result<Read, Malformed> {
    if bytes.len() < NLMSGHDR {
        return Err(Malformed::Bytes("shorter than a netlink header"));
    }
    let kind = u16::from_ne_bytes([bytes[4], bytes[5]]);
    let flags = u16::from_ne_bytes([bytes[6], bytes[7]]);
    let payload = &bytes[NLMSGHDR..];
    match kind {
        // NLMSG_ERROR: an acknowledgement (code 0) or an error.
        2 => {
            if payload.len() < 4 {
                return Err(Malformed::Bytes("an error message without its code"));
            }
            let code = i32::from_ne_bytes([payload[0], payload[1], payload[2], payload[3]]);
            return if code == 0 {
                Ok(Read::Ignored)
            } else {
                Err(Malformed::Kernel(-code))
            };
        }
        // NLMSG_DONE: a dump's end, with the dump's error if it failed.
        3 => {
            let code = payload
                .get(..4)
                .map_or(0, |c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]));
            return if code < 0 {
                Err(Malformed::Kernel(-code))
            } else {
                Ok(Read::Done)
            };
        }
        1 | 4 => return Ok(Read::Ignored),
        _ => {}
    }
    if (kind >> 8) as u8 != SUBSYS_NFTABLES {
        return Ok(Read::Ignored);
    }
    decode((kind & 0xff) as u8, payload)
        .map(|m| Read::Message(m, flags))
        .map_err(Malformed::Bytes)
}

/// Decodes the payload (after the netlink header) of an nf_tables message of type `msg`.
pub fn decode(msg: u8, payload: &[u8]) -> Result<Message, &'static str> {
    if payload.len() < NFGENMSG {
        return Err("an nf_tables message shorter than its header");
    }
    let family = Family::from_u8(payload[0]);
    let attrs = Attributes::read(&payload[NFGENMSG..])?;
    // A removal the kernel calls "destroy" is announced as one.
    let msg = if DESTROY.contains(&msg) {
        [
            DELTABLE,
            DELCHAIN,
            DELRULE,
            DELSET,
            DELSETELEM,
            DELOBJ,
            DELFLOWTABLE,
        ][usize::from(msg - 26)]
    } else {
        msg
    };
    Ok(match msg {
        NEWTABLE | DELTABLE => {
            let name = attrs.string(1)?.ok_or("a table without its name")?;
            if msg == DELTABLE {
                Message::DelTable(family, name)
            } else {
                Message::NewTable(Table {
                    family,
                    name,
                    flags: attrs.u32(2)?.unwrap_or(0),
                    handle: attrs.u64(4)?.unwrap_or(0),
                })
            }
        }
        NEWCHAIN | DELCHAIN => {
            let table = attrs.string(1)?.ok_or("a chain without its table")?;
            let name = attrs.string(3)?.ok_or("a chain without its name")?;
            if msg == DELCHAIN {
                let devices = match attrs.get(4) {
                    Some(nested) => hook(nested)?.devices,
                    None => Vec::new(),
                };
                Message::DelChain(family, table, name, devices)
            } else {
                let hook = match attrs.get(4) {
                    Some(nested) => Some(hook(nested)?),
                    None => None,
                };
                Message::NewChain(Chain {
                    family,
                    table,
                    name,
                    handle: attrs.u64(2)?.unwrap_or(0),
                    hook,
                    policy: attrs.u32(5)?,
                    kind: attrs.string(7)?,
                })
            }
        }
        NEWRULE | DELRULE => {
            let table = attrs.string(1)?.ok_or("a rule without its table")?;
            let chain = attrs.string(2)?.ok_or("a rule without its chain")?;
            let handle = attrs.u64(3)?.ok_or("a rule without its handle")?;
            if msg == DELRULE {
                Message::DelRule(family, table, chain, handle)
            } else {
                let expressions = match attrs.get(4) {
                    Some(list) => expressions(list)?,
                    None => Vec::new(),
                };
                Message::NewRule(Rule {
                    family,
                    table,
                    chain,
                    handle,
                    position: attrs.u64(6)?,
                    expressions,
                    comment: attrs.get(7).and_then(comment),
                })
            }
        }
        NEWSET | DELSET => {
            let table = attrs.string(1)?.ok_or("a set without its table")?;
            let name = attrs.string(2)?.ok_or("a set without its name")?;
            if msg == DELSET {
                Message::DelSet(family, table, name)
            } else {
                let mut expressions = Vec::new();
                if let Some(one) = attrs.get(17) {
                    expressions.push(expression(one)?);
                }
                if let Some(list) = attrs.get(18) {
                    expressions.extend(self::expressions(list)?);
                }
                // NFTA_SET_DESC 9: NFTA_SET_DESC_CONCAT 2, a list of fields, each
                // NFTA_SET_FIELD_LEN 1.
                let mut fields = Vec::new();
                if let Some(desc) = attrs.get(9) {
                    if let Some(concat) = Attributes::read(desc)?.get(2) {
                        for (_, field) in Attributes::read(concat)?.all() {
                            fields.push(Attributes::read(field)?.u32(1)?.unwrap_or(0));
                        }
                    }
                }
                Message::NewSet(Set {
                    family,
                    table,
                    name,
                    expressions,
                    flags: attrs.u32(3)?.unwrap_or(0),
                    key_len: attrs.u32(5)?.ok_or("a set without its key's length")?,
                    data_type: attrs.u32(6)?,
                    data_len: attrs.u32(7)?.unwrap_or(0),
                    fields,
                    elements: Vec::new(),
                })
            }
        }
        NEWSETELEM | DELSETELEM => {
            let table = attrs.string(1)?.ok_or("elements without their table")?;
            let set = attrs.string(2)?.ok_or("elements without their set")?;
            let mut elements = Vec::new();
            if let Some(list) = attrs.get(3) {
                for (_, e) in Attributes::read(list)?.all() {
                    elements.push(element(e)?);
                }
            }
            if msg == DELSETELEM {
                Message::DelElements(family, table, set, elements)
            } else {
                Message::NewElements(family, table, set, elements)
            }
        }
        NEWOBJ | DELOBJ => {
            let table = attrs.string(1)?.ok_or("an object without its table")?;
            let name = attrs.string(2)?.ok_or("an object without its name")?;
            if msg == DELOBJ {
                Message::DelObject(family, table, name)
            } else {
                Message::NewObject(Object {
                    family,
                    table,
                    name,
                    kind: attrs.u32(3)?.ok_or("an object without its type")?,
                })
            }
        }
        NEWFLOWTABLE | DELFLOWTABLE => {
            let table = attrs.string(1)?.ok_or("a flowtable without its table")?;
            let name = attrs.string(2)?.ok_or("a flowtable without its name")?;
            // NFTA_FLOWTABLE_HOOK: NUM 1, PRIORITY 2, DEVS 3.
            let devices = match attrs.get(3) {
                Some(nested) => match Attributes::read(nested)?.get(3) {
                    Some(devs) => devices(devs)?,
                    None => Vec::new(),
                },
                None => Vec::new(),
            };
            if msg == DELFLOWTABLE {
                Message::DelFlowtable(family, table, name, devices)
            } else {
                Message::NewFlowtable(Flowtable {
                    family,
                    table,
                    name,
                    devices,
                })
            }
        }
        NEWGEN => Message::NewGen(attrs.u32(1)?.ok_or("a generation without its id")?),
        other => Message::Other(other),
    })
}

/// A message's attributes, by type (the nested flag taken off), in order.
pub struct Attributes<'a>(Vec<(u16, &'a [u8])>);

impl<'a> Attributes<'a> {
    /// Reads the attributes of `bytes`.
    pub fn read(bytes: &'a [u8]) -> Result<Attributes<'a>, &'static str> {
        let mut out = Vec::new();
        for nla in NlasIterator::new(bytes) {
            let nla = nla.map_err(|_| "a malformed attribute")?;
            let (kind, len) = (nla.kind() & 0x3fff, nla.value_length());
            let whole: &'a [u8] = nla.into_inner();
            let value = whole.get(4..4 + len).ok_or("a malformed attribute")?;
            out.push((kind, value));
        }
        Ok(Attributes(out))
    }

    /// The first attribute of type `kind`.
    pub fn get(&self, kind: u16) -> Option<&'a [u8]> {
        self.0.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v)
    }

    /// Every attribute, in order.
    pub fn all(&self) -> &[(u16, &'a [u8])] {
        &self.0
    }

    /// A NUL-terminated string attribute.
    pub fn string(&self, kind: u16) -> Result<Option<String>, &'static str> {
        self.get(kind).map(string).transpose()
    }

    /// A big-endian 32-bit attribute.
    pub fn u32(&self, kind: u16) -> Result<Option<u32>, &'static str> {
        self.get(kind).map(be32).transpose()
    }

    /// A big-endian 64-bit attribute.
    pub fn u64(&self, kind: u16) -> Result<Option<u64>, &'static str> {
        self.get(kind)
            .map(|v| {
                <[u8; 8]>::try_from(v)
                    .map(u64::from_be_bytes)
                    .map_err(|_| "a 64-bit attribute of another length")
            })
            .transpose()
    }
}

/// A NUL-terminated string. The kernel takes names as bytes; one that is not UTF-8 is
/// kept with its odd bytes replaced, never dropped (a table or chain dropped would be
/// one the gate does not see).
pub fn string(v: &[u8]) -> Result<String, &'static str> {
    let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
    Ok(String::from_utf8_lossy(&v[..end]).into_owned())
}

/// A big-endian 32-bit value.
pub fn be32(v: &[u8]) -> Result<u32, &'static str> {
    <[u8; 4]>::try_from(v)
        .map(u32::from_be_bytes)
        .map_err(|_| "a 32-bit attribute of another length")
}

/// `NFTA_CHAIN_HOOK`: `NFTA_HOOK_HOOKNUM` 1, `_PRIORITY` 2, `_DEV` 3, `_DEVS` 4.
fn hook(nested: &[u8]) -> Result<Hook, &'static str> {
    let a = Attributes::read(nested)?;
    let mut devices = Vec::new();
    if let Some(dev) = a.string(3)? {
        devices.push(dev);
    }
    if let Some(devs) = a.get(4) {
        devices.extend(self::devices(devs)?);
    }
    Ok(Hook {
        number: a.u32(1)?.ok_or("a hook without its number")?,
        priority: a.u32(2)?.unwrap_or(0) as i32,
        devices,
    })
}

/// A hook's devices (`NFTA_HOOK_DEVS`, `NFTA_FLOWTABLE_HOOK_DEVS`): names
/// (`NFTA_DEVICE_NAME` 1), and prefixes (`NFTA_DEVICE_PREFIX` 2) kept with a `*`.
fn devices(devs: &[u8]) -> Result<Vec<String>, &'static str> {
    let mut out = Vec::new();
    for (kind, name) in Attributes::read(devs)?.all() {
        let name = string(name)?;
        out.push(if *kind == 2 { format!("{name}*") } else { name });
    }
    Ok(out)
}

/// One element (`NFTA_SET_ELEM_*`): KEY 1, DATA 2, FLAGS 3, TIMEOUT 4, EXPIRATION 5,
/// KEY_END 10 (after PAD 8 and OBJREF 9); keys and data nest `NFTA_DATA_VALUE` 1 or
/// `NFTA_DATA_VERDICT` 2.
fn element(nested: &[u8]) -> Result<Element, &'static str> {
    let a = Attributes::read(nested)?;
    let value = |k| -> Result<Option<Vec<u8>>, &'static str> {
        match a.get(k) {
            Some(d) => Ok(Attributes::read(d)?.get(1).map(<[u8]>::to_vec)),
            None => Ok(None),
        }
    };
    let data = match a.get(2) {
        Some(d) => {
            let d = Attributes::read(d)?;
            match (d.get(1), d.get(2)) {
                (Some(v), _) => Some(ElementData::Value(v.to_vec())),
                (None, Some(v)) => {
                    let v = Attributes::read(v)?;
                    let code = be32(v.get(1).ok_or("a verdict without its code")?)? as i32;
                    Some(ElementData::Verdict(code, v.string(2)?))
                }
                _ => return Err("an element's data neither a value nor a verdict"),
            }
        }
        None => None,
    };
    Ok(Element {
        key: value(1)?.unwrap_or_default(),
        key_end: value(10)?,
        flags: a.u32(3)?.unwrap_or(0),
        data,
        timeout: a.u64(4)?,
        expiration: a.u64(5)?,
    })
}

/// `NFTA_RULE_EXPRESSIONS`: a list of `NFTA_LIST_ELEM`, each an expression.
pub fn expressions(list: &[u8]) -> Result<Vec<Expression>, &'static str> {
    Attributes::read(list)?
        .all()
        .iter()
        .map(|(_, element)| expression(element))
        .collect()
}

/// One expression: `NFTA_EXPR_NAME` 1 and `NFTA_EXPR_DATA` 2.
pub fn expression(nested: &[u8]) -> Result<Expression, &'static str> {
    let a = Attributes::read(nested)?;
    Ok(Expression {
        name: a.string(1)?.ok_or("an expression without its name")?,
        data: a.get(2).unwrap_or_default().to_vec(),
    })
}

/// The name [`Expression::names`] gives what is nested in a `dynset` but cannot be
/// read: whatever it is, the gate takes it for the worst.
pub const UNREADABLE: &str = "(unreadable)";

impl Expression {
    /// Its name and those of the expressions nested in it (a `dynset`'s, which it
    /// runs on each element it adds or updates), depth first.
    pub fn names(&self) -> Vec<String> {
        let mut out = vec![self.name.clone()];
        if self.name == "dynset" {
            if let Ok(a) = Attributes::read(&self.data) {
                // NFTA_DYNSET_EXPR 7, NFTA_DYNSET_EXPRESSIONS 10.
                let mut nested = Vec::new();
                let mut unreadable = false;
                if let Some(e) = a.get(7) {
                    match expression(e) {
                        Ok(e) => nested.push(e),
                        Err(_) => unreadable = true,
                    }
                }
                if let Some(list) = a.get(10) {
                    match expressions(list) {
                        Ok(list) => nested.extend(list),
                        Err(_) => unreadable = true,
                    }
                }
                for e in nested {
                    out.extend(e.names());
                }
                if unreadable {
                    out.push(UNREADABLE.into());
                }
            } else {
                out.push(UNREADABLE.into());
            }
        }
        out
    }
}

/// A rule's user data (type-length-value, one byte each): its comment
/// (`NFTNL_UDATA_RULE_COMMENT`, 0).
fn comment(udata: &[u8]) -> Option<String> {
    let mut rest = udata;
    while rest.len() >= 2 {
        let (kind, len) = (rest[0], rest[1] as usize);
        let value = rest.get(2..2 + len)?;
        if kind == 0 {
            return string(value).ok();
        }
        rest = &rest[2 + len..];
    }
    None
}

/// A request of type `msg` for `family` (0: every family), dumping if `dump`.
pub fn request(msg: u8, family: u8, dump: bool, seq: u32) -> Vec<u8> {
    request_with(msg, family, dump, seq, &[])
}

/// A request as [`request`] makes it, with attributes (each already framed).
pub fn request_with(msg: u8, family: u8, dump: bool, seq: u32, attrs: &[u8]) -> Vec<u8> {
    let mut flags = libc::NLM_F_REQUEST as u16;
    if dump {
        flags |= libc::NLM_F_DUMP as u16;
    }
    let len = (NLMSGHDR + NFGENMSG + attrs.len()) as u32;
    let mut out = Vec::with_capacity(len as usize);
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&((SUBSYS_NFTABLES as u16) << 8 | msg as u16).to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: family, version (NFNETLINK_V0), resource id.
    out.extend_from_slice(&[family, 0, 0, 0]);
    out.extend_from_slice(attrs);
    out
}

/// A string attribute, framed (its terminating zero and padding included).
pub fn string_attribute(kind: u16, value: &str) -> Vec<u8> {
    let len = 4 + value.len() + 1;
    let mut out = Vec::with_capacity(len.next_multiple_of(4));
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value.as_bytes());
    out.push(0);
    out.resize(len.next_multiple_of(4), 0);
    out
}

/// Splits `bytes` into netlink messages and reads each into `out`; the number that
/// could not be read (each dropped) and whether the dump ended.
pub fn read_all(mut bytes: &[u8], out: &mut Vec<(Message, u16)>) -> (u64, bool, Option<i32>) {
    let (mut bad, mut done, mut error) = (0, false, None);
    while bytes.len() >= NLMSGHDR {
        let len = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        if len < NLMSGHDR || len > bytes.len() {
            return (bad + 1, done, error);
        }
        match read(&bytes[..len]) {
            Ok(Read::Message(m, flags)) => out.push((m, flags)),
            Ok(Read::Done) => done = true,
            Ok(Read::Ignored) => {}
            Err(Malformed::Kernel(code)) => error = Some(code),
            Err(Malformed::Bytes(_)) => bad += 1,
        }
        let step = (len + 3) & !3;
        bytes = &bytes[step.min(bytes.len())..];
    }
    (bad, done, error)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub use crate::build::attribute as nla;

    /// A whole message of type `msg` of `family` with `attrs`.
    pub fn message(msg: u8, family: u8, flags: u16, attrs: &[u8]) -> Vec<u8> {
        let mut out = request(msg, family, false, 1);
        out.extend_from_slice(attrs);
        let len = out.len() as u32;
        out[..4].copy_from_slice(&len.to_ne_bytes());
        out[6..8].copy_from_slice(&flags.to_ne_bytes());
        out
    }

    /// A rule of `family` in `table`/`chain` with `handle` and expressions named.
    pub fn rule(family: u8, table: &str, chain: &str, handle: u64, exprs: &[&str]) -> Vec<u8> {
        let mut list = Vec::new();
        for e in exprs {
            let name = format!("{e}\0");
            list.extend(nla(1 | 0x8000, &nla(1, name.as_bytes())));
        }
        let mut attrs = nla(1, format!("{table}\0").as_bytes());
        attrs.extend(nla(2, format!("{chain}\0").as_bytes()));
        attrs.extend(nla(3, &handle.to_be_bytes()));
        attrs.extend(nla(4 | 0x8000, &list));
        message(NEWRULE, family, 0, &attrs)
    }

    /// A base chain of `family` in `table` at `hook` with `policy`, of `kind`.
    pub fn base_chain(family: u8, table: &str, name: &str, hook: u32, policy: u32) -> Vec<u8> {
        let mut attrs = nla(1, format!("{table}\0").as_bytes());
        attrs.extend(nla(2, &7u64.to_be_bytes()));
        attrs.extend(nla(3, format!("{name}\0").as_bytes()));
        let mut h = nla(1, &hook.to_be_bytes());
        h.extend(nla(2, &0u32.to_be_bytes()));
        attrs.extend(nla(4 | 0x8000, &h));
        attrs.extend(nla(5, &policy.to_be_bytes()));
        attrs.extend(nla(7, b"filter\0"));
        message(NEWCHAIN, family, 0, &attrs)
    }

    #[test]
    fn a_rule_and_a_chain_read_back() {
        let bytes = rule(1, "fw", "fwd", 4, &["payload", "cmp", "immediate"]);
        let Ok(Read::Message(Message::NewRule(r), _)) = read(&bytes) else {
            panic!("{:?}", read(&bytes));
        };
        assert_eq!(
            (r.family, &*r.table, &*r.chain, r.handle),
            (Family::Inet, "fw", "fwd", 4)
        );
        let names: Vec<&str> = r.expressions.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["payload", "cmp", "immediate"]);
        let bytes = base_chain(2, "t", "c", 2, 0);
        let Ok(Read::Message(Message::NewChain(c), _)) = read(&bytes) else {
            panic!();
        };
        assert_eq!(c.hook.unwrap().number, 2);
        assert_eq!((c.policy, c.kind.as_deref()), (Some(0), Some("filter")));
    }

    #[test]
    fn cut_and_random_bytes_are_errors_never_panics() {
        let whole = rule(1, "fw", "fwd", 4, &["payload", "cmp"]);
        let mut out = Vec::new();
        for cut in 0..whole.len() {
            let mut b = whole[..cut].to_vec();
            if b.len() >= 4 {
                let len = b.len() as u32;
                b[..4].copy_from_slice(&len.to_ne_bytes());
            }
            let _ = read(&b);
            let _ = read_all(&b, &mut out);
        }
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        for _ in 0..20_000 {
            let mut b = whole.clone();
            for _ in 0..rng.gen_range(1..6) {
                let i = rng.gen_range(0..b.len());
                b[i] = rng.gen();
            }
            let _ = read(&b);
            let _ = read_all(&b, &mut out);
        }
    }
}
