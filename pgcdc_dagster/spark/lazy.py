"""A Spark session that costs nothing until a run has Spark work, and overlaps its start.

A capture run needs Spark for snapshot chunks above the snapshot's Spark threshold and for
silver batches above the silver one only: an idle micro-batch, or one with a few changes,
never starts a JVM nor connects to a Spark Connect server. When a run does need Spark,
:meth:`LazySpark.start` builds the session on a background thread as soon as the need is
known (before the slot is created, the chunks planned and the Delta tables prepared), and
the first Spark job waits for it with :meth:`LazySpark.get`. The handle belongs to whoever
made it (the ``spark`` resource, for one run): :meth:`LazySpark.close` stops what it opened.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pgcdc_dagster.spark.session import Opened

_LOCAL = re.compile(r"^local(?:\[(\d+|\*)(?:,\s*\d+)?\])?$")


def local_parallelism(master: str) -> int | None:
    """Task slots of a ``local``/``local[N]``/``local[*]`` master (None for a cluster)."""
    match = _LOCAL.match(master.strip())
    if match is None:
        return None
    slots = match.group(1)
    if slots is None:
        return 1
    if slots == "*":
        return os.cpu_count() or 1
    return max(1, int(slots))


class LazySpark:
    """A Spark session built on first need, optionally in the background.

    ``build`` opens the session (it runs at most once; ``spark/session.open_session``);
    ``master`` lets the task slots of a local master be known without starting Spark
    (planning needs them before the session is up; None for a cluster or Spark Connect,
    whose slots the first job finds out: :meth:`parallelism`). ``on_ready`` hooks run on the
    building thread once the session exists (the snapshot starts its Python workers there).
    """

    def __init__(self, build: Callable[[], Opened], master: str | None = None) -> None:
        self._build = build
        self._master = master
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._opened: Opened | None = None
        self._session: SparkSession | None = None
        self._error: BaseException | None = None
        self._on_ready: list[Callable[[LazySpark], object]] = []
        self._slots: int | None = None
        self._probe = threading.Lock()
        self._built = threading.Event()
        """Set once the build ended (a session, or an error): :meth:`get` waits for this,
        not for the ``on_ready`` hooks that run after it on the building thread."""
        self.requested_at: float | None = None
        """``time.monotonic()`` when the background build started (None: not started, or a
        session that already existed)."""
        self.ready_at: float | None = None
        """``time.monotonic()`` when the session built by this handle was ready."""
        self.events: list[tuple[str, float]] = []
        """What happened to the session after it was ready (``workers ready``: its Python
        workers started), noted by its ``on_ready`` hooks (:meth:`note`)."""

    @classmethod
    def ready(cls, session: SparkSession) -> LazySpark:
        """A handle on a session that already exists (its caller's: never stopped here)."""
        from pgcdc_dagster.spark.session import Opened

        handle = cls(lambda: Opened(session, owned=False, kind="given"))
        handle._session = session
        return handle

    @classmethod
    def of(cls, spark: SparkLike) -> LazySpark:
        """``spark`` as a handle (a session is wrapped, a handle returned as is)."""
        return spark if isinstance(spark, LazySpark) else cls.ready(spark)

    @property
    def created(self) -> bool:
        """True once the session exists or its build started (Spark is being paid for)."""
        return self._session is not None or self._thread is not None

    def start(self, on_ready: Callable[[LazySpark], object] | None = None) -> None:
        """Build the session in the background (no-op once built or building).

        ``on_ready`` runs once the session exists: on the building thread, or at once when
        it is already there.
        """
        with self._lock:
            if self._session is not None:
                run_now = on_ready
            else:
                run_now = None
                if on_ready is not None:
                    self._on_ready.append(on_ready)
                if self._thread is None:
                    self.requested_at = time.monotonic()
                    self._thread = threading.Thread(target=self._run, name="pgcdc-spark-start",
                                                    daemon=True)
                    self._thread.start()
        if run_now is not None:
            run_now(self)

    def _run(self) -> None:
        try:
            opened = self._build()
        except BaseException as exc:  # re-raised by get() on the thread that needs Spark
            self._error = exc
            self._built.set()
            return
        self.ready_at = time.monotonic()
        self._opened, self._session = opened, opened.session
        self._built.set()
        for hook in self._on_ready:
            try:
                hook(self)
            except Exception:  # best effort (e.g. warming workers): get() still works
                pass

    def get(self) -> SparkSession:
        """The session: waits for a background build, or builds it now."""
        if self._session is not None:
            return self._session
        self.start()
        self._built.wait()
        if self._error is not None:
            raise self._error
        assert self._session is not None
        return self._session

    def close(self) -> None:
        """Stop what this handle opened (a session that already existed is left running);
        waits for a build under way first. The handle may be started again afterwards."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._lock:
            opened, self._opened = self._opened, None
            if opened is not None:
                self._session = None
                self._thread = None
                self._slots = None
                self._built.clear()
        if opened is not None:
            opened.close()

    @property
    def kind(self) -> str | None:
        """``local``, ``cluster``, ``connect`` or ``given`` once built (None before)."""
        return self._opened.kind if self._opened is not None else None

    def note(self, event: str) -> None:
        """Record ``event`` as happening now (thread-safe: hooks run on other threads)."""
        self.events.append((event, time.monotonic()))

    def timeline(self) -> list[tuple[str, float]]:
        """``spark start``, ``spark ready`` and the noted events, at ``time.monotonic()``."""
        marks = [(event, at) for event, at in (("spark start", self.requested_at),
                                               ("spark ready", self.ready_at))
                 if at is not None]
        return marks + list(self.events)

    def warm(self) -> int:
        """Start the session's Python workers (one task per slot, importing the chunk
        reader) and learn its task slots, once per session; ``workers ready`` is noted."""
        with self._probe:
            if self._slots is None:
                from pgcdc_dagster.spark.chunk_jobs import start_workers

                self._slots = start_workers(self.get())
                self.note("workers ready")
            return self._slots

    def parallelism(self) -> int:
        """Tasks the session runs at once: known from a local master without Spark (also
        the master a Spark Connect server reports), else found by a job (:meth:`warm`)."""
        if self._master is not None:
            local = local_parallelism(self._master)
            if local is not None:
                return local
        if self._slots is None and self._master is None:
            try:  # a given session, or a Spark Connect server's: its master may say
                local = local_parallelism(str(self.get().conf.get("spark.master", "")))
            except Exception:  # a server that does not show its master
                local = None
            if local is not None:
                return local
        return self.warm()


SparkLike = Union["SparkSession", LazySpark]
"""What the capture functions accept: a session, or a handle that builds one on need."""


def session_of(spark: SparkLike) -> SparkSession:
    """The session behind ``spark`` (built, or waited for, now)."""
    return spark.get() if isinstance(spark, LazySpark) else spark
