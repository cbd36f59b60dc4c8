"""Record pgoutput byte fixtures from a real PostgreSQL server (run once, commit the JSON).

    .venv/bin/python tests/data/pgoutput/record_fixtures.py [--dsn DSN]

Without ``--dsn`` a throwaway LocalCluster is started. Each scenario runs in a fresh
database with its own slot and publication, then peeks the slot with the scenario's pgoutput
options and writes ``<scenario>.json``: the options, the SQL that produced the WAL, the
server version and every row as ``{"lsn", "xid", "hex"}``. The unit tests decode these
bytes; nothing in them is hand-made.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg2

from pgcdc_dagster.postgres.local_cluster import LocalCluster

HERE = Path(__file__).parent

BASE = {"proto_version": "1", "publication_names": "pub", "messages": "true"}

SCENARIOS: dict[str, dict[str, object]] = {
    "basic": {
        "options": BASE,
        "setup": [
            "CREATE TABLE t_default (id int PRIMARY KEY, name text, amount numeric(12,2), "
            "flag boolean, ts timestamptz)",
            "CREATE PUBLICATION pub FOR ALL TABLES",
        ],
        "sql": [
            "INSERT INTO t_default VALUES (1, 'one', 1.50, true, '2024-01-02 03:04:05.123456+00')",
            "INSERT INTO t_default VALUES (2, NULL, NULL, NULL, NULL)",
            "UPDATE t_default SET name = 'uno' WHERE id = 1",
            "UPDATE t_default SET id = 3 WHERE id = 2",
            "DELETE FROM t_default WHERE id = 3",
            "BEGIN; INSERT INTO t_default VALUES (10, 'a'); INSERT INTO t_default VALUES (11, 'b');"
            " COMMIT",
        ],
    },
    "identity_full": {
        "options": BASE,
        "setup": [
            "CREATE TABLE t_full (id int PRIMARY KEY, name text, note text)",
            "ALTER TABLE t_full REPLICA IDENTITY FULL",
            "CREATE PUBLICATION pub FOR ALL TABLES",
        ],
        "sql": [
            "INSERT INTO t_full VALUES (1, 'one', NULL)",
            "UPDATE t_full SET name = 'uno' WHERE id = 1",
            "DELETE FROM t_full WHERE id = 1",
        ],
    },
    "identity_index": {
        "options": BASE,
        "setup": [
            "CREATE TABLE t_index (id int PRIMARY KEY, code text NOT NULL, name text)",
            "CREATE UNIQUE INDEX t_index_code ON t_index (code)",
            "ALTER TABLE t_index REPLICA IDENTITY USING INDEX t_index_code",
            "CREATE PUBLICATION pub FOR ALL TABLES",
        ],
        "sql": [
            "INSERT INTO t_index VALUES (1, 'a', 'one')",
            "UPDATE t_index SET name = 'uno' WHERE id = 1",
            "UPDATE t_index SET code = 'b' WHERE id = 1",
            "DELETE FROM t_index WHERE id = 1",
        ],
    },
    "identity_nothing": {
        "options": BASE,
        "setup": [
            "CREATE TABLE t_nothing (id int, name text)",
            "ALTER TABLE t_nothing REPLICA IDENTITY NOTHING",
            "CREATE PUBLICATION pub FOR ALL TABLES WITH (publish = 'insert, truncate')",
        ],
        "sql": ["INSERT INTO t_nothing VALUES (1, 'one')"],
    },
    "toast": {
        "options": BASE,
        "setup": [
            "CREATE TABLE t_toast (id int PRIMARY KEY, other int, big text)",
            "ALTER TABLE t_toast ALTER COLUMN big SET STORAGE EXTERNAL",
            "CREATE PUBLICATION pub FOR ALL TABLES",
        ],
        "sql": [
            "INSERT INTO t_toast VALUES (1, 0, repeat('x', 9000))",
            "UPDATE t_toast SET other = 1 WHERE id = 1",
            "UPDATE t_toast SET big = repeat('y', 9000) WHERE id = 1",
        ],
    },
    "truncate": {
        "options": BASE,
        "setup": [
            "CREATE TABLE t_a (id serial PRIMARY KEY)",
            "CREATE TABLE t_b (id int PRIMARY KEY, a_id int REFERENCES t_a)",
            "CREATE PUBLICATION pub FOR ALL TABLES",
        ],
        "sql": [
            "TRUNCATE t_b",
            "TRUNCATE t_a, t_b",
            "TRUNCATE t_a CASCADE",
            "TRUNCATE t_b RESTART IDENTITY",
            "TRUNCATE t_a RESTART IDENTITY CASCADE",
        ],
    },
    "messages": {
        "options": BASE,
        "setup": ["CREATE TABLE t_m (id int PRIMARY KEY)", "CREATE PUBLICATION pub FOR ALL TABLES"],
        "sql": [
            "SELECT pg_logical_emit_message(false, 'pfx', 'non-transactional')",
            "BEGIN; INSERT INTO t_m VALUES (1); "
            "SELECT pg_logical_emit_message(true, 'pfx', 'transactional'); "
            "SELECT pg_logical_emit_message(true, 'bin', '\\x00ff'::bytea); COMMIT",
            "BEGIN; SELECT pg_logical_emit_message(false, 'pfx', 'survives rollback'); "
            "INSERT INTO t_m VALUES (2); ROLLBACK",
        ],
    },
    "type_enum": {
        "options": BASE,
        "setup": [
            "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
            "CREATE TABLE t_enum (id int PRIMARY KEY, m mood)",
            "CREATE PUBLICATION pub FOR ALL TABLES",
        ],
        "sql": ["INSERT INTO t_enum VALUES (1, 'happy')"],
    },
    "origin": {
        "options": BASE,
        "setup": [
            "CREATE TABLE t_o (id int PRIMARY KEY)",
            "CREATE PUBLICATION pub FOR ALL TABLES",
            "SELECT pg_replication_origin_create('fixture_origin')",
        ],
        "sql": [
            "SELECT pg_replication_origin_session_setup('fixture_origin'); BEGIN; "
            "SELECT pg_replication_origin_xact_setup('0/12345678', now()); "
            "INSERT INTO t_o VALUES (1); COMMIT; SELECT pg_replication_origin_session_reset()",
        ],
        "teardown": ["SELECT pg_replication_origin_drop('fixture_origin')"],
    },
    "binary": {
        "options": {**BASE, "binary": "true"},
        "setup": [
            "CREATE TABLE t_bin (id int PRIMARY KEY, name text, n numeric)",
            "CREATE PUBLICATION pub FOR ALL TABLES",
        ],
        "sql": ["INSERT INTO t_bin VALUES (1, 'one', 1.5)", "UPDATE t_bin SET n = NULL"],
    },
    "streaming": {
        "options": {**BASE, "proto_version": "2", "streaming": "on"},
        "work_mem": "64kB",
        "setup": [
            "CREATE TABLE t_s (id int PRIMARY KEY, v text)",
            "CREATE TABLE t_s2 (id int PRIMARY KEY)",
            "CREATE PUBLICATION pub FOR ALL TABLES",
        ],
        "sql": [
            "BEGIN; INSERT INTO t_s SELECT g, 'a' FROM generate_series(1, 700) g; "
            "SAVEPOINT sp; INSERT INTO t_s SELECT g, 'b' FROM generate_series(701, 1400) g; "
            "ROLLBACK TO SAVEPOINT sp; INSERT INTO t_s VALUES (5000, 'c'); "
            "SELECT pg_logical_emit_message(true, 'pfx', 'streamed'); "
            "TRUNCATE t_s2; UPDATE t_s SET v = 'd' WHERE id = 1; DELETE FROM t_s WHERE id = 2; "
            "COMMIT",
            "BEGIN; INSERT INTO t_s SELECT g, 'e' FROM generate_series(10001, 10700) g; ROLLBACK",
            "INSERT INTO t_s VALUES (20000, 'small')",
        ],
    },
    "two_phase": {
        "options": {**BASE, "proto_version": "3", "two_phase": "true"},
        "slot_two_phase": True,
        "setup": [
            "CREATE TABLE t_2pc (id int PRIMARY KEY, v text)",
            "CREATE PUBLICATION pub FOR ALL TABLES",
        ],
        "sql": [
            "BEGIN; INSERT INTO t_2pc VALUES (1, 'kept'); PREPARE TRANSACTION 'gid_commit'",
            "INSERT INTO t_2pc VALUES (2, 'plain')",
            "COMMIT PREPARED 'gid_commit'",
            "BEGIN; INSERT INTO t_2pc VALUES (3, 'dropped'); PREPARE TRANSACTION 'gid_rollback'",
            "ROLLBACK PREPARED 'gid_rollback'",
        ],
    },
    "schema_change": {
        "options": BASE,
        "copy": True,
        "setup": [
            "CREATE TABLE t_sc (id int PRIMARY KEY, a text)",
            "CREATE PUBLICATION pub FOR ALL TABLES",
        ],
        "sql": [
            "INSERT INTO t_sc VALUES (1, 'before')",
            "ALTER TABLE t_sc ADD COLUMN b int",
            "INSERT INTO t_sc VALUES (2, 'after', 2)",
            "BEGIN; INSERT INTO t_sc VALUES (3, 'same txn', 3); ALTER TABLE t_sc DROP COLUMN a; "
            "INSERT INTO t_sc VALUES (4, 4); COMMIT",
        ],
    },
    "multi_table": {
        "options": BASE,
        "copy": True,
        "setup": [
            "CREATE TABLE t_x (id int PRIMARY KEY)",
            "CREATE TABLE t_y (id int PRIMARY KEY)",
            "CREATE PUBLICATION pub FOR ALL TABLES",
        ],
        "sql": [
            "BEGIN; INSERT INTO t_x VALUES (1); INSERT INTO t_y VALUES (1); "
            "INSERT INTO t_x VALUES (2); SELECT pg_logical_emit_message(true, 'm', 'x'); "
            "DELETE FROM t_y WHERE id = 1; COMMIT",
            "INSERT INTO t_y VALUES (2)",
        ],
    },
    "column_list": {
        "options": BASE,
        "setup": [
            "CREATE TABLE t_cl (id int PRIMARY KEY, shown text, hidden text)",
            "CREATE PUBLICATION pub FOR TABLE t_cl (id, shown)",
        ],
        "sql": ["INSERT INTO t_cl VALUES (1, 'yes', 'no')", "UPDATE t_cl SET shown = 'y2'"],
    },
    "quoted_names": {
        "options": {**BASE, "publication_names": '"Pub Lic"'},
        "setup": [
            'CREATE SCHEMA "My Schema"',
            'CREATE TABLE "My Schema"."Odd ""Name""" ("Col A" int PRIMARY KEY, "é" text)',
            'CREATE PUBLICATION "Pub Lic" FOR ALL TABLES',
        ],
        "sql": ['INSERT INTO "My Schema"."Odd ""Name""" VALUES (1, \'ünï\')'],
    },
    "stream_prepare": {
        "options": {**BASE, "proto_version": "3", "two_phase": "true", "streaming": "on"},
        "slot_two_phase": True,
        "work_mem": "64kB",
        "setup": [
            "CREATE TABLE t_sp (id int PRIMARY KEY, v text)",
            "CREATE PUBLICATION pub FOR ALL TABLES",
        ],
        "sql": [
            "BEGIN; INSERT INTO t_sp SELECT g, 'p' FROM generate_series(1, 700) g; "
            "PREPARE TRANSACTION 'gid_stream'",
            "COMMIT PREPARED 'gid_stream'",
        ],
    },
}


