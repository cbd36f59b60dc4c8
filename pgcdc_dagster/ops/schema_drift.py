"""Schema drift: the source table's columns (as silver would type them) against silver's.

The expected schema comes from the source catalog through the same converters the capture
uses; the actual one is the silver Delta table's. Types are compared after folding the
variants Delta cannot distinguish (``string``/``large_string``/``string_view``, list
variants, time-zone spellings of UTC).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from pgcdc_dagster.lake.delta import open_table
from pgcdc_dagster.lake.silver import META_NAMES

_UTC = ("UTC", "+00:00", "Etc/UTC", "Z")


def normalise_type(typ: pa.DataType) -> str:
    """A string naming the type up to representation details Delta does not keep."""
    if pa.types.is_string(typ) or pa.types.is_large_string(typ) or \
            pa.types.is_string_view(typ):
        return "string"
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or \
            pa.types.is_binary_view(typ) or pa.types.is_fixed_size_binary(typ):
        return "binary"
    if pa.types.is_dictionary(typ):
        return normalise_type(typ.value_type)
    if pa.types.is_timestamp(typ):
        tz = "UTC" if typ.tz in _UTC else (typ.tz or "")
        return f"timestamp[{tz}]"
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_list_view(typ) or \
            pa.types.is_fixed_size_list(typ):
        return f"list<{normalise_type(typ.value_type)}>"
    if pa.types.is_struct(typ):
        inner = ", ".join(f"{f.name}: {normalise_type(f.type)}" for f in typ)
        return f"struct<{inner}>"
    if pa.types.is_map(typ):
        return f"map<{normalise_type(typ.key_type)}, {normalise_type(typ.item_type)}>"
    return str(typ)


@dataclass
class DriftReport:
    """Differences between the source columns and the silver table's columns."""

    table: str
    silver_exists: bool = True
    added: list[str] = field(default_factory=list)
    """In the source, not (yet) in silver."""
    removed: list[str] = field(default_factory=list)
    """In silver, no longer in the source (silver keeps the column; new rows have nulls)."""
    changed: list[tuple[str, str, str]] = field(default_factory=list)
    """(column, silver type, type the source now maps to)."""

    @property
    def ok(self) -> bool:
        return self.silver_exists and not (self.added or self.removed or self.changed)

    def describe(self) -> str:
        if not self.silver_exists:
            return f"silver table of {self.table} does not exist yet"
        if self.ok:
            return f"silver columns of {self.table} match the source"
        parts = []
        if self.added:
            parts.append("added in the source: " + ", ".join(self.added))
        if self.removed:
            parts.append("dropped in the source: " + ", ".join(self.removed))
        if self.changed:
            parts.append("type changed: " + ", ".join(
                f"{c} ({old} -> {new})" for c, old, new in self.changed))
        return f"{self.table}: " + "; ".join(parts)


def silver_schema_of(uri: str) -> pa.Schema | None:
    """The silver table's Arrow schema, or None when the table does not exist."""
    table = open_table(uri)
    if table is None:
        return None
    return pa.schema(table.schema().to_arrow())


def compare_schemas(table: str, expected: pa.Schema, actual: pa.Schema | None) -> DriftReport:
    """Compare the schema silver should have (from the source) with the one it has."""
    report = DriftReport(table)
    if actual is None:
        report.silver_exists = False
        return report
    want = {f.name: f.type for f in expected if f.name not in META_NAMES}
    have = {f.name: f.type for f in actual if f.name not in META_NAMES}
    report.added = [n for n in want if n not in have]
    report.removed = [n for n in have if n not in want]
    for name, typ in want.items():
        if name in have and normalise_type(typ) != normalise_type(have[name]):
            report.changed.append((name, normalise_type(have[name]), normalise_type(typ)))
    return report
