"""Delta Lake sinks through delta-rs: table layout, idempotent commits, bronze and silver."""
