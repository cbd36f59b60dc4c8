"""Oracle: our pgoutput decoding + assembly against PostgreSQL's own test_decoding plugin.

One randomized workload per seed (multi-table transactions, savepoints rolled back, TOAST
values over 8 kB unchanged and changed, primary-key changes, every REPLICA IDENTITY,
TRUNCATE with options, logical messages, a schema change, large transactions committed and
aborted, two-phase commits and rollbacks) is decoded from the same WAL by a test_decoding
slot and by pgoutput slots read three ways: plain (protocol 1), streamed with
``logical_decoding_work_mem = 64kB`` (protocol 2) and two-phase + streamed (protocol 3).
All must yield the same committed changes: per transaction in commit order its xid and
events (table, operation, column values printed as test_decoding prints them), plus the
non-transactional messages at their place.
"""

from __future__ import annotations

import random
import re

import pytest

from pgcdc_dagster.cdc.changes import UNCHANGED_TOAST, Column, Row, Value, Window
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.postgres.peek import peek_window
from tests.support.portions import columns, merge_portions

pytestmark = pytest.mark.integration

SCHEMA = [
    "CREATE TABLE o_default (id int PRIMARY KEY, name text, amount numeric(10,2), flag boolean,"
    " big text)",
    "ALTER TABLE o_default ALTER COLUMN big SET STORAGE EXTERNAL",
    "CREATE TABLE o_full (id int PRIMARY KEY, a text, big text)",
    "ALTER TABLE o_full ALTER COLUMN big SET STORAGE EXTERNAL",
    "ALTER TABLE o_full REPLICA IDENTITY FULL",
    "CREATE TABLE o_index (id int PRIMARY KEY, code text NOT NULL, v bigint)",
    "CREATE UNIQUE INDEX o_index_code ON o_index (code)",
    "ALTER TABLE o_index REPLICA IDENTITY USING INDEX o_index_code",
    "CREATE TABLE o_nothing (id int, v text)",
    "ALTER TABLE o_nothing REPLICA IDENTITY NOTHING",
    "CREATE TABLE o_2pc (id int PRIMARY KEY, v text)",
    "CREATE TABLE o_ta (id serial PRIMARY KEY, v float8)",
    "CREATE TABLE o_tb (id int PRIMARY KEY, a_id int REFERENCES o_ta)",
    "CREATE PUBLICATION pub FOR TABLE o_default, o_full, o_index, o_2pc, o_ta, o_tb",
    "CREATE PUBLICATION pub_ins FOR TABLE o_nothing WITH (publish = 'insert')",
]
_UNQUOTED = {20, 21, 23, 26, 700, 701, 1700}  # test_decoding's print_literal: bare numbers
_TEXTS = ["plain", "it's", "a ''quoted'' one", "back\\slash", "ünïcödé ✓", "", "x y:z [w]"]


