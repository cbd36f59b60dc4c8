"""Where the Delta tables live: ``<lakehouse>/<layer>/<schema>/<table>``."""

from __future__ import annotations

from pathlib import Path


def _is_uri(root: str) -> bool:
    return "://" in root and not root.startswith("file://")


def normalise_root(root: str) -> str:
    """Absolute local path, or the URI unchanged for object stores."""
    if root.startswith("file://"):
        root = root[len("file://"):]
    if _is_uri(root):
        return root.rstrip("/")
    return str(Path(root).expanduser().resolve())


def table_uri(root: str, layer: str, schema: str, table: str) -> str:
    """URI of one Delta table, e.g. ``/lake/bronze/public/orders``."""
    return f"{normalise_root(root)}/{layer}/{schema}/{table}"


def is_local(uri: str) -> bool:
    """True for a local filesystem path."""
    return not _is_uri(uri)
