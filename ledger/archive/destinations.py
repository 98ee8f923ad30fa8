"""Where archives may be written: a destination URL read strictly, the operator's allow-list
(``SAGA_ARCHIVE_ALLOWED_URLS``), and each tenant's own folder under it.

A destination is written by a tenant admin in a policy file, so it is hostile: it may only name
an ``s3://bucket/prefix`` or a ``file:///absolute/path`` at or under one of the operator's allowed
URLs, segment by segment (``file:///srv/archive`` allows ``file:///srv/archive/acme``, never
``file:///srv/archive-other``). Nothing is decoded or resolved: a path with ``.`` or ``..``
segments, empty segments (``//``), percent signs, backslashes, control characters, a query or a
fragment is refused outright rather than normalised, so the text checked is the text used. Every
tenant's runs are written under ``<destination>/<tenant slug>/runs/<run id>/``, so two tenants
sharing a destination never share a folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCHEMES = ("s3", "file")
# S3's bucket naming rules (lower case letters, digits, dots and hyphens, 3 to 63 characters,
# starting and ending with a letter or digit).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# One path segment: letters, digits and a few punctuation marks; no '%', '\\', whitespace.
_SEGMENT = re.compile(r"^[A-Za-z0-9_.~+=@,-]+$")
URL_MAX = 500


class DestinationError(ValueError):
    """A destination that cannot be used, in words."""


@dataclass(frozen=True)
class Destination:
    """A checked destination: ``s3`` with ``bucket`` and key ``segments``, or ``file`` with the
    absolute path's ``segments``."""

    scheme: str
    bucket: str
    segments: tuple[str, ...]

    @property
    def url(self) -> str:
        path = "/".join(self.segments)
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{path}" if path else f"s3://{self.bucket}"
        return f"file:///{path}"

    @property
    def path(self) -> str:
        """The file path (file://) or the key prefix (s3://), without a trailing slash."""
        joined = "/".join(self.segments)
        return f"/{joined}" if self.scheme == "file" else joined

    def child(self, *segments: str) -> Destination:
        for segment in segments:
            _check_segment(segment)
        return Destination(self.scheme, self.bucket, (*self.segments, *segments))

    def within(self, base: Destination) -> bool:
        """At or under ``base``, segment by segment."""
        return (
            self.scheme == base.scheme
            and self.bucket == base.bucket
            and self.segments[: len(base.segments)] == base.segments
        )


def _check_segment(segment: str) -> None:
    if segment in (".", "..") or not _SEGMENT.match(segment):
        raise DestinationError(
            f"path segment {segment[:60]!r} is not allowed (letters, digits and _ . ~ + = @ , - only; "
            "no '.' or '..' segments, no percent-encoding)"
        )


def _split(url: str) -> tuple[str, str, str]:
    """(scheme, bucket, path) of a URL of one of ``SCHEMES``, its text refused when unsafe."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise DestinationError(
            f"must be an s3://bucket/prefix or a file:///absolute/path URL, got {url[:80]!r}"
        )
    if any(ch in rest for ch in "?#%\\") or any(ord(ch) < 33 or ord(ch) == 127 for ch in rest):
        raise DestinationError("may not hold a query, a fragment, percent-encoding, backslashes or spaces")
    if scheme == "file":
        if not rest.startswith("/"):
            raise DestinationError(
                "a file URL names an absolute path on this machine: file:///path (three slashes)"
            )
        return scheme, "", rest[1:]
    bucket, _, path = rest.partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise DestinationError(f"bucket {bucket[:80]!r} is not a valid S3 bucket name")
    return scheme, bucket, path


def destination_parse(url: object) -> Destination:
    """``url`` read strictly (see the module's docstring); ``DestinationError`` saying why not."""
    if not isinstance(url, str):
        raise DestinationError(
            f"must be a string URL (s3://bucket/prefix or file:///path), got {type(url).__name__}"
        )
    if len(url) > URL_MAX:
        raise DestinationError(f"is longer than {URL_MAX} characters")
    scheme, bucket, path = _split(url)
    path = path.removesuffix("/")
    segments = tuple(path.split("/")) if path else ()
    if "" in segments:
        raise DestinationError("may not hold empty path segments ('//')")
    for segment in segments:
        _check_segment(segment)
    if scheme == "file" and not segments:
        raise DestinationError("a file URL may not name the root directory")
    return Destination(scheme, bucket, segments)


def allowed_bases(allowed: tuple[str, ...] | list[str]) -> list[Destination]:
    """The operator's allow-list, each entry read as a destination (a bad entry is a settings
    error: ``DestinationError`` naming it)."""
    bases = []
    for entry in allowed:
        try:
            bases.append(destination_parse(entry))
        except DestinationError as exc:
            raise DestinationError(f"SAGA_ARCHIVE_ALLOWED_URLS entry {entry[:80]!r}: {exc}") from None
    return bases


def destination_check(url: object, allowed: tuple[str, ...] | list[str]) -> Destination:
    """A tenant's destination, read and held against the operator's allow-list."""
    destination = destination_parse(url)
    bases = allowed_bases(allowed)
    if not bases:
        raise DestinationError(
            "no archive destination is allowed on this installation (the operator lists them in "
            "SAGA_ARCHIVE_ALLOWED_URLS)"
        )
    if not any(destination.within(base) for base in bases):
        raise DestinationError(
            f"{destination.url} is not at or under a destination the operator allows "
            f"({', '.join(base.url for base in bases)})"
        )
    return destination


def run_folder(destination: Destination, *, tenant_slug: str, run_id: str) -> Destination:
    """Where one run's files go: ``<destination>/<tenant slug>/runs/<run id>``."""
    return destination.child(tenant_slug, "runs", run_id)
