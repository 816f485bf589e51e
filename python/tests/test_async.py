"""Asynchronous calls: futures, order, deadlines, arrays kept alive."""
import gc
import weakref

import numpy as np
import pytest

import rdmaps
from conftest import ones


def test_async_calls_run_in_submission_order(client):
    futures = [client.push_async("w", 0, ones(1, 8, 0.5)) for _ in range(4)]
    pulled = client.pull_async("w", 0)
    assert all(f.result(timeout=10) is None for f in futures)
    np.testing.assert_array_equal(pulled.result(timeout=10), -1.0)  # 1 - 4 * 0.5
    assert pulled.done()


def test_clock_async_returns_the_new_clock(client):
    f = client.clock_async()
    assert f.result(timeout=10) == 1
    assert client.barrier_async().result(timeout=10) is None


def test_async_error_is_raised_by_result(two_workers):
    cl, _, _ = two_workers
    with cl.connect(0, clock_waits=False, wait_timeout=0.2) as c:
        c.clock()
        f = c.pull_async("bsp", 0)
        with pytest.raises(rdmaps.TimedOut, match="worker"):
            f.result()


def test_result_timeout_leaves_the_call_running(two_workers):
    _, a, b = two_workers
    a.clock()
    f = a.pull_async("bsp", slice(None))
    with pytest.raises(rdmaps.TimedOut, match="keeps running"):
        f.result(timeout=0.05)
    assert not f.done()
    b.clock()
    assert f.result(timeout=10).shape == (4, 4)


def test_dropped_future_keeps_its_arrays_alive_until_done(two_workers):
    _, a, b = two_workers
    a.clock()

    class Tracked(np.ndarray):
        pass

    out = np.zeros((4, 4), np.float32).view(Tracked)
    ref = weakref.ref(out)
    a.pull_async("bsp", slice(None), out)  # future dropped at once
    del out
    gc.collect()
    assert ref() is not None  # the pending pull still writes into it
    b.clock()
    a.pull("bsp", 0)  # runs after the dropped one: that one is done now
    gc.collect()
    assert ref() is None


def test_a_sync_call_does_not_overtake_queued_async_ones(client):
    futures = [client.push_async("w", 1, ones(1, 8, 0.25)) for _ in range(4)]
    # The sync pull of an ASP table may run on the caller's thread, but only
    # once nothing is queued before it.
    np.testing.assert_array_equal(client.pull("w", 1), 0.0)
    assert all(f.done() for f in futures)
