"""A full lakehouse filesystem: a micro-batch on a small tmpfs filled to the last byte fails
with :class:`LakehouseFullError`, whose headline says ``No space left on device`` and names
the path (not pyarrow's ``file metadata is only available after writer close``); once space
is freed the next run is exact (every change once in bronze, silver equals the source).

Mounting the tmpfs needs root (as the CI runs); elsewhere the test is skipped, saying so.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.exceptions import LakehouseFullError
from pgcdc_dagster.lake.paths import table_uri
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the CI runs as root)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                   check=True, capture_output=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)


def _fill(path: Path) -> None:
    """Write until the filesystem refuses even one byte: nothing is left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)


def test_full_lakehouse_names_the_cause_and_the_path(pg_dsn, pg_conn, spark, small_fs) -> None:
    lakehouse = small_fs / "lakehouse"
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE f (id int PRIMARY KEY, v text)")
        cur.execute("INSERT INTO f SELECT g, 'v' FROM generate_series(1, 200) g")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.f",),
                               slot="full", publication="full")
    run_bronze(settings, spark, force_snapshot_step=True)
    run_silver(settings, spark)
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO f SELECT g, md5(g::text) FROM generate_series(201, 5000) g")
    filler = small_fs / "filler"
    _fill(filler)

    with pytest.raises(LakehouseFullError) as err:
        run_bronze(settings, spark, force_snapshot_step=False)
    message = str(err.value)
    assert message.startswith("No space left on device: the lakehouse filesystem is full, "
                              f"writing {lakehouse}")
    assert "MiB free of 16 MiB on that filesystem" in message
    assert "file metadata is only available" not in message

    filler.unlink()
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    uri = table_uri(str(lakehouse), "silver", "public", "f")
    assert assert_silver_equals_source(pg_conn, uri, "public", "f", ["id"]) == 5000
    bronze = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "f"))
    counts = {c["values"]: c["counts"] for c in
              pc.value_counts(bronze.to_pyarrow_table(columns=["op"])["op"]).to_pylist()}
    assert counts == {"r": 200, "c": 4800}
