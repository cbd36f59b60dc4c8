"""Randomized convergence: concurrent writers with fixed seeds,
every change kind, micro-batches interleaved with the writes; afterwards silver equals the
source and bronze holds exactly one event per change, checked event by event against
PostgreSQL's own ``test_decoding`` plugin on a slot created at the same point of the WAL.

Each bronze event is matched in commit order on (table, op, xid, change LSN, key, and the
before / after values as ``test_decoding`` prints them), so a lost, doubled, reordered or
misattributed event fails. The workload covers REPLICA IDENTITY DEFAULT and FULL (STR-3x),
primary-key changes (a delete plus a create), unchanged TOAST values (STR-4x, never the
placeholder in silver), savepoints rolled back and released, whole transactions rolled
back, TRUNCATE while the writers run (STR-53), transactional and non-transactional logical
messages (STR-61, checked in ``bronze/_pgcdc/messages``) and transaction metadata (STR-69:
BEGIN / END in ``bronze/_pgcdc/transactions``, ``event_count``, ``data_collections``,
``total_order`` and ``data_collection_order`` agreeing with the events).

It runs once per ``plugin.name`` on the same workload: pgoutput, wal2json
and decoderbufs must give the same events, except what a plugin cannot carry
(``docs/plugins.md``): decoderbufs sends no TRUNCATE and no logical decoding message, so
those are expected absent (and silver of the truncated tables then keeps rows the source no
longer has: only the never-truncated table is compared with the source).
"""

from __future__ import annotations

import itertools
import random
import threading
from collections import Counter
from typing import Any

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.paths import internal_uri, table_uri
from pgcdc_dagster.postgres.connection import connect
from tests.support.compare import assert_silver_equals_source
from tests.support.decoding_oracle import Event, Message, bronze_events, oracle_events

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA = """
CREATE TABLE plain (id int PRIMARY KEY, n int, doc text);
CREATE TABLE full_ident (id int PRIMARY KEY, n int, doc text);
ALTER TABLE full_ident REPLICA IDENTITY FULL;
CREATE TABLE composite (a int, b text, n int, PRIMARY KEY (a, b));
INSERT INTO plain SELECT g, g, 'd' || g FROM generate_series(1, 400) g;
INSERT INTO full_ident SELECT g, g, 'd' || g FROM generate_series(1, 400) g;
INSERT INTO composite SELECT g, 'k' || (g % 3), g FROM generate_series(1, 200) g;
"""
KEYS: dict[str, tuple[str, ...]] = {"plain": ("id",), "full_ident": ("id",),
                                    "composite": ("a", "b")}
COLUMNS: dict[str, tuple[str, ...]] = {"plain": ("id", "n", "doc"),
                                       "full_ident": ("id", "n", "doc"),
                                       "composite": ("a", "b", "n")}
BIG = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 300))"
PHASES = 6
PER_PHASE = 20
SEED = 20240611


