"""The pgoutput decoder on payloads recorded from PostgreSQL 15 (tests/data/pgoutput)."""

from __future__ import annotations

import struct

import pytest

from pgcdc_dagster.cdc.changes import UNCHANGED_TOAST
from pgcdc_dagster.cdc.pgoutput import messages as m
from pgcdc_dagster.cdc.pgoutput.decoder import Decoder, decode, decode_all
from pgcdc_dagster.cdc.pgoutput.messages import MessageType, pg_time_to_unix_us
from pgcdc_dagster.exceptions import DecodeError
from tests.data.pgoutput.fixtures import load, scenario_names

pytestmark = pytest.mark.unit


def _decoded(name: str) -> list[tuple[int, m.PgOutputMessage]]:
    recorded = load(name)
    return list(zip([lsn for lsn, _, _ in recorded.rows],
                    decode_all(recorded.payloads()), strict=True))


def _of(name: str, kind: type) -> list:
    return [msg for _, msg in _decoded(name) if isinstance(msg, kind)]


@pytest.mark.parametrize("name", scenario_names())
def test_every_recorded_message_is_consumed_exactly(name: str) -> None:
    """Each payload decodes; one byte more or one byte less is an error, never ignored."""
    decoder = Decoder()
    for _, _, data in load(name).rows:
        in_stream = decoder.in_stream
        decoder.decode(data)
        with pytest.raises(DecodeError, match=r"(trailing bytes|truncated).* at byte offset"):
            decode(data + b"\x00", in_stream=in_stream)
        if len(data) > 1:
            with pytest.raises(DecodeError, match="byte offset"):
                decode(data[:-1], in_stream=in_stream)
    assert not decoder.in_stream


def test_fixtures_cover_every_message_type() -> None:
    seen = {type(msg) for name in scenario_names() for _, msg in _decoded(name)}
    assert seen == set(m.PgOutputMessage.__args__)  # type: ignore[attr-defined]


def test_begin_and_commit_frame_a_transaction() -> None:
    (_, begin), *_, (lsn_c, commit) = _decoded("multi_table")[:9]
    assert isinstance(begin, m.Begin) and isinstance(commit, m.Commit)
    assert begin.xid == load("multi_table").rows[0][1]
    assert commit.flags == 0
    assert commit.commit_lsn == begin.final_lsn < commit.end_lsn
    assert commit.end_lsn == lsn_c  # the slot reports a commit at its end LSN
    assert commit.commit_time == begin.commit_time
    # 2026-ish, microseconds since the Unix epoch after conversion
    assert 1_600_000_000_000_000 < pg_time_to_unix_us(commit.commit_time) < 2_500_000_000_000_000


def test_relation_describes_columns_identity_and_keys() -> None:
    (rel,) = [r.relation for r in _of("basic", m.RelationMessage)]
    assert (rel.namespace, rel.name, rel.replica_identity) == ("public", "t_default", "d")
    assert [(c.name, c.type_oid, c.typmod, c.is_key) for c in rel.columns] == [
        ("id", 23, -1, True), ("name", 25, -1, False),
        ("amount", 1700, (12 << 16 | 2) + 4, False), ("flag", 16, -1, False),
        ("ts", 1184, -1, False)]
    identities = {name: _of(name, m.RelationMessage)[0].relation.replica_identity
                  for name in ("identity_full", "identity_index", "identity_nothing")}
    assert identities == {"identity_full": "f", "identity_index": "i", "identity_nothing": "n"}
    index_rel = _of("identity_index", m.RelationMessage)[0].relation
    assert [c.name for c in index_rel.columns if c.is_key] == ["code"]
    full_rel = _of("identity_full", m.RelationMessage)[0].relation
    assert all(c.is_key for c in full_rel.columns)  # FULL: every column is in the identity


def test_relation_names_are_utf8_and_unquoted() -> None:
    rel = _of("quoted_names", m.RelationMessage)[0].relation
    assert (rel.namespace, rel.name) == ("My Schema", 'Odd "Name"')
    assert [c.name for c in rel.columns] == ["Col A", "é"]
    (insert,) = _of("quoted_names", m.Insert)
    assert insert.new.values == (b"1", "ünï".encode())


def test_column_list_publication_sends_only_listed_columns() -> None:
    rel = _of("column_list", m.RelationMessage)[0].relation
    assert [c.name for c in rel.columns] == ["id", "shown"]
    assert [i.new.values for i in _of("column_list", m.Insert)] == [(b"1", b"yes")]


def test_insert_text_and_null_kinds() -> None:
    first, second, *_ = _of("basic", m.Insert)
    assert first.xid is None
    assert first.new.kinds == b"ttttt"
    assert first.new.values == (b"1", b"one", b"1.50", b"t", b"2024-01-02 03:04:05.123456+00")
    assert second.new.kinds == b"tnnnn"
    assert second.new.values == (b"2", None, None, None, None)


