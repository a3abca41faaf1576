//! The input stage over a vector: each frame checked and sorted ([`crate::input`]),
//! the packets to route gathered by family with the addresses the route stage
//! searches, the others' fates set (for the kernel, or dropped with the reason).

use super::{Dropped, Fate, Handed, Pipeline};
use crate::input::{self, Input, ETHERNET_LEN};
use crate::offload::{Gso, GsoKind, Offload};
use crate::pool::{BufferId, Pool};
use fibre_headers::{ipv4, ipv6, tcp, udp, EthernetFrame};
use std::time::Instant;

impl Pipeline {
    /// Checks and sorts the frames of `packets`, received on a link whose MAC address
    /// is `mac`. Each frame's findings are written in place and read back by reference
    /// (a copy of a record just stored in parts stalls the CPU).
    pub(super) fn input_stage(
        &mut self,
        mac: [u8; 6],
        pool: &Pool,
        packets: &[BufferId],
        fates: &mut [Fate],
    ) {
        let n = packets.len();
        let t = Instant::now();
        // Records past the vector's are left as they are: each of the first `n` is
        // written before it is read.
        if self.inputs.len() < n {
            self.inputs.resize(n, Input::Drop(input::Drop::ShortFrame));
        }
        self.v4.clear();
        self.v6.clear();
        self.dst4.clear();
        self.src4.clear();
        self.dst6.clear();
        self.src6.clear();
        self.segment_lens.clear();
        self.segment_lens.resize(n, 0);
        for (i, &id) in packets.iter().enumerate() {
            input::classify_into(pool.frame(id), mac, &mut self.inputs[i]);
            if let Some(gso) = pool.offload(id).gso {
                self.segment_lens[i] = segment_len(pool.frame(id), &pool.offload(id), gso);
            }
        }
        // Sorted once all are classified: a packet's addresses read back at once would
        // wait for the stores that classifying it just made (narrower than the reads)
        // to drain.
        for (i, input) in self.inputs[..n].iter().enumerate() {
            match input {
                Input::V4(p) => {
                    self.v4.push(i);
                    self.dst4.push(p.dst);
                    self.src4.push(p.src);
                }
                Input::V6(p) => {
                    self.v6.push(i);
                    self.dst6.push(p.dst);
                    self.src6.push(p.src);
                }
                Input::Kernel(k) => fates[i] = Fate::Kernel(Handed::Input(*k)),
                Input::Drop(d) => fates[i] = Fate::Drop(Dropped::Input(*d)),
            }
        }
        self.input.add(n, t);
    }
}

/// The length of the IP packets a packet left whole by its sender is cut into: its
/// network and transport headers and a segment's payload, as the kernel's
/// `skb_gso_network_seglen` counts it. Where the transport header starts comes from the
/// partial checksum (a sender that leaves segments to cut leaves the checksum too), or
/// from the IP header.
fn segment_len(frame: &[u8], offload: &Offload, gso: Gso) -> u32 {
    // Each field read where the frame holds its byte, as the kernel's
    // `skb_gso_network_seglen` reads the offsets its sender's headers set, whatever
    // else of those headers is there.
    let byte = |at: usize| frame.get(at).copied();
    let l4 = match offload.checksum {
        Some(c) => c.start as usize,
        None if EthernetFrame::new_checked(frame)
            .is_ok_and(|e| e.ethertype() == input::ETHERTYPE_IPV6) =>
        {
            ETHERNET_LEN + ipv6::HEADER_LEN
        }
        None => {
            ETHERNET_LEN
                + byte(ETHERNET_LEN + ipv4::field::VERSION_AND_LENGTH)
                    .map_or(ipv4::HEADER_LEN, |b| usize::from(b & 0x0f) * 4)
        }
    };
    let transport = match gso.kind {
        GsoKind::Udp => udp::HEADER_LEN,
        GsoKind::Tcp4 | GsoKind::Tcp6 => {
            byte(l4 + tcp::field::DATA_OFFSET).map_or(tcp::HEADER_LEN, |b| usize::from(b >> 4) * 4)
        }
    };
    (l4.saturating_sub(ETHERNET_LEN) + transport) as u32 + u32::from(gso.size)
}
