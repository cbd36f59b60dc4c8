"""pgoutput payloads recorded from a real PostgreSQL server (see record_fixtures.py)."""
