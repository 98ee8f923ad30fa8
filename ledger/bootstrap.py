"""Headless bootstrap (``manage.py bootstrap``): the first tenant, its admin, API keys and a policy
file, from the environment and mounted files, so a deployment needs no interactive step.

Run on every deploy (the migrate job), it creates what is missing and changes nothing else: an
existing tenant, user or key is left as it is and the report says so. It writes through the same
services as the single-purpose commands (``keys.tenant_get_or_create``, ``staff.staff_set``,
``keys.agent_key_create``/``agent_key_import``, ``policies.load.policy_file_load``).

Two stages. ``bootstrap_inputs`` reads and checks every input (variables, the keys file, each
key's secret file, the policy file) without touching the database, listing every problem at once;
``bootstrap_apply`` then writes in one transaction, so a refusal at any point changes nothing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email, validate_slug
from django.db import transaction

from infra import errors
from infra.env import env_secret, read_secret_file
from ledger import staff
from ledger.audit import Actor
from ledger.models import AgentKey, Membership, Tenant
from ledger.policies.errors import PolicyFileError
from ledger.policies.load import PolicyDocument, policy_file_load, policy_file_parse, policy_file_read
from ledger.services import keys

ENV = "SAGA_BOOTSTRAP_"
TENANT = ENV + "TENANT"
TENANT_NAME = ENV + "TENANT_NAME"
ADMIN_USERNAME = ENV + "ADMIN_USERNAME"
ADMIN_EMAIL = ENV + "ADMIN_EMAIL"
ADMIN_PASSWORD = ENV + "ADMIN_PASSWORD"
AGENT_KEYS_FILE = ENV + "AGENT_KEYS_FILE"
POLICY_FILE = ENV + "POLICY_FILE"
POLICY_SCOPE = ENV + "POLICY_SCOPE"
ISSUED_KEYS_FILE = ENV + "ISSUED_KEYS_FILE"
POLICY_SCOPES = ("global", "tenant")
KEY_FIELDS = {"name", "scopes", "owner", "secret_file"}
ACTOR = Actor.system("bootstrap")


class BootstrapError(Exception):
    """Inputs that cannot be used, or a state bootstrap will not change; nothing was written."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class KeySpec:
    name: str
    scopes: list[str]
    owner: str
    # The key material from ``secret_file``; "" to have the server issue the key (printed once).
    secret: str
    where: str  # "keys[0] (onboarding-agent)", for messages


@dataclass(frozen=True)
class BootstrapInputs:
    tenant_slug: str = ""
    tenant_name: str = ""
    admin_username: str = ""
    admin_email: str = ""
    admin_password: str = ""
    keys: list[KeySpec] = field(default_factory=list)
    policy_path: str = ""
    policy_scope: str = "global"
    policy: PolicyDocument | None = None
    # Where keys the server issues are written (``SAGA_BOOTSTRAP_ISSUED_KEYS_FILE``); "" to print.
    issued_keys_file: str = ""

    @property
    def empty(self) -> bool:
        return not (self.tenant_slug or self.admin_username or self.keys or self.policy)


# --- Reading the inputs --------------------------------------------------------------------------


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def _tenant_problems(slug: str, name: str) -> list[str]:
    problems = []
    if slug:
        try:
            validate_slug(slug)
        except DjangoValidationError:
            problems.append(f"{TENANT}={slug[:60]!r}: a tenant slug is letters, digits, - and _ only.")
        if len(slug) > 64:  # Tenant.slug's max_length
            problems.append(f"{TENANT}: at most 64 characters.")
    if len(name) > 200:
        problems.append(f"{TENANT_NAME}: at most 200 characters.")
    return problems


