"""NUMERIC NaN / Infinity / -Infinity end to end under each ``decimal.handling.mode`` (TYPE-08,
CFG-40).

TYPE-08: only ``string`` and ``double`` can carry NaN, as the string constant ``NAN`` or
``Double.NaN``; the infinities follow Debezium's ``SpecialValueDecimal``
(``POSITIVE_INFINITY`` / ``NEGATIVE_INFINITY``, ±Infinity as doubles). Silver, compared with
PostgreSQL's own values: an unconstrained ``numeric`` (a string in silver) holds PostgreSQL's
text ``NaN`` / ``Infinity`` / ``-Infinity``; a ``numeric(p,s)`` (DECIMAL in silver, which has
no NaN; PostgreSQL refuses infinities there) holds NULL for NaN. Under ``precise`` the run
fails with an error naming the table, the column and the mode to use, and nothing of that
table is committed, by snapshot and by stream.
"""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from pgcdc_dagster.capture.runner import run_bronze
from pgcdc_dagster.cdc.typeconv import TypeModes
from pgcdc_dagster.lake.paths import table_uri
from tests.support.capture_both import STREAM_OFFSET, capture_both, settings_for
from tests.support.pg_expect import delta_rows, spark_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SETUP = """
CREATE TABLE ns (id int PRIMARY KEY, nv numeric, n2 numeric(10,2));
INSERT INTO ns VALUES (1, 'NaN', 'NaN'), (2, 'Infinity', 1.5), (3, '-Infinity', NULL),
                      (4, -1.25, -99999999.99), (5, NULL, 0);
"""
IDS = [1, 2, 3, 4, 5]
SPECIAL_STRING = {"NaN": "NAN", "Infinity": "POSITIVE_INFINITY",
                  "-Infinity": "NEGATIVE_INFINITY"}
"""TYPE-08 (``NAN``) and Debezium's SpecialValueDecimal names for the infinities."""


def _pg(conn, expr: str) -> list:
    with conn.cursor() as cur:
        cur.execute(f"SELECT {expr} FROM ns WHERE id < {STREAM_OFFSET} ORDER BY id")
        return [r[0] for r in cur.fetchall()]


def _float_key(v):
    return "NaN" if isinstance(v, float) and math.isnan(v) else v


@pytest.mark.parametrize("mode", ["string", "double"])
def test_nan_and_infinities_by_snapshot_and_stream(pg_dsn, pg_conn, spark, lakehouse, mode):
    """TYPE-08: bronze NAN / POSITIVE_INFINITY / NEGATIVE_INFINITY (string) or NaN / ±inf
    (double); silver equals PostgreSQL (NaN in a DECIMAL column is NULL)."""
    with pg_conn.cursor() as cur:
        cur.execute(SETUP)
    cap = capture_both(pg_dsn, pg_conn, spark, lakehouse, "ns", TypeModes(decimal=mode),
                       slot="ns")
    texts = {c: _pg(pg_conn, f"{c}::text") for c in ("nv", "n2")}
    doubles = {c: _pg(pg_conn, f"{c}::float8") for c in ("nv", "n2")}
    for column in ("nv", "n2"):
        if mode == "string":  # plain PostgreSQL text for these finite values
            want = [None if t is None else SPECIAL_STRING.get(t, t) for t in texts[column]]
        else:
            want = [_float_key(d) for d in doubles[column]]
        for how, images in cap.images:
            got = [_float_key(images[i][column]) for i in IDS]
            assert got == want, (mode, how, column)
    first = cap.snapshot[1]["nv"]
    assert first == "NAN" if mode == "string" else math.isnan(first)  # TYPE-08's constants

    silver_nv = _pg(pg_conn, "CASE WHEN nv IN ('NaN', 'Infinity', '-Infinity') THEN nv::text "
                             "ELSE trim_scale(nv)::text END")
    silver_n2 = _pg(pg_conn, "CASE WHEN n2 = 'NaN' THEN NULL ELSE n2 END")
    for reader, silver in (("delta-rs", delta_rows(cap.ctx.silver_uri, "id")),
                           ("spark", spark_rows(spark, cap.ctx.silver_uri, "id"))):
        for i, k in enumerate(IDS):
            for row in (silver[k], silver[k + STREAM_OFFSET]):
                assert row["n2"] == silver_n2[i], (reader, k)
                assert isinstance(row["n2"], Decimal | None)
                if mode == "string":
                    assert row["nv"] == silver_nv[i], (reader, k)
                else:  # silver holds the double's text: the same double as PostgreSQL's
                    got = None if row["nv"] is None else float(row["nv"])
                    assert _float_key(got) == _float_key(doubles["nv"][i]), (reader, k)
    assert [delta_rows(cap.ctx.silver_uri, "id")[k]["nv"] for k in (1, 2, 3)] == \
        ["NaN", "Infinity", "-Infinity"]


def _bronze_rows(lakehouse) -> int | None:
    try:
        return DeltaTable(table_uri(str(lakehouse), "bronze", "public", "ns")).to_pyarrow_table(
        ).num_rows
    except TableNotFoundError:
        return None


def _assert_clear(exc: BaseException, *, table: bool = True) -> None:
    text = str(exc)
    assert "'nv'" in text or ".nv" in text, text  # the column
    if table:
        assert "public.ns" in text, text
    assert "decimal.handling.mode" in text and "'string'" in text and "'double'" in text, text


def test_precise_refuses_nan_by_snapshot(pg_dsn, pg_conn, spark, lakehouse):
    """TYPE-08: precise cannot carry NaN: the snapshot fails naming table, column and the
    modes to use, and no bronze row of the table is committed."""
    with pg_conn.cursor() as cur:
        cur.execute(SETUP)
    settings = settings_for(pg_dsn, lakehouse, "ns", TypeModes(), slot="ns")
    with pytest.raises(Exception) as info:
        run_bronze(settings, spark, force_snapshot_step=True)
    _assert_clear(info.value)
    assert not _bronze_rows(lakehouse)  # no table, or an empty one


def test_precise_refuses_infinity_by_stream(pg_dsn, pg_conn, spark, lakehouse):
    """TYPE-08: a streamed -Infinity under precise fails the window naming the table and
    column; the window's events (the valid row in the same transaction too) are not
    committed, and the next run meets the same change again (nothing skipped)."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE ns (id int PRIMARY KEY, nv numeric, n2 numeric(10,2))")
        cur.execute("INSERT INTO ns VALUES (1, 1.5, 1.5)")
    settings = settings_for(pg_dsn, lakehouse, "ns", TypeModes(), slot="ns")
    run_bronze(settings, spark, force_snapshot_step=True)
    assert _bronze_rows(lakehouse) == 1
    with pg_conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO ns VALUES (2, 2.5, 2.5)")
        cur.execute("INSERT INTO ns VALUES (3, '-Infinity', NULL)")
        cur.execute("COMMIT")
    for _ in range(2):
        with pytest.raises(Exception) as info:
            run_bronze(settings, spark, force_snapshot_step=False)
        _assert_clear(info.value)  # the bronze writer adds the table to the converter's error
        assert _bronze_rows(lakehouse) == 1
