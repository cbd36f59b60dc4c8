"""Column names Delta Lake cannot store side by side.

Delta Lake compares column names without letter case: delta-rs refuses a schema holding
``Name`` and ``name``, also inside bronze's ``before`` / ``after`` structs. Silver adds its
metadata columns (``__op``, ``__lsn``, ... ``__deleted``) beside the source's, and the MERGE
source carries ``__toast_unchanged``. A source column named like one of those, or two columns
differing only in case, would make every write of the table fail or mix a source value with
silver's bookkeeping. Such a table is left out of the capture (``postgres/discovery.py``)
with the columns named, rather than renamed silently.
"""

from __future__ import annotations

from collections.abc import Sequence

RESERVED_COLUMNS = ("__op", "__lsn", "__commit_lsn", "__ordinal", "__source_ts_ms",
                    "__deleted", "__toast_unchanged")
"""Silver's metadata columns and the MERGE's ``__toast_unchanged`` (``lake/silver.py``)."""


def column_name_problems(names: Sequence[str]) -> list[str]:
    """Why a table with these columns cannot be stored; empty when it can."""
    problems = []
    reserved = {n.lower(): n for n in RESERVED_COLUMNS}
    seen: dict[str, str] = {}
    for name in names:
        low = name.lower()
        if low in reserved:
            problems.append(f"column {name!r} has the name of silver's metadata column "
                            f"{reserved[low]!r}")
        if low in seen:
            problems.append(f"columns {seen[low]!r} and {name!r} differ only in letter case, "
                            "and Delta Lake column names are case-insensitive")
        seen.setdefault(low, name)
    return problems
