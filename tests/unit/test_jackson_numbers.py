"""Number text as Jackson writes it on Java (``cdc/jackson.py``, ``typeconv/javafmt.py``),
with the values the real Debezium 3.6 wrote in the differential test."""

from __future__ import annotations

import pytest

from pgcdc_dagster.cdc.jackson import dumps, float32_value, java_numbers


@pytest.mark.parametrize(("value", "text"), [
    (5e-324, "4.9E-324"),  # one shortest digit: Java prints two
    (1e23, "1.0E23"),
    (1e10, "1.0E10"),
    (1.7976931348623157e308, "1.7976931348623157E308"),
    (0.001, "0.001"),
    (2.0, "2.0"),
])
def test_double_text(value, text):
    assert dumps(value) == text


@pytest.mark.parametrize(("value", "text"), [
    (3.4028235e38, "3.4028235E38"),  # the largest float32: no OverflowError
    (1e-45, "1.4E-45"),              # the smallest subnormal float32
    (3.3, "3.3"),
    (3.0, "3.0"),
    (4e38, '"Infinity"'),            # past float32's range
])
def test_float32_text(value, text):
    assert dumps(java_numbers({"type": "float"}, value)) == text
    assert dumps(float32_value(value)) == text


def test_replace_null_with_default_both_ways():
    """The JsonConverter's ``replace.null.with.default``: a null of a field with a default
    is written as the default when on (Kafka's default), as null when off."""
    from pgcdc_dagster.cdc.debezium_json import FieldCodec

    field = FieldCodec("opt", {"type": "int32", "optional": True, "default": 7}, lambda v: v)
    assert field.value(None) == 7
    assert field.value(None, False) is None
    assert field.value(3, True) == 3
