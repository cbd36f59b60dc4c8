"""A throwaway local PostgreSQL cluster for tests, benchmarks and the demo.

PostgreSQL refuses to run as root, so when the current user is root the cluster is
initialised and started as the unprivileged ``postgres`` user (``runuser``). The cluster
listens on 127.0.0.1 only, with ``wal_level = logical``, and is stopped by its own PID.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from pgcdc_dagster.exceptions import ConfigurationError

_SETTINGS = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{socket_dir}'
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
max_prepared_transactions = 10
shared_buffers = 256MB
max_wal_size = 4GB
fsync = off
synchronous_commit = on
full_page_writes = off
logical_decoding_work_mem = 64MB
log_min_messages = warning
"""


def find_pg_bin() -> Path:
    """Return the directory holding ``initdb`` and ``pg_ctl`` (newest installed version)."""
    env = os.environ.get("PGCDC_PG_BIN")
    if env:
        return Path(env)
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise ConfigurationError(
        "PostgreSQL server binaries (initdb, pg_ctl) were not found. Install them "
        "(Debian: apt-get install postgresql-15) or set PGCDC_PG_BIN to their directory."
    )


def free_port() -> int:
    """Ask the kernel for a free TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LocalCluster:
    """A PostgreSQL cluster in ``root`` (``root/data`` holds the data directory)."""

    root: Path
    port: int = 0
    overrides: dict[str, str] = field(default_factory=dict)
    """Extra ``postgresql.conf`` settings (name -> literal value), applied last."""
    _owner: str | None = field(default=None, init=False)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def dsn(self) -> str:
        """libpq connection string of the cluster's ``postgres`` database."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, check=True, capture_output=True, text=True)

    def _prepare_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            # Parents must be traversable by the postgres user.
            for parent in self.root.resolve().parents:
                mode = parent.stat().st_mode
                if not mode & 0o001:
                    os.chmod(parent, mode | 0o011)
        os.chmod(self.root, 0o700)

    def _pid(self) -> int | None:
        pid_file = self.data_dir / "postmaster.pid"
        try:
            return int(pid_file.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def running(self) -> bool:
        """True when the postmaster of this cluster is alive."""
        pid = self._pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def start(self) -> LocalCluster:
        """Initialise the cluster if needed and start it; return self."""
        pg_bin = find_pg_bin()
        if not (self.data_dir / "PG_VERSION").exists():
            self._prepare_root()
            self._run(
                str(pg_bin / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                "--auth=trust", "-E", "UTF8", "--no-locale",
            )
        conf = self.data_dir / "postgresql.auto.conf"
        if self.running():
            self.port = self.port or _read_port(conf)
            return self
        self.port = self.port or free_port()
        extra = "".join(f"{k} = {v}\n" for k, v in self.overrides.items())
        conf.write_text(_SETTINGS.format(port=self.port, socket_dir=self.root) + extra)
        if os.geteuid() == 0:
            shutil.chown(conf, "postgres", "postgres")
        self._run(
            str(pg_bin / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.root / "server.log"),
            "-w", "-t", "60", "start",
        )
        return self

    def stop(self) -> None:
        """Stop the postmaster by its own PID (fast shutdown) and wait for it."""
        pid = self._pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _read_port(conf: Path) -> int:
    for line in conf.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "port":
            return int(value.strip())
    raise ConfigurationError(f"no port in {conf}")


def tls_overrides(certs: Path) -> dict[str, str]:
    """``postgresql.conf`` settings that make a :class:`LocalCluster` accept TLS (what
    ``sslmode=require`` asks for) with a self-signed certificate written into ``certs``;
    plain connections stay accepted. Needs the ``openssl`` command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ConfigurationError("a TLS test cluster needs the openssl command "
                                 "(scripts/setup.sh installs it)")
    certs.mkdir(parents=True, exist_ok=True)
    subprocess.run([openssl, "req", "-new", "-x509", "-days", "2", "-nodes", "-subj",
                    "/CN=localhost", "-newkey", "rsa:2048", "-keyout", str(certs / "key.pem"),
                    "-out", str(certs / "cert.pem")], check=True, capture_output=True)
    (certs / "key.pem").chmod(0o600)
    if os.geteuid() == 0:  # the server runs as postgres: it must own its key
        for path in (certs, *certs.iterdir()):
            shutil.chown(path, "postgres", "postgres")
        for parent in certs.resolve().parents:
            parent.chmod(parent.stat().st_mode | 0o011)
    return {"ssl": "on", "ssl_cert_file": f"'{certs / 'cert.pem'}'",
            "ssl_key_file": f"'{certs / 'key.pem'}'"}
