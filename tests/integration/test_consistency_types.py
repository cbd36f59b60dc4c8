"""Silver against the source for every type family the capture supports.

The comparison hashes both sides column by column (``cdc/row_hash.py``); this closes the
loop on real data: a table with every type of docs/types.md (the type tests' columns, plus
PostGIS), captured by snapshot and by stream, matches its source with no column skipped and
none hashed by the slow exact path. Then each kind of difference is found and named: one
value changed in a column of each family (on silver's rows as read back from Delta), a row
missing, a row extra, NULL against an empty string, 0.0 against -0.0, a decimal's last
digit, an unconstrained numeric's scale (its silver string). Keys changed after silver's
position are left out of both sides and the table still matches.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.cdc import row_hash
from pgcdc_dagster.cdc.typeconv import TypeModes
from pgcdc_dagster.ops.consistency import ConsistencyReport, compare_with_source
from pgcdc_dagster.ops.digest import Digest, differences
from tests.integration.test_types_capture import COLUMNS, SETUP
from tests.support.extensions import require_extensions

pytestmark = [pytest.mark.integration, pytest.mark.spark]

GEO = {"g": ("geometry", "'SRID=4326;POINT(1 2)'"), "gg": ("geography", "'POINT(3 4)'"),
       "ga": ("geometry[]", "ARRAY['POINT(0 0)'::geometry, NULL]")}


def _create(conn) -> list[str]:
    """Table ``w``: rows 1-3 of the type tests' values (row 1 with PostGIS values), row 4
    all NULL, row 5 with -0.0 and an empty string; the column names."""
    with conn.cursor() as cur:
        cur.execute(SETUP)
        columns = {**{n: ddl for n, (ddl, _) in COLUMNS.items()},
                   **{n: ddl for n, (ddl, _) in GEO.items()}}
        cur.execute(f"CREATE TABLE w (id int PRIMARY KEY, "
                    f"{', '.join(f'{n} {t}' for n, t in columns.items())})")
        names = ", ".join(COLUMNS)
        for row in range(3):
            values = ", ".join(lits[row] for _, lits in COLUMNS.values())
            cur.execute(f"INSERT INTO w (id, {names}) VALUES ({row + 1}, {values})")
        for name, (_, literal) in GEO.items():
            cur.execute(f"UPDATE w SET {name} = {literal} WHERE id = 1")
        cur.execute("INSERT INTO w (id) VALUES (4)")
        cur.execute("INSERT INTO w (id, f8, tx) VALUES (5, '-0', '')")
    return list(columns)


def _compare(settings: CaptureSettings) -> ConsistencyReport:
    (ctx,) = load_contexts(settings)
    return compare_with_source(settings.dsn, ctx, settings.slot, settings.publication)


def test_every_type_family_compared_and_every_difference_named(pg_dsn, pg_conn, spark,
                                                               lakehouse, monkeypatch) -> None:
    require_extensions(pg_conn, "hstore", "citext", "ltree", "postgis")
    names = _create(pg_conn)
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.w",),
                               slot="cmptypes", publication="cmptypes",
                               modes=TypeModes(include_unknown=True))
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:  # the same rows again, through the stream
        cur.execute(f"INSERT INTO w (id, {', '.join(names)}) "
                    f"SELECT id + 1000, {', '.join(names)} FROM w")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)

    def exact(value: object) -> int:
        raise AssertionError(f"{value!r} hashed by the slow exact path")

    monkeypatch.setattr(row_hash, "exact_hash", exact)  # every family is vectorised
    report = _compare(settings)
    assert report.ok, report.describe()
    assert report.source.rows == report.silver.rows == 10
    assert report.skipped_columns == [] and report.columns == ["id", *names]
    assert (report.missing, report.extra, report.different) == ([], [], [])
    assert "silver matches the source (10 rows;" in report.describe()

    # One value of each column changed, on silver's own rows (every family's real values).
    (ctx,) = load_contexts(settings)
    silver = DeltaTable(ctx.silver_uri).to_pyarrow_table(
        columns=report.columns, filters=~pc.field("__deleted"))
    base = Digest()
    base.add(silver, [0], np.empty(0, np.uint64), 1000)
    ids = silver["id"].to_pylist()
    for name in names:
        values = silver[name].to_pylist()
        row = next(i for i, v in enumerate(values) if v is not None)
        other = next((v for v in values if v != values[row]), None)
        changed = [other if i == row else v for i, v in enumerate(values)]
        tampered = silver.set_column(silver.column_names.index(name), name,
                                     pa.array(changed, silver.schema.field(name).type))
        side = Digest()
        side.add(tampered, [0], np.empty(0, np.uint64), 1000)
        assert side.row_checksum != base.row_checksum, name
        assert side.key_checksum == base.key_checksum, name
        assert differences(base, side).different == [repr((ids[row],))], name

    # Changes silver does not hold yet: their keys are left out of both sides.
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE w SET i4 = 7 WHERE id = 2")
        cur.execute("DELETE FROM w WHERE id = 3")
        cur.execute("INSERT INTO w (id) VALUES (50)")
    report = _compare(settings)
    assert report.ok, report.describe()
    assert (report.pending_events, report.excluded_keys) == (3, 3)
    assert report.source.rows == report.silver.rows == 8
    assert (report.source.excluded, report.silver.excluded) == (2, 2)
    assert "3 keys changed in between left out" in report.describe()
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    report = _compare(settings)
    assert report.ok and report.excluded_keys == 0, report.describe()

    # Silver tampered with, one kind of difference per key.
    table = DeltaTable(ctx.silver_uri)
    five = table.to_pyarrow_table(columns=["f8"], filters=pc.field("id") == 5)["f8"][0].as_py()
    assert five == 0.0 and math.copysign(1.0, five) == -1.0  # the source's -0 kept
    table.delete("id = 1001")
    table.update(predicate="id = 4", updates={"tx": "''"})  # NULL in the source
    table.update(predicate="id = 5", updates={"f8": "CAST(0.0 AS DOUBLE)"})
    table.update(predicate="id = 2", updates={"n": "CAST('-99999999.98' AS DECIMAL(10,2))"})
    table.update(predicate="id = 1002",  # the source's -0.000000001 with a trailing zero
                 updates={"nv": "'-0.0000000010'"})
    extra = table.to_pyarrow_table(filters=pc.field("id") == 1)
    extra = extra.set_column(extra.column_names.index("id"), "id",
                             pa.array([999], extra.schema.field("id").type))
    write_deltalake(ctx.silver_uri, extra, mode="append")
    report = _compare(settings)
    assert report.compared and not report.ok, report.describe()
    assert report.missing == ["(1001,)"] and report.extra == ["(999,)"]
    assert report.different == ["(1002,)", "(2,)", "(4,)", "(5,)"]
    text = report.describe()
    assert "missing in silver: (1001,)" in text and "not in the source: (999,)" in text
    assert "values differ: (1002,), (2,), (4,), (5,)" in text
    assert "key checksums differ" in text and "row checksums differ" in text
