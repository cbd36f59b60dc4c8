"""How the snapshot's chunks become Spark tasks (``group_small``): every
chunk exactly once; big tables' chunks alone and first; small tables' chunks in groups of
at most GROUP_MAX_CHUNKS, at least one per slot; with no big chunk to run first, the first
wave's groups are short (FIRST_GROUP_CHUNKS), so the first tables are committed and
reported soon after the workers start."""

from __future__ import annotations

from typing import Any

from pgcdc_dagster.spark.snapshot_tasks import (
    FIRST_GROUP_CHUNKS,
    GROUP_MAX_CHUNKS,
    ChunkGroup,
    chunks_of,
    group_small,
)


def _units(count: int, sizes: list[int], slots: int = 2) -> list[Any]:
    tasks: list[Any] = [f"chunk{i}" for i in range(count)]  # opaque to the grouping
    return group_small(tasks, sizes, chunk_bytes=64 << 20, slots=slots)


def _flat(units: list[Any]) -> list[Any]:
    return [t for u in units for t in (u.tasks if isinstance(u, ChunkGroup) else (u,))]


def test_small_tables_first_wave_is_short() -> None:
    units = _units(1000, [8 << 10] * 1000)
    assert sorted(_flat(units)) == sorted(f"chunk{i}" for i in range(1000))
    sizes = [len(u.tasks) for u in units]
    assert sizes[:2] == [FIRST_GROUP_CHUNKS] * 2
    assert all(n <= GROUP_MAX_CHUNKS for n in sizes) and len(units) >= 1000 // GROUP_MAX_CHUNKS


def test_big_chunks_run_first_and_alone() -> None:
    sizes = [-1, -1, -1] + [8 << 10] * 100  # three chunks of tables read in several
    units = _units(103, sizes)
    assert units[:3] == ["chunk0", "chunk1", "chunk2"]
    assert all(isinstance(u, ChunkGroup) for u in units[3:])
    assert sorted(_flat(units)) == sorted(f"chunk{i}" for i in range(103))
    assert [len(chunks_of(u)) for u in units[3:5]] == [50, 50]  # no short heads needed


def test_few_small_tables() -> None:
    assert _flat(_units(1, [100])) == ["chunk0"]
    units = _units(5, [100] * 5)
    assert sorted(_flat(units)) == [f"chunk{i}" for i in range(5)]
    assert len(units) == 2


def test_tasks_carry_their_schemas_as_arrow_ipc() -> None:
    """A task's schemas are pickled as Arrow IPC bytes (a tenth of the CPU of pickling them
    field by field, paid per table on the driver and in the worker) and come back equal,
    metadata included, through pickle and through Spark's cloudpickle."""
    import pickle

    import pyarrow as pa
    from pyspark import cloudpickle

    from pgcdc_dagster.cdc.envelope import SourceIdentity
    from pgcdc_dagster.postgres.snapshot_read import Chunk
    from pgcdc_dagster.spark.snapshot_tasks import ChunkTask

    bronze = pa.schema([pa.field("after", pa.struct([pa.field("id", pa.int64(), False,
                                                              {"pg.type": "int8"})])),
                        pa.field("op", pa.string())], metadata={"pgcdc.relation": "s.t"})
    silver = pa.schema([pa.field("id", pa.int64(), False, {"pg.type": "int8"})])
    task = ChunkTask("dbname=x password=secret", "snap", Chunk("s", "t", 0), None,
                     (), bronze, silver, (), None, "/b", "/s", SourceIdentity("n", "db"), 1, 2)
    state = task.__getstate__()
    assert isinstance(state["bronze_schema"], bytes) and isinstance(state["silver_schema"], bytes)
    for back in (pickle.loads(pickle.dumps(task)), pickle.loads(cloudpickle.dumps(task))):
        assert back == task
        assert back.bronze_schema.equals(bronze, check_metadata=True)
        assert back.silver_schema.field("id").metadata == {b"pg.type": b"int8"}
    assert isinstance(task.bronze_schema, pa.Schema)  # the task itself is left as it was
