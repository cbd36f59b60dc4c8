"""Java number formatting that Debezium's string encodings inherit.

``Double.toString`` (money in ``decimal.handling.mode=string``). Digits are the shortest
round-trip digits (as JDK 19+ prints them; Python's ``repr`` uses the same rule).
"""

from __future__ import annotations

import math
from decimal import Decimal


def _digits(value: float) -> tuple[str, int]:
    """Java's digits of ``|value|`` and the exponent of the first digit (d.ddd x 10^exp).

    The shortest round-trip digits; when one digit would do, Java prints two, the two-digit
    decimal closest to the exact value (``Double.toString``'s specification: ``4.9E-324``
    for the smallest subnormal, whose shortest form is ``5e-324``).
    """
    digits, exp = _tuple_digits(Decimal(repr(abs(value))))
    if len(digits) == 1:
        exact = Decimal(abs(value))  # the binary value, exactly
        two, two_exp = _tuple_digits(exact.quantize(
            Decimal(1).scaleb(exact.adjusted() - 1), rounding="ROUND_HALF_EVEN"))
        if float(two[0] + "." + two[1:] + f"e{two_exp}") == abs(value):
            return two.rstrip("0") or "0", two_exp
    return digits, exp


def _tuple_digits(dec: Decimal) -> tuple[str, int]:
    _, digits, exponent = dec.normalize().as_tuple()
    assert isinstance(exponent, int)
    return "".join(str(d) for d in digits), len(digits) - 1 + exponent


def java_double_string(value: float) -> str:
    """``java.lang.Double.toString(value)``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0.0"
    digits, exp = _digits(value)
    if 1e-3 <= abs(value) < 1e7:
        if exp >= 0:
            whole = digits[: exp + 1].ljust(exp + 1, "0")
            frac = digits[exp + 1:] or "0"
        else:
            whole = "0"
            frac = "0" * (-exp - 1) + digits
        return f"{sign}{whole}.{frac}"
    mantissa = digits[0] + "." + (digits[1:] or "0")
    return f"{sign}{mantissa}E{exp}"

