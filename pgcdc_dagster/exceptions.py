"""Domain errors. Each message names what was expected, what was found and the fix."""

from __future__ import annotations


class PgCdcError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigurationError(PgCdcError):
    """The configuration or the source server setup cannot work; the message says the fix."""


class SourceUnavailableError(PgCdcError):
    """The source PostgreSQL cannot be reached."""


class MissingPrimaryKeyError(ConfigurationError):
    """A captured table has no primary key (and no usable replica identity index)."""


class TableNotFoundError(ConfigurationError):
    """A table named in the include list does not exist in the source."""


class DecodeError(PgCdcError):
    """A pgoutput buffer could not be decoded; names the message type and byte offset."""


class SlotInUseError(PgCdcError):
    """Another process holds the replication slot; retry later."""


class SlotLostError(PgCdcError):
    """The replication slot is missing, lost or invalidated; a re-snapshot is needed."""


class UnsupportedTypeError(PgCdcError):
    """A column type cannot be converted under the configured handling mode."""


class SourceConnectionLostError(SourceUnavailableError):
    """The connection to the source PostgreSQL was lost while reading the slot (a server
    restart or crash, ``pg_terminate_backend``, a network loss); nothing of the window was
    committed and the next run resumes from the slot's position."""


class PublicationMissingError(ConfigurationError):
    """The slot holds changes decoded against a publication that was dropped: PostgreSQL
    cannot decode them with a publication created afterwards; the message names the way out."""


class LakehouseFullError(PgCdcError):
    """The lakehouse's filesystem is full (``No space left on device``); nothing of the
    write was committed, and the run resumes once there is space."""
