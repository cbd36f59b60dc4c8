"""Object storage: the options delta-rs and pyarrow need to reach a lakehouse off local disk.

A lakehouse root such as ``s3://bucket/prefix`` is reached with the standard AWS variables
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``,
``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP`` …), overridden by the options a
:class:`~resources.LakehouseResource` registers for its root (:func:`register`). The same
resolved options go to delta-rs (``storage_options=``), to pyarrow's own filesystems (the
driver's and the Spark executors' Parquet writes and reads: Spark here has no Hadoop S3
connector) and, pickled inside the tasks, to the executors, which may not share the
driver's environment. Option values are secrets: nothing here logs or prints them.

Other schemes delta-rs supports are passed on, never refused or rewritten:

* Azure (``az://``, ``azure://``, ``abfs://``, ``abfss://``; the account in the URI's
  ``container@account.dfs.core.windows.net`` or in the options): the ``AZURE_STORAGE_*`` /
  ``AZURE_CLIENT_*`` variables and the registered options, under object_store's lower-case
  names (``azure_storage_account_name`` …), go to delta-rs, and the account, key, SAS token
  or service principal to pyarrow's ``AzureFileSystem`` (pyarrow itself has no ``az://``).
* Google Cloud Storage (``gs://``, ``gcs://``): registered options go to delta-rs as given;
  pyarrow's ``GcsFileSystem`` uses Google's default credentials
  (``GOOGLE_APPLICATION_CREDENTIALS``, which delta-rs reads too, or the metadata server).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from urllib.parse import urlparse

import pyarrow.fs as pafs

from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake.paths import is_local

S3_SCHEMES = ("s3", "s3a")
ENV_KEYS = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
    "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP", "AWS_CONDITIONAL_PUT",
    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "AWS_S3_ALLOW_UNSAFE_RENAME",
)
"""Environment variables read for ``s3://`` roots (registered options win)."""
_ALIASES = {"AWS_ENDPOINT": "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3": "AWS_ENDPOINT_URL",
            "AWS_ACCESS_KEY": "AWS_ACCESS_KEY_ID", "AWS_SECRET_KEY": "AWS_SECRET_ACCESS_KEY",
            "AWS_TOKEN": "AWS_SESSION_TOKEN"}

AZURE_SCHEMES = ("az", "azure", "abfs", "abfss")
GCS_SCHEMES = ("gs", "gcs")
AZURE_ENV_KEYS = (
    "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID",
)
"""Environment variables read for Azure roots (registered options win)."""
_AZURE_NAMES = {
    "account_name": "azure_storage_account_name",
    "account_key": "azure_storage_account_key", "access_key": "azure_storage_account_key",
    "azure_storage_access_key": "azure_storage_account_key",
    "azure_storage_key": "azure_storage_account_key",
    "sas_token": "azure_storage_sas_token", "sas_key": "azure_storage_sas_token",
    "azure_storage_sas_key": "azure_storage_sas_token",
    "client_id": "azure_client_id", "azure_storage_client_id": "azure_client_id",
    "client_secret": "azure_client_secret",
    "azure_storage_client_secret": "azure_client_secret",
    "tenant_id": "azure_tenant_id", "azure_storage_tenant_id": "azure_tenant_id",
}
"""object_store's aliases of the Azure keys pyarrow needs, to one (its canonical) name."""

_registered: dict[str, dict[str, str]] = {}
_lock = threading.Lock()


def scheme(uri: str) -> str:
    """The URI's scheme (``""`` for a local path)."""
    return "" if is_local(uri) else urlparse(uri).scheme.lower()


def canonical(options: Mapping[str, str], uri_scheme: str = "s3") -> dict[str, str]:
    """Options under one spelling: ``AWS_*`` upper case for S3 (``endpoint`` ->
    ``AWS_ENDPOINT_URL``), object_store's lower-case names for Azure (``account_key`` ->
    ``azure_storage_account_key``), as given for other schemes. Empty values are dropped."""
    out: dict[str, str] = {}
    for key, value in options.items():
        if value is None or str(value) == "":
            continue
        name = key.upper()
        if uri_scheme in S3_SCHEMES:
            name = name if name.startswith("AWS_") else f"AWS_{name}"
            name = _ALIASES.get(name, name)
        elif uri_scheme in AZURE_SCHEMES:
            name = _AZURE_NAMES.get(key.lower(), key.lower())
        else:
            name = key
        out[name] = str(value)
    return out


def register(root: str, options: Mapping[str, str]) -> None:
    """Options for every table under ``root`` (a resource's fields); local roots ignore them."""
    if is_local(root):
        return
    with _lock:
        _registered[root.rstrip("/")] = canonical(options, scheme(root))


def registered_root(uri: str) -> str | None:
    """The longest registered root that ``uri`` lies under."""
    with _lock:
        roots = [r for r in _registered if uri == r or uri.startswith(r + "/")]
    return max(roots, key=len) if roots else None


