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


def test_zeros_are_page_aligned_and_registrable_on_any_transport(client):
    a = rdmaps.zeros((512, 256))
    assert a.dtype == np.float32 and a.shape == (512, 256) and a.flags.c_contiguous
    assert a.ctypes.data % 4096 == 0 and not a.any()
    client.register(a)
    before = client.stats()["bytes_staged"]
    client.pull("big", slice(None), a)
    assert client.stats()["bytes_staged"] == before
    np.testing.assert_array_equal(a, 1.0)
    assert client.transport == "tcp"
    # tcp is not affected by verbs' page rule: a small heap array registers too.
    client.register(np.zeros(10, np.float32))


def test_fork_safety_rule_of_register_on_verbs():
    # What register() refuses on verbs (rdma-core hides registered pages from
    # forked children whole): memory that shares a page with other objects.
    small = np.zeros(10, np.float32)  # from the heap, inside a page
    why = rdmaps._rdmaps._fork_unsafe_pages(small)
    assert "rdmaps.zeros(shape)" in why and "pages of its own" in why, why
    assert "40 bytes" in why
    assert rdmaps._rdmaps._fork_unsafe_pages(rdmaps.zeros(10)) == ""
    assert rdmaps._rdmaps._fork_unsafe_pages(rdmaps.zeros((64, 3))[5:9]) == ""  # inside a block
    # Whole pages of any array are fine; a page and a float is not.
    raw = np.zeros(3 * 1024 + 1024, np.float32)
    off = (-raw.ctypes.data % 4096) // 4
    assert rdmaps._rdmaps._fork_unsafe_pages(raw[off:off + 2048]) == ""
    assert rdmaps._rdmaps._fork_unsafe_pages(raw[off:off + 2049]) != ""
    with pytest.raises(rdmaps.InvalidArgument, match="negative dimension"):
        rdmaps.zeros((2, -1))
