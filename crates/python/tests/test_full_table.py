"""The full real tables shipped in data/ (about 1.04M IPv4 and 246k IPv6 prefixes), in
fibre and in pytricia: the same keys, and the same answers for addresses all over the
address space and inside the table's prefixes, one at a time and in batches."""

import ipaddress
import random

import numpy as np
import pytest
import pytricia

import fibre
from conftest import DATA, read_prefixes


@pytest.fixture(scope="module")
def tables():
    v4, v6 = read_prefixes("rib-v4.txt.gz"), read_prefixes("rib-v6.txt.gz")
    assert len(v4) > 1_000_000 and len(v6) > 200_000
    ref = {4: pytricia.PyTricia(32), 6: pytricia.PyTricia(128)}
    for fam, prefixes in ((4, v4), (6, v6)):
        tree = ref[fam]
        for i, p in enumerate(prefixes):
            tree[p] = i
    t = fibre.Table.from_items((p, i) for prefixes in (v4, v6) for i, p in enumerate(prefixes))
    return t, ref, v4, v6


def addresses(rng, v4, v6):
    """Addresses anywhere, and inside random prefixes of the table."""
    out = [ipaddress.IPv4Address(rng.getrandbits(32)) for _ in range(40000)]
    out += [ipaddress.IPv6Address((0x2 << 124) | rng.getrandbits(125)) for _ in range(10000)]
    for p in rng.sample(v4, 40000) + rng.sample(v6, 40000):
        net = ipaddress.ip_network(p)
        out.append(net.network_address + rng.getrandbits(net.max_prefixlen - net.prefixlen))
    return out


def test_the_full_tables_hold_the_same_keys(tables):
    t, ref, v4, v6 = tables
    assert len(t) == len(ref[4]) + len(ref[6]) == len(set(v4)) + len(set(v6))
    assert t.keys() == ref[4].keys() + ref[6].keys()
    from_file = fibre.Table.from_file([DATA / "rib-v4.txt.gz", DATA / "rib-v6.txt.gz"])
    assert from_file.keys() == t.keys()
    memory = from_file.memory()
    assert 0 < memory["lookup"] < 64 << 20, memory
    assert memory["total"] == sum(v for k, v in memory.items() if k != "total")


def test_the_full_tables_answer_as_pytricia(tables):
    t, ref, v4, v6 = tables
    rng = random.Random(1)
    addrs = addresses(rng, v4, v6)
    found = 0
    for a in addrs:
        tree = ref[a.version]
        key = rng.choice([str(a), a, a.packed])
        assert t.get(key) == tree.get(key), a
        assert t.get_key(key) == tree.get_key(key), a
        assert (key in t) == (key in tree), a
        found += tree.get(key) is not None
    assert found > 80000, "the addresses inside prefixes are found"
    # In batches: every array form, and the list of text.
    expected = [ref[a.version].get(str(a)) for a in addrs]
    assert t.lookup_many([str(a) for a in addrs]) == expected
    fours = [a for a in addrs if a.version == 4]
    sixes = [a for a in addrs if a.version == 6]
    arr4 = np.array([int(a) for a in fours], dtype=np.uint32)
    assert t.lookup_many(arr4) == [ref[4].get(str(a)) for a in fours]
    arr6 = np.array([[int(a) >> 64, int(a) & (2**64 - 1)] for a in sixes], dtype=np.uint64)
    assert t.lookup_many(arr6) == [ref[6].get(str(a)) for a in sixes]


def test_the_full_tables_answer_prefixes_parents_and_children_as_pytricia(tables):
    t, ref, v4, v6 = tables
    rng = random.Random(2)
    for p in rng.sample(v4, 1500) + rng.sample(v6, 1500):
        net = ipaddress.ip_network(p)
        tree = ref[net.version]
        assert t.parent(p) == tree.parent(p), p
        if net.prefixlen >= 12:  # the children of a short prefix are a large part of it
            assert t.children(p) == tree.children(p), p
        shorter = net.supernet(new_prefix=max(0, net.prefixlen - rng.randint(1, 8)))
        assert t.get_key(str(shorter)) == tree.get_key(str(shorter)), shorter
        assert t.has_key(str(shorter)) == tree.has_key(str(shorter)), shorter
    short = [p for p in v4 if p.endswith("/8")][:3] + [p for p in v6 if int(p.split("/")[1]) <= 20][:3]
    assert len(short) == 6
    for p in short:
        tree = ref[6 if ":" in p else 4]
        assert t.children(p) == tree.children(p), p
