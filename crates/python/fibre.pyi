"""fibre: full-table longest-prefix match for IPv4 and IPv6, with pytricia's interface.

``fibre.Table`` holds IPv4 and IPv6 prefixes (apart: an IPv4 address never matches an
IPv6 prefix) mapped to any Python objects. Code written for pytricia moves over by
changing its import::

    import fibre
    t = fibre.Table()                 # pytricia.PyTricia(), PyTricia(128) -> Table(128)
    t["10.0.0.0/8"] = "a"
    t["10.1.2.3"]                     # 'a': the longest prefix holding the address
    t.lookup_many(numpy_uint32_array) # many at once, the interpreter released

A key is a prefix or an address (its host route):

- ``str``: ``"10.0.0.0/8"``, ``"2001:db8::/32"``, or a bare address;
- ``int``: an IPv4 address, 0 to 2**32 - 1;
- ``bytes`` of 4 or 16 bytes: a packed address, network order;
- ``(bytes, length)``: a packed address and a prefix length;
- ``ipaddress`` networks (prefixes) and addresses (host routes).

A bad key raises ``ValueError`` naming it; fibre is stricter than pytricia (a length past
the family's width, or not a number, is refused rather than guessed) and clears host bits
(``10.1.2.3/8`` is ``10.0.0.0/8``). A prefix that must be in the table and is not raises
``KeyError``.
"""

import ipaddress
import os
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union, overload

import numpy as np
import numpy.typing as npt

__version__: str
#: The most prefixes one table holds.
MAX_PREFIXES: int

Key = Union[
    str,
    int,
    bytes,
    Tuple[bytes, int],
    ipaddress.IPv4Address,
    ipaddress.IPv6Address,
    ipaddress.IPv4Network,
    ipaddress.IPv6Network,
]
"""A prefix or an address, in any of the forms above."""

Addresses = Union[Iterable[Key], npt.NDArray[Any]]
"""What ``lookup_many`` reads: an iterable of keys, or a NumPy array: 1-D ``uint32``
(IPv4 addresses as integers; other integer types are checked), ``(n, 2)`` ``uint64``
(IPv6: each row the high and low 64 bits), or ``(n, 4)`` / ``(n, 16)`` ``uint8`` (packed
addresses, network order)."""

PathLike = Union[str, "os.PathLike[str]"]

