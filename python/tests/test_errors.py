"""Errors: one exception class per StatusCode, and bad arrays refused before anything is sent."""
import socket

import numpy as np
import pytest

import rdmaps
from conftest import ones

CODES = ["InvalidArgument", "NotFound", "AlreadyExists", "PermissionDenied", "OutOfRange",
         "TimedOut", "Unavailable", "Cancelled", "ResourceExhausted", "FailedPrecondition",
         "NotSupported", "IOError", "DataLoss", "Internal"]


def test_every_status_code_is_an_exception_class_under_rdmaps_error():
    for name in CODES:
        cls = getattr(rdmaps, name)
        assert issubclass(cls, rdmaps.Error) and cls.code == name and cls.__name__ == name
    assert issubclass(rdmaps.InvalidArgument, ValueError)
    assert issubclass(rdmaps.TimedOut, TimeoutError)
    assert issubclass(rdmaps.Unavailable, ConnectionError)
    assert issubclass(rdmaps.NotFound, LookupError)


def pushes_applied(cluster):
    return sum(s.stats()["pushes_applied"] for s in cluster.servers)


@pytest.mark.parametrize("grads, says", [
    (np.ones((2, 8), np.float64), "got float64 array of shape (2, 8)"),
    (np.ones((2, 7), np.float32), "got float32 array of shape (2, 7)"),
    (np.ones((3, 8), np.float32), "got float32 array of shape (3, 8)"),
    (np.ones(16, np.float32), "got float32 array of shape (16,)"),
    (np.ones((8, 2), np.float32).T, "got non-contiguous float32 array of shape (2, 8)"),
    (np.ones((2, 16), np.float32)[:, ::2], "got non-contiguous float32 array"),
    ([[1.0] * 8] * 2, "got a list"),
])
def test_bad_grads_are_refused_naming_what_was_expected(cluster, client, grads, says):
    with pytest.raises(rdmaps.InvalidArgument) as e:
        client.push("w", [0, 1], grads)
    msg = str(e.value)
    assert "float32" in msg and "(2, 8)" in msg and says in msg, msg
    assert client.stats()["pushes"] == 0  # refused before anything was sent
    client.clock()  # the clock marker follows any pushes that were sent
    client.pull("w", 0)
    assert pushes_applied(cluster) == 0


def test_read_only_or_wrong_out_is_refused(client):
    out = np.zeros((1, 8), np.float32)
    out.setflags(write=False)
    with pytest.raises(rdmaps.InvalidArgument, match="writable"):
        client.pull("w", 0, out)
    with pytest.raises(rdmaps.InvalidArgument, match=r"shape \(4, 8\)"):
        client.pull("w", slice(0, 4), np.zeros((4, 8), np.float16))
    assert client.stats()["pulls"] == 0


def test_torch_tensor_of_the_wrong_kind_is_refused(client):
    torch = pytest.importorskip("torch")
    with pytest.raises(rdmaps.InvalidArgument, match="float64"):
        client.push("w", 0, torch.ones(1, 8, dtype=torch.float64))
    with pytest.raises(rdmaps.InvalidArgument, match="non-contiguous"):
        client.push("w", [0, 1], torch.ones(8, 2).t())


@pytest.mark.parametrize("rows, cls, says", [
    (100, rdmaps.OutOfRange, "row 100 is out of range"),
    (-101, rdmaps.OutOfRange, "out of range"),
    ([1, -2], rdmaps.OutOfRange, "id -2 at position 1 is negative"),
    (range(90, 110), rdmaps.OutOfRange, "outside [0, 100)"),
    (slice(5, 5), rdmaps.InvalidArgument, "no rows"),
    ([], rdmaps.InvalidArgument, "empty"),
    (np.array([[1, 2]]), rdmaps.InvalidArgument, "1-D integer array"),
    (np.array([1.0, 2.0]), rdmaps.InvalidArgument, "1-D integer array"),
    ("3", rdmaps.InvalidArgument, "must be an int, a slice, a range or a 1-D integer array"),
    (True, rdmaps.InvalidArgument, "bool"),
])
def test_bad_rows_are_refused(client, rows, cls, says):
    with pytest.raises(cls, match=None) as e:
        client.pull("w", rows)
    assert says in str(e.value), str(e.value)
    assert "table 'w'" in str(e.value)


def test_ids_past_the_table_are_refused_by_the_client(client):
    with pytest.raises(rdmaps.InvalidArgument):
        client.pull("w", [3, 100])
    assert client.stats()["rows_pulled"] == 0


def test_unknown_tables(client):
    with pytest.raises(rdmaps.NotFound, match="the servers have: w, big, bsp"):
        client.pull("nope", 0)
    with pytest.raises(rdmaps.NotFound, match="id 9"):
        client.push(9, 0, ones(1, 8))
    with pytest.raises(rdmaps.InvalidArgument):
        client.pull(1.5, 0)


def test_bad_options_are_invalid_argument():
    with pytest.raises(rdmaps.InvalidArgument, match="staleness"):
        rdmaps.Table(0, "t", rows=1, dim=1, staleness="sometimes")
    with pytest.raises(rdmaps.InvalidArgument):
        rdmaps.Optimizer("rmsprop")
    with pytest.raises(rdmaps.InvalidArgument, match="connect_timeout"):
        rdmaps.connect(["127.0.0.1:0"], connect_timeout=-1)
    with pytest.raises(rdmaps.InvalidArgument):
        rdmaps.Server([rdmaps.Table(0, "t", rows=0, dim=1)])


def test_unreachable_server_fails_naming_it():
    # A port bound but not listening: the connection is refused, and no
    # other process can take the port meanwhile.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = "127.0.0.1:%d" % s.getsockname()[1]
        with pytest.raises((rdmaps.TimedOut, rdmaps.Unavailable)) as e:
            rdmaps.connect([address], connect_timeout=1.0)
    assert address in str(e.value)


def test_a_malformed_layout_is_invalid_argument():
    with pytest.raises(rdmaps.InvalidArgument):
        rdmaps.resolve_layout({"RDMAPS_ROLE": "worker", "RDMAPS_TASK_INDEX": "x",
                               "RDMAPS_PS_HOSTS": "h:1", "RDMAPS_NUM_WORKERS": "1"})


def test_bsp_wait_times_out_naming_the_lagging_worker(tables):
    with rdmaps.local_cluster(tables, servers=1, workers=2) as cl:
        a = cl.connect(0, clock_waits=False, wait_timeout=0.3)
        b = cl.connect(1, clock_waits=False)
        a.clock()
        with pytest.raises(rdmaps.TimedOut, match="worker 1") as e:
            a.pull("bsp", 0)
        assert isinstance(e.value, TimeoutError)
        b.close()
        a.close()