def _admin_problems(username: str, email: str, password: str) -> list[str]:
    """The checks a user's form would make (the username field's own validators, an e-mail
    address), before anything is written; the password's are ``staff_set``'s."""
    problems = []
    if username:
        field_ = get_user_model()._meta.get_field("username")
        try:
            field_.run_validators(username)
        except DjangoValidationError as exc:
            problems.append(f"{ADMIN_USERNAME}: {' '.join(exc.messages)}")
    elif password or email:
        problems.append(f"{ADMIN_PASSWORD} or {ADMIN_EMAIL} is set but {ADMIN_USERNAME} is not.")
    if email:
        try:
            validate_email(email)
        except DjangoValidationError:
            problems.append(f"{ADMIN_EMAIL}: not an e-mail address.")
    return problems


def _secret(name: str, problems: list[str]) -> str:
    try:
        return env_secret(name)
    except ImproperlyConfigured as exc:
        problems.append(str(exc))
        return ""


def _key_spec(index: int, entry: Any, base: Path, problems: list[str]) -> KeySpec | None:
    where = f"{AGENT_KEYS_FILE}: keys[{index}]"
    if not isinstance(entry, dict):
        problems.append(f"{where}: must be an object with name, scopes, owner, secret_file.")
        return None
    name = entry.get("name")
    if isinstance(name, str) and name.strip():
        where = f"{where} ({name.strip()})"
    unknown = sorted(set(entry) - KEY_FIELDS)
    found = len(problems)
    if unknown:
        problems.append(
            f"{where}: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(sorted(KEY_FIELDS))})."
        )
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > 200:
        problems.append(f"{where}: name must be a non-empty string of at most 200 characters.")
    scopes = entry.get("scopes", ["agent"])
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        problems.append(f'{where}: scopes must be a list of strings, e.g. ["agent"].')
    owner = entry.get("owner", "")
    if not isinstance(owner, str):
        problems.append(f"{where}: owner must be a username (a string).")
    secret_file = entry.get("secret_file", "")
    secret = ""
    if not isinstance(secret_file, str):
        problems.append(f"{where}: secret_file must be a path (a string).")
    elif secret_file:
        secret = _key_material(base / secret_file, where, problems)
    if len(problems) > found or not isinstance(name, str) or not isinstance(owner, str):
        return None
    return KeySpec(name=name.strip(), scopes=list(scopes), owner=owner.strip(), secret=secret, where=where)


def _key_material(path: Path, where: str, problems: list[str]) -> str:
    try:
        raw = read_secret_file(str(path), variable=f"{where} secret_file")
    except ImproperlyConfigured as exc:
        problems.append(str(exc))
        return ""
    try:
        keys.agent_key_material_check(raw)
    except errors.SagaError as exc:
        problems.append(f"{where}: secret_file {path}: {exc.message}")
        return ""
    return raw