class Writer:
    """Random transactions on the keys this worker owns (``id % 2 = worker``), from a fixed
    seed; :meth:`run` goes on where the previous call stopped."""

    def __init__(self, dsn: str, worker: int, seed: int) -> None:
        self.dsn, self.worker, self.rng = dsn, worker, random.Random(seed)
        self.next_id = 100_000 * (worker + 1)
        self.done = 0

    def run(self, transactions: int) -> None:
        conn = connect(self.dsn, autocommit=False)
        try:
            for _ in range(transactions):
                self._transaction(conn, self.done)
                self.done += 1
        finally:
            conn.close()

    def _transaction(self, conn, i: int) -> None:
        rng, worker, cur = self.rng, self.worker, conn.cursor()
        if i in (30 + 40 * worker, 90 - 20 * worker):
            # TRUNCATE while the other writer runs: first statement of its own transaction
            # (no lock held while it waits), then a refill in the same transaction.
            table = "composite" if worker == 0 else "full_ident"
            cur.execute(f"TRUNCATE {table}")
            if table == "composite":
                cur.execute("INSERT INTO composite SELECT g, 'r' || g, g "
                            "FROM generate_series(1, 5) g")
            else:
                cur.execute("INSERT INTO full_ident SELECT g, 0, 'refill' "
                            "FROM generate_series(1, 400) g")
            conn.commit()
        rollback = False
        for _ in range(rng.randint(1, 5)):
            table = rng.choice(["plain", "full_ident"])
            pick = rng.randrange(1, 200) * 2 + worker
            r = rng.random()
            if r < 0.15:
                self.next_id += 1
                cur.execute(f"INSERT INTO {table} VALUES (%s, 0, {BIG})", (self.next_id,))
            elif r < 0.35:
                cur.execute(f"UPDATE {table} SET n = n + 1 WHERE id %% 2 = %s AND id = ANY(%s)",
                            (worker, [pick, self.next_id]))  # leaves a TOASTed doc unchanged
            elif r < 0.42:
                cur.execute(f"UPDATE {table} SET doc = {BIG} WHERE id = %s", (self.next_id,))
            elif r < 0.50:
                self.next_id += 1
                cur.execute(f"UPDATE {table} SET id = %s WHERE id = %s", (self.next_id, pick))
            elif r < 0.58:
                cur.execute(f"DELETE FROM {table} WHERE id = %s", (pick,))
            elif r < 0.68:
                cur.execute("INSERT INTO composite VALUES (%s, %s, 1) ON CONFLICT (a, b) DO "
                            "UPDATE SET n = composite.n + 1", (pick, f"w{worker}"))
            elif r < 0.72:
                cur.execute("DELETE FROM composite WHERE a = %s AND b = %s", (pick, f"w{worker}"))
            elif r < 0.78:
                cur.execute("SAVEPOINT s")
                cur.execute("INSERT INTO plain VALUES (%s, -1, 'rolled back')", (-1 - worker,))
                cur.execute(f"UPDATE {table} SET n = -5 WHERE id = %s", (pick,))
                cur.execute("SELECT pg_logical_emit_message(true, 'app', 'in rolled back sp')")
                cur.execute("ROLLBACK TO SAVEPOINT s")
            elif r < 0.82:
                cur.execute("SAVEPOINT k")
                cur.execute(f"UPDATE {table} SET n = n * 2 WHERE id = %s", (pick,))
                cur.execute("RELEASE SAVEPOINT k")
            elif r < 0.88:
                cur.execute("SELECT pg_logical_emit_message(true, 'app', %s)",
                            (f"tx {worker} {i}",))
                cur.execute("SELECT pg_logical_emit_message(false, 'app.nt', %s)",
                            (f"nt {worker} {i}",))
            elif r < 0.92:
                cur.execute(f"UPDATE {table} SET n = n + 1 WHERE id %% 2 = %s "
                            f"AND id BETWEEN %s AND %s", (worker, pick, pick + 8))
            elif r < 0.95:
                # everything of this transaction is rolled back, except the
                # non-transactional message, which is decoded at once
                cur.execute(f"UPDATE {table} SET n = -9 WHERE id = %s", (pick,))
                cur.execute("SELECT pg_logical_emit_message(true, 'app', 'never')")
                cur.execute("SELECT pg_logical_emit_message(false, 'app.nt', %s)",
                            (f"survives rollback {worker} {i}",))
                rollback = True
            else:
                cur.execute("UPDATE composite SET n = n + 1 WHERE b = %s", (f"w{worker}",))
        if rollback:
            conn.rollback()
        else:
            conn.commit()


def _bronze(lakehouse, schema: str, table: str) -> list[dict[str, Any]]:
    uri = internal_uri(str(lakehouse), table) if schema == "_pgcdc" \
        else table_uri(str(lakehouse), "bronze", schema, table)
    return DeltaTable(uri).to_pyarrow_table().to_pylist()


