//! The Internet checksum (RFC 1071), whole and updated in place of a changed word
//! (RFC 1624), as IPv4 headers carry it.

/// `a + b` in ones' complement.
#[inline]
pub fn add(a: u16, b: u16) -> u16 {
    let s = a as u32 + b as u32;
    ((s & 0xffff) + (s >> 16)) as u16
}

/// The ones' complement sum of `data` read as big-endian 16-bit words (an odd last byte
/// padded with zero). Summed four bytes at a time into a wide accumulator and folded at
/// the end, which ones' complement arithmetic allows (RFC 1071, section 2): an IPv4
/// header is five additions.
#[inline]
pub fn sum(data: &[u8]) -> u16 {
    let mut s: u64 = 0;
    let mut quads = data.chunks_exact(4);
    for q in &mut quads {
        s += u32::from_be_bytes([q[0], q[1], q[2], q[3]]) as u64;
    }
    let mut words = quads.remainder().chunks_exact(2);
    for w in &mut words {
        s += u16::from_be_bytes([w[0], w[1]]) as u64;
    }
    if let [last] = words.remainder() {
        s += (*last as u64) << 8;
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// The checksum of `data` (its checksum field zero): the complement of its sum.
pub fn checksum(data: &[u8]) -> u16 {
    !sum(data)
}

/// Whether `data`, its checksum field included, is intact: its sum is all ones.
#[inline]
pub fn holds(data: &[u8]) -> bool {
    sum(data) == 0xffff
}

/// The checksum `old` once a 16-bit word of the data went from `from` to `to`, without
/// summing the data again (RFC 1624, equation 3: `HC' = ~(~HC + ~m + m')`). Exact for
/// data that is not all zero once changed, as an IP header never is (its version).
#[inline]
pub fn update(old: u16, from: u16, to: u16) -> u16 {
    !add(add(!old, !from), to)
}

/// The sum of the pseudo-header TCP, UDP and ICMPv6 checksums cover (RFC 768, RFC 793,
/// RFC 8200 section 8.1): the source and destination addresses (4 or 16 bytes each),
/// the protocol and the transport's length.
#[inline]
pub fn pseudo_header_sum(src: &[u8], dst: &[u8], protocol: u8, len: u32) -> u16 {
    let mut s = add(sum(src), sum(dst));
    s = add(s, (len >> 16) as u16);
    s = add(s, len as u16);
    add(s, u16::from(protocol))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn the_rfc_1071_example_sums_as_it_says() {
        // RFC 1071, section 3: the sum of these bytes is ddf2.
        assert_eq!(
            sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0xddf2
        );
        // An odd length pads with zero.
        assert_eq!(sum(&[0x01]), 0x0100);
        assert_eq!(sum(&[]), 0);
    }

    /// Four bytes at a time sums as two at a time does, folded, for every length and
    /// content (the reference: RFC 1071's loop over 16-bit words).
    #[test]
    fn the_wide_sum_agrees_with_summing_words() {
        let reference = |data: &[u8]| {
            let mut s: u32 = 0;
            for w in data.chunks(2) {
                let word = u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]);
                s += word as u32;
                s = (s & 0xffff) + (s >> 16);
            }
            s as u16
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for round in 0..20_000 {
            let len = rng.gen_range(0..100);
            let data: Vec<u8> = match round % 3 {
                0 => vec![0xff; len],
                _ => (0..len).map(|_| rng.gen()).collect(),
            };
            assert_eq!(sum(&data), reference(&data), "{data:02x?}");
        }
    }

    /// An incremental update gives what summing everything again gives, for random data
    /// and random changes of one word, edge values included.
    #[test]
    fn updates_agree_with_a_whole_sum() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for round in 0..20_000 {
            let mut data: Vec<u8> = (0..20).map(|_| rng.gen()).collect();
            if round % 7 == 0 {
                // Nearly all zero, as the edge of a header's checksum: the version only.
                data.iter_mut().for_each(|b| *b = 0);
                data[0] = 0x45;
            }
            data[10] = 0;
            data[11] = 0;
            let c = checksum(&data);
            data[10..12].copy_from_slice(&c.to_be_bytes());
            assert!(holds(&data));
            let at = 2 * rng.gen_range(0..10usize);
            if at == 10 || at == 0 {
                continue;
            }
            let from = u16::from_be_bytes([data[at], data[at + 1]]);
            let to: u16 = match round % 5 {
                0 => 0,
                1 => 0xffff,
                _ => rng.gen(),
            };
            data[at..at + 2].copy_from_slice(&to.to_be_bytes());
            let updated = update(c, from, to);
            data[10..12].copy_from_slice(&updated.to_be_bytes());
            assert!(holds(&data), "round {round}: {data:02x?}");
        }
    }
}
