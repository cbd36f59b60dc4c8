"""Filters and overrides against a real PostgreSQL.

* the allow-lists hold only what the server's catalog says is safe;
* accepted filters select exactly the rows the filter means (compared with PostgreSQL
  running the original text), also with ``standard_conforming_strings = off``;
* functions and operators created in a user schema (which terminate a sentinel backend,
  drop a sentinel slot and write a table) are reachable from the raw text but never from
  what the capture runs; overrides naming them are refused;
* ``statement_timeout`` bounds the filter check, the chunk queries and the override check.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg2
import pytest

from pgcdc_dagster.capture.incremental import apply_signal, run_incremental
from pgcdc_dagster.capture.incremental_state import ProgressStore
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.dblog import parse_signal
from pgcdc_dagster.exceptions import ConfigurationError, PgCdcError
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.postgres.chunks import ChunkSpec, ordering, read_chunk
from pgcdc_dagster.postgres.signals import RejectedCondition, validate_condition
from pgcdc_dagster.postgres.snapshot_override import validate_override
from pgcdc_dagster.postgres.sql_filter import FUNCTIONS, OPERATORS, TYPES

pytestmark = [pytest.mark.integration]

SCHEMA = r"""
CREATE TABLE orders (id int PRIMARY KEY, region text, total numeric(10,2), code int,
                     at timestamptz, "MixedCase" int, name varchar(20));
INSERT INTO orders SELECT g, CASE WHEN g % 3 = 0 THEN 'eu' WHEN g % 3 = 1 THEN 'US' END,
    g * 1.25, CASE WHEN g % 7 <> 0 THEN g % 20 END,
    timestamptz '2024-01-01 00:00+00' + g * interval '5 hours', g % 4, 'item ' || g
    FROM generate_series(1, 200) g;
UPDATE orders SET name = 'a\b' WHERE id = 5;
UPDATE orders SET name = 'it''s' WHERE id = 6;
"""

TRAP = """
CREATE SCHEMA evil;
CREATE TABLE evil.calls (what text);
CREATE TABLE evil.target (pid int, slot text);
CREATE FUNCTION evil.trap(a int, b numeric) RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_terminate_backend(pid) FROM evil.target;
  PERFORM pg_drop_replication_slot(slot) FROM evil.target;
  INSERT INTO evil.calls VALUES ('operator');
  RETURN true;
END $$;
"""
"""``evil.trap(int, numeric)``: terminates the armed backend, drops the armed slot and writes a
table (the write fails in a READ ONLY transaction, the rest does not)."""

TRAPS = TRAP + """
CREATE FUNCTION evil.text_trap(v varchar) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  PERFORM evil.trap(0, 0);
  RETURN 'x';
END $$;
CREATE OPERATOR public.= (LEFTARG = int4, RIGHTARG = numeric, FUNCTION = evil.trap);
CREATE OPERATOR public.<> (LEFTARG = int4, RIGHTARG = numeric, FUNCTION = evil.trap);
CREATE OPERATOR public.=== (LEFTARG = int4, RIGHTARG = numeric, FUNCTION = evil.trap);
CREATE FUNCTION public.lower(v varchar) RETURNS text LANGUAGE sql
    AS 'SELECT evil.text_trap(v)';