class Workload:
    """Random but reproducible statements; tracks live keys so every statement succeeds."""

    def __init__(self, cur, seed: int) -> None:
        self.cur, self.rng, self.seed = cur, random.Random(seed), seed
        self.keys: dict[str, set[int]] = {"o_default": set(), "o_full": set(), "o_index": set()}
        self.next_id = 1
        self.altered = False

    def x(self, sql: str, *args: object) -> None:
        self.cur.execute(sql, args or None)

    def fresh(self) -> int:
        self.next_id += 1
        return self.next_id

    def big(self) -> str:
        return "".join(self.rng.choices("0123456789abcdef", k=self.rng.randint(8500, 12000)))

    def text(self) -> str | None:
        return self.rng.choice([*_TEXTS, None])

    def change(self) -> None:
        table = self.rng.choice(["o_default", "o_full", "o_index", "o_nothing"])
        live = sorted(self.keys.get(table, ()))
        op = self.rng.choice(["ins", "ins", "upd", "upd", "del", "pk"]) if live else "ins"
        if table == "o_nothing":
            self.x("INSERT INTO o_nothing VALUES (%s, %s)", self.fresh(), self.text())
            return
        key = self.rng.choice(live) if live else 0
        if op == "ins":
            key = self.fresh()
            if table == "o_default":
                self.x("INSERT INTO o_default (id, name, amount, flag, big) VALUES "
                       "(%s, %s, %s, %s, %s)", key, self.text(),
                       self.rng.choice([None, self.rng.randint(-10**6, 10**6) / 100]),
                       self.rng.choice([True, False, None]),
                       self.big() if self.rng.random() < 0.3 else None)
            elif table == "o_full":
                self.x("INSERT INTO o_full VALUES (%s, %s, %s)", key, self.text(),
                       self.big() if self.rng.random() < 0.5 else self.text())
            else:
                self.x("INSERT INTO o_index VALUES (%s, %s, %s)", key, f"c{key}",
                       self.rng.randint(-2**40, 2**40))
            self.keys[table].add(key)
        elif op == "upd":
            column, value = {
                "o_default": ("name", self.text()), "o_full": ("a", self.text()),
                "o_index": ("v", self.rng.randint(0, 99))}[table]
            if self.rng.random() < 0.25 and table != "o_index":
                column, value = "big", self.big()  # a changed TOAST value
            if table == "o_index" and self.rng.random() < 0.5:
                column, value = "code", f"c{key}-{self.fresh()}"  # replica identity change
            self.x(f"UPDATE {table} SET {column} = %s WHERE id = %s", value, key)
        elif op == "del":
            self.x(f"DELETE FROM {table} WHERE id = %s", key)
            self.keys[table].discard(key)
        else:
            new = self.fresh()
            self.x(f"UPDATE {table} SET id = %s WHERE id = %s", new, key)
            self.keys[table].discard(key)
            self.keys[table].add(new)

    KINDS = ("multi", "savepoint", "rollback", "message", "truncate", "twophase", "single")

    def transaction(self, kind: str | None = None) -> None:
        kind = kind or self.rng.choices(self.KINDS, [5, 3, 1, 2, 1, 2, 4])[0]
        if kind == "single":
            self.change()
        elif kind == "truncate":
            self.x("INSERT INTO o_ta (v) VALUES (1.5), (-2.25e10)")
            self.x("INSERT INTO o_tb SELECT 1000 + id, id FROM o_ta")
            self.x(self.rng.choice(["TRUNCATE o_tb", "TRUNCATE o_ta CASCADE",
                                    "TRUNCATE o_tb, o_ta RESTART IDENTITY",
                                    "TRUNCATE o_ta RESTART IDENTITY CASCADE"]))
        elif kind == "message":
            self.x("BEGIN")
            self.x("SELECT pg_logical_emit_message(true, 'wm', %s)", f"tx {self.seed}")
            if self.rng.random() < 0.5:
                self.change()
            self.x("SELECT pg_logical_emit_message(false, 'nt', 'non-transactional')")
            self.x(self.rng.choice(["COMMIT", "ROLLBACK"]))
            self.keys = self._live_keys()
        elif kind == "twophase":
            gid = f"g{self.seed}-{self.fresh()}"
            self.x("BEGIN")
            base = self.fresh() * 10_000  # fresh keys: later statements never wait on locks
            rows = self.rng.choice([3, 3, 2500])  # the large one is streamed at PREPARE
            self.x("INSERT INTO o_2pc SELECT g, 'p' FROM generate_series(%s, %s) g",
                   base, base + rows - 1)
            self.x("PREPARE TRANSACTION %s", gid)
            self.change()
            self.x(f"{self.rng.choice(['COMMIT', 'ROLLBACK'])} PREPARED %s", gid)
        else:
            snapshot = {t: set(k) for t, k in self.keys.items()}
            self.x("BEGIN")
            for _ in range(self.rng.randint(2, 6)):
                self.change()
            if kind == "savepoint":
                self.x("SAVEPOINT a")
                for _ in range(self.rng.randint(1, 4)):
                    self.change()
                self.x("ROLLBACK TO SAVEPOINT a")
                self.keys = self._live_keys()
                self.change()
            if kind == "rollback":
                self.x("ROLLBACK")
                self.keys = snapshot
            else:
                self.x("COMMIT")

    def _live_keys(self) -> dict[str, set[int]]:
        self.x("SELECT 'o_default', array_agg(id) FROM o_default UNION ALL "
               "SELECT 'o_full', array_agg(id) FROM o_full UNION ALL "
               "SELECT 'o_index', array_agg(id) FROM o_index")
        return {t: set(ids or ()) for t, ids in self.cur.fetchall()}

    def large(self, commit: bool) -> None:
        base = self.fresh() * 10_000
        self.x("BEGIN")
        self.x("INSERT INTO o_index SELECT g, 'big' || g, g FROM generate_series(%s, %s) g",
               base, base + 2999)
        self.x("SAVEPOINT big")
        self.x("UPDATE o_index SET v = -v WHERE id BETWEEN %s AND %s", base, base + 999)
        self.x("ROLLBACK TO SAVEPOINT big")
        self.x("DELETE FROM o_index WHERE id BETWEEN %s AND %s", base + 2000, base + 2999)
        self.x("COMMIT" if commit else "ROLLBACK")
        if commit:
            self.keys["o_index"] |= set(range(base, base + 2000))

    def run(self, transactions: int) -> None:
        for kind in self.rng.sample(self.KINDS, len(self.KINDS)):  # every kind at least once
            self.transaction(kind)
        for i in range(transactions):
            if i == transactions // 2:
                self.x("ALTER TABLE o_default ADD COLUMN extra int DEFAULT 7")
                self.large(commit=True)
            if i == transactions // 3:
                self.large(commit=False)
            self.transaction()


