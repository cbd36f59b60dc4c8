"""Where the Delta tables live: ``<lakehouse>/<layer>/<schema>/<table>``, names escaped.

Source names are data: a schema or table may be named ``..``, ``a/b`` or
``_pgcdc``. Each name becomes one path segment through :func:`encode_segment`, an injective
mapping whose inverse is :func:`decode_segment`:

* kept as they are: ASCII letters and digits, ``_``, ``-``, ``$``, a ``.`` that is neither
  the first nor the last character, and non-ASCII letters, marks, digits, punctuation and
  symbols (Unicode categories L, M, N, P, S). So every ordinary name (``public/orders``,
  mixed case, digits, underscores, hyphens, ``v1.2``) keeps the path it always had;
* every other character, each byte of its UTF-8 encoding, is written ``~XX`` (``XX`` the
  byte in upper-case hex): ``/`` -> ``~2F``, ``\\`` -> ``~5C``, a leading or trailing
  ``.`` -> ``~2E`` (so ``..`` -> ``~2E~2E``), space -> ``~20``, ``%`` -> ``~25``, ``~``
  itself -> ``~7E``, control characters, quotes, and the characters Spark's path globbing
  (``*?[]{}``), URL parsing (``#?%``), delta-rs (which decodes ``%XX`` in a local path and
  cannot open ``[]^|``) or an object store would misread;
* the empty name (PostgreSQL has none) is ``~``.

``~`` rather than ``%`` escapes because delta-rs percent-decodes table paths (a directory
``a%2Fb`` would be opened as ``a/b``). A PostgreSQL name is at most 63 bytes, so a segment is
at most 189 bytes (file systems allow 255).

The project's own tables live under ``bronze/_pgcdc/`` (schema history, messages,
transactions) and ``<lakehouse>/_pgcdc/<slot>/`` (snapshot progress, capture set,
incremental progress); the commit-safety probe of an object store writes under
``<lakehouse>/_pgcdc/~commit_probe/``, which no slot's directory can be. No source table
can land there: a source schema whose name is ``_pgcdc`` in any letter case is written with
its ``_`` escaped (``~5Fpgcdc``), and every other name maps to a segment other than
``_pgcdc`` (a segment with an escape holds ``~``).
Names differing only in letter case stay distinct paths; on a case-insensitive file system
(macOS, Windows defaults) they would share a directory, as they always did.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ESCAPE = "~"
INTERNAL = "_pgcdc"
"""The segment of the project's own tables (``bronze/_pgcdc``, ``<lakehouse>/_pgcdc``)."""
_PLAIN_ASCII = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-$")
_ESCAPED = re.compile(r"~([0-9A-F]{2})")


def _is_uri(root: str) -> bool:
    return "://" in root and not root.startswith("file://")


def normalise_root(root: str) -> str:
    """Absolute local path, or the URI unchanged for object stores."""
    if root.startswith("file://"):
        root = root[len("file://"):]
    if _is_uri(root):
        return root.rstrip("/")
    return str(Path(root).expanduser().resolve())


def _kept(char: str, first: bool, last: bool, escape_dots: bool) -> bool:
    if char in _PLAIN_ASCII:
        return True
    if char == ".":
        return not (first or last or escape_dots)
    return ord(char) > 127 and unicodedata.category(char)[0] in "LMNPS"


def encode_segment(name: str, *, escape_dots: bool = False) -> str:
    """One name as one path segment (see the module docstring); ``escape_dots`` escapes
    every ``.`` (for file names that join names with dots)."""
    if not name:
        return ESCAPE
    out = []
    end = len(name) - 1
    for i, char in enumerate(name):
        if _kept(char, i == 0, i == end, escape_dots):
            out.append(char)
        else:
            out.extend(f"{ESCAPE}{b:02X}" for b in char.encode("utf-8", "surrogatepass"))
    return "".join(out)


def decode_segment(segment: str) -> str:
    """The name :func:`encode_segment` made ``segment`` from (its inverse).

    Raises:
        ValueError: ``segment`` is not an output of :func:`encode_segment`.
    """
    if segment == ESCAPE:
        return ""
    raw = bytearray()
    i = 0
    while i < len(segment):
        match = _ESCAPED.match(segment, i)
        if match is not None:
            raw.append(int(match.group(1), 16))
            i = match.end()
        elif segment[i] == ESCAPE:
            raise ValueError(f"not an encoded name segment: {segment!r}")
        else:
            raw.extend(segment[i].encode("utf-8"))
            i += 1
    return raw.decode("utf-8", "surrogatepass")


def table_segments(schema: str, table: str) -> tuple[str, str]:
    """The two path segments of a source table (``_pgcdc``, any case, stays ours)."""
    first = encode_segment(schema)
    if first.lower() == INTERNAL:
        first = f"{ESCAPE}{ord(first[0]):02X}{first[1:]}"
    return first, encode_segment(table)


def table_names(schema_segment: str, table_segment: str) -> tuple[str, str]:
    """The ``(schema, table)`` whose :func:`table_segments` are the given ones.

    Raises:
        ValueError: no source table maps to these segments (``_pgcdc`` is the project's).
    """
    names = decode_segment(schema_segment), decode_segment(table_segment)
    if table_segments(*names) != (schema_segment, table_segment):
        raise ValueError(f"no source table is stored at {schema_segment}/{table_segment}")
    return names


def table_uri(root: str, layer: str, schema: str, table: str) -> str:
    """URI of one source table's Delta table, e.g. ``/lake/bronze/public/orders``."""
    first, second = table_segments(schema, table)
    return f"{normalise_root(root)}/{layer}/{first}/{second}"


def internal_uri(root: str, name: str) -> str:
    """URI of one of the project's capture-wide bronze tables, ``bronze/_pgcdc/<name>``
    (``schema_history``, ``messages``, ``transactions``)."""
    return f"{normalise_root(root)}/bronze/{INTERNAL}/{name}"


def slot_root(root: str, slot: str) -> str:
    """``<lakehouse>/_pgcdc/<slot>``: the per-capture state (a slot name, lower-case
    letters, digits and ``_``, is its own segment)."""
    return f"{normalise_root(root)}/{INTERNAL}/{encode_segment(slot)}"


PROBE_SEGMENT = f"{ESCAPE}commit_probe"
"""The commit-safety probe's segment under ``_pgcdc``: it starts with ``~``, which no
:func:`slot_root` segment does (an encoded name starts with ``~`` only when its first
character is escaped, and a slot name's characters never are), so the probe and a slot
named ``commit_probe`` stay apart."""


def probe_prefix(root: str) -> str:
    """``<lakehouse>/_pgcdc/~commit_probe``: where the commit-safety probe writes."""
    return f"{normalise_root(root)}/{INTERNAL}/{PROBE_SEGMENT}"


def is_local(uri: str) -> bool:
    """True for a local filesystem path."""
    return not _is_uri(uri)
