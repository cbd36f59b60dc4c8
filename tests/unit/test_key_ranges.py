"""File pruning by key ranges for every key type with statistics: the Delta
statistics written for dates, timestamps (microseconds, rounded outwards to milliseconds),
decimals (exact) and strings (cut, with the maximum kept above the cut values) are bounds that
delta-rs parses back, and a file is pruned only when no batch key can be in it."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.transaction import AddAction

from pgcdc_dagster.lake.data_files import key_candidates, stored_files, write_data_file
from pgcdc_dagster.lake.delta import ensure_table
from pgcdc_dagster.lake.file_stats import STRING_PREFIX
from pgcdc_dagster.lake.key_ranges import candidates

STEP = dt.timedelta(milliseconds=1, microseconds=1)
T0 = dt.datetime(2026, 1, 1, 12, 0, 0, 123_456, tzinfo=dt.UTC)


def _table(tmp_path, parts: list[pa.Table]) -> tuple[str, DeltaTable]:
    uri = str(tmp_path / "t")
    table = ensure_table(uri, parts[0].schema)
    files = [write_data_file(uri, p, "part") for p in parts]
    table.create_write_transaction(
        [AddAction(f.path, f.size, {}, 0, True, f.stats) for f in files], "append",
        parts[0].schema)
    return uri, DeltaTable(uri)


def _picked(table: DeltaTable, keys: list[str], batch: dict[str, list]) -> list[int]:
    """Indices (in file order by first key) of the files kept for ``batch``."""
    schema = pa.schema(table.schema().to_arrow())
    files = sorted(stored_files(table, keys), key=lambda f: f.low)
    kept = {f.path for f in key_candidates(files, pa.table(batch, schema=pa.schema(
        [schema.field(k) for k in keys])), keys, schema)}
    return [i for i, f in enumerate(files) if f.path in kept]


def test_timestamp_date_and_decimal_keys_prune_on_exact_bounds(tmp_path) -> None:
    ts = pa.timestamp("us", tz="UTC")
    dec = pa.decimal128(38, 10)

    def amount(d: int) -> Decimal:  # 30 digits: beyond a float's and Decimal's default 28
        return Decimal(f"{12345678901234567890 + d}.1234567891")

    parts = [pa.table({"at": pa.array([T0 + i * STEP for i in r], ts),
                       "day": pa.array([dt.date(2026, 1, 1) + dt.timedelta(days=d)
                                        for d in r]),
                       "amount": pa.array([amount(d) for d in r], dec)})
             for r in (range(0, 3), range(1000, 1003), range(5000, 5003))]
    uri, table = _table(tmp_path, parts)
    text = write_data_file(uri, parts[0], "x").stats
    stats = json.loads(text)
    # Microseconds rounded outwards to Delta's milliseconds; decimals exact.
    assert stats["minValues"]["at"] == "2026-01-01T12:00:00.123Z"
    assert stats["maxValues"]["at"] == "2026-01-01T12:00:00.126Z"  # true max .125458
    assert '"amount": 12345678901234567892.1234567891' in text
    # Each file's true last value is in it; values between files are in none.
    last = T0 + 1002 * STEP
    assert _picked(table, ["at"], {"at": [last]}) == [1]
    assert _picked(table, ["at"], {"at": [T0 + 3000 * STEP]}) == []
    assert _picked(table, ["at"], {"at": [T0 + 2 * STEP, T0 + 5001 * STEP]}) == [0, 2]
    assert _picked(table, ["day"], {"day": [dt.date(2026, 1, 1) + dt.timedelta(days=1002)]}
                   ) == [1]
    assert _picked(table, ["day"], {"day": [dt.date(2026, 1, 1) + dt.timedelta(days=1003)]}
                   ) == []
    assert _picked(table, ["amount"], {"amount": [amount(5002)]}) == [2]
    assert _picked(table, ["amount"], {"amount": [amount(2) + Decimal("0.0000000001")]}) == []
    # delta-rs reads the same bounds back: its own data skipping keeps the boundary rows.
    assert table.to_pyarrow_table(filters=[("at", "=", last)]).num_rows == 1
    assert table.to_pyarrow_table(filters=[("amount", "=", amount(5002))]).num_rows == 1


def test_cut_string_bounds_never_prune_a_key_they_may_hold(tmp_path) -> None:
    shared = "k" * (STRING_PREFIX + 8)
    parts = [pa.table({"code": [f"a{i:03d}" for i in range(10)]}),
             pa.table({"code": [f"{shared}{i:03d}" for i in range(10)]}),
             pa.table({"code": ["m" * 5000, "n"]})]  # Parquet drops this file's statistics
    uri, table = _table(tmp_path, parts)
    stats = {json.loads(a)["maxValues"]["code"][:1] for a in
             [write_data_file(uri, p, "x").stats for p in parts]}
    assert stats == {"a", "k", "n"}  # every file has bounds (the long one's from the data)
    assert _picked(table, ["code"], {"code": [f"{shared}999"]}) == [1]  # beyond the cut
    assert _picked(table, ["code"], {"code": ["m" * 6000]}) == [2]
    assert _picked(table, ["code"], {"code": ["b"]}) == []
    # delta-rs's data skipping reads the cut maximum as a bound too.
    assert table.to_pyarrow_table(filters=[("code", "=", f"{shared}009")]).num_rows == 1
    assert table.to_pyarrow_table(filters=[("code", "=", "m" * 5000)]).num_rows == 1
    # A cut maximum without a mark (another writer): the prefix still bounds its keys.
    cut = shared[:STRING_PREFIX]
    assert candidates([[(cut, cut)]], [pa.array([shared + "zzz"])], [pa.string()]) == [True]
    assert candidates([[(cut, cut)]], [pa.array(["kl"])], [pa.string()]) == [False]


def test_composite_keys_prune_on_every_column_and_null_keys_keep_every_file() -> None:
    ranges = [[(1, 1), ("a", "f")], [(1, 2), ("a", "z")], [(2, 2), ("g", "p")],
              [(None, None), ("a", "b")]]
    types = [pa.int64(), pa.string()]

    def kept(tenants: list[int | None], skus: list[str]) -> list[bool]:
        return candidates(ranges, [pa.array(tenants, pa.int64()), pa.array(skus)], types)

    assert kept([2], ["h"]) == [False, True, True, True]  # the last has no tenant range
    assert kept([1], ["x"]) == [False, True, False, True]
    assert kept([3], ["a"]) == [False, False, False, True]
    assert kept([None], ["a"]) == [True, True, True, True]  # NULL key: nothing pruned
