"""rdmaps: a parameter server over one-sided RDMA, from Python.

    import numpy as np, rdmaps

    tables = [rdmaps.Table(0, "w", rows=1000, dim=64,
                           init=rdmaps.Initializer("normal", stddev=0.01),
                           optimizer=rdmaps.Optimizer("adam", lr=1e-3),
                           staleness="bsp")]
    with rdmaps.local_cluster(tables, servers=2) as cluster, cluster.connect() as client:
        w = client.pull("w", slice(0, 10))          # (10, 64) float32, new array
        client.push("w", [3, 7, 7], np.ones((3, 64), np.float32))
        client.clock()

Under a launcher (rdmaps-local, torchrun, TF_CONFIG, ps-lite, mpirun, Slurm)
``rdmaps.init(tables)`` does what each process of the job must: describe the
tables when the launcher asks, serve when the layout makes this process a
server, else connect as a worker (the layout resolved exactly as the C++
tools resolve it, include/rdmaps/cluster.h).

Rows are an int (negative counts from the end), a slice, a range, or a 1-D
integer array / list of ids (any order, duplicates allowed, never negative).
Arrays are float32 numpy arrays or CPU torch tensors, C-contiguous, shaped
(rows, dim) (1-D when rows or dim is 1); anything else is refused with
rdmaps.InvalidArgument before anything is sent. Every call releases the GIL
while it waits; Ctrl-C raises KeyboardInterrupt within 50 ms and cancels the
interrupted call (Client::Interrupt in C++), so the client stays usable.

Errors: every rdmaps StatusCode is an exception class deriving from
rdmaps.Error (and from the matching built-in: InvalidArgument is a
ValueError, TimedOut a TimeoutError, Unavailable a ConnectionError, ...),
carrying the C++ Status message. See docs/python.md.
"""

import atexit
import logging
import os as _os
import sys
import threading
import time
import weakref

import numpy as _np

# verbs: registered memory must survive fork() (DataLoader workers); rdma-core
# reads this when it first opens a device. The extension sets it too (for the
# C environment); this keeps os.environ, which child processes inherit, in step.
_os.environ.setdefault("RDMAV_FORK_SAFE", "1")

from . import _rdmaps  # noqa: E402
from ._rdmaps import (  # noqa: F401  (re-exported)
    ASP,
    BSP,
    AlreadyExists,
    Cancelled,
    DataLoss,
    Error,
    FailedPrecondition,
    Future,
    Initializer,
    Internal,
    InvalidArgument,
    IOError,
    NotFound,
    NotSupported,
    Optimizer,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Table,
    TableInfo,
    TimedOut,
    Unavailable,
    auto_transport,
    initialize_rows,
    parse_tables_json,
    resolve_layout,
    tables_to_json,
)

__version__ = _rdmaps.__version__

_log = logging.getLogger("rdmaps")

__all__ = [
    "ASP", "BSP", "Client", "Error", "Future", "Initializer", "LocalCluster", "Optimizer",
    "Server", "Table", "TableInfo", "connect", "init", "local_cluster", "serve",
    "resolve_layout", "initialize_rows", "parse_tables_json", "tables_to_json",
    "describe_tables_if_asked", "auto_transport", "zeros",
    "AlreadyExists", "Cancelled", "DataLoss", "FailedPrecondition", "Internal",
    "InvalidArgument", "IOError", "NotFound", "NotSupported", "OutOfRange",
    "PermissionDenied", "ResourceExhausted", "TimedOut", "Unavailable",
]

# Clients still open at interpreter exit are closed first (their goodbye
# tells the servers this worker is done), while the interpreter still runs.
_live = weakref.WeakSet()
# LocalClusters with a re-protection thread: closed at exit (after the
# clients) so that the thread ends while the interpreter still runs.
_live_clusters = weakref.WeakSet()


@atexit.register
def _close_all():
    for c in list(_live) + list(_live_clusters):
        try:
            c.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def zeros(shape):
    """A C-contiguous float32 array of zeros in memory pages of its own.

    `shape` is an int or a tuple of ints. The memory is an anonymous mmap of
    whole pages that nothing else shares, so the array can be given to
    Client.register() on verbs in a process that forks (DataLoader workers):
    rdma-core hides registered pages from forked children whole. For torch:
    torch.from_numpy(rdmaps.zeros(shape)).
    """
    if isinstance(shape, int):
        shape = (shape,)
    return _rdmaps.zeros([int(d) for d in shape])


