//! Python keys read as prefixes: every form pytricia takes, refused with a message that
//! names the key when it is bad.
//!
//! A key is a prefix or an address (an address is its host route, `/32` or `/128`):
//!
//! - `str`: `"10.0.0.0/8"`, `"2001:db8::/32"`, or a bare address; the family is told by
//!   a `:` (IPv6) or a `.` (IPv4), as pytricia tells it;
//! - `int`: an IPv4 address, `0` to `2**32 - 1` (pytricia's meaning: an `int` is never
//!   IPv6);
//! - `bytes` of 4 or 16 bytes: a packed address, network order;
//! - a tuple `(bytes, length)`: a packed address and a prefix length (pytricia's raw
//!   form);
//! - `ipaddress` objects: `IPv4Network` and `IPv6Network` are prefixes, `IPv4Address`
//!   and `IPv6Address` (and the interfaces, which are addresses) host routes.
//!
//! Where pytricia is lenient, fibre is strict, so that a typo does not quietly become
//! another route: a length past the family's width, or one that is not a number, is a
//! `ValueError`, where pytricia takes the whole width or `/0`. Host bits are cleared
//! (`10.1.2.3/8` is `10.0.0.0/8`, as it is to a router), where pytricia keeps the key as
//! first given.

use fibre_lpm::{quote, Prefix, PrefixError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyInt, PyString, PyTuple, PyType};

/// A key read: a prefix of one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Parsed {
    /// IPv4.
    V4(Prefix<u32>),
    /// IPv6.
    V6(Prefix<u128>),
}

impl Parsed {
    /// True for a host route (`/32` or `/128`): an address.
    pub fn is_host(&self) -> bool {
        match self {
            Parsed::V4(p) => p.len() == 32,
            Parsed::V6(p) => p.len() == 128,
        }
    }
}

/// The `ipaddress` classes keys may be, imported once.
struct IpClasses {
    networks: Py<PyTuple>,
    addresses: Py<PyTuple>,
}

static IP_CLASSES: PyOnceLock<IpClasses> = PyOnceLock::new();

fn ip_classes(py: Python<'_>) -> PyResult<&IpClasses> {
    IP_CLASSES.get_or_try_init(py, || {
        let m = py.import("ipaddress")?;
        let class = |name: &str| -> PyResult<Bound<'_, PyType>> {
            Ok(m.getattr(name)?.cast_into::<PyType>()?)
        };
        Ok(IpClasses {
            networks: PyTuple::new(py, [class("IPv4Network")?, class("IPv6Network")?])?.unbind(),
            addresses: PyTuple::new(py, [class("IPv4Address")?, class("IPv6Address")?])?.unbind(),
        })
    })
}

/// A `ValueError` saying that `key` is not a prefix, and why.
fn bad_key(key: &Bound<'_, PyAny>, why: impl std::fmt::Display) -> PyErr {
    let shown = key
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "the key".to_string());
    PyValueError::new_err(format!("{}: {why}", quote_repr(&shown)))
}

/// A Python repr cut to a readable length.
fn quote_repr(repr: &str) -> String {
    match repr.char_indices().nth(fibre_lpm::QUOTE_CHARS) {
        None => repr.to_string(),
        Some((cut, _)) => format!("{}... ({} characters)", &repr[..cut], repr.chars().count()),
    }
}

/// Reads a text prefix or address; the family from its `:` or `.`.
pub fn parse_str(text: &str) -> Result<Parsed, String> {
    let addr = text.split('/').next().unwrap_or("");
    let parsed = if addr.contains(':') {
        text.parse::<Prefix<u128>>().map(Parsed::V6)
    } else if addr.contains('.') {
        text.parse::<Prefix<u32>>().map(Parsed::V4)
    } else {
        return Err(format!(
            "{} is not an IPv4 or IPv6 prefix or address",
            quote(text)
        ));
    };
    parsed.map_err(|e: PrefixError| format!("{} is not a valid prefix: {e}", quote(text)))
}

