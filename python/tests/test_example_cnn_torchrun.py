"""The Fashion-MNIST CNN example on a subset, launched by torchrun (2 servers, 2 workers)."""
import os
import subprocess
import sys

import pytest

from conftest import EXAMPLES, json_lines, python_env

DATA = "/usr/share/datasets/fashion-mnist"


@pytest.mark.skipif(not os.path.isdir(DATA), reason="dataset-fashion-mnist is not installed")
def test_cnn_learns_under_torchrun(tmp_path):
    pytest.importorskip("torch.distributed.run")
    env = python_env()
    # The first RDMAPS_NUM_SERVERS ranks serve; the rendezvous publishes its
    # free port in a file (no fixed port).
    env.update(RDMAPS_NUM_SERVERS="2", RDMAPS_TRANSPORT="tcp", OMP_NUM_THREADS="1",
               RDMAPS_RENDEZVOUS="file:" + str(tmp_path / "rendezvous"))
    # --redirects/--tee 1: Debian's torch 1.13 on Python 3.11 fails to parse
    # their default "0" (an IntFlag change); 1 keeps stdout on the console.
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
         "--redirects", "1", "--tee", "1", "--log_dir", str(tmp_path / "logs"),
         os.path.join(EXAMPLES, "fashion_mnist_cnn.py"),
         "--epochs", "1", "--train-limit", "2000", "--test-limit", "500"],
        capture_output=True, text=True, env=env, timeout=280)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (report,) = json_lines(run.stdout)
    assert (report["workers"], report["servers"]) == (2, 2)
    assert report["test_accuracy"] > 0.4, report