def _array(x, what):
    """A numpy view of a CPU torch tensor (shares its memory); numpy as is."""
    if x is None or type(x) is _np.ndarray:
        return x
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise InvalidArgument(
                f"{what}: the tensor is on {x.device}; rdmaps reads and writes CPU memory "
                "(use .cpu(), or pull into a CPU tensor and copy)")
        return x.detach().numpy()
    return x


def _table_list(tables):
    if tables is None:
        return []
    if isinstance(tables, str):
        return parse_tables_json(tables)
    return list(tables)


class Client:
    """A worker's connection to every parameter server of a job.

    Made by rdmaps.connect(), rdmaps.init() or LocalCluster.connect(). Calls
    run in the order they are made, on the client's own thread; the *_async
    forms return an rdmaps.Future at once. Usable as a context manager
    (close() at exit). Not usable in a forked child (FailedPrecondition):
    connect a new client there.
    """

    __slots__ = ("_c", "__weakref__")

    def __init__(self, impl):
        self._c = impl
        _live.add(self)

    # --- Description ------------------------------------------------------
    @property
    def tables(self):
        """The tables the servers publish: a list of rdmaps.TableInfo."""
        return self._c.tables

    def table(self, table):
        """The TableInfo of a table named by name or id (NotFound otherwise)."""
        return self._c.table(table)

    @property
    def worker_id(self):
        return self._c.worker_id

    @property
    def num_workers(self):
        return self._c.num_workers

    @property
    def num_servers(self):
        return self._c.num_servers

    @property
    def closed(self):
        return self._c.closed

    @property
    def transport(self):
        """The backend the client uses: "tcp", "verbs" or "fake" (never "auto")."""
        return self._c.transport

    # --- Synchronous calls -----------------------------------------------
    def pull(self, table, rows, out=None):
        """Reads `rows` of `table` into `out` (allocated when None); returns out.

        Waits as the table's consistency requires (BSP/SSP) and for this
        worker's own earlier pushes (read-my-writes).
        """
        if out is not None and type(out) is not _np.ndarray:
            out = _array(out, "pull: out")
        if type(rows) is not int and type(rows) is not slice:
            rows = _array(rows, "pull: rows")
        return self._c.pull(table, rows, out)

    def push(self, table, rows, grads):
        """Sends gradients for `rows` of `table`; the servers' optimizer applies them.

        Returns once the data is handed to the transport, not yet applied.
        """
        if type(grads) is not _np.ndarray:
            grads = _array(grads, "push: grads")
        if type(rows) is not int and type(rows) is not slice:
            rows = _array(rows, "push: rows")
        self._c.push(table, rows, grads)

    def push_pull(self, table, rows, grads, out=None):
        """push() then pull() of the same rows; the pull sees this push. Returns out."""
        return self._c.push_pull(table, _array(rows, "push_pull: rows"),
                                 _array(grads, "push_pull: grads"), _array(out, "push_pull: out"))

    def clock(self):
        """Ends this worker's iteration; returns the new clock (may wait: SSP/BSP)."""
        return self._c.clock()

    def barrier(self):
        """Returns when every worker has called barrier() as many times."""
        self._c.barrier()

    def flush(self):
        """Returns once the servers applied every push this worker made before it.

        Every later pull, by any worker, sees them (ps-lite's Wait on a push).
        """
        self._c.flush()

    def checkpoint(self):
        """A checkpoint of every table at this worker's clock; collective.

        Every worker calls it right after clock() and before the next push.
        Returns {"clock": c, "name": "ckpt-<c>"} once every server wrote its
        part durably (docs/ps.md, "Checkpoints").
        """
        c = self._c.checkpoint()
        return {"clock": c, "name": "ckpt-%020d" % c}

    def close(self):
        """Tells the servers this worker is done and disconnects. Idempotent."""
        self._c.close()

    # --- Asynchronous calls ----------------------------------------------
    def pull_async(self, table, rows, out=None):
        """pull() returning a Future whose result() is `out`; keep out untouched till then."""
        return self._c.pull_async(table, _array(rows, "pull: rows"), _array(out, "pull: out"))

    def push_async(self, table, rows, grads):
        """push() returning a Future; keep `grads` untouched until it is done."""
        return self._c.push_async(table, _array(rows, "push: rows"), _array(grads, "push: grads"))

    def push_pull_async(self, table, rows, grads, out=None):
        return self._c.push_pull_async(table, _array(rows, "push_pull: rows"),
                                       _array(grads, "push_pull: grads"),
                                       _array(out, "push_pull: out"))

    def clock_async(self):
        """clock() returning a Future whose result() is the new clock."""
        return self._c.clock_async()

    def barrier_async(self):
        return self._c.barrier_async()

    def flush_async(self):
        """flush() returning a Future."""
        return self._c.flush_async()

    # --- Zero-copy -------------------------------------------------------
    def register(self, array):
        """Pins `array` (float32 numpy array or CPU torch tensor) for zero-copy.

        Pulls into and pushes from arrays inside it copy nothing
        (stats()["bytes_staged"] stays 0 for them). The client keeps a
        reference until unregister() or close(). Returns `array`.

        On verbs the array must have memory pages of its own (rdma-core's
        fork protection hides registered pages from forked children, and a
        small heap array shares its pages with other objects): make it with
        rdmaps.zeros(shape); others are refused (InvalidArgument saying so).
        """
        self._c.register(_array(array, "register"))
        return array

    def unregister(self, array):
        """Forgets an array given to register(); later calls on it are staged."""
        self._c.unregister(_array(array, "unregister"))

    # --- Introspection ---------------------------------------------------
    def stats(self):
        """The client's counters (rdmaps::ClientStats) as a dict."""
        return self._c.stats()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        if self._c.closed:
            return "<rdmaps.Client closed>"
        return (f"<rdmaps.Client worker {self._c.worker_id}/{self._c.num_workers}, "
                f"{self._c.num_servers} servers, {len(self._c.tables)} tables>")


