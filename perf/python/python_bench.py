#!/usr/bin/env python3
"""Python binding overhead: rdmaps.Client from Python vs the C++ call, same run.

Against servers in this process (tcp over loopback by default, or fake):
1. 1 KiB pull latency: client.pull(table, row, out) timed from Python,
   against Client::Pull called from C++ in a loop on the same client
   (client._c._cxx_timings: the GIL released, no binding in between).
   Rounds alternate between the two so machine noise hits both; the report
   is the median of each and their ratio (target <= 1.3x).
2. 4 MiB pull and push into / from a registered numpy array: the copy check
   (ClientStats bytes_staged must not grow: no extra copy) and the bandwidth
   of the Python call against the C++ call.

    PYTHONPATH=build/python /usr/bin/python3 perf/python/python_bench.py [--transport fake]

A benchmark, not a test: it prints a JSON report (and exits 1 only when the
4 MiB calls were staged, i.e. copied).
"""
import argparse
import json
import statistics
import time

import numpy as np

import rdmaps


def python_timings(fn, iters):
    out = np.empty(iters, np.int64)
    clock = time.perf_counter_ns
    for i in range(iters):
        t0 = clock()
        fn()
        out[i] = clock() - t0
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--transport", default="tcp")
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--iters", type=int, default=2000, help="1 KiB calls per round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--big-iters", type=int, default=50, help="4 MiB calls per round")
    args = p.parse_args()

    tables = [rdmaps.Table(0, "small", rows=1024, dim=256, layout="inline"),  # 1 KiB rows
              rdmaps.Table(1, "big", rows=1024, dim=1024, layout="dense",  # 4 MiB in all
                           optimizer=rdmaps.Optimizer("sgd", lr=1e-30))]
    report = {"transport": args.transport, "servers": args.servers}
    with rdmaps.local_cluster(tables, servers=args.servers, transport=args.transport) as cl, \
            cl.connect(staging_bytes=8 << 20) as client:
        row = np.zeros((1, 256), np.float32)
        py_med, cxx_med = [], []
        for _ in range(args.rounds):
            cxx = client._c._cxx_timings("small", 7, 1, args.iters, row, False)
            py = python_timings(lambda: client.pull("small", 7, row), args.iters)
            cxx_med.append(float(np.median(cxx)) / 1e3)
            py_med.append(float(np.median(py)) / 1e3)
        report["pull_1KiB_us"] = {"python": round(statistics.median(py_med), 2),
                                  "cxx": round(statistics.median(cxx_med), 2),
                                  "ratio": round(statistics.median(py_med) /
                                                 statistics.median(cxx_med), 3),
                                  "rounds_python": [round(x, 2) for x in py_med],
                                  "rounds_cxx": [round(x, 2) for x in cxx_med]}

        big = client.register(np.zeros((1024, 1024), np.float32))
        gbs = lambda ns: 4 * 2**20 / (float(np.median(ns)) * 1e-9) / 2**30  # noqa: E731
        res = {}
        for op, push in (("pull", False), ("push", True)):
            fn = ((lambda: client.push("big", slice(None), big)) if push
                  else (lambda: client.pull("big", slice(None), big)))
            py_r, cxx_r = [], []
            staged0 = client.stats()["bytes_staged"]
            for _ in range(max(1, args.rounds // 2)):
                cxx_r.append(gbs(client._c._cxx_timings("big", 0, 1024, args.big_iters, big,
                                                        push)))
                py_r.append(gbs(python_timings(fn, args.big_iters)))
            staged = client.stats()["bytes_staged"] - staged0
            res[op] = {"python_GiB_s": round(statistics.median(py_r), 3),
                       "cxx_GiB_s": round(statistics.median(cxx_r), 3),
                       "ratio": round(statistics.median(py_r) / statistics.median(cxx_r), 3),
                       "bytes_staged": staged}
        report["4MiB_registered"] = res
    print(json.dumps(report, indent=1))
    if any(v["bytes_staged"] for v in report["4MiB_registered"].values()):
        raise SystemExit("4 MiB calls on registered memory were staged (copied)")


if __name__ == "__main__":
    main()
