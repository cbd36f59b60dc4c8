"""Debezium's column options: which columns are captured, how values are mapped, which key.

Properties (Debezium syntax, regular expressions matched case-insensitively against the whole
``schema.table.column`` name, as Debezium's ``Predicates.includes`` does):

* ``column.include.list`` / ``column.exclude.list`` (older ``column.whitelist`` /
  ``column.blacklist``; CFG-36/37, TYPE-16): columns left out of ``before``/``after`` and
  silver. Key columns are always kept (EVT-06), in the key and, here, in the value too
  (silver is keyed from the row image). The two lists exclude each other.
* ``column.truncate.to.<N>.chars``, ``column.mask.with.<N>.chars`` (TYPE-13/14, CFG-46/47),
  ``column.mask.hash.<algorithm>.with.salt.<salt>`` and ``column.mask.hash.v2.<algorithm>.
  with.salt.<salt>`` (hash masks, not in the seeds: Debezium's ``MaskStrings``),
  ``column.propagate.source.type`` (TYPE-15, CFG-48): one mapper per column, the first
  matching rule in Debezium's order (truncations, masks, propagation, hashes, hashes v2), as
  ``ColumnMappers.mapperFor`` picks it. See ``column_mappers.py`` for what each does.
* ``message.key.columns`` (CFG-38, EVT-05): ``<table regex>:<column>,<column>;...``; each
  ``<table regex>.<column>`` is a regular expression over ``schema.table.column``. A table
  some item matches is keyed by the matched columns, in table order (bronze ``key``, the
  silver MERGE key); a table none matches keeps its primary key.

``ColumnOptions.parse`` validates everything up front with messages that name the property.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from pgcdc_dagster.cdc.changes import Relation, TableChanges
from pgcdc_dagster.cdc.column_mappers import (
    JAVA_DIGESTS,
    Hash,
    MappedConverter,
    Mapper,
    Mask,
    Propagate,
    Truncate,
)
from pgcdc_dagster.cdc.typeconv import ColumnConverter, PgType
from pgcdc_dagster.exceptions import ConfigurationError

INCLUDE = ("column.include.list", "column.whitelist")
EXCLUDE = ("column.exclude.list", "column.blacklist")
PROPAGATE = "column.propagate.source.type"
KEY_COLUMNS = "message.key.columns"
_TRUNCATE = re.compile(r"column\.truncate\.to\.(\d+)\.chars")
_MASK = re.compile(r"column\.mask\.with\.(\d+)\.chars")
_HASH = re.compile(r"column\.mask\.hash\.(v2\.)?([^.]+)\.with\.salt\.(.+)", re.DOTALL)

Patterns = tuple[re.Pattern[str], ...]


def split_regex_list(value: str) -> list[str]:
    """Split a comma-separated list of regular expressions (Debezium's list properties).

    A comma escaped as ``\\,`` and a comma inside ``{m,n}``, ``(...)`` or a character class
    ``[...]`` belong to the expression; surrounding blanks are dropped. Inside a character
    class, brackets and braces are plain characters (``[(]`` opens no group) and a ``]`` right
    after ``[`` or ``[^`` is a member, as in Python's ``re``.
    """
    items: list[str] = []
    current: list[str] = []
    depth = 0
    in_class = False
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "\\" and i + 1 < len(value):
            nxt = value[i + 1]
            current.append("," if nxt == "," else ch + nxt)
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            # A ']' first in the class (after an optional '^') is a member, not its end.
            j = i + 1 + (value[i + 1:i + 2] == "^")
            if value[j:j + 1] == "]":
                current.append(value[i:j + 1])
                i = j + 1
                continue
        elif ch in "{(":
            depth += 1
        elif ch in "})" and depth:
            depth -= 1
        if ch == "," and depth == 0 and not in_class:
            items.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
        i += 1
    items.append("".join(current).strip())
    return [item for item in items if item]


def _compile(prop: str, text: str) -> re.Pattern[str]:
    try:
        return re.compile(text, re.IGNORECASE)
    except re.error as exc:
        raise ConfigurationError(f"{prop}: {text!r} is not a valid regular expression "
                                 f"({exc})") from None


def _patterns(prop: str, value: str) -> Patterns:
    return tuple(_compile(prop, p) for p in split_regex_list(value))


def _matches(patterns: Patterns, name: str) -> bool:
    return any(p.fullmatch(name) for p in patterns)


def _key_patterns(value: str) -> Patterns:
    """``message.key.columns`` -> one ``<table regex>.<column>`` pattern per column."""
    out: list[re.Pattern[str]] = []
    for item in (i.strip() for i in value.split(";")):
        if not item:
            continue
        table, sep, columns = item.partition(":")
        cols = [c.strip() for c in columns.split(",") if c.strip()]
        if not sep or not table.strip() or not cols or ":" in columns:
            raise ConfigurationError(
                f"{KEY_COLUMNS}: {item!r} is not '<schema>.<table>:<column>[,<column>...]' "
                "(items are separated by ';')")
        out.extend(_compile(KEY_COLUMNS, f"{table.strip()}.{c}") for c in cols)
    return tuple(out)


def _mapper_rule(prop: str, value: str) -> tuple[int, Mapper] | None:
    """(Debezium precedence, mapper) of a mapper property; None if ``prop`` is not one."""
    if m := _TRUNCATE.fullmatch(prop):
        chars = int(m.group(1))
        if chars <= 0:
            raise ConfigurationError(f"{prop}: the length must be a positive integer")
        return 0, Truncate(chars)
    if m := _MASK.fullmatch(prop):
        return 1, Mask(int(m.group(1)))
    if prop == PROPAGATE:
        return 2, Propagate()
    if m := _HASH.fullmatch(prop):
        algorithm = m.group(2)
        if algorithm.upper() not in JAVA_DIGESTS:
            raise ConfigurationError(
                f"{prop}: hash algorithm {algorithm!r} is not supported; use one of "
                f"{', '.join(JAVA_DIGESTS)}")
        v2 = m.group(1) is not None
        return (4 if v2 else 3), Hash(algorithm, m.group(3), v2)
    return None


@dataclass(frozen=True)
class ColumnOptions:
    """Parsed column options of one capture (see the module doc)."""

    include: Patterns = ()
    exclude: Patterns = ()
    rules: tuple[tuple[Patterns, Mapper], ...] = ()
    """Mapper rules in Debezium's precedence order; the first match wins."""
    key_columns: Patterns = ()
    properties: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, properties: Iterable[tuple[str, str]]) -> ColumnOptions:
        """Parse ``(property, value)`` pairs in Debezium syntax.

        Raises:
            ConfigurationError: unknown property, bad regular expression, bad length,
                unsupported hash algorithm, both include and exclude lists, malformed
                ``message.key.columns``.
        """
        pairs = tuple((str(p).strip(), str(v)) for p, v in properties)
        include: Patterns = ()
        exclude: Patterns = ()
        keys: Patterns = ()
        ranked: list[tuple[int, int, Patterns, Mapper]] = []
        for order, (prop, value) in enumerate(pairs):
            if not value.strip():
                continue
            if prop in INCLUDE:
                include += _patterns(prop, value)
            elif prop in EXCLUDE:
                exclude += _patterns(prop, value)
            elif prop == KEY_COLUMNS:
                keys += _key_patterns(value)
            elif (rule := _mapper_rule(prop, value)) is not None:
                ranked.append((rule[0], order, _patterns(prop, value), rule[1]))
            else:
                raise ConfigurationError(
                    f"{prop!r} is not a column option; use column.include.list, "
                    "column.exclude.list, column.mask.with.<N>.chars, "
                    "column.truncate.to.<N>.chars, column.mask.hash[.v2].<algorithm>.with."
                    f"salt.<salt>, {PROPAGATE} or {KEY_COLUMNS}")
        if include and exclude:
            raise ConfigurationError(
                "column.include.list and column.exclude.list cannot be used together; "
                "set only one of them")
        rules = tuple((patterns, mapper) for _, _, patterns, mapper in sorted(
            ranked, key=lambda r: (r[0], r[1])))
        return cls(include, exclude, rules, keys, pairs)

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude or self.rules or self.key_columns)

    def captures(self, schema: str, table: str, column: str) -> bool:
        """Whether the column list keeps ``schema.table.column`` (key columns aside)."""
        name = f"{schema}.{table}.{column}"
        if self.include:
            return _matches(self.include, name)
        return not _matches(self.exclude, name)

    def mapper_for(self, schema: str, table: str, column: str) -> Mapper | None:
        """The column's mapper: the first matching rule, as Debezium picks it."""
        name = f"{schema}.{table}.{column}"
        for patterns, mapper in self.rules:
            if _matches(patterns, name):
                return mapper
        return None

    def key_for(self, schema: str, table: str, columns: Sequence[str]) -> tuple[str, ...] | None:
        """``message.key.columns`` for the table: matched columns in table order, or None."""
        if not self.key_columns:
            return None
        found = tuple(c for c in columns if _matches(self.key_columns, f"{schema}.{table}.{c}"))
        return found or None

    def shape(self, relation: Relation, converters: Sequence[ColumnConverter],
              types: Mapping[int, PgType]) -> tuple[Relation, tuple[ColumnConverter, ...]]:
        """The captured relation (custom key flagged, filtered columns removed) and its
        converters (mapped columns wrapped in :class:`MappedConverter`).

        Raises:
            ConfigurationError: a mask, hash or truncation matches a key column (bronze's
                key and silver's MERGE key are the row's key values, so they must stay
                exact).
        """
        schema, table = relation.namespace, relation.name
        key = self.key_for(schema, table, [c.name for c in relation.columns])
        if key is not None:
            relation = with_key(relation, key)
        cols, convs = [], []
        for col, conv in zip(relation.columns, converters, strict=True):
            if not (col.is_key or self.captures(schema, table, col.name)):
                continue
            mapper = self.mapper_for(schema, table, col.name)
            if mapper is not None:
                pgtype = types.get(col.type_oid) or getattr(conv, "pgtype", None)
                if pgtype is None:
                    raise ConfigurationError(
                        f"{schema}.{table}.{col.name}: the column type is unknown, so its "
                        "column option cannot be applied")
                mapped = MappedConverter(conv, mapper, pgtype, col.typmod)
                if col.is_key and not isinstance(mapper, Propagate) and mapped.applies:
                    raise ConfigurationError(
                        f"{schema}.{table}.{col.name} is a key column; it cannot be masked, "
                        "hashed or truncated (events and silver are keyed by its exact "
                        "value). Narrow the column option's regular expression.")
                conv = mapped
            cols.append(col)
            convs.append(conv)
        return dataclasses.replace(relation, columns=tuple(cols)), tuple(convs)


def with_key(relation: Relation, key: Sequence[str]) -> Relation:
    """The relation with exactly the ``key`` columns flagged as key."""
    wanted = set(key)
    if all(c.is_key == (c.name in wanted) for c in relation.columns):
        return relation
    return dataclasses.replace(relation, columns=tuple(
        dataclasses.replace(c, is_key=c.name in wanted) for c in relation.columns))


@lru_cache(maxsize=64)
def parse_column_options(properties: tuple[tuple[str, str], ...]) -> ColumnOptions:
    """:meth:`ColumnOptions.parse`, cached by the (hashable) property pairs."""
    return ColumnOptions.parse(properties)


def project_changes(seg: TableChanges, columns: Sequence[str]) -> TableChanges:
    """The segment restricted to ``columns`` (by name, in that order), rows projected.

    Used by the stream so that excluded and dropped columns leave the row tuples before the
    envelope is built; the segment's relation becomes the projected one.
    """
    names = [c.name for c in seg.relation.columns]
    if names == list(columns):
        return seg
    pos = [names.index(c) for c in columns]
    by_name = {c.name: c for c in seg.relation.columns}
    relation = dataclasses.replace(seg.relation, columns=tuple(by_name[c] for c in columns))

    def project(rows: list[tuple[object, ...] | None]) -> list[tuple[object, ...] | None]:
        return [None if r is None else tuple(r[i] for i in pos) for r in rows]

    return dataclasses.replace(seg, relation=relation, before=project(seg.before),  # type: ignore[arg-type]
                               after=project(seg.after))  # type: ignore[arg-type]