def _job_secret(job_token=None):
    """The job secret: `job_token` when given, else the sources the C++ tools
    read first (RDMAPS_JOB_SECRET_FILE, RDMAPS_JOB_SECRET, its old name
    RDMAPS_JOB_TOKEN); None when there is none (docs/security.md)."""
    if job_token:
        return job_token
    path = _os.environ.get("RDMAPS_JOB_SECRET_FILE")
    if path:
        with open(path) as f:
            return f.read().strip()
    return _os.environ.get("RDMAPS_JOB_SECRET") or _os.environ.get("RDMAPS_JOB_TOKEN") or None


def _new_job_secret():
    import secrets
    return secrets.token_hex(16)


def connect(servers=None, *, worker_id=None, num_workers=None, transport=None, job_token=None,
            tables=None, staleness=None, clock_waits=True, connect_timeout=30.0,
            wait_timeout=60.0, op_timeout=None, staging_bytes=None, env=None, max_workers=None,
            replicas=None, coordinator=None, **cluster):
    """Connects a worker to the servers; returns an rdmaps.Client.

    servers: a list of "host:port" (server index order), with worker_id and
    num_workers; transport "tcp" by default. Without servers, the layout comes
    from the environment (or `env`, a dict) exactly as the C++ tools resolve it
    (RDMAPS_*, TF_CONFIG, DMLC_*, torchrun, MPI, Slurm, loopback; rank-based
    sources run the rendezvous), the transport from it (else "auto"); extra
    keyword arguments are rdmaps::ClusterOptions fields (role, task_index,
    ps_hosts, num_servers, rendezvous, startup_timeout, ...).
    tables: when given, checked against the servers' (a list of rdmaps.Table,
    or tables JSON). staleness: 'bsp', 'asp' or s, tightening every table's.
    Timeouts are in seconds.
    max_workers: the servers' max_workers (elastic mode, docs/ps.md "Elastic
    workers"). replicas=2: the shards are replicated; the worker follows the
    shard map in the job's coordinator (`coordinator`, e.g.
    "etcd://HOST:PORT", else RDMAPS_COORDINATOR) and fails over to a
    promoted backup (docs/ps.md, "Replication and failover"). A layout from
    the environment with RDMAPS_REPLICAS=2 (rdmaps-local --replicas=2) does
    this by itself.
    """
    if isinstance(servers, str):
        servers = [s for s in servers.split(",") if s]
    if servers:
        # Explicit servers: the secret as given or from the environment (a
        # layout from the environment resolves its own, as the tools do).
        job_token = _job_secret(job_token)
    impl = _rdmaps.connect(servers, worker_id, num_workers, transport, job_token,
                           _table_list(tables), staleness, clock_waits, float(connect_timeout),
                           float(wait_timeout), op_timeout, staging_bytes, env, cluster,
                           max_workers, replicas, coordinator)
    return Client(impl)


