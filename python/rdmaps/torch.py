"""PyTorch on rdmaps: the parameters live on the servers, which run the optimizer.

Dense models:

    tables = rdmaps.torch.tables(net, optimizer=rdmaps.Optimizer("adam", lr=1e-3),
                                 staleness="bsp")
    client = rdmaps.init(tables)               # or rdmaps.connect(...) / a LocalCluster
    model = rdmaps.torch.Model(net, client)
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)    # forward pulls the parameters first
        loss.backward()
        model.step()                           # pushes the gradients, ends the clock

Each parameter tensor is one table (tables() names them after the
parameters); the worker runs no optimizer. The consistency model is the
tables' staleness ("bsp", "asp" or an SSP bound s), one argument.

Sparse models: rdmaps.torch.Embedding(client, table, mode="sum") is an
EmbeddingBag whose table lives on the servers and may be far larger than the
worker's memory: each forward pulls only the distinct rows of its ids, and
step() (or Model.step()) pushes only their gradients (scattered rows).
"""

import numpy as np
import torch

import rdmaps

__all__ = ["Embedding", "Model", "parameter_shape", "tables"]

# A 1-D parameter of at most this many floats is one row; above it, rows of 1.
_MAX_ROW_FLOATS = 4096


def parameter_shape(p):
    """The (rows, dim) table shape of a parameter tensor.

    Row-major: the first dimension is the rows, the rest one row; a scalar
    is (1, 1); a 1-D tensor is one row when small, else one float per row.
    """
    n = p.numel()
    if p.dim() == 0:
        return 1, 1
    if p.dim() == 1:
        return (1, n) if n <= _MAX_ROW_FLOATS else (n, 1)
    return p.shape[0], n // p.shape[0]


def _initializer(p, seed):
    """The servers' initializer closest to `p`'s current values.

    Equal values: that constant (zeros for biases, ones for norms' weights);
    else uniform in [-b, b] with b the largest magnitude, which is PyTorch's
    default for Linear and Conv layers (kaiming_uniform(a=sqrt(5)): b = 1 /
    sqrt(fan_in)).
    """
    with torch.no_grad():
        flat = p.detach().reshape(-1)
        lo, hi = float(flat.min()), float(flat.max())
    if lo == hi:
        return rdmaps.Initializer("constant", value=lo) if lo != 0 else rdmaps.Initializer("zeros")
    b = max(abs(lo), abs(hi))
    return rdmaps.Initializer("uniform", low=-b, high=b, seed=seed)


def _own_pages(t):
    """A copy of float32 tensor `t` in memory pages of its own (rdmaps.zeros)."""
    out = torch.from_numpy(rdmaps.zeros(tuple(t.shape)))
    out.copy_(t)
    return out


def _table_name(prefix, name):
    # Table names are at most 31 characters; keep the informative end.
    full = (prefix + name).replace(".", "_")
    return full if len(full) <= 31 else full[-31:]


def tables(module, *, optimizer=None, staleness="bsp", first_id=0, prefix="", seed=1,
           init=None):
    """One rdmaps.Table per parameter of `module` (in named_parameters order).

    optimizer: the rdmaps.Optimizer the servers run (default Adam, lr 1e-3).
    staleness: "bsp", "asp" or an SSP bound. init: {parameter name:
    rdmaps.Initializer} overriding the initializer matched to the module's
    current values. Ids are first_id, first_id + 1, ...; names come from the
    parameter names (dots become underscores, truncated to 31 characters).
    """
    optimizer = optimizer or rdmaps.Optimizer("adam", lr=1e-3)
    init = init or {}
    out = []
    for i, (name, p) in enumerate(module.named_parameters()):
        rows, dim = parameter_shape(p)
        table_id = first_id + i
        out.append(rdmaps.Table(table_id, _table_name(prefix, name), rows=rows, dim=dim,
                                init=init.get(name, _initializer(p, seed + table_id)),
                                optimizer=optimizer, staleness=staleness))
    return out


