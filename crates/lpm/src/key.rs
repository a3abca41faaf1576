//! Keys: the unsigned integers that IPv4 (`u32`) and IPv6 (`u128`) addresses are.
//!
//! The structures are written once, against the [`Key`] trait: the address family's
//! width and address type are public; what the structures need besides (masking to a prefix
//! length, reading or writing a run of bits counted from the most significant end) is in
//! a trait of the crate's own, `Bits`.

use std::fmt::{Debug, Display};
use std::hash::Hash;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An address family's key: the address as an unsigned integer, most significant bit first.
///
/// Implemented by `u32` (IPv4) and `u128` (IPv6) only.
pub trait Key:
    Copy + Eq + Ord + Hash + Debug + Default + Send + Sync + 'static + bits::Bits
{
    /// The standard library's address type of this family.
    type Addr: Copy + Eq + Debug + Display + FromStr + Into<Self> + From<Self>;
    /// Width of the key in bits (32 or 128).
    const BITS: u8;
    /// IP version (4 or 6), for reports.
    const FAMILY: u8;
    /// The key from the low `BITS` bits of a `u128` (used by generators and tests).
    fn from_u128(v: u128) -> Self;
    /// The key widened to a `u128`.
    fn to_u128(self) -> u128;
}

pub(crate) mod bits {
    /// What the structures need of a key and users do not: runs of bits counted from the
    /// most significant end. Bits beyond the key's width read as zero, which lets the
    /// trie's last level run past the end of the key. (A trait of its own, out of reach
    /// outside the crate, so that only `u32` and `u128` are keys.)
    pub trait Bits: Sized {
        /// `len` bits starting `offset` bits below the most significant bit, as an
        /// integer. Bits past the end of the key read as zero. Requires `offset < BITS`,
        /// `1 <= len <= 24`.
        fn bits(self, offset: u32, len: u32) -> u32;
        /// The `n` most significant bits (`1 <= n <= 24`), as an integer.
        fn top(self, n: u32) -> u32;
        /// The 64 bits starting `offset < BITS` bits below the most significant bit, bits
        /// past the end of the key reading as zero. The trie's lookups walk a window of
        /// the key, not the key: one 64-bit shift per level for either family.
        fn window(self, offset: u32) -> u64;
        /// Six-bit levels a window serves before it runs out of key bits and must be
        /// taken again further on; `u32::MAX` when it holds all of the key there is.
        const WINDOW_LEVELS: u32;
        /// The key with all but its `len` most significant bits cleared (`len <= BITS`).
        fn mask(self, len: u8) -> Self;
        /// The key with `value` written into the `len` bits starting at `offset`
        /// (`offset + len <= BITS`); those bits must be zero before.
        fn deposit(self, offset: u32, len: u32, value: u32) -> Self;
        /// A prefix of this family packed in bytes (the address's, most significant
        /// first, then the length), aligned to one: ordered as `(address, length)`, and
        /// a third of the size of a `Prefix<u128>`, which a `u128` aligns to 16 bytes.
        type Packed: Copy + Ord + std::fmt::Debug + Send + Sync;
        /// The prefix of address `self` (its host bits clear) and length `len`, packed.
        fn pack(self, len: u8) -> Self::Packed;
        /// The address and length of a packed prefix.
        fn unpack(packed: Self::Packed) -> (Self, u8);
    }
}

use bits::Bits;

impl Key for u32 {
    type Addr = Ipv4Addr;
    const BITS: u8 = 32;
    const FAMILY: u8 = 4;
    fn from_u128(v: u128) -> Self {
        v as u32
    }
    fn to_u128(self) -> u128 {
        u128::from(self)
    }
}

impl Bits for u32 {
    #[inline(always)]
    fn top(self, n: u32) -> u32 {
        self >> (32 - n)
    }
    #[inline(always)]
    fn window(self, offset: u32) -> u64 {
        (u64::from(self) << 32) << offset
    }
    const WINDOW_LEVELS: u32 = u32::MAX;
    type Packed = [u8; 5];
    #[inline]
    fn pack(self, len: u8) -> [u8; 5] {
        let a = self.to_be_bytes();
        [a[0], a[1], a[2], a[3], len]
    }
    #[inline]
    fn unpack(p: [u8; 5]) -> (u32, u8) {
        (u32::from_be_bytes([p[0], p[1], p[2], p[3]]), p[4])
    }
    #[inline(always)]
    fn bits(self, offset: u32, len: u32) -> u32 {
        let wide = (self as u64) << 32;
        ((wide << offset) >> (64 - len)) as u32
    }
    #[inline]
    fn mask(self, len: u8) -> Self {
        if len == 0 {
            0
        } else {
            self & (u32::MAX << (32 - u32::from(len)))
        }
    }
    #[inline]
    fn deposit(self, offset: u32, len: u32, value: u32) -> Self {
        debug_assert!(offset + len <= 32);
        if len == 0 {
            return self;
        }
        self | (value << (32 - offset - len))
    }
}

impl Key for u128 {
    type Addr = Ipv6Addr;
    const BITS: u8 = 128;
    const FAMILY: u8 = 6;
    fn from_u128(v: u128) -> Self {
        v
    }
    fn to_u128(self) -> u128 {
        self
    }
}

