//! `fibre.Table`: pytricia's interface over one LPM table per family, values any Python
//! objects.
//!
//! The LPM tables map prefixes to `u32`s, so a value lives in a slab of entries (its
//! object and its prefix's length) and the tables hold its entry's id. A removed
//! prefix's entry is reused by a later insert, but not while a `lookup_many` that started
//! before the removal still runs with the interpreter released: its ids come from a
//! snapshot published at its start, which may still name the entry. Such entries are
//! retired, in order, and freed when every batch older than their removal has ended (an
//! epoch scheme, as read-copy-update reclaims memory). A batch's answers are thus the
//! values of one consistent version of the table, even as another thread updates it.
//!
//! IPv4 and IPv6 live in separate tables, so an IPv4 address never matches an IPv6
//! prefix with the same leading bits (pytricia's one tree lets `32.0.0.1` match
//! `2000::/8`). Keys and iteration give IPv4 first, then IPv6, each in pytricia's order
//! (address, then length).

use crate::batch::{answer, gather};
use crate::family::Family;
use crate::keys::{parse_key, parse_key_with_len, Parsed};
use fibre_lpm::{Key, Prefix, MAX_VALUE};
use fibre_routefile::{final_prefixes, read_route_file, SourceError};
use numpy::PyArray1;
use pyo3::exceptions::{PyKeyError, PyMemoryError, PyOSError, PyRuntimeWarning, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::{PyBool, PyDict, PyList, PyTuple, PyType};
use pyo3::PyTraverseError;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::Mutex;

/// The values by entry id, each with its prefix's length (the family and address come
/// from the query): two arrays, 9 bytes an entry where a struct of both would take 16.
#[derive(Default)]
struct Entries {
    values: Vec<Option<Py<PyAny>>>,
    lens: Vec<u8>,
}

impl Entries {
    /// Room for `n` entries.
    fn with_capacity(n: usize) -> Self {
        Entries {
            values: Vec::with_capacity(n),
            lens: Vec::with_capacity(n),
        }
    }

    /// The value of entry `id`, if it is live.
    fn get(&self, id: u32) -> Option<&Py<PyAny>> {
        self.values.get(id as usize)?.as_ref()
    }

    /// The prefix length of entry `id`.
    fn len_of(&self, id: u32) -> u8 {
        self.lens.get(id as usize).copied().unwrap_or(0)
    }

    /// Number of entries, live or free.
    fn count(&self) -> usize {
        self.values.len()
    }

    /// Appends an entry.
    fn push(&mut self, value: Py<PyAny>, len: u8) {
        self.values.push(Some(value));
        self.lens.push(len);
    }

    /// Sets entry `id` (an existing one).
    fn put(&mut self, id: u32, value: Py<PyAny>, len: u8) {
        self.values[id as usize] = Some(value);
        self.lens[id as usize] = len;
    }

    /// Frees entry `id`; its value, if it was live.
    fn take(&mut self, id: u32) -> Option<Py<PyAny>> {
        self.values.get_mut(id as usize)?.take()
    }

    /// Sets the value of live entry `id`; the value it had.
    fn replace(&mut self, id: u32, value: Py<PyAny>) -> Option<Py<PyAny>> {
        let slot = self.values.get_mut(id as usize)?.as_mut()?;
        Some(std::mem::replace(slot, value))
    }

    /// Every entry's value, `None` for free ones.
    fn iter(&self) -> impl Iterator<Item = Option<&Py<PyAny>>> {
        self.values.iter().map(Option::as_ref)
    }

    /// Bytes held.
    fn bytes(&self) -> usize {
        self.values.capacity() * std::mem::size_of::<Option<Py<PyAny>>>() + self.lens.capacity()
    }
}

/// A longest-prefix-match table of IPv4 and IPv6 prefixes to Python objects, with
/// pytricia's interface.
///
/// The state is behind a mutex taken with the interpreter released while waiting
/// (`lock_py_attached`): Python code may run while a method holds it (a key's
/// `ipaddress` properties, a collection), which lets another thread call in, and that
/// thread then waits rather than failing. Keys are read and Python objects made and
/// dropped outside it, so that no Python code that might reach the same table runs
/// while its state is held.
#[pyclass(module = "fibre", name = "Table", frozen, subclass)]
pub struct Table {
    state: Mutex<State>,
}

/// A table's state.
struct State {
    v4: Family<u32>,
    v6: Family<u128>,
    entries: Entries,
    /// Entries free for reuse.
    free: Vec<u32>,
    /// Entries removed while batches ran, each with the number of batches started
    /// before its removal, oldest first: freed once none of those batches runs.
    retired: VecDeque<(u64, u32)>,
    /// `lookup_many` calls started so far.
    started: u64,
    /// The `lookup_many` calls running with the interpreter released, by their order of
    /// starting.
    running: BTreeSet<u64>,
    /// Values let go of, dropped once the state is released (dropping one may run its
    /// finalizer).
    garbage: Vec<Py<PyAny>>,
}

/// The text of a prefix, as pytricia gives keys.
fn text<K: Key>(p: &Prefix<K>) -> String {
    p.to_string()
}

/// A `KeyError` naming the key that is not in the table.
fn missing(p: &Parsed) -> PyErr {
    let shown = match p {
        Parsed::V4(p) => text(p),
        Parsed::V6(p) => text(p),
    };
    PyKeyError::new_err(format!("prefix {shown} is not in the table"))
}

impl State {
    fn empty() -> Self {
        State {
            v4: Family::default(),
            v6: Family::default(),
            entries: Entries::default(),
            free: Vec::new(),
            retired: VecDeque::new(),
            started: 0,
            running: BTreeSet::new(),
            garbage: Vec::new(),
        }
    }

    /// A table built in bulk from distinct prefixes and their values.
    fn build(py: Python<'_>, routes: Vec<(Parsed, Py<PyAny>)>) -> PyResult<Table> {
        if routes.len() > MAX_VALUE as usize {
            return Err(PyMemoryError::new_err(format!(
                "a table holds at most {MAX_VALUE} prefixes"
            )));
        }
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        let mut entries = Entries::with_capacity(routes.len());
        for (id, (p, value)) in (0u32..).zip(routes) {
            let len = match p {
                Parsed::V4(p) => {
                    v4.push((p, id));
                    p.len()
                }
                Parsed::V6(p) => {
                    v6.push((p, id));
                    p.len()
                }
            };
            entries.push(value, len);
        }
        let (v4, v6) = py.detach(|| (Family::build(v4), Family::build(v6)));
        Ok(Table::of(State {
            v4,
            v6,
            entries,
            ..State::empty()
        }))
    }

    /// The length of entry `id`'s prefix.
    fn len_of(&self, id: u32) -> u8 {
        self.entries.len_of(id)
    }

    /// The value of entry `id`. An id the LPM tables or a running batch hold always
    /// names a live entry (entries are freed only once neither can hold them), so a
    /// missing one would be a bug here: it answers None rather than crash the
    /// interpreter.
    fn value(&self, py: Python<'_>, id: u32) -> Py<PyAny> {
        match self.entries.get(id) {
            Some(v) => v.clone_ref(py),
            _ => {
                debug_assert!(false, "entry {id} is not live");
                py.None()
            }
        }
    }

    /// The id of exactly `p`.
    fn exact(&self, p: &Parsed) -> Option<u32> {
        match p {
            Parsed::V4(p) => self.v4.exact(p),
            Parsed::V6(p) => self.v6.exact(p),
        }
    }

    /// The id of the longest prefix holding all of `p` (an address, or a prefix as
    /// pytricia answers one), and that prefix.
    fn best(&self, p: &Parsed) -> Option<(u32, Parsed)> {
        let len_of = |id| self.len_of(id);
        match p {
            Parsed::V4(p) => {
                let id = if p.len() == 32 {
                    self.v4.lookup(p.addr())?
                } else {
                    self.v4.best(p, len_of)?
                };
                Some((id, Parsed::V4(Prefix::new_clamped(p.addr(), len_of(id)))))
            }
            Parsed::V6(p) => {
                let id = if p.len() == 128 {
                    self.v6.lookup(p.addr())?
                } else {
                    self.v6.best(p, len_of)?
                };
                Some((id, Parsed::V6(Prefix::new_clamped(p.addr(), len_of(id)))))
            }
        }
    }

    /// Frees the retired entries that no running batch can name: those removed before
    /// the oldest running batch started.
    fn release_retired(&mut self) {
        let oldest = self.running.first().copied().unwrap_or(u64::MAX);
        while let Some(&(removed_after, id)) = self.retired.front() {
            if removed_after > oldest {
                break;
            }
            self.retired.pop_front();
            if let Some(value) = self.entries.take(id) {
                self.garbage.push(value);
            }
            self.free.push(id);
        }
    }

    /// Sets `p` to `value`.
    fn set(&mut self, p: Parsed, value: Py<PyAny>) -> PyResult<()> {
        if let Some(id) = self.exact(&p) {
            // Replaced in place; the old value dropped once the state is released.
            if let Some(old) = self.entries.replace(id, value) {
                self.garbage.push(old);
            }
            return Ok(());
        }
        self.release_retired();
        let len = match p {
            Parsed::V4(p) => p.len(),
            Parsed::V6(p) => p.len(),
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.entries.put(id, value, len);
                id
            }
            None => {
                let id = u32::try_from(self.entries.count())
                    .ok()
                    .filter(|id| *id <= MAX_VALUE)
                    .ok_or_else(|| {
                        PyMemoryError::new_err(format!(
                            "a table holds at most {MAX_VALUE} prefixes"
                        ))
                    })?;
                self.entries.push(value, len);
                id
            }
        };
        match p {
            Parsed::V4(p) => self.v4.insert(p, id),
            Parsed::V6(p) => self.v6.insert(p, id),
        };
        Ok(())
    }

    /// Removes `p`, or a `KeyError`.
    fn remove(&mut self, p: &Parsed) -> PyResult<()> {
        let id = match p {
            Parsed::V4(q) => self.v4.remove(q),
            Parsed::V6(q) => self.v6.remove(q),
        }
        .ok_or_else(|| missing(p))?;
        self.retired.push_back((self.started, id));
        self.release_retired();
        Ok(())
    }

    /// `Ok` if exactly `p` is in the table, else a `KeyError`.
    fn present(&self, p: &Parsed) -> PyResult<()> {
        self.exact(p).map(|_| ()).ok_or_else(|| missing(p))
    }

    /// Every prefix's text with its id: IPv4 first, each family in order.
    fn all(&self) -> impl Iterator<Item = (String, u32)> + '_ {
        let v4 = self.v4.iter().map(|(p, id)| (text(&p), id));
        let v6 = self.v6.iter().map(|(p, id)| (text(&p), id));
        v4.chain(v6)
    }
}

