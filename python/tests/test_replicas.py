"""Replicated shards and elastic worker slots from Python: LocalCluster and
connect take `replicas` and `max_workers` as the C++ options do."""
import time

import numpy as np
import pytest

import rdmaps
from conftest import sgd_table


def tables():
    return [sgd_table(0, "w", rows=40, dim=4)]


def test_replicated_local_cluster_forwards_every_push_to_the_backups():
    with rdmaps.local_cluster(tables(), servers=2, workers=1, replicas=2) as lc:
        assert len(lc.backups) == 2 and lc.coordinator.startswith("memory:")
        assert set(lc.addresses).isdisjoint(b.address for b in lc.backups)
        with lc.connect(0) as c:
            for _ in range(10):
                c.push("w", slice(0, 40), np.ones((40, 4), np.float32))
            c.flush()
            np.testing.assert_array_equal(c.pull("w", slice(0, 40)), -9.0)  # 1 - 10
        # Each backup holds its shard's pushes (the log), in apply order. A
        # record is acknowledged once it is in the backup's ring, and applied
        # there a moment later: wait (bounded) until the backup has caught up.
        for primary, backup in zip(lc.servers, lc.backups):
            assert primary.stats()["log_records"] >= 10
            deadline = time.monotonic() + 10
            while (backup.stats()["log_records"] != primary.stats()["log_records"]
                   and time.monotonic() < deadline):
                time.sleep(0.005)  # polling a deadline
            assert backup.stats()["log_records"] == primary.stats()["log_records"]
            shard = primary.stats()  # the backup applied exactly the same rows
            rows = 20  # rows 0..19 on server 0, 20..39 on server 1
            begin = 0 if primary is lc.servers[0] else 20
            np.testing.assert_array_equal(backup.read_local(0, begin, rows),
                                          primary.read_local(0, begin, rows))
            assert shard["pushes_applied"] >= 10


def test_replicas_2_needs_a_coordinator():
    with rdmaps.local_cluster(tables(), servers=1, workers=1) as lc:
        with pytest.raises(rdmaps.InvalidArgument, match="coordinator"):
            rdmaps.connect(lc.addresses, worker_id=0, num_workers=1, job_token=lc.job_token,
                           replicas=2, env={})
        with pytest.raises(rdmaps.InvalidArgument, match="replicas=3"):
            rdmaps.connect(lc.addresses, worker_id=0, num_workers=1, job_token=lc.job_token,
                           replicas=3)
    with pytest.raises(rdmaps.InvalidArgument, match="coordinator"):
        rdmaps.Server(tables(), replicas=2, replica_role="backup")
    with pytest.raises(ValueError):
        rdmaps.local_cluster(tables(), replicas=3)


def test_elastic_local_cluster_takes_a_worker_in_a_free_slot():
    with rdmaps.local_cluster(tables(), servers=2, workers=1, max_workers=3) as lc:
        with lc.connect(0) as first:
            first.push("w", slice(0, 40), np.ones((40, 4), np.float32))
            first.flush()
            with lc.connect(2) as joiner:  # a slot beyond the first members
                joiner.push("w", slice(0, 40), np.ones((40, 4), np.float32))
                joiner.flush()
            np.testing.assert_array_equal(first.pull("w", slice(0, 40)), -1.0)  # 1 - 2
        with pytest.raises(rdmaps.Error):
            lc.connect(3, connect_timeout=2.0)  # no such slot
