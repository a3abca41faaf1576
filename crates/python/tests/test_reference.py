"""fibre.Table held to pytricia on random tables: every method, both families, every key
type, after inserts, replaces and deletes."""

import ipaddress

import pytest

import fibre
from conftest import Reference, random_v4_addr, random_v4_prefix, random_v6_addr, random_v6_prefix


def prefix_forms(net):
    """The forms a prefix key takes in both libraries."""
    return [str(net), net, (net.network_address.packed, net.prefixlen)]


def address_forms(addr):
    """The forms an address key takes in both libraries."""
    forms = [str(addr), addr, addr.packed]
    if addr.version == 4:
        forms.append(int(addr))
    return forms


def outcome(call, *args):
    """What a call answers, or the type of exception it raises."""
    try:
        return ("ok", call(*args))
    except Exception as e:  # the type is what is compared
        return ("raised", type(e))


def build(rng, n):
    """A random table of n prefixes per family, some replaced and some deleted, with the
    same operations applied to the reference; also the prefixes deleted."""
    t, ref = fibre.Table(), Reference()
    nets = [random_v4_prefix(rng) for _ in range(n)] + [random_v6_prefix(rng) for _ in range(n)]
    rng.shuffle(nets)
    for i, net in enumerate(nets):
        key = rng.choice(prefix_forms(net))
        value = ("value", i)
        if rng.random() < 0.5:
            t[key] = value
        else:
            t.insert(key, value)
        ref[str(net)] = value
    deleted = []
    for net in rng.sample(nets, n // 2):
        if ref.has_key(str(net)):
            key = rng.choice(prefix_forms(net))
            if rng.random() < 0.5:
                del t[key]
            else:
                t.delete(key)
            del ref[str(net)]
            deleted.append(net)
    return t, ref, nets, deleted


@pytest.mark.parametrize("n", [0, 1, 20, 1500])
def test_keys_iteration_and_len_match_pytricia(rng, n):
    t, ref, _, _ = build(rng, n)
    assert len(t) == len(ref)
    assert t.keys() == ref.keys()
    assert list(t) == ref.keys()
    assert [k for k, _ in t.items()] == ref.keys()
    assert all(v == ref.get(k) for k, v in t.items())


def test_lookups_of_addresses_match_pytricia_in_every_key_form(rng):
    t, ref, _, _ = build(rng, 1500)
    checked = 0
    for _ in range(4000):
        addr = random_v4_addr(rng) if rng.random() < 0.5 else random_v6_addr(rng)
        for key in address_forms(addr):
            assert outcome(t.__getitem__, key) == outcome(ref.__getitem__, key), key
            assert t.get(key) == ref.get(key), key
            assert t.get(key, "miss") == ref.get(key, "miss"), key
            assert t.get_key(key) == ref.get_key(key), key
            assert (key in t) == (key in ref), key
            assert t.has_key(key) == ref.has_key(key), key
            checked += ref.get_key(key) is not None
    assert checked > 1000, "most addresses should fall in the crowded regions"


def test_lookups_of_prefixes_match_pytricia(rng):
    """A prefix is answered by the longest prefix holding all of it, as pytricia does."""
    t, ref, nets, deleted = build(rng, 1500)
    queries = [random_v4_prefix(rng) for _ in range(1500)] + [random_v6_prefix(rng) for _ in range(1500)]
    queries += nets + deleted
    for net in queries:
        for key in prefix_forms(net):
            assert t.get(key, "miss") == ref.get(key, "miss"), key
            assert t.get_key(key) == ref.get_key(key), key
            assert (key in t) == (key in ref), key
            assert t.has_key(key) == ref.has_key(key), key
            assert outcome(t.__getitem__, key) == outcome(ref.__getitem__, key), key
    # Host bits are ignored as pytricia ignores them in lookups.
    for net in nets[:200]:
        if net.prefixlen not in (0, net.max_prefixlen):
            key = f"{net.network_address + 1}/{net.prefixlen}"
            assert t.get_key(key) == ref.get_key(key), key


def test_parent_and_children_match_pytricia(rng):
    t, ref, nets, deleted = build(rng, 1500)
    for net in nets + deleted:
        key = rng.choice(prefix_forms(net))
        assert outcome(t.parent, key) == outcome(ref.parent, key), key
        assert outcome(t.children, key) == outcome(ref.children, key), key
    present = [n for n in nets if ref.has_key(str(n))]
    assert sum(1 for n in present if t.children(str(n))) > 20, "the table should nest"
    assert sum(1 for n in present if t.parent(str(n))) > 20, "the table should nest"


def test_missing_prefixes_raise_key_error_as_in_pytricia(rng):
    t, ref, _, deleted = build(rng, 200)
    assert deleted
    for net in deleted[:50]:
        for call in ("delete", "parent", "children"):
            with pytest.raises(KeyError):
                getattr(t, call)(str(net))
            with pytest.raises(KeyError):
                getattr(ref, call)(str(net))
        with pytest.raises(KeyError):
            del t[str(net)]
    empty = fibre.Table()
    with pytest.raises(KeyError):
        empty["10.0.0.1"]
    assert empty.get("10.0.0.1") is None
    assert empty.get_key("::1") is None


def test_insert_with_an_address_and_a_length_matches_pytricia(rng):
    t, ref = fibre.Table(), Reference()
    for i in range(500):
        net = random_v4_prefix(rng) if i % 2 else random_v6_prefix(rng)
        addr = net.network_address + (rng.getrandbits(8) if net.prefixlen < net.max_prefixlen - 8 else 0)
        key = rng.choice([str(addr), addr, addr.packed])
        t.insert(key, net.prefixlen, i)
        ref.tree(key).insert(key, net.prefixlen, i)
    # pytricia keeps the host bits of the first key given; fibre clears them.
    assert t.keys() == [str(ipaddress.ip_network(k, strict=False)) for k in ref.keys()]
    for _ in range(2000):
        a = random_v4_addr(rng) if rng.random() < 0.5 else random_v6_addr(rng)
        assert t.get(str(a)) == ref.get(str(a))


def test_families_do_not_alias():
    """pytricia's one tree lets 32.0.0.1 match 2000::/8; fibre keeps the families apart."""
    import pytricia

    one_tree = pytricia.PyTricia(128)
    one_tree["2000::/8"] = "v6"
    assert one_tree.get_key("32.0.0.1") == "2000::/8", "pytricia aliases"
    t = fibre.Table(128)
    t["2000::/8"] = "v6"
    assert t.get_key("32.0.0.1") is None
    assert "32.0.0.1" not in t
    t["32.0.0.0/8"] = "v4"
    assert t["32.0.0.1"] == "v4"
    assert t["2000::1"] == "v6"
    assert t.keys() == ["32.0.0.0/8", "2000::/8"]
    t["0.0.0.0/0"] = "all v4"
    assert t.get("::1") is None
    assert t.get(b"\0" * 16) is None
    assert t.get(b"\0" * 4) == "all v4"


def test_values_are_any_object_kept_by_identity_and_released_on_delete():
    import gc
    import weakref

    class Value:
        pass

    t = fibre.Table()
    v = Value()
    t["192.0.2.0/24"] = v
    assert t["192.0.2.7"] is v
    assert t.lookup_many(["192.0.2.7"])[0] is v
    gone = weakref.ref(v)
    del v
    gc.collect()
    assert gone() is not None, "the table holds its value"
    t.delete("192.0.2.0/24")
    gc.collect()
    assert gone() is None, "a deleted prefix's value is released"
    replaced = Value()
    t["192.0.2.0/24"] = replaced
    gone = weakref.ref(replaced)
    del replaced
    t["192.0.2.0/24"] = None
    gc.collect()
    assert gone() is None, "a replaced value is released"
    assert t["192.0.2.1"] is None and len(t) == 1


def test_pytricia_constructor_arguments_and_no_ops():
    assert len(fibre.Table()) == len(fibre.Table(32)) == len(fibre.Table(128, 10)) == 0
    with pytest.raises(ValueError):
        fibre.Table(129)
    with pytest.raises(ValueError):
        fibre.Table(32, 2, True)
    t = fibre.Table()
    t["10.0.0.0/8"] = 1
    t.freeze()
    t["10.1.0.0/16"] = 2
    t.thaw()
    assert t["10.1.0.1"] == 2
    assert "2 IPv4" in repr(t)


def test_a_cycle_through_a_table_is_collected():
    import gc
    import weakref

    class Node:
        pass

    t = fibre.Table()
    node = Node()
    node.table = t
    t["10.0.0.0/8"] = node
    gone = weakref.ref(node)
    del node, t
    gc.collect()
    assert gone() is None, "the cycle collector sees the table's values"


def test_a_table_pickles_with_its_prefixes_and_values(rng):
    import pickle

    t, ref, _, _ = build(rng, 300)
    copy = pickle.loads(pickle.dumps(t))
    assert copy.items() == t.items() and len(copy) == len(ref)
    copy["10.0.0.0/8"] = "only in the copy"
    assert t.get_key("10.0.0.1") != "10.0.0.0/8" or t["10.0.0.1"] != "only in the copy"