@pytest.mark.parametrize("plugin", ["pgoutput", "wal2json", "decoderbufs"])
def test_concurrent_writers_converge(pg_dsn, pg_conn, spark, lakehouse, plugin) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\..*",),
                               slot=f"conv_{plugin}", publication="conv",
                               window_max_bytes=256 << 10, provide_transaction_metadata=True,
                               plugin_name=plugin)
    sends_all = plugin != "decoderbufs"  # decoderbufs: no TRUNCATE, no messages
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:  # the oracle starts where our stream starts
        cur.execute("SELECT pg_create_logical_replication_slot('oracle', 'test_decoding')")
    writers = [Writer(pg_dsn, w, SEED + w) for w in (0, 1)]
    for _ in range(PHASES):  # each micro-batch runs while both writers are writing
        threads = [threading.Thread(target=w.run, args=(PER_PHASE,)) for w in writers]
        for t in threads:
            t.start()
        run_bronze(settings, spark, force_snapshot_step=False)
        run_silver(settings, spark)
        for t in threads:
            t.join()
    assert [w.done for w in writers] == [PHASES * PER_PHASE] * 2  # no writer failed
    run_bronze(settings, spark, force_snapshot_step=False)  # after quiescing
    run_silver(settings, spark)

    with pg_conn.cursor() as cur:
        cur.execute("SELECT lsn::text, xid::text::bigint, data "
                    "FROM pg_logical_slot_get_changes('oracle', NULL, NULL)")
        rows = cur.fetchall()
    txns, messages = oracle_events(rows, KEYS, COLUMNS)
    if not sends_all:
        for tx in txns:
            tx.events[:] = [e for e in tx.events if e.op != "t"]
        messages = []

    # Data events: exactly the oracle's, in commit order.
    expected: list[Event] = [e for tx in txns for e in tx.events]
    got: list[tuple[tuple[int, int], Event]] = []
    raw: dict[str, list[dict[str, Any]]] = {}
    for table in KEYS:
        raw[table] = [r for r in _bronze(lakehouse, "public", table) if r["op"] != "r"]
        got.extend(bronze_events(table, raw[table], KEYS[table], COLUMNS[table]))
    got.sort(key=lambda item: item[0])
    got_events = [e for _, e in got]
    _assert_same_events(got_events, expected)
    kinds = Counter((e.table, e.op) for e in expected)
    assert not sends_all or (kinds[("composite", "t")] >= 1 and kinds[("full_ident", "t")] >= 1)
    assert all(kinds[(t, op)] > 0 for t in ("plain", "full_ident") for op in "cud"), kinds
    unchanged = [e for e in expected if e.after and ("doc", "unchanged-toast-datum") in e.after]
    # under FULL the old row's value fills after (STR-48): only DEFAULT tables keep the marker
    assert len(unchanged) >= 10 and all(e.table != "full_ident" for e in unchanged)
    assert len(expected) > 600

    _check_transaction_metadata(txns, messages, raw, lakehouse)
    if sends_all:
        _check_messages(messages, lakehouse)
    else:
        assert not _bronze_or_empty(lakehouse, "_pgcdc", "messages")
    for table, key in KEYS.items():
        if not sends_all and table != "plain":
            continue  # TRUNCATE never reached silver
        assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", table),
                                    "public", table, list(key))


def _bronze_or_empty(lakehouse, schema: str, table: str) -> list[dict[str, Any]]:
    try:
        return _bronze(lakehouse, schema, table)
    except TableNotFoundError:
        return []


def _assert_same_events(got: list[Event], expected: list[Event]) -> None:
    """Equal lists; on failure, name the first difference (not a 1000-item diff)."""
    for i, (g, e) in enumerate(zip(got, expected, strict=False)):
        assert g == e, f"event {i} of {len(expected)} differs:\n bronze: {g}\n oracle: {e}"
    assert len(got) == len(expected), \
        f"bronze has {len(got)} events, test_decoding {len(expected)}"


def _changes(events: list[Event]) -> list[Event]:
    """The events with the delete + create pair of a primary-key change taken as one."""
    out: list[Event] = []
    for e in events:
        if out and (out[-1].op, e.op) == ("d", "c") and out[-1].lsn == e.lsn \
                and out[-1].table == e.table:
            continue
        out.append(e)
    return out


def _message_commit(lakehouse, xid: int) -> int:
    """The commit LSN bronze recorded for the transactional messages of ``xid``."""
    commits = {m["__commit_lsn"] for m in _bronze(lakehouse, "_pgcdc", "messages")
               if m["transactional"] and m["source"]["txId"] == xid}
    assert len(commits) == 1, (xid, commits)
    return commits.pop()


