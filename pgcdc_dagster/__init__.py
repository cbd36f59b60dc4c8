"""pgcdc_dagster: change data capture from PostgreSQL into Delta Lake, orchestrated by Dagster.

The public API, for a Dagster project of your own (README.md, "Several sources"):

* :func:`pgcdc_definitions` - one capture as Definitions whose every name is the capture's;
* :class:`PgcdcTranslator` / :class:`PgcdcTableProps` - the table assets' specs;
* :class:`PgcdcComponent` - the same as a Dagster Component (``dg scaffold defs``);
* the resources in :mod:`pgcdc_dagster.resources`.

Names are imported on first use: importing the package (or its pure core,
``pgcdc_dagster.cdc``) imports no Dagster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgcdc_dagster.assets.component import PgcdcComponent
    from pgcdc_dagster.assets.factory import pgcdc_definitions
    from pgcdc_dagster.assets.translator import PgcdcTableProps, PgcdcTranslator

_EXPORTS = {
    "pgcdc_definitions": "pgcdc_dagster.assets.factory",
    "PgcdcTranslator": "pgcdc_dagster.assets.translator",
    "PgcdcTableProps": "pgcdc_dagster.assets.translator",
    "PgcdcComponent": "pgcdc_dagster.assets.component",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pgcdc_dagster' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["PgcdcComponent", "PgcdcTableProps", "PgcdcTranslator", "pgcdc_definitions"]


def __dir__() -> list[str]:
    """The public names too (``dg`` lists the package's components by them)."""
    return sorted({*globals(), *_EXPORTS})
