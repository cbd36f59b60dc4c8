"""Safe Delta commits on object storage.

A store that ignores conditional writes (moto behind a front that drops ``If-None-Match``)
is refused before anything is written, with an error naming the way to opt in; the opt-in
and a store that honours conditional writes commit; concurrent writers on the safe store
never overwrite each other's commit.
"""

from __future__ import annotations

import threading
import uuid

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.lake import commit_safety
from pgcdc_dagster.lake.commit_safety import UNSAFE_OPT_IN, UnsafeCommitError
from pgcdc_dagster.lake.delta import append_arrow, ensure_table, open_table
from pgcdc_dagster.lake.paths import probe_prefix, slot_root
from pgcdc_dagster.lake.storage import register, storage_options
from tests.support import s3_server
from tests.support.s3_server import SECRET_KEY

pytestmark = [pytest.mark.integration]
SCHEMA = pa.schema([pa.field("id", pa.int64())])


@pytest.fixture(scope="module")
def careless_store():
    """A second server that ignores If-None-Match, like a store without conditional writes."""
    careless = s3_server.start(honour_conditional_writes=False)
    yield careless
    careless.stop()


def _point_at(monkeypatch, server, bucket: str) -> str:
    server.create_bucket(bucket)
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    commit_safety.forget_checks()
    return f"s3://{bucket}/lakehouse"


def test_store_without_conditional_writes_is_refused_unless_opted_in(careless_store,
                                                                     monkeypatch) -> None:
    lake = _point_at(monkeypatch, careless_store, f"careless-{uuid.uuid4().hex[:8]}")
    uri = f"{lake}/bronze/public/t"
    with pytest.raises(UnsafeCommitError) as caught:
        ensure_table(uri, SCHEMA)
    message = str(caught.value)
    assert UNSAFE_OPT_IN in message and "conditional" in message
    assert SECRET_KEY not in message
    assert open_table(uri) is None  # refused before anything was committed
    with pytest.raises(UnsafeCommitError):  # every writer entry point is guarded
        append_arrow(uri, pa.table({"id": [1]}), app_id="a", version=1)

    monkeypatch.setenv(UNSAFE_OPT_IN, "true")  # the documented opt-in: a single writer
    commit_safety.forget_checks()
    append_arrow(uri, pa.table({"id": [1]}), app_id="a", version=1)
    assert open_table(uri).to_pyarrow_table().num_rows == 1
    commit_safety.forget_checks()


def test_disabled_conditional_put_is_refused(s3_lakehouse, monkeypatch) -> None:
    monkeypatch.setenv("AWS_CONDITIONAL_PUT", "disabled")
    with pytest.raises(UnsafeCommitError, match="AWS_CONDITIONAL_PUT=disabled"):
        ensure_table(f"{s3_lakehouse}/bronze/public/t", SCHEMA)


def test_concurrent_commits_on_a_safe_store_never_overwrite(s3_lakehouse) -> None:
    uri = f"{s3_lakehouse}/bronze/public/race"
    ensure_table(uri, SCHEMA)
    writers = 4
    start = threading.Barrier(writers)
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            start.wait()
            append_arrow(uri, pa.table({"id": [i] * 10}), app_id=f"w{i}", version=i + 1)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    table = DeltaTable(uri, storage_options=storage_options(uri))
    assert table.version() == writers  # one version each, none written twice
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == \
        sorted(i for i in range(writers) for _ in range(10))
    assert {f"w{i}": table.transaction_version(f"w{i}") for i in range(writers)} == \
        {f"w{i}": i + 1 for i in range(writers)}


def test_resource_fields_reach_delta_rs_and_pyarrow(s3_server, monkeypatch) -> None:
    """No AWS variable set: the lakehouse resource's fields alone reach the bucket."""
    from pgcdc_dagster.capture.incremental_state import ProgressStore, TableProgress
    from pgcdc_dagster.resources import LakehouseResource

    bucket = f"fields-{uuid.uuid4().hex[:8]}"
    s3_server.create_bucket(bucket)
    for key in s3_server.env():
        monkeypatch.delenv(key, raising=False)
    commit_safety.forget_checks()
    env = s3_server.env()
    lake = LakehouseResource(root=f"s3://{bucket}/lh", access_key_id=env["AWS_ACCESS_KEY_ID"],
                             secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                             region=env["AWS_REGION"], endpoint_url=s3_server.endpoint,
                             allow_http=True)
    uri = lake.table("bronze", "public", "t")  # registers the options for the root
    append_arrow(uri, pa.table({"id": [1, 2]}), app_id="a", version=1)
    assert open_table(uri).to_pyarrow_table().num_rows == 2
    store = ProgressStore(lake.root, "slot")
    store.save(TableProgress(snapshot_id="s", table="public.t", chunk_size=10))
    assert [p.table for p in store.all()] == ["public.t"]
    assert SECRET_KEY not in repr(lake.normalised()) and SECRET_KEY not in str(
        store.load("public", "t"))
    commit_safety.forget_checks()


def test_the_probe_writes_where_no_slot_state_lives(s3_lakehouse, monkeypatch) -> None:
    """A slot named ``commit_probe`` keeps its state apart from the probe: the
    probe's puts (real ones, recorded on the way) land under ``_pgcdc/~commit_probe/``."""
    keys: list[str] = []
    real_put = commit_safety.signed_put

    def recording_put(options, bucket, key, body, headers):  # type: ignore[no-untyped-def]
        keys.append(f"s3://{bucket}/{key}")
        return real_put(options, bucket, key, body, headers)

    monkeypatch.setattr(commit_safety, "signed_put", recording_put)
    register(s3_lakehouse, {})  # the root, as the lakehouse resource registers it
    ensure_table(f"{s3_lakehouse}/bronze/public/t", SCHEMA)
    assert len(keys) == 2 and keys[0] == keys[1]
    assert keys[0].startswith(probe_prefix(s3_lakehouse) + "/")
    for slot in ("commit_probe", "_commit_probe", "pgcdc"):
        assert not keys[0].startswith(slot_root(s3_lakehouse, slot) + "/")
