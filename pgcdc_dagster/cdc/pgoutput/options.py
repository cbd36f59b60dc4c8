"""pgoutput start options and the choice of protocol version.

Protocol versions (PostgreSQL docs, "Logical Streaming Replication Parameters"):

==== ======= =====================================================================
ver  server  adds
==== ======= =====================================================================
1    10+     the baseline: Begin/Commit, Relation, Type, Insert/Update/Delete,
             Truncate (11+), Origin, Message (14+, with ``messages``)
2    14+     streaming of in-progress transactions (``streaming``)
3    15+     two-phase commit (``two_phase``)
4    16+     ``streaming = parallel``: Stream Abort carries abort LSN and time
==== ======= =====================================================================

Decision: request the highest version the server offers (2 on 14, 3 on 15, 4 on 16+), as
Debezium and PostgreSQL's own subscriber do. Message formats do not change between versions
unless a feature is switched on (``streaming``, ``two_phase``), so the same changes decode the
same on every version; a feature the server cannot serve is refused by name. ``binary``
(14+) sends values in the types' send/recv format; the project's type conversion expects
text, so it is off by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pgcdc_dagster.exceptions import ConfigurationError

StreamingMode = Literal["off", "on", "parallel"]

_MIN_SERVER = {1: 100000, 2: 140000, 3: 150000, 4: 160000}


@dataclass(frozen=True, slots=True)
class PgOutputOptions:
    """The options passed to pgoutput when a slot is read."""

    publication_names: tuple[str, ...]
    proto_version: int = 1
    messages: bool = True
    """Send logical decoding messages (``pg_logical_emit_message``)."""
    streaming: StreamingMode = "off"
    """Stream large in-progress transactions instead of spilling them on the server."""
    two_phase: bool = False
    """Decode prepared transactions at PREPARE (the assembler emits them at COMMIT PREPARED)."""
    binary: bool = False
    """Values in binary send format instead of text."""

    def __post_init__(self) -> None:
        if not self.publication_names:
            raise ConfigurationError("pgoutput needs at least one publication name")
        needed = required_proto_version(streaming=self.streaming, two_phase=self.two_phase)
        if self.proto_version < needed:
            raise ConfigurationError(
                f"pgoutput protocol version {self.proto_version} cannot carry the requested "
                f"options (streaming={self.streaming}, two_phase={self.two_phase}); "
                f"use {needed} or later")
        if self.proto_version not in _MIN_SERVER:
            raise ConfigurationError(
                f"unknown pgoutput protocol version {self.proto_version} (known: 1-4)")

    def as_pairs(self) -> list[tuple[str, str]]:
        """Option name/value pairs in the order the slot functions take them."""
        pairs = [
            ("proto_version", str(self.proto_version)),
            ("publication_names", publication_names_value(self.publication_names)),
            ("messages", _bool(self.messages)),
        ]
        if self.binary:
            pairs.append(("binary", "true"))
        if self.streaming != "off":
            pairs.append(("streaming", self.streaming))
        if self.two_phase:
            pairs.append(("two_phase", "true"))
        return pairs


def _bool(value: bool) -> str:
    return "true" if value else "false"


def publication_names_value(names: Sequence[str]) -> str:
    """pgoutput's ``publication_names`` option: the names as an identifier list, each quoted
    unless plain lower case (``SplitIdentifierString`` folds unquoted names to lower case)."""
    return ",".join(_quote_name(n) for n in names)


def _quote_name(name: str) -> str:
    """Quote a publication name for pgoutput's identifier list (``SplitIdentifierString``)."""
    if name and name.islower() and name.replace("_", "").isalnum() and name[0].isalpha():
        return name
    return '"' + name.replace('"', '""') + '"'


def required_proto_version(*, streaming: StreamingMode = "off", two_phase: bool = False) -> int:
    """The lowest protocol version that supports the requested features."""
    if streaming == "parallel":
        return 4
    if two_phase:
        return 3
    if streaming == "on":
        return 2
    return 1


def max_proto_version(server_version_num: int) -> int:
    """The highest pgoutput protocol version a server (``server_version_num``) offers."""
    return max(v for v, minimum in _MIN_SERVER.items() if server_version_num >= minimum)


def choose_options(
    server_version_num: int,
    publication_names: tuple[str, ...] | list[str],
    *,
    messages: bool = True,
    streaming: StreamingMode = "off",
    two_phase: bool = False,
    binary: bool = False,
) -> PgOutputOptions:
    """Build options for a server (``SHOW server_version_num``), checking it can serve them.

    Raises:
        ConfigurationError: the server is too old for a requested feature.
    """
    needed = required_proto_version(streaming=streaming, two_phase=two_phase)
    minimum = max(_MIN_SERVER[needed], 140000 if (binary or messages) else 0)
    if server_version_num < minimum:
        raise ConfigurationError(
            f"PostgreSQL {server_version_num // 10000} cannot serve pgoutput with "
            f"streaming={streaming}, two_phase={two_phase}, messages={messages}, "
            f"binary={binary}: it needs PostgreSQL {minimum // 10000} or later")
    return PgOutputOptions(tuple(publication_names), max_proto_version(server_version_num),
                           messages, streaming, two_phase, binary)
