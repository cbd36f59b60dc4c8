"""Every bronze and silver type is storable in Delta (delta-rs) and reads back unchanged."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from pgcdc_dagster.cdc.typeconv import TypeModes, converter_for
from pgcdc_dagster.postgres.catalog import load_types, table_columns
from tests.integration.test_types_support import copy_texts

pytestmark = pytest.mark.integration

COLUMNS = {
    "b": ("boolean", "true"), "i2": ("smallint", "-7"), "i8": ("bigint", "9"),
    "f4": ("real", "1.5"), "n": ("numeric(10,2)", "12.34"), "nv": ("numeric", "1.50"),
    "m": ("money", "1.5"), "d": ("date", "'2018-06-20'"), "t": ("time", "'15:13:16.945104'"),
    "tz": ("timetz", "'15:13:16+02'"), "ts": ("timestamp", "'2018-06-20 15:13:16.945104'"),
    "tstz": ("timestamptz", "'2018-06-20 15:13:16.945104+00'"),
    "iv": ("interval", "'1 day'"), "by": ("bytea", "'\\x00ff'"), "bt": ("bit(10)", "B'0000000101'"),
    "j": ("jsonb", "'{\"a\": 1}'"), "u": ("uuid", "gen_random_uuid()"),
    "p": ("point", "point(1, 2)"), "h": ("hstore", "'a=>1'"), "ai": ("int[]", "'{1,NULL}'"),
    "an": ("numeric[]", "'{1.5}'"), "ag": ("int[][]", "'{{1,2},{3,4}}'"),
    "e": ("mood", "'ok'"), "r": ("int4range", "'[1,3)'"),
}


@pytest.mark.parametrize("modes", [TypeModes(), TypeModes(
    time_precision="connect", decimal="string", interval="string", binary="base64",
    hstore="map")])
def test_bronze_and_silver_round_trip_through_delta(pg_conn, tmp_path, modes):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS hstore")
        cur.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
        cols = ", ".join(f"{name} {ddl}" for name, (ddl, _) in COLUMNS.items())
        cur.execute(f"CREATE TABLE w (id int PRIMARY KEY, {cols})")
        names = ", ".join(COLUMNS)
        values = ", ".join(lit for _, lit in COLUMNS.values())
        cur.execute(f"INSERT INTO w (id, {names}) VALUES (1, {values})")
        cur.execute("INSERT INTO w (id) VALUES (2)")
    meta = {n: (o, m) for n, o, m, _ in table_columns(pg_conn, "public", "w")}
    types = load_types(pg_conn, [o for o, _ in meta.values()])
    bronze, silver = [], []
    for name in COLUMNS:
        oid, typmod = meta[name]
        dims = 2 if name == "ag" else 1
        conv = converter_for(name, types[oid], typmod, modes, dimensions=dims)
        text = pa.array(copy_texts(pg_conn, f"SELECT {name} FROM w ORDER BY id"), pa.string())
        bronze.append((conv.bronze_field, conv.to_bronze(text)))
        silver.append((conv.silver_field, conv.to_silver(text)))
    for label, pairs in (("bronze", bronze), ("silver", silver)):
        table = pa.Table.from_arrays([a for _, a in pairs], schema=pa.schema([f for f, _ in pairs]))
        path = str(tmp_path / label)
        write_deltalake(path, table)
        back = DeltaTable(path).to_pyarrow_table()
        for field, array in pairs:
            assert back.column(field.name).to_pylist() == array.to_pylist(), (label, field.name)
