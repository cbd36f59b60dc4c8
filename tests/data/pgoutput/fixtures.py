"""Load the recorded pgoutput fixtures (``<scenario>.json``, written by record_fixtures.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Recorded:
    """One recorded scenario: pgoutput options and the slot rows (lsn, xid, message bytes)."""

    name: str
    options: dict[str, str]
    rows: tuple[tuple[int, int, bytes], ...]
    copy: bytes | None
    server_version_num: int

    def payloads(self) -> list[bytes]:
        return [data for _, _, data in self.rows]

    def items(self) -> list[tuple[int, bytes]]:
        return [(lsn, data) for lsn, _, data in self.rows]


def _lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


@cache
def load(name: str) -> Recorded:
    doc = json.loads((HERE / f"{name}.json").read_text())
    rows = tuple((_lsn(r["lsn"]), r["xid"], bytes.fromhex(r["hex"])) for r in doc["rows"])
    copy = bytes.fromhex(doc["copy_hex"]) if doc.get("copy_hex") else None
    return Recorded(name, doc["options"], rows, copy, doc["server_version_num"])


def scenario_names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.json") if p.stem != "copy_binary")


def copy_binary() -> dict[str, object]:
    return json.loads((HERE / "copy_binary.json").read_text())  # type: ignore[no-any-return]


def flatten(window: object) -> list[dict[str, object]]:
    """Every event of a Window as a dict, in commit order (then order within the transaction).

    Also checks the columnar invariant: all lists of a segment have the segment's length.
    """
    from pgcdc_dagster.cdc.changes import Window

    assert isinstance(window, Window)
    events: list[dict[str, object]] = []
    for seg in window.segments():
        n = len(seg)
        assert n > 0, f"empty segment for {seg.relation.qualified}"
        for attr in ("commit_lsn", "lsn", "xid", "commit_ts_us", "total_order",
                     "collection_order", "before", "before_key_only", "after",
                     "truncate_options"):
            assert len(getattr(seg, attr)) == n, (seg.relation.qualified, attr)
        for i in range(n):
            events.append({
                "table": seg.relation.qualified, "op": seg.op[i], "commit_lsn": seg.commit_lsn[i],
                "lsn": seg.lsn[i], "xid": seg.xid[i], "ts": seg.commit_ts_us[i],
                "total_order": seg.total_order[i], "collection_order": seg.collection_order[i],
                "before": seg.before[i], "key_only": seg.before_key_only[i],
                "after": seg.after[i], "truncate_options": seg.truncate_options[i],
                "columns": tuple(c.name for c in seg.relation.columns)})
    for msg in window.messages:
        events.append({"table": None, "op": "m", "commit_lsn": msg.commit_lsn, "lsn": msg.lsn,
                       "xid": msg.xid, "ts": msg.commit_ts_us, "total_order": msg.total_order,
                       "prefix": msg.prefix, "content": msg.content,
                       "transactional": msg.transactional})
    events.sort(key=lambda e: (e["commit_lsn"], e["total_order"]))
    return events
