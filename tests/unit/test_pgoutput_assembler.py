"""The window assembler on message sequences recorded from PostgreSQL 15."""

from __future__ import annotations

import struct

import pytest

from pgcdc_dagster.cdc.changes import UNCHANGED_TOAST, Window
from pgcdc_dagster.cdc.pgoutput.assembler import Assembler, assemble
from pgcdc_dagster.cdc.pgoutput.messages import MessageType
from pgcdc_dagster.exceptions import DecodeError
from tests.data.pgoutput.fixtures import flatten, load, scenario_names

pytestmark = pytest.mark.unit


def _window(name: str, **kwargs: object) -> Window:
    assembler = Assembler(**kwargs)  # type: ignore[arg-type]
    for lsn, data in load(name).items():
        assembler.feed(lsn, data)
    return assembler.finish()


def _rows(window: Window) -> list[tuple[str, object, object]]:
    return [(e["op"], e["before"], e["after"]) for e in flatten(window) if e["op"] != "m"]


@pytest.mark.parametrize("name", scenario_names())
def test_every_fixture_assembles_into_consistent_segments(name: str) -> None:
    window = _window(name)
    events = flatten(window)  # asserts equal list lengths per segment
    assert window.change_count == len(events)
    tx_events = [e for e in events if e.get("transactional", True)]
    assert sum(t.event_count for t in window.transactions) == len(tx_events)
    for info in window.transactions:
        mine = [e for e in tx_events if e["xid"] == info.xid]
        assert sorted(e["total_order"] for e in mine) == list(range(1, info.event_count + 1))
        assert {e["commit_lsn"] for e in mine} == {info.commit_lsn}
        assert {e["ts"] for e in mine} == {info.commit_ts_us}
    if window.transactions:
        assert window.last_commit_end_lsn == max(t.end_lsn for t in window.transactions)


def test_basic_operations_and_transaction_metadata() -> None:
    window = _window("basic")
    assert list(window.tables) == [("public", "t_default")]
    assert _rows(window) == [
        ("c", None, (b"1", b"one", b"1.50", b"t", b"2024-01-02 03:04:05.123456+00")),
        ("c", None, (b"2", None, None, None, None)),
        ("u", None, (b"1", b"uno", b"1.50", b"t", b"2024-01-02 03:04:05.123456+00")),
        ("u", (b"2", None, None, None, None), (b"3", None, None, None, None)),
        ("d", (b"3", None, None, None, None), None),
        ("c", None, (b"10", b"a", None, None, None)),
        ("c", None, (b"11", b"b", None, None, None)),
    ]
    events = flatten(window)
    assert [e["key_only"] for e in events] == [False, False, False, True, True, False, False]
    assert [e["total_order"] for e in events] == [1, 1, 1, 1, 1, 1, 2]
    assert [e["collection_order"] for e in events] == [1, 1, 1, 1, 1, 1, 2]
    xids = [xid for _, xid, data in load("basic").rows if data[0] == MessageType.BEGIN]
    assert [t.xid for t in window.transactions] == xids
    assert [e["xid"] for e in events] == [*xids[:5], xids[5], xids[5]]
    assert window.transactions[-1].per_table == (("public", "t_default", 2),)
    change_lsns = [lsn for lsn, _, d in load("basic").rows if d[0] in b"IUD"]
    assert [e["lsn"] for e in events] == change_lsns
    assert all(e["lsn"] < e["commit_lsn"] for e in events)


def test_multi_table_orders_within_transaction() -> None:
    window = _window("multi_table")
    first_txn = [e for e in flatten(window) if e["xid"] == window.transactions[0].xid]
    assert [(e["table"] and e["table"][1], e["op"], e["total_order"], e.get("collection_order"))
            for e in first_txn] == [
        ("t_x", "c", 1, 1), ("t_y", "c", 2, 1), ("t_x", "c", 3, 2), (None, "m", 4, None),
        ("t_y", "d", 5, 2)]
    assert window.transactions[0].per_table == (("public", "t_x", 2), ("public", "t_y", 2))
    assert window.transactions[0].event_count == 5
    (msg,) = window.messages
    assert (msg.transactional, msg.prefix, msg.content, msg.xid) == (
        True, "m", b"x", window.transactions[0].xid)
    assert msg.commit_lsn == window.transactions[0].commit_lsn


def test_relation_change_opens_a_new_segment_even_mid_transaction() -> None:
    window = _window("schema_change")
    segments = window.tables[("public", "t_sc")]
    assert [[c.name for c in s.relation.columns] for s in segments] == [
        ["id", "a"], ["id", "a", "b"], ["id", "b"]]
    assert [[row[0] for row in s.after] for s in segments] == [[b"1"], [b"2", b"3"], [b"4"]]
    assert segments[1].collection_order == [1, 1] and segments[2].collection_order == [2]
    assert segments[2].total_order == [2]
    assert window.transactions[-1].per_table == (("public", "t_sc", 2),)


def test_identical_relation_messages_keep_one_segment() -> None:
    assert len(_window("truncate").tables[("public", "t_b")]) == 1


