#!/usr/bin/env python3
"""A small CNN on Fashion-MNIST, data-parallel through rdmaps.

The model's parameters live on the parameter servers, which run Adam on
every pushed gradient; each worker trains on its own 1/W of the training set
(pull parameters, forward, backward, push gradients, clock). Worker 0 then
measures the test accuracy of the servers' parameters and prints one JSON
line with the figures.

Every process of the job runs this same script; rdmaps.init() makes each one
what the launcher's layout says (describe the tables, serve, or train):

    rdmaps-local --servers 2 --workers 4 -- /usr/bin/python3 fashion_mnist_cnn.py
    RDMAPS_NUM_SERVERS=2 RDMAPS_TRANSPORT=tcp /usr/bin/python3 -m torch.distributed.run \\
        --standalone --nproc_per_node 6 fashion_mnist_cnn.py

Data: Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist),
read from disk, never downloaded. See docs/python.md for the figures.
"""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import rdmaps
import rdmaps.torch as rt

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file (gzip or plain) as a numpy array of uint8."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 8:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    body = np.frombuffer(data, np.uint8, offset=4 + 4 * rank)
    if body.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {body.size} bytes of data, the header says {dims}")
    return body.reshape(dims)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"

    def find(kind):
        for name in (f"{prefix}-{kind}", f"{prefix}-{kind}.gz"):
            if os.path.exists(os.path.join(data_dir, name)):
                return os.path.join(data_dir, name)
        sys.exit(f"{data_dir} has no {prefix}-{kind}[.gz]: apt-get install dataset-fashion-mnist "
                 "or pass --data-dir")

    images = read_idx(find("images-idx3-ubyte"))
    labels = read_idx(find("labels-idx1-ubyte"))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return (x - 0.2860) / 0.3530, torch.from_numpy(labels.astype(np.int64))


class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = torch.nn.Linear(64 * 7 * 7, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def accuracy(model, x, y, batch=1000):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            correct += int((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
    model.train()
    return correct / max(1, len(x))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--staleness", default="bsp", help="bsp, asp or an SSP bound")
    p.add_argument("--train-limit", type=int, default=0, help="first N training images (0: all)")
    p.add_argument("--test-limit", type=int, default=0, help="first N test images (0: all)")
    p.add_argument("--data-dir", default=DATA_DIR)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    staleness = args.staleness if args.staleness in ("bsp", "asp") else int(args.staleness)

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    net = Cnn()
    tables = rt.tables(net, optimizer=rdmaps.Optimizer("adam", lr=args.lr),
                       staleness=staleness, seed=args.seed)
    # Describes the tables, serves, or connects: whatever the launcher asks.
    client = rdmaps.init(tables, wait_timeout=300)
    w, W = client.worker_id, client.num_workers
    model = rt.Model(net, client)

    x, y = load(args.data_dir, "train")
    if args.train_limit:
        x, y = x[:args.train_limit], y[:args.train_limit]
    x, y = x[w::W], y[w::W]  # this worker's partition
    gen = torch.Generator().manual_seed(args.seed + w)
    start = time.monotonic()
    steps = 0
    for epoch in range(args.epochs):
        order = torch.randperm(len(x), generator=gen)
        total = 0.0
        for i in range(0, len(x), args.batch_size):
            batch = order[i:i + args.batch_size]
            loss = F.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            model.step()
            total += float(loss) * len(batch)
            steps += 1
        print(f"[worker {w}] epoch {epoch + 1}/{args.epochs} loss {total / len(x):.4f} "
              f"({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
    train_seconds = time.monotonic() - start
    client.barrier()  # every worker's last push is in
    if w == 0:
        tx, ty = load(args.data_dir, "test")
        if args.test_limit:
            tx, ty = tx[:args.test_limit], ty[:args.test_limit]
        model.pull()  # the final parameters
        acc = accuracy(model.module, tx, ty)
        stats = client.stats()
        print(json.dumps({"test_accuracy": acc, "train_seconds": round(train_seconds, 1),
                          "workers": W, "servers": client.num_servers, "steps": steps,
                          "epochs": args.epochs, "bytes_staged": stats["bytes_staged"],
                          "zero_copy_calls": stats["zero_copy_calls"]}), flush=True)
    client.barrier()  # worker 0 has read the parameters before anyone leaves
    client.close()


if __name__ == "__main__":
    main()
