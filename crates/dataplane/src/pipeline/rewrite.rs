//! The rewrite stage over a vector: each packet to send has its TTL or hop limit taken
//! down by one and its MAC addresses set ([`crate::rewrite`]); an IPv4 packet over the
//! MTU without DF is cut into fragments ([`crate::fragment`]), the later ones in
//! buffers the neighbour stage took for them.

use super::{Dropped, Fate, Pipeline};
use crate::fragment;
use crate::input::Input;
use crate::input::ETHERNET_LEN;
use crate::offload::{self, Offload};
use crate::pool::{BufferId, Pool};
use crate::rewrite;
use std::time::Instant;

impl Pipeline {
    /// Rewrites the packets of `next` (each its index and MAC addresses) in their
    /// buffers, and cuts those to cut.
    pub(super) fn rewrite_stage(
        &mut self,
        pool: &mut Pool,
        packets: &[BufferId],
        fates: &mut [Fate],
        next: &[(usize, [u8; 6], [u8; 6])],
    ) {
        let t = Instant::now();
        for &(i, dst_mac, src_mac) in next {
            let frame = pool.frame_mut(packets[i]);
            match self.inputs[i] {
                Input::V4(_) => rewrite::decrement_ttl(frame),
                _ => rewrite::decrement_hop_limit(frame),
            };
            rewrite::set_macs(frame, dst_mac, src_mac);
        }
        if !self.cut.is_empty() {
            self.fragment(pool, packets, fates);
        }
        self.rewrite.add(next.len(), t);
    }

    /// Cuts each packet of `self.cut`, rewritten, into fragments: the first in the
    /// packet's own buffer, the others in the buffers taken for them (into
    /// `self.fragments`).
    fn fragment(&mut self, pool: &mut Pool, packets: &[BufferId], fates: &mut [Fate]) {
        for (i, mtu, later) in &self.cut {
            let (i, later) = (*i, &self.spare[later.clone()]);
            let ip_len = match self.inputs[i] {
                Input::V4(p) => p.len as usize,
                _ => 0,
            };
            let (id, pieces) = (packets[i], fragment::pieces(ip_len, *mtu as usize));
            let Some(pieces) = pieces else {
                // Not reached: only IPv4 packets that can be cut get here.
                pool.free(later);
                fates[i] = Fate::Drop(Dropped::NoBufferToFragment);
                continue;
            };
            // A checksum left partial is finished first, as `ip_do_fragment` has
            // `skb_checksum_help` finish it: a fragment's device cannot.
            if let Some(c) = pool.offload(id).checksum {
                offload::finish_checksum(pool.frame_mut(id), c);
                pool.set_offload(id, Offload::NONE);
            }
            // The packet without the frame's padding, out of the buffer its first
            // fragment is written to.
            self.whole.clear();
            let frame = pool.frame(id);
            self.whole
                .extend_from_slice(&frame[..(ETHERNET_LEN + ip_len).min(frame.len())]);
            let size = pool.buffer_size();
            let mut whole = true;
            for (k, piece) in pieces.enumerate() {
                let Some(&buffer) = (if k == 0 { Some(&id) } else { later.get(k - 1) }) else {
                    whole = false;
                    break;
                };
                match fragment::write(&self.whole, piece, pool.resize(buffer, size)) {
                    Some(len) => {
                        pool.resize(buffer, len);
                    }
                    None => whole = false,
                }
            }
            if whole {
                self.fragments.extend(later.iter().map(|&b| (i, b)));
                self.fragments_made += 1 + later.len() as u64;
            } else {
                // Not reached: the input stage refuses a frame shorter than its header
                // says, every fragment is shorter than the packet its buffer held, and
                // the buffers were taken for these very pieces.
                pool.free(later);
                fates[i] = Fate::Drop(Dropped::NoBufferToFragment);
            }
        }
    }
}
