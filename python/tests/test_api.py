"""The Client API: rows in every form, results, tables, stats, clocks, layouts."""
import threading

import numpy as np
import pytest

import rdmaps
from conftest import ones, wait_until


def test_pull_allocates_float32_rows_with_the_servers_initial_values(client):
    out = client.pull("w", slice(0, 5))
    assert out.dtype == np.float32 and out.shape == (5, 8)
    np.testing.assert_array_equal(out, np.ones((5, 8), np.float32))


def test_pull_into_out_returns_the_same_array(client):
    out = np.zeros((3, 8), np.float32)
    assert client.pull("w", [4, 5, 6], out) is out
    np.testing.assert_array_equal(out, 1.0)


def test_push_is_applied_by_the_servers_optimizer(client):
    # SGD, lr 1: w = 1 - g, read back by the same worker (read-my-writes).
    client.push("w", slice(10, 12), np.array([[0.5] * 8, [2.0] * 8], np.float32))
    np.testing.assert_array_equal(client.pull("w", slice(10, 12))[:, 0], [0.5, -1.0])


@pytest.mark.parametrize("rows, expected", [
    (7, [7]),
    (-1, [99]),
    (slice(95, None), [95, 96, 97, 98, 99]),
    (slice(0, 10, 3), [0, 3, 6, 9]),
    (slice(None, None, -40), [99, 59, 19]),
    (range(20, 26, 2), [20, 22, 24]),
    ([42, 3, 42], [42, 3, 42]),
    (np.array([5, 1], np.int32), [5, 1]),
    (np.array([8, 9], np.uint64), [8, 9]),
    (np.array([8, 9, 10, 11], np.int64)[::2], [8, 10]),
])
def test_every_form_of_rows_names_the_expected_rows(client, rows, expected):
    # Mark each row with its own value, then pull the rows back by `rows`.
    marks = -np.arange(100, dtype=np.float32)[:, None] * np.ones((1, 8), np.float32)
    client.push("w", slice(None), marks)  # w[r] = 1 + r
    got = client.pull("w", rows)
    assert got.shape == (len(expected), 8)
    np.testing.assert_array_equal(got[:, 0], np.array(expected, np.float32) + 1)


def test_torch_tensors_as_ids_out_and_grads(client):
    torch = pytest.importorskip("torch")
    ids = torch.tensor([1, 2], dtype=torch.int64)
    client.push("w", ids, torch.full((2, 8), 3.0))
    out = torch.zeros(2, 8)
    client.pull("w", ids, out)
    assert torch.equal(out, torch.full((2, 8), -2.0))


def test_tables_by_name_id_or_info(client):
    names = [t.name for t in client.tables]
    assert names == ["w", "big", "bsp"]
    info = client.table("big")
    assert (info.id, info.rows, info.dim, info.layout) == (1, 512, 256, "dense")
    assert client.table(1).name == "big"
    assert client.pull(info, 0).shape == (1, 256)
    assert client.table("bsp").staleness == "bsp"


def test_push_pull_sees_its_own_push(client):
    out = client.push_pull("w", slice(30, 32), ones(2, 8, 0.25))
    np.testing.assert_array_equal(out, 0.75)
    out = client.push_pull("w", [30, 40], ones(2, 8, 0.25))
    np.testing.assert_array_equal(out[:, 0], [0.5, 0.75])


def test_clock_counts_iterations_and_stats_is_a_dict(client):
    assert client.clock() == 1
    assert client.clock() == 2
    client.pull("w", 0)
    s = client.stats()
    assert s["clock"] == 2 and s["pulls"] >= 1 and isinstance(s["blocked_seconds"], float)
    assert set(s) >= {"bytes_staged", "zero_copy_calls", "rows_pulled", "torn_retries"}


def test_identity_properties(cluster):
    with cluster.connect(0) as c:
        assert (c.worker_id, c.num_workers, c.num_servers) == (0, 1, 2)
        assert "2 servers" in repr(c)
    assert c.closed and "closed" in repr(c)


def test_context_manager_says_goodbye(cluster):
    with cluster.connect() as c:
        c.pull("w", 0)
    c.close()  # idempotent
    wait_until(lambda: sum(s.stats()["workers_done"] for s in cluster.servers) == 2)
    with pytest.raises(rdmaps.FailedPrecondition, match="closed"):
        c.pull("w", 0)


def test_barrier_waits_for_every_worker(two_workers):
    _, a, b = two_workers
    done = threading.Event()

    def second():
        b.barrier()
        done.set()

    t = threading.Thread(target=second)
    t.start()
    assert not done.wait(0.2)  # b waits for a (a bound, not a sleep as synchronisation)
    a.barrier()
    t.join(10)
    assert done.is_set()


def test_bsp_pull_waits_for_the_slowest_worker(two_workers):
    _, a, b = two_workers
    a.push("bsp", slice(None), ones(4, 4))
    b.push("bsp", slice(None), ones(4, 4))
    a.clock()
    f = a.pull_async("bsp", slice(None))
    with pytest.raises(rdmaps.TimedOut):
        f.result(timeout=0.2)  # b has not finished iteration 0
    b.clock()
    np.testing.assert_array_equal(f.result(timeout=10), -1.0)  # 1 - 1 - 1: both pushes


def test_connect_resolves_the_layout_from_the_environment(cluster):
    env = cluster.env(0)
    layout = rdmaps.resolve_layout(env)
    assert (layout["role"], layout["index"], layout["num_servers"]) == ("worker", 0, 2)
    assert layout["source"] == "RDMAPS_*"
    with rdmaps.connect(env=env) as c:
        assert c.num_servers == 2
        assert c.pull("w", 0)[0, 0] == 1.0


def test_connect_checks_tables_against_the_servers(cluster, tables):
    with rdmaps.connect(cluster.addresses, tables=tables) as c:
        assert len(c.tables) == 3
    wrong = [rdmaps.Table(0, "w", rows=99, dim=8)]
    with pytest.raises(rdmaps.Error):
        rdmaps.connect(cluster.addresses, tables=wrong)


def test_server_run_returns_when_its_worker_closes(tables):
    with rdmaps.Server(tables) as server:
        with rdmaps.connect([server.address]) as c:
            c.push("w", 0, ones(1, 8))
        server.run(timeout=20)
        st = server.stats()
        assert st["workers_done"] == 1 and st["pushes_applied"] >= 1
        np.testing.assert_array_equal(server.read_local(0, 0, 1), 0.0)


def test_server_run_times_out(tables):
    with rdmaps.Server(tables) as server:
        with pytest.raises(rdmaps.TimedOut):
            server.run(timeout=0.1)


def test_initialize_rows_matches_what_the_servers_hold(client):
    t = rdmaps.Table(5, "n", rows=10, dim=4, init=rdmaps.Initializer("normal", stddev=1.0, seed=7))
    rows = rdmaps.initialize_rows(t, 2, 3)
    assert rows.shape == (3, 4) and rows.std() > 0
    with rdmaps.local_cluster([t]) as cl, cl.connect() as c:
        np.testing.assert_array_equal(c.pull("n", slice(2, 5)), rows)


def test_tables_json_round_trip(tables):
    text = rdmaps.tables_to_json(tables)
    back = rdmaps.parse_tables_json(text)
    assert [(t.id, t.name, t.rows, t.dim, t.staleness) for t in back] == \
        [(t.id, t.name, t.rows, t.dim, t.staleness) for t in tables]
    with pytest.raises(rdmaps.InvalidArgument):
        rdmaps.parse_tables_json('{"tables": [{"id": 0, "nmae": "typo"}]}')
