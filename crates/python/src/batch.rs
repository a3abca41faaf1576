//! `lookup_many`'s side of the work: addresses gathered from a list or a NumPy array into
//! one vector per family, then looked up in batches with the interpreter released.
//!
//! The forms an array may take, chosen so that each maps onto the LPM keys with one pass
//! and no Python objects:
//!
//! - IPv4: a 1-D array of `uint32` (or of another integer type, each value checked to be
//!   an address), the addresses as integers, as `int(IPv4Address)` gives them; or an
//!   `(n, 4)` array of `uint8`, packed addresses in network order;
//! - IPv6: an `(n, 2)` array of `uint64`, each row the address's high and low 64 bits
//!   (`int(a) >> 64`, `int(a) & (2**64 - 1)`); or an `(n, 16)` array of `uint8`, packed
//!   addresses in network order (`IPv6Address.packed`).
//!
//! Anything else iterable is read key by key ([`crate::keys`]), both families mixed;
//! a key that is a prefix shorter than its family's width is answered as `get` answers
//! it, one at a time, before the batch.
//!
//! The keys are copied out of the array before the interpreter is released: another
//! thread may change the array meanwhile, and a copy costs a small part of a lookup.

use crate::keys::{parse_key, Parsed};
use fibre_lpm::{Key, LpmReader};
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The addresses of one call, by family.
#[derive(Default)]
pub struct Queries {
    /// How many addresses were given.
    pub n: usize,
    /// IPv4 addresses.
    pub v4: Vec<u32>,
    /// Their positions in the input, or `None` if they are all of it, in order.
    pub v4_at: Option<Vec<usize>>,
    /// IPv6 addresses.
    pub v6: Vec<u128>,
    /// Their positions in the input, or `None` if they are all of it, in order.
    pub v6_at: Option<Vec<usize>>,
    /// Prefix keys: position and prefix, answered one at a time.
    pub prefixes: Vec<(usize, Parsed)>,
}

/// An error for an array of a form `lookup_many` does not read.
fn bad_array(what: String) -> PyErr {
    PyValueError::new_err(format!(
        "lookup_many reads a 1-D uint32 array (IPv4), an (n, 2) uint64 array (IPv6 high \
         and low halves), an (n, 4) or (n, 16) uint8 array (packed addresses), or any \
         iterable of keys; not {what}"
    ))
}

