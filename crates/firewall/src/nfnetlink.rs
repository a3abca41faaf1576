//! nfnetlink sockets to the kernel of the current network namespace: one subscribed to
//! the nf_tables group, which queues every committed change (each batch ending with its
//! generation), and one for the dump, which takes tables, chains, sets, objects,
//! flowtables and rules of every family between two readings of the generation, again until both readings agree and
//! no part was marked interrupted. And the tables of iptables-legacy, read from
//! `/proc/net`.

use crate::gate::Legacy;
use crate::message::{
    self, Message, GETCHAIN, GETFLOWTABLE, GETGEN, GETOBJ, GETRULE, GETSET, GETSETELEM, GETTABLE,
    GROUP_NFTABLES,
};
use crate::ruleset::Ruleset;
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use std::io;

/// The receive buffer asked for each socket: a ruleset of tens of thousands of rules
/// loaded at once queues rather than overflows.
pub const RECEIVE_BUFFER: usize = 32 << 20;

/// Times a dump is taken again when the ruleset changed under it.
const DUMP_TRIES: usize = 16;

/// `NLM_F_DUMP_INTR`.
const NLM_F_DUMP_INTR: u16 = 0x10;

/// A dump of the ruleset.
pub struct Dump {
    /// The ruleset.
    pub ruleset: Ruleset,
    /// Messages that could not be read (dropped).
    pub malformed: u64,
    /// Times the dump was taken again because the ruleset changed under it.
    pub restarts: u64,
    /// Why there is no nf_tables in this kernel, if there is none (then no ruleset
    /// either).
    pub unavailable: Option<String>,
}

/// Dumps the ruleset of every family.
pub fn dump() -> io::Result<Dump> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    fibre_kernel::sockopt::set_receive_buffer(&socket, RECEIVE_BUFFER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut malformed, mut restarts) = (0, 0);
    for _ in 0..DUMP_TRIES {
        let gen = message::request(GETGEN, 0, false, u32::from(GETGEN) + 1);
        let before = match exchange(&mut socket, &mut buf, &gen, false, &mut malformed) {
            Ok((m, _)) => generation(&m),
            Err(e) if unsupported(&e) => {
                return Ok(Dump {
                    ruleset: Ruleset::new(),
                    malformed,
                    restarts,
                    unavailable: Some(format!("nf_tables: {e}")),
                })
            }
            Err(e) => return Err(e),
        };
        let mut ruleset = Ruleset::new();
        let mut interrupted = false;
        for kind in [GETTABLE, GETCHAIN, GETSET, GETOBJ, GETFLOWTABLE, GETRULE] {
            let request = message::request(kind, 0, true, u32::from(kind) + 1);
            let (messages, intr) = exchange(&mut socket, &mut buf, &request, true, &mut malformed)?;
            interrupted |= intr;
            for (m, flags) in messages {
                ruleset.apply(m, flags);
            }
        }
        // Each set's elements, asked for by its table and name.
        let sets: Vec<(u8, String, String)> = ruleset
            .tables()
            .flat_map(|t| t.sets.values())
            .map(|s| (s.family.to_u8(), s.table.clone(), s.name.clone()))
            .collect();
        for (family, table, set) in sets {
            let mut attrs = message::string_attribute(1, &table);
            attrs.extend(message::string_attribute(2, &set));
            let request = message::request_with(GETSETELEM, family, true, 100, &attrs);
            let (messages, intr) = exchange(&mut socket, &mut buf, &request, true, &mut malformed)?;
            interrupted |= intr;
            for (m, flags) in messages {
                ruleset.apply(m, flags);
            }
        }
        let (m, _) = exchange(&mut socket, &mut buf, &gen, false, &mut malformed)?;
        let after = generation(&m);
        if !interrupted && before == after {
            ruleset.generation = after;
            return Ok(Dump {
                ruleset,
                malformed,
                restarts,
                unavailable: None,
            });
        }
        restarts += 1;
    }
    Err(io::Error::other(format!(
        "the ruleset changed under {DUMP_TRIES} dumps in a row"
    )))
}