"""
"""Exact-type matches for ``int = numeric`` and ``lower(varchar)``: with the raw text
PostgreSQL picks them over the built-ins (which need an implicit cast)."""


@pytest.fixture
def settings(pg_dsn, pg_conn, lakehouse) -> CaptureSettings:
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
        cur.execute("CREATE PUBLICATION flt FOR TABLE orders")
        cur.execute("SELECT pg_create_logical_replication_slot('flt', 'pgoutput')")
    return CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=(r"public\.orders",),
                           slot="flt", publication="flt")


class Sentinels:
    """A second backend and another consumer's slot that nothing may touch."""

    def __init__(self, dsn: str, conn: psycopg2.extensions.connection,
                 tables: tuple[str, ...] = ("orders",)) -> None:
        self.conn = conn
        self.content_sql = " UNION ALL ".join(
            f"SELECT {n}, count(*), sum(hashtext(t::text)) FROM {t} t"
            for n, t in enumerate(tables))
        self.backend = psycopg2.connect(dsn)
        self.backend.autocommit = True
        with self.backend.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            self.pid = int(cur.fetchone()[0])
        self.slot = f"sentinel_{uuid.uuid4().hex[:8]}"
        with conn.cursor() as cur:
            cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                        (self.slot,))
            cur.execute(self.content_sql)
            self.content = sorted(cur.fetchall())

    def arm(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("INSERT INTO evil.target VALUES (%s, %s)", (self.pid, self.slot))

    def assert_untouched(self) -> None:
        with self.backend.cursor() as cur:  # the sentinel backend still answers
            cur.execute("SELECT 1")
        with self.conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (self.pid,))
            assert cur.fetchone()[0] == 1
            cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                        (self.slot,))
            assert cur.fetchone()[0] == 1, "the sentinel slot was dropped"
            cur.execute("SELECT count(*) FROM evil.calls")
            assert cur.fetchone()[0] == 0, "a trap ran"
            cur.execute(self.content_sql)
            assert sorted(cur.fetchall()) == self.content, "a table was written"


@pytest.fixture
def traps(settings, pg_dsn, pg_conn) -> Iterator[Sentinels]:
    with pg_conn.cursor() as cur:
        cur.execute(TRAPS)
    sentinels = Sentinels(pg_dsn, pg_conn)
    yield sentinels
    sentinels.backend.close()


def _raw_ids(conn, text: str) -> set[int]:
    with conn.cursor() as cur:
        cur.execute(f"SELECT id FROM orders WHERE {text}")  # the ground truth (benign text)
        return {int(r[0]) for r in cur.fetchall()}


def _chunk_ids(conn, dsn: str, condition: str, timeout_ms: int = 60_000) -> set[int]:
    order, nullable = ordering(conn, "public", "orders", ["id"])
    spec = ChunkSpec("public", "orders", ("id", "name"), order, condition, nullable,
                     timeout_ms)
    rows, _last = read_chunk(dsn, spec, None, None, 1000)
    return {int(r[0]) for r in rows}


def test_allow_lists_match_the_catalog(pg_conn) -> None:
    """Every overload of an allow-listed name in pg_catalog is an ordinary, non-volatile,
    non-set-returning function; every allow-listed operator calls such a function."""
    with pg_conn.cursor() as cur:
        cur.execute("""SELECT proname, provolatile, proretset, prokind FROM pg_proc
                       WHERE pronamespace = 'pg_catalog'::regnamespace
                         AND proname = ANY(%s)""", (sorted(FUNCTIONS),))
        rows = cur.fetchall()
        assert {r[0] for r in rows} == FUNCTIONS  # all exist on the server
        bad = [r for r in rows if r[1] == "v" or r[2] or r[3] != "f"]
        assert not bad, bad
        cur.execute("""SELECT o.oprname, p.proname, p.provolatile FROM pg_operator o
                       JOIN pg_proc p ON p.oid = o.oprcode
                       WHERE o.oprnamespace = 'pg_catalog'::regnamespace
                         AND o.oprname = ANY(%s)""", (sorted(OPERATORS),))
        rows = cur.fetchall()
        assert {r[0] for r in rows} == OPERATORS
        assert not [r for r in rows if r[2] == "v"]
        cur.execute("SELECT typname FROM pg_type WHERE typnamespace = "
                    "'pg_catalog'::regnamespace AND typname = ANY(%s)", (sorted(TYPES),))
        assert {r[0] for r in cur.fetchall()} == TYPES