class Server:
    """A parameter server in this process (its threads serve from the start).

    rdmaps.Server(tables, listen="127.0.0.1:0", server_index=0, num_servers=1,
    num_workers=1, transport="tcp", ...): .address is what workers connect
    to; run() blocks until every worker is done (or timeout / Ctrl-C), stop()
    ends it. Usable as a context manager (stop() at exit).
    max_workers: elastic mode (worker slots). replicas=2 with replica_role
    "backup" (start it first) or "primary" with backup_address (the
    backup's .address), both with the same server_index and `coordinator`
    ("memory:NAME" in one process, "dir:/PATH", "etcd://HOST:PORT"), where
    the shard map lives (docs/ps.md, "Replication and failover").
    rejoin_as_backup_of="HOST:PORT" (with replica_role "backup"): a
    replacement backup of a shard that runs with one copy, HOST:PORT its
    primary; it copies the shard, catches up from the log and becomes the
    backup (docs/ps.md, "Re-protection"). lease_ttl: s a primary's lease
    lasts without renewal (0.75 by default): a primary that hangs with its
    connections open is replaced after about this long. kill() ends the
    server as a dying process.
    """

    def __init__(self, tables, listen="127.0.0.1:0", *, server_index=0, num_servers=1,
                 num_workers=1, transport="tcp", job_token="", exit_when_workers_done=True,
                 push_slots=None, push_slot_bytes=None, apply_threads=0, op_timeout=None,
                 max_workers=0, replicas=1, replica_role="primary", backup_address="",
                 coordinator="", coordinator_prefix="rdmaps/job/", rejoin_as_backup_of="",
                 lease_ttl=None):
        # The job secret workers must prove: as given, else from the
        # environment, else a new one (give it to the workers: .job_token).
        self.job_token = _job_secret(job_token) or _new_job_secret()
        self._s = _rdmaps.start_server(_table_list(tables), listen, server_index, num_servers,
                                       num_workers, transport, self.job_token,
                                       exit_when_workers_done,
                                       push_slots, push_slot_bytes, apply_threads, op_timeout,
                                       max_workers, replicas, replica_role, backup_address,
                                       coordinator, coordinator_prefix, rejoin_as_backup_of,
                                       None if lease_ttl is None else float(lease_ttl))

    @property
    def address(self):
        return self._s.address

    def run(self, timeout=None):
        """Serves until every worker has closed (or stop()); TimedOut after timeout s."""
        self._s.run(timeout)

    @property
    def killed(self):
        """True once kill() ran."""
        return self._s.killed

    def stop(self):
        if not self._s.killed:
            self._s.stop()

    def kill(self):
        """Ends this server as if its process died (for failover tests).

        Its threads stop and every connection closes at once: with
        replicas=2 its peer takes over (a backup is promoted, a primary goes
        on alone) and workers fail over. Later calls but .address, stop()
        and kill() raise FailedPrecondition. Idempotent.
        """
        self._s.kill()

    def stats(self):
        """The server's counters (rdmaps::ServerStats) as a dict."""
        return self._s.stats()

    def read_local(self, table, begin, count):
        """This server's current values of rows [begin, begin+count) it owns, flat float32."""
        return self._s.read_local(table, begin, count)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def serve(tables, *, transport=None, env=None, **cluster):
    """Serves `tables` as the server the launcher's layout makes this process.

    Joins the rendezvous when the source needs one (torchrun, MPI, Slurm) and
    returns when every worker is done. FailedPrecondition if the layout makes
    this process a worker.
    """
    _rdmaps.serve(_table_list(tables), transport, env, cluster)


