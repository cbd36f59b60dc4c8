"""Bounded buffers for transactions that cannot be emitted yet (streamed or prepared).

A streamed (in-progress) transaction arrives in Stream Start / Stream Stop blocks and may be
gigabytes long; it can only be emitted at Stream Commit. Its raw messages are kept as
``(lsn, message bytes)`` pairs; when the buffered bytes of all open transactions exceed the
budget, the largest buffer is appended to an anonymous temporary file as one marshalled
chunk, and read back chunk by chunk on replay. Memory therefore stays near the budget
whatever the transaction size.

This is the only module under ``cdc/`` that touches the file system, and only through
:func:`tempfile.TemporaryFile` (unlinked on creation, removed by the OS on close).
"""

from __future__ import annotations

import marshal
import tempfile
from collections.abc import Iterator
from typing import IO

Item = tuple[int, bytes]
"""(LSN of the record, raw pgoutput message)."""

_ITEM_OVERHEAD = 120
"""Approximate bytes of Python objects per buffered item on top of the payload."""


class SpillBudget:
    """Shared memory budget of all open transaction buffers of one assembler."""

    def __init__(self, limit_bytes: int, directory: str | None = None) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"spill budget must be positive, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self.directory = directory
        self.in_memory = 0
        self.spilled_bytes = 0
        """Total payload bytes written to temporary files (for metrics and tests)."""
        self._buffers: set[TxnBuffer] = set()

    def new_buffer(self) -> TxnBuffer:
        """Create a buffer that counts against this budget."""
        buffer = TxnBuffer(self)
        self._buffers.add(buffer)
        return buffer

    def _grew(self) -> None:
        while self.in_memory > self.limit_bytes and self._buffers:
            largest = max(self._buffers, key=lambda b: b.in_memory)
            if largest.in_memory == 0:
                return
            largest.spill()

    def _forget(self, buffer: TxnBuffer) -> None:
        self._buffers.discard(buffer)


class TxnBuffer:
    """Append-only list of :data:`Item` that spills to a temporary file under pressure."""

    __slots__ = ("_budget", "_chunks", "_file", "_items", "count", "in_memory")

    def __init__(self, budget: SpillBudget) -> None:
        self._budget = budget
        self._items: list[Item] = []
        self._file: IO[bytes] | None = None
        self._chunks = 0
        self.in_memory = 0
        self.count = 0

    @property
    def spilled(self) -> bool:
        """Some items live in the temporary file."""
        return self._chunks > 0

    def append(self, lsn: int, message: bytes) -> None:
        """Buffer one message; may spill this or another buffer to disk."""
        self._items.append((int(lsn), message))
        self.count += 1
        size = len(message) + _ITEM_OVERHEAD
        self.in_memory += size
        budget = self._budget
        budget.in_memory += size
        if budget.in_memory > budget.limit_bytes:
            budget._grew()

    def spill(self) -> None:
        """Write the in-memory items to the temporary file as one chunk."""
        if not self._items:
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="pgcdc-spill-", dir=self._budget.directory)
        marshal.dump(self._items, self._file)
        self._chunks += 1
        self._budget.spilled_bytes += self.in_memory
        self._budget.in_memory -= self.in_memory
        self._items = []
        self.in_memory = 0

    def __iter__(self) -> Iterator[Item]:
        """Yield every item in append order (spilled chunks first, one chunk in memory)."""
        if self._file is not None:
            self._file.flush()
            self._file.seek(0)
            for _ in range(self._chunks):
                chunk: list[Item] = marshal.load(self._file)
                yield from chunk
            self._file.seek(0, 2)
        yield from self._items

    def close(self) -> None:
        """Release memory and the temporary file; the buffer is unusable afterwards."""
        self._budget.in_memory -= self.in_memory
        self._budget._forget(self)
        self._items = []
        self.in_memory = 0
        if self._file is not None:
            self._file.close()
            self._file = None
