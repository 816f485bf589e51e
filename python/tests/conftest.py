"""Shared fixtures: tables with known arithmetic and a local cluster of them.

Table "w" uses SGD with learning rate 1 and starts at 1.0, so after pushes
of gradients g the rows are exactly 1 - sum(g): every test can predict the
values it pulls.
"""
import os
import sys
import time

import numpy as np
import pytest

import rdmaps

BUILD_DIR = os.environ.get("RDMAPS_BUILD_DIR", "")

# One job secret for the session: servers and workers started by the tests
# (in this process or as children) find it where the tools look.
os.environ.setdefault("RDMAPS_JOB_SECRET", "python-tests-" + os.urandom(8).hex())


def sgd_table(id, name, rows, dim, staleness="asp", layout="auto"):
    return rdmaps.Table(id, name, rows=rows, dim=dim,
                        init=rdmaps.Initializer("constant", value=1.0),
                        optimizer=rdmaps.Optimizer("sgd", lr=1.0), staleness=staleness,
                        layout=layout)


@pytest.fixture
def tables():
    return [
        sgd_table(0, "w", 100, 8),
        sgd_table(1, "big", 512, 256, layout="dense"),  # 1 KiB rows, zero-copy pulls
        sgd_table(2, "bsp", 4, 4, staleness="bsp"),
    ]


@pytest.fixture
def cluster(tables):
    with rdmaps.local_cluster(tables, servers=2, workers=1) as c:
        yield c


@pytest.fixture
def client(cluster):
    with cluster.connect(wait_timeout=20) as c:
        yield c


@pytest.fixture
def two_workers(tables):
    """A cluster of two workers and both clients (clock_waits off: one thread drives both)."""
    with rdmaps.local_cluster(tables, servers=2, workers=2) as cl:
        a = cl.connect(0, clock_waits=False, wait_timeout=20)
        b = cl.connect(1, clock_waits=False, wait_timeout=20)
        try:
            yield cl, a, b
        finally:
            a.close()
            b.close()


def python_env():
    """The environment a child interpreter needs to import this build's rdmaps."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def ones(rows, dim, value=1.0):
    return np.full((rows, dim), value, np.float32)


def wait_until(condition, timeout=10.0, what="condition"):
    """Polls `condition` (e.g. a server's stats) until true; fails after timeout s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(0.01)


EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def tool(relative):
    """A program of the build tree (RDMAPS_BUILD_DIR), or skip when it was not built."""
    path = os.path.join(BUILD_DIR, relative)
    if not BUILD_DIR or not os.access(path, os.X_OK):
        pytest.skip(f"{relative} is not built (RDMAPS_BUILD_DIR={BUILD_DIR!r})")
    return path


def json_lines(text):
    """The JSON objects printed on lines of `text` (a launcher may prefix them)."""
    import json
    out = []
    for line in text.splitlines():
        if "{" in line and line.rstrip().endswith("}"):
            out.append(json.loads(line[line.index("{"):]))
    return out
