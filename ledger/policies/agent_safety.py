"""The ``agentSafety`` layout of a policy file, translated into the native one: camelCase keys,
upper-case enum values, a policy per tool name, its own compensation words, durations such as
``"30s"`` (``infra.durations``). The result goes through the native layout's validation
(``ledger.policies.schema``), so both layouts mean the same thing once loaded; what cannot be
translated is reported here, naming its place."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from infra.durations import parse_duration
from ledger.models import ActionClass, CompensationStrategy
from ledger.policies.errors import Problems

AGENT_SAFETY = "agentSafety"

# What each agentSafety compensation means in the native vocabulary, and the action class it
# implies when the entry does not say (conservative: "none" means it cannot be undone).
_AGENT_SAFETY_COMPENSATION = {
    "snapshot": (CompensationStrategy.SNAPSHOT, ActionClass.INTERNAL_UPDATE),
    "correction": (CompensationStrategy.CORRECTION, ActionClass.EXTERNAL_IRREVERSIBLE),
    "none": (CompensationStrategy.NONE, ActionClass.EXTERNAL_IRREVERSIBLE),
    "custom": (CompensationStrategy.CUSTOM, ActionClass.EXTERNAL_REVERSIBLE),
    "delete": (CompensationStrategy.CUSTOM, ActionClass.EXTERNAL_REVERSIBLE),
    "cancel": (CompensationStrategy.CUSTOM, ActionClass.EXTERNAL_REVERSIBLE),
    "compensate": (CompensationStrategy.CUSTOM, ActionClass.EXTERNAL_REVERSIBLE),
}


def _snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).lower()


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def agent_safety_translate(root: Any, problems: Problems) -> dict[str, Any]:
    """The native shape of an ``agentSafety`` object; what cannot be translated goes to
    ``problems``, naming its place."""
    if not isinstance(root, dict):
        problems.add("agentSafety", "must be an object")
        return {}
    known = {"policies", "unwind", "audit", "compensators", "default_policy", "auto_compensate"}
    for key in root:
        if _snake(key) not in known:
            problems.add(f"agentSafety.{key}", f"unknown key (allowed: {', '.join(sorted(known))})")
    # Each section under its native name; the first spelling of a name counts (``defaultPolicy``
    # before a later ``default_policy``).
    entries: dict[str, Any] = {}
    for key, value in root.items():
        entries.setdefault(_snake(key), value)
    native: dict[str, Any] = {}
    for name, translate in _SECTIONS:
        value = entries.get(name)
        if value is not None and (translated := translate(value, problems)) is not _LEFT_OUT:
            native[name] = translated
    return native


# A section that cannot be translated at all (its problem is reported): left out of the native
# shape, so it is not reported a second time by the native validation.
_LEFT_OUT = object()


def _translate_policies(policies: Any, problems: Problems) -> Any:
    if not isinstance(policies, dict):
        problems.add("agentSafety.policies", "must be an object mapping tool names to policies")
        return _LEFT_OUT
    translated = []
    for tool, raw in policies.items():
        where = f'agentSafety.policies["{tool}"]'
        if not isinstance(raw, dict):
            problems.add(where, "must be an object")
            continue
        translated.append(_translate_policy(tool, raw, problems, where))
    return translated


def _translate_default_policy(default: Any, problems: Problems) -> Any:
    if not isinstance(default, dict):
        return default
    return _translate_policy(None, default, problems, "agentSafety.defaultPolicy")


def _translate_auto_compensate(auto: Any, problems: Problems) -> Any:
    return {_snake(k): _lower(v) for k, v in auto.items()} if isinstance(auto, dict) else auto


def _translate_compensators(compensators: Any, problems: Problems) -> Any:
    if not isinstance(compensators, dict):
        return compensators
    return {
        tool: ({_snake(k): v for k, v in spec.items()} if isinstance(spec, dict) else spec)
        for tool, spec in compensators.items()
    }


def _translate_audit(audit: Any, problems: Problems) -> Any:
    """``audit`` as written, but ``retention``'s keys in the native spelling (``closedRuns``)."""
    if not isinstance(audit, dict):
        return audit
    return {
        key: (
            {_snake(k): v for k, v in value.items()}
            if key == "retention" and isinstance(value, dict)
            else value
        )
        for key, value in audit.items()
    }