/// A packed address (4 or 16 bytes, network order) with a prefix length.
fn from_packed(bytes: &[u8], len: Option<u64>) -> Result<Parsed, String> {
    let too_long = |len: u64, max: u8| format!("prefix length {len} is longer than {max}");
    match bytes.len() {
        4 => {
            let addr = u32::from_be_bytes(bytes.try_into().expect("4 bytes"));
            let len = len.unwrap_or(32);
            let len = u8::try_from(len)
                .ok()
                .filter(|l| *l <= 32)
                .ok_or_else(|| too_long(len, 32))?;
            Ok(Parsed::V4(Prefix::new_clamped(addr, len)))
        }
        16 => {
            let addr = u128::from_be_bytes(bytes.try_into().expect("16 bytes"));
            let len = len.unwrap_or(128);
            let len = u8::try_from(len)
                .ok()
                .filter(|l| *l <= 128)
                .ok_or_else(|| too_long(len, 128))?;
            Ok(Parsed::V6(Prefix::new_clamped(addr, len)))
        }
        n => Err(format!(
            "a packed address has 4 (IPv4) or 16 (IPv6) bytes, not {n}"
        )),
    }
}

/// Reads any key (see the module documentation); a `ValueError` naming it if it is bad.
pub fn parse_key(key: &Bound<'_, PyAny>) -> PyResult<Parsed> {
    if let Ok(s) = key.cast::<PyString>() {
        // The stable ABI of 3.9 has no borrowed view of a str's UTF-8: encode it, and
        // read the bytes in place rather than copy them again into a `String`.
        let bytes = s.encode_utf8()?;
        let text = std::str::from_utf8(bytes.as_bytes())
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        return parse_str(text).map_err(PyValueError::new_err);
    }
    if let Ok(i) = key.cast::<PyInt>() {
        return match i.extract::<u32>() {
            Ok(a) => Ok(Parsed::V4(Prefix::host(a))),
            Err(_) => Err(bad_key(
                key,
                "an int key is an IPv4 address, from 0 to 4294967295",
            )),
        };
    }
    if let Ok(b) = key.cast::<PyBytes>() {
        return from_packed(b.as_bytes(), None).map_err(|e| bad_key(key, e));
    }
    if let Ok(t) = key.cast::<PyTuple>() {
        let pair = (t.len() == 2)
            .then(|| t.extract::<(Bound<'_, PyBytes>, u64)>().ok())
            .flatten();
        let Some((bytes, len)) = pair else {
            return Err(bad_key(
                key,
                "a tuple key is (packed address bytes, prefix length)",
            ));
        };
        return from_packed(bytes.as_bytes(), Some(len)).map_err(|e| bad_key(key, e));
    }
    let py = key.py();
    let classes = ip_classes(py)?;
    if key.is_instance(classes.networks.bind(py).as_any())? {
        let packed = key.getattr("network_address")?.getattr("packed")?;
        let len: u64 = key.getattr("prefixlen")?.extract()?;
        let packed = packed.cast::<PyBytes>()?;
        return from_packed(packed.as_bytes(), Some(len)).map_err(|e| bad_key(key, e));
    }
    if key.is_instance(classes.addresses.bind(py).as_any())? {
        let packed = key.getattr("packed")?;
        let packed = packed.cast::<PyBytes>()?;
        return from_packed(packed.as_bytes(), None).map_err(|e| bad_key(key, e));
    }
    let type_name = key
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_string());
    Err(bad_key(
        key,
        format!(
            "a key is a str, an int, 4 or 16 bytes, a (bytes, length) tuple or an \
             ipaddress address or network, not {type_name}"
        ),
    ))
}

/// Reads a key and overrides its length with `len` (pytricia's
/// `insert(address, length, value)`).
pub fn parse_key_with_len(key: &Bound<'_, PyAny>, len: u64) -> PyResult<Parsed> {
    let parsed = parse_key(key)?;
    let (max, addr) = match parsed {
        Parsed::V4(p) => (32u64, p.addr() as u128),
        Parsed::V6(p) => (128u64, p.addr()),
    };
    if len > max {
        return Err(bad_key(
            key,
            format!("prefix length {len} is longer than {max}"),
        ));
    }
    Ok(match parsed {
        Parsed::V4(_) => Parsed::V4(Prefix::new_clamped(addr as u32, len as u8)),
        Parsed::V6(_) => Parsed::V6(Prefix::new_clamped(addr, len as u8)),
    })
}
