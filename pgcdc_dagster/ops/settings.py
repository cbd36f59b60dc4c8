"""Monitoring settings: schedule interval, lag trigger and check thresholds.

Read from the environment by the Dagster definitions' loader (never at import).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.ops.slot_health import SlotThresholds

ENV = {
    "microbatch_cron": "PGCDC_MICROBATCH_CRON",
    "checks_cron": "PGCDC_CHECKS_CRON",
    "maintenance_cron": "PGCDC_MAINTENANCE_CRON",
    "lag_trigger_bytes": "PGCDC_LAG_TRIGGER_BYTES",
    "retained_trigger_bytes": "PGCDC_RETAINED_TRIGGER_BYTES",
    "lag_trigger_changes": "PGCDC_LAG_TRIGGER_CHANGES",
    "max_lag_bytes": "PGCDC_SLOT_MAX_LAG_BYTES",
    "max_retained_bytes": "PGCDC_SLOT_MAX_RETAINED_BYTES",
    "max_spill_ratio": "PGCDC_SLOT_MAX_SPILL_RATIO",
    "owners": "PGCDC_OWNERS",
    "dead_run_grace_s": "PGCDC_DEAD_RUN_GRACE_SECONDS",
}

_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40}


def parse_bytes(text: str, name: str) -> int:
    """``'64MB'``, ``'1gb'``, ``'1048576'`` -> bytes (binary units, as PostgreSQL's)."""
    raw = text.strip().lower().replace(" ", "")
    digits = raw.rstrip("kmgtb")
    unit = raw[len(digits):]
    if not digits.isdigit() or unit not in _UNITS:
        raise ConfigurationError(
            f"{name} = {text!r} is not a size; write e.g. 67108864, 64MB or 1GB")
    return int(digits) * _UNITS[unit]


@dataclass(frozen=True)
class MonitorSettings:
    """How often to capture, when to capture early, and what counts as unhealthy."""

    microbatch_cron: str = "*/5 * * * *"
    """Cron of the cdc_microbatch schedule (``PGCDC_MICROBATCH_CRON``)."""
    checks_cron: str = "0 3 * * *"
    """Cron of the capture_checks schedule (``PGCDC_CHECKS_CRON``)."""
    maintenance_cron: str = "30 3 * * *"
    """Cron of the silver_maintenance schedule (``PGCDC_MAINTENANCE_CRON``)."""
    lag_trigger_bytes: int = 64 << 20
    """The slot-lag sensor launches cdc_microbatch when the slot's lag (WAL written since its
    confirmed position) reaches this (``PGCDC_LAG_TRIGGER_BYTES``)."""
    retained_trigger_bytes: int = 1 << 30
    """... or when the WAL it retains reaches this (``PGCDC_RETAINED_TRIGGER_BYTES``)."""
    lag_trigger_changes: int = 100_000
    """... or when the slot holds this many row changes (``PGCDC_LAG_TRIGGER_CHANGES``; 0
    turns the count off). Counted on a temporary copy of the slot, never on the slot."""
    slot: SlotThresholds = field(default_factory=SlotThresholds)
    """Limits of the slot_healthy check (``PGCDC_SLOT_MAX_LAG_BYTES``,
    ``PGCDC_SLOT_MAX_RETAINED_BYTES``, ``PGCDC_SLOT_MAX_SPILL_RATIO``)."""
    max_pending_bytes: int = 256 << 20
    """The silver check compares only when the slot is at most this far behind."""
    history_limit: int = 200
    """Bronze commits and capture runs the LSN-window check looks back over."""
    owners: tuple[str, ...] = ("team:pgcdc",)
    """Owners of the assets (``PGCDC_OWNERS``: comma-separated emails or ``team:name``)."""
    dead_run_grace_s: int = 60
    """A capture run that took the slot's lock is dead once nobody holds the lock and the run
    logged nothing for this long (``PGCDC_DEAD_RUN_GRACE_SECONDS``): the schedule and the
    lag sensor then mark it failed and go on (``assets/run_liveness.py``)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> MonitorSettings:
        """Defaults overridden by the ``PGCDC_*`` variables that are set."""
        def get(key: str) -> str | None:
            value = environ.get(ENV[key], "").strip()
            return value or None

        base = cls()
        slot = SlotThresholds(
            max_lag_bytes=_size(get("max_lag_bytes"), ENV["max_lag_bytes"],
                                base.slot.max_lag_bytes),
            max_retained_bytes=_size(get("max_retained_bytes"), ENV["max_retained_bytes"],
                                     base.slot.max_retained_bytes),
            max_spill_ratio=_ratio(get("max_spill_ratio"), ENV["max_spill_ratio"],
                                   base.slot.max_spill_ratio),
        )
        owners = _owners(get("owners"))
        return cls(
            microbatch_cron=get("microbatch_cron") or base.microbatch_cron,
            checks_cron=get("checks_cron") or base.checks_cron,
            maintenance_cron=get("maintenance_cron") or base.maintenance_cron,
            lag_trigger_bytes=_size(get("lag_trigger_bytes"), ENV["lag_trigger_bytes"],
                                    base.lag_trigger_bytes),
            retained_trigger_bytes=_size(get("retained_trigger_bytes"),
                                         ENV["retained_trigger_bytes"],
                                         base.retained_trigger_bytes),
            lag_trigger_changes=_count(get("lag_trigger_changes"),
                                       ENV["lag_trigger_changes"], base.lag_trigger_changes),
            slot=slot,
            dead_run_grace_s=_count(get("dead_run_grace_s"), ENV["dead_run_grace_s"],
                                    base.dead_run_grace_s),
            owners=owners or base.owners,
        )


def _owners(value: str | None) -> tuple[str, ...]:
    """``PGCDC_OWNERS`` as Dagster takes owners: each an e-mail address or ``team:<name>``
    (Dagster's own refusal named an asset, not the variable)."""
    # Dagster's own rule, through its public API (imported here: this module is read without
    # Dagster elsewhere)
    import dagster as dg

    owners = tuple(o.strip() for o in (value or "").split(",") if o.strip())
    for owner in owners:
        try:
            dg.AssetSpec("pgcdc_owner_probe", owners=[owner])
        except dg.DagsterInvalidDefinitionError:
            raise ConfigurationError(
                f"PGCDC_OWNERS: {owner!r} is not an owner; write e-mail addresses or "
                "team:<name>, comma-separated (e.g. team:data,ana@example.com)") from None
    return owners


def _size(value: str | None, name: str, default: int) -> int:
    return default if value is None else parse_bytes(value, name)


def _count(value: str | None, name: str, default: int) -> int:
    if value is None:
        return default
    digits = value.replace("_", "")
    if not digits.isdigit():
        raise ConfigurationError(f"{name} = {value!r} is not a count; write e.g. 100000 "
                                 "(0 turns it off)")
    return int(digits)


def _ratio(value: str | None, name: str, default: float) -> float:
    if value is None:
        return default
    try:
        ratio = float(value)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ConfigurationError(f"{name} = {value!r} is not a ratio between 0 and 1; "
                                 "write e.g. 0.5")
    return ratio
