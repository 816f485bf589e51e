"""Ctrl-C during a long wait, and fork() after a client exists (DataLoader workers)."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rdmaps
from conftest import ones, python_env, wait_until

# A worker whose BSP pull waits for a worker that never clocks, for up to
# wait_timeout = 6 s; SIGINT must end the wait at once. The interrupted pull
# goes on in the background until its deadline; the client's next call runs
# after it and works, and close() says goodbye.
INTERRUPTED_WORKER = textwrap.dedent("""
    import sys, threading, time, traceback, numpy as np, rdmaps
    client = rdmaps.connect(sys.argv[1].split(","), worker_id=0, num_workers=2,
                            clock_waits=False, wait_timeout=6)
    client.clock()

    def report_waiting():  # once the pull is really waiting inside the client
        while client.stats()["pull_waits"] == 0:
            time.sleep(0.01)
        print("waiting", flush=True)

    threading.Thread(target=report_waiting, daemon=True).start()
    start = time.monotonic()
    try:
        client.pull("bsp", 0)
        print("not interrupted")
    except KeyboardInterrupt:
        frames = [f.name for f in traceback.extract_tb(sys.exc_info()[2])]
        print("interrupted after %.1f s in %s" % (time.monotonic() - start, frames[-1]),
              flush=True)
    # Still usable: an ASP table does not wait.
    print("usable", float(client.pull("w", 3)[0, 0]), flush=True)
    client.close()
    print("closed", flush=True)
""")


def test_ctrl_c_interrupts_a_long_wait_and_leaves_the_client_usable(tables):
    with rdmaps.local_cluster(tables, servers=1, workers=2) as cl:
        proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_WORKER, ",".join(cl.addresses)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=python_env())
        try:
            assert proc.stdout.readline() == "waiting\n"
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            proc.wait()
        lines = out.splitlines()
        assert lines[0].startswith("interrupted after "), (out, err)
        # Well before the 6 s wait_timeout, and inside the pull itself.
        assert float(lines[0].split()[2]) < 3 and lines[0].endswith(" in pull"), out
        assert lines[1:] == ["usable 1.0", "closed"], (out, err)
        assert proc.returncode == 0
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
