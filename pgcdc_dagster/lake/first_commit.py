"""A new local Delta table's first commit (version 0), written without delta-rs's create.

delta-rs's create lists the log to see whether a table exists, commits, then loads the new
table back (about 2-3 ms of CPU per table, two tables per captured table in a
snapshot, all in the driver process). For a brand-new table on local storage the commit is one
JSON file; :func:`write_first_commit` writes the actions delta-rs's create would write (the
same protocol, metadata, add actions with their statistics, app transactions and commit info),
atomically and only if absent (a hard link of a temporary file, as delta-rs's local store
commits), and loads nothing back.

The protocol is derived as delta-rs's create derives it for a table without configuration:
reader 1 / writer 2, or reader 3 / writer 7 with the ``timestampNtz`` feature when a column
holds ``timestamp_ntz`` (at the top level, in a struct or in an array, where delta-rs looks).
A schema this module cannot decide exactly (``timestamp_ntz`` only inside a map, or a column
carrying Delta's own ``delta.*`` metadata: invariants, generated or identity columns, column
mapping) is not hand-written: :func:`first_protocol` returns None and the caller lets delta-rs
create the table. Object stores always go through delta-rs (``lake/commit_safety.py``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import deltalake

LOG_DIR = "_delta_log"
TEMP_PREFIX = "_commit_"
"""Temporary commit files (``_commit_<uuid>.json.tmp``, as delta-rs names them)."""
_ENGINE = f"delta-rs:py-{deltalake.__version__}"
_CLIENT = f"delta-rs.py-{deltalake.__version__}"
NTZ_FEATURE = "timestampNtz"


def first_protocol(schema_json: str) -> dict[str, Any] | None:
    """The protocol action delta-rs's create writes for a table of this Delta schema (no
    table configuration), or None when this module does not decide it (see the module
    docstring)."""
    fields = json.loads(schema_json)["fields"]
    found = _Scan()
    for field in fields:
        found.field(field, reached=True)
    if found.delta_metadata or found.ntz_unreached:
        return None
    if found.ntz_reached:
        return {"minReaderVersion": 3, "minWriterVersion": 7,
                "readerFeatures": [NTZ_FEATURE], "writerFeatures": [NTZ_FEATURE]}
    return {"minReaderVersion": 1, "minWriterVersion": 2}


class _Scan:
    """What a schema holds that changes the protocol."""

    def __init__(self) -> None:
        self.ntz_reached = False
        """A ``timestamp_ntz`` where delta-rs's create looks for one (top level, struct
        fields, array elements)."""
        self.ntz_unreached = False
        """A ``timestamp_ntz`` only a map reaches."""
        self.delta_metadata = False

    def field(self, field: Mapping[str, Any], reached: bool) -> None:
        if any(str(k).startswith("delta.") for k in field.get("metadata") or {}):
            self.delta_metadata = True
        self.type(field["type"], reached)

    def type(self, dtype: Any, reached: bool) -> None:
        if dtype == "timestamp_ntz":
            if reached:
                self.ntz_reached = True
            else:
                self.ntz_unreached = True
        elif isinstance(dtype, dict):
            kind = dtype.get("type")
            if kind == "struct":
                for field in dtype["fields"]:
                    self.field(field, reached)
            elif kind == "array":
                self.type(dtype["elementType"], reached)
            elif kind == "map":
                self.type(dtype["keyType"], False)
                self.type(dtype["valueType"], False)


def location_url(path: str) -> str:
    """The ``file://`` URL delta-rs records as a local table's location: the real path,
    percent-encoded as the ``url`` crate encodes a directory path's segments."""
    real = os.path.realpath(path)
    return "file://" + "".join(_url_char(c) for c in real).rstrip("/") + "/"


_ENCODED = frozenset(' "#<>?`{}%\x7f')


def _url_char(char: str) -> str:
    if char in _ENCODED or ord(char) < 0x20 or ord(char) > 0x7f:
        return "".join(f"%{b:02X}" for b in char.encode("utf-8", "surrogatepass"))
    return char


class TableExists(Exception):
    """A table (or the start of one) is already at the location: commit the usual way."""


def write_first_commit(path: str, schema_json: str, protocol: Mapping[str, Any],
                       adds: Sequence[tuple[str, int, str]],
                       app_transactions: Sequence[tuple[str, int]],
                       custom_metadata: Mapping[str, Any]) -> None:
    """Create the table at local ``path`` (its directory exists) with version 0 holding
    ``adds`` (``(relative path, size, stats JSON)``), the app transactions and the commit's
    custom metadata.

    Raises:
        TableExists: the log already holds a commit or a checkpoint (or another writer
            created version 0 first); nothing was written.
    """
    log = os.path.join(path, LOG_DIR)
    try:
        os.mkdir(log)  # a new log: nothing to look at (the usual case, one call)
    except FileExistsError:
        if any(not name.startswith(TEMP_PREFIX) for name in os.listdir(log)):
            raise TableExists(path) from None
    except FileNotFoundError:  # no table directory yet (a table without files)
        os.makedirs(log, exist_ok=True)
    now = int(time.time() * 1000)
    metadata: dict[str, Any] = {
        "id": str(uuid.uuid4()), "name": None, "description": None,
        "format": {"provider": "parquet", "options": {}}, "schemaString": schema_json,
        "partitionColumns": [], "createdTime": now, "configuration": {}}
    info: dict[str, Any] = {
        "timestamp": now, "operation": "CREATE TABLE",
        "operationParameters": {"mode": "ErrorIfExists", "location": location_url(path),
                                "protocol": _dumps(protocol), "metadata": _dumps(metadata)},
        "engineInfo": _ENGINE, "clientVersion": _CLIENT, **custom_metadata}
    lines = [{"commitInfo": info}, {"protocol": protocol}, {"metaData": metadata}]
    lines.extend({"add": {"path": p, "partitionValues": {}, "size": size,
                          "modificationTime": now, "dataChange": True, "stats": stats,
                          "tags": None, "baseRowId": None, "defaultRowCommitVersion": None,
                          "clusteringProvider": None}}
                 for p, size, stats in adds)
    lines.extend({"txn": {"appId": app, "version": version}} for app, version in app_transactions)
    temp = os.path.join(log, f"{TEMP_PREFIX}{uuid.uuid4()}.json.tmp")
    with open(temp, "w", encoding="utf-8") as fh:
        fh.write("".join(_dumps(line) + "\n" for line in lines))
    try:
        os.link(temp, os.path.join(log, f"{0:020d}.json"))  # put if absent
    except FileExistsError:
        raise TableExists(path) from None
    finally:
        os.unlink(temp)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
