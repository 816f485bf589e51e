"""The Fashion-MNIST CNN example on a subset: 2 servers and 4 workers started by rdmaps-local."""
import os
import subprocess
import sys

import pytest

from conftest import EXAMPLES, json_lines, python_env, tool

DATA = "/usr/share/datasets/fashion-mnist"


@pytest.mark.skipif(not os.path.isdir(DATA), reason="dataset-fashion-mnist is not installed")
def test_cnn_learns_under_rdmaps_local():
    pytest.importorskip("torch")
    launcher = tool("tools/local/rdmaps-local")
    run = subprocess.run(
        [launcher, "--servers", "2", "--workers", "4", "--transport", "tcp", "--timeout_s", "240",
         "--", sys.executable, os.path.join(EXAMPLES, "fashion_mnist_cnn.py"),
         "--epochs", "1", "--train-limit", "2000", "--test-limit", "500"],
        capture_output=True, text=True, env=python_env(), timeout=280)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (report,) = json_lines(run.stdout)
    assert (report["workers"], report["servers"]) == (4, 2)
    # 8 steps of 4 x 64 images: far above chance (10 %); the full run reaches >= 90 %.
    assert report["test_accuracy"] > 0.4, report
