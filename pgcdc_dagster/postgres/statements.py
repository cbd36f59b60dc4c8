"""Running composed SQL with values: the one way a statement holding a name gets parameters.

psycopg2 %-formats the *whole* statement text whenever parameters are passed, so a name
rendered by ``sql.Identifier`` that holds ``%`` (a table ``a%2Fb``, a column ``50%``, a
schema ``%(k)s``) would be read as a placeholder: the statement fails (``unsupported format
character``, ``tuple index out of range``, ``KeyError``) or, worse, a name like ``x%sy``
takes a parameter's place. Without parameters psycopg2 leaves the text alone.

So: statement text the code writes as a constant ``str`` may take parameters (``%s``); a
``sql.Composed`` (which may hold source names) never does. :func:`execute` binds the values
of a composed statement's ``sql.Placeholder()`` slots as ``sql.Literal`` (psycopg2's own
quoting of the same values) and runs the statement without parameters.
``tests/unit/test_statements.py`` checks that no ``execute`` in the package passes
parameters with a statement that is not constant text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg2.extensions
from psycopg2 import sql


def bind(query: sql.Composable, params: Sequence[Any]) -> sql.Composable:
    """``query`` with its ``sql.Placeholder()`` slots, in order, replaced by the values as
    literals.

    Raises:
        ValueError: a named placeholder, or not as many values as placeholders.
    """
    values = iter(params)
    used = 0

    def walk(part: sql.Composable) -> sql.Composable:
        nonlocal used
        if isinstance(part, sql.Placeholder):
            if part.name is not None:
                raise ValueError("bind() takes positional placeholders only")
            try:
                value = next(values)
            except StopIteration:
                raise ValueError("more placeholders than values") from None
            used += 1
            return sql.Literal(value)
        if isinstance(part, sql.Composed):
            return sql.Composed([walk(p) for p in part.seq])
        return part

    bound = walk(query)
    if used != len(params):
        raise ValueError(f"{len(params)} values for {used} placeholders")
    return bound


def execute(cur: psycopg2.extensions.cursor, query: str | sql.Composable,
            params: Sequence[Any] | None = None) -> None:
    """Run ``query`` with ``params``: constant text as psycopg2 does; a composed statement
    with its placeholders bound as literals and no %-formatting of its text."""
    if isinstance(query, sql.Composable):
        cur.execute(bind(query, params or ()) if params else query)
    else:
        cur.execute(query, params)
