"""Column names are data in the silver MERGE, in both silver engines.

Before the fix a name with a single quote broke every MERGE of its table, and a name spelled
like an expression (``x') OR ('1``) turned the TOAST test of the update into another
expression, so updates of that column never reached silver while runs stayed green. Here
every hostile column is TOAST-able (text), updated with and without unchanged-TOAST
placeholders, and part of the key, in the Arrow and the Spark preparer.
"""

from __future__ import annotations

import pytest

from pgcdc_dagster.capture.bronze_write import write_window
from pgcdc_dagster.capture.silver_apply import apply_silver
from pgcdc_dagster.cdc.changes import UNCHANGED_TOAST, Column, Relation, Window
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.quoting import spark_path, sql_ident, sql_literal
from pgcdc_dagster.lake.delta import ensure_table
from pgcdc_dagster.lake.silver import live_rows
from tests.support.segments import IDENT, SegmentBuilder, text_context

pytestmark = pytest.mark.spark

HOSTILE = ["it's", 'say "hi"', "back`tick", "back\\slash", " spaced name ", "a + b",
           "x OR 1=1", "x') OR ('1", "t.id", "Ünïcødé 名前", "CamelCase", "n" * 63]
"""Text columns (TOAST-able: their unchanged values arrive as placeholders)."""
KEY = '"s"."k"'
REL = Relation(16500, "public", "hostile", "d", (
    Column(KEY, 23, -1, True), *(Column(n, 25, -1, False) for n in HOSTILE)))


@pytest.fixture(params=["arrow", "spark"])
def engine(request) -> int:
    return 10**9 if request.param == "arrow" else 0


def _row(key: int, tag: str, toast: frozenset[str] = frozenset()) -> tuple[bytes | None, ...]:
    return (str(key).encode(), *(UNCHANGED_TOAST if n in toast else f"{tag}:{n}".encode()
                                 for n in HOSTILE))


def test_quoting_helpers_escape_their_quote() -> None:
    assert sql_ident('a"b') == '"a""b"'
    assert sql_literal("it's") == "'it''s'"
    assert spark_path("image", "a`b.c") == "`image`.`a``b.c`"


def test_hostile_column_names_converge(spark, lakehouse, engine) -> None:
    ctx = text_context(lakehouse, REL, not_null=(KEY,))
    ensure_table(ctx.bronze_uri, ctx.bronze_schema)
    convs = list(ctx.converters)

    def write(seg: SegmentBuilder, upto: int) -> None:
        window = Window(tables={REL.qualified: [seg.seg]})
        write_window(window, Lsn(upto), {REL.qualified: ctx}, lambda rel: convs, IDENT)
        apply_silver(ctx, spark, engine)

    b = SegmentBuilder(REL)
    for k in (1, 2, 3):
        b.add("c", after=_row(k, "v1"))
    write(b, 2000)
    half = frozenset(HOSTILE[::2])
    b2 = SegmentBuilder(REL, lsn=3000)
    b2.add("u", after=_row(1, "v2"))  # every hostile column changes
    b2.add("u", after=_row(2, "v2", half))  # half of them unchanged TOAST
    b2.add("d", before=_row(3, "v1"), key_only=True)
    write(b2, 4000)
    # A second batch over the same keys: updates must reach silver again (the MERGE runs,
    # not the append of new keys only).
    b3 = SegmentBuilder(REL, lsn=5000)
    b3.add("u", after=_row(1, "v3", frozenset(HOSTILE[1::2])))
    b3.add("c", after=_row(4, "v3"))
    write(b3, 6000)

    silver = {r[KEY]: r for r in live_rows(ctx.silver_uri).to_pylist()}
    assert set(silver) == {1, 2, 4}
    for n in HOSTILE:
        assert silver[1][n] == (f"v2:{n}" if n in HOSTILE[1::2] else f"v3:{n}"), n
        assert silver[2][n] == (f"v1:{n}" if n in half else f"v2:{n}"), n
        assert silver[4][n] == f"v3:{n}", n
