"""Where the Delta tables live, as a Dagster resource."""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from pgcdc_dagster.lake.paths import normalise_root, table_uri


class LakehouseResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Root of the lakehouse (``PGCDC_LAKEHOUSE``): a local path or an object-store URI."""

    root: str = Field(
        description="Root path or URI of the lakehouse; tables land at "
        "<root>/bronze/<schema>/<table> and <root>/silver/<schema>/<table>.",
    )

    def table(self, layer: str, schema: str, table: str) -> str:
        """URI of one Delta table."""
        return table_uri(self.root, layer, schema, table)

    def normalised(self) -> str:
        """The root as an absolute path (or the URI unchanged)."""
        return normalise_root(self.root)
