"""Starting the Spark JVM before the run exists, in a process that will snapshot.

A snapshot run needs Spark for its chunks, and the JVM's start takes seconds. A process
started to execute the ``initial_snapshot`` job (``dagster job execute -j initial_snapshot``,
or the run worker the daemon or the UI launches: ``dagster api execute_run``) starts the
session on a background thread as soon as the code location's module is imported, while
Dagster imports the rest, loads the definitions, creates the run and sets up the step
(issue 16). It does so only when the snapshot is bound to read chunks (the slot is missing or
lost, or ``snapshot.mode = always``): otherwise the snapshot step starts Spark itself once it
knows it has chunks to read, and a run without Spark work starts no JVM.

The session handle is shared by the process, one per settings (:func:`shared_handle`; a JVM
is one per process anyway), so the run's ``SparkResource`` gets the handle started here.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from pgcdc_dagster.spark.lazy import LazySpark
from pgcdc_dagster.spark.session import (
    DAEMON_MODULE_CONF,
    build_context,
    build_session,
    session_settings,
)
from pgcdc_dagster.spark.worker_daemon import DAEMON_MODULE, zygote

if TYPE_CHECKING:
    from pgcdc_dagster.spark.lazy import HasContext

PRESTART_JOB = "initial_snapshot"
"""The job whose process starts Spark before the run (its snapshot step reads chunks)."""
DEFAULT_MASTER = "local[2]"
DEFAULT_APP_NAME = "pgcdc_dagster"
"""``SparkResource``'s defaults: the run's resource must find the handle started here."""
DEFAULT_SLOT = "pgcdc"
DEFAULT_MODE = "initial"
"""``CaptureResource``'s defaults of ``slot`` and ``snapshot_mode``."""

log = logging.getLogger(__name__)

_HANDLES: dict[tuple[str, str, tuple[tuple[str, str], ...], str | None], LazySpark] = {}
_HANDLES_LOCK = threading.Lock()


def shared_handle(master: str, app_name: str = DEFAULT_APP_NAME,
                  conf: Mapping[str, str] | None = None,
                  driver_memory: str | None = None) -> LazySpark:
    """The process's handle on the session of these settings (created on first call)."""
    settings = dict(conf or {})
    key = (master, app_name, tuple(sorted(settings.items())), driver_memory)
    with _HANDLES_LOCK:
        handle = _HANDLES.get(key)
        if handle is None:
            handle = LazySpark(
                lambda: build_session(master, app_name, settings, driver_memory), master,
                quick_build=lambda: build_context(master, app_name, settings, driver_memory,
                                                  quick_start=True))
            _HANDLES[key] = handle
        return handle


def _job_names(value: object) -> Iterator[str]:
    """``job_name``/``pipeline_name`` values anywhere in a decoded JSON document."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("job_name", "pipeline_name") and isinstance(item, str):
                yield item
            else:
                yield from _job_names(item)
    elif isinstance(value, list):
        for item in value:
            yield from _job_names(item)


def job_of_process(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """The job this process was started to execute, when its command line says so:
    ``dagster job execute ... -j NAME`` (``--job NAME``, ``--job=NAME``), or a run worker
    ``dagster api execute_run`` (the run's arguments as JSON, on the command line or in
    ``DAGSTER_EXECUTE_RUN_ARGS``). None otherwise (a code server, the webserver, a test)."""
    args = list(argv[1:])
    if args[:2] == ["job", "execute"]:
        for i, arg in enumerate(args):
            if arg in ("-j", "--job") and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith("--job="):
                return arg.split("=", 1)[1]
        return None
    if args[:2] == ["api", "execute_run"]:
        documents = [a for a in args[2:] if a.startswith("{")]
        documents += [environ.get("DAGSTER_EXECUTE_RUN_ARGS", "")]
        for document in documents:
            try:
                names = set(_job_names(json.loads(document)))
            except ValueError:
                continue
            if len(names) == 1:
                return names.pop()
    return None


def snapshot_will_read(dsn: str, slot: str, snapshot_mode: str) -> bool:
    """True when the ``initial_snapshot`` job's snapshot step is bound to read chunks: the
    slot is missing or lost (modes that create it with a snapshot), or ``snapshot.mode`` is
    ``always``. In any other case (the slot exists, ``no_data``, ``initial_only``, an
    unreachable source) the step starts Spark itself once it knows it has chunks to read."""
    # Light imports only (psycopg2): the JVM's launch waits for this check, and the capture
    # modules (pyarrow, deltalake) are imported by the code location meanwhile.
    from pgcdc_dagster.postgres.connection import connection
    from pgcdc_dagster.postgres.slot import slot_info

    if snapshot_mode == "always":
        return True
    if snapshot_mode not in ("initial", "when_needed"):
        return False
    try:
        with connection(dsn) as conn:
            info = slot_info(conn, slot)
        return info is None or not info.usable
    except Exception:  # the run reports the source's problem, not the code location
        return False


def prestart(master: str, app_name: str = DEFAULT_APP_NAME,
             conf: Mapping[str, str] | None = None,
             driver_memory: str | None = None) -> LazySpark:
    """Start the process's session of these settings in the background, for snapshot chunks
    (a quick start; the Python workers are started once it is up); return its handle.
    The chunk reader's modules are not imported here: the JVM's launch does not wait for
    them. A local master's worker daemon gets them from a zygote that imports them while
    the JVM starts (``spark/worker_daemon/zygote.py``); the workers are started by
    ``warm_workers`` once the session is up."""
    handle = shared_handle(master, app_name, conf, driver_memory)
    if not handle.created and uses_our_daemon(master, conf):
        try:
            _ZYGOTES.append(zygote.start())
        except OSError as exc:  # the daemon imports its modules itself, a little later
            log.info("no worker zygote (%s): Spark's daemon imports its own modules", exc)

    def warm(spark: HasContext) -> object:
        from pgcdc_dagster.spark.snapshot_tasks import warm_workers

        return warm_workers(spark, note=handle.note)

    handle.start(on_ready=warm, quick=True)
    return handle


_DONE: list[bool] = []
_ZYGOTES: list[zygote.Zygote] = []
"""The zygote this process started (it ends with the process, or once it served)."""


def uses_our_daemon(master: str, conf: Mapping[str, str] | None) -> bool:
    """True when the session's Python workers come from this project's daemon (a local
    master, the daemon module not set to another by the user)."""
    settings = session_settings(master, conf)
    return settings.get(DAEMON_MODULE_CONF) == DAEMON_MODULE


def prestart_for_process(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Start Spark now if this process executes ``initial_snapshot`` and its snapshot will
    read chunks (settings from the ``PGCDC_*`` variables, as the code location's resources
    read them). Once per process; True when this call started it."""
    if _DONE or job_of_process(argv, environ) != PRESTART_JOB:
        return False
    _DONE.append(True)
    dsn = environ.get("PGCDC_PG_DSN")
    if not dsn or not snapshot_will_read(dsn, environ.get("PGCDC_SLOT") or DEFAULT_SLOT,
                                         environ.get("PGCDC_SNAPSHOT_MODE") or DEFAULT_MODE):
        return False
    prestart(environ.get("PGCDC_SPARK_MASTER") or DEFAULT_MASTER)
    return True