@contextmanager
def _database(admin_dsn: str) -> Iterator[str]:
    name = f"fx_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(admin_dsn)
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')
    try:
        yield " ".join([p for p in admin_dsn.split() if not p.startswith("dbname=")]
                       + [f"dbname={name}"])
    finally:
        admin.cursor().execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()


def record(dsn: str, name: str, spec: dict[str, object]) -> dict[str, object]:
    """Run one scenario and return its fixture document."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    # The test cluster runs with synchronous_commit = off; a peek only sees flushed WAL.
    cur.execute("SET synchronous_commit = on")
    for statement in spec["setup"]:  # type: ignore[attr-defined]
        cur.execute(statement)
    cur.execute("SELECT pg_create_logical_replication_slot('fx', 'pgoutput', false, %s)",
                (bool(spec.get("slot_two_phase")),))
    for statement in spec["sql"]:  # type: ignore[attr-defined]
        cur.execute(statement)
    cur.execute("CHECKPOINT")  # flushes WAL: an abort record is not flushed at ROLLBACK
    options: dict[str, str] = spec["options"]  # type: ignore[assignment]
    if spec.get("work_mem"):
        cur.execute("SET logical_decoding_work_mem = %s", (spec["work_mem"],))
    args = [v for pair in options.items() for v in pair]
    placeholders = ", ".join(["%s"] * len(args))
    cur.execute("SELECT pg_current_wal_lsn()")
    upto = cur.fetchone()[0]
    cur.execute(
        "SELECT lsn::text, xid::text, encode(data, 'hex') FROM "
        f"pg_logical_slot_peek_binary_changes('fx', %s, NULL, {placeholders})",
        [upto, *args])
    rows = [{"lsn": lsn, "xid": int(xid), "hex": data} for lsn, xid, data in cur.fetchall()]
    copy_hex = None
    if spec.get("copy"):
        sink = io.BytesIO()
        cur.copy_expert(cur.mogrify(
            "COPY (SELECT lsn, xid, data FROM "
            f"pg_logical_slot_peek_binary_changes('fx', %s, NULL, {placeholders})) "
            "TO STDOUT (FORMAT binary)", [upto, *args]).decode(), sink)
        copy_hex = sink.getvalue().hex()
    cur.execute("SELECT pg_drop_replication_slot('fx')")
    for statement in spec.get("teardown", []):  # type: ignore[attr-defined]
        cur.execute(statement)
    version = conn.server_version
    conn.close()
    return {"scenario": name, "server_version_num": version, "options": options,
            "work_mem": spec.get("work_mem"), "setup": spec["setup"], "sql": spec["sql"],
            "rows": rows, "copy_hex": copy_hex}


COPY_QUERY = (
    "SELECT * FROM (VALUES (1, 'one'::text, NULL::bytea), (2, '', '\\x00ff'::bytea), "
    "(NULL, repeat('z', 100000), ''::bytea)) v(i, t, b)")


def record_copy(dsn: str) -> dict[str, object]:
    """A COPY BINARY stream with NULLs, empty and large values, and each field's send bytes."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    sink = io.BytesIO()
    cur.copy_expert(f"COPY ({COPY_QUERY}) TO STDOUT (FORMAT binary)", sink)
    cur.execute(f"SELECT int4send(i), textsend(t), byteasend(b) FROM ({COPY_QUERY}) q")
    expected = [[None if v is None else bytes(v).hex() for v in row] for row in cur.fetchall()]
    conn.close()
    return {"query": COPY_QUERY, "hex": sink.getvalue().hex(), "expected": expected}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="admin DSN of an existing server (wal_level=logical)")
    parser.add_argument("scenarios", nargs="*", help="subset to record (default: all)")
    args = parser.parse_args()
    cluster = None
    dsn = args.dsn
    if dsn is None:
        cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="pgcdc-fixtures-")) / "pg").start()
        dsn = cluster.dsn
    try:
        if not args.scenarios or "copy_binary" in args.scenarios:
            (HERE / "copy_binary.json").write_text(json.dumps(record_copy(dsn), indent=1) + "\n")
            print("copy_binary.json")
        for name in [n for n in args.scenarios or SCENARIOS if n != "copy_binary"]:
            with _database(dsn) as db_dsn:
                doc = record(db_dsn, name, SCENARIOS[name])
            path = HERE / f"{name}.json"
            path.write_text(json.dumps(doc, indent=1) + "\n")
            print(f"{path.name}: {len(doc['rows'])} messages")  # type: ignore[arg-type]
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
