"""Which job a process was started to execute, read from its command line.

A process started for one run (``dagster job execute -j NAME``, or the run worker Dagster's
daemon or UI launches: ``dagster api execute_run``) builds that job's definitions only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence


def _job_names(value: object) -> Iterator[str]:
    """``job_name``/``pipeline_name`` values anywhere in a decoded JSON document."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("job_name", "pipeline_name") and isinstance(item, str):
                yield item
            else:
                yield from _job_names(item)
    elif isinstance(value, list):
        for item in value:
            yield from _job_names(item)


def job_of_process(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """The job this process was started to execute, when its command line says so:
    ``dagster job execute ... -j NAME`` (``--job NAME``, ``--job=NAME``), or a run worker
    ``dagster api execute_run`` (the run's arguments as JSON, on the command line or in
    ``DAGSTER_EXECUTE_RUN_ARGS``). None otherwise (a code server, the webserver, a test)."""
    args = list(argv[1:])
    if args[:2] == ["job", "execute"]:
        for i, arg in enumerate(args):
            if arg in ("-j", "--job") and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith("--job="):
                return arg.split("=", 1)[1]
        return None
    if args[:2] == ["api", "execute_run"]:
        documents = [a for a in args[2:] if a.startswith("{")]
        documents += [environ.get("DAGSTER_EXECUTE_RUN_ARGS", "")]
        for document in documents:
            try:
                names = set(_job_names(json.loads(document)))
            except ValueError:
                continue
            if len(names) == 1:
                return names.pop()
    return None
