"""A full lakehouse filesystem, told plainly.

pyarrow reports a Parquet write that hit ``ENOSPC`` as ``RuntimeError: file metadata is
only available after writer close`` (closing the failed writer masks the ``OSError``, which
is only in the chained traceback), and Spark tasks and delta-rs wrap it in their own texts.
:func:`explaining_full_disk` (around a write whose path is known) and
:func:`explains_full_disk` (around a run, naming the lakehouse) look for the cause anywhere
in the exception chain and raise :class:`~pgcdc_dagster.exceptions.LakehouseFullError` with
``No space left on device``, the path, and the space left on that filesystem.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from pgcdc_dagster.exceptions import LakehouseFullError

P = ParamSpec("P")
R = TypeVar("R")

_TEXTS = ("No space left on device", "os error 28", "errno 28", "Errno 28")


def is_disk_full(exc: BaseException) -> bool:
    """True when ``exc`` or an exception it chains to is ``ENOSPC``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return True
        if any(text in str(current) for text in _TEXTS):
            return True
        current = current.__cause__ or current.__context__
    return False


def _space(path: str) -> str:
    """`` (N MiB free of M MiB there)`` for a local path, else nothing."""
    local = path.removeprefix("file://")
    if "://" in local:
        return ""
    while local and not os.path.exists(local):
        local = os.path.dirname(local.rstrip("/"))
    try:
        st = os.statvfs(local or "/")
    except OSError:
        return ""
    mib = 1 << 20
    return (f" ({st.f_bavail * st.f_frsize // mib} MiB free of "
            f"{st.f_blocks * st.f_frsize // mib} MiB on that filesystem)")


def disk_full_error(path: str) -> LakehouseFullError:
    return LakehouseFullError(
        f"No space left on device: the lakehouse filesystem is full, writing {path}"
        f"{_space(path)}. Nothing of this write was committed (a file written in part is "
        "an orphan no table references; vacuum removes it). Free space or grow the volume, "
        "then run again: the run resumes from the last commit, and the replication slot "
        "still holds what was not committed.")


@contextmanager
def explaining_full_disk(path: str) -> Iterator[None]:
    """Raise :class:`LakehouseFullError` naming ``path`` when the block fails for lack of
    space (whatever error reports it)."""
    try:
        yield
    except LakehouseFullError:
        raise
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        raise disk_full_error(path) from exc


def explains_full_disk(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator for a run whose first argument has ``lakehouse``: a full disk anywhere in
    it raises :class:`LakehouseFullError` naming the lakehouse (or the file, when known)."""
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        settings = args[0] if args else kwargs.get("settings")
        root = getattr(settings, "lakehouse", None)
        if not isinstance(root, str):
            return fn(*args, **kwargs)
        with explaining_full_disk(root):
            return fn(*args, **kwargs)

    return wrapper
