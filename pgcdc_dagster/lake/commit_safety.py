"""Safe Delta commits on S3: refuse a store that would let two writers overwrite a commit.

A Delta commit is the creation of ``_delta_log/<version>.json``; two writers racing for the
same version must not both succeed. Local disks and the other object stores delta-rs knows
create files exclusively. On S3, delta-rs 1.x writes each log entry with a conditional put
(``If-None-Match: *``, ``AWS_CONDITIONAL_PUT=etag``, its default): AWS S3, MinIO and R2
honour it, but a store that ignores the header silently lets the second writer overwrite
the first commit. (delta-rs 1.x no longer ships the DynamoDB locking provider, and
``AWS_CONDITIONAL_PUT=disabled`` makes every commit fail.)

So before the first commit under an ``s3://`` root served by another endpoint than AWS's
(``AWS_ENDPOINT_URL``), :func:`ensure_safe_commits` *probes* the store once per process: it
puts one object under ``<root>/_pgcdc/~commit_probe/`` twice with ``If-None-Match: *``; the
second put must be refused (delta-rs lists the log before it commits, so only a true race
would show the difference through delta-rs itself). When it is not, the run stops
with :class:`UnsafeCommitError`, unless the user opted in with
``AWS_S3_ALLOW_UNSAFE_RENAME=true`` (delta-rs's name for the same promise; the resource
field ``allow_unsafe_commits``), which promises a single writer per table.
"""

from __future__ import annotations

import threading
import uuid
from urllib.parse import urlparse

from pgcdc_dagster.exceptions import PgCdcError
from pgcdc_dagster.lake.paths import probe_prefix
from pgcdc_dagster.lake.s3_sign import signed_put
from pgcdc_dagster.lake.storage import (
    S3_SCHEMES,
    delete_file,
    registered_root,
    scheme,
    storage_options,
    truthy,
)

UNSAFE_OPT_IN = "AWS_S3_ALLOW_UNSAFE_RENAME"

_checked: set[str] = set()
_lock = threading.Lock()


class UnsafeCommitError(PgCdcError):
    """The object store cannot keep two writers from overwriting each other's commit."""


def _options_text() -> str:
    return ("Use a store that honours conditional writes (AWS S3, MinIO, Cloudflare R2; "
            "delta-rs's default AWS_CONDITIONAL_PUT=etag), or, if exactly one process ever "
            f"writes each table (one capture per slot, no maintenance while it runs), opt in "
            f"with {UNSAFE_OPT_IN}=true (or LakehouseResource.allow_unsafe_commits). "
            "See docs/operations.md, 'Running in production'.")


def probe_root(uri: str) -> str:
    """Where the probe runs: the registered lakehouse root, else the bucket."""
    root = registered_root(uri)
    if root is not None:
        return root
    parsed = urlparse(uri)
    return f"{parsed.scheme}://{parsed.netloc}"


def ensure_safe_commits(uri: str) -> None:
    """Raise :class:`UnsafeCommitError` unless commits under ``uri`` are exclusive."""
    if scheme(uri) not in S3_SCHEMES:
        return
    root = probe_root(uri)
    with _lock:
        if root in _checked:
            return
        options = storage_options(uri) or {}
        if not truthy(options.get(UNSAFE_OPT_IN)):
            if options.get("AWS_CONDITIONAL_PUT", "etag").lower() == "disabled":
                raise UnsafeCommitError(
                    f"{root}: AWS_CONDITIONAL_PUT=disabled leaves delta-rs no way to create a "
                    "commit exclusively (every commit would fail). " + _options_text())
            if not conditional_commits_hold(root, options):
                raise UnsafeCommitError(
                    f"{root}: the object store ignored a conditional write (If-None-Match), so "
                    "two writers could overwrite each other's Delta commit. " + _options_text())
        _checked.add(root)


def conditional_commits_hold(root: str, options: dict[str, str]) -> bool:
    """Put one probe object twice with ``If-None-Match: *``; True when the store refuses the
    second put (HTTP 412 or 409), as delta-rs's commits need."""
    endpoint = options.get("AWS_ENDPOINT_URL")
    if not endpoint:
        return True  # AWS S3 itself honours If-None-Match (since August 2024)
    if "AWS_ACCESS_KEY_ID" not in options:
        raise UnsafeCommitError(
            f"{root}: cannot check that the store at the configured endpoint honours "
            "conditional writes without static credentials (AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY). " + _options_text())
    parsed = urlparse(root)
    key = "/".join(p for p in (urlparse(probe_prefix(root)).path.strip("/"),
                               uuid.uuid4().hex) if p)
    try:
        first = signed_put(options, parsed.netloc, key, b"probe", {"If-None-Match": "*"})
        if first >= 300:
            raise UnsafeCommitError(
                f"{root}: the commit-safety probe could not write under the root "
                f"(HTTP {first}); check the credentials and the bucket. " + _options_text())
        second = signed_put(options, parsed.netloc, key, b"probe", {"If-None-Match": "*"})
    finally:
        delete_file(f"{parsed.scheme}://{parsed.netloc}/{key}")
    return second in (409, 412)


def forget_checks() -> None:
    """Probe again on the next commit (tests, or after the store's settings changed)."""
    with _lock:
        _checked.clear()
