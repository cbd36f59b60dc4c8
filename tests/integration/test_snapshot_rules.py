"""``snapshot.mode`` decisions (pure: no server) and the override statement lexer."""

from __future__ import annotations

import pytest

from pgcdc_dagster.capture.snapshot_modes import decide, normalise_mode, reusable_chunks
from pgcdc_dagster.capture.snapshot_state import ChunkDone, SnapshotState, TablePlan
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.exceptions import ConfigurationError, SlotLostError
from pgcdc_dagster.postgres.slot import SlotInfo
from pgcdc_dagster.postgres.snapshot_read import Chunk
from pgcdc_dagster.postgres.sql_filter import single_statement

pytestmark = pytest.mark.unit

A, B = ("public", "a"), ("public", "b")
OK = SlotInfo("s", "pgoutput", "db", False, None, Lsn(100), Lsn(200), "reserved", 0, 0)
LOST = SlotInfo("s", "pgoutput", "db", False, None, None, None, "lost", 0, 0)
OPEN = SnapshotState(1, "initial", [A, B])


def _decide(mode: str, slot: SlotInfo | None, offsets: dict, *, force: bool = False,
            open_snapshot: SnapshotState | None = None, include=None):
    return decide(mode, force=force, slot=slot, slot_name="s", tables=[A, B], offsets=offsets,
                  open_snapshot=open_snapshot, snapshot_include=include)


NONE = {A: False, B: False}
BOTH = {A: True, B: True}
ONLY_A = {A: True, B: False}


@pytest.mark.parametrize(("mode", "slot", "offsets", "force", "action", "tables"), [
    ("initial", None, NONE, False, "create", (A, B)),
    ("initial", OK, BOTH, True, "none", ()),
    ("initial", OK, ONLY_A, False, "temporary", (B,)),
    ("initial", LOST, NONE, False, "recreate", (A, B)),
    ("initial_only", None, NONE, False, "temporary", (A, B)),
    ("initial_only", None, BOTH, True, "none", ()),
    ("when_needed", None, BOTH, False, "create", (A, B)),
    ("when_needed", LOST, BOTH, False, "recreate", (A, B)),
    ("when_needed", OK, BOTH, False, "none", ()),
    ("when_needed", OK, ONLY_A, False, "temporary", (B,)),
    ("always", OK, BOTH, True, "temporary", (A, B)),
    ("always", OK, BOTH, False, "none", ()),
    ("always", LOST, BOTH, False, "recreate", (A, B)),
    ("never", None, NONE, False, "create_plain", ()),
    ("no_data", OK, ONLY_A, True, "none", ()),
])
def test_mode_matrix(mode, slot, offsets, force, action, tables) -> None:
    decision = _decide(mode, slot, offsets, force=force)
    assert (decision.slot_action, decision.tables) == (action, tables)


def test_no_data_gives_offsets_without_rows() -> None:
    assert _decide("no_data", None, NONE).empty_tables == (A, B)
    assert _decide("no_data", OK, ONLY_A).empty_tables == (B,)


@pytest.mark.parametrize("mode", ["initial", "no_data"])
def test_lost_slot_with_offsets_needs_a_resnapshot_mode(mode) -> None:
    for slot in (None, LOST):
        with pytest.raises(SlotLostError, match="when_needed"):
            _decide(mode, slot, ONLY_A)


def test_open_snapshot_is_resumed_or_abandoned_with_its_slot() -> None:
    resumed = _decide("initial", OK, NONE, open_snapshot=OPEN)
    assert resumed.slot_action == "temporary" and resumed.resume is OPEN
    gone = _decide("when_needed", None, NONE, open_snapshot=OPEN)
    assert gone.slot_action == "create" and gone.abandon is OPEN and gone.resume is None
    only = _decide("initial_only", None, NONE, open_snapshot=OPEN)
    assert only.resume is OPEN and only.abandon is None


def test_snapshot_include_list_reads_some_and_offsets_the_rest() -> None:
    decision = _decide("initial", None, NONE, include={A})
    assert decision.tables == (A,) and decision.empty_tables == (B,)


def test_unknown_mode() -> None:
    assert normalise_mode("never") == "no_data"
    with pytest.raises(ConfigurationError, match=r"snapshot\.mode"):
        normalise_mode("exported")


@pytest.mark.parametrize("text", [
    "SELECT * FROM t", "SELECT * FROM t;", "SELECT * FROM t ;  -- done\n",
    "SELECT ';' AS x, $$;$$, $q$ ; $q$, E'\\';', \"a;b\" FROM t /* ; */",
    "SELECT 1 /* nested /* ; */ still */",
])
def test_single_statement_accepts(text) -> None:
    assert single_statement(text).strip().startswith("SELECT")


@pytest.mark.parametrize("text", [
    "SELECT 1; SELECT 2", "SELECT 1; DROP TABLE t", "SELECT ';'; DELETE FROM t", "", " ; ",
    "SELECT $$a$$; SELECT 1",
])
def test_single_statement_rejects(text) -> None:
    with pytest.raises(ConfigurationError):
        single_statement(text)


def _plan(kind: str, n: int) -> TablePlan:
    return TablePlan("public", "a", kind, [Chunk("public", "a", i, kind) for i in range(n)], 10)


def test_resumed_key_ranges_keep_chunks_the_stream_can_complete() -> None:
    chunks = {0: ChunkDone(0, 100, 5, None, ()), 1: ChunkDone(1, 300, 5, None, ())}
    assert set(reusable_chunks(_plan("key", 3), chunks, stream_from=100)) == {0, 1}
    # The slot was advanced past chunk 0's point: the stream cannot complete it any more.
    assert set(reusable_chunks(_plan("key", 3), chunks, stream_from=200)) == {1}


def test_resumed_ctid_ranges_are_kept_whole_or_read_again() -> None:
    same = {i: ChunkDone(i, 100, 5, None, ()) for i in range(2)}
    assert reusable_chunks(_plan("ctid", 2), same, stream_from=100) == same
    assert reusable_chunks(_plan("ctid", 3), same, stream_from=100) == {}
    mixed = {0: ChunkDone(0, 100, 5, None, ()), 1: ChunkDone(1, 300, 5, None, ())}
    assert reusable_chunks(_plan("ctid", 2), mixed, stream_from=100) == {}
