"""Reads on other threads while one thread updates: lookup_many runs with the interpreter
released, against one published version of the table, while the main thread inserts and
deletes; every answer must be a prefix that holds its address."""

import ipaddress
import threading

import numpy as np

import fibre


def test_batches_on_threads_see_consistent_versions_while_the_table_changes(rng):
    t = fibre.Table()
    base = [ipaddress.ip_network(f"10.{i}.0.0/16") for i in range(256)]
    for net in base:
        t[net] = str(net)
    # The prefixes the writer adds and removes: each value is its own prefix, so an
    # answer from an entry reused for another prefix would not hold its address.
    churn = [ipaddress.ip_network(f"10.{i}.{j}.0/24") for i in range(256) for j in range(0, 256, 17)]
    addrs = np.array([0x0A000000 | rng.getrandbits(24) for _ in range(20000)], dtype=np.uint32)
    wrong, errors, rounds = [], [], [0]
    stop = threading.Event()

    def reader():
        try:
            while not stop.is_set():
                for a, v in zip(addrs[:2000], t.lookup_many(addrs)[:2000]):
                    net = ipaddress.ip_network(v)
                    if ipaddress.IPv4Address(int(a)) not in net:
                        wrong.append((int(a), v))
                ids = t.lookup_many(addrs, ids=True)
                if (ids < 0).any():
                    wrong.append("an address under 10.0.0.0/8 unanswered")
                rounds[0] += 1
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for th in threads:
        th.start()
    updates = inserts = 0
    while updates < 20000 and not errors and (rounds[0] < 20 or updates < 2000):
        net = churn[rng.randrange(len(churn))]
        if t.has_key(net):
            t.delete(net)
        else:
            t[net] = str(net)
            inserts += 1
        updates += 1
    stop.set()
    for th in threads:
        th.join()
    assert not errors, errors
    assert not wrong, wrong[:5]
    assert rounds[0] >= 2, "the readers ran"
    assert len(t) == 256 + sum(1 for n in churn if t.has_key(n))
    # Entries were reused as batches ended: the slab did not grow with every insert.
    slab = len(t.values_by_id())
    assert slab < 256 + inserts, (slab, inserts)
    # With no batch running, every removed entry is free again.
    for net in churn:
        if t.has_key(net):
            t.delete(net)
    for net in churn:
        t[net] = str(net)
    assert len(t.values_by_id()) == max(slab, 256 + len(churn))
