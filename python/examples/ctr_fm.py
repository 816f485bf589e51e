#!/usr/bin/env python3
"""A factorization machine on synthetic click data, its embeddings on the servers.

The data: F categorical fields, each with --rows / F ids drawn from a Zipf
distribution (a few ids are very frequent, most are rare, as in real click
logs), and a known ground truth: every id has a true weight and a true
factor vector (a pure function of the id), a sample's true logit is the
factorization machine they define, and its label is drawn from the logistic
of that logit. The best possible AUC on the test set (the true logits'
AUC) is reported beside the model's.

The model: one embedding table of --rows rows (first column the linear
weight, then --factors factors) served by the parameter servers with
Adagrad; each batch pulls only the distinct rows its ids name and pushes
only their gradients (rdmaps.torch.Embedding). The table can be far larger
than a worker's memory.

    rdmaps-local --servers 2 --workers 4 -- /usr/bin/python3 ctr_fm.py --rows 10000000
    /usr/bin/python3 ctr_fm.py --inproc-servers 2 --rows 100000 --steps 200   # one process

Worker 0 prints one JSON line with the figures (docs/python.md).
"""
import argparse
import json
import math
import sys
import time

import numpy as np
import torch

import rdmaps
import rdmaps.torch as rt

TRUE_FACTORS = 4
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(x):
    """A well-mixed 64-bit hash of each element (numpy uint64)."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & M64
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & M64
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & M64
        return x ^ (x >> np.uint64(31))


def uniform_of(ids, salt):
    """A number in [-1, 1) that is a pure function of (id, salt)."""
    h = splitmix64(ids.astype(np.uint64) * np.uint64(64) + np.uint64(salt))
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53) * 2.0 - 1.0


class ClickData:
    """The synthetic click stream: Zipf ids per field and the true FM's labels."""

    def __init__(self, rows, fields, zipf_a, seed):
        self.fields = fields
        self.vocab = rows // fields
        self.zipf_a = zipf_a
        self.seed = seed
        # A bijection rank -> id within a field, so that the frequent ids are
        # spread over the table (and over the servers' shards).
        self.mult = 2654435761
        while math.gcd(self.mult, self.vocab) != 1:
            self.mult += 2

    def ids(self, rng, n):
        ranks = (rng.zipf(self.zipf_a, size=(n, self.fields)) - 1) % self.vocab
        local = (ranks.astype(np.uint64) * np.uint64(self.mult)) % np.uint64(self.vocab)
        offsets = (np.arange(self.fields, dtype=np.uint64) * np.uint64(self.vocab))[None, :]
        return (local + offsets).astype(np.int64)

    def true_logit(self, ids):
        w = 0.6 * uniform_of(ids, 0)  # (n, F)
        v = np.stack([0.5 * uniform_of(ids, 1 + j) for j in range(TRUE_FACTORS)], -1)
        inter = 0.5 * ((v.sum(1) ** 2) - (v ** 2).sum(1)).sum(1)
        return -0.5 + w.sum(1) + inter

    def batch(self, rng, n):
        ids = self.ids(rng, n)
        logit = self.true_logit(ids)
        labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return ids, labels, logit


def auc(scores, labels):
    """Area under the ROC curve, by ranks (continuous scores: ties are negligible)."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    pos = labels > 0.5
    p, n = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - p * (p + 1) / 2) / max(1, p * n))


class FM(torch.nn.Module):
    """logit = bias + sum of linear weights + pairwise factor interactions."""

    def __init__(self, client):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(1))
        self.emb = rt.Embedding(client, "fm", mode=None)

    def forward(self, ids):
        e = self.emb(ids)  # (batch, fields, 1 + factors)
        linear = e[..., 0].sum(1)
        v = e[..., 1:]
        inter = 0.5 * ((v.sum(1) ** 2) - (v ** 2).sum(1)).sum(1)
        return self.bias + linear + inter


def make_tables(args):
    opt = rdmaps.Optimizer("adagrad", lr=args.lr, initial_accumulator=0.0)
    return [
        rdmaps.Table(0, "fm", rows=args.rows, dim=1 + args.factors,
                     init=rdmaps.Initializer("normal", stddev=0.01, seed=args.seed),
                     optimizer=opt, staleness=args.staleness),
        rdmaps.Table(1, "bias", rows=1, dim=1, optimizer=opt, staleness=args.staleness),
    ]


def train(client, args):
    w = client.worker_id
    net = FM(client)
    model = rt.Model(net, client, first_id=1)
    data = ClickData(args.rows, args.fields, args.zipf, args.seed)
    rng = np.random.default_rng(args.seed * 1000 + w + 1)
    start = time.monotonic()
    loss_sum, seen = 0.0, 0
    for step in range(args.steps):
        ids, labels, _ = data.batch(rng, args.batch_size)
        logit = model(torch.from_numpy(ids))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit,
                                                                    torch.from_numpy(labels))
        loss.backward()
        model.step()
        loss_sum += float(loss)
        seen += 1
        if (step + 1) % max(1, args.steps // 10) == 0:
            print(f"[worker {w}] step {step + 1}/{args.steps} loss {loss_sum / seen:.4f} "
                  f"({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
            loss_sum, seen = 0.0, 0
    train_seconds = time.monotonic() - start
    client.barrier()
    if w == 0:
        test_rng = np.random.default_rng(args.seed + 999_999)
        ids, labels, true_logit = data.batch(test_rng, args.test_samples)
        scores = []
        with torch.no_grad():
            model.pull()
            for i in range(0, len(ids), 8192):
                scores.append(net(torch.from_numpy(ids[i:i + 8192])).numpy())
        scores = np.concatenate(scores)
        stats = client.stats()
        print(json.dumps({
            "auc": round(auc(scores, labels), 4),
            "bayes_auc": round(auc(true_logit, labels), 4),
            "rows": args.rows, "fields": args.fields, "workers": client.num_workers,
            "servers": client.num_servers, "steps": args.steps, "batch_size": args.batch_size,
            "train_seconds": round(train_seconds, 1),
            "samples_per_second": round(args.steps * args.batch_size * client.num_workers /
                                        max(train_seconds, 1e-9)),
            "rows_pulled": stats["rows_pulled"], "rows_pushed": stats["rows_pushed"],
        }), flush=True)
    client.barrier()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000, help="embedding table rows")
    p.add_argument("--fields", type=int, default=8)
    p.add_argument("--factors", type=int, default=8)
    p.add_argument("--zipf", type=float, default=1.2, help="Zipf exponent of the ids")
    p.add_argument("--steps", type=int, default=2000, help="batches per worker")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--staleness", default="asp", help="bsp, asp or an SSP bound")
    p.add_argument("--test-samples", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--inproc-servers", type=int, default=0,
                   help="run this many servers in this process and train as its one worker")
    args = p.parse_args()
    if args.staleness not in ("bsp", "asp"):
        args.staleness = int(args.staleness)
    torch.set_num_threads(1)
    tables = make_tables(args)
    if args.inproc_servers:
        with rdmaps.local_cluster(tables, servers=args.inproc_servers) as cluster, \
                cluster.connect(wait_timeout=300) as client:
            train(client, args)
        return
    client = rdmaps.init(tables, wait_timeout=300)
    train(client, args)
    client.close()


if __name__ == "__main__":
    main()
