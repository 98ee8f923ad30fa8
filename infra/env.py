"""Secrets from the environment or from mounted files.

Every secret setting ``NAME`` can instead be given as ``NAME_FILE``, the path of a file holding it
(a Docker or Kubernetes secret mounted read-only), so the value never sits in the environment of
the process or in the manifest. Settings read them with ``env_secret``; ``manage.py bootstrap``
reads its own the same way.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

FILE_SUFFIX = "_FILE"
# A secret file larger than this is not a secret but a mistake (a directory's worth of mount, a
# log): refused rather than read into memory.
MAX_SECRET_FILE_BYTES = 64 * 1024


def env_secret(name: str, default: str = "") -> str:
    """``NAME`` from the environment, or the contents of the file ``NAME_FILE`` names.

    Both set (non-empty) is refused, naming both: which one wins would be a guess. A file that
    cannot be read, is not UTF-8, is too large or is empty is refused, naming the variable and the
    path. Trailing line breaks are stripped (editors and ``echo`` add one). Neither set: ``default``.
    Raises ``ImproperlyConfigured``: manage.py and the web process turn it into one line.
    """
    direct = os.environ.get(name, "")
    path = os.environ.get(name + FILE_SUFFIX, "")
    if direct and path:
        raise ImproperlyConfigured(
            f"Both {name} and {name}{FILE_SUFFIX} are set; set only one of them "
            f"({name}{FILE_SUFFIX} names a file holding the value)."
        )
    if not path:
        return direct if direct else default
    return read_secret_file(path, variable=name + FILE_SUFFIX)


def read_secret_file(path: str, *, variable: str) -> str:
    """The secret held in the file at ``path`` (named by ``variable``), trailing line breaks
    stripped; ``ImproperlyConfigured`` naming both when it cannot be used."""
    where = f"{variable}={path}"
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_SECRET_FILE_BYTES + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ImproperlyConfigured(f"{where}: the file cannot be read ({reason}).") from None
    if len(raw) > MAX_SECRET_FILE_BYTES:
        raise ImproperlyConfigured(
            f"{where}: the file is larger than {MAX_SECRET_FILE_BYTES} bytes; it should hold one secret."
        )
    try:
        value = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ImproperlyConfigured(f"{where}: the file is not UTF-8 text.") from None
    if not value.strip():
        raise ImproperlyConfigured(f"{where}: the file is empty.")
    return value