def describe_tables_if_asked(tables):
    """True (after writing them) when a launcher asked for the tables: exit 0 then."""
    return _rdmaps.describe_tables_if_asked(_table_list(tables))


def init(tables, *, env=None, transport=None, **connect_args):
    """What every process of a launched job calls first; returns a Client.

    - rdmaps-local asking for the tables (RDMAPS_DESCRIBE_TABLES): writes them
      and exits the process (status 0);
    - a process the layout makes a server (torchrun's first RDMAPS_NUM_SERVERS
      ranks, RDMAPS_ROLE=ps, TF_CONFIG's ps tasks, ...): serves the tables
      until the job ends, then exits (status 0);
    - a worker: rdmaps.connect(tables=tables, env=env, transport=transport,
      **connect_args).
    """
    tables = _table_list(tables)
    if describe_tables_if_asked(tables):
        sys.exit(0)
    if resolve_layout(env)["role"] == "ps":
        serve(tables, transport=transport, env=env)
        sys.exit(0)
    return connect(tables=tables, env=env, transport=transport, **connect_args)


class _ShardCare:
    """LocalCluster's re-protection state of one shard (under its lock)."""

    __slots__ = ("replacement", "give_up", "not_before", "lost_at", "final", "said")

    def __init__(self):
        self.replacement = None  # a replacement Server in its catch-up
        self.give_up = 0.0       # when that replacement is killed if not in sync
        self.not_before = 0.0    # no replacement starts before this
        self.lost_at = None      # when the shard was first seen with one copy
        self.final = None        # why no replacement will come (then Unavailable)
        self.said = None         # the last condition logged (each is logged once)


