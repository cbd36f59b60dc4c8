"""The current state a bronze table implies, folded in Python (a reference for tests).

Per key (NULL equal to NULL, as Python tuples compare), the event with the greatest sequence
``(__commit_lsn, __ordinal)`` wins; a delete removes the key, a TRUNCATE every key before it.
Used where silver cannot be the judge (keys with NULL columns), so the DBLog output can still
be compared with the source row for row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deltalake import DeltaTable


def bronze_state(uri: str, key: Sequence[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    data = DeltaTable(uri).to_pyarrow_table(
        columns=["op", "before", "after", "__commit_lsn", "__ordinal"]).to_pylist()
    data.sort(key=lambda e: (e["__commit_lsn"], e["__ordinal"]))
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    for event in data:
        op = event["op"]
        if op == "t":
            state.clear()
        elif op == "d":
            state.pop(tuple(event["before"][k] for k in key), None)
        elif op in ("r", "c", "u"):
            after = event["after"]
            if op == "u" and event["before"] is not None:
                state.pop(tuple(event["before"][k] for k in key), None)
            state[tuple(after[k] for k in key)] = dict(after)
    return state
