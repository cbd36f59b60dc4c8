"""This repository's own code location (``workspace.yaml``), built on the public API.

The wheel installs ``pgcdc_dagster`` only: this folder is not part of it. The definitions are
the single capture configured by the ``PGCDC_*`` environment variables
(:mod:`pgcdc_dagster.definitions`); a project that captures several sources builds its own
with :func:`pgcdc_dagster.pgcdc_definitions` or the ``PgcdcComponent`` (README.md).
"""

from pgcdc_dagster.definitions import defs

__all__ = ["defs"]
