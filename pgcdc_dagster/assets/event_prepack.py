"""An asset materialization packed for serialization ahead, by the thread that built it
(issue 16).

Most of a materialization's serialization is packing its metadata (a bronze table's: a column
schema and some 35 values, 9 KB of JSON): a walk in Python over every record and value, on
the thread that stores the event, which in a capture run is the op's thread, the run's
critical path. A worker thread that builds an ``AssetMaterialization`` (the capture's
metadata threads) can pack it there with :func:`prepack`; while the event is stored, in a
block of :func:`assets.event_memo.memo_installed`, :func:`entry_text` serializes the event
with that packed form in place of the materialization, so the op's thread only packs the
event's envelope and encodes the JSON.

The text is the one ``dagster_shared.serdes.serialize_value`` makes of the event: both go
through ``_transform_for_serialization``; Dagster's wraps each record lazily
(``_LazySerializationWrapper``, whose items are the record serializer's ``pack_items``) and
the prepacked materialization is the dict ``pack_value`` makes of the same ``pack_items``, in
the same order. It is also checked: the first event composed in the process is serialized
both ways and, should they differ, nothing prepacked is used again (every event goes to
Dagster's ``serialize_value``).

A prepacked form is kept until its event is serialized, or until the last
:func:`assets.event_memo.memo_installed` block ends (an event never logged): at most the
materializations built and not yet stored. :func:`prepack` does nothing outside such a block.
Names of ``dagster_shared.serdes.serdes`` relied on (``dagster`` 1.13.27, pinned; checked
before use, and when missing nothing is prepacked): ``_transform_for_serialization``,
``_LazySerializationWrapper``, ``_WHITELIST_MAP``, ``_root`` and ``pack_value``, and
``dagster_shared.seven.json.dumps`` (what ``serialize_value`` encodes with).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import dagster as dg
import dagster_shared.seven.json as seven_json
from dagster._core.events.log import EventLogEntry
from dagster_shared.serdes import serdes

_lock = threading.Lock()
_packed: dict[int, tuple[dg.AssetMaterialization, Any]] = {}
"""Prepacked materializations by ``id()`` (the object kept: its id is not reused meanwhile)."""
_enabled = False
"""Set while a memo block is open (:func:`enable`)."""
_checked: bool | None = None
"""Whether a composed text was found equal to Dagster's (None: not checked yet)."""

_NAMES = ("_transform_for_serialization", "_LazySerializationWrapper", "_WHITELIST_MAP",
          "_root", "pack_value")


def usable() -> bool:
    """Whether ``dagster_shared``'s serializer has every name this module relies on."""
    return all(hasattr(serdes, name) for name in _NAMES) and \
        callable(getattr(seven_json, "dumps", None)) and \
        isinstance(serdes._LazySerializationWrapper, type)


def enable(on: bool) -> None:
    """Called by :func:`assets.event_memo.memo_installed` (its first block opens, its last
    closes); closing forgets every prepacked form."""
    global _enabled
    with _lock:
        _enabled = on and _checked is not False and usable()
        if not on:
            _packed.clear()


def prepack(event: dg.AssetMaterialization) -> dg.AssetMaterialization:
    """Pack ``event`` for serialization now, in this thread (nothing outside a memo block);
    returns it."""
    if not _enabled:
        return event
    packed = serdes.pack_value(event)
    with _lock:
        if _enabled:
            _packed[id(event)] = (event, packed)
    return event


def _take(materialization: object) -> Any:
    with _lock:
        found = _packed.get(id(materialization))
        if found is None or found[0] is not materialization:
            return None
        del _packed[id(materialization)]
        return found[1]


class _Wrapper(serdes._LazySerializationWrapper):
    """Dagster's lazy record wrapper, handing this composition's handler down."""

    __slots__ = ("_handler",)

    def __init__(self, obj: Any, whitelist_map: Any, descent_path: str,
                 handler: _Handler) -> None:
        super().__init__(obj, whitelist_map, descent_path)
        self._handler = handler

    def items(self) -> Iterator[tuple[str, Any]]:  # type: ignore[override]
        serializer = self._whitelist_map.object_serializers[self._obj.__class__.__name__]
        yield from serializer.pack_items(self._obj, self._whitelist_map, self._handler,
                                         self._descent_path)


class _Handler:
    """The object handler of one composition: the prepacked materialization as packed,
    every other record wrapped as Dagster's ``serialize_value`` wraps it."""

    def __init__(self, materialization: object, packed: Any) -> None:
        self._materialization = materialization
        self._packed = packed

    def __call__(self, obj: Any, whitelist_map: Any, descent_path: str) -> Any:
        if obj is self._materialization:
            return self._packed
        return _Wrapper(obj, whitelist_map, descent_path, self)


def entry_text(entry: EventLogEntry) -> str | None:
    """The serialized text of ``entry`` when its materialization was prepacked (None: it was
    not, or prepacked forms are not used)."""
    if not _enabled or not _packed:
        return None
    event = entry.dagster_event
    if event is None or event.event_type != dg.DagsterEventType.ASSET_MATERIALIZATION:
        return None
    materialization = event.step_materialization_data.materialization
    packed = _take(materialization)
    if packed is None:
        return None
    text: str = seven_json.dumps(serdes._transform_for_serialization(
        entry, whitelist_map=serdes._WHITELIST_MAP,
        object_handler=_Handler(materialization, packed), descent_path=serdes._root(entry)))
    return text if _equal_once(entry, text) else None


def _equal_once(entry: EventLogEntry, text: str) -> bool:
    global _checked, _enabled
    if _checked is None:
        _checked = text == serdes.serialize_value(entry)
        if not _checked:
            with _lock:
                _enabled = False
                _packed.clear()
    return _checked
