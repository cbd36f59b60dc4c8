"""Take docs/asset-graph.png from the running Dagster UI with headless Chromium.

    .venv/bin/python scripts/screenshot.py [--out docs/asset-graph.png] [--no-materialize]

Starts a throwaway PostgreSQL (LocalCluster) with a small schema, a DAGSTER_HOME of its own
(telemetry off), optionally runs ``initial_snapshot`` once in process so the graph shows
materialized assets, starts ``dagster-webserver`` on 127.0.0.1 (``env --default-signal=INT``,
see reference/environment.md), waits until it lists the assets over GraphQL, points headless
Chromium at the global asset graph, and stops everything by its own PID. Needs Debian's
``chromium`` (``apt-get install chromium``). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.local_cluster import LocalCluster, free_port

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = """
CREATE SCHEMA shop;
CREATE TABLE shop.customers (id bigint PRIMARY KEY, name text NOT NULL, email text);
CREATE TABLE shop.orders (id bigint PRIMARY KEY, customer_id bigint REFERENCES shop.customers,
                          total numeric(12,2), placed_at timestamptz DEFAULT now());
CREATE TABLE shop.order_items (order_id bigint, line int, sku text, qty int,
                               PRIMARY KEY (order_id, line));
INSERT INTO shop.customers SELECT g, 'customer ' || g, 'c' || g || '@example.com'
  FROM generate_series(1, 500) g;
INSERT INTO shop.orders SELECT g, 1 + g % 500, g * 1.25, now() FROM generate_series(1, 2000) g;
INSERT INTO shop.order_items SELECT 1 + g % 2000, g, 'sku-' || (g % 40), 1 + g % 3
  FROM generate_series(1, 4000) g;
"""
ASSETS = "{ assetNodes { assetKey { path } } }"
READY_TIMEOUT_S = 180
SLOT = "pgcdc_screenshot"
GROUPS = ("source", "bronze", "incremental", "silver")
"""Asset groups shown expanded (the UI's ``expanded`` query parameter: global group ids)."""


def log(message: str) -> None:
    print(f"[screenshot] {message}", flush=True)


def graphql(url: str, query: str) -> dict[str, object]:
    request = urllib.request.Request(
        f"{url}/graphql", data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def wait_for_assets(url: str, proc: subprocess.Popen[bytes]) -> int:
    """Wait until the webserver lists the asset nodes; return how many."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dagster-webserver exited with {proc.returncode}")
        try:
            data = graphql(url, ASSETS).get("data")
            nodes = data.get("assetNodes") if isinstance(data, dict) else None
            if nodes:
                return len(nodes)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"dagster-webserver did not list assets within {READY_TIMEOUT_S}s")


def stop(proc: subprocess.Popen[bytes], name: str) -> None:
    """SIGINT to the process's own PID; SIGKILL to its group only if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log(f"{name} ignored SIGINT for 30 s: killing its process group")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return
    os.killpg(proc.pid, signal.SIGKILL)  # a child (code server) outlived the webserver


def materialize(env: dict[str, str], log_file: Path) -> None:
    """Run initial_snapshot once, in a child process using the same DAGSTER_HOME."""
    code = (
        "import dagster as dg\n"
        "from pgcdc_dagster.definitions import defs\n"
        "d = defs() if callable(defs) else defs\n"
        "with dg.DagsterInstance.get() as instance:\n"
        "    r = d.resolve_job_def('initial_snapshot').execute_in_process(instance=instance)\n"
        "    assert r.success\n")
    with log_file.open("wb") as out:
        subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True,
                       stdout=out, stderr=subprocess.STDOUT)


def screenshot(url: str, out: Path, work: Path, width: int, height: int) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise RuntimeError("chromium is not installed: apt-get install chromium")
    profile = work / "chromium-profile"
    shot = work / "shot.png"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}",
           f"--window-size={width},{height}", "--virtual-time-budget=25000",
           f"--screenshot={shot}", url]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=120)
    finally:
        stop(proc, "chromium")
    if not shot.exists() or shot.stat().st_size == 0:
        raise RuntimeError("chromium wrote no screenshot")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "asset-graph.png")
    parser.add_argument("--no-materialize", action="store_true",
                        help="skip the initial_snapshot run (the graph shows no status)")
    parser.add_argument("--width", type=int, default=1900)
    parser.add_argument("--height", type=int, default=2300)
    parser.add_argument("--path", default="/asset-groups?expanded=" + ",".join(
        f"global@global:{g}" for g in GROUPS),
                        help="UI page to capture (default: the global asset graph, every "
                        "group expanded)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="pgcdc-screenshot-"))
    home = work / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nnux:\n  enabled: false\n"
        "run_coordinator:\n  module: dagster._core.run_coordinator\n"
        "  class: DefaultRunCoordinator\n")
    cluster = LocalCluster(work / "pg").start()
    server: subprocess.Popen[bytes] | None = None
    try:
        with connection(cluster.dsn) as conn, conn.cursor() as cur:
            cur.execute(SCHEMA)
        env = dict(os.environ)
        env.update({
            "DAGSTER_HOME": str(home), "PGCDC_PG_DSN": cluster.dsn,
            "PGCDC_TABLES": "shop\\..*", "PGCDC_LAKEHOUSE": str(work / "lakehouse"),
            "PGCDC_SLOT": SLOT, "PGCDC_PUBLICATION": SLOT,
            "PYSPARK_PYTHON": env.get("PYSPARK_PYTHON", sys.executable),
            "SPARK_LOCAL_IP": "127.0.0.1",
        })
        if not args.no_materialize:
            log("running initial_snapshot once (local Spark)")
            materialize(env, work / "initial_snapshot.log")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        webserver = Path(sys.executable).parent / "dagster-webserver"
        server_log = (work / "webserver.log").open("wb")
        server = subprocess.Popen(
            ["env", "--default-signal=INT", str(webserver), "-w", str(ROOT / "workspace.yaml"),
             "-h", "127.0.0.1", "-p", str(port)],
            cwd=ROOT, env=env, stdout=server_log, stderr=subprocess.STDOUT,
            start_new_session=True)
        log(f"dagster-webserver pid {server.pid} on {url}")
        count = wait_for_assets(url, server)
        log(f"{count} asset nodes listed; capturing {url}{args.path}")
        screenshot(f"{url}{args.path}", args.out, work, args.width, args.height)
        log(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    finally:
        if server is not None:
            stop(server, "dagster-webserver")
            log(f"dagster-webserver pid {server.pid} stopped")
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
