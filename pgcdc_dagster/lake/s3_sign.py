"""One AWS Signature V4 signed ``PUT`` to an S3-compatible endpoint (stdlib only).

Used by :mod:`pgcdc_dagster.lake.commit_safety` to send a conditional write
(``If-None-Match``), which neither pyarrow's filesystem nor delta-rs exposes directly.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.client
from collections.abc import Mapping
from urllib.parse import quote, urlparse


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signed_put(options: Mapping[str, str], bucket: str, key: str, body: bytes,
               headers: Mapping[str, str], timeout: float = 30.0) -> int:
    """PUT ``body`` at ``bucket/key`` (path-style) and return the HTTP status."""
    endpoint = urlparse(options["AWS_ENDPOINT_URL"])
    region = options.get("AWS_REGION", "us-east-1")
    now = dt.datetime.now(dt.UTC)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(body).hexdigest()
    path = "/" + quote(f"{bucket}/{key}", safe="/-_.~")
    base = (endpoint.path or "").rstrip("/")
    signed = {"host": endpoint.netloc, "x-amz-content-sha256": payload, "x-amz-date": stamp,
              **{k.lower(): v for k, v in headers.items()}}
    if options.get("AWS_SESSION_TOKEN"):
        signed["x-amz-security-token"] = options["AWS_SESSION_TOKEN"]
    names = sorted(signed)
    canonical = "\n".join(["PUT", base + path, "",
                           *[f"{n}:{signed[n].strip()}" for n in names], "",
                           ";".join(names), payload])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key_bytes = _hmac(_hmac(_hmac(_hmac(
        ("AWS4" + options.get("AWS_SECRET_ACCESS_KEY", "")).encode(), day), region), "s3"),
        "aws4_request")
    signature = hmac.new(key_bytes, to_sign.encode(), hashlib.sha256).hexdigest()
    signed["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={options['AWS_ACCESS_KEY_ID']}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}")
    conn_cls = http.client.HTTPSConnection if endpoint.scheme == "https" else \
        http.client.HTTPConnection
    conn = conn_cls(endpoint.netloc, timeout=timeout)
    try:
        conn.request("PUT", base + path, body=body,
                     headers={k: v for k, v in signed.items() if k != "host"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()
