"""A Spark session that costs nothing until a run has Spark work, and overlaps its start.

A capture run needs Spark for snapshot chunks and for silver batches over the Spark threshold
only: an idle micro-batch, or one with a few changes, never starts a JVM. When a run does need
Spark, :meth:`LazySpark.start` builds the session on a background thread as soon as the need
is known (before the slot is created, the chunks planned and the Delta tables prepared), and
the first Spark job waits for it with :meth:`LazySpark.get` (issue 16).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Union

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

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


START_SWITCH_INTERVAL = 0.0005
"""The interpreter's thread switch interval (seconds; Python's default 0.005) while a session
starts in the background. The start makes ~150 py4j calls (the context's creation, the
workers' warm-up job), each a socket round trip after which the starting thread waits for the
GIL; while another thread runs Python (Dagster setting up the run, the step planning the
chunks), each wait lasted up to the switch interval: ~4 ms per call instead of ~0.5 ms
measured with a busy thread beside it."""

class _Switches:
    """The starts under way and the switch interval in force before the first of them."""

    lock = threading.Lock()
    starts = 0
    before = 0.0


@contextmanager
def quick_switches() -> Iterator[None]:
    """Run the block with :data:`START_SWITCH_INTERVAL` as the switch interval (a shorter one
    already set is kept); the interval in force before is restored when the last start
    under way ends, unless something else changed it meanwhile."""
    with _Switches.lock:
        if _Switches.starts == 0:
            _Switches.before = sys.getswitchinterval()
        _Switches.starts += 1
        ours = min(_Switches.before, START_SWITCH_INTERVAL)
        sys.setswitchinterval(ours)
    try:
        yield
    finally:
        with _Switches.lock:
            _Switches.starts -= 1
            if _Switches.starts == 0 and sys.getswitchinterval() == ours:
                sys.setswitchinterval(_Switches.before)


class HasContext(Protocol):
    """What Python-task work (snapshot chunks) needs: a Spark context. A session has one;
    :meth:`LazySpark.tasks` gives one without building the SQL session."""

    @property
    def sparkContext(self) -> SparkContext: ...


@dataclass(frozen=True)
class ContextOnly:
    """A Spark context where a session is not needed (:class:`HasContext`)."""

    sparkContext: SparkContext


class LazySpark:
    """A Spark session built on first need, optionally in the background.

    ``build`` creates the session (it runs at most once); ``master`` lets the task slots of
    a local master be known without starting the JVM (planning needs them before the session
    is up). ``on_ready`` hooks run on the building thread once the context exists (the
    snapshot starts its Python workers there). ``quick_build``, when given, is what a start
    for work done by Python tasks uses (:meth:`start` with ``quick``): the Spark **context**
    alone, on a JVM that starts sooner because it compiles less
    (``build_context(quick_start=True)``); :meth:`tasks` hands it out, and :meth:`get`
    builds the SQL session on it only when something asks for one.
    """

    def __init__(self, build: Callable[[], SparkSession], master: str | None = None,
                 quick_build: Callable[[], SparkContext] | None = None) -> None:
        self._build = build
        self._quick_build = quick_build
        self._master = master
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._session: SparkSession | None = None
        self._context: SparkContext | None = None
        self._error: BaseException | None = None
        self._on_ready: list[Callable[[HasContext], object]] = []
        self.requested_at: float | None = None
        """``time.monotonic()`` when the background build started (None: not started, or a
        session that already existed)."""
        self.ready_at: float | None = None
        """``time.monotonic()`` when the context (or session) built by this handle was
        ready."""
        self.events: list[tuple[str, float]] = []
        """What happened to the session after it was ready (``workers ready``: its Python
        workers started), noted by its ``on_ready`` hooks (:meth:`note`)."""

    @classmethod
    def ready(cls, session: SparkSession) -> LazySpark:
        """A handle on a session that already exists."""
        handle = cls(lambda: session)
        handle._session = session  # its context is read only when needed (None: no Spark)
        return handle

    @classmethod
    def of(cls, spark: SparkLike) -> LazySpark:
        """``spark`` as a handle (a session is wrapped, a handle returned as is)."""
        return spark if isinstance(spark, LazySpark) else cls.ready(spark)

    @property
    def created(self) -> bool:
        """True once the session exists (or its build started: the JVM is being paid for)."""
        return self._up or self._thread is not None

    def start(self, on_ready: Callable[[HasContext], object] | None = None, *,
              quick: bool = False) -> None:
        """Build the session in the background (no-op once built or building).

        ``on_ready`` runs once the context exists: on the building thread, or at once when
        it is already there. ``quick``: the run's Spark work is Python tasks (snapshot
        chunks), so the first start may use ``quick_build`` (the context alone).
        """
        with self._lock:
            if self._up:
                run_now = on_ready
            else:
                run_now = None
                if on_ready is not None:
                    self._on_ready.append(on_ready)
                if self._thread is None:
                    self.requested_at = time.monotonic()
                    quick_build = self._quick_build if quick else None
                    self._thread = threading.Thread(target=self._run, args=(quick_build,),
                                                    name="pgcdc-spark-start", daemon=True)
                    self._thread.start()
        if run_now is not None:
            run_now(self._holder())

    def _run(self, quick_build: Callable[[], SparkContext] | None) -> None:
        with quick_switches():
            self._build_and_hook(quick_build)

    def _build_and_hook(self, quick_build: Callable[[], SparkContext] | None) -> None:
        try:
            if quick_build is not None:
                context = quick_build()
            else:
                self._session = self._build()
                context = self._session.sparkContext
        except BaseException as exc:  # re-raised by get() on the thread that needs Spark
            self._error = exc
            return
        self.ready_at = time.monotonic()
        self._context = context
        for hook in self._on_ready:
            try:
                hook(self._holder())
            except Exception:  # best effort (e.g. warming workers): get() still works
                pass

    @property
    def _up(self) -> bool:
        return self._session is not None or self._context is not None

    def _holder(self) -> HasContext:
        if self._session is not None:
            return self._session
        assert self._context is not None
        return ContextOnly(self._context)

    def _wait(self) -> None:
        """Wait for the background build (starting a full one if none was asked for)."""
        if self._up:
            return
        self.start()
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error

    def tasks(self) -> HasContext:
        """The context, for work that is only Python tasks: waits for a background build
        (or builds the session now) but builds no SQL session on a quick one."""
        self._wait()
        return self._holder()

    def get(self) -> SparkSession:
        """The session: waits for a background build, or builds it now (on the context of
        a quick build: the SQL session only now)."""
        if self._session is not None:
            return self._session
        self._wait()
        with self._lock:
            if self._session is None:
                self._session = self._build()
        return self._session

    def note(self, event: str) -> None:
        """Record ``event`` as happening now (thread-safe: hooks run on other threads)."""
        self.events.append((event, time.monotonic()))

    def timeline(self) -> list[tuple[str, float]]:
        """``spark start``, ``spark ready`` and the noted events, at ``time.monotonic()``."""
        marks = [(event, at) for event, at in (("spark start", self.requested_at),
                                               ("spark ready", self.ready_at))
                 if at is not None]
        return marks + list(self.events)

    def parallelism(self) -> int:
        """Tasks the session runs at once; known from a local master without a JVM."""
        if not self._up and self._master is not None:
            local = local_parallelism(self._master)
            if local is not None:
                return local
        return max(1, int(self.tasks().sparkContext.defaultParallelism))


SparkLike = Union["SparkSession", LazySpark]
"""What the capture functions accept: a session, or a handle that builds one on need."""


def session_of(spark: SparkLike) -> SparkSession:
    """The session behind ``spark`` (built, or waited for, now)."""
    return spark.get() if isinstance(spark, LazySpark) else spark
