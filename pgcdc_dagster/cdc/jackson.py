"""JSON text and numbers as Kafka Connect's JsonConverter (Jackson) writes them.

``dumps`` writes compact JSON with UTF-8 text unescaped and doubles as Java's
``Double.toString`` (``1.0E10``, ``1.5E-4``); ``java_numbers`` gives FLOAT32 values the digits
of ``Float.toString`` (a Connect FLOAT32 travels as a Java float, so ``1.1f`` prints ``1.1``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from pgcdc_dagster.cdc.typeconv.javafmt import java_double_string


def float32_value(value: float) -> float:
    """The float whose digits (as ``java_double_string`` writes them) are ``Float.toString``
    of the FLOAT32 ``value``: the shortest that read back as the same float, and two where
    one would do (``1.4E-45`` for the smallest subnormal, as Java's specification says)."""
    if math.isnan(value) or math.isinf(value) or value == 0:
        return value
    target = _as_float32(value)
    for digits in range(1, 10):
        candidate = float(f"{target:.{digits}g}")
        if _as_float32(candidate) == target:
            if digits == 1:
                two = float(f"{target:.2g}")
                if _as_float32(two) == target:
                    return two
            return candidate
    return target


def _as_float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (values past the largest float32 that still
    round to it, e.g. ``3.4028235e38``, stay finite; beyond, infinity)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def java_numbers(schema: Mapping[str, Any], value: Any) -> Any:
    """Give FLOAT32 values (at any depth) their Java ``Float.toString`` digits."""
    if value is None:
        return None
    kind = schema.get("type")
    if kind == "float" and isinstance(value, float):  # JsonConverter's name for FLOAT32
        return float32_value(value)
    if kind == "array" and isinstance(value, list) and "items" in schema:
        return [java_numbers(schema["items"], v) for v in value]
    if kind == "struct" and isinstance(value, dict):
        by_name = {f["field"]: f for f in schema.get("fields", ())}
        return {k: java_numbers(by_name[k], v) if k in by_name else v
                for k, v in value.items()}
    if kind == "map" and isinstance(value, dict) and "values" in schema:
        return {k: java_numbers(schema["values"], v) for k, v in value.items()}
    return value


def dumps(value: Any) -> str:
    """Compact JSON text as Jackson writes it: UTF-8 text unescaped, doubles as
    ``Double.toString`` (``1.0E10``, ``1.5E-4``), keys in insertion order."""
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts)


def _write(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            out.append(json.dumps(java_double_string(value)))
        else:
            out.append(java_double_string(value))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, Mapping):
        out.append("{")
        for i, (k, v) in enumerate(value.items()):
            if i:
                out.append(",")
            out.append(json.dumps(str(k), ensure_ascii=False))
            out.append(":")
            _write(v, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, v in enumerate(value):
            if i:
                out.append(",")
            _write(v, out)
        out.append("]")
    else:
        raise TypeError(f"cannot write {type(value).__name__} as JSON")
