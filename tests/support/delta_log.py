"""Reading a Delta table's log the way the file-level assertions need it."""

from __future__ import annotations

import json
import os
from typing import Any

from deltalake import DeltaTable


def commit_actions(uri: str, version: int) -> list[dict[str, Any]]:
    """The actions of one commit (its JSON log entry)."""
    path = os.path.join(uri, "_delta_log", f"{version:020d}.json")
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def last_commit_files(uri: str) -> tuple[set[str], set[str]]:
    """Paths the table's last commit removed and added."""
    actions = commit_actions(uri, DeltaTable(uri).version())
    return ({a["remove"]["path"] for a in actions if "remove" in a},
            {a["add"]["path"] for a in actions if "add" in a})
