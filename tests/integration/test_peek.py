"""peek_window against a real PostgreSQL: bounded, non-consuming, exact."""

from __future__ import annotations

import gc

import psycopg2
import pytest

from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.pgoutput.options import max_proto_version
from pgcdc_dagster.cdc.pgoutput.pending import PendingTxn
from pgcdc_dagster.exceptions import ConfigurationError, DecodeError
from pgcdc_dagster.postgres.peek import peek_window
from tests.data.pgoutput.fixtures import flatten

pytestmark = pytest.mark.integration


def _setup(cur, two_phase: bool = False) -> None:
    cur.execute("SET synchronous_commit = on")  # a peek sees flushed WAL only
    cur.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    cur.execute("CREATE PUBLICATION pub FOR TABLE t")
    cur.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, %s)",
                (two_phase,))


def _lsn(cur) -> Lsn:
    cur.execute("SELECT pg_current_wal_lsn()::text")
    return Lsn(cur.fetchone()[0])


def _confirmed(cur) -> str:
    cur.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name='s'")
    return cur.fetchone()[0]


def _ids(window) -> list[bytes]:
    return [e["after"][0] if e["after"] else e["before"][0] for e in flatten(window)
            if e["op"] != "m"]


def test_peek_decodes_committed_changes_without_consuming(pg_conn) -> None:
    cur = pg_conn.cursor()
    _setup(cur)
    before = _confirmed(cur)
    cur.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 1000) g")
    cur.execute("UPDATE t SET v = 'x' WHERE id <= 10")
    cur.execute("DELETE FROM t WHERE id = 1000")
    cur.execute("SELECT pg_logical_emit_message(true, 'wm', 'hello')")
    upto = _lsn(cur)
    assert gc.isenabled()
    window = peek_window(pg_conn, "s", "pub", upto)
    assert gc.isenabled()
    (segment,) = window.tables[("public", "t")]
    assert segment.op == ["c"] * 1000 + ["u"] * 10 + ["d"]
    assert segment.after[0] == (b"1", b"v1") and segment.after[1000] == (b"1", b"x")
    assert segment.before[-1] == (b"1000", None) and segment.before_key_only[-1]
    assert [m.content for m in window.messages] == [b"hello"]
    assert len(window.transactions) == 4
    assert _confirmed(cur) == before
    again = peek_window(pg_conn, "s", "pub", upto)
    assert again == window


def test_upto_lsn_bounds_the_window_and_upto_nchanges_stops_between_transactions(
        pg_conn) -> None:
    cur = pg_conn.cursor()
    _setup(cur)
    cur.execute("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 100) g")
    middle = _lsn(cur)
    cur.execute("INSERT INTO t SELECT g, 'b' FROM generate_series(101, 200) g")
    end = _lsn(cur)
    assert len(peek_window(pg_conn, "s", "pub", middle).tables[("public", "t")][0]) == 100
    assert len(peek_window(pg_conn, "s", "pub", end).tables[("public", "t")][0]) == 200
    # The limit is checked only at transaction boundaries: a whole transaction comes back.
    limited = peek_window(pg_conn, "s", "pub", end, upto_nchanges=5)
    assert len(limited.tables[("public", "t")][0]) == 100


def test_skip_below_drops_what_an_earlier_window_delivered(pg_conn) -> None:
    cur = pg_conn.cursor()
    _setup(cur)
    cur.execute("INSERT INTO t VALUES (1, 'a')")
    first = peek_window(pg_conn, "s", "pub", _lsn(cur))
    cur.execute("INSERT INTO t VALUES (2, 'b')")
    window = peek_window(pg_conn, "s", "pub", _lsn(cur),
                         skip_below=Lsn(first.last_commit_end_lsn))
    assert _ids(window) == [b"2"]


def test_streaming_with_low_decoding_work_mem_matches_plain_decoding(pg_conn) -> None:
    cur = pg_conn.cursor()
    _setup(cur)
    cur.execute("BEGIN")
    cur.execute("INSERT INTO t SELECT g, repeat('x', 50) FROM generate_series(1, 3000) g")
    cur.execute("SAVEPOINT s1")
    cur.execute("INSERT INTO t SELECT g, 'gone' FROM generate_series(3001, 6000) g")
    cur.execute("ROLLBACK TO SAVEPOINT s1")
    cur.execute("UPDATE t SET v = 'y' WHERE id % 100 = 0")
    cur.execute("COMMIT")
    cur.execute("BEGIN")
    cur.execute("INSERT INTO t SELECT g, 'aborted' FROM generate_series(7001, 10000) g")
    cur.execute("ROLLBACK")
    cur.execute("INSERT INTO t VALUES (20000, 'last')")
    upto = _lsn(cur)
    plain = peek_window(pg_conn, "s", "pub", upto)
    streamed = peek_window(pg_conn, "s", "pub", upto, streaming=True, decoding_work_mem="64kB",
                           spill_limit_bytes=100_000)
    cur.execute("SET logical_decoding_work_mem = '64kB'")
    cur.execute("SELECT count(*) FROM pg_logical_slot_peek_binary_changes('s', %s, NULL, "
                "'proto_version', '2', 'publication_names', 'pub', 'streaming', 'on') "
                "WHERE get_byte(data, 0) = ascii('S')", (str(upto),))
    assert cur.fetchone()[0] > 1  # PostgreSQL really streamed
    cur.execute("RESET logical_decoding_work_mem")
    cur.execute("SHOW logical_decoding_work_mem")
    assert cur.fetchone()[0] == "64MB"  # peek_window restored the session setting
    assert flatten(streamed) == flatten(plain)
    assert len(_ids(plain)) == 3000 + 30 + 1


