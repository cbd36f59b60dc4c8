"""Bronze (Debezium-encoded) values back to native silver values, keyed by semantic type.

Silver is derived from bronze, so silver can always be rebuilt from bronze. A converter may
implement ``from_bronze`` itself; otherwise the Debezium semantic name in the bronze field's
metadata decides the decoding (TYPE- items of the seed inventory).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.cdc.typeconv import ColumnConverter


def _meta(field: pa.Field, key: str) -> str | None:
    value = (field.metadata or {}).get(key.encode())
    return value.decode() if value is not None else None


def _scale(field: pa.Field) -> int:
    params = json.loads(_meta(field, "debezium.parameters") or "{}")
    return int(params.get("scale", 0))


def _unscaled(raw: bytes, scale: int) -> Decimal:
    return Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale)


def _decimal(arr: pa.Array, field: pa.Field, target: pa.DataType) -> pa.Array:
    scale = _scale(field)
    values = [None if v is None else _unscaled(v, scale) for v in arr.to_pylist()]
    return pa.array(values, target)


def _variable_decimal(arr: pa.Array, target: pa.DataType) -> pa.Array:
    out: list[object] = []
    for v in arr.to_pylist():
        if v is None:
            out.append(None)
            continue
        d = _unscaled(v["value"], int(v["scale"]))
        out.append(str(d) if pa.types.is_string(target) else d)
    return pa.array(out, target)


def _zoned(arr: pa.Array, target: pa.DataType) -> pa.Array:
    text = pc.replace_substring_regex(arr, r"Z$", "+00:00")
    return pc.cast(text, pa.timestamp("us", tz="UTC")).cast(target)


def _scaled_int(factor: int, unit_type: pa.DataType) -> Callable[[pa.Array, pa.DataType], pa.Array]:
    def convert(arr: pa.Array, target: pa.DataType) -> pa.Array:
        ints = pc.cast(arr, pa.int64())
        if factor > 0:
            ints = pc.multiply(ints, factor)
        elif factor < 0:
            ints = pc.divide(ints, -factor)
        return pc.cast(ints.cast(unit_type), target)
    return convert


_BY_NAME: dict[str, Callable[[pa.Array, pa.DataType], pa.Array]] = {
    "io.debezium.time.ZonedTimestamp": _zoned,
    "io.debezium.time.Date": lambda a, t: pc.cast(pc.cast(a, pa.int32()).cast(pa.date32()), t),
    "io.debezium.time.MicroTimestamp": _scaled_int(0, pa.timestamp("us")),
    "io.debezium.time.Timestamp": _scaled_int(1000, pa.timestamp("us")),
    "io.debezium.time.NanoTimestamp": _scaled_int(-1000, pa.timestamp("us")),
    "io.debezium.time.MicroTime": _scaled_int(0, pa.time64("us")),
    "io.debezium.time.Time": _scaled_int(1000, pa.time64("us")),
    "io.debezium.time.NanoTime": _scaled_int(-1000, pa.time64("us")),
    "io.debezium.data.VariableScaleDecimal": _variable_decimal,
}


_ZERO = {"int8": 0, "int16": 0, "int32": 0, "int64": 0, "bool": False, "float": 0.0,
         "double": 0.0, "string": "", "binary": b""}


def _restore_required(values: pa.Array, target: pa.DataType) -> pa.Array:
    """Bronze stores nested fields as nullable (a null struct has null children); give the
    required children of null structs a placeholder so the strict Debezium type applies
    (also for the struct elements of an array, e.g. a NULL element of ``geometry[]``)."""
    if pa.types.is_list(values.type) and pa.types.is_list(target) and \
            pa.types.is_struct(target.value_type):
        items = _restore_required(values.values, target.value_type)
        if items.type != target.value_type:
            return values
        return pa.ListArray.from_arrays(values.offsets, items, type=target,
                                        mask=values.is_null() if values.null_count else None)
    if not (pa.types.is_struct(values.type) and pa.types.is_struct(target)):
        return values
    children = []
    for i in range(target.num_fields):
        want = target.field(i)
        child = values.field(want.name)
        child = _restore_required(child, want.type)
        if not want.nullable and child.null_count and str(child.type) in _ZERO:
            child = pc.fill_null(child, pa.scalar(_ZERO[str(child.type)], child.type))
        children.append(child.cast(want.type) if child.type != want.type else child)
    return pa.StructArray.from_arrays(children, fields=list(target), mask=values.is_null())


def from_bronze(conv: ColumnConverter, values: pa.Array) -> pa.Array:
    """Decode one column of bronze values into the converter's silver type."""
    custom = getattr(conv, "from_bronze", None)
    if custom is not None:
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        return custom(_restore_required(values, conv.bronze_field.type))
    target = conv.silver_field.type
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.type == target:
        return values
    name = _meta(conv.bronze_field, "debezium.name")
    if name == "org.apache.kafka.connect.data.Decimal" and pa.types.is_decimal(target):
        return _decimal(values, conv.bronze_field, target)
    if name in _BY_NAME:
        return _BY_NAME[name](values, target)
    return pc.cast(values, target)
