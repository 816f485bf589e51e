"""Zero-copy: pulls into and pushes from registered memory copy nothing."""
import numpy as np
import pytest

import rdmaps
from conftest import ones


def staged(client):
    return client.stats()["bytes_staged"]


def test_pull_into_registered_numpy_lands_in_place_unstaged(client):
    buf = client.register(np.zeros((512, 256), np.float32))
    client.push("big", slice(None), np.full((512, 256), 0.5, np.float32))
    before, calls = staged(client), client.stats()["zero_copy_calls"]
    out = client.pull("big", slice(None), buf)
    assert out is buf
    np.testing.assert_array_equal(buf, 0.5)  # the caller's memory holds the rows
    assert staged(client) == before  # nothing copied
    assert client.stats()["zero_copy_calls"] == calls + 1
    # A view inside the registered array is zero-copy too.
    client.pull("big", slice(100, 110), buf[200:210])
    assert staged(client) == before


def test_push_from_registered_memory_is_unstaged(client):
    grads = client.register(np.full((512, 256), 0.25, np.float32))
    before = staged(client)
    client.push("big", slice(None), grads)
    assert staged(client) == before
    np.testing.assert_array_equal(client.pull("big", slice(0, 2)), 0.75)


def test_unregistered_memory_is_staged_and_unregister_restores_that(client):
    buf = np.zeros((512, 256), np.float32)
    client.pull("big", slice(None), buf)
    assert staged(client) >= buf.nbytes
    client.register(buf)
    s = staged(client)
    client.pull("big", slice(None), buf)
    assert staged(client) == s
    client.unregister(buf)
    client.pull("big", slice(None), buf)
    assert staged(client) >= s + buf.nbytes
    with pytest.raises(rdmaps.NotFound):
        client.unregister(buf)


def test_registered_torch_tensor_is_zero_copy(client):
    torch = pytest.importorskip("torch")
    t = torch.zeros(512, 256)
    client.register(t)
    before = staged(client)
    client.push("big", slice(None), torch.full((512, 256), 2.0))  # staged: not registered
    mid = staged(client)
    assert mid > before
    client.pull("big", slice(None), t)
    assert staged(client) == mid
    assert torch.equal(t, torch.full((512, 256), -1.0))


def test_register_refuses_what_it_cannot_pin(client):
    with pytest.raises(rdmaps.InvalidArgument, match="float32"):
        client.register(np.zeros(10, np.float64))
    with pytest.raises(rdmaps.InvalidArgument, match="C-contiguous"):
        client.register(np.zeros((10, 10), np.float32)[:, ::2])
    buf = np.zeros(100, np.float32)
    client.register(buf)
    with pytest.raises(rdmaps.InvalidArgument):
        client.register(buf[10:20])  # overlaps


def test_registered_array_is_kept_alive_by_the_client(client):
    import gc
    import weakref

    class Owner(np.ndarray):
        pass

    buf = np.zeros((512, 256), np.float32).view(Owner)
    ref = weakref.ref(buf)
    client.register(buf)
    del buf
    gc.collect()
    assert ref() is not None  # the pinned memory cannot be freed under the client
    client.pull("big", slice(None), ref())