_COLUMN = re.compile(r" ([\w]+)\[[^\]]+\]:('(?:[^']|'')*'|\S+)")


def _tuple(text: str) -> tuple[tuple[str, str], ...]:
    return tuple(_COLUMN.findall(text))


def _parse_change(data: str) -> list[tuple[object, ...]]:
    head, _, body = data.partition(": ")
    tables = [t.strip() for t in head.removeprefix("table ").split(",")]
    op, _, rest = body.partition(":")
    if op == "TRUNCATE":
        flags = (2 if "restart_seqs" in rest else 0) | (1 if "cascade" in rest else 0)
        return [(t, "t", None, None, flags) for t in tables]
    before = None
    if rest.startswith(" old-key:"):
        old, _, rest = rest.removeprefix(" old-key:").partition(" new-tuple:")
        before = _tuple(old)
    (table,) = tables
    if op == "DELETE":
        return [(table, "d", _tuple(rest), None, 0)]
    return [(table, {"INSERT": "c", "UPDATE": "u"}[op], before, _tuple(rest), 0)]


def oracle(cur, upto: Lsn) -> list[tuple[object, ...]]:
    """test_decoding's view: (xid, events) per committed transaction, or a bare message."""
    cur.execute("SELECT xid::text::bigint, data FROM pg_logical_slot_peek_changes('td', %s, "
                "NULL, 'include-xids', '1', 'skip-empty-xacts', '1')", (str(upto),))
    out: list[tuple[object, ...]] = []
    current: list[object] | None = None
    current_xid = None
    for xid, data in cur.fetchall():
        if data.startswith("message: transactional: 0"):
            out.append(("message", data))
            continue
        if data.startswith(("BEGIN", "COMMIT")):
            continue
        if xid != current_xid:  # a transaction's rows are contiguous (printed at commit)
            current, current_xid = [], xid
            out.append((xid, current))
        assert current is not None
        if data.startswith("message: transactional: 1"):
            current.append(("message", data))
        else:
            current.extend(_parse_change(data))
    return [(x, tuple(e)) if x != "message" else (x, e) for x, e in out]


def _literal(type_oid: int, value: Value) -> str:
    if value is None:
        return "null"
    if value is UNCHANGED_TOAST:
        return "unchanged-toast-datum"
    assert isinstance(value, bytes)
    text = value.decode()
    if type_oid in _UNQUOTED:
        return text
    if type_oid == 16:
        return "true" if text == "t" else "false"
    return "'" + text.replace("'", "''") + "'"


def _image(cols: tuple[Column, ...], row: Row | None, skip_nulls: bool) -> object:
    """A tuple as test_decoding prints it (old images skip NULLs)."""
    if row is None:
        return None
    return tuple((c.name, _literal(c.type_oid, v)) for c, v in zip(cols, row, strict=True)
                 if not (skip_nulls and v is None))


