#!/usr/bin/env python
"""Django's manage.py for a checkout; an installed server runs the same as ``python -m saga_admin``."""

from __future__ import annotations

from saga_admin.__main__ import main

if __name__ == "__main__":
    main("manage.py")
