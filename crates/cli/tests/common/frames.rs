//! Frames the kernel sent, made comparable with fibre's: what is the kernel's own doing
//! left out, what two correct routers may differ in set to zero.

use super::fold;

/// Whether a frame the kernel sent is its own doing rather than forwarding's or an
/// error's: neighbour discovery, router solicitations, multicast listener reports.
pub fn kernels_own(f: &[u8]) -> bool {
    let ethertype = u16::from_be_bytes([f[12], f[13]]);
    if f[0] & 1 == 1 || (ethertype != 0x0800 && ethertype != 0x86dd) {
        return true;
    }
    ethertype == 0x86dd && f[20] == 58 && (130..=143).contains(&f[54])
}

/// A frame with what may differ between two correct routers set to zero: an ICMP error's
/// IP identification and header checksum, an ICMPv6 error's flow label.
pub fn normal(mut f: Vec<u8>) -> Vec<u8> {
    match u16::from_be_bytes([f[12], f[13]]) {
        // A TCP reset the kernel made leaves its checksum for the device to finish
        // (`CHECKSUM_PARTIAL`); a veth hands it on unfinished: finished here.
        0x0800 if f[23] == 6 && f.len() >= 54 && f[47] & 0x04 != 0 => {
            let ihl = usize::from(f[14] & 0xf) * 4;
            let tcp = 14 + ihl;
            let len = u16::from_be_bytes([f[16], f[17]]) as usize - ihl;
            f[tcp + 16..tcp + 18].fill(0);
            let mut pseudo = f[26..34].to_vec();
            pseudo.extend_from_slice(&[0, 6]);
            pseudo.extend_from_slice(&(len as u16).to_be_bytes());
            pseudo.extend_from_slice(&f[tcp..tcp + len]);
            let sum = !fold(&pseudo);
            f[tcp + 16..tcp + 18].copy_from_slice(&sum.to_be_bytes());
        }
        0x0800 if f[23] == 1 && matches!(f[34], 3 | 11) => {
            f[18..20].fill(0);
            f[24..26].fill(0);
        }
        0x86dd if f[20] == 58 && f[54] < 128 => {
            f[15] &= 0xf0;
            f[16..18].fill(0);
        }
        _ => {}
    }
    f
}
