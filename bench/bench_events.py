"""What one Dagster event costs the run's process, on the instance a user gets.

An op reports ``--events`` asset materializations and as many asset check evaluations, with
metadata shaped like the capture's (a bronze table's: about 35 numbers, LSNs, paths and a
ten-column schema with descriptions; a light check's: a dozen values), through Dagster's
public API (``context.log_event``), on a fresh ``DAGSTER_HOME`` whose ``dagster.yaml`` only
turns telemetry off (the default SQLite storage), in a process of its own. This is the cost
per changed table that no code of this project can lower: a capture run reports two
materializations and two light checks per table it changed.

It prints the milliseconds per event, wall and CPU, for each kind: CPU of the reporting
thread and of the whole process, and the size of each kind's serialized event.
``--postgres`` measures the same on an instance whose storage is PostgreSQL (dagster-postgres,
as in ``dagster.yaml.example``), in a throwaway local cluster.

    .venv/bin/python bench/bench_events.py [--events 300] [--postgres]
"""

# No ``from __future__ import annotations``: Dagster reads the op's context annotation.

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg

MODE = "dagster"


def bronze_like_metadata(i: int) -> dict[str, Any]:
    """A bronze materialization's metadata, of the same kinds and size as the capture's."""
    columns = [dg.TableColumn(name=f"column_{c}", type="struct<id:int64,name:string>",
                              description=f"what column {c} holds, as the capture documents it",
                              constraints=dg.TableColumnConstraints(nullable=True, unique=False,
                                                                    other=[]))
               for c in range(10)]
    meta: dict[str, Any] = {f"count_{k}": i * k for k in range(20)}
    meta.update({f"lsn_{k}": f"0/{0x151A658 + i * k:X}" for k in range(6)})
    meta.update({"capture_kind": "snapshot", "duration_s": 1.25, "rows_per_s": 812.5,
                 "source_table": f"s.t{i}", "dagster/row_count": 1000,
                 "dagster/column_schema": dg.TableSchema(columns=columns),
                 "dagster/uri": f"/tmp/lake/bronze/s/t{i}",
                 "table_uri": dg.MetadataValue.path(f"/tmp/lake/bronze/s/t{i}")})
    return meta


def check_like_metadata(i: int) -> dict[str, Any]:
    meta: dict[str, Any] = {f"lsn_{k}": f"0/{0x151A658 + i * k:X}" for k in range(4)}
    meta.update({f"count_{k}": i + k for k in range(6)})
    meta["wal_status"] = "reserved"
    return meta


def _timed(report: Callable[[int], None], count: int) -> dict[str, float]:
    wall, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
    for i in range(count):
        report(i)
    return {"wall_ms": (time.perf_counter() - wall) * 1000 / count,
            "cpu_ms": (time.thread_time() - cpu) * 1000 / count,
            "process_cpu_ms": (time.process_time() - process) * 1000 / count}


def measure(mode: str, count: int) -> dict[str, Any]:
    """One way of reporting, on a fresh instance in this process."""
    from dagster_shared.serdes import serialize_value

    figures: dict[str, Any] = {}

    def materialization(i: int) -> dg.AssetMaterialization:
        return dg.AssetMaterialization(asset_key=["bronze", "s", f"t{i}"],
                                       metadata=bronze_like_metadata(i))

    def check(i: int) -> Any:  # log_event records check evaluations too
        return dg.AssetCheckEvaluation(asset_key=dg.AssetKey(["bronze", "s", f"t{i}"]),
                                       check_name="lsn_windows_contiguous", passed=True,
                                       metadata=check_like_metadata(i))

    @dg.op
    def report(context: dg.OpExecutionContext) -> None:
        figures["materialization"] = _timed(
            lambda i: context.log_event(materialization(i)), count)
        figures["check evaluation"] = _timed(lambda i: context.log_event(check(i)), count)

    @dg.job
    def reporting() -> None:
        report()

    instance = dg.DagsterInstance.get()
    result = reporting.execute_in_process(instance=instance)
    assert result.success
    kinds = {dg.DagsterEventType.ASSET_MATERIALIZATION: "materialization",
             dg.DagsterEventType.ASSET_CHECK_EVALUATION: "check evaluation"}
    for record in instance.get_records_for_run(result.run_id, limit=10_000).records:
        kind = kinds.get(record.event_log_entry.dagster_event_type)  # type: ignore[arg-type]
        if kind is not None:
            figures[kind]["stored"] = figures[kind].get("stored", 0) + 1
            if "bytes" not in figures[kind]:
                figures[kind]["bytes"] = len(serialize_value(record.event_log_entry))
    return figures


@contextmanager
def _instances(postgres: bool) -> Iterator[list[tuple[str, str]]]:
    """(storage name, dagster.yaml text) of each instance measured."""
    yamls = [("sqlite (default)", "telemetry:\n  enabled: false\n")]
    if not postgres:
        yield yamls
        return
    from pgcdc_dagster.postgres.local_cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="pgcdc_bench_events_pg_") as root:
        cluster = LocalCluster(Path(root) / "pg").start()
        try:
            url = f"postgresql+psycopg2://postgres@127.0.0.1:{cluster.port}/postgres"
            yield [*yamls, ("postgres", "telemetry:\n  enabled: false\nstorage:\n"
                                        f"  postgres:\n    postgres_url: {json.dumps(url)}\n")]
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=300,
                        help="materializations, and as many check evaluations")
    parser.add_argument("--postgres", action="store_true",
                        help="also measure an instance on PostgreSQL (a local throwaway cluster)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.events)))
        return
    with _instances(args.postgres) as instances:
        for storage, yaml in instances:
            for mode in (MODE,):
                figures = _child(yaml, mode, args.events)
                print(f"{storage:<17} " + "; ".join(
                    f"{kind} {f['wall_ms']:.2f} ms wall {f['cpu_ms']:.2f} ms CPU "
                    f"({f['process_cpu_ms']:.2f} process; {f['stored']} stored, "
                    f"{f['bytes']} B)" for kind, f in figures.items())
                    + f"  (load {os.getloadavg()[0]:.1f})", flush=True)


def _child(yaml: str, mode: str, events: int) -> dict[str, Any]:
    """One way of reporting, in a process of its own on a fresh ``DAGSTER_HOME``."""
    with tempfile.TemporaryDirectory(prefix="pgcdc_bench_events_") as home:
        Path(home, "dagster.yaml").write_text(yaml)
        env = {**os.environ, "DAGSTER_HOME": home}
        proc = subprocess.run([sys.executable, __file__, "--events", str(events),
                               "--child", mode], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{mode} failed:\n{proc.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return figures


if __name__ == "__main__":
    main()