def _translate_policy(
    tool: str | None, raw: dict[str, Any], problems: Problems, where: str
) -> dict[str, Any]:
    policy: dict[str, Any] = {} if tool is None else {"tool": tool}
    for key, value in raw.items():
        name = _snake(key)
        if name == "rules":
            policy[name] = [_translate_rule(rule) for rule in value] if isinstance(value, list) else value
        elif name == "limits":
            policy[name] = (
                [
                    {
                        _snake(k): (_lower(v) if _snake(k) in ("per", "on_exceed") else v)
                        for k, v in limit.items()
                    }
                    if isinstance(limit, dict)
                    else limit
                    for limit in value
                ]
                if isinstance(value, list)
                else value
            )
        else:
            policy[name] = (
                _lower(value)
                if name in {"risk", "approval", "action_class", "compensation", "on_timeout"}
                else value
            )
    compensation = policy.get("compensation")
    if isinstance(compensation, str):
        if compensation not in _AGENT_SAFETY_COMPENSATION:
            allowed = ", ".join(name.upper() for name in _AGENT_SAFETY_COMPENSATION)
            problems.add(where, f"compensation: must be one of {allowed}, got {raw.get('compensation')!r}")
            del policy["compensation"]
            return policy
        strategy, implied_class = _AGENT_SAFETY_COMPENSATION[compensation]
        policy["compensation"] = strategy.value
        if tool is not None:
            policy.setdefault("action_class", implied_class.value)
    return policy


def _translate_condition(raw: Any) -> Any:
    """camelCase condition keys (``notIn``) in the native spelling; operands are kept as written."""
    if not isinstance(raw, dict):
        return raw
    condition: dict[str, Any] = {}
    for key, value in raw.items():
        name = _snake(key)
        condition[name] = (
            [_translate_condition(c) for c in value]
            if name in ("all", "any") and isinstance(value, list)
            else value
        )
    return condition


def _translate_rule(raw: Any) -> Any:
    """An agentSafety rule: condition keys as above, ``then`` values case-insensitive."""
    if not isinstance(raw, dict):
        return raw
    rule: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "if":
            rule[key] = _translate_condition(value)
        elif key == "then" and isinstance(value, dict):
            rule[key] = {_snake(k): (_lower(v) if _snake(k) != "approvers" else v) for k, v in value.items()}
        else:
            rule[key] = value
    return rule


def _translate_unwind(raw: Any, problems: Problems) -> Any:
    if not isinstance(raw, dict):
        return raw
    unwind: dict[str, Any] = {}
    for key, value in raw.items():
        name = _snake(key)
        where = f"agentSafety.unwind.{key}"
        if name == "strategy":
            # Saga Admin always unwinds newest-first; anything else would break guarantee 4.
            if _lower(value) != "lifo":
                problems.add(where, f"must be LIFO (the only order Saga Admin unwinds in), got '{value}'")
        elif name == "on_compensation_failure":
            unwind[name] = _lower(value)
        elif name in ("timeout", "step_timeout", "step_timeout_s"):
            try:
                unwind["step_timeout_s"] = parse_duration(value)
            except ValueError as exc:
                problems.add(where, str(exc))
        else:
            unwind[name] = value
    return unwind


# The sections, in the order they are translated (and their problems reported).
_SECTIONS: tuple[tuple[str, Callable[[Any, Problems], Any]], ...] = (
    ("policies", _translate_policies),
    ("default_policy", _translate_default_policy),
    ("unwind", _translate_unwind),
    ("auto_compensate", _translate_auto_compensate),
    ("compensators", _translate_compensators),
    ("audit", _translate_audit),
)
