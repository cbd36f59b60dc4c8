"""The worker daemon's imports made by a zygote while the JVM starts (issue 16): Spark's
daemon protocol holds through the hand-off, and no process outlives the driver.

Each scenario is a driver process of its own (its own JVM), marked by an environment variable
that every process it starts inherits (the JVM, the zygote, the daemon, the workers), so the
test can tell that none is left.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from pgcdc_dagster.spark.prestart import uses_our_daemon
from pgcdc_dagster.spark.worker_daemon import zygote
from tests.support.processes import MARK, left_behind, marked

DRIVER = r'''
import json, os, sys, threading, time
from pgcdc_dagster.spark.session import build_context
from pgcdc_dagster.spark.worker_daemon import zygote
from tests.support.processes import MARK, left_behind, marked

def say(**what):
    print(json.dumps(what), flush=True)

def probe(_index):
    import os, sys
    from pgcdc_dagster.spark import worker_daemon as daemon
    return (os.getpid(), os.getppid(), daemon.PRELOADED_IN, daemon.HANDED_OFF_FROM,
            "pgcdc_dagster.capture.snapshot_arrow" in sys.modules, hash("pgcdc"))

def sleeper(_index):
    import os, time
    with open(os.environ["PIDFILE"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)
    return 0

mode = sys.argv[1]
z = zygote.start()
say(zygote=z.process.pid)
if mode == "unused":
    sys.exit(0)
sc = build_context("local[2]", quick_start=True)
say(jvm=sc._gateway.proc.pid, seen=sc.parallelize(range(4), 4).map(probe).collect(),
    socket_left=os.path.exists(z.path))
if mode == "killed":
    time.sleep(600)  # killed by the test
# A task killed while its worker runs: the JVM has the daemon kill the worker by its PID.
def sleep_job():
    sc.setJobGroup("sleepers", "sleepers", interruptOnCancel=True)  # this thread's
    try:
        sc.parallelize([0], 1).map(sleeper).collect()
    except Exception:
        pass  # cancelled

job = threading.Thread(target=sleep_job, daemon=True)
job.start()
while not os.path.exists(os.environ["PIDFILE"]) or not open(os.environ["PIDFILE"]).read():
    time.sleep(0.1)
sleeper_pid = int(open(os.environ["PIDFILE"]).read())
sc.cancelJobGroup("sleepers")
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        os.kill(sleeper_pid, 0)
    except OSError:
        break
    time.sleep(0.1)
say(sleeper=sleeper_pid, sleeper_killed=time.monotonic() < deadline)
sc.stop()  # the JVM destroys the daemon it started: the handed-off one must end
deadline = time.monotonic() + 60
while z.process.poll() is None and time.monotonic() < deadline:
    time.sleep(0.1)
say(zygote_status=z.process.poll())
# A new session (the zygote served once and is gone): its daemon serves by itself.
sc = build_context("local[2]", quick_start=True)
say(seen_again=sc.parallelize(range(2), 2).map(probe).collect())
sc.stop()
'''


def _driver(mode: str, tmp_path) -> tuple[subprocess.Popen[str], str]:
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark, "PIDFILE": str(tmp_path / f"{mode}.pid"),
           "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    env.pop("PYTHONHASHSEED", None)
    env.pop(zygote.SOCKET_ENV, None)
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, mode], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return proc, mark


def _said(proc: subprocess.Popen[str]) -> dict[str, object]:
    """The driver's next report (the JVM writes its own warnings to the same output)."""
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        assert line, "the driver ended early"
        if line.startswith("{"):
            return json.loads(line)  # type: ignore[no-any-return]


