"""The fast paths of the wal2json and decoderbufs readers against their general paths.

wal2json rows written compactly (as wal2json writes them) take the per-table regular
expressions of ``cdc/plugins/wal2json.py``; the same rows with spaces after the separators
can only be read by the ``json`` module. decoderbufs rows of a learnt shape take the
layouts of ``cdc/plugins/pbrows.py``; a translator that never learns reads every row with the
protobuf runtime. Both readings must give the same Window, value by value, over generated
rows with the values the fast paths could get wrong: numbers past 2^53 and of 40 digits,
floats that do not round-trip through a float, -0, escapes and control characters, long
strings holding bytes that look like the structure around them, NULLs, unchanged TOAST,
key changes and REPLICA IDENTITY FULL.
"""

from __future__ import annotations

import json
import random
import struct
from typing import Any

from pgcdc_dagster.cdc.changes import Window
from pgcdc_dagster.cdc.pgoutput.assembler import Assembler
from pgcdc_dagster.cdc.plugins import decoderbufs as dbufs
from pgcdc_dagster.cdc.plugins.decoderbufs import DecoderbufsTranslator
from pgcdc_dagster.cdc.plugins.pgwire import TableInfo, relation_of
from pgcdc_dagster.cdc.plugins.rows import RowOutput
from pgcdc_dagster.cdc.plugins.wal2json import Wal2JsonTranslator
from tests.support.protobuf import key as _key
from tests.support.protobuf import ld as _ld
from tests.support.protobuf import varint as _varint

COLUMNS = [("id", 20, -1, True), ("n", 1700, -1, False), ("f8", 701, -1, False),
           ("f4", 700, -1, False), ("ok", 16, -1, False), ("tx", 25, -1, False),
           ("by", 17, -1, False), ("ts", 1184, -1, False), ("d", 1082, -1, False),
           ("i4", 23, -1, False), ("js", 3802, -1, False)]
VARLENA = frozenset({"n", "tx", "by", "js"})
NO_BYTEA = [c for c in COLUMNS if c[0] != "by"]
TABLES = {("public", "t"): TableInfo(relation_of(42, "public", "t", "d", COLUMNS), VARLENA),
          ("public", "full"): TableInfo(relation_of(43, "public", "full", "f", COLUMNS),
                                        VARLENA),
          ("public", "plain"): TableInfo(relation_of(44, "public", "plain", "d", NO_BYTEA),
                                         VARLENA)}
TRICKY_TEXT = ['', 'a"b', 'back\\slash', 'tab\tnl\nctl\x01', 'é 😀 \u2028', ',"value":1}',
               '*\x04\n\x02id\x10\x17', 'x' * 300, ':\x0b\n\x07integer',
               '*\x05\n\x02by\x10\x11J\x00'  # what follows tx in a decoderbufs row
               ]


def _windows_equal(a: Window, b: Window) -> None:
    assert a.change_count == b.change_count > 0
    assert a.transactions == b.transactions
    for key, segs in b.tables.items():
        for got, want in zip(a.tables[key], segs, strict=True):
            for name in ("op", "lsn", "before", "before_key_only", "after", "commit_lsn"):
                assert getattr(got, name) == getattr(want, name), name


# --- wal2json ------------------------------------------------------------------------------

def _w2j_value(rng: random.Random, name: str) -> str:
    """A value as wal2json writes it (numbers bare, strings escaped)."""
    if rng.random() < 0.1 and name != "id":
        return "null"
    if name == "id":
        return str(rng.choice([1, 2, 9007199254740993, -9223372036854775808]))
    if name == "n":
        return rng.choice(["1234567890123456789012345678901234567890.0123456789", "1.50",
                           "-0.000000000000000000000000000000000000001", "0"])
    if name in ("f8", "f4"):
        return rng.choice(["0.1", "1e+308", "-0", "3.4028235e+38", "1.5e-07", "5e-324"])
    if name == "ok":
        return rng.choice(["true", "false"])
    if name == "by":
        return json.dumps(rng.choice(["", "00ff", "deadbeef"]))
    if name == "js":
        return json.dumps(json.dumps({"k": rng.choice(TRICKY_TEXT), "n": 1.10}),
                          ensure_ascii=False)
    if name in ("ts", "d"):
        return json.dumps("2016-11-04 13:51:30.123456+02")
    if name == "i4":
        return str(rng.choice([0, -2147483648, 2147483647]))
    return json.dumps(rng.choice(TRICKY_TEXT), ensure_ascii=False)