def test_update_without_old_tuple_with_key_and_with_old_row() -> None:
    plain, key_change = _of("basic", m.Update)
    assert (plain.old_kind, plain.old) == (None, None)
    assert key_change.old_kind == "K"
    assert key_change.old is not None and key_change.old.values == (b"2", None, None, None, None)
    assert key_change.new.values[0] == b"3"
    (full,) = _of("identity_full", m.Update)
    assert full.old_kind == "O"
    assert full.old is not None and full.old.values == (b"1", b"one", None)
    assert full.new.values == (b"1", b"uno", None)
    no_key_change, index_change = _of("identity_index", m.Update)
    assert no_key_change.old is None
    assert index_change.old_kind == "K"
    assert index_change.old is not None and index_change.old.kinds == b"ntn"


def test_delete_with_key_and_with_old_row() -> None:
    (by_key,) = _of("basic", m.Delete)
    assert by_key.old_kind == "K" and by_key.old.values == (b"3", None, None, None, None)
    (by_row,) = _of("identity_full", m.Delete)
    assert by_row.old_kind == "O" and by_row.old.values == (b"1", b"uno", None)


def test_unchanged_toast_is_kind_u() -> None:
    _, unchanged, changed = [*_of("toast", m.Insert), *_of("toast", m.Update)]
    assert unchanged.new.kinds == b"ttu"
    assert unchanged.new.values[2] is UNCHANGED_TOAST
    assert changed.new.values[2] == b"y" * 9000


def test_binary_option_sends_kind_b_in_send_format() -> None:
    (insert,) = _of("binary", m.Insert)
    assert insert.new.kinds == b"bbb"
    assert insert.new.values[0] == struct.pack(">i", 1)
    assert insert.new.values[1] == b"one"
    (update,) = _of("binary", m.Update)
    assert update.new.kinds == b"bbn"


def test_truncate_options_and_several_relations() -> None:
    truncates = _of("truncate", m.Truncate)
    assert [(t.options, len(t.relation_oids)) for t in truncates] == [
        (0, 1), (0, 2), (1, 2), (2, 1), (3, 2)]
    assert [(t.cascade, t.restart_identity) for t in truncates] == [
        (False, False), (False, False), (True, False), (False, True), (True, True)]


def test_logical_messages_transactional_or_not() -> None:
    messages = _of("messages", m.Message)
    assert [(x.transactional, x.prefix, x.content) for x in messages] == [
        (False, "pfx", b"non-transactional"), (True, "pfx", b"transactional"),
        (True, "bin", b"\x00\xff"), (False, "pfx", b"survives rollback")]
    assert all(x.xid is None and x.lsn > 0 for x in messages)


def test_type_and_origin_messages() -> None:
    (typ,) = _of("type_enum", m.TypeMessage)
    assert (typ.namespace, typ.name, typ.xid) == ("public", "mood", None)
    rel = _of("type_enum", m.RelationMessage)[0].relation
    assert rel.columns[1].type_oid == typ.oid
    (origin,) = _of("origin", m.Origin)
    assert (origin.name, origin.origin_lsn) == ("fixture_origin", 0x12345678)


def test_streamed_blocks_carry_xids() -> None:
    decoded = _decoded("streaming")
    starts = [x for _, x in decoded if isinstance(x, m.StreamStart)]
    assert starts[0].first_segment and not starts[1].first_segment
    top = starts[0].xid
    inserts = [x for _, x in decoded if isinstance(x, m.Insert)]
    assert all(x.xid is not None for x in inserts[:-1])
    assert inserts[-1].xid is None  # the small, ordinary transaction at the end
    aborts = [x for _, x in decoded if isinstance(x, m.StreamAbort)]
    assert [(a.xid == top, a.xid == a.subxid) for a in aborts] == [(True, False), (False, True)]
    assert all(a.abort_lsn is None and a.abort_time is None for a in aborts)
    (commit,) = [x for _, x in decoded if isinstance(x, m.StreamCommit)]
    assert commit.xid == top and commit.flags == 0 and commit.commit_lsn < commit.end_lsn
    streamed_rel = [x for _, x in decoded if isinstance(x, m.RelationMessage)]
    assert all(r.xid is not None for r in streamed_rel)
    (trunc,) = [x for _, x in decoded if isinstance(x, m.Truncate)]
    assert trunc.xid is not None
    (msg,) = [x for _, x in decoded if isinstance(x, m.Message)]
    assert msg.xid == top and msg.transactional


