"""fibre beside pytricia and py-radix from Python, on the full real tables in data/.

For each library, on one table holding IPv4 and IPv6 (two pytricia trees, one per
family, since one tree aliases the families): the build time, the memory the process
grew by while building (resident set size, the Python values included), single lookups
from Python (a loop of ``get`` on text addresses, the way flow annotators call them), and
for fibre ``lookup_many`` on a NumPy array of addresses (IPv4 as uint32, IPv6 as (n, 2)
uint64), answering values and answering ids. pytricia and py-radix have no batched
lookup: their rate is the loop's. Each library is measured in a process of its own, so
that one's memory does not hide another's. Each lookup figure is the best of three
rounds.

    python crates/python/bench.py                       # the full tables, 1M addresses
    python crates/python/bench.py --prefixes 10000 --addresses 50000   # a quick check

Addresses are drawn half inside the table's prefixes, half anywhere (IPv4) or under
2000::/3 (IPv6), the same for every library (a fixed seed). The figures are printed as a
table and, with --json, written to a file.
"""

import argparse
import gc
import gzip
import ipaddress
import json
import multiprocessing
import os
import random
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data" / "ris-2026-05-11"
LIBRARIES = ["fibre", "pytricia", "py-radix"]


def rss():
    """The process's resident set size, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def read_prefixes(path, limit):
    with gzip.open(path, "rt") as f:
        out = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    if limit:
        out = random.Random(7).sample(out, min(limit, len(out)))
    return out


def draw_addresses(v4, v6, n):
    """n addresses, as text, by family: half inside prefixes of the table."""
    rng = random.Random(11)
    out = {4: [], 6: []}
    for fam, prefixes, count in ((4, v4, n * 4 // 5), (6, v6, n - n * 4 // 5)):
        for i in range(count):
            if i % 2:
                net = ipaddress.ip_network(rng.choice(prefixes))
                addr = int(net.network_address) + rng.getrandbits(net.max_prefixlen - net.prefixlen)
            elif fam == 4:
                addr = rng.getrandbits(32)
            else:
                addr = (0x2 << 124) | rng.getrandbits(125)
            out[fam].append(str(ipaddress.ip_address(addr) if fam == 6 else ipaddress.IPv4Address(addr)))
    return out


def timed(f):
    start = time.perf_counter()
    result = f()
    return result, time.perf_counter() - start


def best_of(f, rounds=3):
    """The result and the shortest time of a few rounds (the machine's load drifts)."""
    runs = [timed(f) for _ in range(rounds)]
    return runs[0][0], min(secs for _, secs in runs)


def build(library, v4, v6):
    """The library's table of both families, values the prefixes' positions; and a
    single-address lookup function per family."""
    if library == "fibre":
        import fibre

        t = fibre.Table.from_items((p, i) for ps in (v4, v6) for i, p in enumerate(ps))
        return t, {4: t.get, 6: t.get}
    if library == "pytricia":
        import pytricia

        trees = {4: pytricia.PyTricia(32), 6: pytricia.PyTricia(128)}
        for fam, ps in ((4, v4), (6, v6)):
            tree = trees[fam]
            for i, p in enumerate(ps):
                tree[p] = i
        return trees, {4: trees[4].get, 6: trees[6].get}
    import radix

    tree = radix.Radix()
    for ps in (v4, v6):
        for i, p in enumerate(ps):
            tree.add(p).data["v"] = i

    def get(addr, search=tree.search_best):
        node = search(addr)
        return None if node is None else node.data["v"]

    return tree, {4: get, 6: get}


def measure(library, args, queue):
    """Runs in a process of its own: one library's figures, put on the queue."""
    import numpy as np

    v4 = read_prefixes(args.v4, args.prefixes)
    v6 = read_prefixes(args.v6, args.prefixes and args.prefixes // 4)
    addrs = draw_addresses(v4, v6, args.addresses)
    gc.collect()
    before = rss()
    (table, get), build_s = timed(lambda: build(library, v4, v6))
    gc.collect()
    figures = {
        "library": library,
        "prefixes": len(v4) + len(v6),
        "build_s": build_s,
        "memory_mib": (rss() - before) / 2**20,
    }
    answers = {}
    for fam in (4, 6):
        a = addrs[fam][: args.single]
        lookup = get[fam]
        found, secs = best_of(lambda: [lookup(x) for x in a])
        figures[f"single_v{fam}_ns"] = secs / len(a) * 1e9
        answers[fam] = found
    if library == "fibre":
        figures["table_memory_mib"] = table.memory()["total"] / 2**20
        arr4 = np.array([int(ipaddress.IPv4Address(x)) for x in addrs[4]], dtype=np.uint32)
        sixes = [int(ipaddress.IPv6Address(x)) for x in addrs[6]]
        arr6 = np.array([[x >> 64, x & (2**64 - 1)] for x in sixes], dtype=np.uint64)
        for name, arr in (("v4", arr4), ("v6", arr6)):
            table.lookup_many(arr[:1000])  # warm
            values, secs = best_of(lambda: table.lookup_many(arr))
            figures[f"many_{name}_ns"] = secs / len(arr) * 1e9
            _, secs = best_of(lambda: table.lookup_many(arr, ids=True))
            figures[f"many_ids_{name}_ns"] = secs / len(arr) * 1e9
            fam = 4 if name == "v4" else 6
            n = min(args.single, len(arr))
            assert values[:n] == answers[fam][:n], "lookup_many and get disagree"
    figures["checksum"] = sum(-1 if x is None else x for fam in (4, 6) for x in answers[fam])
    queue.put(figures)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--v4", default=DATA / "rib-v4.txt.gz", type=Path)
    parser.add_argument("--v6", default=DATA / "rib-v6.txt.gz", type=Path)
    parser.add_argument("--prefixes", type=int, default=0, help="a random sample of this many IPv4 prefixes (and a quarter as many IPv6), 0 for all")
    parser.add_argument("--addresses", type=int, default=1_000_000, help="addresses for lookup_many (4/5 IPv4)")
    parser.add_argument("--single", type=int, default=200_000, help="addresses per family for single lookups")
    parser.add_argument("--libraries", default=",".join(LIBRARIES))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    results = []
    for library in args.libraries.split(","):
        queue = multiprocessing.Queue()
        p = multiprocessing.Process(target=measure, args=(library, args, queue))
        p.start()
        figures = queue.get()
        p.join()
        results.append(figures)
    checksums = {r["checksum"] for r in results}
    if len(checksums) != 1:
        sys.exit("the libraries answered differently: " + ", ".join(f"{r['library']} {r['checksum']}" for r in results))
    print(f"{results[0]['prefixes']} prefixes; {args.addresses} addresses for lookup_many, {args.single} a family for single lookups")
    print(f"{'library':10} {'build s':>8} {'RSS MiB':>8} {'get v4 ns':>10} {'get v6 ns':>10} {'many v4 ns':>11} {'many v6 ns':>11} {'ids v4 ns':>10} {'ids v6 ns':>10}")
    dash = "-"
    for r in results:
        many = [f"{r[k]:.1f}" if k in r else dash for k in ("many_v4_ns", "many_v6_ns", "many_ids_v4_ns", "many_ids_v6_ns")]
        print(f"{r['library']:10} {r['build_s']:8.2f} {r['memory_mib']:8.1f} {r['single_v4_ns']:10.0f} {r['single_v6_ns']:10.0f} {many[0]:>11} {many[1]:>11} {many[2]:>10} {many[3]:>10}")
    base = {r["library"]: r for r in results}
    if "fibre" in base and "pytricia" in base:
        f, p = base["fibre"], base["pytricia"]
        print(
            f"fibre against pytricia: lookup_many {p['single_v4_ns'] / f['many_v4_ns']:.0f}x (IPv4), "
            f"{p['single_v6_ns'] / f['many_v6_ns']:.0f}x (IPv6) its rate a lookup; "
            f"single lookups {p['single_v4_ns'] / f['single_v4_ns']:.1f}x (IPv4), {p['single_v6_ns'] / f['single_v6_ns']:.1f}x (IPv6)"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
