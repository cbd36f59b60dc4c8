"""Helpers for the type integration tests: a one-column table in a real PostgreSQL, the exact
text output of its values (what pgoutput text mode sends, via COPY ... (FORMAT text)) and the
converter the catalog gives for it."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pgcdc_dagster.cdc.typeconv import ColumnConverter, TypeModes, converter_for
from pgcdc_dagster.postgres.catalog import load_types, table_column_dimensions, table_columns

UNREPRESENTABLE = object()
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def _unescape(field: str) -> str | None:
    if field == "\\N":
        return None

    def repl(m: re.Match[str]) -> str:
        s = m.group(1)
        if s[0] in _ESCAPES:
            return _ESCAPES[s[0]] + s[1:]
        if s[0] == "x":
            return chr(int(s[1:], 16))
        return chr(int(s, 8))

    return re.sub(r"\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|.)", repl, field)


def copy_texts(conn: Any, query: str) -> list[str | None]:
    """The text output of a one-column query, via COPY (FORMAT text), NULL as None."""
    buf = io.BytesIO()
    with conn.cursor() as cur:
        cur.copy_expert(f"COPY ({query}) TO STDOUT (FORMAT text)", buf)
    lines = buf.getvalue().decode("utf-8").split("\n")
    return [_unescape(line) for line in lines[:-1]]


@dataclass
class Case:
    """One column of a real table: converter, exact texts and psycopg2's Python values."""

    conn: Any
    conv: ColumnConverter
    texts: list[str | None]

    @property
    def py(self) -> list[Any]:
        """psycopg2's value per row; ``UNREPRESENTABLE`` where Python cannot hold it (BC)."""
        out: list[Any] = []
        with self.conn.cursor() as cur:
            cur.execute("SELECT id FROM t ORDER BY id")
            ids = [r[0] for r in cur.fetchall()]
            for i in ids:
                try:
                    cur.execute("SELECT c FROM t WHERE id = %s", (i,))
                    out.append(cur.fetchone()[0])
                except ValueError:
                    out.append(UNREPRESENTABLE)
        return out

    @property
    def text_array(self) -> pa.Array:
        return pa.array(self.texts, type=pa.string())

    def bronze(self) -> list[Any]:
        return self.conv.to_bronze(self.text_array).to_pylist()

    def silver(self) -> list[Any]:
        """Silver values; also checks they equal the values decoded from bronze."""
        direct = self.conv.to_silver(self.text_array)
        if self.conv.bronze_field.nullable:
            decoded = self.conv.from_bronze(self.conv.to_bronze(self.text_array))
            assert direct.equals(decoded), "snapshot silver and stream silver disagree"
        return direct.to_pylist()

    def sql(self, expr: str) -> list[Any]:
        """``expr`` (over column ``c``) evaluated per row, in row order."""
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT {expr} FROM t ORDER BY id")
            return [r[0] for r in cur.fetchall()]


def make_case(conn: Any, ddl_type: str, literals: list[str], modes: TypeModes | None = None,
              *, table: str = "t") -> Case:
    """Create ``t(id, c ddl_type)``, insert the SQL literals in order and build the case."""
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {table}")
        cur.execute(f"CREATE TABLE {table} (id serial PRIMARY KEY, c {ddl_type})")
        for lit in literals:
            cur.execute(f"INSERT INTO {table} (c) VALUES ({lit})")
    cols = {name: (oid, typmod, notnull)
            for name, oid, typmod, notnull in table_columns(conn, "public", table)}
    oid, typmod, notnull = cols["c"]
    pgtype = load_types(conn, [oid])[oid]
    dims = table_column_dimensions(conn, "public", table)["c"]
    conv = converter_for("c", pgtype, typmod, modes or TypeModes(), nullable=not notnull,
                         dimensions=max(dims, 1))
    texts = copy_texts(conn, f"SELECT c FROM {table} ORDER BY id")
    return Case(conn, conv, texts)
