"""Writing and reading archive files: a ``file://`` destination on this machine, or an
``s3://`` one through boto3 (any S3-compatible store: the endpoint is ``SAGA_ARCHIVE_S3_ENDPOINT_URL``,
else boto3's own configuration, ``AWS_ENDPOINT_URL`` and the usual credentials chain).

A file is written atomically (a temporary file in the same folder, fsync, rename, fsync of the
folder), so a reader sees the old file or the new one, never half of one; an S3 object is written
whole by its PUT (or its multipart upload's completion). Every write is confirmed by reading the
file back and comparing its SHA-256 (``put_confirmed``) before anything is removed from PostgreSQL.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from typing import IO, Any, Protocol

from ledger.archive.destinations import Destination, DestinationError, destination_parse

_CHUNK = 1 << 20


class StorageError(OSError):
    """An archive file that could not be written, confirmed or read, in words."""


class Storage(Protocol):
    def put(self, where: Destination, data: IO[bytes]) -> None: ...

    def get(self, where: Destination) -> bytes: ...

    def find(self, under: Destination, name: str) -> Iterator[Destination]: ...


def _sha256(data: IO[bytes]) -> str:
    data.seek(0)
    digest = hashlib.sha256()
    for chunk in iter(lambda: data.read(_CHUNK), b""):
        digest.update(chunk)
    data.seek(0)
    return digest.hexdigest()


class FileStorage:
    def put(self, where: Destination, data: IO[bytes]) -> None:
        folder, name = os.path.split(where.path)
        try:
            os.makedirs(folder, mode=0o750, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        except OSError as exc:
            raise StorageError(f"cannot write under {folder}: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "wb") as out:
                data.seek(0)
                for chunk in iter(lambda: data.read(_CHUNK), b""):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, where.path)
            directory = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise StorageError(f"cannot write {where.path}: {exc.strerror or exc}") from None

    def get(self, where: Destination) -> bytes:
        try:
            with open(where.path, "rb") as file:
                return file.read()
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StorageError(f"cannot read {where.path}: {exc.strerror or exc}") from None

    def find(self, under: Destination, name: str) -> Iterator[Destination]:
        if not os.path.isdir(under.path):
            raise StorageError(f"{under.url} is not a folder on this machine")
        for folder, folders, files in os.walk(under.path, followlinks=False):
            folders.sort()
            if name in files:
                relative = os.path.relpath(os.path.join(folder, name), under.path)
                yield under.child(*relative.split(os.sep))


class S3Storage:
    def __init__(self, *, endpoint_url: str = "") -> None:
        import boto3  # boto3 loads slowly: only when an s3:// destination is used
        from botocore.config import Config

        self.client: Any = boto3.client(
            "s3",
            endpoint_url=endpoint_url or None,
            config=Config(
                retries={"mode": "standard", "max_attempts": 5}, connect_timeout=10, read_timeout=60
            ),
        )

    def _error(self, action: str, where: Destination, exc: Exception) -> StorageError:
        return StorageError(f"cannot {action} {where.url}: {exc}")

    def put(self, where: Destination, data: IO[bytes]) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        data.seek(0)
        try:
            self.client.upload_fileobj(data, where.bucket, where.path)
        except (BotoCoreError, ClientError) as exc:
            raise self._error("write", where, exc) from None

    def get(self, where: Destination) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            body: bytes = self.client.get_object(Bucket=where.bucket, Key=where.path)["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise FileNotFoundError(where.url) from None
            raise self._error("read", where, exc) from None
        except BotoCoreError as exc:
            raise self._error("read", where, exc) from None
        return body

    def find(self, under: Destination, name: str) -> Iterator[Destination]:
        from botocore.exceptions import BotoCoreError, ClientError

        prefix = f"{under.path}/" if under.path else ""
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=under.bucket, Prefix=prefix
            ):
                for item in page.get("Contents", []):
                    key = str(item["Key"])
                    if key.rsplit("/", 1)[-1] != name:
                        continue
                    try:
                        yield destination_parse(f"s3://{under.bucket}/{key}")
                    except DestinationError:
                        continue  # not a key an archive writes
        except (BotoCoreError, ClientError) as exc:
            raise self._error("list", under, exc) from None


def storage_for(destination: Destination, *, s3_endpoint_url: str = "") -> Storage:
    if destination.scheme == "s3":
        return S3Storage(endpoint_url=s3_endpoint_url)
    return FileStorage()


def put_confirmed(storage: Storage, where: Destination, data: IO[bytes]) -> str:
    """Write ``data`` to ``where``, read it back and compare: its SHA-256, or ``StorageError``."""
    expected = _sha256(data)
    storage.put(where, data)
    try:
        written = hashlib.sha256(storage.get(where)).hexdigest()
    except FileNotFoundError:
        raise StorageError(f"{where.url} is not there after it was written") from None
    if written != expected:
        raise StorageError(f"{where.url} reads back different from what was written")
    return expected
