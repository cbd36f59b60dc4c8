"""Java number formatting that Debezium's string encodings inherit.

``Double.toString`` (money in ``decimal.handling.mode=string``). Digits are the shortest
round-trip digits (as JDK 19+ prints them; Python's ``repr`` uses the same rule).
"""

from __future__ import annotations

import math
from decimal import Decimal


def _digits(value: float) -> tuple[str, int]:
    """Shortest digits of ``|value|`` and the exponent of the first digit (d.ddd x 10^exp)."""
    _, digits, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
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