def test_stream_abort_v4_parallel_fields() -> None:
    """No PostgreSQL 16 server here: extend a recorded v2 abort by the v4 fields (docs)."""
    recorded = next(d for d in load("streaming").payloads() if d[0] == MessageType.STREAM_ABORT)
    v4 = recorded + struct.pack(">Qq", 0x1_0000_0010, 123_456)
    parsed = decode(v4)
    assert isinstance(parsed, m.StreamAbort)
    assert (parsed.abort_lsn, parsed.abort_time) == (0x1_0000_0010, 123_456)
    with pytest.raises(DecodeError, match=r"STREAM_ABORT.*truncated"):
        decode(v4[:-3])


def test_two_phase_messages() -> None:
    decoded = [x for _, x in _decoded("two_phase")]
    begin_prepares = [x for x in decoded if isinstance(x, m.BeginPrepare)]
    prepares = [x for x in decoded if isinstance(x, m.Prepare)]
    (committed,) = [x for x in decoded if isinstance(x, m.CommitPrepared)]
    (rolled_back,) = [x for x in decoded if isinstance(x, m.RollbackPrepared)]
    assert [b.gid for b in begin_prepares] == ["gid_commit", "gid_rollback"]
    assert [(p.gid, p.prepare_lsn, p.end_lsn, p.xid) for p in prepares] == [
        (b.gid, b.prepare_lsn, b.end_lsn, b.xid) for b in begin_prepares]
    assert committed.gid == "gid_commit" and committed.xid == begin_prepares[0].xid
    assert committed.commit_lsn > prepares[0].end_lsn
    assert rolled_back.gid == "gid_rollback"
    assert rolled_back.prepare_end_lsn == prepares[1].end_lsn < rolled_back.rollback_end_lsn
    assert rolled_back.prepare_time == prepares[1].prepare_time <= rolled_back.rollback_time
    (stream_prepare,) = _of("stream_prepare", m.StreamPrepare)
    assert stream_prepare.gid == "gid_stream" and stream_prepare.flags == 0


def test_message_type_codes() -> None:
    assert MessageType.BEGIN.char == "B"
    assert MessageType(ord("c")) is MessageType.STREAM_COMMIT
    assert len({t.char for t in MessageType}) == 19


@pytest.mark.parametrize(("payload", "pattern"), [
    (b"", "empty pgoutput message"),
    (b"Z\x00", r"unknown pgoutput message type 'Z' \(0x5a\) at byte offset 0"),
    (b"B\x00\x00", r"BEGIN message \('B'\): truncated: needs 20 more bytes at byte offset 1"),
    (b"I\x00\x00\x40\x00X\x00\x00", r"INSERT.*expected 'N'.*0x58 at byte offset 5"),
    (b"I\x00\x00\x40\x00N\x00\x01x", r"INSERT.*unknown tuple column kind 0x78 at byte offset 8"),
    (b"I\x00\x00\x40\x00N\x00\x01t\x00\x00\x00\x09ab", r"INSERT.*runs past the end"),
    (b"U\x00\x00\x40\x00K\x00\x00Q", r"UPDATE.*expected 'K', 'O' or 'N', found 0x51"),
    (b"D\x00\x00\x40\x00N\x00\x00", r"DELETE.*expected 'K' or 'O'"),
    (b"R\x00\x00\x40\x00public", r"RELATION.*unterminated string"),
    (b"R\x00\x00\x40\x00public\x00t\x00d\xff\xff", r"RELATION.*negative column count"),
    (b"O" + b"\x00" * 8 + b"\xff\xfe\x00", r"ORIGIN.*not UTF-8"),
    (b"M\x01" + b"\x00" * 8 + b"p\x00\x00\x00\x00\x05ab", r"MESSAGE.*truncated: needs 5"),
    (b"T\x00\x00\x00\x03\x00\x00\x00\x00\x01", r"TRUNCATE.*truncated: needs 12"),
    (b"A\x00\x00\x00\x01\x00\x00\x00\x01\x00", r"STREAM_ABORT.*truncated"),
    (b"E\x00", r"STREAM_STOP.*1 unexpected trailing bytes at byte offset 1"),
])
def test_malformed_buffers_name_type_and_offset(payload: bytes, pattern: str) -> None:
    with pytest.raises(DecodeError, match=pattern):
        decode(payload)


def test_decode_in_place_within_a_larger_buffer() -> None:
    payload = load("basic").payloads()[2]
    framed = b"junk" + payload + b"more"
    assert decode(framed, pos=4, end=4 + len(payload)) == decode(payload)


def test_decoder_rejects_nested_or_stray_stream_markers() -> None:
    start = next(d for d in load("streaming").payloads() if d[0] == MessageType.STREAM_START)
    decoder = Decoder()
    decoder.decode(start)
    with pytest.raises(DecodeError, match="inside an open stream"):
        decoder.decode(start)
    with pytest.raises(DecodeError, match="without a stream"):
        Decoder().decode(b"E")
