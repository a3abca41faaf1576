"""lookup_many against single lookups (themselves held to pytricia): lists of every key
type and both families mixed, every NumPy form, ids and values."""

import ipaddress

import numpy as np
import pytest

import fibre
from conftest import random_v4_addr, random_v4_prefix, random_v6_addr, random_v6_prefix


@pytest.fixture
def table(rng):
    t = fibre.Table()
    for i in range(3000):
        t[random_v4_prefix(rng) if i % 2 else random_v6_prefix(rng)] = ("value", i)
    for k in t.keys()[::7]:
        t.delete(k)  # free entries, reused by the inserts below
    for i in range(300):
        t[random_v4_prefix(rng)] = ("again", i)
    return t


def v4_addrs(rng, n):
    return [random_v4_addr(rng) for _ in range(n)]


def v6_addrs(rng, n):
    return [random_v6_addr(rng) for _ in range(n)]


def test_a_list_of_mixed_keys_answers_as_get(rng, table):
    keys = []
    for a in v4_addrs(rng, 2000) + v6_addrs(rng, 2000):
        keys.append(rng.choice([str(a), a, a.packed] + ([int(a)] if a.version == 4 else [])))
    keys += [str(random_v4_prefix(rng)) for _ in range(200)]  # prefixes, answered as get
    rng.shuffle(keys)
    expected = [table.get(k) for k in keys]
    assert sum(e is not None for e in expected) > 1000
    assert table.lookup_many(keys) == expected
    assert table.lookup_many(iter(keys), "miss") == [table.get(k, "miss") for k in keys]
    ids = table.lookup_many(keys, ids=True)
    assert ids.dtype == np.int64 and ids.shape == (len(keys),)
    by_id = table.values_by_id()
    assert [by_id[i] if i >= 0 else None for i in ids] == expected
    assert table.lookup_many([]) == []
    assert table.lookup_many([], ids=True).shape == (0,)


def test_ipv4_arrays_answer_as_get(rng, table):
    addrs = v4_addrs(rng, 5000)
    expected = [table.get(a) for a in addrs]
    ints = np.array([int(a) for a in addrs], dtype=np.uint32)
    packed = np.frombuffer(b"".join(a.packed for a in addrs), dtype=np.uint8).reshape(-1, 4)
    for arr in [ints, ints.astype(np.int64), ints.astype(np.uint64), packed]:
        assert table.lookup_many(arr) == expected, arr.dtype
    # Not contiguous: every other address.
    assert table.lookup_many(ints[::2]) == expected[::2]
    ids = table.lookup_many(ints, ids=True)
    by_id = np.array(table.values_by_id() + [None], dtype=object)
    assert list(by_id[ids]) == expected  # -1 indexes the None appended
    assert ((ids >= 0) == np.array([e is not None for e in expected])).all()


def test_ipv6_arrays_answer_as_get(rng, table):
    addrs = v6_addrs(rng, 5000)
    expected = [table.get(a) for a in addrs]
    halves = np.array([[int(a) >> 64, int(a) & (2**64 - 1)] for a in addrs], dtype=np.uint64)
    packed = np.frombuffer(b"".join(a.packed for a in addrs), dtype=np.uint8).reshape(-1, 16)
    assert sum(e is not None for e in expected) > 1000
    for arr in [halves, packed, np.asfortranarray(halves)]:
        assert table.lookup_many(arr, "miss") == [e if e is not None else "miss" for e in expected]
    ids = table.lookup_many(halves, ids=True)
    by_id = table.values_by_id()
    assert [by_id[i] if i >= 0 else None for i in ids] == expected


def test_an_array_of_strings_is_read_key_by_key(rng, table):
    addrs = [str(a) for a in v4_addrs(rng, 500) + v6_addrs(rng, 500)]
    assert table.lookup_many(np.array(addrs)) == [table.get(a) for a in addrs]


def test_lookup_many_sees_the_latest_updates(rng):
    t = fibre.Table()
    arr = np.array([int(ipaddress.IPv4Address("10.1.2.3"))], dtype=np.uint32)
    assert t.lookup_many(arr) == [None]
    t["10.0.0.0/8"] = "a"
    assert t.lookup_many(arr) == ["a"]
    t["10.1.0.0/16"] = "b"
    assert t.lookup_many(arr) == ["b"]
    t.delete("10.1.0.0/16")
    assert t.lookup_many(arr) == ["a"]
    t["10.1.0.0/16"] = "c"
    assert t.lookup_many(arr, ids=True)[0] >= 0
    assert t.lookup_many(arr) == ["c"]
