"""Where the Delta tables live, as a Dagster resource."""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from pgcdc_dagster.lake.commit_safety import UNSAFE_OPT_IN
from pgcdc_dagster.lake.paths import internal_uri, normalise_root, table_uri
from pgcdc_dagster.lake.storage import register


class LakehouseResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Root of the lakehouse (``PGCDC_LAKEHOUSE``): a local path or an object-store URI.

    For ``s3://bucket/prefix`` the standard AWS variables (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``, …)
    apply; the fields below override them (pass secrets as ``dg.EnvVar``).
    """

    root: str = Field(
        description="Root path or URI of the lakehouse; tables land at "
        "<root>/bronze/<schema>/<table> and <root>/silver/<schema>/<table> (names escaped, "
        "see the README).",
    )
    access_key_id: str | None = Field(default=None, description="AWS_ACCESS_KEY_ID.")
    secret_access_key: str | None = Field(
        default=None, description="AWS_SECRET_ACCESS_KEY (use dg.EnvVar).")
    session_token: str | None = Field(default=None, description="AWS_SESSION_TOKEN.")
    region: str | None = Field(default=None, description="AWS_REGION.")
    endpoint_url: str | None = Field(
        default=None, description="AWS_ENDPOINT_URL of an S3-compatible store (MinIO, R2, …).")
    allow_http: bool | None = Field(
        default=None, description="AWS_ALLOW_HTTP: allow a plain-http endpoint (loopback).")
    allow_unsafe_commits: bool = Field(
        default=False,
        description=f"Skip the conditional-write check ({UNSAFE_OPT_IN}=true): only when a "
        "single process ever writes each table.",
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="Further delta-rs storage options (object_store keys), e.g. "
        "{'AWS_VIRTUAL_HOSTED_STYLE_REQUEST': 'true'}.",
    )

    def options(self) -> dict[str, str]:
        """The storage options these fields set (secrets: never log them)."""
        fields = {
            "AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY":
            self.secret_access_key, "AWS_SESSION_TOKEN": self.session_token,
            "AWS_REGION": self.region, "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ALLOW_HTTP": None if self.allow_http is None else str(self.allow_http).lower(),
            UNSAFE_OPT_IN: "true" if self.allow_unsafe_commits else None,
        }
        return {**self.storage_options, **{k: v for k, v in fields.items() if v is not None}}

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Register the storage options for every table under the root (this process)."""
        register(normalise_root(self.root), self.options())

    def table(self, layer: str, schema: str, table: str) -> str:
        """URI of one source table's Delta table."""
        register(normalise_root(self.root), self.options())
        return table_uri(self.root, layer, schema, table)

    def internal(self, name: str) -> str:
        """URI of a capture-wide bronze table, ``<root>/bronze/_pgcdc/<name>``."""
        register(normalise_root(self.root), self.options())
        return internal_uri(self.root, name)

    def normalised(self) -> str:
        """The root as an absolute path (or the URI unchanged)."""
        return normalise_root(self.root)
