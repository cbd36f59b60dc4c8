"""The capture engine: initial snapshot, micro-batches and silver catch-up, free of Dagster.

Dagster assets call these functions; they take plain settings and return reports.
"""
