"""Re-protection in LocalCluster (replicas=2): a shard that lost a copy gets
a replacement backup, copied from the survivor while a worker goes on
pushing, so a second failure of the same shard loses nothing. (From torch:
test_torch.py, test_model_training_survives_two_primary_kills.)"""
import re
import threading
import time

import numpy as np
import pytest

import rdmaps
from conftest import sgd_table

ROWS, DIM = 64, 4
WAIT_TIMEOUT = 5.0  # every worker call's deadline (s)


def tables():
    return [sgd_table(0, "w", rows=ROWS, dim=DIM)]  # SGD lr 1 from 1.0: rows = 1 - sum(grads)


class Pusher:
    """A worker thread pushing ones to random rows (duplicates included)
    and, every 8th push, pulling what it pushed (read-my-writes): counts[r]
    is how often row r was in a push that returned OK."""

    def __init__(self, client):
        self.client = client
        self.counts = np.zeros(ROWS, np.int64)
        self.pushes = 0
        self.errors = []
        self.mismatches = []
        self.longest_call = 0.0
        self.cv = threading.Condition()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def timed(self, call, *args):
        t = time.monotonic()
        out = call(*args)
        self.longest_call = max(self.longest_call, time.monotonic() - t)
        return out

    def run(self):
        rng = np.random.default_rng(7)
        try:
            while not self.stop.is_set():
                rows = rng.integers(0, ROWS, 8)
                self.timed(self.client.push, "w", rows, np.ones((8, DIM), np.float32))
                with self.cv:
                    np.add.at(self.counts, rows, 1)
                    self.pushes += 1
                    self.cv.notify_all()
                if self.pushes % 8 == 0:
                    got = np.asarray(self.timed(self.client.pull, "w", slice(0, ROWS)))
                    want = (1.0 - self.counts).astype(np.float32)[:, None]
                    if not np.array_equal(got, np.broadcast_to(want, got.shape)):
                        self.mismatches.append((self.pushes, got[:, 0] - want[:, 0]))
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)
            with self.cv:
                self.cv.notify_all()

    def wait_for(self, pushes, timeout=20.0):
        """Waits (bounded) until `pushes` pushes returned OK."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while self.pushes < pushes and not self.errors:
                left = deadline - time.monotonic()
                assert left > 0, f"only {self.pushes} of {pushes} pushes in {timeout} s"
                self.cv.wait(left)
        assert not self.errors, self.errors

    def finish(self):
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()
        assert not self.errors, self.errors
        assert not self.mismatches, self.mismatches[:3]


def assert_copies_equal(lc, shard, begin, count, timeout=10.0):
    """The backup applies a record just after the primary acknowledged it:
    waits (bounded) until both copies of the shard hold the same rows."""
    deadline = time.monotonic() + timeout
    primary, backup = lc.servers[shard], lc.backups[shard]
    while not np.array_equal(backup.read_local(0, begin, count),
                             primary.read_local(0, begin, count)):
        assert time.monotonic() < deadline, f"shard {shard}: the backup's rows differ"
        time.sleep(0.005)  # polling a deadline


def test_two_primary_kills_during_pushes_lose_nothing():
    with rdmaps.local_cluster(tables(), servers=2, workers=1, replicas=2) as lc, \
            lc.connect(0, wait_timeout=WAIT_TIMEOUT) as client:
        assert lc.protected() and lc.replacements_left == 4
        first_primary, first_backup = lc.servers[0], lc.backups[0]
        pusher = Pusher(client)
        pusher.wait_for(20)

        # 1. The primary of shard 0 dies: its backup takes over, a
        # replacement copies the shard from it while the pushes go on.
        assert lc.kill(0) is first_primary and first_primary.killed
        try:  # a deadline of 0: it says why it is not protected yet
            lc.wait_protected(0, timeout=0)
        except rdmaps.TimedOut as e:
            assert re.search("after 0 s: shard 0: (its primary .* died|it runs with one copy|"
                             "the replacement .* is catching up)", str(e)), e
        else:  # (only if this thread stood still through the whole re-protection)
            assert lc.reprotections
        at_kill = pusher.pushes
        pusher.wait_for(at_kill + 20)  # pushes go on through the failover
        entries = lc.wait_protected(timeout=20)
        assert lc.protected(0)
        assert lc.servers[0] is first_backup
        replacement = lc.backups[0]
        assert replacement not in (first_primary, first_backup)
        assert entries[0]["primary"] == first_backup.address
        assert entries[0]["backup"] == replacement.address
        assert lc.dead == [first_primary]
        assert len(lc.reprotections) == 1
        event = lc.reprotections[0]
        assert event["shard"] == 0 and event["backup"] == replacement.address
        assert event["catchup_bytes"] > 0 and event["catchup_seconds"] > 0
        assert first_backup.stats()["reprotections"] == 1
        with pytest.raises(rdmaps.FailedPrecondition, match="killed"):
            first_primary.stats()

        # 2. The pushes reach the replacement through the log; then the new
        # primary dies too: the replacement takes over with every push.
        at_protected = pusher.pushes
        pusher.wait_for(at_protected + 20)
        assert lc.kill(0) is first_backup
        pusher.wait_for(pusher.pushes + 20)
        lc.wait_protected(timeout=20)
        assert lc.servers[0] is replacement and len(lc.reprotections) == 2
        pusher.wait_for(pusher.pushes + 10)
        pusher.finish()

        client.flush()
        np.testing.assert_array_equal(client.pull("w", slice(0, ROWS)),
                                      np.broadcast_to((1.0 - pusher.counts)[:, None], (ROWS, DIM)))
        assert pusher.longest_call < WAIT_TIMEOUT
        for shard, begin in ((0, 0), (1, ROWS // 2)):  # both copies hold the same rows
            assert_copies_equal(lc, shard, begin, ROWS // 2)
        assert lc.replacements_left == 2 and lc.dead == [first_primary, first_backup]


def test_a_lost_backup_is_replaced_until_max_replacements_is_used():
    with rdmaps.local_cluster(tables(), servers=2, workers=1, replicas=2,
                              max_replacements=1) as lc, \
            lc.connect(0, wait_timeout=WAIT_TIMEOUT) as client:
        primary, backup = lc.servers[1], lc.backups[1]
        pusher = Pusher(client)
        pusher.wait_for(10)
        assert lc.kill(1, "backup") is backup
        lc.wait_protected(1, timeout=20)  # the primary went on alone, then got a new backup
        assert lc.servers[1] is primary and lc.backups[1] is not backup
        assert lc.replacements_left == 0
        pusher.wait_for(pusher.pushes + 10)

        # The budget is used: the next loss leaves the shard with one copy
        # (said at once, not at the deadline), and nothing is lost.
        new_backup = lc.backups[1]
        lc.kill(1)
        with pytest.raises(rdmaps.Unavailable, match="max_replacements"):
            lc.wait_protected(timeout=20)
        assert lc.servers[1] is new_backup and lc.backups[1] is None
        assert not lc.protected(1) and lc.protected(0)
        pusher.wait_for(pusher.pushes + 10)
        pusher.finish()
        client.flush()
        np.testing.assert_array_equal(client.pull("w", slice(0, ROWS))[:, 0], 1.0 - pusher.counts)
        with pytest.raises(rdmaps.FailedPrecondition, match="no live backup"):
            lc.kill(1, "backup")


def test_max_replacements_0_leaves_the_promoted_backup_alone():
    with rdmaps.local_cluster(tables(), servers=1, workers=1, replicas=2,
                              max_replacements=0) as lc:
        with lc.connect(0) as client:
            client.push("w", slice(0, ROWS), np.ones((ROWS, DIM), np.float32))
            client.flush()
            backup = lc.backups[0]
            lc.kill(0)
            with pytest.raises(rdmaps.Unavailable, match="max_replacements=0"):
                lc.wait_protected(timeout=20)
            assert lc.servers[0] is backup and lc.backups[0] is None and not lc.reprotections
            np.testing.assert_array_equal(client.pull("w", slice(0, ROWS)), 0.0)
        # The last copy dies: the shard is lost, and said so.
        lc.kill(0)
        with pytest.raises(rdmaps.Unavailable, match="no live copy"):
            lc.wait_protected(timeout=20)


def test_reprotection_needs_replicas_2():
    with rdmaps.local_cluster(tables(), servers=1) as lc:
        assert not lc.backups
        for call in (lambda: lc.kill(0), lambda: lc.wait_protected(timeout=1),
                     lambda: lc.shard_map(0)):
            with pytest.raises(rdmaps.FailedPrecondition, match="replicas=2"):
                call()
    with pytest.raises(ValueError, match="max_replacements"):
        rdmaps.local_cluster(tables(), replicas=2, max_replacements=-1)
