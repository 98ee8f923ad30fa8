#!/usr/bin/env python
from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "saga_admin.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        # Load the settings before any command: they refuse an unsafe configuration (no
        # SECRET_KEY with DEBUG off), and one sentence says so better than Django's traceback.
        settings.INSTALLED_APPS  # noqa: B018
    except ImproperlyConfigured as exc:
        sys.exit(f"Saga Admin will not start: {exc}")
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