def ours(window: Window) -> list[tuple[object, ...]]:
    """The same view built from a Window."""
    events: list[tuple[int, int, int | None, tuple[object, ...]]] = []
    for seg in window.segments():
        cols = seg.relation.columns
        name = f"{seg.relation.namespace}.{seg.relation.name}"
        for i in range(len(seg)):
            event = (name, seg.op[i], _image(cols, seg.before[i], True),
                     _image(cols, seg.after[i], False), seg.truncate_options[i])
            events.append((seg.commit_lsn[i], seg.total_order[i], seg.xid[i], event))
    for msg in window.messages:
        text = (f"message: transactional: {int(msg.transactional)} prefix: {msg.prefix}, "
                f"sz: {len(msg.content)} content:{msg.content.decode()}")
        events.append((msg.commit_lsn, msg.total_order, msg.xid, ("message", text)))
    events.sort(key=lambda e: (e[0], e[1]))
    out: list[tuple[object, ...]] = []
    for _, _, xid, event in events:
        if xid is None:
            out.append(event)
        elif out and out[-1][0] == xid:
            out[-1][1].append(event)  # type: ignore[attr-defined]
        else:
            out.append((xid, [event]))
    return [(x, tuple(e)) if x != "message" else (x, e) for x, e in out]


@pytest.mark.parametrize("seed", [11, 23, 47, 90])
def test_pgoutput_matches_test_decoding(pg_conn, seed: int) -> None:
    cur = pg_conn.cursor()
    cur.execute("SET synchronous_commit = on")
    for statement in SCHEMA:
        cur.execute(statement)
    cur.execute("SELECT pg_create_logical_replication_slot('td', 'test_decoding')")
    cur.execute("SELECT pg_create_logical_replication_slot('po', 'pgoutput')")
    cur.execute("SELECT pg_create_logical_replication_slot('po2', 'pgoutput', false, true)")
    Workload(cur, seed).run(transactions=150)
    cur.execute("CHECKPOINT")  # an abort record is not flushed by itself
    cur.execute("SELECT pg_current_wal_flush_lsn()::text")
    upto = Lsn(cur.fetchone()[0])

    expected = oracle(cur, upto)
    pubs = ["pub", "pub_ins"]
    plain = peek_window(pg_conn, "po", pubs, upto)
    streamed = peek_window(pg_conn, "po", pubs, upto, streaming=True, decoding_work_mem="64kB",
                           spill_limit_bytes=64 * 1024)
    two_phase = peek_window(pg_conn, "po2", pubs, upto, streaming=True, two_phase=True,
                            decoding_work_mem="64kB")
    # In small portions, cut anywhere inside transactions: joined, the same.
    portions: dict[str, list[Window]] = {"plain": [], "streamed": [], "two_phase": []}
    plain_cut = peek_window(pg_conn, "po", pubs, upto, portion_changes=7,
                            on_portion=portions["plain"].append)
    streamed_cut = peek_window(pg_conn, "po", pubs, upto, streaming=True,
                               decoding_work_mem="64kB", spill_limit_bytes=64 * 1024,
                               portion_changes=13, on_portion=portions["streamed"].append)
    two_phase_cut = peek_window(pg_conn, "po2", pubs, upto, streaming=True, two_phase=True,
                                decoding_work_mem="64kB", portion_changes=5,
                                on_portion=portions["two_phase"].append)
    for name, whole, cut in (("plain", plain, plain_cut), ("streamed", streamed, streamed_cut),
                             ("two_phase", two_phase, two_phase_cut)):
        assert len(portions[name]) > 20, name
        assert columns(merge_portions(portions[name], cut)) == columns(whole), name
    ops = {e[1] for x, events in expected if x != "message" for e in events}  # type: ignore[union-attr]
    assert {"c", "u", "d", "t"} <= ops and len(expected) > 100
    flat = repr(expected)
    assert "unchanged-toast-datum" in flat and re.search(r"'[0-9a-f]{8500,}'", flat)
    old_images = {e[0] for x, events in expected if x != "message"  # type: ignore[union-attr]
                  for e in events if e[0] != "message" and e[2]}
    assert {"public.o_default", "public.o_full", "public.o_index"} <= old_images
    cur.execute("SET logical_decoding_work_mem = '64kB'")
    cur.execute("SELECT string_agg(DISTINCT chr(get_byte(data, 0)), '') FROM "
                "pg_logical_slot_peek_binary_changes('po2', %s, NULL, 'proto_version', '3', "
                "'publication_names', 'pub,pub_ins', 'streaming', 'on', 'two_phase', 'on')",
                (str(upto),))
    assert set("SEAcbPKrp") <= set(cur.fetchone()[0])  # the streamed and 2PC paths ran
    cur.execute("RESET logical_decoding_work_mem")
    assert ours(plain) == expected
    assert ours(streamed) == expected
    assert ours(two_phase) == expected
    assert [t.xid for t in plain.transactions] == [x for x, _ in expected if x != "message"]
