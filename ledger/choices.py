"""The vocabularies every part of the record shares: risk (and its order), action class, approval
mode and compensation strategy."""

from __future__ import annotations

from django.db import models


class Risk(models.TextChoices):
    LOW = "low", "Low"
    MEDIUM = "medium", "Medium"
    HIGH = "high", "High"
    CRITICAL = "critical", "Critical"


RISK_ORDER = {Risk.LOW: 0, Risk.MEDIUM: 1, Risk.HIGH: 2, Risk.CRITICAL: 3}


def max_risk(*risks: str) -> str:
    present = [r for r in risks if r]
    return max(present, key=lambda r: RISK_ORDER[Risk(r)]) if present else Risk.LOW


class ActionClass(models.TextChoices):
    READ_ONLY = "read_only", "Read only"
    DRAFT_ONLY = "draft_only", "Draft only"
    INTERNAL_UPDATE = "internal_update", "Internal update"
    EXTERNAL_REVERSIBLE = "external_reversible", "External, reversible"
    EXTERNAL_IRREVERSIBLE = "external_irreversible", "External, irreversible"


class ApprovalMode(models.TextChoices):
    AUTO = "auto", "Automatic"
    MANUAL = "manual", "Manual approval"


class CompensationStrategy(models.TextChoices):
    CUSTOM = "custom", "Registered compensating tool"
    SNAPSHOT = "snapshot", "Restore the before snapshot"
    CORRECTION = "correction", "Correction (irreversible action)"
    NONE = "none", "Cannot be undone"
