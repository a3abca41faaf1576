//! The only unsafe code of fibre-bench: the calls into DPDK (through `shim.c` for the
//! environment and the tables, directly for lookups), each wrapped in a safe function
//! whose arguments make the call sound. Built only with `cfg(fibre_dpdk)`.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr, CString};
use std::ptr::NonNull;
use std::sync::OnceLock;

extern "C" {
    fn fibre_dpdk_init(mem_mb: c_uint, why: *mut c_char, why_len: usize) -> c_int;
    fn fibre_dpdk_heap_bytes() -> c_ulonglong;
    fn fibre_dpdk_fib4_create(
        name: *const c_char,
        max_routes: c_int,
        num_tbl8: c_uint,
        default_nh: c_ulonglong,
        vector: *mut c_int,
        why: *mut c_char,
        why_len: usize,
    ) -> *mut c_void;
    fn fibre_dpdk_fib4_add(fib: *mut c_void, ip: c_uint, depth: u8, nh: c_ulonglong) -> c_int;
    fn fibre_dpdk_fib4_free(fib: *mut c_void);
    fn fibre_dpdk_fib6_create(
        name: *const c_char,
        max_routes: c_int,
        num_tbl8: c_uint,
        default_nh: c_ulonglong,
        vector: *mut c_int,
        why: *mut c_char,
        why_len: usize,
    ) -> *mut c_void;
    fn fibre_dpdk_fib6_add(
        fib: *mut c_void,
        ip: *const [u8; 16],
        depth: u8,
        nh: c_ulonglong,
    ) -> c_int;
    fn fibre_dpdk_fib6_free(fib: *mut c_void);
    // DPDK's own lookups (`rte_fib.h`, `rte_fib6.h`); the addresses are only read.
    fn rte_fib_lookup_bulk(
        fib: *mut c_void,
        ips: *const u32,
        next_hops: *mut u64,
        n: c_int,
    ) -> c_int;
    fn rte_fib6_lookup_bulk(
        fib: *mut c_void,
        ips: *const [u8; 16],
        next_hops: *mut u64,
        n: c_int,
    ) -> c_int;
}

/// Room for a reason from the shim.
const WHY_LEN: usize = 512;

fn why_text(buf: &[u8]) -> String {
    CStr::from_bytes_until_nul(buf)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "no reason given".into())
}

/// Starts DPDK's environment once per process (`mem_mb` MiB of ordinary memory, no
/// hugepages, no devices); later calls return the first one's result.
pub fn init(mem_mb: u32) -> Result<(), String> {
    static INIT: OnceLock<Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        let mut why = [0u8; WHY_LEN];
        // SAFETY: `why` is writable for `WHY_LEN` bytes, which the shim writes at most
        // (NUL included); the OnceLock makes this the process's only rte_eal_init call.
        let r = unsafe { fibre_dpdk_init(mem_mb, why.as_mut_ptr().cast(), WHY_LEN) };
        if r == 0 {
            Ok(())
        } else {
            Err(why_text(&why))
        }
    })
    .clone()
}

/// Bytes allocated from DPDK's heaps (after [`init`] succeeded).
pub fn heap_bytes() -> u64 {
    // SAFETY: reads the heaps' statistics, which the environment (started, as every
    // caller has [`init`]'s success) keeps under its own lock.
    unsafe { fibre_dpdk_heap_bytes() }
}

/// Which table a [`Fib`] is: `rte_fib` (IPv4, DIR-24-8) or `rte_fib6` (IPv6, trie).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `rte_fib`, DIR-24-8.
    V4,
    /// `rte_fib6`, trie.
    V6,
}

/// One of DPDK's FIBs with 4-byte next hops, freed when dropped.
pub struct Fib {
    ptr: NonNull<c_void>,
    family: Family,
    /// Whether the lookups are DPDK's AVX-512 ones.
    pub vector: bool,
}

// SAFETY: DPDK's FIBs are plain memory of DPDK's heap, usable from any thread; `add`
// takes `&mut self`, so no lookup runs while the tables change, and concurrent lookups
// only read them (DPDK's bulk lookups keep no state between calls).
unsafe impl Send for Fib {}
// SAFETY: as above: through `&Fib` only lookups run, and they only read.
unsafe impl Sync for Fib {}