impl Bits for u128 {
    #[inline(always)]
    fn top(self, n: u32) -> u32 {
        // Only the high half matters for n <= 24: a 64-bit shift instead of a 128-bit one.
        (((self >> 64) as u64) >> (64 - n)) as u32
    }
    #[inline(always)]
    fn window(self, offset: u32) -> u64 {
        ((self << offset) >> 64) as u64
    }
    const WINDOW_LEVELS: u32 = 10;
    type Packed = [u8; 17];
    #[inline]
    fn pack(self, len: u8) -> [u8; 17] {
        let mut p = [0; 17];
        p[..16].copy_from_slice(&self.to_be_bytes());
        p[16] = len;
        p
    }
    #[inline]
    fn unpack(p: [u8; 17]) -> (u128, u8) {
        let mut a = [0; 16];
        a.copy_from_slice(&p[..16]);
        (u128::from_be_bytes(a), p[16])
    }
    #[inline(always)]
    fn bits(self, offset: u32, len: u32) -> u32 {
        ((self << offset) >> (128 - len)) as u32
    }
    #[inline]
    fn mask(self, len: u8) -> Self {
        if len == 0 {
            0
        } else {
            self & (u128::MAX << (128 - u32::from(len)))
        }
    }
    #[inline]
    fn deposit(self, offset: u32, len: u32, value: u32) -> Self {
        debug_assert!(offset + len <= 128);
        if len == 0 {
            return self;
        }
        self | (u128::from(value) << (128 - offset - len))
    }
}

#[cfg(test)]
mod tests {
    use super::bits::Bits;

    #[test]
    fn bits_reads_from_the_top_and_pads_with_zeros() {
        let k: u32 = 0xC0A8_0102; // 192.168.1.2
        assert_eq!(k.bits(0, 8), 192);
        assert_eq!(k.bits(8, 8), 168);
        assert_eq!(k.bits(0, 18), 0xC0A8_0102 >> 14);
        assert_eq!(
            k.bits(30, 6),
            0b10_0000,
            "two real bits, four zero bits past the end"
        );
        let v6: u128 = 0x2001_0db8 << 96;
        assert_eq!(v6.bits(0, 16), 0x2001);
        assert_eq!(v6.bits(16, 16), 0x0db8);
        assert_eq!((u128::MAX).bits(124, 6), 0b11_1100);
        assert_eq!(v6.top(16), 0x2001);
        assert_eq!(v6.window(16) >> 58, 0x0db8 >> 10);
        assert_eq!(k.top(18), k.bits(0, 18));
        assert_eq!(k.window(18) >> 58, u64::from(k.bits(18, 6)));
    }

    #[test]
    fn windows_hold_the_next_levels_of_the_key() {
        let k: u32 = 0xC0A8_0102;
        assert_eq!(k.window(0), 0xC0A8_0102 << 32);
        assert_eq!(k.window(18) >> 58, u64::from(k.bits(18, 6)));
        assert_eq!(k.window(30) >> 58, 0b10_0000, "zeros past the end");
        let v6: u128 = (0x2001_0db8 << 96) | 0xABCD;
        assert_eq!(v6.window(0), 0x2001_0db8_0000_0000);
        assert_eq!(v6.window(112), 0xABCD << 48);
        for level in 0..u128::WINDOW_LEVELS {
            assert_eq!(
                (v6.window(18) << (6 * level)) >> 58,
                u64::from(v6.bits(18 + 6 * level, 6)),
                "level {level} of a window is the key's own bits"
            );
        }
    }

    #[test]
    fn mask_and_deposit_are_inverse() {
        assert_eq!(0xFFFF_FFFFu32.mask(0), 0);
        assert_eq!(0xFFFF_FFFFu32.mask(32), 0xFFFF_FFFF);
        assert_eq!(0xFFFF_FFFFu32.mask(9), 0xFF80_0000);
        assert_eq!(u128::MAX.mask(128), u128::MAX);
        assert_eq!(u128::MAX.mask(1), 1 << 127);
        let k = 0u32.deposit(18, 6, 0b101101);
        assert_eq!(k.bits(18, 6), 0b101101);
        assert_eq!(0u128.deposit(122, 6, 0x3F), 0x3F);
    }

    proptest::proptest! {
        /// Packed prefixes order as `(address, length)` and unpack to what was packed.
        #[test]
        fn packed_prefixes_order_as_prefixes(a: u128, b: u128, la in 0u8..=128, lb in 0u8..=128) {
            let (a4, b4) = (a as u32, b as u32);
            let (la4, lb4) = (la % 33, lb % 33);
            proptest::prop_assert_eq!(a.pack(la).cmp(&b.pack(lb)), (a, la).cmp(&(b, lb)));
            proptest::prop_assert_eq!(a4.pack(la4).cmp(&b4.pack(lb4)), (a4, la4).cmp(&(b4, lb4)));
            proptest::prop_assert_eq!(u128::unpack(a.pack(la)), (a, la));
            proptest::prop_assert_eq!(u32::unpack(a4.pack(la4)), (a4, la4));
            // Neighbours in order too (random pairs are seldom close).
            proptest::prop_assert!(a.pack(la) < a.pack(la + 1));
            proptest::prop_assert!(a == u128::MAX || a.pack(la) < (a + 1).pack(0));
        }
    }
}
