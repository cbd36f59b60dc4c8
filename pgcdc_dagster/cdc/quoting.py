"""Names inside expression text: the only way a source identifier enters an expression.

Column names come from the source and are data: a name may hold any character PostgreSQL
allows in a quoted identifier (quotes, backticks, backslashes, spaces, dots, operators,
non-ASCII). Wherever a name must appear inside text that a parser reads (a delta-rs /
DataFusion predicate or update expression, a Spark column path), it goes through one of
these functions; nothing else builds such text from a name.

* :func:`sql_ident`: a DataFusion (delta-rs) identifier, ``"name"`` with ``"`` doubled.
  Quoted, so DataFusion does not lower-case it (an unquoted ``Name`` would mean ``name``)
  and reads no operator, dot or keyword in it.
* :func:`sql_literal`: a DataFusion string literal, ``'text'`` with ``'`` doubled
  (DataFusion's default dialect reads backslashes literally).
* :func:`spark_path`: a Spark column path for ``F.col``, each part in backticks with ``\\```
  doubled, joined by dots (``image.`t.id``` is the field ``t.id`` of ``image``).

Where an API takes a name as a value rather than text (``pyarrow.compute.field``,
``Column.getField``, ``alias``, ``withColumn``), the name is passed as it is.
"""

from __future__ import annotations


def sql_ident(name: str) -> str:
    """``name`` as a quoted DataFusion identifier (case kept, ``"`` doubled)."""
    return '"' + name.replace('"', '""') + '"'


def sql_column(alias: str, name: str) -> str:
    """``alias."name"``: a column of a MERGE's source or target (``alias`` is ours)."""
    return f"{alias}.{sql_ident(name)}"


def sql_literal(value: str) -> str:
    """``value`` as a DataFusion string literal (``'`` doubled)."""
    return "'" + value.replace("'", "''") + "'"


def spark_path(*parts: str) -> str:
    """A Spark column path for ``F.col``: every part backtick-quoted, joined by dots."""
    return ".".join("`" + p.replace("`", "``") + "`" for p in parts)
