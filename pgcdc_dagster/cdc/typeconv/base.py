"""The shared converter implementation and the small Arrow helpers every type family uses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.cdc.typeconv.model import PgType, TypeModes
from pgcdc_dagster.cdc.typeconv.schema import ConnectSchema


def as_text(values: pa.Array | pa.ChunkedArray) -> pa.StringArray:
    """Normalise the input column to one ``pa.string()`` array (nulls kept)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if values.type != pa.string():
        values = pc.cast(values, pa.string())
    assert isinstance(values, pa.StringArray)
    return values


def map_values(text: pa.StringArray, fn: Callable[[str], Any], type_: pa.DataType) -> pa.Array:
    """Apply ``fn`` to every non-null value (per-value Python; for the complex types)."""
    return pa.array([None if v is None else fn(v) for v in text.to_pylist()], type=type_)


def patch(fast: pa.Array, text: pa.StringArray, mask: pa.Array,
          fn: Callable[[str], Any]) -> pa.Array:
    """Replace the rows where ``mask`` is true by ``fn(text)``, computed per value.

    Used for the vectorised fast path of a type with a few special values (infinity, BC,
    years past 9999): the fast path fills the common rows, ``fn`` the rest.
    """
    if not pc.any(mask).as_py():
        return fast
    texts = text.to_pylist()
    flags = mask.to_pylist()
    repl = [fn(t) for t, f in zip(texts, flags, strict=True) if f and t is not None]
    filled = pc.fill_null(mask, False)
    return pc.replace_with_mask(fast, filled, pa.array(repl, type=fast.type))


def zero_value(schema: ConnectSchema) -> object:
    """The zero of a Connect schema: 0, 0.0, False, "", b"", [], {} or a struct of zeros."""
    zeros: dict[str, object] = {"boolean": False, "string": "", "bytes": b"", "float32": 0.0,
                                "float64": 0.0, "array": [], "map": []}
    if schema.type == "struct":
        return {n: (None if s.optional else zero_value(s)) for n, s in schema.fields}
    return zeros.get(schema.type, 0)


class BaseConverter:
    """A column converter: a Kafka Connect schema for bronze plus a native silver type.

    Subclasses implement :meth:`_bronze` and :meth:`_silver` on a ``pa.string()`` array and may
    override :meth:`bronze_placeholder` (TYPE-17/18) and :meth:`bronze_fallback`.
    """

    dropped: bool = False
    default_value: object = None
    """The column default's bronze value (set by ``defaults.with_default``), or None."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool, schema: ConnectSchema, silver_type: pa.DataType) -> None:
        self.column = column
        self.pgtype = pgtype
        self.typmod = typmod
        self.modes = modes
        self.nullable = nullable
        self.schema = schema if nullable else schema.required()
        meta = self.schema.arrow_metadata()
        meta["pg.type"] = pgtype.qualified_name
        meta["pg.typmod"] = str(typmod)
        self.bronze_field = pa.field(column, self.schema.arrow_type(), nullable, metadata=meta)
        self.silver_field = pa.field(
            column, silver_type, nullable,
            metadata={"pg.type": pgtype.qualified_name, "pg.typmod": str(typmod)},
        )

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.column!r}, {self.pgtype.name}, "
                f"bronze={self.bronze_field.type}, silver={self.silver_field.type})")

    def to_bronze(self, text: pa.Array) -> pa.Array:
        """Text output values (nulls for SQL NULL) -> Debezium-encoded values.

        For a NOT NULL column, a null (e.g. a non-key column of a DELETE's old-key tuple) is
        replaced by :meth:`bronze_fallback`, as Debezium's ``convertValue`` does.
        """
        out = self._bronze(as_text(text))
        assert out.type == self.bronze_field.type, (out.type, self.bronze_field.type)
        if not self.nullable and out.null_count:
            out = pc.fill_null(out, self.bronze_fallback())
        return out

    def bronze_fallback(self) -> pa.Scalar:
        """The value Debezium writes for a null in a NOT NULL column: the column's default
        when it has one (``42`` for ``DEFAULT 42``; ``now()`` gives the epoch), else the
        type's zero."""
        value = self.default_value if self.default_value is not None \
            else self._fallback_value()
        return pa.scalar(value, type=self.bronze_field.type)

    def _fallback_value(self) -> object:
        return zero_value(self.schema)

    def to_silver(self, text: pa.Array) -> pa.Array:
        """Text output values (nulls for SQL NULL) -> native values.

        Always equal to ``from_bronze(to_bronze(text))`` (nulls kept even for NOT NULL
        columns), so silver written from a snapshot's text and silver derived from bronze
        events agree; where a handling mode makes bronze lossy, silver is equally so.
        """
        out = self._silver(as_text(text))
        assert out.type == self.silver_field.type, (out.type, self.silver_field.type)
        return out

    def from_bronze(self, values: pa.Array | pa.ChunkedArray) -> pa.Array:
        """Bronze (Debezium-encoded) values of this column -> native silver values."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
        if values.type != self.bronze_field.type:
            values = values.cast(self.bronze_field.type)
        out = self._from_bronze(values)
        assert out.type == self.silver_field.type, (out.type, self.silver_field.type)
        return out

    def bronze_placeholder(self) -> pa.Scalar | None:
        """Debezium's value for an unchanged TOAST column; None if it has none (TYPE-17/18)."""
        return None

    def to_json(self, value: object) -> object:
        """A bronze value (``to_pylist`` form) -> the value Debezium's JsonConverter writes."""
        return self.schema.json_value(value)

    def connect_schema(self) -> dict[str, Any]:
        """The Kafka Connect JSON schema fragment Debezium writes for this field."""
        return self.schema.json_schema(field=self.column)

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        raise NotImplementedError

    def _silver(self, text: pa.StringArray) -> pa.Array:
        """Default: decode the bronze encoding (subclasses add equal, faster direct paths)."""
        return self._from_bronze(self._bronze(text))

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        """Default: bronze and silver share the representation."""
        return values

    def _string_placeholder(self) -> pa.Scalar:
        return pa.scalar(self.modes.placeholder_text, type=pa.string())


class DroppedConverter(BaseConverter):
    """A column Debezium omits from events: a type it does not know (TYPE-12, default).

    ``dropped`` is True; callers leave the column out of bronze and silver. The fields still
    describe the text form (``string``) so that callers may log or inspect it.
    """

    dropped = True

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        super().__init__(column, pgtype, typmod, modes, nullable,
                         ConnectSchema("string"), pa.string())

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        return text

    def _silver(self, text: pa.StringArray) -> pa.Array:
        return text
