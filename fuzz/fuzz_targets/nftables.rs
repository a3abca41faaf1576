//! Fuzzes the firewall from the bytes the kernel sends to the verdicts fibre gives: any
//! nf_tables messages are read (`message::read_all`) and applied to a mirrored ruleset,
//! the gate judges it, every rule is rendered for an operator, the filter is compiled,
//! and frames are put through every hook, and through the NAT chains. No input may
//! panic, and the compiled filter (its blocks skipping rules a packet cannot match) must
//! decide every frame as the same rules walked one by one do. The same bytes are read as
//! ctnetlink's connections too (`connections::decode`).
//!
//! The input: two bytes (big-endian) give the length of the messages, which follow,
//! framed as netlink frames them; then frames, each a length byte and the IP packet
//! (an Ethernet header is put before it, IPv4 or IPv6 by the packet's first nibble).
//! Seeded with the messages of real dumps (`fuzz/seeds/nftables`), whose expressions
//! the fuzzer then varies.
#![no_main]

use fibre_firewall::gate::{self, Legacy};
use fibre_firewall::{connections, message, render, Ct, Filter, Hook, Link, Packet, Part, Ruleset};
use libfuzzer_sys::fuzz_target;

fn link(index: u32, name: &str) -> Link<'_> {
    Link {
        index,
        name,
        kind: 1,
        group: index,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(len) = data.get(..2).map(|l| usize::from(u16::from_be_bytes([l[0], l[1]]))) else {
        return;
    };
    let messages = &data[2..(2 + len).min(data.len())];
    let mut frames = data.get(2 + len..).unwrap_or_default();

    let mut read = Vec::new();
    let _ = message::read_all(messages, &mut read);
    let mut ruleset = Ruleset::new();
    for (m, flags) in read {
        ruleset.apply(m, flags);
    }
    // As ctnetlink's: each message's payload as a connection.
    let _ = connections::decode(messages.get(16..).unwrap_or_default(), 1);

    let links = ["ra".to_string(), "rb".to_string()];
    let refusals = gate::refusals(&ruleset, &links, &Legacy::default());
    for r in &refusals {
        let _ = r.describe();
        let _ = r.to_json();
    }
    let _ = gate::tracked(&ruleset);
    for t in ruleset.tables() {
        for c in t.chains.values() {
            for r in &c.rules {
                let _ = render::rule(r);
            }
        }
    }

    let fast = Filter::of(&ruleset);
    let walked = fast.walked();
    let (iif, oif) = (link(2, "ra"), link(3, "rb"));
    while let Some((&n, rest)) = frames.split_first() {
        let ip = &rest[..usize::from(n).min(rest.len())];
        frames = &rest[ip.len()..];
        let mut frame = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
        if ip.first().is_some_and(|b| b >> 4 == 6) {
            frame[12..14].copy_from_slice(&[0x86, 0xdd]);
        }
        frame.extend_from_slice(ip);
        for state in [None, Some(1u32 << 3), Some(1 << 1), Some(1)] {
            let ct = state.map(|state| Ct {
                state,
                reply: state == 1 << 1,
                connection: None,
                steady: None,
            });
            let p = Packet {
                frame: &frame,
                iif,
                oif,
            };
            for part in [Part::Whole, Part::BeforeNat, Part::AfterNat] {
                assert_eq!(
                    fast.prerouting_verdict(&frame, iif, ct.as_ref(), part),
                    walked.prerouting_verdict(&frame, iif, ct.as_ref(), part),
                    "prerouting"
                );
                assert_eq!(
                    fast.forwarding_verdict(&p, ct.as_ref(), part),
                    walked.forwarding_verdict(&p, ct.as_ref(), part),
                    "forwarding"
                );
            }
            for hook in [Hook::Prerouting, Hook::Postrouting] {
                let out = (hook == Hook::Postrouting).then_some(oif);
                assert_eq!(
                    fast.nat(hook, &frame, iif, out, ct.as_ref()),
                    walked.nat(hook, &frame, iif, out, ct.as_ref()),
                    "nat"
                );
            }
        }
    }
});