class Table:
    """A longest-prefix-match table of IPv4 and IPv6 prefixes to Python objects.

    Lookups of an address take the table's LPM structures (a few nanoseconds inside;
    the Python call costs more); a prefix is answered by the longest prefix of the table
    holding all of it, as pytricia answers. Safe to use from many threads:
    ``lookup_many`` runs with the interpreter released, against one version of the
    table, while other threads update it.
    """

    def __init__(self, maxbits: int = 32, family: int = 2, raw_output: bool = False) -> None:
        """An empty table for both families. pytricia's arguments are accepted and
        ignored (``maxbits`` must be 0 to 128); ``raw_output=True`` is refused."""

    @classmethod
    def from_items(cls, items: Iterable[Tuple[Key, Any]]) -> "Table":
        """A table of ``(key, value)`` pairs, built in bulk (much faster than inserting
        one by one). A prefix given twice keeps its last value."""

    @classmethod
    def from_file(
        cls,
        path: Union[PathLike, List[PathLike]],
        value: Any = True,
        skip_bad: bool = False,
    ) -> "Table":
        """A table of the prefixes of a route file, or of a list of them read in turn,
        each mapped to ``value``: the files ``fibre lookup`` reads (a prefix a line,
        ``A``/``W`` announcements and withdrawals, ``ip -batch`` lines, MRT dumps; plain,
        gzip or bzip2). A bad line raises ``ValueError`` naming its file and line unless
        ``skip_bad``; an unreadable file raises ``OSError``; an MRT dump that breaks off
        keeps what came before, with a ``RuntimeWarning`` saying where."""

    @overload
    def insert(self, prefix: Key, value: Any) -> None: ...
    @overload
    def insert(self, address: Key, length: int, value: Any) -> None: ...
    def insert(self, *args: Any) -> None:
        """Maps a prefix to ``value`` (``insert(address, length, value)`` sets the
        length), replacing its value if it is there."""

    def __setitem__(self, prefix: Key, value: Any) -> None:
        """Maps a prefix to ``value``."""

    def __getitem__(self, key: Key) -> Any:
        """The value of the longest prefix holding ``key``; ``KeyError`` if none does."""

    def __delitem__(self, prefix: Key) -> None:
        """Removes exactly ``prefix``; ``KeyError`` if it is not in the table."""

    def delete(self, prefix: Key) -> None:
        """Removes exactly ``prefix``; ``KeyError`` if it is not in the table."""

    def get(self, key: Key, default: Any = None) -> Any:
        """The value of the longest prefix holding ``key``, or ``default``."""

    def get_key(self, key: Key) -> Optional[str]:
        """The longest prefix holding ``key``, as text (``"10.0.0.0/8"``), or None."""

    def has_key(self, prefix: Key) -> bool:
        """True if exactly ``prefix`` is in the table."""

    def __contains__(self, key: Key) -> bool:
        """True if a prefix of the table holds ``key`` (not an exact match: see
        ``has_key``)."""

    def __len__(self) -> int:
        """Number of prefixes, both families."""

    def keys(self) -> List[str]:
        """Every prefix as text: IPv4, then IPv6, each by address, then length
        (pytricia's order)."""

    def items(self) -> List[Tuple[str, Any]]:
        """Every prefix with its value, in the order of ``keys()``."""

    def __iter__(self) -> Iterator[str]:
        """The prefixes, as ``keys()`` lists them when iteration starts."""

    def parent(self, prefix: Key) -> Optional[str]:
        """The longest prefix strictly holding ``prefix``, or None; ``prefix`` must be in
        the table (``KeyError`` if not)."""

    def children(self, prefix: Key) -> List[str]:
        """Every prefix strictly inside ``prefix``, at any depth, in order; ``prefix``
        must be in the table (``KeyError`` if not)."""

    def freeze(self) -> None:
        """Does nothing (pytricia's compaction; fibre's tables are always compact)."""

    def thaw(self) -> None:
        """Does nothing (see ``freeze``)."""

    @overload
    def lookup_many(self, addresses: Addresses, default: Any = None) -> List[Any]: ...
    @overload
    def lookup_many(
        self, addresses: Addresses, default: Any = None, *, ids: bool
    ) -> Union[List[Any], npt.NDArray[np.int64]]: ...
    def lookup_many(self, addresses: Addresses, default: Any = None, *, ids: bool = False) -> Any:
        """Looks up many addresses at once, in batches, with the interpreter released.

        Answers a list of values (``default`` where no prefix holds the address), or
        with ``ids=True`` a NumPy ``int64`` array of entry ids, -1 where no prefix
        holds the address; ``values_by_id()`` maps ids to values. The answers are those
        of one version of the table, even as other threads update it. A key that is a
        prefix shorter than its family's width is answered as ``get`` answers it."""

    def values_by_id(self) -> List[Any]:
        """Every entry's value at its id (None at a free id): what ``lookup_many(...,
        ids=True)``'s ids index."""

    def __reduce__(self) -> Tuple[Any, Tuple[List[Tuple[str, Any]]]]:
        """Pickles as ``Table.from_items(self.items())``."""

    def memory(self) -> Dict[str, int]:
        """Bytes used: ``lookup`` (what lookups read), ``update`` (what only updates
        use), ``index`` (the ordered index behind ``keys``, ``parent`` and
        ``children``, estimated), ``entries`` (the references to the values), and
        ``total``. The values themselves are not counted."""