/// IPv4 keys from a 1-D integer array of any type, each checked.
fn ipv4_from_ints<T>(a: &Bound<'_, PyArray1<T>>) -> PyResult<Vec<u32>>
where
    T: numpy::Element + Copy + TryInto<u32> + std::fmt::Display,
{
    let ro = a.readonly();
    ro.as_array()
        .iter()
        .map(|&v| {
            v.try_into().map_err(|_| {
                PyValueError::new_err(format!(
                    "{v} is not an IPv4 address (an integer from 0 to 4294967295)"
                ))
            })
        })
        .collect()
}

/// Queries from a NumPy array, if `obj` is one of the forms above; `None` if it is a
/// NumPy array of another kind, to be read key by key.
fn from_numpy(obj: &Bound<'_, PyAny>) -> PyResult<Option<Queries>> {
    let v4 = |v4: Vec<u32>| Queries {
        n: v4.len(),
        v4,
        ..Queries::default()
    };
    let v6 = |v6: Vec<u128>| Queries {
        n: v6.len(),
        v6,
        ..Queries::default()
    };
    if let Ok(a) = obj.cast::<PyArray1<u32>>() {
        let ro = a.readonly();
        let keys = match ro.as_slice() {
            Ok(s) => s.to_vec(),
            Err(_) => ro.as_array().iter().copied().collect(),
        };
        return Ok(Some(v4(keys)));
    }
    if let Ok(a) = obj.cast::<PyArray1<i64>>() {
        return Ok(Some(v4(ipv4_from_ints(a)?)));
    }
    if let Ok(a) = obj.cast::<PyArray1<u64>>() {
        return Ok(Some(v4(ipv4_from_ints(a)?)));
    }
    if let Ok(a) = obj.cast::<PyArray1<i32>>() {
        return Ok(Some(v4(ipv4_from_ints(a)?)));
    }
    if let Ok(a) = obj.cast::<PyArray2<u64>>() {
        if a.shape()[1] != 2 {
            return Err(bad_array(format!(
                "a uint64 array of shape {:?}",
                a.shape()
            )));
        }
        let ro = a.readonly();
        let keys = ro
            .as_array()
            .rows()
            .into_iter()
            .map(|r| (u128::from(r[0]) << 64) | u128::from(r[1]))
            .collect();
        return Ok(Some(v6(keys)));
    }
    if let Ok(a) = obj.cast::<PyArray2<u8>>() {
        let ro = a.readonly();
        let view = ro.as_array();
        return match a.shape()[1] {
            4 => Ok(Some(v4(view
                .rows()
                .into_iter()
                .map(|r| u32::from_be_bytes([r[0], r[1], r[2], r[3]]))
                .collect()))),
            16 => Ok(Some(v6(view
                .rows()
                .into_iter()
                .map(|r| {
                    let mut b = [0u8; 16];
                    b.iter_mut().zip(r.iter()).for_each(|(d, s)| *d = *s);
                    u128::from_be_bytes(b)
                })
                .collect()))),
            _ => Err(bad_array(format!("a uint8 array of shape {:?}", a.shape()))),
        };
    }
    Ok(None)
}

/// True if `obj`'s type comes from NumPy (checked before asking NumPy anything, so that
/// lists work where NumPy is not installed).
fn is_numpy(obj: &Bound<'_, PyAny>) -> bool {
    obj.get_type()
        .module()
        .is_ok_and(|m| m.to_cow().is_ok_and(|m| m == "numpy"))
}

/// The addresses of `obj`: an array of a form above, or an iterable of keys.
pub fn gather(obj: &Bound<'_, PyAny>) -> PyResult<Queries> {
    if is_numpy(obj) {
        if let Some(q) = from_numpy(obj)? {
            return Ok(q);
        }
    }
    let mut q = Queries::default();
    let mut v4_at = Vec::new();
    let mut v6_at = Vec::new();
    for (i, key) in obj.try_iter()?.enumerate() {
        let parsed = parse_key(&key?)?;
        match parsed {
            Parsed::V4(p) if parsed.is_host() => {
                q.v4.push(p.addr());
                v4_at.push(i);
            }
            Parsed::V6(p) if parsed.is_host() => {
                q.v6.push(p.addr());
                v6_at.push(i);
            }
            _ => q.prefixes.push((i, parsed)),
        }
        q.n = i + 1;
    }
    if q.v4.len() < q.n {
        q.v4_at = Some(v4_at);
    }
    if q.v6.len() < q.n {
        q.v6_at = Some(v6_at);
    }
    Ok(q)
}

/// Keys looked up per pass: a reused buffer of answers this long stays in the cache,
/// where one as long as the input would cost a page fault every 512 keys.
const CHUNK: usize = 1024;

/// Looks up `keys` in `reader`'s current version, batched, writing each answer's id
/// (or -1) to `out` at the key's position.
fn answer_family<K: Key>(reader: &LpmReader<K>, keys: &[K], at: Option<&[usize]>, out: &mut [i64]) {
    if keys.is_empty() {
        return;
    }
    let guard = reader
        .read()
        .expect("the table's writer lives as long as it");
    let mut found = [None; CHUNK];
    let id = |f: &Option<u32>| f.map_or(-1, i64::from);
    for (n, chunk) in keys.chunks(CHUNK).enumerate() {
        let found = &mut found[..chunk.len()];
        guard.lookup_batch(chunk, found);
        let start = n * CHUNK;
        match at {
            None => out[start..start + chunk.len()]
                .iter_mut()
                .zip(found.iter())
                .for_each(|(o, f)| *o = id(f)),
            Some(at) => at[start..start + chunk.len()]
                .iter()
                .zip(found.iter())
                .for_each(|(&i, f)| out[i] = id(f)),
        }
    }
}

/// Answers every address of `q` (its prefixes already answered in `out`), by family,
/// in batches. Runs with the interpreter released.
pub fn answer(q: &Queries, v4: &LpmReader<u32>, v6: &LpmReader<u128>, out: &mut [i64]) {
    answer_family(v4, &q.v4, q.v4_at.as_deref(), out);
    answer_family(v6, &q.v6, q.v6_at.as_deref(), out);
}
