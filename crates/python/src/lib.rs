//! # fibre for Python: the `fibre` module
//!
//! fibre's longest-prefix-match tables ([`fibre_lpm`]) behind pytricia's interface, for
//! the many who annotate flows, logs and captures with prefixes in Python: `import
//! fibre` and `fibre.Table()` where there was `import pytricia` and
//! `pytricia.PyTricia()`. What pytricia lacks besides: `lookup_many` over a list or a
//! NumPy array, batched, with the interpreter released; tables built in bulk from pairs
//! or from route files; reads on other threads while one thread updates; `memory()`.
//!
//! Built by maturin into one wheel for CPython 3.9 and newer (`pip install
//! ./crates/python`); `fibre.pyi` beside the manifest holds the types and what each
//! method does. The modules, each importing only those above it:
//!
//! - `keys`: Python keys (text, integers, bytes, `ipaddress` objects) read as prefixes;
//! - `family`: one family's LPM table, shared with batch readers, and an ordered index;
//! - `batch`: `lookup_many`'s addresses gathered by family and answered in batches;
//! - `table`: the `Table` class, values in a slab of entries whose ids the LPM tables
//!   hold.

use pyo3::prelude::*;

mod batch;
mod family;
mod keys;
mod table;

pub use table::Table;

/// Full-table longest-prefix match for IPv4 and IPv6 with pytricia's interface.
///
/// `fibre.Table()` is a table of both families (apart) mapping prefixes to any Python
/// objects: `t["10.0.0.0/8"] = v`, `t["10.1.2.3"]`, `get`, `get_key`, `has_key`, `in`,
/// `delete`, `keys`, `parent`, `children`, as pytricia's; and `lookup_many` over lists
/// and NumPy arrays with the interpreter released, `Table.from_items`,
/// `Table.from_file` and `memory()` besides. `MAX_PREFIXES` is the most a table holds.
#[pymodule]
#[pyo3(name = "fibre")]
fn fibre_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Table>()?;
    m.add("MAX_PREFIXES", fibre_lpm::MAX_VALUE + 1)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