def test_replica_identity_old_images() -> None:
    assert _rows(_window("identity_full")) == [
        ("c", None, (b"1", b"one", None)),
        ("u", (b"1", b"one", None), (b"1", b"uno", None)),
        ("d", (b"1", b"uno", None), None)]
    assert [e["key_only"] for e in flatten(_window("identity_full"))] == [False] * 3
    index_rows = _rows(_window("identity_index"))
    assert index_rows[2] == ("u", (None, b"a", None), (b"1", b"b", b"uno"))
    assert index_rows[3] == ("d", (None, b"b", None), None)


def test_unchanged_toast_value_is_the_sentinel() -> None:
    rows = _rows(_window("toast"))
    assert rows[1] == ("u", None, (b"1", b"1", UNCHANGED_TOAST))
    assert rows[2][2] == (b"1", b"1", b"y" * 9000)


def test_truncate_is_one_row_per_relation_with_options() -> None:
    window = _window("truncate")
    events = flatten(window)
    assert [(e["table"][1], e["truncate_options"]) for e in events] == [
        ("t_b", 0), ("t_a", 0), ("t_b", 0), ("t_a", 1), ("t_b", 1), ("t_b", 2), ("t_a", 3),
        ("t_b", 3)]
    assert all(e["op"] == "t" and e["before"] is None and e["after"] is None for e in events)
    assert window.transactions[1].per_table == (("public", "t_a", 1), ("public", "t_b", 1))


def test_logical_messages_transactional_and_not() -> None:
    window = _window("messages")
    assert [(x.transactional, x.content, x.xid is None, x.total_order) for x in window.messages] \
        == [(False, b"non-transactional", True, 0), (True, b"transactional", False, 2),
            (True, b"\x00\xff", False, 3), (False, b"survives rollback", True, 0)]
    assert window.messages[0].commit_lsn == window.messages[0].lsn
    assert len(window.transactions) == 1  # the rolled-back insert never appears
    assert window.change_count == 5


def test_streamed_transaction_drops_aborted_subtransaction_and_aborted_stream() -> None:
    window = _window("streaming")
    t_s = [e for e in flatten(window) if e["table"] == ("public", "t_s")]
    ids = [e["after"][0] for e in t_s if e["op"] == "c"]
    assert ids == [str(i).encode() for i in range(1, 701)] + [b"5000", b"20000"]
    assert [(e["op"], e["after"] or e["before"]) for e in t_s if e["op"] != "c"] == [
        ("u", (b"1", b"d")), ("d", (b"2", None))]
    top = window.transactions[0]
    assert top.event_count == 705  # 700 + 1 inserts, message, truncate, update, delete
    assert top.per_table == (("public", "t_s", 703), ("public", "t_s2", 1))
    assert [e["op"] for e in flatten(window) if e["table"] == ("public", "t_s2")] == ["t"]
    assert window.messages[0].content == b"streamed"
    assert len(window.transactions) == 2  # the aborted 700-row stream is gone


def test_spilling_to_disk_gives_the_same_window() -> None:
    in_memory = _window("streaming")
    assembler = Assembler(spill_limit_bytes=4096)
    for lsn, data in load("streaming").items():
        assembler.feed(lsn, data)
    spilled = assembler.finish()
    assert assembler.spilled_bytes > 50_000
    assert spilled == in_memory


def test_stream_without_commit_at_window_end_is_discarded() -> None:
    items = load("streaming").items()
    commit = next(i for i, (_, d) in enumerate(items) if d[0] == MessageType.STREAM_COMMIT)
    assembler = Assembler()
    for lsn, data in items[:commit]:
        assembler.feed(lsn, data)
    window = assembler.finish()
    assert window.change_count == 0 and window.transactions == []
    assert len(assembler.discarded_streams) == 1


def test_two_phase_emits_at_commit_prepared_and_drops_rollback() -> None:
    window = _window("two_phase")
    rows = [(e["after"], e["xid"]) for e in flatten(window)]
    assert [r for r, _ in rows] == [(b"2", b"plain"), (b"1", b"kept")]
    commit_prepared = next(d for _, _, d in load("two_phase").rows if d[0] == ord("K"))
    commit_lsn = struct.unpack_from(">Q", commit_prepared, 2)[0]
    assert window.transactions[1].commit_lsn == commit_lsn
    assert all(b"dropped" not in (e["after"] or ()) for e in flatten(window))


def test_prepared_transaction_carried_to_the_next_window() -> None:
    items = load("two_phase").items()
    cut = next(i for i, (_, d) in enumerate(items) if d[0] == MessageType.PREPARE) + 1
    first = Assembler()
    for lsn, data in items[:cut]:
        first.feed(lsn, data)
    assert first.finish().change_count == 0
    assert list(first.prepared) == ["gid_commit"]
    # A new peek starts a new pgoutput session, which describes relations again.
    relation = next(item for item in items if item[1][0] == MessageType.RELATION)
    second = Assembler(prepared=first.prepared)
    for lsn, data in [relation, *items[cut:]]:
        second.feed(lsn, data)
    assert [e["after"] for e in flatten(second.finish())] == [(b"2", b"plain"), (b"1", b"kept")]
    assert first.prepared == {}
    lost = Assembler()
    with pytest.raises(DecodeError, match=r"COMMIT_PREPARED.*prepared in an earlier window"):
        for lsn, data in [relation, *items[cut:]]:
            lost.feed(lsn, data)