def _key_specs(path: str, problems: list[str]) -> list[KeySpec]:
    """The keys file: ``{"keys": [{"name", "scopes", "owner", "secret_file"}, …]}`` (JSON; a
    relative ``secret_file`` is found next to the keys file)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(
            f"{AGENT_KEYS_FILE}={path}: the file cannot be read ({getattr(exc, 'strerror', None) or exc})."
        )
        return []
    except json.JSONDecodeError as exc:
        problems.append(
            f"{AGENT_KEYS_FILE}={path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}."
        )
        return []
    if not isinstance(data, dict) or set(data) != {"keys"} or not isinstance(data["keys"], list):
        problems.append(
            f'{AGENT_KEYS_FILE}={path}: must be a JSON object {{"keys": [...]}} and nothing else.'
        )
        return []
    specs = [_key_spec(i, entry, Path(path).parent, problems) for i, entry in enumerate(data["keys"])]
    found = [spec for spec in specs if spec is not None]
    names = [spec.name for spec in found]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{AGENT_KEYS_FILE}: the key name {name!r} is listed more than once.")
    prefixes = [spec.secret.rsplit("_", 1)[0] for spec in found if spec.secret]
    for prefix in sorted({p for p in prefixes if prefixes.count(p) > 1}):
        problems.append(
            f"{AGENT_KEYS_FILE}: the key material with prefix {prefix} is given to more than one key."
        )
    return found


def _policy(path: str, scope: str, problems: list[str]) -> PolicyDocument | None:
    if scope not in POLICY_SCOPES:
        problems.append(f"{POLICY_SCOPE}={scope!r}: must be global or tenant.")
    try:
        return policy_file_parse(policy_file_read(path), source=path)
    except PolicyFileError as exc:
        problems.append(f"{POLICY_FILE}: {exc}")
        return None


def bootstrap_inputs() -> BootstrapInputs:
    """Every input, read and checked; ``BootstrapError`` listing every problem. Touches no table."""
    problems: list[str] = []
    slug, username = _env(TENANT), _env(ADMIN_USERNAME)
    problems.extend(_tenant_problems(slug, _env(TENANT_NAME)))
    password = _secret(ADMIN_PASSWORD, problems)
    keys_path, policy_path = _env(AGENT_KEYS_FILE), _env(POLICY_FILE)
    scope = _env(POLICY_SCOPE) or "global"
    if not slug:
        needing = [
            name for name, value in ((ADMIN_USERNAME, username), (AGENT_KEYS_FILE, keys_path)) if value
        ]
        if scope == "tenant" and policy_path:
            needing.append(f"{POLICY_SCOPE}=tenant")
        if needing:
            problems.append(f"{', '.join(needing)} need(s) a tenant: set {TENANT} (its slug).")
    problems.extend(_admin_problems(username, _env(ADMIN_EMAIL), password))
    specs = _key_specs(keys_path, problems) if keys_path else []
    document = _policy(policy_path, scope, problems) if policy_path else None
    issued_keys_file = _env(ISSUED_KEYS_FILE)
    if issued_keys_file and not Path(issued_keys_file).parent.is_dir():
        problems.append(f"{ISSUED_KEYS_FILE}={issued_keys_file!r}: its folder does not exist.")
    if problems:
        raise BootstrapError(problems)
    return BootstrapInputs(
        tenant_slug=slug,
        tenant_name=_env(TENANT_NAME),
        admin_username=username,
        admin_email=_env(ADMIN_EMAIL),
        admin_password=password,
        keys=specs,
        policy_path=policy_path,
        policy_scope=scope,
        policy=document,
        issued_keys_file=issued_keys_file,
    )


# --- Applying them -------------------------------------------------------------------------------


@dataclass(frozen=True)
class IssuedKey:
    """A key the server issued (no secret_file), handed over once (``_hand_over_issued``)."""

    name: str
    prefix: str
    scopes: list[str]
    secret: str = field(repr=False)

    @property
    def created(self) -> str:
        return f"Created key {self.prefix} ({self.name}, {', '.join(self.scopes)})"


@dataclass
class BootstrapReport:
    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Keys the server issued (no secret_file), to print once (to a terminal only).
    issued: list[IssuedKey] = field(default_factory=list)
    changed: bool = False

    def did(self, line: str) -> None:
        self.lines.append(line)
        self.changed = True


def _tenant(inputs: BootstrapInputs, report: BootstrapReport) -> Tenant | None:
    if not inputs.tenant_slug:
        return None
    tenant = Tenant.objects.filter(slug=inputs.tenant_slug).first()
    if tenant is None:
        tenant = keys.tenant_get_or_create(slug=inputs.tenant_slug, name=inputs.tenant_name)
        report.did(f"Created tenant {tenant.slug} ({tenant.name}).")
        return tenant
    report.lines.append(f"Tenant {tenant.slug} exists: left as it is.")
    if inputs.tenant_name and inputs.tenant_name != tenant.name:
        report.warnings.append(
            f"Tenant {tenant.slug} is named {tenant.name!r}, not {inputs.tenant_name!r}; bootstrap does not rename it."
        )
    return tenant


def _admin(inputs: BootstrapInputs, tenant: Tenant, report: BootstrapReport) -> None:
    username = inputs.admin_username
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        if not inputs.admin_password:
            raise BootstrapError(
                [
                    f"User {username} does not exist: set {ADMIN_PASSWORD} or {ADMIN_PASSWORD}_FILE to create them."
                ]
            )
        staff.staff_set(
            username=username,
            password=inputs.admin_password,
            tenant=tenant,
            role=Membership.Role.ADMIN,
            email=inputs.admin_email,
            actor=ACTOR,
        )
        report.did(f"Created user {username}: admin at {tenant.slug} (Django admin access).")
        return
    role = Membership.objects.filter(user=user, tenant=tenant).values_list("role", flat=True).first()
    report.lines.append(
        f"User {username} exists: left as it is (password not reset; {role or 'no role'} at {tenant.slug})."
    )
    if role != Membership.Role.ADMIN:
        report.warnings.append(
            f"User {username} is not an admin at {tenant.slug}; bootstrap does not change an existing "
            f"user: manage.py create_staff gives a role."
        )


def _owner(spec: KeySpec) -> Any:
    if not spec.owner:
        return None
    person = get_user_model().objects.filter(username=spec.owner).first()
    if person is None:
        raise BootstrapError([f"{spec.where}: no user is named {spec.owner!r} (the key's owner)."])
    return person


def _existing_key_problem(spec: KeySpec, tenant: Tenant) -> tuple[AgentKey | None, str]:
    """The stored key ``spec``'s material belongs to (or None), or why bootstrap cannot go on."""
    prefix = spec.secret.rsplit("_", 1)[0]
    key = AgentKey.objects.filter(prefix=prefix).first()
    if key is None:
        active = list(
            AgentKey.objects.filter(tenant=tenant, name=spec.name, revoked_at__isnull=True).values_list(
                "prefix", flat=True
            )
        )
        if active:
            return None, (
                f"{spec.where}: tenant {tenant.slug} already has an active key named {spec.name} "
                f"({', '.join(sorted(active))}) and the secret_file holds another one. Bootstrap never "
                "rotates a key: revoke the old one (manage.py revoke_agent_key --prefix …) to have this "
                "one imported, or put the current key back in the file."
            )
        return None, ""
    if key.tenant_id != tenant.pk or key.name != spec.name:
        return key, f"{spec.where}: the prefix {prefix} is the key of another agent; make new key material."
    if not keys.agent_key_matches(key=key, raw=spec.secret):
        return key, (
            f"{spec.where}: the secret_file does not match the stored key {prefix} (same prefix, "
            "another secret). Bootstrap never replaces a key's secret: restore the file, or revoke the "
            "key and give new key material."
        )
    if key.revoked_at is not None:
        return key, f"{spec.where}: key {prefix} was revoked; give new key material to replace it."
    return key, ""