impl Table {
    fn of(state: State) -> Self {
        Table {
            state: Mutex::new(state),
        }
    }

    /// Runs `f` on the state, then drops the values it let go of, once the state is
    /// released.
    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&mut State) -> R) -> R {
        let (r, garbage) = {
            let mut st = self
                .state
                .lock_py_attached(py)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let r = f(&mut st);
            (r, std::mem::take(&mut st.garbage))
        };
        drop(garbage);
        r
    }
}

fn parsed_text(p: &Parsed) -> String {
    match p {
        Parsed::V4(p) => text(p),
        Parsed::V6(p) => text(p),
    }
}

#[pymethods]
impl Table {
    /// Table(maxbits=32, family=AF_INET, raw_output=False)
    ///
    /// An empty table for both families. pytricia's arguments are accepted so that
    /// `PyTricia(128)` becomes `Table(128)`, and ignored: every table holds IPv4 and
    /// IPv6, apart. `raw_output` (keys as `(bytes, length)`) is not supported.
    #[new]
    #[pyo3(signature = (*args))]
    fn new(args: &Bound<'_, PyTuple>) -> PyResult<Self> {
        if args.len() > 3 {
            return Err(PyValueError::new_err(
                "Table takes at most 3 arguments (maxbits, family, raw_output), all ignored",
            ));
        }
        if let Ok(maxbits) = args.get_item(0) {
            let ok = maxbits.extract::<u8>().is_ok_and(|m| m <= 128);
            if !ok {
                return Err(PyValueError::new_err(format!(
                    "maxbits must be from 0 to 128, not {}",
                    maxbits.repr()?
                )));
            }
        }
        if let Ok(raw) = args.get_item(2) {
            if raw.is_truthy()? {
                return Err(PyValueError::new_err(
                    "raw_output is not supported: keys are always text",
                ));
            }
        }
        Ok(Table::of(State::empty()))
    }

