"""Every object-store scheme delta-rs supports is passed on, not refused or
rewritten. For ``s3://``/``s3a://``, ``gs://``/``gcs://``, ``az://``/``azure://`` and
``abfs(s)://``: the lakehouse root and table URIs keep the scheme, the storage options
resolved for delta-rs (environment + resource fields) are the ones the scheme reads, and
the pyarrow filesystem the driver and the executors write Parquet through is the right
one, with the right path, account and credentials. No network: filesystems are built,
never used; the commit-safety probe only concerns S3 roots with a custom endpoint.
"""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs
import pytest

from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake import commit_safety, storage
from pgcdc_dagster.lake.paths import normalise_root, slot_root, table_uri
from pgcdc_dagster.resources import LakehouseResource

AWS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "aws-secret",
       "AWS_REGION": "eu-west-1"}
AZURE = {"AZURE_STORAGE_ACCOUNT_NAME": "envaccount", "AZURE_STORAGE_ACCOUNT_KEY": "ZW52a2V5"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in (*storage.ENV_KEYS, *storage.AZURE_ENV_KEYS):
        monkeypatch.delenv(key, raising=False)
    with storage._lock:
        saved = dict(storage._registered)
        storage._registered.clear()
    yield
    with storage._lock:
        storage._registered.clear()
        storage._registered.update(saved)


def fs_args(fs: pafs.FileSystem) -> dict[str, Any]:
    """The arguments a pyarrow filesystem was built with (what it pickles)."""
    return dict(fs.__reduce__()[1][0])


@pytest.mark.parametrize("root", [
    "s3://bucket/lake", "s3a://bucket/lake", "gs://bucket/lake", "gcs://bucket/lake",
    "az://container/lake", "azure://container/lake", "abfs://container/lake",
    "abfss://container@account.dfs.core.windows.net/lake",
])
def test_roots_keep_their_scheme(root: str) -> None:
    assert normalise_root(root + "/") == root
    assert not storage.is_local(root)
    assert table_uri(root, "silver", "public", "my table") == f"{root}/silver/public/my~20table"
    assert slot_root(root, "pgcdc") == f"{root}/_pgcdc/pgcdc"
    assert storage.scheme(root) == root.split("://")[0]


def test_s3_options_from_the_environment_and_the_resource(monkeypatch) -> None:
    for key, value in {**AWS, "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
                       "AWS_ALLOW_HTTP": "true"}.items():
        monkeypatch.setenv(key, value)
    uri = "s3://bucket/lake/bronze/public/t"
    assert storage.storage_options(uri) == {**AWS, "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
                                            "AWS_ALLOW_HTTP": "true"}
    fs, path = storage.filesystem(uri)
    assert isinstance(fs, pafs.S3FileSystem) and path == "bucket/lake/bronze/public/t"
    args = fs_args(fs)
    assert (args["access_key"], args["secret_key"], args["region"], args["endpoint_override"],
            args["scheme"]) == ("AKIDEXAMPLE", "aws-secret", "eu-west-1", "127.0.0.1:9000",
                                "http")
    # The resource's fields win for tables under its root, under their AWS names.
    lake = LakehouseResource(root="s3a://bucket/lake", region="us-east-2",
                             endpoint_url="https://minio.internal:9000",
                             storage_options={"virtual_hosted_style_request": "true"})
    uri = lake.table("bronze", "public", "t")
    assert uri == "s3a://bucket/lake/bronze/public/t"
    options = storage.storage_options(uri)
    assert options is not None
    assert (options["AWS_REGION"], options["AWS_ENDPOINT_URL"],
            options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"]) == (
        "us-east-2", "https://minio.internal:9000", "true")
    args = fs_args(storage.filesystem(uri)[0])
    assert (args["region"], args["endpoint_override"], args["scheme"],
            args["force_virtual_addressing"]) == ("us-east-2", "minio.internal:9000", "https",
                                                  True)


def test_gcs_options_are_passed_as_given(monkeypatch) -> None:
    for key, value in AWS.items():
        monkeypatch.setenv(key, value)  # not read for another scheme
    uri = "gs://bucket/lake/bronze/public/t"
    assert storage.storage_options(uri) == {}
    given = {"google_service_account": "/secrets/sa.json", "Google_Bucket": "bucket"}
    LakehouseResource(root="gs://bucket/lake", storage_options=given).table("bronze", "p", "t")
    assert storage.storage_options(uri) == given
    for gcs in (uri, "gcs://bucket/lake/bronze/public/t"):
        fs, path = storage.filesystem(gcs)
        assert isinstance(fs, pafs.GcsFileSystem) and path == "bucket/lake/bronze/public/t"
    commit_safety.ensure_safe_commits(uri)  # no probe: GCS creates objects exclusively


def test_azure_account_and_credentials(monkeypatch) -> None:
    for key, value in {**AWS, **AZURE}.items():
        monkeypatch.setenv(key, value)
    uri = "az://container/lake/bronze/public/t"
    assert storage.storage_options(uri) == {"azure_storage_account_name": "envaccount",
                                            "azure_storage_account_key": "ZW52a2V5"}
    fs, path = storage.filesystem(uri)
    assert isinstance(fs, pafs.AzureFileSystem) and path == "container/lake/bronze/public/t"
    assert (fs_args(fs)["account_name"], fs_args(fs)["account_key"]) == ("envaccount",
                                                                           "ZW52a2V5")
    # object_store's aliases from the resource win, under the canonical names.
    LakehouseResource(root="azure://container/lake", storage_options={
        "account_name": "resacct", "sas_token": "sv=2024&sig=x", "AZURE_TENANT_ID": "t",
        "Client_Id": "c", "client_secret": "s"},
    ).table("bronze", "public", "t")
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_KEY")
    uri = "azure://container/lake/bronze/public/t"
    assert storage.storage_options(uri) == {"azure_storage_account_name": "resacct",
                                            "azure_storage_sas_token": "sv=2024&sig=x",
                                            "azure_tenant_id": "t", "azure_client_id": "c",
                                            "azure_client_secret": "s"}
    args = fs_args(storage.filesystem(uri)[0])
    assert (args["account_name"], args["sas_token"], args["client_id"]) == (
        "resacct", "sv=2024&sig=x", "")  # a SAS token is complete on its own
    principal = {k: v for k, v in (storage.storage_options(uri) or {}).items()
                 if k in ("azure_client_id", "azure_client_secret", "azure_tenant_id")}
    args = fs_args(storage.filesystem(uri, {"azure_storage_account_name": "sp", **principal})[0])
    assert (args["account_name"], args["client_id"], args["client_secret"],
            args["tenant_id"]) == ("sp", "c", "s", "t")  # a service principal
    commit_safety.ensure_safe_commits(uri)  # no probe: Azure creates blobs exclusively


def test_abfss_takes_the_account_from_the_uri(monkeypatch) -> None:
    uri = "abfss://container@fromuri.dfs.core.windows.net/lake/silver/public/t"
    fs, path = storage.filesystem(uri)
    assert isinstance(fs, pafs.AzureFileSystem) and path == "container/lake/silver/public/t"
    assert fs_args(fs)["account_name"] == "fromuri"
    # Shipped options (as the executors get them) are used as they are.
    fs, _ = storage.filesystem(uri, {"azure_storage_account_key": "a2V5"})
    assert (fs_args(fs)["account_name"], fs_args(fs)["account_key"]) == ("fromuri", "a2V5")


def test_azure_without_an_account_names_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="AZURE_STORAGE_ACCOUNT_NAME"):
        storage.filesystem("az://container/lake/bronze/public/t")


def test_s3_on_aws_itself_needs_no_probe(monkeypatch) -> None:
    for key, value in AWS.items():
        monkeypatch.setenv(key, value)
    commit_safety.forget_checks()
    commit_safety.ensure_safe_commits("s3://bucket/lake/bronze/public/t")  # no endpoint: AWS
    commit_safety.forget_checks()
