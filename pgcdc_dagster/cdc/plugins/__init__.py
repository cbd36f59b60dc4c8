"""Logical decoding plugins other than pgoutput (``plugin.name``, CFG-24, STR-32..35).

``decoderbufs`` (Protobuf rows) and ``wal2json`` (JSON, format version 2) are read through the
same bounded peek windows as pgoutput (``postgres/plugin_peek.py``). Their changes are written
into the pgoutput assembler as the very rows pgoutput's decoder would have parsed
(:mod:`.rows`, with pgoutput's tuple rules from :mod:`.pgwire`), and their Begin / Commit /
Truncate / messages as pgoutput protocol-1 messages, so the window, bronze and silver are
built by exactly the same code for every plugin; only what a plugin cannot carry differs
(``docs/plugins.md``).

Pure: no I/O. The table descriptions (:class:`~.pgwire.TableInfo`) come from the catalog,
read by the caller before the window.
"""

from __future__ import annotations

from pgcdc_dagster.exceptions import ConfigurationError

PGOUTPUT = "pgoutput"
DECODERBUFS = "decoderbufs"
WAL2JSON = "wal2json"
YBOUTPUT = "yboutput"
PLUGINS = (PGOUTPUT, DECODERBUFS, WAL2JSON, YBOUTPUT)
"""``plugin.name`` values this project reads (Debezium's, without the wal2json RDS and
streaming variants, plus YugabyteDB's ``yboutput``, YB-02)."""
PGOUTPUT_WIRE = frozenset({PGOUTPUT, YBOUTPUT})
"""Plugins whose output is pgoutput's protocol, read by ``postgres/peek.py`` directly.
``yboutput`` is YugabyteDB's pgoutput; under its REPLICA IDENTITY CHANGE (Relation
identity ``c``) an update carries the key and the changed columns, the others as ``'u'``
(docs/plugins.md, *YugabyteDB*)."""


def check_plugin(name: str) -> str:
    """``name`` if it is a supported ``plugin.name``.

    Raises:
        ConfigurationError: any other name, naming the supported ones.
    """
    if name not in PLUGINS:
        raise ConfigurationError(
            f"plugin.name = {name!r} is not supported; use one of {', '.join(PLUGINS)} "
            "(PGCDC_PLUGIN_NAME; yboutput only on YugabyteDB)")
    return name