class Model(torch.nn.Module):
    """`module` with its parameters held by the rdmaps servers.

    forward() first pulls every parameter into the module's own tensors (once
    per step; pinned for zero-copy where the table's layout allows); after
    backward(), step() pushes every gradient, then the gradients of the
    rdmaps.torch.Embedding modules inside, zeroes them and ends the clock
    (returning it). The tables are tables(module, first_id=first_id,
    prefix=prefix), checked by name and shape against the client's.
    grad_scale multiplies the gradients pushed (e.g. 1 / num_workers to
    average rather than sum the workers' steps with SGD).
    """

    def __init__(self, module, client, *, first_id=0, prefix="", grad_scale=1.0, register=True):
        super().__init__()
        self.module = module
        self.client = client
        self.grad_scale = float(grad_scale)
        self._params = []  # (table id, parameter, (rows, dim))
        for i, (name, p) in enumerate(module.named_parameters()):
            info = client.table(first_id + i)
            shape = parameter_shape(p)
            if (info.rows, info.dim) != shape or info.name != _table_name(prefix, name):
                raise rdmaps.InvalidArgument(
                    f"parameter {name} {tuple(p.shape)} needs table '{_table_name(prefix, name)}'"
                    f" of {shape[0]} x {shape[1]} at id {first_id + i}; the servers have "
                    f"'{info.name}' of {info.rows} x {info.dim}: start them with "
                    "rdmaps.torch.tables(module) (same first_id and prefix)")
            if not p.is_contiguous() or p.device.type != "cpu" or p.dtype != torch.float32:
                raise rdmaps.InvalidArgument(
                    f"parameter {name} must be a contiguous float32 CPU tensor")
            # The gradient buffers exist from the start and stay (zeroed in
            # place), so both directions can be pinned once. Pinned tensors
            # live in pages of their own (rdmaps.zeros): on verbs a forked
            # child (a DataLoader worker) loses registered pages whole.
            if register:
                p.data = _own_pages(p.data)
                p.grad = _own_pages(torch.zeros_like(p))
            else:
                p.grad = torch.zeros_like(p)
            if register:
                client.register(p.data)
                client.register(p.grad)
            self._params.append((info.id, p, shape))
        self._stale = True

    def pull(self):
        """Pulls every parameter from the servers into the module's tensors."""
        futures = [self.client.pull_async(tid, slice(None), p.data.view(shape))
                   for tid, p, shape in self._params]
        for f in futures:
            f.result()
        self._stale = False

    def forward(self, *args, **kwargs):
        if self._stale:
            self.pull()
        return self.module(*args, **kwargs)

    def push(self):
        """Pushes every parameter's gradient, and those of the Embedding modules."""
        futures = []
        for tid, p, shape in self._params:
            if self.grad_scale != 1.0:
                p.grad.mul_(self.grad_scale)
            futures.append(self.client.push_async(tid, slice(None), p.grad.view(shape)))
        for f in futures:
            f.result()
        for m in self.module.modules():
            if isinstance(m, Embedding):
                m.push(scale=self.grad_scale)
        for _, p, _ in self._params:
            p.grad.zero_()

    def step(self):
        """push(), then end the clock; the next forward pulls. Returns the new clock."""
        self.push()
        self._stale = True
        return self.client.clock()


class Embedding(torch.nn.Module):
    """An EmbeddingBag (or Embedding, mode=None) whose table lives on the servers.

    forward(ids, offsets=None, per_sample_weights=None) pulls the distinct
    rows of `ids` (any int tensor or array) into a leaf tensor and reduces
    them as torch.nn.functional.embedding_bag does (mode "sum", "mean" or
    "max"; with mode=None it returns one row per id, like nn.Embedding).
    After backward(), push() sends the gradients of those rows only, as
    scattered rows, and forgets them; Model.step() calls it, or call it
    yourself and then client.clock(). `table` is a name or id of the client's.
    """

    def __init__(self, client, table, mode="sum"):
        super().__init__()
        if mode not in ("sum", "mean", "max", None):
            raise rdmaps.InvalidArgument(f"mode {mode!r}: use 'sum', 'mean', 'max' or None")
        self.client = client
        self.info = client.table(table)
        self.mode = mode
        self._pending = []  # (unique ids as uint64 numpy, leaf rows tensor)

    @property
    def num_embeddings(self):
        return self.info.rows

    @property
    def embedding_dim(self):
        return self.info.dim

    def forward(self, ids, offsets=None, per_sample_weights=None):
        ids = torch.as_tensor(ids)
        unique, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        uids = unique.numpy().astype(np.uint64) if unique.numel() else None
        if uids is None:
            raise rdmaps.InvalidArgument("Embedding: no ids in the batch")
        rows = torch.from_numpy(self.client.pull(self.info.id, uids))
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            self._pending.append((uids, rows))
        if self.mode is None:
            return torch.nn.functional.embedding(inverse.reshape(ids.shape), rows)
        if offsets is None and ids.dim() == 1:
            raise rdmaps.InvalidArgument(
                "Embedding: 1-D ids need offsets (or give a 2-D batch of bags)")
        inv = inverse.reshape(ids.shape)
        return torch.nn.functional.embedding_bag(inv, rows, offsets, mode=self.mode,
                                                 per_sample_weights=per_sample_weights)

    def push(self, scale=1.0):
        """Pushes the gradients of the rows pulled since the last push (scattered rows)."""
        futures = []
        for uids, rows in self._pending:
            if rows.grad is None:
                continue
            g = rows.grad if scale == 1.0 else rows.grad * scale
            futures.append((self.client.push_async(self.info.id, uids, g.contiguous()), g))
        self._pending = []
        for f, _ in futures:
            f.result()

    def extra_repr(self):
        return (f"table '{self.info.name}' ({self.info.rows} x {self.info.dim}) on "
                f"{self.client.num_servers} servers, mode={self.mode!r}")