def _key_drift(spec: KeySpec, key: AgentKey, report: BootstrapReport) -> None:
    owner = key.owner.get_username() if key.owner_id and key.owner else ""
    if sorted(set(spec.scopes)) != sorted(key.scopes) or spec.owner != owner:
        report.warnings.append(
            f"Key {key.prefix} ({spec.name}) has scopes {','.join(key.scopes)}"
            f"{f' and owner {owner}' if owner else ''}, not what the keys file says; bootstrap does not "
            "change a key: issue a new one and revoke this one."
        )


def _key(spec: KeySpec, tenant: Tenant, report: BootstrapReport) -> None:
    if spec.secret:
        key, problem = _existing_key_problem(spec, tenant)
        if problem:
            raise BootstrapError([problem])
        if key is not None:
            report.lines.append(f"Key {key.prefix} ({spec.name}) exists: left as it is.")
            _key_drift(spec, key, report)
            return
        key = keys.agent_key_import(
            tenant=tenant,
            name=spec.name,
            secret=spec.secret,
            scopes=spec.scopes,
            actor=ACTOR,
            owner=_owner(spec),
        )
        report.did(f"Imported key {key.prefix} ({spec.name}, {', '.join(key.scopes)}) from its secret_file.")
        return
    active = AgentKey.objects.filter(tenant=tenant, name=spec.name, revoked_at__isnull=True).order_by(
        "created_at"
    )
    existing = active.first()
    if existing is not None:
        report.lines.append(f"Key {existing.prefix} ({spec.name}) exists: left as it is.")
        _key_drift(spec, existing, report)
        return
    issued = keys.agent_key_create(
        tenant=tenant, name=spec.name, scopes=spec.scopes, actor=ACTOR, owner=_owner(spec)
    )
    report.changed = True
    report.issued.append(
        IssuedKey(
            name=spec.name, prefix=issued.key.prefix, scopes=list(issued.key.scopes), secret=issued.secret
        )
    )


