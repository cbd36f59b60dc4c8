"""A local S3-compatible server for tests: moto's S3 backend on loopback, in a child process.

It runs in its own process because some delta-rs calls hold the GIL while they wait for the
store: a server thread in the test process would never answer them.

:func:`start` serves it on a free port. ``honour_conditional_writes=False`` serves moto
through a front that drops ``If-None-Match`` headers, like an object store without
conditional writes: what commit_safety must refuse.

    python -m tests.support.s3_server [--ignore-conditional-writes]   # prints the port
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ACCESS_KEY = "pgcdc-test-key"
SECRET_KEY = "pgcdc-test-secret-do-not-log"
REGION = "us-east-1"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[str]

    def env(self) -> dict[str, str]:
        """The standard variables that point delta-rs, pyarrow and boto3 at this server."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": REGION, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_ALLOW_HTTP": "true"}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def stop(self) -> None:
        """Stop the server process (by its PID)."""
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def _drop_conditional_headers(app: Callable[..., Iterable[bytes]]) -> Callable[..., Any]:
    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        environ.pop("HTTP_IF_NONE_MATCH", None)
        environ.pop("HTTP_IF_MATCH", None)
        return app(environ, start_response)
    return wrapped


def start(*, honour_conditional_writes: bool = True) -> S3Server:
    """Start moto's S3 on 127.0.0.1 (a free port) in a child process."""
    args = [sys.executable, "-m", "tests.support.s3_server"]
    if not honour_conditional_writes:
        args.append("--ignore-conditional-writes")
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        proc.kill()
        raise RuntimeError(f"the S3 test server did not start: {line!r}")
    return S3Server(f"http://127.0.0.1:{line}", proc)


def main(argv: list[str]) -> None:
    import logging

    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app: Any = DomainDispatcherApplication(create_backend_app)
    if "--ignore-conditional-writes" in argv:
        app = _drop_conditional_headers(app)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    print(server.server_port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
