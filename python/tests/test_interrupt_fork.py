"""Ctrl-C during a long wait, and fork() after a client exists (DataLoader workers)."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import rdmaps
from conftest import ones, python_env, sgd_table, wait_until

# Worker 0 of two, two clocks ahead of worker 1 (a straggler the test holds
# at clock 0): its pulls of an SSP-1 table wait for worker 1, for up to
# wait_timeout = 60 s. SIGINT must raise KeyboardInterrupt at once AND cancel
# the C++ call: the client's next call runs at once (it would queue behind
# the interrupted pull for a minute otherwise), an interrupted future raises
# Cancelled, and once the straggler clocks a pull of the SSP table works.
INTERRUPTED_WORKER = textwrap.dedent("""
    import sys, threading, time, traceback, rdmaps
    client = rdmaps.connect(sys.argv[1].split(","), worker_id=0, num_workers=2,
                            clock_waits=False, wait_timeout=60)
    client.clock()
    client.clock()

    # Once the pull is really waiting inside the client and, with `entered`,
    # the main thread has reached the call that waits for it (a SIGINT before
    # that would land outside the try, e.g. inside Thread.start()).
    def report_waiting(waits, entered=None):
        def run():
            while client.stats()["pull_waits"] < waits or (entered and not entered.is_set()):
                time.sleep(0.01)
            print("waiting", flush=True)
        threading.Thread(target=run, daemon=True).start()

    def where():
        return traceback.extract_tb(sys.exc_info()[2])[-1].name

    report_waiting(1)
    try:
        client.pull("ssp", 0)
        print("not interrupted", flush=True)
    except KeyboardInterrupt:
        print("interrupted in", where(), flush=True)
    start = time.monotonic()
    value = float(client.pull("w", 3)[0, 0])  # ASP: no wait
    print("usable %.1f after %.2f s" % (value, time.monotonic() - start), flush=True)

    future = client.pull_async("ssp", 1)
    entered = threading.Event()
    report_waiting(2, entered)
    try:
        entered.set()
        future.result()
        print("not interrupted", flush=True)
    except KeyboardInterrupt:
        print("interrupted in", where(), flush=True)
    try:
        future.result(timeout=5)
        print("not cancelled", flush=True)
    except rdmaps.Cancelled as e:
        print("future cancelled", "interrupted" in str(e), flush=True)

    print("ready", flush=True)  # the test lets worker 1 clock now
    sys.stdin.readline()
    print("pulled", float(client.pull("ssp", 0)[0, 0]), flush=True)
    client.close()
    print("closed", flush=True)
""")


def test_ctrl_c_cancels_a_long_wait_and_leaves_the_client_usable():
    tables = [sgd_table(0, "w", 10, 4), sgd_table(1, "ssp", 4, 4, staleness=1)]
    with rdmaps.local_cluster(tables, servers=1, workers=2) as cl, \
            cl.connect(1, clock_waits=False) as straggler:
        proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_WORKER, ",".join(cl.addresses)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=python_env())
        try:
            def interrupt():
                assert proc.stdout.readline() == "waiting\n"
                sent = time.monotonic()
                proc.send_signal(signal.SIGINT)
                line = proc.stdout.readline()
                # Within a signal slice and the cancellation's first polls;
                # far below the 60 s wait_timeout (and the 2 s grace after
                # which KeyboardInterrupt would come without a cancel).
                assert time.monotonic() - sent < 1.5, line
                return line

            assert interrupt() == "interrupted in pull\n"
            usable = proc.stdout.readline().split()
            assert usable[:2] == ["usable", "1.0"] and float(usable[3]) < 1.0, usable
            assert interrupt().startswith("interrupted in ")  # future.result()
            assert proc.stdout.readline() == "future cancelled True\n"
            assert proc.stdout.readline() == "ready\n"
            straggler.clock()
            proc.stdin.write("go\n")
            proc.stdin.flush()
            out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            proc.wait()
        assert out.splitlines() == ["pulled 1.0", "closed"], (out, err)
        assert proc.returncode == 0, err
        wait_until(lambda: cl.servers[0].stats()["workers_done"] == 1)  # the goodbye arrived


def test_forked_child_cannot_use_or_close_the_parents_client(cluster):
    client = cluster.connect()
    buf = client.register(np.zeros((512, 256), np.float32))
    client.pull("big", slice(None), buf)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then exit through the interpreter's normal exit
        code = 0
        try:
            buf[:] = 42.0  # its own copy of the pages
            try:
                client.pull("w", 0)
                code = 10  # it must not have worked
            except rdmaps.FailedPrecondition as e:
                code = 0 if "fork" in str(e) else 11
            client.close()  # refused too: it must not send the parent's goodbye
            code = 12
        except rdmaps.FailedPrecondition:
            pass
        except BaseException:  # noqa: BLE001
            code = 13
        os.write(w, bytes([code]))
        del client  # destroying it in the child touches nothing
        import gc
        gc.collect()
        os.write(w, b"!")
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        report = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert report == b"\x00!", report
    # The parent's memory and connections are untouched.
    np.testing.assert_array_equal(buf, 1.0)
    assert sum(s.stats()["workers_done"] for s in cluster.servers) == 0
    client.push("big", slice(None), ones(512, 256, 0.5))
    client.pull("big", slice(None), buf)
    np.testing.assert_array_equal(buf, 0.5)
    assert client.stats()["bytes_staged"] == 512 * 256 * 4 * 1  # only the unregistered push
    client.close()
    wait_until(lambda: sum(s.stats()["workers_done"] for s in cluster.servers) == 2)


def test_forked_child_exiting_normally_does_not_say_goodbye(cluster):
    client = cluster.connect()
    # A child that lets the interpreter finalise (atexit handlers, object
    # destruction), as multiprocessing's children may.
    code = subprocess.run(
        [sys.executable, "-c", textwrap.dedent("""
            import os, sys, rdmaps
            c = rdmaps.connect(sys.argv[1].split(","))
            pid = os.fork()
            if pid == 0:
                sys.exit(0)  # atexit closes live clients: must skip the parent's
            _, st = os.waitpid(pid, 0)
            print(os.waitstatus_to_exitcode(st), c.pull("w", 0)[0, 0], flush=True)
        """), ",".join(cluster.addresses)],
        capture_output=True, text=True, env=python_env(), timeout=60)
    assert code.returncode == 0, code.stderr
    assert code.stdout.split() == ["0", "1.0"], (code.stdout, code.stderr)
    client.close()


def test_dataloader_workers_fork_while_a_client_is_registered(cluster):
    torch = pytest.importorskip("torch")
    client = cluster.connect()
    weights = torch.zeros(512, 256)
    client.register(weights)

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.full((4,), float(i))

    loader = torch.utils.data.DataLoader(Data(), batch_size=2, num_workers=2)
    for step, batch in enumerate(loader):
        client.push("big", slice(0, 2), torch.full((2, 256), float(batch[0, 0])))
        client.pull("big", slice(None), weights)
    # Pushed gradients 0 + 2 + 4 + 6 onto rows 0..1, starting from 1.
    assert torch.equal(weights[0], torch.full((256,), -11.0))
    assert torch.equal(weights[2], torch.full((256,), 1.0))
    assert sum(s.stats()["workers_done"] for s in cluster.servers) == 0
    client.close()
