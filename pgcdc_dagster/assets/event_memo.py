"""Each event serialized once while Dagster stores it (issue 16).

Dagster's SQL event storages (SQLite and PostgreSQL alike) serialize the same event two or
three times while storing it: the event row, then the asset's latest materialization (the
event inside an ``EventLogRecord`` with its new storage id), or a check's execution row
(written as an UPDATE, then as an INSERT when the run planned no such check). The event is
an immutable record and nothing changes it in between, so the text is the same each time.

Within :func:`serialized_once` (around one ``store_event`` call, in the storing thread) the
name ``serialize_value`` that Dagster's ``sql_event_log`` module calls answers for *that*
event from the text serialized the first time, and for ``EventLogRecord(storage_id, event)``
with that text inside the record's; every other value, thread or moment goes to
``dagster_shared``'s own ``serialize_value``. The record's text is composed only after it was
checked, once per process, to equal what ``serialize_value`` makes of it. A materialization
packed ahead by the thread that built it (:mod:`assets.event_prepack`) is serialized from that
packed form.

The module attribute is replaced while any block of :func:`memo_installed` is open (counted
across threads) and put back after the last one, unless someone else replaced it meanwhile.
Dagster names relied on (``dagster`` 1.13.27, pinned; checked before use, and when missing
or different nothing is replaced): ``serialize_value`` of
``dagster._core.storage.event_log.sql_event_log`` being ``dagster_shared.serdes``'s own, and
``EventLogRecord``'s fields ``storage_id`` and ``event_log_entry``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

from dagster._core.event_api import EventLogRecord
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log import sql_event_log
from dagster_shared.serdes import serialize_value as _serialize_value

from pgcdc_dagster.assets import event_prepack

_scope = threading.local()
_install_lock = threading.Lock()
_installed = 0
_record_checked: bool | None = None
"""Whether a record's composed text was found equal to Dagster's (None: not checked yet)."""


def _entry_text(entry: EventLogEntry) -> str:
    text: str | None = getattr(_scope, "text", None)
    if text is None:
        text = event_prepack.entry_text(entry)  # a materialization packed ahead
        if text is None:
            text = _serialize_value(entry)
        _scope.text = text
    return text


def _record_text(storage_id: int, entry_text: str) -> str:
    return ('{"__class__": "EventLogRecord", "event_log_entry": ' + entry_text +
            ', "storage_id": ' + json.dumps(storage_id) + "}")


def _record_composable(record: EventLogRecord, entry_text: str) -> bool:
    global _record_checked
    if _record_checked is None:
        _record_checked = _serialize_value(record) == _record_text(record.storage_id,
                                                                    entry_text)
    return _record_checked


def serialize_value(val: Any, *args: Any, **kwargs: Any) -> str:
    """``dagster_shared.serdes.serialize_value``, with the event being stored (this thread's
    :func:`serialized_once`) serialized once."""
    entry = getattr(_scope, "entry", None)
    if entry is None or args or kwargs:
        return _serialize_value(val, *args, **kwargs)
    if val is entry:
        return _entry_text(entry)
    if type(val) is EventLogRecord and val.event_log_entry is entry and \
            type(val.storage_id) is int:
        text = _entry_text(entry)
        if _record_composable(val, text):
            return _record_text(val.storage_id, text)
    return _serialize_value(val, *args, **kwargs)


@contextlib.contextmanager
def serialized_once(event: EventLogEntry) -> Iterator[None]:
    """Within the block, in this thread, ``event`` is serialized once by Dagster's storage."""
    outer = getattr(_scope, "entry", None), getattr(_scope, "text", None)
    _scope.entry, _scope.text = event, None
    try:
        yield
    finally:
        _scope.entry, _scope.text = outer


def memo_installable() -> bool:
    """Whether Dagster's ``sql_event_log`` calls ``dagster_shared``'s ``serialize_value`` (or
    this module's, installed by another block) and ``EventLogRecord`` has the fields used."""
    fields = getattr(EventLogRecord, "_fields", ())
    current = getattr(sql_event_log, "serialize_value", None)
    return "storage_id" in fields and "event_log_entry" in fields and \
        current in (_serialize_value, serialize_value)


@contextlib.contextmanager
def memo_installed() -> Iterator[bool]:
    """Within the block, Dagster's SQL event storage calls :func:`serialize_value`; yields
    whether it does (False when a name it relies on is not Dagster's own)."""
    global _installed
    with _install_lock:
        if not memo_installable():
            yield_value = False
        else:
            _installed += 1
            setattr(sql_event_log, "serialize_value", serialize_value)  # noqa: B010
            if _installed == 1:
                event_prepack.enable(True)
            yield_value = True
    try:
        yield yield_value
    finally:
        if yield_value:
            with _install_lock:
                _installed -= 1
                if _installed == 0:
                    event_prepack.enable(False)
                if _installed == 0 and \
                        getattr(sql_event_log, "serialize_value", None) is serialize_value:
                    setattr(sql_event_log, "serialize_value", _serialize_value)  # noqa: B010


def store_event_memoized(store: Callable[[EventLogEntry], None]
                         ) -> Callable[[EventLogEntry], None]:
    """``store`` (a storage's ``store_event``) with each event serialized once."""
    def store_event(event: EventLogEntry) -> None:
        with serialized_once(event):
            store(event)
    return store_event
