"""Compile the native snapshot loops (``copyscan.c``) into a shared library, once per machine.

The library is written to ``$XDG_CACHE_HOME/pgcdc_dagster`` (else ``~/.cache/pgcdc_dagster``)
under a name that carries the digest of the source and of the compiler (its file: a new
version is a new file), so a changed source or compiler builds a new one and an old one is
never loaded by mistake. Each
builder compiles into its own temporary file and renames it into place (a rename is atomic):
concurrent builders (Spark workers starting together) never see a partial library, and the
last rename wins with identical bytes.

``python -m pgcdc_dagster.native.build`` builds it (``scripts/setup.sh`` does, best effort);
at run time :func:`pgcdc_dagster.native.copyscan.library` builds it on first use.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pgcdc_dagster.cache import cache_dir

SOURCE = Path(__file__).with_name("copyscan.c")
FLAGS = ("-O2", "-shared", "-fPIC")


class BuildError(RuntimeError):
    """The library could not be built (no compiler, a failed compile, an unwritable cache)."""


def compiler() -> list[str]:
    """The C compiler's command: ``$CC`` (may carry arguments), else ``cc``."""
    return shlex.split(os.environ.get("CC") or "cc")


def _compiler_identity(cc: list[str]) -> str:
    """The compiler's resolved path, size and modification time (a new compiler version is
    a new file): read without running it, so a process that only loads the library spawns
    nothing."""
    found = shutil.which(cc[0]) if cc else None
    if found is None:
        raise BuildError(f"no C compiler ({shlex.join(cc) or 'CC is empty'} is not found); "
                         "install gcc (Debian: apt-get install gcc libc6-dev) or set CC")
    real = os.path.realpath(found)
    stat = os.stat(real)
    return "\0".join([real, str(stat.st_size), str(stat.st_mtime_ns), *cc[1:]])


def library_path(cc: list[str] | None = None) -> Path:
    """Where the library of this source and this compiler is (or would be) written.

    Raises:
        BuildError: no compiler.
    """
    cc = compiler() if cc is None else cc
    digest = hashlib.sha256()
    digest.update(SOURCE.read_bytes())
    digest.update("\0".join([_compiler_identity(cc), *FLAGS, sys.platform]).encode())
    return cache_dir() / f"copyscan-{digest.hexdigest()[:16]}.so"


def build() -> Path:
    """The library's path, compiled first if it is not there yet.

    Raises:
        BuildError: no working compiler, a failed compile, or a cache that cannot be written.
    """
    cc = compiler()
    path = library_path(cc)
    if path.is_file():
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as exc:
        raise BuildError(f"cannot write the native library to {path.parent}: {exc}") from exc
    try:
        try:
            done = subprocess.run([*cc, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True,
                                  text=True, timeout=120, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            raise BuildError(f"{shlex.join(cc)} failed: {exc}") from exc
        if done.returncode != 0:
            raise BuildError(f"{shlex.join(cc)} failed on {SOURCE.name}: "
                             f"{done.stderr.strip()[:500]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)  # atomic: a concurrent builder's rename wins with the same bytes
    except OSError as exc:
        raise BuildError(f"cannot write the native library to {path}: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def main() -> int:
    try:
        print(build())
    except BuildError as exc:
        print(f"pgcdc_dagster.native: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
