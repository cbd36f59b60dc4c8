"""A pre-imported worker daemon, started with the JVM instead of after it (issue 16).

Spark starts its Python worker daemon (``python -m pgcdc_dagster.spark.worker_daemon``) only
on the first Python task, once the JVM is up; the daemon then imports the chunk reader
(pyarrow, pandas, pyspark.worker, the decoder: ~0.8 CPU s) while the first chunks wait. A
process that prestarts Spark for a snapshot (``spark/prestart.py``, local masters only) also
starts a **zygote** (:func:`start`): a Python process that imports the same modules in
parallel with the JVM's start, then waits on a Unix socket in a private directory.

When Spark starts the daemon, the daemon's module finds the zygote's socket in its
environment (:data:`SOCKET_ENV`, inherited from the driver through the JVM) and hands its
work over (:func:`hand_off`): it sends its standard input, output and error (the JVM's
pipes), its environment, arguments, working directory and ``sys.path``; the zygote forks a
child that takes them over and runs pyspark's daemon, already imported. Spark's protocol is
the daemon's own, unchanged: the listening port on its standard output, the workers it forks
(their PIDs are real: the JVM kills them by PID through the daemon's standard input), its
exit when the JVM closes that input, and ``SIGTERM`` (the JVM destroying the daemon's
process, the one it started) is passed on to the child by the process Spark started, which
stays until the child ends and exits with its status.

One hand-off per zygote: it stops listening after it, and a later daemon (a new session in
the same process) finds no zygote and imports everything itself, as it does without one.
The zygote refuses a daemon it would not be equivalent to (another Python executable, or
another ``PYTHONHASHSEED``: str hashes must match Spark's setting), and the daemon then
serves by itself too.

No process is left behind: the zygote exits when the driver's pipe to it closes (the driver
ended, or :meth:`Zygote.stop`) unless it is serving, and then when its child ends; it
terminates the child if the process Spark started dies (its connection closes); the child
exits when the JVM closes its standard input, as pyspark's daemon does. Only the driver's
user can reach the socket (a directory of mode 0700, and the peer's credentials checked).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from pgcdc_dagster.spark.worker_daemon import exit_now

SOCKET_ENV = "PGCDC_WORKER_ZYGOTE"
"""The zygote's socket path, in the driver's environment (so in the JVM's and the
daemon's)."""
ZYGOTE_MODULE = "pgcdc_dagster.spark.worker_daemon.zygote"
HASH_SEED_ENV = "PYTHONHASHSEED"
DEFAULT_HASH_SEED = "0"
"""pyspark gives the workers ``PYTHONHASHSEED`` from the driver's environment, else 0; the
zygote's interpreter must hash strings as the workers of a daemon Spark starts would."""

_HEADER = struct.Struct("!I")
_STD_FDS = (0, 1, 2)


def hash_seed(environ: Mapping[str, str]) -> str:
    return environ.get(HASH_SEED_ENV, DEFAULT_HASH_SEED)


@dataclass
class Zygote:
    """A running zygote, started by :func:`start` (the driver's side)."""

    process: subprocess.Popen[bytes]
    directory: str
    path: str
    _stopped: list[bool] = field(default_factory=list)

    def stop(self) -> None:
        """Close the zygote's pipe: it exits unless it serves a daemon (which then ends with
        Spark's session); the directory of its socket is removed (idempotent)."""
        if self._stopped:
            return
        self._stopped.append(True)
        if self.process.stdin is not None:
            self.process.stdin.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def start(environ: MutableMapping[str, str] | None = None) -> Zygote:
    """Start a zygote and name its socket in ``environ`` (``os.environ``: the JVM started
    after this inherits it, and so does the daemon Spark starts). The socket listens before
    this returns (a daemon that connects early waits for the zygote's imports).

    Raises:
        OSError: the socket cannot be made (nothing is left behind); Spark's daemon then
            imports its modules itself.
    """
    env = os.environ if environ is None else environ
    directory = tempfile.mkdtemp(prefix="pgcdc-zygote-")  # mode 0700
    path = os.path.join(directory, "daemon.sock")
    child_env = {**env, HASH_SEED_ENV: hash_seed(env)}
    child_env.pop(SOCKET_ENV, None)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        try:
            listener.bind(path)  # OSError: e.g. a TMPDIR too long for a socket's path
        except OSError:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        listener.listen(1)
        process = subprocess.Popen(
            [sys.executable, "-m", ZYGOTE_MODULE, path, str(listener.fileno())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=child_env,
            pass_fds=[listener.fileno()])
    env[SOCKET_ENV] = path
    return Zygote(process, directory, path)


# --- the daemon's side (the process Spark started) ---------------------------------------


def _send(sock: socket.socket, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(message).encode()
    header = _HEADER.pack(len(data))
    if fds:
        socket.send_fds(sock, [header], list(fds))
    else:
        sock.sendall(header)
    sock.sendall(data)


def _receive(sock: socket.socket, with_fds: bool = False
             ) -> tuple[dict[str, Any] | None, list[int]]:
    """A message (None at the end of the stream) and the descriptors sent with it."""
    fds: list[int] = []
    if with_fds:
        header, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, len(_STD_FDS))
    else:
        header = sock.recv(_HEADER.size)
    while header and len(header) < _HEADER.size:
        more = sock.recv(_HEADER.size - len(header))
        if not more:
            break
        header += more
    if len(header) < _HEADER.size:
        return None, fds
    (size,) = _HEADER.unpack(header)
    data = b""
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            return None, fds
        data += more
    return json.loads(data), fds


def hand_off(path: str, sys_path: list[str]) -> int | None:
    """Hand this daemon's work to the zygote at ``path``; the daemon's exit status once the
    zygote's child has ended, or None when nothing was handed over (no zygote, or it
    refused): the caller then serves by itself."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        _send(sock, {"argv": sys.argv, "path": sys_path, "cwd": os.getcwd(),
                     "env": dict(os.environ), "executable": sys.executable}, _STD_FDS)
        reply, _ = _receive(sock)
    except OSError:
        sock.close()
        return None
    if reply is None or "pid" not in reply:
        sock.close()
        return None
    child = int(reply["pid"])

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(child, signum)
        except OSError:
            pass

    signal.signal(signal.SIGTERM, forward)  # the JVM destroys the daemon it started
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The JVM's pipes are the child's now: holding them would delay the ends it waits for.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    while True:
        try:
            message, _ = _receive(sock)
            break
        except InterruptedError:
            continue
    sock.close()
    if message is None:  # the zygote died: its child must not outlive the daemon
        forward(signal.SIGTERM, None)
        return 1
    return int(message.get("exit", 1))


# --- the zygote ----------------------------------------------------------------------------


def _refusal(request: dict[str, Any]) -> str | None:
    if request.get("executable") != sys.executable:
        return "another Python executable"
    if hash_seed(request.get("env") or {}) != os.environ.get(HASH_SEED_ENV):
        return "another PYTHONHASHSEED"
    return None


def _become_daemon(request: dict[str, Any], fds: list[int], closing: list[socket.socket]
                   ) -> None:
    """In the forked child: take over the daemon's descriptors, environment, arguments and
    path, and run pyspark's daemon; never returns."""
    code = 1
    try:
        for sock in closing:
            sock.close()
        for target, fd in zip(_STD_FDS, fds, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.pop(SOCKET_ENV, None)
        sys.argv[:] = request["argv"]
        sys.path[:] = request["path"]
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from pgcdc_dagster.spark import worker_daemon

        worker_daemon.PRELOADED_IN = os.getpid()
        worker_daemon.HANDED_OFF_FROM = os.getppid()
        from pyspark.daemon import manager

        manager()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        exit_now(code)


def _peer_is_us(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return bool(uid == os.getuid())


def _supervise(conn: socket.socket, child: int) -> None:
    """Wait for the child; terminate it if the process Spark started goes away; send that
    process the child's exit status."""
    watch = selectors.DefaultSelector()
    pidfd = os.pidfd_open(child)
    watch.register(pidfd, selectors.EVENT_READ, "child")
    watch.register(conn, selectors.EVENT_READ, "daemon")
    while True:
        kinds = {key.data for key, _ in watch.select()}
        if "child" in kinds:
            break
        if "daemon" in kinds:  # only its end is expected from the daemon's side
            if not conn.recv(1):
                watch.unregister(conn)
                try:
                    os.kill(child, signal.SIGTERM)
                except OSError:
                    pass
    _, status = os.waitpid(child, 0)
    try:
        _send(conn, {"exit": os.waitstatus_to_exitcode(status) & 0xFF})
    except OSError:
        pass
    conn.close()


def _remove(path: str) -> None:
    """Remove the socket and its private directory (the zygote is their last user)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(path))


def serve(path: str, listening: int) -> None:
    """The zygote: import the chunk reader, hand one daemon over on the socket listening at
    ``path`` (descriptor ``listening``, bound by the driver), or exit when the driver's pipe
    closes first."""
    from pgcdc_dagster.spark.worker_daemon import installed_over_zips, preload

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the JVM: the driver handles Ctrl-C
    listener = socket.socket(fileno=listening)  # a daemon that comes early waits in its queue
    sys.path[:] = installed_over_zips(sys.path)
    preload()
    watch = selectors.DefaultSelector()
    watch.register(listener, selectors.EVENT_READ, "daemon")
    watch.register(0, selectors.EVENT_READ, "driver")
    try:
        while True:
            kinds = {key.data for key, _ in watch.select()}
            if "driver" in kinds and not os.read(0, 4096):
                return  # the driver ended or stopped the zygote before Spark needed it
            if "daemon" not in kinds:
                continue
            conn, _ = listener.accept()
            request, fds = _receive(conn, with_fds=True) if _peer_is_us(conn) else (None, [])
            refused = "not a daemon's request" if request is None or len(fds) != 3 else \
                _refusal(request)
            if refused is not None:
                _send(conn, {"refused": refused})  # the daemon serves by itself
                for fd in fds:
                    os.close(fd)
                conn.close()
                return
            assert request is not None
            watch.close()
            listener.close()
            _remove(path)
            child = os.fork()
            if child == 0:
                _become_daemon(request, fds, [conn])
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):  # gone already: _supervise ends the child
                _send(conn, {"pid": child})
            devnull = os.open(os.devnull, os.O_RDWR)  # the driver's output is not ours now
            for target in (0, 1, 2):
                os.dup2(devnull, target)
            os.close(devnull)
            _supervise(conn, child)
            return
    finally:
        _remove(path)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
    exit_now(0)
