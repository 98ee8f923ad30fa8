from __future__ import annotations

from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo world: stand-ins for the systems demo agents act on, and the agents themselves."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "demo"
    verbose_name = "Demo world"
