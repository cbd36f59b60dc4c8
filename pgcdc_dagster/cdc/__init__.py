"""Pure core: LSNs, pgoutput decoding, transaction assembly, type conversion, envelopes.

Nothing in this package performs I/O or imports dagster, psycopg2 or pyspark
(``tests/unit/test_core_is_pure.py`` enforces it).
"""
