"""Dagster names of source tables: asset key components, op identifiers, tag values.

PostgreSQL names may hold any character but NUL; Dagster names may not. This module is the
one mapping between the two (pure, no I/O). Lakehouse paths are another concern
(:mod:`pgcdc_dagster.lake.paths`).

**Asset key component** (``bronze/<schema>/<table>``, ``silver/...``, ``source/...``): a name
of ``[A-Za-z0-9_]`` characters is its own component (the keys of ordinary names never
change), unless it starts with ``x__`` or is ``_pgcdc`` (the capture-wide tables'
``bronze/_pgcdc/...``). Any other name is escaped: ``x__`` followed by the
name with ``_`` written ``__`` and every character outside ``[A-Za-z0-9]`` written ``_<hex
code point>_``::

    orders      -> orders            a_b   -> a_b          A -> A  (case is kept)
    a-b         -> x__a_2d_b         my table -> x__my_20_table
    café        -> x__caf_e9_        ..    -> x___2e__2e_
    x__old      -> x__x____old

The mapping is injective (escaped components start with ``x__``, ordinary ones do not, and
the escape decodes back: :func:`name_of_component`), and every component matches Dagster's
name rule ``^[A-Za-z0-9_]+$``, so it is valid wherever Dagster derives names from keys.

**Op identifiers** (:func:`identifier`): Dagster derives op input and output names from asset
keys by joining the components with ``_`` or ``__``, which is not injective (``a_b.c`` and
``a.b_c``; ``a__b.c`` and ``a.b__c``). The definitions name inputs and outputs with
:func:`identifier` instead: ``<layer>__<schema>__<table>`` when neither component holds ``__``
nor starts or ends with ``_`` (the name Dagster would derive), else ``<layer>__x<hex of the
UTF-8 bytes of schema NUL table>``. Injective, valid, stable across reloads.

**Partition keys** of the incremental snapshot (:func:`partition_key`): ``schema.table`` as
Debezium's ``data-collections`` write it, with a fallback for what Dagster refuses there.

**Table identity** (:func:`table_id`): ``schema.table`` as Debezium's ``data-collections``
write it, a part holding ``.`` (or ``"``, or white space at its ends) double-quoted: the
engine's one text key of a table (counts, reports, progress, signals, export ``--table``).

**Tag values** (:func:`tag_value`): Dagster's strict tag values are ``[A-Za-z0-9_.-]{0,63}``;
a name that is not one gets no tag (the real name is in the asset's description and
metadata, ``pgcdc/schema`` and ``pgcdc/table``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from urllib.parse import quote, unquote

ESCAPE_PREFIX = "x__"
"""Start of every escaped component (and of no ordinary one)."""

RESERVED = frozenset({"_pgcdc"})
"""Names escaped although plain: ``bronze/_pgcdc/...`` holds the capture-wide tables."""

_ORDINARY = re.compile(r"[A-Za-z0-9_]+")
_ALNUM = re.compile(r"[A-Za-z0-9]")
_TAG_VALUE = re.compile(r"[A-Za-z0-9_.-]{1,63}")
_JOIN_SAFE = re.compile(r"[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*")
_HEX_ESCAPE = re.compile(r"_([0-9a-f]+)_")


def is_ordinary(name: str) -> bool:
    """True when ``name`` is its own key component."""
    return (bool(_ORDINARY.fullmatch(name)) and not name.startswith(ESCAPE_PREFIX)
            and name not in RESERVED)


def key_component(name: str) -> str:
    """The asset key component of a schema or table name (see the module doc)."""
    if is_ordinary(name):
        return name
    out = [ESCAPE_PREFIX]
    for ch in name:
        if _ALNUM.fullmatch(ch):
            out.append(ch)
        elif ch == "_":
            out.append("__")
        else:
            out.append(f"_{ord(ch):x}_")
    return "".join(out)


def name_of_component(component: str) -> str:
    """The schema or table name of a key component (inverse of :func:`key_component`).

    Raises:
        ValueError: ``component`` is not one :func:`key_component` produces.
    """
    if not component.startswith(ESCAPE_PREFIX):
        if not is_ordinary(component):
            raise ValueError(f"{component!r} is not an asset key component of a table")
        return component
    body = component[len(ESCAPE_PREFIX):]
    out = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "_":
            if not _ALNUM.fullmatch(ch):
                raise ValueError(f"{component!r} is not an asset key component of a table")
            out.append(ch)
            i += 1
        elif body.startswith("__", i):
            out.append("_")
            i += 2
        else:
            m = _HEX_ESCAPE.match(body, i)
            if m is None:
                raise ValueError(f"{component!r} has an unterminated escape at {i}")
            out.append(chr(int(m.group(1), 16)))
            i = m.end()
    name = "".join(out)
    if key_component(name) != component:  # e.g. an escape of a character kept as itself
        raise ValueError(f"{component!r} is not the canonical component of {name!r}")
    return name


def asset_path(layer: str, schema: str, table: str) -> list[str]:
    """The asset key path of a table in a layer: ``[layer, schema', table']``."""
    return [layer, key_component(schema), key_component(table)]


def table_of_path(path: Sequence[str]) -> tuple[str, str]:
    """The ``(schema, table)`` of an asset key path made by :func:`asset_path`."""
    if len(path) != 3:
        raise ValueError(f"{'/'.join(path)!r} is not the asset key of a captured table")
    return name_of_component(path[1]), name_of_component(path[2])


def identifier(layer: str, schema: str, table: str) -> str:
    """An op input/output name for a table in a layer (injective; see the module doc)."""
    parts = (key_component(schema), key_component(table))
    if all(_JOIN_SAFE.fullmatch(p) for p in parts):
        return "__".join((layer, *parts))
    raw = schema.encode("utf-8") + b"\0" + table.encode("utf-8")
    return f"{layer}__x{raw.hex()}"


def tag_value(name: str) -> str | None:
    """``name`` as a Dagster tag value, or None when it is not a valid one."""
    return name if _TAG_VALUE.fullmatch(name) else None


_PLAIN_SQL = re.compile(r"[a-z_][a-z0-9_]*")


def quote_ident(name: str) -> str:
    """``name`` as PostgreSQL's ``quote_ident`` writes it (keywords aside): double-quoted,
    ``"`` doubled, unless lower-case plain. Usable in the SQL of a fix."""
    return name if _PLAIN_SQL.fullmatch(name) else '"' + name.replace('"', '""') + '"'


