"""One side of a consistency comparison: row count and order-independent checksums.

Each batch of rows (already cast to the comparison's Arrow schema) is hashed column by
column (:mod:`pgcdc_dagster.cdc.row_hash`): a key hash from the key columns, a row hash from
every column. Rows whose key changed after the compared position are left out by key hash.
While a side holds at most ``keep_limit`` rows, its key and row hashes and its key columns
are kept, so that when the sides differ the differing keys can be named; they are only
turned into Python values for the sample of keys reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pgcdc_dagster.cdc.row_hash import Hashes, checksum, column_hashes, combine

_MASK = (1 << 64) - 1
SAMPLE = 5
"""Keys named per kind of difference."""


@dataclass
class KeptRows:
    """A small side's rows, as key hash, row hash and key values."""

    key_hashes: list[Hashes] = field(default_factory=list)
    row_hashes: list[Hashes] = field(default_factory=list)
    keys: list[pa.Table] = field(default_factory=list)

    def by_key(self) -> tuple[dict[int, int], dict[int, int]]:
        """Row hash and row index per key hash (the last row of a key wins)."""
        keys = np.concatenate(self.key_hashes).tolist() if self.key_hashes else []
        rows = np.concatenate(self.row_hashes).tolist() if self.row_hashes else []
        return dict(zip(keys, rows, strict=True)), {k: i for i, k in enumerate(keys)}

    def names(self, index: dict[int, int], wanted: Sequence[int]) -> list[str]:
        """``repr`` of the key tuples of the ``wanted`` key hashes."""
        if not wanted:
            return []
        table = pa.concat_tables(self.keys)
        taken = table.take(pa.array([index[k] for k in wanted], pa.int64()))
        return [repr(tuple(row)) for row in zip(*(c.to_pylist() for c in taken.columns),
                                                strict=True)]


@dataclass
class Digest:
    """Count and order-independent checksums of one side."""

    rows: int = 0
    key_checksum: int = 0
    row_checksum: int = 0
    excluded: int = 0
    """Rows left out because their key changed after the compared LSN."""
    kept: KeptRows | None = field(default_factory=KeptRows, repr=False)
    """The rows while the side is small enough to name differences (then None)."""

    def add(self, batch: pa.RecordBatch | pa.Table, key_pos: Sequence[int],
            left_out: Hashes, keep_limit: int) -> None:
        """Hash the batch's rows into the checksums, leaving out the keys of ``left_out``
        (sorted key hashes)."""
        columns = [column_hashes(c) for c in batch.columns]
        key_hashes = combine([columns[i] for i in key_pos], batch.num_rows)
        row_hashes = combine(columns, batch.num_rows)
        keys = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        keys = keys.select(list(key_pos))
        if left_out.size:
            keep = ~np.isin(key_hashes, left_out)
            dropped = int(keep.size - keep.sum())
            if dropped:
                self.excluded += dropped
                key_hashes, row_hashes = key_hashes[keep], row_hashes[keep]
                keys = keys.filter(pa.array(keep))
        self.rows += len(key_hashes)
        self.key_checksum = (self.key_checksum + checksum(key_hashes)) & _MASK
        self.row_checksum = (self.row_checksum + checksum(row_hashes)) & _MASK
        if self.kept is not None:
            if self.rows > keep_limit:
                self.kept = None
            else:
                self.kept.key_hashes.append(key_hashes)
                self.kept.row_hashes.append(row_hashes)
                self.kept.keys.append(keys)


def key_hashes(columns: Sequence[pa.Array]) -> Hashes:
    """Key hashes of key values given column by column (as :meth:`Digest.add` hashes them)."""
    return combine([column_hashes(c) for c in columns], len(columns[0]) if columns else 0)


@dataclass(frozen=True)
class Differences:
    """Samples of keys, as ``repr`` of the key tuple, sorted."""

    missing: list[str]
    """In the source, not in silver."""
    extra: list[str]
    """In silver, not in the source."""
    different: list[str]
    """In both, with different rows."""


def differences(source: Digest, silver: Digest) -> Differences:
    """Name the differing keys (empty when a side was too large to keep, or none differ)."""
    if source.kept is None or silver.kept is None or (
            source.rows == silver.rows and source.key_checksum == silver.key_checksum
            and source.row_checksum == silver.row_checksum):
        return Differences([], [], [])
    src, src_index = source.kept.by_key()
    dst, dst_index = silver.kept.by_key()
    missing = [k for k in src if k not in dst]
    extra = [k for k in dst if k not in src]
    different = [k for k, row in src.items() if k in dst and dst[k] != row]
    return Differences(sorted(source.kept.names(src_index, missing))[:SAMPLE],
                       sorted(silver.kept.names(dst_index, extra))[:SAMPLE],
                       sorted(source.kept.names(src_index, different))[:SAMPLE])
