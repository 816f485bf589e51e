"""rdmaps.torch: dense models whose optimizer runs on the servers, and server-side embeddings."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rdmaps  # noqa: E402
import rdmaps.torch as rt  # noqa: E402


def small_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def train_beside_local_sgd(model, net, steps, before=None):
    """`steps` steps of `model` (net's parameters on the servers, SGD lr 0.1)
    and of a local copy of net under torch's SGD on the same batches; then
    net's pulled parameters equal the copy's. `before(step)` runs first in
    each step."""
    reference = small_net()
    reference.load_state_dict(net.state_dict())  # the servers' initial weights
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        if before:
            before(step)
        x = torch.randn(8, 6, generator=gen)
        y = torch.randint(0, 3, (8,), generator=gen)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        assert model.step() == step + 1
        opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        opt.step()
    model.pull()
    for a, b in zip(net.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_tables_follow_the_parameters():
    t = rt.tables(small_net(), optimizer=rdmaps.Optimizer("sgd", lr=0.1), staleness=2, first_id=3)
    assert [(x.id, x.name, x.rows, x.dim) for x in t] == [
        (3, "0_weight", 5, 6), (4, "0_bias", 1, 5), (5, "2_weight", 3, 5), (6, "2_bias", 1, 3)]
    assert all(x.staleness == 2 and x.optimizer.kind == "sgd" for x in t)
    # PyTorch's Linear init is uniform in +-1/sqrt(fan_in): matched by bound.
    assert t[0].init.kind == "uniform" and t[0].init.high <= 1 / np.sqrt(6) + 1e-6
    assert rt.parameter_shape(torch.zeros(10000)) == (10000, 1)
    assert rt.parameter_shape(torch.zeros(2, 3, 4)) == (2, 12)


def test_model_trains_exactly_like_local_sgd():
    net = small_net()
    tables = rt.tables(net, optimizer=rdmaps.Optimizer("sgd", lr=0.1), staleness="bsp")
    with rdmaps.local_cluster(tables, servers=2) as cl, cl.connect() as client:
        model = rt.Model(net, client)
        model.pull()
        train_beside_local_sgd(model, net, 5)
        # The parameters and gradients were pinned: the dense traffic copied
        # at most the rows too small for zero-copy reads.
        assert client.stats()["zero_copy_calls"] > 0


def test_model_training_survives_two_primary_kills():
    """replicas=2 (test_reprotect.py): the primary of shard 0 dies, then the
    backup promoted in its place; each time a replacement catches up while
    training goes on, and the weights equal local SGD's."""
    model_net = small_net()
    tabs = rt.tables(model_net, optimizer=rdmaps.Optimizer("sgd", lr=0.1), staleness="bsp")
    with rdmaps.local_cluster(tabs, servers=2, replicas=2) as lc, \
            lc.connect(wait_timeout=5.0) as client:
        model = rt.Model(model_net, client)
        model.pull()
        def before(step):
            if step in (8, 20):
                lc.kill(0)  # the primary, then the promoted one: training goes on at once
            if step in (14, 26):
                lc.wait_protected(timeout=20)  # (the steps before went on without it)

        train_beside_local_sgd(model, model_net, 30, before)
        assert [e["shard"] for e in lc.reprotections] == [0, 0] and len(lc.dead) == 2


def test_model_refuses_tables_of_another_shape():
    net = small_net()
    tables = rt.tables(torch.nn.Linear(6, 4))
    with rdmaps.local_cluster(tables) as cl, cl.connect() as client:
        with pytest.raises(rdmaps.InvalidArgument, match="rdmaps.torch.tables"):
            rt.Model(net, client)


def emb_table(rows=1000, dim=4):
    return rdmaps.Table(0, "emb", rows=rows, dim=dim,
                        init=rdmaps.Initializer("constant", value=1.0),
                        optimizer=rdmaps.Optimizer("sgd", lr=1.0))


def test_embedding_pulls_and_pushes_only_the_batch_rows():
    with rdmaps.local_cluster([emb_table()], servers=2) as cl, cl.connect() as client:
        emb = rt.Embedding(client, "emb", mode="sum")
        ids = torch.tensor([[3, 7, 3], [999, 7, 0]])
        out = emb(ids)
        assert out.shape == (2, 4)
        torch.testing.assert_close(out, torch.full((2, 4), 3.0))
        assert client.stats()["rows_pulled"] == 4  # distinct ids only
        out.sum().backward()
        emb.push()
        assert client.stats()["rows_pushed"] == 4
        # d(sum)/d(row) = occurrences: row 3 twice, 7 twice, 999 and 0 once.
        got = client.pull("emb", [0, 3, 7, 999, 5])[:, 0]
        np.testing.assert_array_equal(got, [0.0, -1.0, -1.0, 0.0, 1.0])


def test_embedding_with_offsets_mean_and_plain_lookup():
    with rdmaps.local_cluster([emb_table()]) as cl, cl.connect() as client:
        bag = rt.Embedding(client, 0, mode="mean")
        out = bag(torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1]))
        assert out.shape == (2, 4)
        plain = rt.Embedding(client, "emb", mode=None)
        assert plain(torch.tensor([[1, 2], [2, 2]])).shape == (2, 2, 4)
        with torch.no_grad():
            plain(torch.tensor([5]))
        assert plain._pending and len(plain._pending) == 1  # no grad: not kept
        with pytest.raises(rdmaps.InvalidArgument, match="offsets"):
            bag(torch.tensor([1, 2]))


def test_model_step_pushes_embedding_gradients_too():
    class Net(torch.nn.Module):
        def __init__(self, client):
            super().__init__()
            self.emb = rt.Embedding(client, "emb", mode="sum")
            self.out = torch.nn.Linear(4, 1)

        def forward(self, ids):
            return self.out(self.emb(ids))

    torch.manual_seed(0)
    dense = torch.nn.Linear(4, 1)
    tables = [emb_table()] + rt.tables(dense, first_id=1, prefix="out.",
                                       optimizer=rdmaps.Optimizer("sgd", lr=0.1))
    with rdmaps.local_cluster(tables) as cl, cl.connect() as client:
        net = Net(client)
        model = rt.Model(net, client, first_id=1, prefix="")
        before = client.pull("emb", [1, 2, 500]).copy()
        model(torch.tensor([[1, 2]])).sum().backward()
        model.step()
        after = client.pull("emb", [1, 2, 500])
        assert not np.array_equal(before[:2], after[:2]) and np.array_equal(before[2], after[2])
