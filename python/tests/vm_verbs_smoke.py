#!/usr/bin/env python3
"""Smoke test of the Python binding on verbs, run inside the Soft-RoCE VM.

tests/vm/CMakeLists.txt lists it among the VM's commands when the package is
built: a server and a worker in this process on the rxe device's address
(RDMAPS_TEST_VERBS_ADDR), a pull into and a push from registered memory
(zero-copy: nothing staged), a small heap array refused by register() (it
shares pages with other objects, which rdma-core's fork protection would
take from a child), then a fork (the child uses its heap, is refused the
client; the parent's memory region and connection keep working). Exit 0 on success; no torch (its
import takes minutes under the VM's emulated CPU).
"""
import ctypes
import gc
import os
import sys

import numpy as np

import rdmaps


def check(cond, what):
    if not cond:
        print("vm_verbs_smoke: FAILED:", what, flush=True)
        sys.exit(1)


def main():
    addr = os.environ.get("RDMAPS_TEST_VERBS_ADDR")
    if not addr:
        print("vm_verbs_smoke: RDMAPS_TEST_VERBS_ADDR is not set (run inside the VM)")
        return 77
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    check(libc.getenv(b"RDMAV_FORK_SAFE") == b"1", "the extension sets RDMAV_FORK_SAFE")
    table = rdmaps.Table(0, "w", rows=64, dim=256, layout="dense",
                         init=rdmaps.Initializer("constant", value=1.0),
                         optimizer=rdmaps.Optimizer("sgd", lr=1.0))
    with rdmaps.Server([table], f"{addr}:0", transport="verbs",
                       exit_when_workers_done=False) as server:
        client = rdmaps.connect([server.address], transport="verbs", wait_timeout=60,
                                job_token=server.job_token)
        # A small heap array shares its pages with other Python objects,
        # which rdma-core's fork protection would take from a forked child
        # with the registered pages (SIGSEGV): register() refuses it.
        heap = np.zeros((16, 256), np.float32)  # 16 KiB: malloc's heap, not its own mmap
        neighbours = [{"i": i, "s": str(i) * 8} for i in range(2000)]
        try:
            client.register(heap)
            check(False, "register() refuses a heap array that shares its pages")
        except rdmaps.InvalidArgument as e:
            check("rdmaps.zeros(shape)" in str(e) and "fork" in str(e),
                  f"the refusal says why and what to use instead: {e}")
        # rdmaps.zeros() arrays have pages of their own.
        buf = client.register(rdmaps.zeros((64, 256)))
        grads = client.register(rdmaps.zeros((64, 256)))
        grads[:] = 0.5
        client.push("w", slice(None), grads)
        client.pull("w", slice(None), buf)
        check(np.all(buf == 0.5), "pulled values land in the registered array")
        check(client.stats()["bytes_staged"] == 0, "registered pull and push copy nothing")
        pid = os.fork()
        if pid == 0:
            try:
                # The heap array and the objects around it are all there,
                # the allocator and the collector work on them.
                code = 0 if float(heap.sum()) == 0.0 else 4
                code = code or (0 if sum(d["i"] for d in neighbours) == 1999 * 1000 else 5)
                del neighbours[::2]
                more = [np.ones(1000, np.float32) * i for i in range(200)]
                gc.collect()
                code = code or (0 if float(more[-1][0]) == 199.0 else 6)
                try:
                    client.pull("w", 0)
                    code = code or 2
                except rdmaps.FailedPrecondition:
                    pass
                os._exit(code)
            except BaseException as e:  # say what it was instead
                print(f"vm_verbs_smoke: the forked child got {type(e).__name__}: {e}", flush=True)
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        check(os.waitstatus_to_exitcode(status) == 0,
              "the forked child keeps its heap and is refused the parent's client "
              f"(exit {os.waitstatus_to_exitcode(status)})")
        client.push("w", slice(None), grads)
        client.pull("w", slice(None), buf)
        check(np.all(buf == 0.0), "the parent's memory region works after the fork")
        client.close()
    print("vm_verbs_smoke: OK (verbs, zero-copy, fork)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
