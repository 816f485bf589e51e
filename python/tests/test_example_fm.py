"""The factorization-machine example on a subset (servers in the worker's process)."""
import os
import subprocess
import sys

import pytest

from conftest import EXAMPLES, json_lines, python_env


def test_fm_learns_the_ground_truth():
    pytest.importorskip("torch")
    run = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "ctr_fm.py"), "--inproc-servers", "2",
         "--rows", "50000", "--steps", "150", "--test-samples", "20000"],
        capture_output=True, text=True, env=python_env(), timeout=200)
    assert run.returncode == 0, run.stderr[-3000:]
    (r,) = json_lines(run.stdout)
    assert r["bayes_auc"] > 0.7, r  # the data carry signal
    assert 0.6 < r["auc"] <= r["bayes_auc"] + 0.01, r  # learned much of it, no better than truth
    # Only the batches' distinct rows moved: far fewer than steps x batch x fields.
    assert r["rows_pulled"] < 150 * 1024 * 8 and r["rows_pushed"] <= r["rows_pulled"]


def test_fm_ground_truth_is_a_pure_function_of_the_ids():
    sys.path.insert(0, EXAMPLES)
    import numpy as np

    import ctr_fm

    data = ctr_fm.ClickData(rows=1000, fields=4, zipf_a=1.2, seed=3)
    ids = data.ids(np.random.default_rng(0), 500)
    assert ids.min() >= 0 and ids.max() < 1000
    assert ((ids // 250) == np.arange(4)).all()  # each field in its own range
    np.testing.assert_array_equal(data.true_logit(ids), data.true_logit(ids.copy()))
    assert ctr_fm.auc(np.array([0.1, 0.2, 0.9, 0.8]), np.array([0, 0, 1, 1])) == 1.0
    assert ctr_fm.auc(np.array([0.9, 0.8, 0.1, 0.2]), np.array([0, 0, 1, 1])) == 0.0