    /// Table.from_items(items) -> Table
    ///
    /// A table of `items`, an iterable of `(key, value)` pairs (a dict's `.items()`, a
    /// generator, ...), built in bulk: much faster than inserting one by one. A prefix
    /// given twice keeps its last value.
    #[classmethod]
    fn from_items(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        items: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let mut routes: Vec<(Parsed, Py<PyAny>)> = Vec::new();
        let mut seen: HashMap<Parsed, usize> = HashMap::new();
        for item in items.try_iter()? {
            let item = item?;
            let (key, value): (Bound<'_, PyAny>, Py<PyAny>) = item.extract().map_err(|_| {
                PyValueError::new_err(format!(
                    "from_items takes (key, value) pairs, not {}",
                    item.repr().map(|r| r.to_string()).unwrap_or_default()
                ))
            })?;
            let p = parse_key(&key)?;
            match seen.get(&p) {
                Some(&i) => routes[i].1 = value,
                None => {
                    seen.insert(p, routes.len());
                    routes.push((p, value));
                }
            }
        }
        State::build(py, routes)
    }

    /// Table.from_file(path, value=True, skip_bad=False) -> Table
    ///
    /// A table of the prefixes of a route file (or of a list of them, read in turn),
    /// each mapped to `value`: the files `fibre lookup` reads (one prefix per line,
    /// optionally `A` or `W` first, IPv4 and IPv6 mixed; `ip -batch` lines; MRT dumps;
    /// plain, gzip or bzip2), applied in order. A bad line raises `ValueError` naming its
    /// file and line, or is skipped with `skip_bad=True`; a file that cannot be read
    /// raises `OSError`; an MRT dump that breaks off keeps what came before, with a
    /// `RuntimeWarning` saying where. The files are read with the interpreter released.
    #[classmethod]
    #[pyo3(signature = (path, value = None, skip_bad = false))]
    fn from_file(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        value: Option<Py<PyAny>>,
        skip_bad: bool,
    ) -> PyResult<Self> {
        let paths: Vec<PathBuf> = match path.extract::<PathBuf>() {
            Ok(p) => vec![p],
            Err(_) => path.extract().map_err(|_| {
                PyValueError::new_err(format!(
                    "from_file takes a path or a list of paths, not {}",
                    path.repr().map(|r| r.to_string()).unwrap_or_default()
                ))
            })?,
        };
        let value = match value {
            Some(v) => v,
            None => PyBool::new(py, true).to_owned().into_any().unbind(),
        };
        let read = py.detach(|| -> Result<_, SourceError> {
            let (mut v4, mut v6, mut broken) = (Vec::new(), Vec::new(), Vec::new());
            for path in &paths {
                let f = read_route_file(path, skip_bad)?;
                v4.extend(f.v4);
                v6.extend(f.v6);
                broken.extend(f.broken);
            }
            Ok((final_prefixes(&v4), final_prefixes(&v6), broken))
        });
        let (v4, v6, broken) = read.map_err(|e| {
            if e.line.is_some() {
                PyValueError::new_err(e.to_string())
            } else {
                PyOSError::new_err(e.to_string())
            }
        })?;
        for e in broken {
            // An MRT dump that breaks off keeps what came before, as `fibre lookup` does;
            // the user is told where.
            let message =
                CString::new(format!("{e}; the routes before it are kept")).unwrap_or_default();
            PyErr::warn(py, &py.get_type::<PyRuntimeWarning>(), &message, 1)?;
        }
        let routes = v4
            .into_iter()
            .map(Parsed::V4)
            .chain(v6.into_iter().map(Parsed::V6))
            .map(|p| (p, value.clone_ref(py)))
            .collect();
        State::build(py, routes)
    }

    /// insert(prefix, value) or insert(address, length, value) -> None
    ///
    /// Maps a prefix to `value`, replacing its value if it is there.
    #[pyo3(signature = (key, *args))]
    fn insert(&self, key: &Bound<'_, PyAny>, args: &Bound<'_, PyTuple>) -> PyResult<()> {
        let py = key.py();
        match args.len() {
            1 => {
                let p = parse_key(key)?;
                let value = args.get_item(0)?.unbind();
                self.with(py, |st| st.set(p, value))
            }
            2 => {
                let len = args.get_item(0)?;
                let len: u64 = len.extract().map_err(|_| {
                    PyValueError::new_err(format!(
                        "insert(address, length, value): the length must be an int, not {}",
                        len.repr().map(|r| r.to_string()).unwrap_or_default()
                    ))
                })?;
                let p = parse_key_with_len(key, len)?;
                let value = args.get_item(1)?.unbind();
                self.with(py, |st| st.set(p, value))
            }
            _ => Err(PyValueError::new_err(
                "insert takes (prefix, value) or (address, length, value)",
            )),
        }
    }

    fn __setitem__(&self, key: &Bound<'_, PyAny>, value: Py<PyAny>) -> PyResult<()> {
        let p = parse_key(key)?;
        self.with(key.py(), |st| st.set(p, value))
    }

    /// The value of the longest prefix holding `key`; `KeyError` if none does.
    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let p = parse_key(key)?;
        match self.with(py, |st| st.best(&p).map(|(id, _)| st.value(py, id))) {
            Some(v) => Ok(v),
            None => Err(PyKeyError::new_err(format!(
                "no prefix holds {}",
                parsed_text(&p)
            ))),
        }
    }

    fn __delitem__(&self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        self.delete(key)
    }

    /// delete(prefix) -> None
    ///
    /// Removes exactly `prefix`; `KeyError` if it is not in the table.
    fn delete(&self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let p = parse_key(key)?;
        self.with(key.py(), |st| st.remove(&p))
    }

    /// get(key, default=None) -> object
    ///
    /// The value of the longest prefix holding `key` (an address, or all of a prefix),
    /// or `default`.
    #[pyo3(signature = (key, default = None))]
    fn get(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        default: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let p = parse_key(key)?;
        let found = self.with(py, |st| st.best(&p).map(|(id, _)| st.value(py, id)));
        Ok(found.unwrap_or_else(|| default.unwrap_or_else(|| py.None())))
    }

    /// get_key(key) -> str or None
    ///
    /// The longest prefix holding `key`, as text, or None.
    fn get_key(&self, key: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
        let p = parse_key(key)?;
        let found = self.with(key.py(), |st| st.best(&p).map(|(_, found)| found));
        Ok(found.map(|f| parsed_text(&f)))
    }

    /// has_key(prefix) -> bool
    ///
    /// True if exactly `prefix` is in the table (`in` asks whether one holds it).
    fn has_key(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let p = parse_key(key)?;
        Ok(self.with(key.py(), |st| st.exact(&p).is_some()))
    }

    /// True if a prefix of the table holds `key` (an address, or all of a prefix).
    fn __contains__(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let p = parse_key(key)?;
        Ok(self.with(key.py(), |st| st.best(&p).is_some()))
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.with(py, |st| st.v4.len() + st.v6.len())
    }

    /// keys() -> list of str
    ///
    /// Every prefix, as text: IPv4 then IPv6, each by address, then length.
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let keys: Vec<String> = self.with(py, |st| st.all().map(|(k, _)| k).collect());
        PyList::new(py, keys)
    }

    /// items() -> list of (str, object)
    ///
    /// Every prefix with its value, in the order of `keys()`.
    fn items<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items: Vec<(String, Py<PyAny>)> = self.with(py, |st| {
            st.all().map(|(k, id)| (k, st.value(py, id))).collect()
        });
        PyList::new(py, items)
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.keys(py)?.try_iter()?.into_any())
    }

    /// parent(prefix) -> str or None
    ///
    /// The longest prefix of the table strictly holding `prefix`, which must be in the
    /// table itself (`KeyError` if not), or None.
    fn parent(&self, key: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
        let p = parse_key(key)?;
        self.with(key.py(), |st| {
            st.present(&p)?;
            Ok(match p {
                Parsed::V4(p) => st.v4.parent(&p).map(|(q, _)| text(&q)),
                Parsed::V6(p) => st.v6.parent(&p).map(|(q, _)| text(&q)),
            })
        })
    }

    /// children(prefix) -> list of str
    ///
    /// Every prefix of the table strictly inside `prefix`, at any depth, in the order of
    /// `keys()`; `prefix` must be in the table (`KeyError` if not).
    fn children<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let p = parse_key(key)?;
        let children: Vec<String> = self.with(py, |st| {
            st.present(&p)?;
            PyResult::Ok(match p {
                Parsed::V4(p) => st.v4.children(&p).map(|q| text(&q)).collect(),
                Parsed::V6(p) => st.v6.children(&p).map(|q| text(&q)).collect(),
            })
        })?;
        PyList::new(py, children)
    }

    /// freeze() -> None
    ///
    /// Does nothing: pytricia's compaction, which fibre's tables need not (they stay
    /// compact and updatable).
    fn freeze(&self) {}

    /// thaw() -> None
    ///
    /// Does nothing (see `freeze`).
    fn thaw(&self) {}

    /// lookup_many(addresses, default=None, *, ids=False) -> list or numpy.ndarray
    ///
    /// Looks up many addresses at once, in batches, with the interpreter released (other
    /// threads run meanwhile, and may update the table: the answers are those of one
    /// version of it). `addresses` is a list (or any iterable) of keys, or a NumPy array:
    /// 1-D uint32 (IPv4, as integers), (n, 2) uint64 (IPv6, high and low halves), or
    /// (n, 4) or (n, 16) uint8 (packed addresses).
    ///
    /// Answers a list of values (`default` where no prefix holds the address), or, with
    /// `ids=True`, a NumPy int64 array of entry ids (-1 where none does), which
    /// `values_by_id()` turns into values: `numpy.array(t.values_by_id(),
    /// dtype=object)[ids]`, or `ids >= 0` for a mask of covered addresses.
    #[pyo3(signature = (addresses, default = None, *, ids = false))]
    fn lookup_many<'py>(
        slf: &Bound<'py, Self>,
        addresses: &Bound<'py, PyAny>,
        default: Option<Py<PyAny>>,
        ids: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        if ids {
            // The answer is a NumPy array: say so plainly if NumPy is missing.
            py.import("numpy").map_err(|e| {
                pyo3::exceptions::PyImportError::new_err(format!(
                    "lookup_many(..., ids=True) answers a NumPy array: {e}"
                ))
            })?;
        }
        let queries = gather(addresses)?;
        let mut out = vec![-1i64; queries.n];
        let this = slf.get();
        let (batch, v4, v6) = this.with(py, |st| {
            for (i, p) in &queries.prefixes {
                out[*i] = st.best(p).map_or(-1, |(id, _)| i64::from(id));
            }
            let batch = st.started;
            st.started += 1;
            st.running.insert(batch);
            (batch, st.v4.reader(), st.v6.reader())
        });
        let out = py.detach(move || {
            answer(&queries, &v4, &v6, &mut out);
            out
        });
        // The batch ends here: the entries it could name are kept until now.
        let values = this.with(py, |st| {
            let values = (!ids).then(|| {
                out.iter()
                    .map(|&id| u32::try_from(id).ok().map(|id| st.value(py, id)))
                    .collect::<Vec<_>>()
            });
            st.running.remove(&batch);
            st.release_retired();
            values
        });
        match values {
            None => Ok(PyArray1::from_vec(py, out).into_any()),
            Some(values) => {
                let default = default.unwrap_or_else(|| py.None());
                let values = values
                    .into_iter()
                    .map(|v| v.unwrap_or_else(|| default.clone_ref(py)));
                Ok(PyList::new(py, values)?.into_any())
            }
        }
    }

    /// values_by_id() -> list
    ///
    /// Every entry's value at its id (None at a free id): what `lookup_many(...,
    /// ids=True)`'s ids index.
    fn values_by_id<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let values: Vec<Py<PyAny>> = self.with(py, |st| {
            st.entries
                .iter()
                .map(|v| v.map_or_else(|| py.None(), |v| v.clone_ref(py)))
                .collect()
        });
        PyList::new(py, values)
    }

    /// memory() -> dict
    ///
    /// Bytes the table uses, by part: `lookup` (what lookups read, both families),
    /// `update` (what only updates use), `index` (the ordered index behind `keys()`,
    /// `children` and `parent`, estimated), `entries` (the slab of values' references),
    /// and `total`. The Python values themselves are not counted.
    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (lookup, update, index, entries) = self.with(py, |st| {
            let (m4, i4) = st.v4.memory();
            let (m6, i6) = st.v6.memory();
            let entries = st.entries.bytes() + st.free.capacity() * 4 + st.retired.capacity() * 16;
            (
                m4.lookup_bytes + m6.lookup_bytes,
                m4.update_bytes + m6.update_bytes,
                i4 + i6,
                entries,
            )
        });
        let d = PyDict::new(py);
        d.set_item("lookup", lookup)?;
        d.set_item("update", update)?;
        d.set_item("index", index)?;
        d.set_item("entries", entries)?;
        d.set_item("total", lookup + update + index + entries)?;
        Ok(d)
    }

    /// Pickles as `Table.from_items(items)`: the prefixes and values, not the structures.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyList>,))> {
        let py = slf.py();
        let build = py.get_type::<Table>().getattr("from_items")?;
        Ok((build, (slf.get().items(py)?,)))
    }

    /// The values, for the cycle collector. A state held by another call (which can only
    /// be waiting for the interpreter) is skipped: its values then count as referenced
    /// from outside, which keeps them alive, the safe side.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Ok(st) = self.state.try_lock() {
            for v in st.entries.iter().flatten() {
                visit.call(v)?;
            }
        }
        Ok(())
    }

    /// Empties the table, for the cycle collector (a value that refers to its table).
    fn __clear__(&self) {
        let old = match self.state.try_lock() {
            Ok(mut st) => std::mem::replace(&mut *st, State::empty()),
            Err(_) => return,
        };
        drop(old);
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let (v4, v6) = self.with(py, |st| (st.v4.len(), st.v6.len()));
        format!("<fibre.Table: {v4} IPv4 and {v6} IPv6 prefixes>")
    }
}
