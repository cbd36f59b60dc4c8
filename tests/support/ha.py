"""A primary with a physical standby, and a writer that follows a failover (the HA tests)."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable

import psycopg2

from pgcdc_dagster.postgres.local_cluster import find_pg_bin


def requested_pg_major() -> int | None:
    """The major version ``PGCDC_TEST_PG_VERSION`` asks for (None: the system's newest)."""
    value = os.environ.get("PGCDC_TEST_PG_VERSION", "").strip()
    return int(value) if value else None


@functools.cache
def session_pg_major() -> int:
    """The major version the test clusters run (``PGCDC_TEST_PG_VERSION`` or the system's:
    the name of its directory, ``/usr/lib/postgresql/<major>/bin``, else ``postgres
    --version``)."""
    major = requested_pg_major()
    if major is not None:
        return major
    pg_bin = find_pg_bin()
    if pg_bin.parent.name.isdigit():
        return int(pg_bin.parent.name)
    out = subprocess.run([str(pg_bin / "postgres"), "--version"], check=True,
                         capture_output=True, text=True).stdout
    found = re.search(r"(\d+)(?:\.\d+)?", out)
    assert found, out
    return int(found.group(1))


def wait_for(what: str, check: Callable[[], bool], timeout: float = 90.0,
             interval: float = 0.2) -> None:
    """Poll ``check`` until it holds (a readiness wait, not a measurement)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def query(dsn: str, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Rows of one statement on a connection of its own (autocommit)."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


class FailoverWriter(threading.Thread):
    """Inserts rows ``id = 1, 2, ...`` (``n = 0``) and increments ``n`` of an earlier row
    every third insert, one autocommit statement each, into ``ha``; after a connection error
    it reconnects to :attr:`target` (the test points it at the promoted standby)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.target = dsn
        self.inserted = 0
        self.errors = 0
        self._halt = threading.Event()

    def run(self) -> None:
        conn = None
        i = 0
        while not self._halt.is_set():
            try:
                if conn is None:
                    conn = psycopg2.connect(self.target, connect_timeout=5)
                    conn.autocommit = True
                with conn.cursor() as cur:
                    i += 1
                    cur.execute("INSERT INTO ha VALUES (%s, 0, repeat('v', 20))", (i,))
                    if i % 3 == 0:
                        cur.execute("UPDATE ha SET n = n + 1 WHERE id = %s", (i // 3,))
                self.inserted = i
            except psycopg2.Error:
                self.errors += 1
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.2)
        if conn is not None:
            conn.close()

    def wait_rows(self, more: int) -> None:
        """Wait until ``more`` further rows were inserted."""
        goal = self.inserted + more
        wait_for(f"{more} more writes", lambda: self.inserted >= goal)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)


