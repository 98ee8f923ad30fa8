"""Prometheus metrics shared by every process of a deployment, and the ledger's own.

Counters and histograms move in many processes at once: gunicorn's web workers and the RQ
workers' work horses. ``prometheus_client``'s multiprocess mode keeps each process's values in a
memory-mapped file under one directory, and the web's ``GET /metrics`` adds them up
(``saga_admin.metrics``). This module sets that mode up before any metric exists, so every module
that defines metrics imports it first (``recovery.metrics``, ``saga_admin.metrics``).

The directory is ``PROMETHEUS_MULTIPROC_DIR`` when set, else one derived from the deployment's
``DATABASE_URL`` and ``REDIS_URL`` (as given, or the paths of their ``_FILE`` variants) under the
system's temporary directory: every process of one deployment on one host finds the same
directory without being told, and two deployments (or two test runs) on one host never share one.
The web's gunicorn master removes the files of processes that are gone when it starts
(``saga_admin.gunicorn``).

An RQ worker forks a work horse for every job, one at a time. With one file per process that
would leave a file behind per job, and a scrape reads every file; so a worker's horses share one
identity (``<worker pid>-horse``), which is safe because a worker never runs two horses at once,
and each horse reads the values the previous one left before adding its own.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from prometheus_client import Counter, Histogram, values
from prometheus_client.mmap_dict import MmapedDict

DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
# What locates a deployment: processes that share these share a database and a queue.
_DEPLOYMENT_VARIABLES = ("DATABASE_URL", "DATABASE_URL_FILE", "REDIS_URL", "REDIS_URL_FILE")


def multiprocess_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where this deployment's processes keep their metric files on this host."""
    explicit = environ.get(DIR_VARIABLE, "").strip()
    if explicit:
        return Path(explicit)
    seed = "\0".join(environ.get(name, "") for name in _DEPLOYMENT_VARIABLES)
    digest = hashlib.sha256(seed.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"saga-admin-metrics-{os.getuid()}-{digest}"


def _prepare_dir() -> Path:
    path = multiprocess_dir()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"{path} is not writable")
    except OSError as exc:
        raise ImproperlyConfigured(
            f"{DIR_VARIABLE}={path}: the metrics directory cannot be created or written ({exc}). "
            f"Point {DIR_VARIABLE} at a writable directory every web and worker process of this host shares."
        ) from None
    # prometheus_client reads the directory from the environment each time a process opens its
    # files; set (to the same value) for this process and the ones it starts.
    os.environ[DIR_VARIABLE] = str(path)
    return path


def forget_dead_processes(path: Path | None = None) -> int:
    """Remove the files of processes that are no longer running: the web's gunicorn master calls
    it before it forks its workers, so a new deployment's counters start from zero. A process that
    still runs here (a worker started a moment before the web) keeps its file. One this host cannot
    see (another container's) counts as gone: its counters restart, which Prometheus's ``rate()``
    takes as the reset it is. Returns how many files went."""
    removed = 0
    for file in (path or multiprocess_dir()).glob("*.db"):
        if _running(file.stem.rsplit("_", 1)[-1]):
            continue
        try:
            file.unlink()
        except FileNotFoundError:
            continue
        removed += 1
    return removed


def _running(identity: str) -> bool:
    """Whether the process a file belongs to (``<pid>`` or ``<worker pid>-horse``) runs here,
    this process aside."""
    pid = identity.split("-", 1)[0]
    if not pid.isdigit() or int(pid) in (0, os.getpid()):
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: running
    return True


# --- One file per process, one per worker for its work horses ------------------------------

_identity: str | None = None


def as_work_horse() -> None:
    """Called first thing in an RQ work horse (forked by its worker, one at a time): it writes to
    its worker's one horse file, ``<worker pid>-horse``, instead of a file of its own."""
    global _identity
    _identity = f"{os.getppid()}-horse"


def _process_identifier() -> str:
    return _identity or str(os.getpid())


def _forget_if_idle() -> None:
    """At exit: a process that moved nothing (a management command, which loads the settings and
    so these metrics) leaves no files behind, so a host's files grow with its servers, not with
    every command ever run on it. A horse never gets here (it leaves by ``os._exit``)."""
    for file in MULTIPROCESS_DIR.glob(f"*_{_process_identifier()}.db"):
        try:
            entries = MmapedDict.read_all_values_from_file(str(file))  # type: ignore[no-untyped-call]
            if all(value == 0 for _key, value, _ts, _pos in entries):
                file.unlink()
        except (OSError, ValueError):
            continue  # unreadable or gone: left to the web's next start


MULTIPROCESS_DIR = _prepare_dir()
atexit.register(_forget_if_idle)
# Chosen before any metric is built (prometheus_client decides it when it is first imported, from
# the environment, which may be before this module set the variable).
values.ValueClass = values.MultiProcessValue(process_identifier=_process_identifier)  # type: ignore[no-untyped-call]


# --- The ledger's metrics ---------------------------------------------------------------------

# The ledger's hot writes, each one call of a server-side function (ledger.services.writes).
_WRITE_KINDS = {"saga_action_record": "record", "saga_action_move": "move"}
# What those functions answer when they wrote a row (the others: a replay, a refusal, "checks").
_WROTE = frozenset({"created", "moved"})

LEDGER_WRITES = Counter(
    "saga_ledger_writes",
    "Actions written to the ledger: recorded (kind=record) or moved to another state (kind=move).",
    ["kind"],
)
LEDGER_WRITE_SECONDS = Histogram(
    "saga_ledger_write_duration_seconds",
    "Round trip of one hot ledger write, one server-side function call (recording an action, the "
    "agent's start and reports; replays and refusals included), by kind.",
    ["kind"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
# Children looked up once: the append path pays one observe and at most one inc.
_WRITES = {function: LEDGER_WRITES.labels(kind) for function, kind in _WRITE_KINDS.items()}
_WRITE_SECONDS = {function: LEDGER_WRITE_SECONDS.labels(kind) for function, kind in _WRITE_KINDS.items()}


def ledger_write_observed(function: str, outcome: object, started: float) -> None:
    """One call of a ledger write function, started at ``time.perf_counter()`` ``started``,
    answered ``outcome``."""
    _WRITE_SECONDS[function].observe(time.perf_counter() - started)
    if outcome in _WROTE:
        _WRITES[function].inc()


def ledger_moved() -> None:
    """An action moved by a compare-and-set in this transaction (approvals, reconciling,
    compensation; the agent's own moves are hot writes): counted once it commits."""
    transaction.on_commit(_WRITES["saga_action_move"].inc)


# --- Pruning ------------------------------------------------------------------------------------

# The stores the worker prunes (ledger.pruning): Idempotency-Key records, finished notifications.
PRUNED_STORES = ("idempotency", "notifications")
PRUNED_ROWS = Counter(
    "saga_pruned_rows",
    "Rows pruned past their retention window, by store: idempotency (Idempotency-Key records) or "
    "notifications (delivered, dropped and failed outbox rows).",
    ["store"],
)
_PRUNED = {store: PRUNED_ROWS.labels(store) for store in PRUNED_STORES}


def rows_pruned(store: str, count: int) -> None:
    """``count`` rows of ``store`` deleted in this transaction: counted once it commits."""
    if count:
        transaction.on_commit(lambda: _PRUNED[store].inc(count))
