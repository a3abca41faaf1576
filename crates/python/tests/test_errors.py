"""Bad input: a Python exception with a message naming the bad key, never a crash; where
pytricia raises, fibre raises the same type."""

import ipaddress

import pytest
import pytricia

import fibre

# Keys both libraries refuse with ValueError.
BAD_FOR_BOTH = ["x", "10.0.0", "1.2.3.4.5", "10.0.0.256/8", "2001:db8:::/32", "::g/64", b"123", b"", 1.5, None, [1, 2]]

# Keys pytricia takes by guessing (a length past the width becomes the width, a length
# that is not a number becomes /0) and fibre refuses, naming them.
STRICT_IN_FIBRE = ["10.0.0.0/33", "10.0.0.0/x", "10.0.0.0/", "::/129", "2001:db8::/-1", " 10.0.0.0/8", -1, 2**32, ("ab", 8)]


def methods(t):
    return [
        lambda k: t[k],
        lambda k: t.get(k),
        lambda k: t.get_key(k),
        lambda k: k in t,
        lambda k: t.has_key(k),
        lambda k: t.__setitem__(k, 1),
        lambda k: t.insert(k, 1),
        lambda k: t.delete(k),
        lambda k: t.parent(k),
        lambda k: t.children(k),
        lambda k: t.lookup_many([k]),
    ]


@pytest.mark.parametrize("key", BAD_FOR_BOTH, ids=repr)
def test_keys_both_refuse_raise_value_error(key):
    ref = pytricia.PyTricia(128)
    with pytest.raises(ValueError):
        ref.get(key)
    t = fibre.Table()
    t["10.0.0.0/8"] = "a"
    for call in methods(t):
        with pytest.raises(ValueError) as e:
            call(key)
        assert str(e.value), "a message"
    assert len(t) == 1 and t["10.1.1.1"] == "a"


@pytest.mark.parametrize("key", STRICT_IN_FIBRE, ids=repr)
def test_fibre_refuses_what_pytricia_guesses_and_names_it(key):
    t = fibre.Table()
    for call in methods(t):
        with pytest.raises(ValueError) as e:
            call(key)
        shown = key if isinstance(key, str) else repr(key)
        assert shown.strip() in str(e.value), str(e.value)
    assert len(t) == 0


def test_a_bad_prefix_is_named_in_the_message():
    t = fibre.Table()
    with pytest.raises(ValueError, match=r'"10\.0\.0\.0/33".*longer than 32'):
        t["10.0.0.0/33"] = 1
    with pytest.raises(ValueError, match="an int key is an IPv4 address"):
        t[2**40]
    with pytest.raises(ValueError, match="not float"):
        t.get(1.5)
    long_key = "1" * 10000
    with pytest.raises(ValueError) as e:
        t[long_key]
    assert len(str(e.value)) < 200, "a long key is quoted, not copied"


def test_insert_arguments_are_checked():
    t = fibre.Table()
    with pytest.raises(ValueError):
        t.insert("10.0.0.0/8")
    with pytest.raises(ValueError):
        t.insert("10.0.0.0", "8", 1)
    with pytest.raises(ValueError):
        t.insert("10.0.0.0", 33, 1)
    with pytest.raises(ValueError):
        t.insert(ipaddress.ip_address("::1"), 129, 1)
    t.insert("10.0.0.0", 8, "a")
    assert t.keys() == ["10.0.0.0/8"]


def test_lookup_many_refuses_bad_input():
    np = pytest.importorskip("numpy")
    t = fibre.Table()
    for bad in [
        np.zeros((3, 3), dtype=np.uint64),
        np.zeros((3, 5), dtype=np.uint8),
        np.array([-1], dtype=np.int64),
        np.array([2**32], dtype=np.uint64),
        ["10.0.0.1", "bad"],
        5,
    ]:
        with pytest.raises((ValueError, TypeError)):
            t.lookup_many(bad)
    with pytest.raises(ValueError, match="bad"):
        t.lookup_many(["10.0.0.1", "bad"])
