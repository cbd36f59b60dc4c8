"""The throwaway cluster the whole suite relies on is configured for logical decoding."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_cluster_has_logical_wal_level(pg_conn) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("SHOW wal_level")
        assert cur.fetchone()[0] == "logical"
        cur.execute("SELECT inet_server_addr()::text")
        assert cur.fetchone()[0].startswith("127.0.0.1")
