"""Binary NUMERIC digits to unscaled integers: the one-word path (up to four digit groups)
and the group-by-group path agree with each other and with Python's decimal arithmetic,
and both refuse a value with more fractional digits than the scale keeps.

``tests/integration/test_snapshot_binary.py`` checks whole columns against text COPY on
real PostgreSQL output; this drives the two paths directly over thousands of values of
every digit-group layout (weights far below and above the point, trailing and leading
zero groups, values the scale cuts) that a table of a few columns cannot hold.
"""

from __future__ import annotations

import random
import struct
from decimal import Decimal

import numpy as np
import pytest

from pgcdc_dagster.capture import snapshot_binary as sb
from pgcdc_dagster.cdc import copy_columns as cc


def numeric_send(value: Decimal) -> bytes:
    """PostgreSQL's binary send format of a finite NUMERIC (``numeric_send``)."""
    sign, digits, exponent = value.normalize().as_tuple()
    assert isinstance(exponent, int)
    if not any(digits):
        return struct.pack(">hhHh", 0, 0, 0, 0)
    text = "".join(map(str, digits))
    # align the digits on base-10000 groups around the decimal point
    frac = -exponent if exponent < 0 else 0
    text += "0" * max(exponent, 0)
    pad_right = (-frac) % 4
    text += "0" * pad_right
    frac += pad_right
    pad_left = (-(len(text) - frac)) % 4
    text = "0" * pad_left + text
    groups = [int(text[i:i + 4]) for i in range(0, len(text), 4)]
    weight = (len(text) - frac) // 4 - 1
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    return struct.pack(f">hhHh{len(groups)}h", len(groups), weight,
                       0x4000 if sign else 0, 0, *groups)


def _columns(values: list[bytes | None]) -> cc.BinaryRows:
    rows = [struct.pack(">h", 1) + (struct.pack(">i", -1) if v is None else
                                    struct.pack(">i", len(v)) + v) for v in values]
    return cc.split_fields(rows, 1)


def _both(values: list[Decimal | None], scale: int
          ) -> tuple[np.ndarray | None, np.ndarray | None]:
    rows = _columns([None if v is None else numeric_send(v) for v in values])
    start = rows.starts[0]
    int16 = cc.numbers_at(rows.data, ">i2")
    live = ~cc.nulls(rows, 0)
    start = np.where(live, start, 0)
    ndigits = np.where(live, int16[start].astype(np.int64), 0)
    weight = int16[start + 2].astype(np.int64)
    word = sb._unscaled_in_word(rows.data, start, ndigits, weight, scale) \
        if int(ndigits.max()) <= sb._WORD_GROUPS else None
    digit = sb._unscaled_by_digit(int16, start, ndigits, weight, live, scale)
    return word, digit


def _magnitude(value: Decimal, scale: int) -> int:
    return int(abs(value).scaleb(scale))


@pytest.mark.parametrize("scale", [0, 1, 2, 3, 4, 5, 8, 12])
def test_word_and_digit_paths_equal_decimal_arithmetic(scale: int) -> None:
    rng = random.Random(scale)
    values: list[Decimal | None] = [None, Decimal(0)]
    wide: list[Decimal | None] = []
    edges = [10**16 - 1, 10**18 - 1, 1, 10**4, 10**8, 10**12, 10**4 - 1, 10**scale]
    for i in range(3000 + len(edges)):
        if i < len(edges):
            unscaled = edges[i]
        else:
            digits = rng.randint(1, 18)
            unscaled = rng.randrange(10 ** (digits - 1), 10**digits)
            unscaled *= 10 ** rng.choice([0, 0, 1, 4, 5])  # trailing zero groups
        if len(str(unscaled)) > 18:
            continue
        value = Decimal(unscaled).scaleb(-scale) * rng.choice([1, -1])
        # at most four digit groups: the word path's; five: the group-by-group path's
        four = struct.unpack_from(">h", numeric_send(value))[0] <= sb._WORD_GROUPS
        (values if four else wide).append(value)
    assert len(values) > 1000 and len(wide) > 100
    word, digit = _both(values, scale)
    assert word is not None and digit is not None
    want = [0 if v is None else _magnitude(v, scale) for v in values]
    assert word.tolist() == want
    assert digit.tolist() == want
    word, digit = _both(values + wide, scale)
    assert word is None and digit is not None
    assert digit.tolist() == want + [_magnitude(v, scale) for v in wide if v is not None]


@pytest.mark.parametrize(("value", "scale"), [
    (Decimal("0.005"), 2), (Decimal("1.5"), 0), (Decimal("123.00001"), 4),
    (Decimal("1e-20"), 2), (Decimal("1e-30"), 18)])
def test_more_digits_than_the_scale_refused_by_both(value: Decimal, scale: int) -> None:
    word, digit = _both([Decimal(1), value], scale)
    assert word is None and digit is None


def test_send_format_matches_known_encodings() -> None:
    # numeric_send of 123.45: 2 groups (123, 4500), weight 0, positive
    assert numeric_send(Decimal("123.45")) == struct.pack(">hhHh2h", 2, 0, 0, 0, 123, 4500)
    # 1e20: one group (1), weight 5
    assert numeric_send(Decimal("1e20")) == struct.pack(">hhHhh", 1, 5, 0, 0, 1)
    # -0.0001: one group (1), weight -1, negative
    assert numeric_send(Decimal("-0.0001")) == struct.pack(">hhHhh", 1, -1, 0x4000, 0, 1)
