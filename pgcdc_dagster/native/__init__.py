"""Compiled per-row loops of the snapshot reader (a small C library loaded with ctypes).

:mod:`pgcdc_dagster.native.build` compiles ``copyscan.c`` once per machine;
:mod:`pgcdc_dagster.native.copyscan` loads it and calls it on numpy arrays. Without a C
compiler, or with ``PGCDC_NATIVE=off``, the numpy code runs instead (same results).
"""