LEGIT = [
    "region IN ('eu', 'US') AND code NOT IN (1, 2, 3)",
    "total BETWEEN 10 AND 50.5", "id NOT BETWEEN SYMMETRIC 150 AND 20",
    "region LIKE 'e%'", "region ILIKE 'us'", "name NOT LIKE 'item 1%'",
    "name LIKE 'a!%' ESCAPE '!' OR name = 'a\\b' OR name = 'it''s'",
    "at::timestamptz >= timestamptz '2024-01-10 00:00+00' AND at < '2024-01-20'",
    "date_trunc('day', at AT TIME ZONE 'UTC') = '2024-01-05'::timestamp",
    "total::numeric(10,1) > 100.0 AND CAST(code AS text) = '7'",
    "coalesce(code, -1) = -1", "code IS NULL OR NOT (code > 5)", "(code > 5) IS NOT TRUE",
    "code IS DISTINCT FROM 5", "code IS NOT DISTINCT FROM NULL", "nullif(code, 3) IS NULL",
    '"MixedCase" = 2 AND region IS NOT NULL', "lower(region) = 'us' AND length(name) > 7",
    "CASE region WHEN 'eu' THEN total > 100 ELSE false END",
    "extract(dow FROM at AT TIME ZONE 'UTC') = 1 AND greatest(id, code) < 100",
    "id % 10 = 0 AND - id < -150", "region || '-' || code::text = 'eu-3'",
    "to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD') = '2024-01-02'",
]


def test_accepted_filters_select_what_they_mean(settings, pg_dsn, pg_conn) -> None:
    """The canonical text selects the same rows as the original, through the real chunk
    query (READ ONLY, statement_timeout), whatever standard_conforming_strings says."""
    with pg_conn.cursor() as cur:
        cur.execute("SELECT current_database()")
        db = cur.fetchone()[0]
        cur.execute(f'ALTER DATABASE "{db}" SET standard_conforming_strings = off')
        cur.execute("SET standard_conforming_strings = on")  # the ground truth's reading
    for text in LEGIT:
        expected = _raw_ids(pg_conn, text)
        assert expected, text  # every filter selects something ...
        assert len(expected) < 200, text  # ... and not everything
        canonical = validate_condition(pg_conn, "public", "orders", text)
        assert _chunk_ids(pg_conn, pg_dsn, canonical) == expected, (text, canonical)
    assert _chunk_ids(pg_conn, pg_dsn, validate_condition(
        pg_conn, "public", "orders", "name = 'a\\b'")) == {5}