def storage_options(uri: str) -> dict[str, str] | None:
    """delta-rs ``storage_options`` for ``uri`` (None for a local path)."""
    if is_local(uri):
        return None
    kind = scheme(uri)
    options: dict[str, str] = {}
    if kind in S3_SCHEMES:
        options = canonical({k: v for k in ENV_KEYS if (v := os.environ.get(k))})
        if "AWS_REGION" not in options and "AWS_DEFAULT_REGION" in options:
            options["AWS_REGION"] = options["AWS_DEFAULT_REGION"]
        options.pop("AWS_DEFAULT_REGION", None)
    elif kind in AZURE_SCHEMES:
        options = canonical({k: v for k in AZURE_ENV_KEYS if (v := os.environ.get(k))}, kind)
    root = registered_root(uri)
    if root is not None:
        with _lock:
            options.update(_registered[root])
    return options


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def filesystem(uri: str, options: Mapping[str, str] | None = None
               ) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path inside it for ``uri``.

    ``options`` are the resolved storage options (:func:`storage_options`, resolved on the
    driver and shipped to executors); None resolves them here.
    """
    if is_local(uri):
        return pafs.LocalFileSystem(), uri
    kind = scheme(uri)
    opts = dict(storage_options(uri) or {}) if options is None else dict(options)
    if kind in AZURE_SCHEMES:
        return _azure(uri, opts)
    if kind not in S3_SCHEMES:
        fs, inner = pafs.FileSystem.from_uri(uri)
        return fs, str(inner)
    parsed = urlparse(uri)
    path = f"{parsed.netloc}{parsed.path}".rstrip("/")
    kwargs: dict[str, object] = {}
    if "AWS_ACCESS_KEY_ID" in opts:
        kwargs["access_key"] = opts["AWS_ACCESS_KEY_ID"]
        kwargs["secret_key"] = opts.get("AWS_SECRET_ACCESS_KEY", "")
        if "AWS_SESSION_TOKEN" in opts:
            kwargs["session_token"] = opts["AWS_SESSION_TOKEN"]
    if "AWS_REGION" in opts:
        kwargs["region"] = opts["AWS_REGION"]
    endpoint = opts.get("AWS_ENDPOINT_URL")
    if endpoint:
        target = urlparse(endpoint)
        kwargs["endpoint_override"] = target.netloc or endpoint
        kwargs["scheme"] = target.scheme or ("http" if truthy(opts.get("AWS_ALLOW_HTTP"))
                                             else "https")
    if truthy(opts.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST")):
        kwargs["force_virtual_addressing"] = True
    return pafs.S3FileSystem(**kwargs), path


def _azure(uri: str, opts: Mapping[str, str]) -> tuple[pafs.FileSystem, str]:
    """pyarrow's AzureFileSystem for ``az://container/path`` or
    ``abfss://container@account.dfs.core.windows.net/path``: path ``container/path``."""
    parsed = urlparse(uri)
    container, _, host = parsed.netloc.partition("@")
    account = opts.get("azure_storage_account_name") or host.split(".", 1)[0]
    if not account:
        raise ConfigurationError(
            f"{parsed.scheme}://{parsed.netloc}: no Azure storage account; set "
            "AZURE_STORAGE_ACCOUNT_NAME (or the lakehouse resource's storage_options "
            "{'azure_storage_account_name': ...}), or use abfss://<container>@<account>"
            ".dfs.core.windows.net/<path>.")
    kwargs: dict[str, str] = {}
    if opts.get("azure_storage_account_key"):
        kwargs["account_key"] = opts["azure_storage_account_key"]
    elif opts.get("azure_storage_sas_token"):  # pyarrow takes one or the other
        kwargs["sas_token"] = opts["azure_storage_sas_token"]
    elif opts.get("azure_client_id"):  # a managed identity, or a service principal
        kwargs["client_id"] = opts["azure_client_id"]
        if opts.get("azure_client_secret") and opts.get("azure_tenant_id"):
            kwargs["client_secret"] = opts["azure_client_secret"]
            kwargs["tenant_id"] = opts["azure_tenant_id"]
    return pafs.AzureFileSystem(account, **kwargs), f"{container}{parsed.path}".rstrip("/")


def join(uri: str, *parts: str) -> str:
    """``uri/part/...`` for a local path or a URI."""
    return "/".join([uri.rstrip("/"), *parts])


def read_bytes(uri: str) -> bytes | None:
    """The object's bytes, or None when it does not exist."""
    fs, path = filesystem(uri)
    try:
        with fs.open_input_stream(path) as stream:
            return bytes(stream.read())
    except FileNotFoundError:
        return None
    except OSError as exc:  # S3 reports a missing key as an OSError naming it
        if "NoSuchKey" in str(exc) or "does not exist" in str(exc) or "Not Found" in str(exc):
            return None
        raise


def write_bytes(uri: str, data: bytes) -> None:
    """Replace the object atomically: an S3 PUT is all-or-nothing; locally, write + rename."""
    fs, path = filesystem(uri)
    if is_local(uri):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
        return
    with fs.open_output_stream(path) as stream:
        stream.write(data)


def list_names(uri: str, suffix: str = "") -> list[str]:
    """Names of the files directly under ``uri`` ending with ``suffix`` (sorted)."""
    fs, path = filesystem(uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except FileNotFoundError:
        return []
    return sorted(i.base_name for i in infos
                  if i.type == pafs.FileType.File and i.base_name.endswith(suffix))


def delete_file(uri: str) -> None:
    """Delete one file; a missing one is not an error."""
    fs, path = filesystem(uri)
    try:
        fs.delete_file(path)
    except (FileNotFoundError, OSError):
        pass


def delete_tree(uri: str) -> None:
    """Delete everything under ``uri``; a missing one is not an error."""
    fs, path = filesystem(uri)
    try:
        fs.delete_dir(path)
    except (FileNotFoundError, OSError):
        pass