def test_two_phase_prepare_carried_across_an_advanced_slot(pg_conn, pg_dsn) -> None:
    cur = pg_conn.cursor()
    _setup(cur, two_phase=True)
    if pg_conn.server_version < 150000:  # protocol 3 (two_phase) is 15's
        with pytest.raises(ConfigurationError, match="needs PostgreSQL 15"):
            peek_window(pg_conn, "s", "pub", _lsn(cur), two_phase=True)
        return
    other = psycopg2.connect(pg_dsn)
    other.autocommit = True
    ocur = other.cursor()
    ocur.execute("SET synchronous_commit = on")
    ocur.execute("BEGIN")
    ocur.execute("INSERT INTO t VALUES (1, 'prepared')")
    ocur.execute("PREPARE TRANSACTION 'g1'")
    cur.execute("INSERT INTO t VALUES (2, 'plain')")
    first_end = _lsn(cur)
    prepared: dict[str, PendingTxn] = {}
    first = peek_window(pg_conn, "s", "pub", first_end, two_phase=True, prepared=prepared)
    assert _ids(first) == [b"2"] and list(prepared) == ["g1"]
    cur.execute("SELECT pg_replication_slot_advance('s', %s)", (str(first_end),))
    ocur.execute("COMMIT PREPARED 'g1'")
    other.close()
    second_end = _lsn(cur)
    with pytest.raises(DecodeError, match="prepared in an earlier window"):
        peek_window(pg_conn, "s", "pub", second_end, two_phase=True)
    second = peek_window(pg_conn, "s", "pub", second_end, two_phase=True, prepared=prepared)
    assert _ids(second) == [b"1"] and prepared == {}


def test_quoted_publication_names_and_several_publications(pg_conn) -> None:
    cur = pg_conn.cursor()
    cur.execute("SET synchronous_commit = on")
    cur.execute('CREATE TABLE "T one" (id int PRIMARY KEY)')
    cur.execute("CREATE TABLE t2 (id int PRIMARY KEY)")
    cur.execute('CREATE PUBLICATION "Pub One" FOR TABLE "T one"')
    cur.execute("CREATE PUBLICATION pub2 FOR TABLE t2")
    cur.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    cur.execute('INSERT INTO "T one" VALUES (1)')
    cur.execute("INSERT INTO t2 VALUES (2)")
    upto = _lsn(cur)
    assert list(peek_window(pg_conn, "s", "Pub One", upto).tables) == [("public", "T one")]
    both = peek_window(pg_conn, "s", ["Pub One", "pub2"], upto)
    assert list(both.tables) == [("public", "T one"), ("public", "t2")]


def test_works_inside_a_transaction_of_a_non_autocommit_connection(pg_conn, pg_dsn) -> None:
    cur = pg_conn.cursor()
    _setup(cur)
    cur.execute("INSERT INTO t VALUES (1, 'a')")
    upto = _lsn(cur)
    conn = psycopg2.connect(pg_dsn)
    try:
        assert _ids(peek_window(conn, "s", "pub", upto, decoding_work_mem="1MB")) == [b"1"]
        conn.rollback()
    finally:
        conn.close()


def test_window_bound_and_options_are_checked(pg_conn) -> None:
    cur = pg_conn.cursor()
    _setup(cur)
    with pytest.raises(ConfigurationError, match="explicit upto_lsn"):
        peek_window(pg_conn, "s", "pub", None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="protocol version 1 cannot carry"):
        peek_window(pg_conn, "s", "pub", _lsn(cur), proto_version=1, streaming=True)
    if pg_conn.server_version < 160000:  # protocol 4 (streaming = parallel) is 16's
        with pytest.raises(ConfigurationError, match="needs PostgreSQL 16"):
            peek_window(pg_conn, "s", "pub", _lsn(cur), streaming="parallel")