def test_user_schema_functions_and_operators_are_unreachable(settings, pg_conn, pg_dsn,
                                                             traps) -> None:
    """The raw text would run the traps; what the capture runs does not."""
    condition = ("code = 15.0 OR lower(name) = 'item 3' OR code IN (16.0) OR "
                 "nullif(code, 17.0) IS NULL OR CASE code WHEN 18.0 THEN true END "
                 "OR code IS NOT DISTINCT FROM 19.0")
    pg_conn.autocommit = False
    try:  # sanity: unarmed, in a transaction rolled back, the raw text reaches the traps
        with pg_conn.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM orders WHERE {condition}")
            cur.execute("SELECT count(DISTINCT what) FROM evil.calls")
            assert cur.fetchone()[0] == 1
    finally:
        pg_conn.rollback()
        pg_conn.autocommit = True
    with pg_conn.cursor() as cur:  # the database default now puts the user schema first
        cur.execute("SELECT current_database()")
        db = cur.fetchone()[0]
        cur.execute(f'ALTER DATABASE "{db}" SET search_path = public, pg_catalog')
    traps.arm()
    apply_signal(settings, parse_signal("legit", "execute-snapshot", {
        "data-collections": ["public.orders"],
        "additional-conditions": [{"data-collection": "public.orders", "filter": condition}]}),
        chunk_size=16)
    report = run_incremental(settings)
    assert report.tables[0].status == "done"
    from deltalake import DeltaTable

    rows = DeltaTable(table_uri(settings.lakehouse, "bronze", "public", "orders")) \
        .to_pyarrow_table(columns=["after", "op"]).to_pylist()
    got = sorted(r["after"]["id"] for r in rows if r["op"] == "r")
    assert got == sorted(_raw_ids(pg_conn, "code IN (15, 16, 17, 18, 19) OR code IS NULL "
                                           "OR id = 3"))
    traps.assert_untouched()
    for hostile, reason in [
        ("code === 1.5", "operator ==="),
        ("code OPERATOR(public.=) 1.5", "operator OPERATOR(public.=)"),
        ("evil.trap(code, 1)", "function evil.trap"),
        ('U&"\\0065vil".trap(code, 1)', "function evil.trap"),
        ("public.lower(name) = 'x'", "function public.lower"),
        ("name = '\\' OR evil.trap(1, 1) OR name = '\\'", "function evil.trap"),
    ]:
        with pytest.raises(RejectedCondition, match=reason.replace("(", r"\(")
                           .replace(")", r"\)")):
            apply_signal(settings, parse_signal("evil", "execute-snapshot", {
                "data-collections": ["public.orders"], "additional-conditions": [
                    {"data-collection": "public.orders", "filter": hostile}]}))
    assert [p.signal_id for p in ProgressStore(settings.lakehouse, settings.slot).all()] == \
        ["legit"]
    # An override reaching the same objects is refused before anything runs.
    columns = [("id", 23), ("region", 25), ("total", 1700), ("code", 23), ("at", 1184),
               ("MixedCase", 23), ("name", 1043)]
    for select, reason in [
        ("SELECT * FROM orders WHERE code = 15.0", "operator public.= share a name"),
        ("SELECT * FROM orders WHERE lower(name) = 'x'",
         "function public.lower, operator public.= share"),
        ("SELECT *, pg_terminate_backend(1) FROM orders", "function pg_terminate_backend"),
        ("SELECT * FROM orders WHERE evil.trap(code, 1)", "function evil.trap"),
        ('SELECT * FROM orders WHERE U&"pg_drop_replication_slot"(\'x\') IS NULL',
         "function pg_drop_replication_slot"),
    ]:
        with pytest.raises(ConfigurationError, match=reason):
            validate_override(pg_conn, "public", "orders", select, columns)
    assert validate_override(pg_conn, "public", "orders",
                             "SELECT * FROM orders WHERE pg_catalog.lower(name) "
                             "OPERATOR(pg_catalog.~~) 'item%'", columns)
    traps.assert_untouched()


def test_statement_timeout_bounds_every_statement_with_user_sql(settings, pg_dsn,
                                                                pg_conn) -> None:
    """A table locked by someone else: the filter check, the chunk queries (max key, chunk
    read) and the override check give up after the timeout, naming the setting."""
    fast = CaptureSettings(**{**{f: getattr(settings, f) for f in settings.__slots__},
                              "incremental_statement_timeout_ms": 300})
    good = parse_signal("t", "execute-snapshot", {
        "data-collections": ["public.orders"],
        "additional-conditions": [{"data-collection": "public.orders", "filter": "id > 10"}]})
    holder = psycopg2.connect(pg_dsn)
    # Without the timeout a statement would wait for the lock: release it after a while so
    # that such a regression fails the assertions instead of hanging the suite.
    stop = threading.Event()

    def release() -> None:
        while not stop.wait(60):
            holder.rollback()

    guard = threading.Thread(target=release, daemon=True)
    guard.start()
    try:
        with holder.cursor() as cur:
            cur.execute("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(RejectedCondition, match="statement timeout"):
            apply_signal(fast, good)
        holder.rollback()
        apply_signal(fast, good)
        with holder.cursor() as cur:
            cur.execute("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(PgCdcError, match="PGCDC_INCREMENTAL_STATEMENT_TIMEOUT_MS"):
            run_incremental(fast)
        with pytest.raises(PgCdcError, match="statement timeout"):
            _chunk_ids(pg_conn, pg_dsn, '("id" OPERATOR(pg_catalog.>) 10)', timeout_ms=300)
        with pytest.raises(PgCdcError, match="statement timeout"):
            validate_override(pg_conn, "public", "orders", "SELECT * FROM orders",
                              [("id", 23)], timeout_ms=300)
    finally:
        stop.set()
        guard.join()
        holder.rollback()
        holder.close()
    report = run_incremental(fast)  # lock gone: the same snapshot finishes
    assert report.tables[0].status == "done" and report.tables[0].rows_read == 190
