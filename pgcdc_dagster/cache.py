"""The project's per-user cache directory (the Spark class archive, the native loops)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/pgcdc_dagster``, else ``~/.cache/pgcdc_dagster``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "pgcdc_dagster"
