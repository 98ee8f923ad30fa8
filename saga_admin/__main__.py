"""``python -m saga_admin <command>``: manage.py for an installed server (``pip install .`` ships
no manage.py), and what the Procfile's worker line runs, from a checkout or an install alike."""

from __future__ import annotations

import os
import sys


def main(prog: str = "python -m saga_admin") -> None:
    """Run the management command ``sys.argv`` names; ``prog`` names the program in help and errors."""
    if sys.argv[1:] == ["--version"]:
        # The release (CHANGELOG.md), not Django's, which is what Django's own --version prints.
        from infra.version import server_version

        print(f"saga-admin {server_version()}")
        return
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
    # Django names the program from argv[0]: "__main__.py" would be no use in its help.
    execute_from_command_line([prog, *sys.argv[1:]])


if __name__ == "__main__":
    main()
