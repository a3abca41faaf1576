//! Fuzzes the packet path's input stage: any frame is sorted (routed, handed to the
//! kernel, or dropped with a reason) without a panic; a frame sorted to be routed holds
//! the header it was read from, and taking its TTL or hop limit down keeps it whole.
#![no_main]

use fibre_headers::checksum;
use fibre_dataplane::input::{classify, Input, ETHERNET_LEN};
use fibre_dataplane::rewrite::{decrement_hop_limit, decrement_ttl};
use libfuzzer_sys::fuzz_target;

const OURS: [u8; 6] = [0x02, 0, 0, 0, 0, 1];

fuzz_target!(|data: &[u8]| {
    let mut frame = data.to_vec();
    // Most frames addressed to this link, so that the IP checks are reached.
    if frame.len() >= 6 && frame[0] & 1 == 0 {
        frame[..6].copy_from_slice(&OURS);
    }
    match classify(&frame, OURS) {
        Input::V4(p) => {
            let header = &frame[ETHERNET_LEN..ETHERNET_LEN + 20];
            assert!(checksum::holds(header));
            assert!(p.len as usize + ETHERNET_LEN <= frame.len());
            if p.ttl > 0 {
                assert!(decrement_ttl(&mut frame));
                assert!(checksum::holds(&frame[ETHERNET_LEN..ETHERNET_LEN + 20]));
                assert_eq!(frame[ETHERNET_LEN + 8], p.ttl - 1);
            }
        }
        Input::V6(p) => {
            assert!(p.len as usize + 40 + ETHERNET_LEN <= frame.len());
            assert_eq!(decrement_hop_limit(&mut frame), p.hop_limit > 0);
        }
        Input::Kernel(_) | Input::Drop(_) => {}
    }
});
