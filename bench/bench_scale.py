"""Scale benchmark: what a run costs as the captured table count grows.

Every figure is a whole ``dagster job execute -m pgcdc_dagster.definitions -j <job>`` process
on a fresh ``DAGSTER_HOME`` with the default instance (telemetry off), as a user runs it. Two
captures of one throwaway PostgreSQL cluster, ``small`` tables (default 3) and ``large``
tables (default 1000) of ``--rows`` rows each, are measured in the same run:

* ``initial_snapshot`` of large ÷ small (target ≤ 3);
* an idle ``cdc_microbatch`` of large ÷ small (target ≤ 1.5);
* a ``cdc_microbatch`` after the same ``--updates`` updates to 3 tables, large ÷ small
  (target ≤ 1.5);
* the ``capture_checks`` sweep (every check of every table, silver against the source
  included): its seconds for the large capture (target: seconds, not minutes) and large ÷
  small (``--no-checks`` skips it; ``--checks-only`` measures the snapshot and the sweep
  only, and prints the sweep's events and its seconds per phase; ``--microbatch-only``
  reports the two micro-batches only: the snapshot runs to set them up, unreported).

The machine is shared: compare the ratios, not the seconds. Each run's CPU seconds (the
process and its children: the Spark JVM and Python workers) are printed next to its wall time,
with their ratio: on a loaded machine a run waits for the CPU, so wall time grows with the
load while CPU seconds much less.

Each run's Dagster events are counted in its instance's event log and printed per
captured table, so the cost Dagster's event storage adds per table shows next to the time.
``--profile DIR`` runs every process under ``cProfile`` and leaves ``<capture>_<job>.prof``
files there (read them with ``pstats``). ``--tuned`` loads the code location through
``bench/tuned_definitions.py``, which calls ``pgcdc_dagster.tuning.tune_process()`` after the
imports, with ``ARROW_DEFAULT_MEMORY_POOL=jemalloc`` in its environment, as a deployment that
opts into the process tuning does.

    .venv/bin/python bench/bench_scale.py [--small 3] [--large 1000] [--rows 1000]
        [--snapshot-only | --checks-only | --microbatch-only] [--profile DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg2

from pgcdc_dagster.postgres import local_cluster
from pgcdc_dagster.postgres.local_cluster import LocalCluster

ROOT = Path(local_cluster.__file__).resolve().parents[2]
"""The code measured: the checkout ``pgcdc_dagster`` is imported from (PYTHONPATH decides)."""


def create_tables(dsn: str, schema: str, count: int, rows: int) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"CREATE SCHEMA {schema}")
        for i in range(count):
            cur.execute(f"CREATE TABLE {schema}.t{i} (id int PRIMARY KEY, name text, "
                        "amount numeric(10,2), at timestamptz)")
            cur.execute(f"INSERT INTO {schema}.t{i} SELECT g, 'row ' || g, g * 0.25, now() "
                        "FROM generate_series(1, %s) g", (rows,))
    conn.close()


def update(dsn: str, schema: str, tables: int, updates: int) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        per = max(1, updates // tables)
        for i in range(tables):
            cur.execute(f"UPDATE {schema}.t{i} SET amount = amount + 1 WHERE id <= %s", (per,))
    conn.close()


class Capture:
    """One capture (schema, slot, lakehouse, DAGSTER_HOME) run by the Dagster CLI."""

    def __init__(self, root: Path, dsn: str, schema: str, profile: Path | None = None,
                 module: str = "pgcdc_dagster.definitions") -> None:
        self.module = module
        self.schema = schema
        self.profile = profile
        self.output = ""
        self.home = home = root / f"home_{schema}"
        home.mkdir(parents=True)
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        self.env = dict(os.environ)
        self.env.update({
            "PGCDC_PG_DSN": dsn, "PGCDC_LAKEHOUSE": str(root / f"lake_{schema}"),
            "PGCDC_TABLES": f"{schema}\\..*", "PGCDC_SLOT": f"bench_{schema}",
            "PGCDC_PUBLICATION": f"bench_{schema}", "DAGSTER_HOME": str(home),
            "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
        })
        if module != "pgcdc_dagster.definitions":  # the tuned deployment: Arrow's C++ pool too
            self.env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")

    def run(self, job: str) -> tuple[float, float]:
        """Wall seconds and CPU seconds (the process and its children) of one job."""
        cli = [str(Path(sys.executable).parent / "dagster")]
        if self.profile is not None:
            out = self.profile / f"{self.schema}_{job}.prof"
            cli = [sys.executable, "-m", "cProfile", "-o", str(out), *cli]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run(
            [*cli, "job", "execute", "-m", self.module, "-j", job],
            env=self.env, cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        self.output = proc.stdout + proc.stderr
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0 or "RUN_SUCCESS" not in proc.stdout + proc.stderr:
            sys.exit(f"{job} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        return seconds, cpu

    def events(self) -> dict[str, int]:
        """The Dagster events of the last run, by type (read from its instance)."""
        from collections import Counter

        import dagster as dg

        with dg.DagsterInstance.from_config(str(self.home)) as instance:
            run = instance.get_runs(limit=1)[0]
            return dict(Counter(e.dagster_event_type.value if e.dagster_event_type else "LOG"
                                for e in instance.all_logs(run.run_id)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=3)
    parser.add_argument("--large", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--snapshot-only", action="store_true",
                        help="measure initial_snapshot only")
    parser.add_argument("--no-checks", action="store_true",
                        help="skip the capture_checks sweep")
    parser.add_argument("--checks-only", action="store_true",
                        help="initial_snapshot, then the capture_checks sweep only (no "
                        "micro-batches)")
    parser.add_argument("--microbatch-only", action="store_true",
                        help="the micro-batches only: initial_snapshot still runs (to set up) "
                        "but is not reported, no capture_checks sweep")
    parser.add_argument("--tuned", action="store_true",
                        help="load the code location through bench/tuned_definitions.py")
    parser.add_argument("--profile", type=Path, default=None,
                        help="run each process under cProfile, .prof files into this directory")
    args = parser.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="pgcdc_bench_scale_"))
    cluster = LocalCluster(root / "pg").start()
    try:
        sizes = {"small": args.small, "large": args.large}
        captures = {}
        for name, count in sizes.items():
            create_tables(cluster.dsn, name, count, args.rows)
            captures[name] = Capture(root, cluster.dsn, name, args.profile,
                                     "bench.tuned_definitions" if args.tuned
                                     else "pgcdc_dagster.definitions")
        figures: dict[str, dict[str, tuple[float, float]]] = {}
        for name, capture in captures.items():
            figures[name] = {"initial_snapshot": capture.run("initial_snapshot")}
            snap_events = capture.events()
            for line in capture.output.splitlines():  # when the snapshot's phases ended
                if "snapshot timeline" in line and not args.microbatch_only:
                    print(f"  {name}: " + line.split(" - ")[-1], flush=True)
            if args.checks_only:
                figures[name]["capture_checks (full sweep)"] = capture.run("capture_checks")
                sweep_events = capture.events()
                print(f"  capture_checks events: {sum(sweep_events.values())} "
                      f"({sum(sweep_events.values()) / sizes[name]:.1f} per table): "
                      + ", ".join(f"{k} {v}" for k, v in sorted(sweep_events.items())),
                      flush=True)
                for line in capture.output.splitlines():  # the sweep's seconds per phase
                    if "check evaluations of" in line:
                        print("  " + line.split(" - ")[-1], flush=True)
            elif not args.snapshot_only:
                figures[name]["idle cdc_microbatch"] = capture.run("cdc_microbatch")
                update(cluster.dsn, name, 3, args.updates)
                figures[name][f"cdc_microbatch, {args.updates} updates to 3 tables"] = \
                    capture.run("cdc_microbatch")
                if args.microbatch_only:
                    figures[name].pop("initial_snapshot")
                elif not args.no_checks:
                    figures[name]["capture_checks (full sweep)"] = \
                        capture.run("capture_checks")
            print(f"{name} ({sizes[name]} tables x {args.rows} rows): "
                  + ", ".join(f"{k} {v[0]:.1f}s ({v[1]:.1f} CPU s)"
                              for k, v in figures[name].items()), flush=True)
            if args.microbatch_only:
                continue
            print(f"  initial_snapshot events: {sum(snap_events.values())} "
                  f"({sum(snap_events.values()) / sizes[name]:.1f} per table): "
                  + ", ".join(f"{k} {v}" for k, v in sorted(snap_events.items())), flush=True)
        load = os.getloadavg()[0]
        targets = {"initial_snapshot": 3.0, "capture_checks (full sweep)": None}
        print(f"\nratios, {args.large} tables / {args.small} tables (load {load:.1f}):")
        for job, small in figures["small"].items():
            ratio = figures["large"][job][0] / small[0]
            cpu = figures["large"][job][1] / max(small[1], 1e-9)
            target = targets.get(job, 1.5)
            if target is None:  # this target is in seconds
                print(f"  {job:<45} {ratio:5.2f}  ({figures['large'][job][0]:.1f} s for "
                      f"{args.large} tables; target: seconds, not minutes; CPU seconds "
                      f"{cpu:.2f})")
                continue
            print(f"  {job:<45} {ratio:5.2f}  (target <= {target}"
                  f"{', met' if ratio <= target else ', NOT met'}; CPU seconds {cpu:.2f})")
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