def _check_transaction_metadata(txns, messages: list[Message],
                                raw: dict[str, list[dict[str, Any]]], lakehouse) -> None:
    """BEGIN / END per transaction with events; counts and orders agree with the events."""
    by_tx: dict[str, list[dict[str, Any]]] = {}
    for table, rows in raw.items():
        for row in rows:
            assert row["transaction"] is not None, (table, row["op"])
            by_tx.setdefault(row["transaction"]["id"], []).append({**row, "_table": table})
    msg_ordinals: dict[int, list[int]] = {}
    for m in _bronze_or_empty(lakehouse, "_pgcdc", "messages"):
        if m["transactional"]:
            msg_ordinals.setdefault(m["source"]["txId"], []).append(m["__ordinal"])
    commit_of: dict[int, int] = {}
    for tx_id, rows in by_tx.items():
        xid, commit = (int(x) for x in tx_id.split(":"))
        assert {r["source"]["txId"] for r in rows} == {xid}
        assert {r["__commit_lsn"] for r in rows} == {commit}
        commit_of[xid] = commit
        rows.sort(key=lambda r: r["__ordinal"])
        # total_order is the event's place in its transaction (transactional messages, which
        # newer Debezium also numbers, included): the ordinals of the data events and the
        # transactional messages run 1, 2, 3 ... without a gap or a repeat.
        # KNOWN DEVIATION (reported): the delete and the create of one primary-key change
        # share their ordinal, total_order and data_collection_order; Debezium numbers them
        # as two events.
        ordinals = [r["__ordinal"] for r in rows] + msg_ordinals.get(xid, [])
        for a, b in itertools.pairwise(rows):
            if a["__ordinal"] == b["__ordinal"]:
                assert (a["op"], b["op"]) == ("d", "c") \
                    and a["source"]["lsn"] == b["source"]["lsn"], tx_id
                ordinals.remove(a["__ordinal"])
        assert sorted(ordinals) == list(range(1, len(ordinals) + 1)), tx_id
        per_table: Counter[str] = Counter()
        previous: dict[str, Any] | None = None
        for r in rows:
            assert r["transaction"]["total_order"] == r["__ordinal"], tx_id
            if previous is None or previous["__ordinal"] != r["__ordinal"]:
                per_table[r["_table"]] += 1
            assert r["transaction"]["data_collection_order"] == per_table[r["_table"]], tx_id
            previous = r
    with_events = [tx for tx in txns if tx.events]
    for tx in with_events:  # the commit LSN lies between the last change and the commit's end
        assert max(e.lsn for e in tx.events) < commit_of[tx.xid] <= tx.end_lsn

    # A transaction with only a transactional message has BEGIN / END too (the message is
    # an event of the transaction, as in Debezium's LogicalDecodingMessageMonitor).
    tx_messages = Counter(m.xid for m in messages
                          if m.transactional and not m.prefix.startswith("pgcdc"))
    for tx in txns:
        if not tx.events and tx_messages[tx.xid]:
            commit_of[tx.xid] = _message_commit(lakehouse, tx.xid)
    with_meta = [tx for tx in txns if tx.events or tx_messages[tx.xid]]
    records = _bronze(lakehouse, "_pgcdc", "transactions")
    begins = Counter(r["id"] for r in records if r["status"] == "BEGIN")
    ends = {r["id"]: r for r in records if r["status"] == "END"}
    assert len(ends) == sum(1 for r in records if r["status"] == "END")  # no END twice
    expected_ids = {f"{tx.xid}:{commit_of[tx.xid]}" for tx in with_meta}
    assert set(begins) == expected_ids and set(begins.values()) == {1}
    assert set(ends) == expected_ids
    for tx in with_meta:
        end = ends[f"{tx.xid}:{commit_of[tx.xid]}"]
        # KNOWN DEVIATION (as above): a primary-key change counts once.
        changes = _changes(tx.events)
        assert end["event_count"] == len(changes) + tx_messages[tx.xid], (end, tx.xid)
        counts = Counter(f"public.{e.table}" for e in changes)
        assert {d["data_collection"]: d["event_count"] for d in end["data_collections"]} \
            == dict(counts)


def _check_messages(messages: list[Message], lakehouse) -> None:
    """Every logical message once, transactional ones with their xid (STR-61)."""
    wanted = sorted((m for m in messages if not m.prefix.startswith("pgcdc")),
                    key=lambda m: m.lsn)
    rows = _bronze(lakehouse, "_pgcdc", "messages")
    got = sorted((Message(r["transactional"], r["message"]["prefix"], r["message"]["content"],
                          r["source"]["lsn"], r["source"]["txId"]) for r in rows),
                 key=lambda m: m.lsn)
    assert got == wanted
    assert all(r["op"] == "m" for r in rows)
    assert any(m.transactional for m in wanted) and any(not m.transactional for m in wanted)
    assert any(m.content.startswith(b"survives rollback") for m in wanted)
    assert not any(m.content in (b"never", b"in rolled back sp") for m in wanted)
