"""Operational helpers behind the Dagster checks, sensors and jobs (no Dagster imports).

Each helper takes a DSN or a table URI and returns a plain report: slot health
(:mod:`.slot_health`), silver against source (:mod:`.consistency`), bronze LSN windows
(:mod:`.lsn_windows`), schema drift (:mod:`.schema_drift`), table discovery
(:mod:`.discovery`), Delta table statistics (:mod:`.delta_stats`) and teardown
(:mod:`.teardown`).
"""