/// Whether an error says the kernel has no nf_tables.
fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::EPROTONOSUPPORT) | Some(libc::ENOENT)
    )
}

/// The generation a `NFT_MSG_NEWGEN` among `messages` gives.
fn generation(messages: &[(Message, u16)]) -> Option<u32> {
    messages.iter().find_map(|(m, _)| match m {
        Message::NewGen(g) => Some(*g),
        _ => None,
    })
}

/// Sends `request` (a dump if `dump`) and reads its answer to the end; the messages and
/// whether the kernel marked the dump interrupted.
fn exchange(
    socket: &mut Socket,
    buf: &mut [u8],
    request: &[u8],
    dump: bool,
    malformed: &mut u64,
) -> io::Result<(Vec<(Message, u16)>, bool)> {
    socket.send(request, 0)?;
    let mut out = Vec::new();
    let mut interrupted = false;
    loop {
        let n = socket.recv(&mut &mut buf[..], 0)?;
        let before = out.len();
        let (bad, done, error) = message::read_all(&buf[..n], &mut out);
        *malformed += bad;
        if let Some(code) = error {
            return Err(io::Error::from_raw_os_error(code));
        }
        interrupted |= out[before..]
            .iter()
            .any(|(_, flags)| flags & NLM_F_DUMP_INTR != 0);
        // A request that is not a dump is answered by one message.
        if done || (!dump && out.len() > before) {
            return Ok((out, interrupted));
        }
    }
}

/// The subscription to the nf_tables group.
pub struct Events {
    socket: Socket,
    buf: Vec<u8>,
}

/// What one receive gave.
pub enum Batch {
    /// Messages, with their flags, and how many could not be read.
    Messages(Vec<(Message, u16)>, u64),
    /// Messages were lost: the ruleset must be dumped again.
    Overflow,
}

impl Events {
    /// Subscribes to the nf_tables group.
    pub fn subscribe() -> io::Result<Events> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        fibre_kernel::sockopt::set_receive_buffer(&socket, RECEIVE_BUFFER)?;
        socket.bind_auto()?;
        socket.add_membership(GROUP_NFTABLES)?;
        Ok(Events {
            socket,
            buf: vec![0; 1 << 20],
        })
    }

    /// Waits for changes and returns what has queued since, up to the end of a
    /// committed batch (its generation message) or until nothing more is queued.
    /// After an overflow, what is still queued is discarded: the dump that must follow
    /// holds its effect.
    pub fn receive(&mut self) -> io::Result<Batch> {
        let mut out = Vec::new();
        let mut bad = 0;
        let mut flags = 0;
        loop {
            let n = match self.socket.recv(&mut &mut self.buf[..], flags) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    self.discard()?;
                    return Ok(Batch::Overflow);
                }
                Err(e) if flags != 0 && e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            };
            let (b, _, _) = message::read_all(&self.buf[..n], &mut out);
            bad += b;
            if matches!(out.last(), Some((Message::NewGen(_), _))) {
                break;
            }
            flags = libc::MSG_DONTWAIT;
        }
        Ok(Batch::Messages(out, bad))
    }

    /// Reads and drops everything queued, without waiting.
    fn discard(&mut self) -> io::Result<()> {
        loop {
            match self.socket.recv(&mut &mut self.buf[..], libc::MSG_DONTWAIT) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
}

/// The tables of iptables-legacy in this namespace (none where its modules are not
/// loaded). A file there but unreadable (it is root's alone) is taken for a table of
/// unknown rules, named by why: it closes its family.
pub fn legacy() -> Legacy {
    let read = |path: &str| -> Vec<String> {
        match std::fs::read_to_string(path) {
            Ok(t) => t
                .lines()
                .map(str::to_string)
                .filter(|l| !l.is_empty())
                .collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => vec![format!("(unreadable {path}: {e})")],
        }
    };
    Legacy {
        v4: read("/proc/net/ip_tables_names"),
        v6: read("/proc/net/ip6_tables_names"),
    }
}