def _policies(inputs: BootstrapInputs, tenant: Tenant | None, report: BootstrapReport) -> None:
    assert inputs.policy is not None
    scope = tenant if inputs.policy_scope == "tenant" else None
    loaded = policy_file_load(document=inputs.policy, source=inputs.policy_path, tenant=scope, actor=ACTOR)
    where = f"tenant {loaded.scope}" if scope is not None else "the global"
    head = f"Policy file {inputs.policy_path} ({loaded.layout} layout) into {where} scope"
    if not loaded.changed:
        report.lines.append(f"{head}: unchanged ({len(loaded.unchanged)} entries).")
    else:
        removed = f", {len(loaded.removed)} removed ({', '.join(loaded.removed)})" if loaded.removed else ""
        report.did(f"{head}: {loaded.summary()}{removed}.")
    report.warnings.extend(loaded.warnings)


def _hand_over_issued(inputs: BootstrapInputs, report: BootstrapReport, *, may_print: bool) -> None:
    """Where the keys the server issued go, before the transaction commits (a key nobody received
    is never left active). A deploy job's stdout is its log, kept and shown to whoever reads the
    Job: with ``SAGA_BOOTSTRAP_ISSUED_KEYS_FILE``, each key is appended to that
    file (created 0600) as a JSON line and named on stdout by its prefix only; without it a key is
    printed only to a terminal (``may_print``), else the run is refused."""
    if not report.issued:
        return
    if not inputs.issued_keys_file:
        if may_print:
            return
        raise BootstrapError(
            [
                f"{key.created} would be printed into a log (the output is not a terminal): give it "
                f"a secret_file, or set {ISSUED_KEYS_FILE} to a file the keys are written to."
                for key in report.issued
            ]
        )
    lines = [json.dumps({"name": k.name, "prefix": k.prefix, "key": k.secret}) + "\n" for k in report.issued]
    try:
        descriptor = os.open(inputs.issued_keys_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(descriptor, "a", encoding="utf-8") as out:
            out.writelines(lines)
    except OSError as exc:
        raise BootstrapError([f"{ISSUED_KEYS_FILE}={inputs.issued_keys_file!r}: {exc.strerror}."]) from None
    report.lines.extend(f"{key.created}: written to {inputs.issued_keys_file}." for key in report.issued)
    report.issued = []


@transaction.atomic
def bootstrap_apply(inputs: BootstrapInputs, *, may_print: bool = False) -> BootstrapReport:
    """Create what ``inputs`` declare and is missing, in one transaction: any refusal
    (``BootstrapError``, or a service's ``SagaError``) changes nothing. ``may_print``: the output
    is a terminal, where a key the server issues may be shown (``_hand_over_issued``)."""
    report = BootstrapReport()
    tenant = _tenant(inputs, report)
    if tenant is not None and inputs.admin_username:
        _admin(inputs, tenant, report)
    for spec in inputs.keys:
        assert tenant is not None
        try:
            _key(spec, tenant, report)
        except errors.SagaError as exc:
            raise BootstrapError([f"{spec.where}: {exc.message}"]) from None
    if inputs.policy is not None:
        _policies(inputs, tenant, report)
    _hand_over_issued(inputs, report, may_print=may_print)
    return report
