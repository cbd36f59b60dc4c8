"""decoderbufs / wal2json rows through the translators (``cdc/plugins``) into the project's own
pgoutput assembler: byte-level fixtures built from the plugins' documented layouts
(decoderbufs ``pg_logicaldec.proto``, wal2json format version 2)."""

from __future__ import annotations

import json

import pytest

from pgcdc_dagster.cdc.changes import UNCHANGED_TOAST
from pgcdc_dagster.cdc.pgoutput.assembler import Assembler
from pgcdc_dagster.cdc.plugins import check_plugin
from pgcdc_dagster.cdc.plugins.decoderbufs import (
    DecoderbufsTranslator,
    _date,
    _money,
    _split_table,
)
from pgcdc_dagster.cdc.plugins.decoderbufs import _datum as parse_datum
from pgcdc_dagster.cdc.plugins.pgwire import TableInfo, relation_of
from pgcdc_dagster.cdc.plugins.rows import RowOutput
from pgcdc_dagster.cdc.plugins.wal2json import Wal2JsonTranslator
from pgcdc_dagster.exceptions import ConfigurationError, DecodeError
from tests.support.protobuf import key as _key
from tests.support.protobuf import ld as _ld
from tests.support.protobuf import varint as _varint

TABLE = TableInfo(relation_of(42, "public", "t", "d", [("id", 23, -1, True),
                                                      ("doc", 25, -1, False),
                                                      ("at", 1114, 3, False)]),
                  frozenset({"doc"}))


def _datum(name: str, oid: int, kind: int | None = None, value: object = None) -> bytes:
    out = _ld(1, name.encode()) + _key(2, 0) + _varint(oid)
    if kind == 8:
        out += _ld(8, str(value).encode())
    elif kind in (3, 4, 11):
        out += _key(kind, 0) + _varint(int(value))  # type: ignore[arg-type]
    return out


def _datum_bytes(name: str, oid: int, value: object, kind: int = 8) -> bytes:
    return _datum(name, oid, kind, value)  # the test's builder, not the parser


def _row(op: int, new: list[bytes] = (), old: list[bytes] = ()) -> bytes:  # type: ignore[assignment]
    out = _key(1, 0) + _varint(700) + _key(2, 0) + _varint(1_700_000_000_000_000)
    if op < 3:
        out += _ld(3, b"public.t")
    out += _key(4, 0) + _varint(op)
    return out + b"".join(_ld(5, d) for d in new) + b"".join(_ld(6, d) for d in old)


def _output(tables: dict[tuple[str, str], TableInfo]) -> RowOutput:
    return RowOutput(tables, Assembler())


def test_decoderbufs_transaction_becomes_pgoutput():
    out = _output({("public", "t"): TABLE})
    tr = DecoderbufsTranslator(out, window_end=1000)
    at = 1_478_267_490_123_000  # 2016-11-04 13:51:30.123 in µs since the epoch
    tr.translate(100, _row(3))
    tr.translate(110, _row(0, [_datum("id", 23, 3, 1), _datum("doc", 25, 8, "x"),
                                        _datum("at", 1114, 4, at)]))
    tr.translate(120, _row(1, [_datum("id", 23, 3, 1), _datum("doc", 25, 11, 1),
                                        _datum("at", 1114)]))
    tr.translate(130, _row(2, old=[_datum("id", 23, 3, -1), _datum("doc", 25)]))
    # buffered until COMMIT: decoderbufs sends no commit LSN at BEGIN
    assert out.assembler.portions == 0 and not out.assembler._writer.window.tables
    tr.translate(1010, _row(4))
    window = out.assembler.finish()
    (seg,) = window.segments()
    assert seg.op == ["c", "u", "d"]
    assert seg.after[0] == (b"1", b"x", b"2016-11-04 13:51:30.123")
    assert seg.after[1] == (b"1", UNCHANGED_TOAST, None)  # datum_missing vs no value (NULL)
    assert seg.before[2][0] == b"-1"
    assert seg.lsn == [110, 120, 130]  # each change at its own LSN
    # commit LSN: inside the commit record, below the window end (exactly-once bookkeeping)
    assert seg.commit_lsn == [999, 999, 999]
    assert window.last_commit_end_lsn == 1010


def test_decoderbufs_values_back_to_text():
    assert _date(-1) == "1969-12-31" and _date(-719_528) == "0001-01-01 BC"
    assert _money(-123411) == "-$1,234.11" and _money(5) == "$0.05"
    tr = DecoderbufsTranslator(_output({}), window_end=10)
    with pytest.raises(DecodeError, match="not a RowMessage"):
        tr.translate(1, _key(3, 2) + _varint(10) + b"abc")  # truncated
    with pytest.raises(DecodeError, match="no operation or table"):
        tr.translate(1, _key(1, 0) + _varint(5))
    # names are quote_identifier output: quoted ones keep dots, quotes and case
    assert _split_table('"My.Schema"."T""x"') == ("My.Schema", 'T"x')
    assert parse_datum(_datum_bytes('"Mixed Case"', 25, "v")) == ("Mixed Case", "v")
    # varint widths: 2-byte oid, long string, big and negative integers
    for oid, kind, value in ((3802, 8, "{}"), (25, 8, "x" * 300), (20, 4, 2**40), (23, 3, -5)):
        assert parse_datum(_datum_bytes("c", oid, value, kind))[1] == str(value)


def test_wal2json_rows_become_pgoutput():
    out = _output({("public", "t"): TABLE})
    tr = Wal2JsonTranslator(out)

    def row(**kw: object) -> bytes:
        return json.dumps(kw).encode()

    b = {"timestamp": "2016-11-04 13:51:30.5+00", "lsn": "0/200", "nextlsn": "0/210",
         "xid": 9}
    tr.translate(0x100, row(action="B", **b))
    tr.translate(0x150, b'{"action":"I","schema":"public","table":"t","columns":['
                          b'{"name":"id","value":12345678901234567890.10},'
                          b'{"name":"doc","value":null},{"name":"at","value":"x"}]}')
    tr.translate(0x160, row(action="U", schema="public", table="t",
                                     columns=[{"name": "id", "value": 2}],
                                     identity=[{"name": "id", "value": 1}]))
    tr.translate(0x170, row(action="I", schema="other", table="t", columns=[]))
    tr.translate(0x210, row(action="C", **b))
    window = out.assembler.finish()
    (seg,) = window.segments()
    assert seg.op == ["c", "u"]
    assert seg.after[0] == (b"12345678901234567890.10", None, b"x")  # numbers kept as text
    assert seg.after[1] == (b"2", UNCHANGED_TOAST, None)  # left out: unchanged TOAST
    assert seg.before[1][0] == b"1"  # key changed: pgoutput's old key tuple
    assert seg.commit_lsn == [0x200, 0x200] and window.last_commit_end_lsn == 0x210
    with pytest.raises(DecodeError, match="format version 2"):
        tr.translate(1, b"BEGIN 123")


def test_plugin_names():
    assert check_plugin("wal2json") == "wal2json"
    with pytest.raises(ConfigurationError, match="pgoutput, decoderbufs, wal2json"):
        check_plugin("wal2json_rds")
