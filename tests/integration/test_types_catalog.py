"""catalog.load_types / table_columns against a real PostgreSQL (arrays, domains, enums, ranges)."""

from __future__ import annotations

import pytest

from pgcdc_dagster.cdc.typeconv import TypeModes, converter_for
from pgcdc_dagster.exceptions import TableNotFoundError
from pgcdc_dagster.postgres.catalog import load_types, table_column_dimensions, table_columns

pytestmark = pytest.mark.integration


def test_load_types_resolves_arrays_domains_enums_ranges(pg_conn):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
        cur.execute("CREATE DOMAIN price AS numeric(10, 2)")
        cur.execute("CREATE DOMAIN price2 AS price")
        cur.execute("CREATE TABLE t (id int PRIMARY KEY, m mood, ms mood[], p price, "
                    "p2 price2, r int4range, grid int[][] NOT NULL)")
    cols = table_columns(pg_conn, "public", "t")
    assert [c[0] for c in cols] == ["id", "m", "ms", "p", "p2", "r", "grid"]
    assert cols[0][3] is True and cols[6][3] is True and cols[1][3] is False
    types = load_types(pg_conn, [c[1] for c in cols])
    by_name = {name: types[oid] for name, oid, _, _ in cols}
    assert by_name["id"].name == "int4" and by_name["id"].schema == "pg_catalog"
    assert by_name["m"].enum_labels == ("sad", "ok", "happy")
    assert by_name["ms"].is_array and by_name["ms"].element == by_name["m"]
    assert by_name["p"].typtype == "d" and by_name["p"].base is not None
    assert by_name["p"].base.name == "numeric" and by_name["p"].base_typmod == (10 << 16 | 2) + 4
    assert by_name["p2"].base == by_name["p"]
    assert by_name["r"].subtype is not None and by_name["r"].subtype.name == "int4"
    assert table_column_dimensions(pg_conn, "public", "t")["grid"] == 2
    # TYPE-11: a domain over a built-in type inherits its scale; a domain over a domain not.
    modes = TypeModes()
    p = converter_for("p", by_name["p"], -1, modes)
    assert p.connect_schema()["parameters"] == {"scale": "2", "connect.decimal.precision": "10"}
    p2 = converter_for("p2", by_name["p2"], -1, modes)
    assert p2.connect_schema()["name"] == "io.debezium.data.VariableScaleDecimal"


def test_cache_and_missing_table(pg_conn):
    cache: dict = {}
    first = load_types(pg_conn, [23, 1007], cache=cache)
    assert first[1007].element == first[23]
    assert load_types(pg_conn, [23], cache=cache)[23] is first[23]
    with pytest.raises(TableNotFoundError):
        table_columns(pg_conn, "public", "nope")