def test_parallel_streaming_matches_plain_decoding_on_16_and_later(pg_conn) -> None:
    """Protocol 4's ``streaming = parallel`` (16+): a streamed transaction, an aborted
    streamed one and a plain one decode as without streaming."""
    cur = pg_conn.cursor()
    _setup(cur)
    cur.execute("BEGIN")
    cur.execute("INSERT INTO t SELECT g, repeat('x', 50) FROM generate_series(1, 3000) g")
    cur.execute("COMMIT")
    cur.execute("BEGIN")
    cur.execute("INSERT INTO t SELECT g, 'aborted' FROM generate_series(7001, 10000) g")
    cur.execute("ROLLBACK")
    cur.execute("INSERT INTO t VALUES (20000, 'last')")
    upto = _lsn(cur)
    if pg_conn.server_version < 160000:
        with pytest.raises(ConfigurationError, match="needs PostgreSQL 16"):
            peek_window(pg_conn, "s", "pub", upto, streaming="parallel")
        return
    plain = peek_window(pg_conn, "s", "pub", upto)
    streamed = peek_window(pg_conn, "s", "pub", upto, streaming="parallel",
                           decoding_work_mem="64kB", spill_limit_bytes=100_000)
    assert flatten(streamed) == flatten(plain)
    assert len(_ids(plain)) == 3000 + 1


def test_explicit_protocol_versions_give_the_same_window(pg_conn) -> None:
    cur = pg_conn.cursor()
    _setup(cur)
    cur.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 10) g")
    cur.execute("TRUNCATE t")
    upto = _lsn(cur)
    offered = max_proto_version(pg_conn.server_version)
    assert offered == {14: 2, 15: 3}.get(pg_conn.server_version // 10000, 4)
    windows = [peek_window(pg_conn, "s", "pub", upto, proto_version=v)
               for v in range(1, offered + 1)]
    assert all(w == windows[0] for w in windows)
    assert peek_window(pg_conn, "s", "pub", upto) == windows[0]  # the default: the highest
    assert [e["op"] for e in flatten(windows[0])] == ["c"] * 10 + ["t"]


def test_server_error_propagates_and_gc_is_restored(pg_conn) -> None:
    cur = pg_conn.cursor()
    _setup(cur)
    with pytest.raises(psycopg2.errors.UndefinedObject, match="does not exist"):
        peek_window(pg_conn, "no_such_slot", "pub", _lsn(cur))
    assert gc.isenabled()


def test_decode_error_drains_the_copy_and_leaves_the_connection_usable(
        pg_conn, monkeypatch) -> None:
    from pgcdc_dagster.cdc.pgoutput.assembler import Assembler

    cur = pg_conn.cursor()
    _setup(cur)
    cur.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 500) g")
    cur.execute("INSERT INTO t VALUES (1000, 'w')")
    upto = _lsn(cur)
    real_feed = Assembler.feed

    def failing_feed(self, lsn, buf, pos=0, end=None):
        if buf[pos] == ord("C"):
            raise DecodeError("injected at the first Commit")
        real_feed(self, lsn, buf, pos, end)

    monkeypatch.setattr(Assembler, "feed", failing_feed)
    with pytest.raises(DecodeError, match="injected"):
        peek_window(pg_conn, "s", "pub", upto)
    monkeypatch.undo()
    cur.execute("SELECT 1")
    assert cur.fetchone() == (1,)
    assert len(_ids(peek_window(pg_conn, "s", "pub", upto))) == 501


def test_peek_text_values_do_not_depend_on_the_session_settings(pg_conn, pg_dsn) -> None:
    """The peek pins the snapshot's output settings (snapshot_read.SESSION_SETTINGS), so a
    connection with another DateStyle, IntervalStyle, TimeZone or extra_float_digits decodes
    the same text values as the snapshot reads them."""
    cur = pg_conn.cursor()
    cur.execute("SET synchronous_commit = on")
    cur.execute("CREATE TABLE d (id int PRIMARY KEY, day date, at timestamptz, span interval, "
                "f float8)")
    cur.execute("CREATE PUBLICATION pub FOR TABLE d")
    cur.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    cur.execute("INSERT INTO d VALUES (1, '2024-01-02', '2024-01-02 03:04:05.5+00', "
                "'1 day 02:03:04', 0.1)")
    upto = _lsn(cur)
    odd = psycopg2.connect(pg_dsn)
    try:
        odd.autocommit = True
        ocur = odd.cursor()
        ocur.execute("SET DateStyle = 'SQL, DMY'")
        ocur.execute("SET IntervalStyle = 'iso_8601'")
        ocur.execute("SET TimeZone = 'Asia/Kolkata'")
        ocur.execute("SET extra_float_digits = 0")
        ocur.execute("SELECT day::text, at::text FROM d")
        assert ocur.fetchone() == ("02/01/2024", "02/01/2024 08:34:05.5 IST")  # really odd
        (seg,) = peek_window(odd, "s", "pub", upto).tables[("public", "d")]
    finally:
        odd.close()
    assert seg.after == [(b"1", b"2024-01-02", b"2024-01-02 03:04:05.5+00", b"1 day 02:03:04",
                          b"0.1")]
    (same,) = peek_window(pg_conn, "s", "pub", upto).tables[("public", "d")]
    assert same.after == seg.after