impl Fib {
    /// A FIB of `family` for `max_routes` routes with `num_tbl8` second-level groups,
    /// answering `default_nh` where no route matches (after [`init`] succeeded).
    pub fn create(
        family: Family,
        name: &str,
        max_routes: u32,
        num_tbl8: u32,
        default_nh: u32,
    ) -> Result<Fib, String> {
        let name = CString::new(name).map_err(|e| e.to_string())?;
        let max_routes = c_int::try_from(max_routes).map_err(|e| e.to_string())?;
        let mut vector: c_int = 0;
        let mut why = [0u8; WHY_LEN];
        let create = match family {
            Family::V4 => fibre_dpdk_fib4_create,
            Family::V6 => fibre_dpdk_fib6_create,
        };
        // SAFETY: `name` is a NUL-terminated string DPDK copies; `vector` and `why` are
        // writable (`why` for `WHY_LEN` bytes); the environment is started (the callers
        // hold [`init`]'s success).
        let ptr = unsafe {
            create(
                name.as_ptr(),
                max_routes,
                num_tbl8,
                u64::from(default_nh),
                &mut vector,
                why.as_mut_ptr().cast(),
                WHY_LEN,
            )
        };
        match NonNull::new(ptr) {
            Some(ptr) => Ok(Fib {
                ptr,
                family,
                vector: vector != 0,
            }),
            None => Err(why_text(&why)),
        }
    }

    /// Adds the route `addr/len` (IPv4 in the low 32 bits) with next hop `nh`; the
    /// error is DPDK's negative errno (`-ENOSPC`: no second-level group left).
    pub fn add(&mut self, addr: u128, len: u8, nh: u32) -> Result<(), i32> {
        let r = match self.family {
            // SAFETY: `self.ptr` is a live rte_fib (made by `create`, freed only by
            // `drop`), and `&mut self` keeps lookups out while it changes.
            Family::V4 => unsafe {
                fibre_dpdk_fib4_add(self.ptr.as_ptr(), addr as u32, len, u64::from(nh))
            },
            Family::V6 => {
                let ip = addr.to_be_bytes();
                // SAFETY: as above, for a live rte_fib6; `ip` is 16 readable bytes.
                unsafe { fibre_dpdk_fib6_add(self.ptr.as_ptr(), &ip, len, u64::from(nh)) }
            }
        };
        if r == 0 {
            Ok(())
        } else {
            Err(r)
        }
    }

    /// DPDK's bulk lookup of IPv4 addresses (host order) into `out` (one a key).
    ///
    /// # Panics
    ///
    /// If this is not an IPv4 FIB, `ips` and `out` differ in length, or the length
    /// does not fit a C `int`.
    #[inline]
    pub fn lookup4(&self, ips: &[u32], out: &mut [u64]) {
        assert!(
            self.family == Family::V4 && ips.len() == out.len() && ips.len() <= c_int::MAX as usize
        );
        // SAFETY: a live rte_fib; `ips` holds `n` addresses, which DPDK only reads, and
        // `out` room for `n` next hops; `n` fits a C int (asserted).
        unsafe {
            rte_fib_lookup_bulk(
                self.ptr.as_ptr(),
                ips.as_ptr(),
                out.as_mut_ptr(),
                ips.len() as c_int,
            )
        };
    }

    /// DPDK's bulk lookup of IPv6 addresses (network order) into `out`.
    ///
    /// # Panics
    ///
    /// If this is not an IPv6 FIB, `ips` and `out` differ in length, or the length
    /// does not fit a C `int`.
    #[inline]
    pub fn lookup6(&self, ips: &[[u8; 16]], out: &mut [u64]) {
        assert!(
            self.family == Family::V6 && ips.len() == out.len() && ips.len() <= c_int::MAX as usize
        );
        // SAFETY: as in `lookup4`, for a live rte_fib6 and 16-byte addresses.
        unsafe {
            rte_fib6_lookup_bulk(
                self.ptr.as_ptr(),
                ips.as_ptr(),
                out.as_mut_ptr(),
                ips.len() as c_int,
            )
        };
    }
}

impl Drop for Fib {
    fn drop(&mut self) {
        match self.family {
            // SAFETY: a live rte_fib, freed once: nothing can use it after `drop`.
            Family::V4 => unsafe { fibre_dpdk_fib4_free(self.ptr.as_ptr()) },
            // SAFETY: as above, for an rte_fib6.
            Family::V6 => unsafe { fibre_dpdk_fib6_free(self.ptr.as_ptr()) },
        }
    }
}
