"""Tables built in bulk: from (key, value) pairs and from route files, held to tables
built one insert at a time."""

import bz2
import gzip

import pytest

import fibre
from conftest import random_v4_prefix, random_v6_prefix


def test_from_items_equals_inserting_one_by_one(rng):
    pairs = [(random_v4_prefix(rng) if i % 3 else random_v6_prefix(rng), i) for i in range(4000)]
    pairs += [(str(net), "last") for net, _ in pairs[:100]]  # given twice: the last wins
    one_by_one = fibre.Table()
    for k, v in pairs:
        one_by_one[k] = v
    for items in (pairs, iter(pairs), dict((str(k), v) for k, v in pairs).items()):
        bulk = fibre.Table.from_items(items)
        assert bulk.items() == one_by_one.items()
    bulk["10.0.0.0/8"] = "added"
    assert bulk.get_key("10.1.1.1") is not None
    with pytest.raises(ValueError, match="pairs"):
        fibre.Table.from_items([("10.0.0.0/8",)])
    with pytest.raises(ValueError, match="10.0.0.0/40"):
        fibre.Table.from_items([("10.0.0.0/40", 1)])


ROUTES = """\
# a comment
10.0.0.0/8
A 10.1.0.0/16
192.0.2.0/24
2001:db8::/32
A 2001:db8:1::/48
W 192.0.2.0/24
route add 198.51.100.0/24 via 10.0.0.1
"""


def test_from_file_reads_what_fibre_lookup_reads(tmp_path):
    plain = tmp_path / "routes.txt"
    plain.write_text(ROUTES)
    gz = tmp_path / "routes.gz"
    gz.write_bytes(gzip.compress(ROUTES.encode()))
    bz = tmp_path / "routes.bz2"
    bz.write_bytes(bz2.compress(ROUTES.encode()))
    expected = ["10.0.0.0/8", "10.1.0.0/16", "198.51.100.0/24", "2001:db8::/32", "2001:db8:1::/48"]
    for path in (plain, str(gz), bz):
        t = fibre.Table.from_file(path)
        assert t.keys() == expected
        assert t["10.1.2.3"] is True
    t = fibre.Table.from_file(plain, value="origin")
    assert t.get("2001:db8:1::1") == "origin" and t.get("192.0.2.1") is None
    # Several files, read in turn: the second withdraws what the first announced.
    later = tmp_path / "later.txt"
    later.write_text("W 10.1.0.0/16\n203.0.113.0/24\n")
    t = fibre.Table.from_file([plain, later])
    assert t.get_key("10.1.2.3") == "10.0.0.0/8" and "203.0.113.9" in t


def test_from_file_names_a_bad_line_or_skips_it(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("10.0.0.0/8\n10.0.0.0/99\n192.0.2.0/24\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2:"):
        fibre.Table.from_file(path)
    t = fibre.Table.from_file(path, skip_bad=True)
    assert t.keys() == ["10.0.0.0/8", "192.0.2.0/24"]
    with pytest.raises(OSError, match="missing"):
        fibre.Table.from_file(tmp_path / "missing.txt")
    with pytest.raises(ValueError):
        fibre.Table.from_file(5)


def test_from_file_warns_where_an_mrt_dump_breaks_off(tmp_path):
    import struct
    import warnings

    # An MRT record header (TABLE_DUMP_V2, PEER_INDEX_TABLE) promising 100 bytes, and 10.
    path = tmp_path / "cut.mrt"
    path.write_bytes(struct.pack(">IHHI", 0, 13, 1, 100) + b"\0" * 10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = fibre.Table.from_file(path)
    assert len(t) == 0
    assert [w.category for w in caught] == [RuntimeWarning], caught
    assert "cut.mrt" in str(caught[0].message)
