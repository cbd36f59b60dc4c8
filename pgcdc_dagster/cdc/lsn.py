"""Log sequence numbers: a 64-bit WAL position printed as ``X/Y`` (two hex halves)."""

from __future__ import annotations

import re

_LSN_RE = re.compile(r"^\s*([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})\s*$")


class Lsn(int):
    """A PostgreSQL LSN. Behaves as an unsigned 64-bit int; ``str()`` prints ``X/Y``."""

    __slots__ = ()

    def __new__(cls, value: int | str) -> Lsn:
        if isinstance(value, str):
            return cls.parse(value)
        if value < 0 or value >= 1 << 64:
            raise ValueError(f"LSN out of range: {value}")
        return super().__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """Parse ``'16/B374D848'``; raise ValueError naming the bad text."""
        match = _LSN_RE.match(text)
        if match is None:
            raise ValueError(f"not an LSN (expected 'X/Y' in hex): {text!r}")
        return cls((int(match.group(1), 16) << 32) | int(match.group(2), 16))

    def __str__(self) -> str:
        return f"{int(self) >> 32:X}/{int(self) & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"


ZERO = Lsn(0)
