"""Upkeep racing micro-batches: compaction of bronze and silver and log checkpoints
run in a thread, over and over, while micro-batches capture changes into the same tables.

Whichever commit loses a race fails with a Delta conflict and is redone (the micro-batch's
silver rewrite) or left for the next run (a compaction group); afterwards nothing is lost or
doubled: silver equals the source, bronze holds each change event exactly once, the
compaction commits carry no app transaction, and the bronze offset only moved forward.
"""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.delta import committed_version
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.upkeep import CompactionResult, checkpoint, compact, compact_bronze
from tests.support.compare import assert_silver_equals_source
from tests.support.delta_log import commit_actions

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROUNDS = 5
TARGET = 64 << 10


class Upkeep(threading.Thread):
    """Compacts and checkpoints both tables until stopped; counts what it committed."""

    def __init__(self, settings: CaptureSettings) -> None:
        super().__init__(daemon=True)
        self.settings = settings
        self.stop = threading.Event()
        self.bronze = CompactionResult()
        self.silver = CompactionResult()
        self.error: BaseException | None = None

    def run(self) -> None:
        root, prefix = self.settings.lakehouse, self.settings.app_prefix
        bronze = table_uri(root, "bronze", "public", "items")
        silver = table_uri(root, "silver", "public", "items")
        try:
            while not self.stop.is_set():
                b = compact_bronze(bronze, silver, f"{prefix}:silver:public.items", TARGET)
                s = compact(silver, ["id"], TARGET)
                for total, one in ((self.bronze, b), (self.silver, s)):
                    total.groups += one.groups
                    total.conflicts += one.conflicts
                checkpoint(bronze)
                checkpoint(silver)
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_upkeep_racing_microbatches(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, n int, doc text)")
        cur.execute("INSERT INTO items SELECT g, g, md5(g::text) FROM generate_series(1, 3000) g")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.items",),
                               target_file_bytes=TARGET)
    run_bronze(settings, spark, force_snapshot_step=True)
    run_silver(settings, spark)
    bronze_uri = table_uri(str(lakehouse), "bronze", "public", "items")
    silver_uri = table_uri(str(lakehouse), "silver", "public", "items")
    bronze_app = f"{settings.app_prefix}:bronze:public.items"
    rng = random.Random(17)
    changes = 0
    offsets = [committed_version(DeltaTable(bronze_uri), bronze_app)]
    next_id = 3001
    upkeep = Upkeep(settings)
    upkeep.start()
    try:
        for _ in range(ROUNDS):
            with pg_conn.cursor() as cur:
                cur.execute("UPDATE items SET n = n + 1, doc = md5(random()::text) "
                            "WHERE id = ANY(%s)", (rng.sample(range(1, next_id), 40),))
                changes += cur.rowcount
                cur.execute("INSERT INTO items SELECT g, g, 'new' FROM generate_series(%s, %s) g",
                            (next_id, next_id + 14))
                changes += cur.rowcount
                next_id += 15
                cur.execute("DELETE FROM items WHERE id = ANY(%s)",
                            (rng.sample(range(1, next_id), 10),))
                changes += cur.rowcount
            run_bronze(settings, spark, force_snapshot_step=False)
            run_silver(settings, spark)
            offsets.append(committed_version(DeltaTable(bronze_uri), bronze_app))
    finally:
        upkeep.stop.set()
        upkeep.join(120)
    assert upkeep.error is None, upkeep.error
    assert upkeep.silver.groups and upkeep.bronze.groups  # the race was run, not avoided

    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    assert_silver_equals_source(pg_conn, silver_uri, "public", "items", ["id"])
    ids = DeltaTable(silver_uri).to_pyarrow_table(columns=["id"])["id"].to_pylist()
    assert len(ids) == len(set(ids))  # no row doubled by a lost race
    events = DeltaTable(bronze_uri).to_pyarrow_table(columns=["op", "__commit_lsn", "__ordinal"])
    ops = Counter(events["op"].to_pylist())
    assert ops["r"] == 3000 and ops["c"] + ops["u"] + ops["d"] == changes
    stream = [(lsn, o) for op, lsn, o in zip(events["op"].to_pylist(),
                                              events["__commit_lsn"].to_pylist(),
                                              events["__ordinal"].to_pylist(), strict=True)
              if op != "r"]
    assert len(set(stream)) == len(stream)  # no event doubled by compaction
    assert all(o is not None for o in offsets) and offsets == sorted(offsets)
    for uri in (bronze_uri, silver_uri):
        table = DeltaTable(uri)
        compactions = [h["version"] for h in table.history()
                       if h.get("pgcdc.kind") == "compaction"]
        assert compactions
        for version in compactions:
            assert not [a for a in commit_actions(uri, version) if "txn" in a]