def _hash_with_seed(seed: str) -> int:
    out = subprocess.run([sys.executable, "-c", "print(hash('pgcdc'))"], check=True,
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": seed})
    return int(out.stdout)


def _alive(pid: int) -> bool:
    """Running (a zombie left to a reaper that is not ours counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _daemon(path: str, seed: str) -> tuple[subprocess.Popen[bytes], int, socket.socket]:
    """Start the daemon module as Spark does (its environment, pipes) and ask it for a
    worker as the JVM does: the daemon, the worker's PID and the connection to it (the
    worker waits on it)."""
    env = {**os.environ, zygote.SOCKET_ENV: path, "PYTHONHASHSEED": seed,
           "PYTHON_WORKER_FACTORY_SECRET": "secret"}
    daemon = subprocess.Popen([sys.executable, "-m", "pgcdc_dagster.spark.worker_daemon"],
                              env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert daemon.stdout is not None
    port = struct.unpack("!i", daemon.stdout.read(4))[0]
    conn = socket.create_connection(("127.0.0.1", port), timeout=60)
    reader = conn.makefile("rb")
    worker = struct.unpack("!i", reader.read(4))[0]
    # Authenticated as the JVM does: the worker has its own signal handlers from then on.
    conn.sendall(struct.pack("!i", 6) + b"secret")
    assert reader.read(struct.unpack("!i", reader.read(4))[0]) == b"ok"
    return daemon, worker, conn


def test_the_zygote_serves_an_equivalent_daemon_once_and_ends_with_it() -> None:
    # A daemon that would hash strings otherwise (another PYTHONHASHSEED) serves by itself.
    environ: dict[str, str] = {**os.environ}
    refusing = zygote.start(environ)
    daemon, worker, conn = _daemon(environ[zygote.SOCKET_ENV], "1")
    try:
        assert _parent(worker) == daemon.pid
        assert refusing.process.wait(60) == 0  # it refused and ended
        assert not os.path.exists(refusing.directory)  # nothing left in the temp dir
    finally:
        conn.close()
        daemon.kill()
        daemon.wait(60)
        refusing.stop()
    # An equivalent one is handed over: its workers are forked by the zygote's child.
    served = zygote.start(environ)
    daemon, worker, conn = _daemon(environ[zygote.SOCKET_ENV], "0")
    try:
        child = _parent(worker)
        assert child != daemon.pid and _parent(child) == served.process.pid
        assert not os.path.exists(served.directory)  # one hand-off: nobody else connects
        # SIGTERM to the process Spark started (the JVM's destroy) ends the child and its
        # workers (pyspark's shutdown), then that process, with the child's status, and
        # the zygote.
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(60) == 1  # pyspark's daemon exits 1 on SIGTERM
        assert served.process.wait(60) == 0
        deadline = time.monotonic() + 30
        while (_alive(worker) or _alive(child)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker) and not _alive(child)
    finally:
        conn.close()
        if daemon.poll() is None:
            daemon.kill()
        served.stop()


def test_only_our_local_daemon_gets_a_zygote() -> None:
    assert uses_our_daemon("local[2]", None)
    assert not uses_our_daemon("spark://h:7077", None)  # executors keep pyspark's daemon
    assert not uses_our_daemon("local[2]", {"spark.python.daemon.module": "pyspark.daemon"})


@pytest.mark.spark
def test_a_daemon_handed_to_the_zygote_keeps_sparks_protocol(tmp_path) -> None:
    proc, mark = _driver("served", tmp_path)
    try:
        zygote_pid = _said(proc)["zygote"]
        first = _said(proc)
        # Workers forked by a daemon the zygote forked, with the chunk reader imported, and
        # strings hashed as Spark's PYTHONHASHSEED (0) says; the socket is gone after use.
        for pid, parent, preloaded_in, handed_off_from, decoder, hashed in first["seen"]:
            assert preloaded_in == parent != pid and handed_off_from == zygote_pid, first
            assert decoder and hashed == _hash_with_seed("0"), first
        assert first["socket_left"] is False
        # A cancelled task's worker is killed by PID through the daemon's standard input.
        killed = _said(proc)
        assert killed["sleeper_killed"] is True, killed
        # The JVM destroying the daemon ends the daemon, its workers and the zygote.
        assert _said(proc)["zygote_status"] == 0
        # A later session's daemon finds no zygote and serves by itself.
        again = _said(proc)
        for pid, parent, preloaded_in, handed_off_from, decoder, _ in again["seen_again"]:
            assert preloaded_in == parent != pid and handed_off_from is None, again
            assert decoder, again
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert left_behind(mark) == []


@pytest.mark.spark
def test_no_process_outlives_a_killed_driver_or_an_unused_zygote(tmp_path) -> None:
    proc, mark = _driver("killed", tmp_path)
    try:
        _said(proc)
        assert _said(proc)["socket_left"] is False  # served: JVM, zygote, daemon, workers up
        assert len(marked(mark)) >= 5
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert left_behind(mark) == []
    # A zygote that Spark never needed ends with its driver.
    proc, mark = _driver("unused", tmp_path)
    _said(proc)
    assert proc.wait(60) == 0
    assert left_behind(mark) == []



def test_a_socket_path_too_long_leaves_nothing(monkeypatch, tmp_path) -> None:
    """A TMPDIR too long for a Unix socket's path (108 bytes): start raises OSError and
    leaves nothing (the prestart then goes on without a zygote: ``test_release.py`` runs its
    drivers under such a TMPDIR)."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    environ: dict[str, str] = {}
    with pytest.raises(OSError):
        zygote.start(environ)
    assert list(deep.iterdir()) == [] and zygote.SOCKET_ENV not in environ
