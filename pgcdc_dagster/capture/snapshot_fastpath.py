"""Column conversion for snapshots: the converter's bronze value and the silver value from it.

``fast_convert`` returns exactly ``(conv.to_bronze(text), conv.to_silver(text))``. The
generic path decodes silver from the bronze value (equal by the converters' contract and
cheaper than a second text conversion).
"""

from __future__ import annotations

import pyarrow as pa

from pgcdc_dagster.cdc.typeconv import ColumnConverter


def fast_convert(conv: ColumnConverter, text: pa.Array) -> tuple[pa.Array, pa.Array]:
    """``(to_bronze(text), to_silver(text))`` of one column."""
    bronze = conv.to_bronze(text)
    return bronze, conv.from_bronze(bronze)
