"""A real S3 API on this machine for the retention tests: ``moto_server`` (moto in server mode, an
HTTP server speaking S3) started as a subprocess on a free port, with its own throwaway
credentials; a bucket per test."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.processes import free_port, wait_for

# What boto3 reads from the environment to reach the server (this process's and its children's).
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_buckets = itertools.count(1)


@dataclass
class S3Server:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, **_lower(CREDENTIALS))

    def new_bucket(self) -> str:
        name = f"saga-archive-{os.getpid()}-{next(_buckets)}"
        self.client().create_bucket(Bucket=name)
        return name


def _lower(credentials: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": credentials["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": credentials["AWS_SECRET_ACCESS_KEY"],
        "region_name": credentials["AWS_DEFAULT_REGION"],
    }


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code < 500
    except httpx.HTTPError:
        return False


def start_s3(log: Path) -> Iterator[S3Server]:
    """``moto_server`` on a free port until the generator is closed."""
    binary = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    port = free_port()
    process = subprocess.Popen(
        [binary, "-H", "127.0.0.1", "-p", str(port)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = S3Server(process, port)
    try:
        wait_for(lambda: process.poll() is not None or _up(server.endpoint), what="moto_server to listen")
        assert process.poll() is None, log.read_text(errors="replace")
        yield server
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One moto_server for the session (each test makes its own bucket)."""
    yield from start_s3(tmp_path_factory.mktemp("s3") / "moto.log")


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The server, with its credentials in this process's environment (boto3 reads them there)."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    return s3_server
