"""Shared helpers of the Python tests: pytricia as the reference, one tree per family.

pytricia keeps IPv4 and IPv6 in one tree and lets them alias (an IPv4 address matches an
IPv6 prefix with the same leading bits), so the reference is two trees, a 32-bit one for
IPv4 and a 128-bit one for IPv6, and fibre's one table is held to both.
"""

import gzip
import ipaddress
import random
from pathlib import Path

import pytest
import pytricia

DATA = Path(__file__).resolve().parents[3] / "data" / "ris-2026-05-11"


def family(key):
    """4 or 6: the family of a key in any of the forms both libraries take."""
    if isinstance(key, str):
        return 6 if ":" in key else 4
    if isinstance(key, int):
        return 4
    if isinstance(key, bytes):
        return 4 if len(key) == 4 else 6
    if isinstance(key, tuple):
        return 4 if len(key[0]) == 4 else 6
    return key.version


class Reference:
    """Two pytricia trees behind one interface: what fibre.Table must answer."""

    def __init__(self):
        self.trees = {4: pytricia.PyTricia(32), 6: pytricia.PyTricia(128)}

    def tree(self, key):
        return self.trees[family(key)]

    def __setitem__(self, key, value):
        self.tree(key)[key] = value

    def __getitem__(self, key):
        return self.tree(key)[key]

    def __delitem__(self, key):
        del self.tree(key)[key]

    def __contains__(self, key):
        return key in self.tree(key)

    def __len__(self):
        return len(self.trees[4]) + len(self.trees[6])

    def delete(self, key):
        self.tree(key).delete(key)

    def get(self, key, default=None):
        return self.tree(key).get(key, default)

    def get_key(self, key):
        return self.tree(key).get_key(key)

    def has_key(self, key):
        return self.tree(key).has_key(key)

    def parent(self, key):
        return self.tree(key).parent(key)

    def children(self, key):
        return self.tree(key).children(key)

    def keys(self):
        return self.trees[4].keys() + self.trees[6].keys()


def random_v4_prefix(rng):
    """A prefix in a few crowded regions, so that prefixes nest."""
    base = rng.choice([0x0A000000, 0xC0A80000, 0x64400000, rng.getrandbits(32)])
    addr = base | rng.getrandbits(16)
    length = rng.choice([0, 1, 7, 8, 9] + list(range(12, 33)) * 2)
    return ipaddress.ip_network((addr, length), strict=False)


def random_v6_prefix(rng):
    """A prefix under a few documentation and global prefixes, so that prefixes nest."""
    base = rng.choice([0x20010DB8 << 96, 0x2A00 << 112, 0xFD00 << 112, (0x2000 << 112) | rng.getrandbits(100)])
    addr = base | rng.getrandbits(72)
    length = rng.choice([0, 1, 3, 16, 19, 29, 32, 33, 40, 47, 48, 56, 63, 64, 65, 96, 127, 128] + list(range(28, 66)))
    return ipaddress.ip_network((addr, length), strict=False)


def random_v4_addr(rng):
    base = rng.choice([0x0A000000, 0xC0A80000, 0x64400000, 0])
    return ipaddress.IPv4Address(base | rng.getrandbits(32 if base == 0 else 16))


def random_v6_addr(rng):
    base = rng.choice([0x20010DB8 << 96, 0x2A00 << 112, 0xFD00 << 112, 0x2000 << 112])
    return ipaddress.IPv6Address(base | rng.getrandbits(72 if base else 128))


def read_prefixes(name):
    """The prefixes of a route file of data/, as text."""
    with gzip.open(DATA / name, "rt") as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


@pytest.fixture
def rng():
    return random.Random(37)
