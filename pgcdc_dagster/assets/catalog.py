"""The captured tables a code location is built with, without needing the source to load.

They come, in this order, from:

1. an explicit list (``pgcdc_definitions(tables=["public.orders", ...])``, a Component's
   ``tables:``): the source is never read when the code location loads;
2. the source's catalog (the include list resolved against it), when the source answers;
   the result is written to the catalog file, when there is one;
3. the catalog file (``catalog=`` / ``PGCDC_CATALOG``), when the source does not answer: the
   tables of the last successful load or ``python -m pgcdc_dagster.assets.catalog``.

When the source does not answer and nothing is cached, the definitions have no table assets
(the slot's assets, jobs, schedules and sensors are there): the code location still loads,
with the user's other assets, and capture runs fail naming the source and the error.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import psycopg2

from pgcdc_dagster.exceptions import ConfigurationError, PgCdcError
from pgcdc_dagster.names import parse_table_id, table_id

log = logging.getLogger("pgcdc_dagster")

Tables = list[tuple[str, str]]


def parse_tables(names: Sequence[str | tuple[str, str]]) -> Tables:
    """``schema.table`` names (quoted as Debezium quotes a part holding a dot) or pairs."""
    out: Tables = []
    for name in names:
        if isinstance(name, tuple):
            out.append(name)
            continue
        try:
            out.append(parse_table_id(name))
        except ValueError as exc:
            raise ConfigurationError(f"tables: {exc}") from None
    if len(set(out)) != len(out):
        raise ConfigurationError(f"tables: a table is listed twice in {list(names)!r}")
    return out


def read_catalog(path: str | Path) -> Tables | None:
    """The tables cached in ``path`` (None when there is no such file)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"catalog file {str(path)!r} cannot be read ({exc}): delete "
                                 "it, or refresh it with python -m pgcdc_dagster.assets.catalog"
                                 ) from None
    return [parse_table_id(t) for t in data["tables"]]


def write_catalog(path: str | Path, tables: Sequence[tuple[str, str]]) -> None:
    """Cache ``tables`` in ``path`` (written whole, then renamed: never half a file)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".tmp")
    partial.write_text(json.dumps({"tables": [table_id(s, t) for s, t in tables]}, indent=1))
    partial.replace(target)


SOURCE_ERRORS = (psycopg2.Error, PgCdcError, OSError)
"""What a source that cannot be read raises while the catalog is resolved."""


def resolve_tables(discover: Callable[[], Tables], catalog: str | Path | None,
                   where: str) -> Tables:
    """The source's tables (cached in ``catalog``), or the cached ones when the source cannot
    be read (``where``: what to name in the warning), or none."""
    try:
        found = discover()
    except ConfigurationError:
        raise
    except SOURCE_ERRORS as exc:
        cached = read_catalog(catalog) if catalog is not None else None
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if cached is not None:
            log.warning(f"the source {where} cannot be read ({first}): the code location "
                        f"uses the {len(cached)} tables cached in {catalog}")
            return cached
        log.warning(f"the source {where} cannot be read ({first}) and no catalog is cached: "
                    "the code location loads without table assets; capture runs fail until "
                    "the source answers (then reload)")
        return []
    if catalog is not None:
        try:
            write_catalog(catalog, found)
        except OSError as exc:
            log.warning(f"the catalog cache {catalog} cannot be written: {exc}")
    return found


def main(argv: Sequence[str]) -> int:
    """``python -m pgcdc_dagster.assets.catalog [PATH]``: resolve ``PGCDC_TABLES`` against
    the source ``PGCDC_PG_DSN`` and cache the tables in PATH (default ``PGCDC_CATALOG``)."""
    from pgcdc_dagster.definitions import discover_tables
    from pgcdc_dagster.resources.capture import split_list

    path = argv[0] if argv else os.environ.get("PGCDC_CATALOG", "")
    dsn = os.environ.get("PGCDC_PG_DSN", "")
    if not path or not dsn:
        print("usage: PGCDC_PG_DSN=... [PGCDC_TABLES=...] python -m "
              "pgcdc_dagster.assets.catalog PATH (or PGCDC_CATALOG=PATH)", file=sys.stderr)
        return 2
    tables = discover_tables(dsn, split_list(os.environ.get("PGCDC_TABLES", "")))
    write_catalog(path, tables)
    print(f"{len(tables)} tables cached in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
