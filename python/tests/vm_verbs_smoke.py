#!/usr/bin/env python3
"""Smoke test of the Python binding on verbs, run inside the Soft-RoCE VM.

tests/vm/CMakeLists.txt lists it among the VM's commands when the package is
built: a server and a worker in this process on the rxe device's address
(RDMAPS_TEST_VERBS_ADDR), a pull into and a push from registered memory
(zero-copy: nothing staged), then a fork (the child is refused, the parent's
memory region and connection keep working). Exit 0 on success; no torch (its
import takes minutes under the VM's emulated CPU).
"""
import ctypes
import os
import sys

import numpy as np

import rdmaps


def check(cond, what):
    if not cond:
        print("vm_verbs_smoke: FAILED:", what, flush=True)
        sys.exit(1)


def page_aligned(rows, cols):
    """A float32 array made of whole pages: registered memory on verbs must not
    share a page with anything else, or rdma-core's fork protection
    (MADV_DONTFORK of the registered pages) takes those neighbours away from
    a forked child (docs/python.md, "fork")."""
    n = rows * cols
    raw = np.zeros(n + 4096 // 4, np.float32)
    off = (-raw.ctypes.data % 4096) // 4
    return raw[off:off + n].reshape(rows, cols)


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
        buf = client.register(page_aligned(64, 256))
        grads = page_aligned(64, 256)
        grads[:] = 0.5
        client.register(grads)
        client.push("w", slice(None), grads)
        client.pull("w", slice(None), buf)
        check(np.all(buf == 0.5), "pulled values land in the registered array")
        check(client.stats()["bytes_staged"] == 0, "registered pull and push copy nothing")
        pid = os.fork()
        if pid == 0:
            try:
                client.pull("w", 0)
                os._exit(2)
            except rdmaps.FailedPrecondition:
                os._exit(0)
            except BaseException as e:  # say what it was instead
                print(f"vm_verbs_smoke: the forked child got {type(e).__name__}: {e}", flush=True)
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        check(os.waitstatus_to_exitcode(status) == 0,
              f"the forked child is refused (exit {os.waitstatus_to_exitcode(status)})")
        client.push("w", slice(None), grads)
        client.pull("w", slice(None), buf)
        check(np.all(buf == 0.0), "the parent's memory region works after the fork")
        client.close()
    print("vm_verbs_smoke: OK (verbs, zero-copy, fork)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