def _w2j_rows(rng: random.Random, spaced: bool) -> list[bytes]:
    comma, colon = (", ", ": ") if spaced else (",", ":")

    def obj(pairs: list[tuple[str, str]]) -> str:
        return "{" + comma.join(f'"{k}"{colon}{v}' for k, v in pairs) + "}"

    def items(values: dict[str, str]) -> str:
        return "[" + comma.join(obj([("name", json.dumps(k)), ("value", v)])
                                for k, v in values.items()) + "]"

    out = [obj([("action", '"B"'), ("xid", "700"), ("timestamp", '"2016-11-04 13:51:30+00"'),
                ("lsn", '"0/200"'), ("nextlsn", '"0/900"')]).encode()]
    for _ in range(300):
        table = rng.choice(["t", "full", "plain"])
        columns = NO_BYTEA if table == "plain" else COLUMNS
        new = {c[0]: _w2j_value(rng, c[0]) for c in columns}
        old = {c[0]: _w2j_value(rng, c[0]) for c in columns}
        action = rng.choice("IUUD")
        head = [("action", f'"{action}"'), ("xid", "700"),
                ("timestamp", '"2016-11-04 13:51:30+00"'), ("lsn", '"0/300"'),
                ("schema", '"public"'), ("table", f'"{table}"')]
        if action == "U" and rng.random() < 0.2:
            del new["tx"]  # unchanged TOAST: left out (the general path, both ways)
        ident = old if table == "full" else {
            "id": old["id"] if rng.random() < 0.3 else new.get("id", "1")}
        if action == "I":
            head.append(("columns", items(new)))
        elif action == "U":
            head += [("columns", items(new)), ("identity", items(ident))]
        else:
            head.append(("identity", items(ident)))
        out.append(obj(head).encode())
    out.append(obj([("action", '"C"'), ("xid", "700"), ("timestamp", '"2016-11-04 13:51:30+00"'),
                    ("lsn", '"0/200"'), ("nextlsn", '"0/900"')]).encode())
    return out


def _w2j_window(rows: list[bytes]) -> tuple[Window, int]:
    out = RowOutput(TABLES, Assembler())
    tr = Wal2JsonTranslator(out)
    general = 0
    decode = tr._general

    def counted(*args: Any) -> None:
        nonlocal general
        general += 1
        decode(*args)

    tr._general = counted  # type: ignore[method-assign]
    for lsn, row in enumerate(rows, 0x300):
        tr.translate(lsn, row)
    return out.assembler.finish(), general


def test_wal2json_fast_path_reads_what_the_json_module_reads():
    compact, spaced = _w2j_rows(random.Random(7), False), _w2j_rows(random.Random(7), True)
    fast, general_fast = _w2j_window(compact)
    slow, general_slow = _w2j_window(spaced)
    assert general_slow == len(spaced)  # spaced rows: never the fast path
    assert general_fast < len(compact) // 3  # Begin, Commit and left-out columns only
    _windows_equal(fast, slow)
    after = [r for seg in fast.segments() for r in seg.after if r is not None]
    ids = {r[0] for r in after}
    assert b"9007199254740993" in ids and b"-9223372036854775808" in ids
    assert any(r[1] == b"1234567890123456789012345678901234567890.0123456789" for r in after)
    assert {r[2] for r in after} >= {b"0.1", b"1e+308", b"-0"}  # floats as PostgreSQL wrote
    assert any(r[5] == b'tab\tnl\nctl\x01' for r in after)
    assert any(r[6] == b"\\xdeadbeef" for r in after)  # bytea: bare hex made \x...


# --- decoderbufs ---------------------------------------------------------------------------