class LocalCluster:
    """Servers running in this process, for notebooks and tests.

    rdmaps.local_cluster(tables, servers=2, workers=1, transport="tcp"):
    .addresses lists the servers; .connect(worker_id=0, **kw) connects a
    worker (a Client); close() stops the servers. Context manager.
    Workers may also be other processes: give them .addresses.
    max_workers: elastic mode (worker slots; workers connect with ids below
    it). replicas=2: a backup (.backups[i]) and a primary (.servers[i]) per
    shard, the shard map in an in-process coordinator (.coordinator);
    .connect gives workers that fail over to a promoted backup.

    Re-protection (replicas=2): when a copy of a shard dies (kill(shard)
    in a test) the survivor serves alone, and a background thread starts a
    replacement backup that copies the shard from it while the workers go
    on pushing, catches up from the log and becomes the backup (the shard
    map names it), at most `max_replacements` times per cluster (4, as
    rdmaps-local; 0: never). .servers[i] and .backups[i] follow the shard
    map (.backups[i] is None while shard i has one copy);
    wait_protected() waits, with a deadline, until every shard has two
    copies again; .reprotections lists each one done. A replacement not in
    sync within `reprotect_timeout` s is killed and another one started.
    Logged on the "rdmaps" logger. lease_ttl (5 s here, 0.75 s for a
    Server): a primary that hangs without dying is replaced after about
    this long; a killed one at once (its connections close). Longer than
    a Server's so that a loaded machine's stalls are not taken for a hang.
    """

    _next_id = 0
    _POLL = 0.02  # s between two looks at the shard map (re-protection)

    def __init__(self, tables, servers=1, workers=1, transport="tcp", job_token="",
                 host="127.0.0.1", max_workers=0, replicas=1, max_replacements=4,
                 reprotect_timeout=60.0, lease_ttl=5.0, **server_args):
        if replicas not in (1, 2):
            raise ValueError(f"replicas={replicas!r} is not 1 or 2")
        if type(max_replacements) is not int or max_replacements < 0:
            raise ValueError(f"max_replacements={max_replacements!r} is not an int >= 0")
        if not reprotect_timeout > 0:
            raise ValueError(f"reprotect_timeout={reprotect_timeout!r} is not > 0 seconds")
        self.tables = _table_list(tables)
        self.num_workers = workers
        self.max_workers = max_workers
        self.replicas = replicas
        self.transport = transport
        self.job_token = _job_secret(job_token) or _new_job_secret()
        self.max_replacements = max_replacements if replicas == 2 else 0
        self.reprotect_timeout = float(reprotect_timeout)
        self.coordinator = None
        # Each completed re-protection: {"shard", "backup" (the replacement's
        # address), "primary", "epoch", "seconds" (from the loss to the map
        # naming the replacement), "catchup_bytes", "catchup_seconds"}.
        self.reprotections = []
        self.replacements_started = 0
        self.dead = []  # the copies that died or were killed, in that order
        self._cv = threading.Condition()
        self._closing = threading.Event()
        self._supervisor = None
        self._care = []
        self._shard_map = None
        self._host = host
        if replicas == 2:
            LocalCluster._next_id += 1
            self.coordinator = f"memory:rdmaps-local-cluster-{_os.getpid()}-{LocalCluster._next_id}"
        self.servers = []
        self.backups = []
        self._common = dict(num_servers=servers, num_workers=workers, transport=transport,
                            job_token=self.job_token, exit_when_workers_done=False,
                            max_workers=max_workers, **server_args)
        if replicas == 2:
            self._common["lease_ttl"] = lease_ttl
        common = self._common
        try:
            for i in range(servers):
                backup_address = ""
                if replicas == 2:
                    self.backups.append(Server(self.tables, f"{host}:0", server_index=i,
                                               replicas=2, replica_role="backup",
                                               coordinator=self.coordinator, **common))
                    backup_address = self.backups[-1].address
                    extra = dict(replicas=2, backup_address=backup_address,
                                 coordinator=self.coordinator)
                else:
                    extra = {}
                self.servers.append(Server(self.tables, f"{host}:0", server_index=i,
                                           **extra, **common))
            if replicas == 2:
                self._shard_map = _rdmaps.open_shard_map(
                    self.coordinator, server_args.get("coordinator_prefix", "rdmaps/job/"))
                self._care = [_ShardCare() for _ in range(servers)]
                # (The thread holds the cluster weakly: one nobody closed is
                # still collected, which stops its servers.)
                self._supervisor = threading.Thread(
                    target=LocalCluster._supervise, args=(weakref.ref(self), self._closing),
                    daemon=True, name="rdmaps-reprotect")
                _live_clusters.add(self)
                self._supervisor.start()
        except BaseException:
            self.close()
            raise

    @property
    def addresses(self):
        return [s.address for s in self.servers]

    def connect(self, worker_id=0, **connect_args):
        """A Client for worker `worker_id` of this cluster."""
        connect_args.setdefault("transport", self.transport)
        connect_args.setdefault("job_token", self.job_token)
        if self.max_workers:
            connect_args.setdefault("max_workers", self.max_workers)
        if self.replicas == 2:
            connect_args.setdefault("replicas", 2)
            connect_args.setdefault("coordinator", self.coordinator)
        return connect(self.addresses, worker_id=worker_id, num_workers=self.num_workers,
                       **connect_args)

    def env(self, worker_id):
        """The environment a worker process of this cluster resolves its layout from."""
        return {"RDMAPS_ROLE": "worker", "RDMAPS_TASK_INDEX": str(worker_id),
                "RDMAPS_PS_HOSTS": ",".join(self.addresses),
                "RDMAPS_NUM_WORKERS": str(self.num_workers),
                "RDMAPS_TRANSPORT": self.transport, "RDMAPS_JOB_SECRET": self.job_token}

    # --- Failures and re-protection (replicas=2) ---------------------------
    def shard_map(self, shard):
        """Shard `shard`'s entry of the shard map: {"shard", "epoch", "primary", "backup"}."""
        self._need_replicas("shard_map")
        return self._shard_map.current(shard)

    def kill(self, shard, role="primary"):
        """Kills the current primary (or, role="backup", backup) of `shard`
        as if its process died (Server.kill()); returns that Server.

        The survivor takes over at once (workers fail over to a promoted
        backup) and re-protection starts a replacement backup. Raises
        FailedPrecondition when the shard has no such live copy now.
        """
        self._need_replicas("kill")
        if role not in ("primary", "backup"):
            raise ValueError(f"role={role!r} is not 'primary' or 'backup'")
        with self._cv:
            s = (self.servers if role == "primary" else self.backups)[shard]
            if s is None or s.killed:
                raise FailedPrecondition(f"shard {shard} has no live {role} to kill now")
            s.kill()
            care = self._care[shard]
            if care.lost_at is None:
                care.lost_at = time.monotonic()
            self._cv.notify_all()
            return s

    @property
    def replacements_left(self):
        """How many more replacement backups re-protection may start."""
        return max(0, self.max_replacements - self.replacements_started)

    def protected(self, shard=None):
        """True when shard `shard` (None: every shard) has two live copies
        that the shard map names as its primary and its backup."""
        shards = range(len(self.servers)) if shard is None else [shard]
        with self._cv:
            return all(self._unprotected_why(i) is None for i in shards)

    def wait_protected(self, shard=None, timeout=30.0):
        """Waits until shard `shard` (None: every shard) is protected again.

        Returns the shard map entries ({shard: entry}). Raises TimedOut
        after `timeout` s (naming each shard still waiting and why), and
        Unavailable at once for a shard no replacement will come to (no
        live copy left, max_replacements used, re-protection off).
        """
        self._need_replicas("wait_protected")
        shards = range(len(self.servers)) if shard is None else [shard]
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                waiting = [(i, self._unprotected_why(i)) for i in shards]
                waiting = [(i, why) for i, why in waiting if why is not None]
                if not waiting:
                    return {i: self._shard_map.current(i) for i in shards}
                for i, why in waiting:
                    final = self._final_why(i)
                    if final:
                        raise Unavailable(f"shard {i} is not re-protected: {final}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimedOut(f"wait_protected: after {timeout} s: " +
                                   "; ".join(f"shard {i}: {why}" for i, why in waiting))
                self._cv.wait(min(left, self._POLL))

    def _need_replicas(self, what):
        if self.replicas != 2:
            raise FailedPrecondition(f"LocalCluster.{what} needs replicas=2 (this cluster has "
                                     "one copy of each shard)")

    def _unprotected_why(self, shard):
        """None when `shard` is protected, else why not (under the lock)."""
        primary, backup = self.servers[shard], self.backups[shard]
        if self.replicas != 2:
            return "the cluster has replicas=1"
        if primary.killed:
            return f"its primary {primary.address} died; the backup takes over"
        if backup is None or backup.killed:
            care = self._care[shard]
            if care.replacement is not None:
                return f"the replacement {care.replacement.address} is catching up"
            return f"it runs with one copy ({primary.address})"
        entry = self._shard_map.current(shard)
        if entry["primary"] != primary.address or entry["backup"] != backup.address:
            return (f"the shard map (epoch {entry['epoch']}: primary {entry['primary']}, backup "
                    f"{entry['backup'] or 'none'}) does not name it yet")
        return None

    def _final_why(self, shard):
        """Why no replacement will come to `shard` (None: one may; under the lock)."""
        primary, backup = self.servers[shard], self.backups[shard]
        if primary.killed and (backup is None or backup.killed):
            return f"no live copy is left (primary {primary.address} died alone)"
        return self._care[shard].final

    def _say(self, care, level, message):
        if care.said != message:
            care.said = message
            _log.log(level, "%s", message)

    @staticmethod
    def _supervise(cluster, closing):
        """The re-protection thread: looks at the shard map every _POLL s."""
        while not closing.wait(LocalCluster._POLL):
            lc = cluster()
            if lc is None:
                return
            for shard in range(len(lc._care)):
                if closing.is_set():
                    return
                try:
                    lc._reprotect_step(shard)
                except Error as e:  # (the map unreadable: try again at the next look)
                    with lc._cv:
                        lc._say(lc._care[shard], logging.WARNING,
                                f"shard {shard}: re-protection: {e}")
            del lc

    def _retire(self, server):
        """A copy the shard map dropped: killed (if alive) and listed in .dead."""
        server.kill()
        self.dead.append(server)

    def _reprotect_step(self, shard):
        entry = self._shard_map.current(shard)
        now = time.monotonic()
        with self._cv:
            care = self._care[shard]
            primary, backup = self.servers[shard], self.backups[shard]
            # The shard map's primary: a promoted backup (its primary died).
            if entry["primary"] != primary.address and backup is not None \
                    and entry["primary"] == backup.address:
                self._say(care, logging.WARNING,
                          f"shard {shard}: primary {primary.address} lost; backup "
                          f"{backup.address} promoted at epoch {entry['epoch']}")
                self._retire(primary)
                self.servers[shard], self.backups[shard] = backup, None
                primary, backup = backup, None
                if care.lost_at is None:
                    care.lost_at = now
                self._cv.notify_all()
            if entry["primary"] != primary.address:
                return  # (a decision not reflected here yet)
            if entry["backup"] == "" and backup is not None:
                self._say(care, logging.WARNING,
                          f"shard {shard}: backup {backup.address} lost; primary "
                          f"{primary.address} serves alone at epoch {entry['epoch']}")
                self._retire(backup)
                self.backups[shard] = backup = None
                if care.lost_at is None:
                    care.lost_at = now
                self._cv.notify_all()
            if backup is not None:
                return  # protected (or failing over: the map has not changed yet)
            if primary.killed:
                if care.replacement is not None:  # (its copy died with the primary)
                    self._retire(care.replacement)
                    care.replacement = None
                care.final = self._final_why(shard)
                self._say(care, logging.ERROR, f"shard {shard} lost: {care.final}")
                self._cv.notify_all()
                return
            if care.replacement is not None:
                r = care.replacement
                if entry["backup"] == r.address:
                    stats = r.stats()
                    self.backups[shard], care.replacement = r, None
                    event = {"shard": shard, "backup": r.address, "primary": primary.address,
                             "epoch": entry["epoch"], "seconds": now - (care.lost_at or now),
                             "catchup_bytes": stats["catchup_bytes"],
                             "catchup_seconds": stats["catchup_seconds"]}
                    self.reprotections.append(event)
                    care.lost_at = None
                    self._say(care, logging.INFO,
                              f"shard {shard} is protected again: {r.address} is the backup of "
                              f"{primary.address} at epoch {entry['epoch']} (copied "
                              f"{event['catchup_bytes']} bytes, in sync after "
                              f"{event['catchup_seconds']:.3f} s)")
                    self._cv.notify_all()
                elif r.killed or now >= care.give_up:
                    self._say(care, logging.WARNING,
                              f"shard {shard}: the replacement {r.address} is not in sync "
                              f"{self.reprotect_timeout} s after it started; killing it")
                    self._retire(r)
                    care.replacement = None
                    care.not_before = now + 1.0
                return
            if now < care.not_before or self._closing.is_set():
                return
            if self.max_replacements == 0:
                care.final = ("it runs with one copy and re-protection is off "
                              "(LocalCluster(max_replacements=0))")
            elif self.replacements_started >= self.max_replacements:
                care.final = (f"it runs with one copy: the {self.max_replacements} replacements "
                              "LocalCluster(max_replacements=...) allows were used")
            if care.final:
                self._say(care, logging.WARNING, f"shard {shard} is not re-protected: {care.final}")
                self._cv.notify_all()
                return
            self.replacements_started += 1
            started = self.replacements_started
            primary_address = primary.address
            self._say(care, logging.INFO,
                      f"shard {shard} has one copy ({primary_address}): starting a replacement "
                      f"backup ({started} of {self.max_replacements})")
        # Start() returns once the primary took the replacement (its copy and
        # catch-up go on in the background); without the lock, which the
        # workers' threads do not need but wait_protected does.
        try:
            r = Server(self.tables, f"{self._host}:0", server_index=shard, replicas=2,
                       replica_role="backup", coordinator=self.coordinator,
                       rejoin_as_backup_of=primary_address, **self._common)
        except Error as e:
            with self._cv:
                self._say(care, logging.WARNING,
                          f"shard {shard}: the replacement backup did not start ({e}); "
                          "trying again in 1 s")
                care.not_before = time.monotonic() + 1.0
            return
        with self._cv:
            care.replacement = r
            care.give_up = time.monotonic() + self.reprotect_timeout
            self._cv.notify_all()

    def close(self):
        self._closing.set()
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join()
        with self._cv:
            everything = self.servers + [b for b in self.backups if b is not None]
            everything += [c.replacement for c in self._care if c.replacement is not None]
            for c in self._care:
                c.replacement = None
            self.servers = []
            self.backups = []
            self._cv.notify_all()
        for s in everything:
            s.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def local_cluster(tables, servers=1, workers=1, transport="tcp", **kwargs):
    """Starts `servers` parameter servers in this process; returns a LocalCluster."""
    return LocalCluster(tables, servers=servers, workers=workers, transport=transport, **kwargs)
