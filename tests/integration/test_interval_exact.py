"""INTERVAL exact to the microsecond under both ``interval.handling.mode`` values, by snapshot
and by stream: edge values one microsecond either side of each unit (second, minute, hour,
day, month, year), months and days with microseconds, and the int64 limits.

The expected values come from PostgreSQL's own fields (``extract`` is exact ``numeric``) and
integer arithmetic on the test side: ``numeric`` is Debezium's formula with a 30.4375-day
month, which is a whole number of microseconds, so nothing may round; ``string`` is the ISO
form of the exact fields. Silver is read back with delta-rs.
"""

from __future__ import annotations

import pytest

from pgcdc_dagster.cdc.typeconv import TypeModes
from tests.support.capture_both import STREAM_OFFSET, capture_both
from tests.support.pg_expect import delta_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]

EDGES = [
    "00:00:01.000001", "-00:00:01.000001", "00:00:00.999999", "-00:00:00.999999",
    "00:00:00.000001", "-00:00:00.000001", "00:00:02.000003",
    "00:00:59.999999", "00:01:00.000001", "-00:01:00.000001",
    "00:59:59.999999", "01:00:00.000001", "-01:00:00.000001",
    "23:59:59.999999", "1 day 00:00:00.000001", "1 day -00:00:00.000001",
    "-1 days +00:00:00.000001", "1 mon 00:00:00.000001", "1 mon -00:00:00.000001",
    "-1 mons -00:00:00.000001", "1 year 00:00:00.000001", "1 year -00:00:00.000001",
    "1 year 2 mons 3 days 04:05:06.000007", "-7 mons -11 days -23:59:59.999999",
    "11 mons 29 days 23:59:59.999999", "2562047788:00:54.775807", "-2562047788:00:54.775807",
    "1 day 2562047788:00:54.775807",
]
"""The last one exceeds int64 microseconds in ``numeric`` (it saturates, as Java's cast)."""
MICROS_PER_MONTH = 2_629_800_000_000  # 365.25 / 12 days
MICROS_PER_DAY = 86_400_000_000
INT64 = (-(2**63), 2**63 - 1)


def _fields(conn) -> list[tuple[int, int, int, int, int, int, int]]:
    """(years, months, days, hours, minutes, whole seconds, microseconds) of each row."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT extract(year from iv)::bigint, extract(month from iv)::bigint, "
            "extract(day from iv)::bigint, extract(hour from iv)::bigint, "
            "extract(minute from iv)::bigint, (extract(microseconds from iv))::bigint "
            f"FROM ivs WHERE id < {STREAM_OFFSET} ORDER BY id")
        return [(y, mo, d, h, mi, *_split(us)) for y, mo, d, h, mi, us in cur.fetchall()]


def _split(micros: int) -> tuple[int, int]:
    """Whole seconds and microseconds, both with the sign of ``micros`` (PGInterval's)."""
    whole = abs(micros) // 1_000_000 * (-1 if micros < 0 else 1)
    return whole, micros - whole * 1_000_000


def _iso(y: int, mo: int, d: int, h: int, mi: int, s: int, us: int) -> str:
    total = s * 1_000_000 + us
    whole, frac = divmod(abs(total), 1_000_000)
    secs = ("-" if total < 0 else "") + str(whole) + (f".{frac:06d}".rstrip("0") if frac else "")
    return f"P{y}Y{mo}M{d}DT{h}H{mi}M{secs}S"


@pytest.mark.parametrize("mode", ["numeric", "string"])
def test_interval_edges_exact_by_snapshot_and_stream(pg_dsn, pg_conn, spark, lakehouse, mode):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE ivs (id int PRIMARY KEY, iv interval)")
        for i, text in enumerate(EDGES, start=1):
            cur.execute("INSERT INTO ivs VALUES (%s, %s::interval)", (i, text))
    cap = capture_both(pg_dsn, pg_conn, spark, lakehouse, "ivs", TypeModes(interval=mode),
                       slot=f"iv_{mode}")
    ids = list(range(1, len(EDGES) + 1))
    fields = _fields(pg_conn)
    exact = [{"months": y * 12 + mo, "days": d,
              "microseconds": ((h * 60 + mi) * 60 + s) * 1_000_000 + us}
             for y, mo, d, h, mi, s, us in fields]
    if mode == "numeric":
        bronze = [max(INT64[0], min(INT64[1], e["months"] * MICROS_PER_MONTH
                                    + e["days"] * MICROS_PER_DAY + e["microseconds"]))
                  for e in exact]
        silver = [{"months": 0, "days": 0, "microseconds": b} for b in bronze]
        assert bronze[0] == 1_000_001 and bronze[1] == -1_000_001
        assert bronze[-1] == INT64[1]
    else:
        bronze = [_iso(*f) for f in fields]
        silver = exact
        assert bronze[0] == "P0Y0M0DT0H0M1.000001S"
        assert bronze[1] == "P0Y0M0DT0H0M-1.000001S"
    for how, images in cap.images:
        assert [images[k]["iv"] for k in ids] == bronze, (mode, how)
    rows = delta_rows(cap.ctx.silver_uri, "id")
    assert [rows[k]["iv"] for k in ids] == silver, (mode, "silver snapshot")
    assert [rows[k + STREAM_OFFSET]["iv"] for k in ids] == silver, (mode, "silver stream")