def display_name(schema: str, table: str) -> str:
    """``schema.table`` with each part as :func:`quote_ident` writes it."""
    return f"{quote_ident(schema)}.{quote_ident(table)}"


_BARE_PART = re.compile(r'[^."\s](?:[^."]*[^."\s])?')


def _id_part(p: str) -> str:
    return p if _BARE_PART.fullmatch(p) else '"' + p.replace('"', '""') + '"'


def table_id(schema: str, table: str) -> str:
    """The engine's identity of a source table as text (the key of its counts, progress,
    reports, transaction metadata and signals' ``data-collections``): ``schema.table``, a
    part that holds ``.`` or ``"``, is empty, or starts or ends with white space written
    double-quoted with ``"`` doubled (Debezium's quoting of names with dots). Every ordinary
    name keeps its ``schema.table``; ``"a.b".c`` and ``a."b.c"`` stay apart (injective;
    :func:`parse_table_id` is the inverse)."""
    return f"{_id_part(schema)}.{_id_part(table)}"


def parse_table_id(text: str) -> tuple[str, str]:
    """The ``(schema, table)`` of a :func:`table_id` (surrounding white space ignored).

    An unquoted name with more than one dot (``a.b.c``) names no table for sure; it is
    refused, naming the two quoted forms.

    Raises:
        ValueError: ``text`` is not ``<schema>.<table>`` or is ambiguous.
    """
    text = text.strip()
    m = _QUOTED_KEY.fullmatch(text)
    if m is not None:
        return _unquote_part(m.group(1)), _unquote_part(m.group(2))
    if '"' not in text and text.count(".") > 1:
        first, _, rest = text.partition(".")
        head, _, last = text.rpartition(".")
        raise ValueError(
            f"{text!r} is ambiguous: a schema or table name holding a dot must be "
            f"double-quoted, e.g. {table_id(first, rest)} or {table_id(head, last)}")
    raise ValueError(f"{text!r} is not <schema>.<table> (a part holding a dot or a double "
                     "quote double-quoted, \" doubled)")


def splits(text: str) -> list[tuple[str, str]]:
    """Every ``(schema, table)`` whose plain ``schema.table`` is ``text``."""
    return [(text[:i], text[i + 1:]) for i, ch in enumerate(text) if ch == "."]


def resolve_table_id(text: str, known: Iterable[tuple[str, str]]) -> tuple[str, str]:
    """:func:`parse_table_id`, except that an unquoted name with several dots names the one
    table of ``known`` whose plain ``schema.table`` it is (as such names always did).

    Raises:
        ValueError: not a table name, or ambiguous among ``known``.
    """
    try:
        return parse_table_id(text)
    except ValueError:
        found = [t for t in known if f"{t[0]}.{t[1]}" == text.strip()]
        if len(found) == 1:
            return found[0]
        raise


INVALID_PARTITION_SUBSTRINGS = ("...", "\a", "\b", "\f", "\n", "\r", "\t", "\v", "\0")
"""What Dagster refuses in a partition key (dagster INVALID_PARTITION_SUBSTRINGS)."""

_PLAIN_PART = re.compile(r'[^."]+')
_QUOTED_KEY = re.compile(r'("(?:[^"]|"")*"|[^."]+)\.("(?:[^"]|"")*"|[^."]+)')


def _key_part(p: str) -> str:
    return p if _PLAIN_PART.fullmatch(p) else '"' + p.replace('"', '""') + '"'


def _unquote_part(p: str) -> str:
    return p[1:-1].replace('""', '"') if p.startswith('"') else p


def _percent(p: str) -> str:
    return quote(p, safe="").replace(".", "%2E")


def partition_key(schema: str, table: str) -> str:
    """The incremental-snapshot partition of a table.

    ``schema.table``, a part holding ``.`` or ``"`` double-quoted (as in Debezium's
    ``data-collections``; every ordinary name keeps this key). When that would contain what
    Dagster refuses in a partition key (``...`` or a control character), ``.`` followed by
    the percent-encoded parts (``.`` written ``%2E``) joined by ``.``: a form the first never
    takes (it never starts with ``.``), so the mapping stays injective.
    """
    key = f"{_key_part(schema)}.{_key_part(table)}"
    if not any(bad in key for bad in INVALID_PARTITION_SUBSTRINGS):
        return key
    return f".{_percent(schema)}.{_percent(table)}"


def partition_table(key: str) -> tuple[str, str]:
    """The ``(schema, table)`` of a partition key (inverse of :func:`partition_key`).

    Raises:
        ValueError: ``key`` is not a partition key of a table.
    """
    if key.startswith("."):
        parts = key[1:].split(".")
        if len(parts) == 2 and all(parts):
            return unquote(parts[0], errors="strict"), unquote(parts[1], errors="strict")
    else:
        m = _QUOTED_KEY.fullmatch(key)
        if m is not None:
            return _unquote_part(m.group(1)), _unquote_part(m.group(2))
    raise ValueError(f"{key!r} is not a partition key of a table (<schema>.<table>)")