def test_stream_prepare_emits_at_commit_prepared() -> None:
    window = _window("stream_prepare", spill_limit_bytes=10_000)
    assert window.change_count == 700
    assert [t.event_count for t in window.transactions] == [700]


def test_skip_below_drops_already_delivered_transactions() -> None:
    full = _window("basic")
    third = full.transactions[2].commit_lsn
    window = _window("basic", skip_below=third)
    assert [t.xid for t in window.transactions] == [t.xid for t in full.transactions[2:]]
    assert window.change_count == full.change_count - 2
    assert window.last_commit_end_lsn == full.last_commit_end_lsn
    streamed = _window("streaming", skip_below=_window("streaming").transactions[1].commit_lsn)
    assert [e["after"] for e in flatten(streamed)] == [(b"20000", b"small")]
    messages = _window("messages", skip_below=10**12)
    assert messages.messages == [] and messages.change_count == 0


def test_types_and_origin_are_kept() -> None:
    assembler = Assembler()
    for lsn, data in load("type_enum").items() + load("origin").items():
        assembler.feed(lsn, data)
    assert [t.name for t in assembler.types.values()] == ["mood"]
    assert assembler.origin is not None and assembler.origin.name == "fixture_origin"


def test_feed_in_place_from_a_larger_buffer() -> None:
    items = load("basic").items()
    assembler = Assembler()
    for lsn, data in items:
        framed = b"\x00" * 26 + data
        assembler.feed(lsn, framed, 26, len(framed))
    assert assembler.finish() == assemble(items)


def _begin_and_relation() -> list[tuple[int, bytes]]:
    return [item for item in load("basic").items()[:2]]


def test_change_for_undescribed_relation_names_type_and_offset() -> None:
    items = load("basic").items()
    assembler = Assembler()
    assembler.feed(*items[0])  # Begin, but not the Relation message
    with pytest.raises(DecodeError, match=r"INSERT message \('I'\) at LSN .*relation oid "
                                          r"\d+ that no Relation message described at byte "
                                          r"offset 1"):
        assembler.feed(*items[2])


@pytest.mark.parametrize(("cut", "pattern"), [
    (-1, r"INSERT message \('I'\) at LSN .*: (truncated|message ends)"),
    (8, r"INSERT message \('I'\) at LSN .*truncated"),
])
def test_truncated_change_in_the_hot_path(cut: int, pattern: str) -> None:
    assembler = Assembler()
    for item in _begin_and_relation():
        assembler.feed(*item)
    lsn, insert = load("basic").items()[2]
    with pytest.raises(DecodeError, match=pattern):
        assembler.feed(lsn, insert[:cut])


def test_bad_tuple_kind_in_the_hot_path() -> None:
    assembler = Assembler()
    for item in _begin_and_relation():
        assembler.feed(*item)
    lsn, insert = load("basic").items()[2]
    bad = insert[:8] + b"x" + insert[9:]
    with pytest.raises(DecodeError, match=r"INSERT.*unknown tuple column kind 0x78 at byte "
                                          r"offset 8"):
        assembler.feed(lsn, bad)


def test_protocol_state_errors() -> None:
    items = load("basic").items()
    with pytest.raises(DecodeError, match=r"INSERT.*change outside a transaction"):
        Assembler().feed(*items[2])
    with pytest.raises(DecodeError, match=r"COMMIT.*unexpected outside a transaction"):
        Assembler().feed(*items[3])
    open_txn = Assembler()
    for item in items[:3]:
        open_txn.feed(*item)
    with pytest.raises(DecodeError, match="window ended inside Begin/Commit"):
        open_txn.finish()
    with pytest.raises(DecodeError, match=r"BEGIN.*unexpected inside Begin/Commit"):
        open_txn.feed(*items[0])
    stream = load("streaming").items()
    continuation = [d for _, d in stream if d[0] == MessageType.STREAM_START][1]
    with pytest.raises(DecodeError, match=r"STREAM_START.*first segment was not in this window"):
        Assembler().feed(0, continuation)
    with pytest.raises(DecodeError, match=r"empty message"):
        Assembler().feed(0, b"")
    with pytest.raises(DecodeError, match=r"unknown pgoutput message type 'Z' \(0x5a\) at byte "
                                          r"offset 0 \(slot row at LSN 0/0\)"):
        Assembler().feed(0, b"Z")


def test_commit_lsn_must_match_begin() -> None:
    items = load("basic").items()
    lsn, commit = items[3]
    forged = commit[:2] + struct.pack(">Q", 1) + commit[10:]
    assembler = Assembler()
    for item in items[:3]:
        assembler.feed(*item)
    with pytest.raises(DecodeError, match=r"COMMIT.*commit LSN 0/1 differs from Begin's"):
        assembler.feed(lsn, forged)
