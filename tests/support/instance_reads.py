"""Counting what a run asks of the Dagster instance's SQL storage (real statements, counted)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine


@contextlib.contextmanager
def counting_instance_reads() -> Iterator[list[int]]:
    """Counts the SELECT statements run meanwhile on any SQLAlchemy engine of this process
    (the instance's run, event log and index storages)."""
    count = [0]

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            count[0] += 1

    event.listen(Engine, "before_cursor_execute", before)
    try:
        yield count
    finally:
        event.remove(Engine, "before_cursor_execute", before)