def _pb_datum(rng: random.Random, name: str, oid: int, old: bool) -> bytes:
    out = _ld(1, name.encode()) + _key(2, 0) + _varint(oid)
    roll = rng.random()
    if name != "id" and roll < 0.1:
        return out  # NULL
    if name in VARLENA and roll < 0.2 and not old:
        return out + _key(11, 0) + _varint(1)  # datum_missing: unchanged TOAST
    if oid in (20, 23):
        return out + _key(4 if oid == 20 else 3, 0) + _varint(rng.choice(
            [1, 127, 128, -1, 9007199254740993, -2147483648, 2**63 - 1][:7 if oid == 20 else 4]))
    if oid == 701:
        return out + _key(6, 1) + struct.pack("<d", rng.choice([0.1, 1e308, -0.0, 5e-324,
                                                                 float("nan"), float("inf")]))
    if oid == 700:
        return out + _key(5, 5) + struct.pack("<f", rng.choice([0.1, -0.0, 3.4028235e38]))
    if oid == 16:
        return out + _key(7, 0) + _varint(rng.choice([0, 1]))
    if oid == 17:
        return out + _ld(9, rng.choice([b"", b"\x00\xff", b"\x2a\x04"]))
    if oid == 1184:
        return out + _key(4, 0) + _varint(rng.choice([1_478_267_490_123_456, -1, 0,
                                                      -62_135_596_800_000_001]))
    if oid == 1082:
        return out + _key(3, 0) + _varint(rng.choice([0, -1, 19000, -719_528]))
    return out + _ld(8, rng.choice([*TRICKY_TEXT, "1234567890123456789012345678901234567890"
                                                  ".0123456789"]).encode())


def _pb_rows(rng: random.Random) -> list[bytes]:
    head = _key(1, 0) + _varint(700) + _key(2, 0) + _varint(1_478_267_490_000_000)
    typeinfo = b"".join(_ld(7, _ld(1, b"integer") + _key(2, 0) + _varint(1))
                        for _ in COLUMNS)
    rows = [head + _key(4, 0) + _varint(3)]
    for _ in range(300):
        table = rng.choice(["public.t", "public.full", "public.not_captured"])
        op = rng.choice([0, 1, 1, 2])
        new = b"".join(_ld(5, _pb_datum(rng, c[0], c[1], False)) for c in COLUMNS) \
            if op != 2 else b""
        old = b""
        if op == 2 or (op == 1 and (table == "public.full" or rng.random() < 0.3)):
            cols = COLUMNS if table == "public.full" else COLUMNS[:1]
            old = b"".join(_ld(6, _pb_datum(rng, c[0], c[1], True)) for c in cols)
        rows.append(head + _ld(3, table.encode()) + _key(4, 0) + _varint(op) + new + old
                    + (typeinfo if op != 2 else b""))
    return [*rows, head + _key(4, 0) + _varint(4)]


def _pb_window(rows: list[bytes], learn: bool) -> tuple[Window, int]:
    out = RowOutput(TABLES, Assembler())
    tr = DecoderbufsTranslator(out, window_end=10**9)
    if not learn:
        tr._learn = lambda *args: None  # type: ignore[method-assign]
    parsed = 0
    parse = dbufs._parse

    def counted(cls: Any, data: bytes) -> Any:
        nonlocal parsed
        parsed += 1
        return parse(cls, data)

    dbufs._parse = counted
    try:
        for lsn, row in enumerate(rows, 0x300):
            tr.translate(lsn, row)
    finally:
        dbufs._parse = parse
    return out.assembler.finish(), parsed


def test_decoderbufs_layouts_read_what_the_protobuf_runtime_reads():
    rows = _pb_rows(random.Random(11))
    fast, parsed_fast = _pb_window(rows, learn=True)
    slow, parsed_slow = _pb_window(rows, learn=False)
    skipped = sum(b"public.not_captured" in row for row in rows)
    assert skipped > 50
    assert parsed_slow == len(rows) - skipped + 1  # a table not captured: its first row only
    assert parsed_fast < len(rows) // 2  # most rows read by the learnt layouts
    _windows_equal(fast, slow)
    after = [r for seg in fast.segments() for r in seg.after if r is not None]
    assert {r[2] for r in after} >= {b"0.1", b"1e+308", b"-0.0", b"NaN", b"Infinity"}
    assert any(r[0] == b"9007199254740993" for r in after)
    assert any(r[5] == b"x" * 300 for r in after)  # a 2-byte length
