"""Saga Admin settings.

Everything comes from the environment (the Procfile processes read nothing else). The settings
fail closed: DEBUG is off unless set, and without a SECRET_KEY nothing starts unless DEBUG=1 (a
development machine: `make run` and the test suite say so). Production: a real SECRET_KEY and
ALLOWED_HOSTS pass ``manage.py check --deploy``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

# Prometheus's multiprocess directory (infra.metrics), ready before any library builds a metric
# as it is imported (django-rq's admin does): a missing or unwritable PROMETHEUS_MULTIPROC_DIR
# stops every process here, naming it.
import infra.metrics  # noqa: F401, I001 - first, on purpose
from dashboard.sso.conf import authentication_backends, sso_settings_from_env
from infra import redis_connection
from infra.env import env_secret
from ledger.prune_windows import idempotency_retention_s, notification_retention_s

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    return [part.strip() for part in value.split(",") if part.strip()]


# The demo world (/demo-world/: pretend HR, workspace, email, CRM and payments systems, and their
# tables) is served only where the demo runs: `make run` sets SAGA_DEMO=1. Off, its paths are 404.
SAGA_DEMO = env_bool("SAGA_DEMO", False)

# Fail closed: a deploy that forgets an environment variable must not run with debug pages or
# forgeable sessions. DEBUG is off unless set; with it off, no SECRET_KEY means no start at all:
# every management command and the web process load these settings first (manage.py and
# saga_admin/wsgi.py turn this error into one line).
DEBUG = env_bool("DEBUG", False)
# Secrets (this one, DATABASE_URL, REDIS_URL and the SAGA_* secrets) may come from a mounted file
# instead: NAME_FILE=/run/secrets/name (infra.env; both set, or an unreadable file, refuse to
# start naming them).
SECRET_KEY = env_secret("SECRET_KEY").strip()
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set. Set SECRET_KEY to a long random value (for example the output of "
            "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`), the same for every "
            "process of a deployment; or set DEBUG=1 on a development machine."
        )
    # Development only (DEBUG=1): a fixed, public key; `manage.py check --deploy` flags it.
    SECRET_KEY = "django-insecure-dev-only-saga-admin-key-change-me"
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django.contrib.postgres",
    "pgtrigger",
    "django_htmx",
    "template_partials",
    "django_rq",
    "ninja",
    "csp",
    "axes",
    "saga_admin",
    "ledger",
    "recovery",
    "recovery.audit_stream",  # its own tables (app label audit_stream): docs/OPERATIONS.md
    "recovery.bulk",  # bulk decisions by filter (app label bulk): docs/RECOVERY.md
    "dashboard",
    "demo",
]

MIDDLEWARE = [
    # Times every request, the middleware below included (saga_admin.metrics).
    "saga_admin.metrics.RequestMetricsMiddleware",
    "saga_admin.middleware.RequestIdMiddleware",
    # /healthz, /livez, /readyz and /metrics: answered here, for any Host and over plain HTTP
    # (probes and Prometheus ask by the container's or the pod's own address).
    "saga_admin.health.ProbeMiddleware",
    # /api/: the key is checked before the body is read (401/429 unread), then the body's size
    # (413), content type (415), JSON well-formedness and depth, before any view.
    "saga_admin.api.limits.ApiGateMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # Sessions, CSRF, the logged-in user, messages, the idle timeout, htmx and the login lockout,
    # in that order, for the pages only: /api/ goes past them (saga_admin.middleware).
    "saga_admin.middleware.PageMiddleware",
]

# Django's and axes' checks look for these middleware by name in MIDDLEWARE; they run inside
# PageMiddleware instead (pages only), and saga_admin.E001/E002 check that in their place.
SILENCED_SYSTEM_CHECKS = ["admin.E408", "admin.E409", "admin.E410", "axes.W002", "security.W003"]

ROOT_URLCONF = "saga_admin.urls"
WSGI_APPLICATION = "saga_admin.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboard.context_processors.nav",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_secret("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/saga_admin"),
        conn_max_age=env_int("DB_CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
# Django's PostgreSQL backend with a health check of reused connections that needs no round trip
# when the socket shows the server has not closed it (infra/postgresql/base.py): Django's
# `SELECT 1` before each request's first query doubled every ledger write's round trips.
DATABASES["default"]["ENGINE"] = "infra.postgresql"
# Behind a connection pooler (SAGA_DB_POOLER: unset for a direct connection, `session` or
# `transaction` for PgBouncer's pool modes; docs/DEPLOY.md, "Behind PgBouncer"). A pooler refuses
# the `options` startup parameter outright (PgBouncer: "unsupported startup parameter: options"),
# so behind one the settings send none; transaction pooling also hands each transaction whichever
# server connection is free, so a server-side cursor (QuerySet.iterator()'s, WITH HOLD outside a
# transaction) may be gone by the next fetch: Django declares none.
SAGA_DB_POOLER = os.environ.get("SAGA_DB_POOLER", "").strip().lower()
if SAGA_DB_POOLER not in {"", "session", "transaction"}:
    raise ImproperlyConfigured(
        f"SAGA_DB_POOLER={SAGA_DB_POOLER!r}: set it to `transaction` or `session` (PgBouncer's pool "
        "mode in front of PostgreSQL), or leave it unset for a direct connection."
    )
DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = SAGA_DB_POOLER == "transaction"
# Short OLTP queries only: PostgreSQL's JIT compiled the plans of the dashboard's aggregates over
# a million actions, adding 20-40 ms to queries that run in a few (docs/BENCHMARKS.md).
# SAGA_DB_JIT_OFF=1 adds `-c jit=off` to whatever libpq options DATABASE_URL carries (not in their
# place). On by default for a direct connection; off by default behind a pooler, which would
# refuse every connection for it: there the role carries it (ALTER ROLE … SET jit = off).
if env_bool("SAGA_DB_JIT_OFF", not SAGA_DB_POOLER):
    _db_options = DATABASES["default"].setdefault("OPTIONS", {})
    _db_options["options"] = f"{_db_options.get('options', '')} -c jit=off".strip()
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_secret("REDIS_URL", "redis://127.0.0.1:6379/0")
# One Redis server, or the primary Redis Sentinel names (REDIS_SENTINELS, REDIS_SENTINEL_MASTER):
# every connection of every process comes from the two settings below (infra/redis_connection.py).
REDIS_TARGET = redis_connection.redis_target(
    REDIS_URL,
    sentinels=os.environ.get("REDIS_SENTINELS", ""),
    master=os.environ.get("REDIS_SENTINEL_MASTER", ""),
    sentinel_password=env_secret("REDIS_SENTINEL_PASSWORD"),
)
# Shared by every web process: the API's per-key throttle counts live here.
CACHES = {"default": redis_connection.cache(REDIS_TARGET, KEY_PREFIX="saga", TIMEOUT=300)}
RQ_QUEUES = {
    name: redis_connection.rq_queue(REDIS_TARGET, DEFAULT_TIMEOUT=env_int("SAGA_JOB_TIMEOUT_S", 300))
    for name in ("default", "compensations", "notifications")
}
# Our own code enqueues with transaction.on_commit explicitly; django-rq's default
# (on_db_commit) would silently defer any other enqueue too, which is what we want.
RQ = {"COMMIT_MODE": "on_db_commit"}
# django-rq's pages show every tenant's jobs: only at /django-rq/, for superusers
# (dashboard/views/workers.py), not also inside the Django admin, where any staff user (a tenant admin)
# would reach them.
RQ_SHOW_ADMIN_LINK = False

# Staff passwords (create_staff, the Django admin, changepassword): Django's full standard set.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 12},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Single sign-on (OIDC) for the dashboard: off unless SAGA_OIDC_ISSUER is set; SAGA_LOCAL_LOGIN=0
# turns password sign-in off (dashboard/sso/conf.py reads and checks them; docs/OPERATIONS.md).
# Its backend answers only the SSO callback, ahead of the password lockout (dashboard/sso/backend.py);
# with password sign-in off, the password backend is not listed at all.
SAGA_SSO = sso_settings_from_env()
AUTHENTICATION_BACKENDS = authentication_backends(SAGA_SSO)
LOGIN_URL = "login"
# A URL name, not a path: under a SCRIPT_NAME prefix (mounted under /saga), "/" is outside the site.
LOGIN_REDIRECT_URL = "dashboard:queue"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
# Where collectstatic writes and whitenoise serves from. From a checkout, the repository's
# staticfiles/; an installed server (pip install .) sets STATIC_ROOT, or gets one beside its
# packages in site-packages.
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", "").strip() or BASE_DIR / "staticfiles")
# The repository's own static/ (the apps' static/ folders travel inside their packages); an
# installed server has none, and a missing folder would be a warning on every check.
STATICFILES_DIRS = [folder for folder in [BASE_DIR / "static"] if folder.is_dir()]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if DEBUG
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}

# --- Security -------------------------------------------------------------------------------
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
# /healthz, /livez, /readyz and /metrics answer plain HTTP and any Host, for load balancers,
# probes and Prometheus: ProbeMiddleware answers them before SecurityMiddleware's redirect.
# No SECURE_PROXY_SSL_HEADER: Django would believe X-Forwarded-Proto from whoever sends it. The
# scheme is gunicorn's wsgi.url_scheme, which it sets from X-Forwarded-Proto only for a peer in
# SAGA_TRUSTED_PROXY_IPS (the Procfile's --forwarded-allow-ips); anyone else's header is ignored.
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 8 * 3600)
SESSION_IDLE_TIMEOUT_S = env_int("SESSION_IDLE_TIMEOUT_S", 30 * 60)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

CONTENT_SECURITY_POLICY = {
    # django-rq's own dashboard uses inline scripts; it is admin-only.
    "EXCLUDE_URL_PREFIXES": ["/django-rq/"],
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "font-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = env_float("AXES_COOLOFF_HOURS", 0.25)
AXES_RESET_ON_SUCCESS = True
# Lock the (username, address) pair: guesses at alice's password from one address lock alice out
# from that address only, not every user behind the same office NAT, and not alice elsewhere.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# ... and, with a higher threshold, the username alone: guesses at alice's password from many
# addresses (a botnet, or one host rotating through its IPv6 /64s) are stopped too
# (dashboard.login.LockoutHandler).
AXES_HANDLER = "dashboard.login.LockoutHandler"
LOGIN_USERNAME_FAILURE_LIMIT = env_int("SAGA_LOGIN_USERNAME_FAILURE_LIMIT", 50)
# The address is the one the API's throttle counts (SAGA_TRUSTED_PROXY_HOPS), an IPv6 client by
# its /64.
AXES_CLIENT_IP_CALLABLE = "dashboard.login.client_ip"
# The login page again, saying for how long (429, Retry-After).
AXES_LOCKOUT_CALLABLE = "dashboard.login.locked_out"
AXES_VERBOSE = False

DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("SAGA_MAX_BODY_BYTES", 1024 * 1024)

EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "saga-admin@localhost")

# --- Saga Admin knobs (all overridable from the environment) -------------------------------
# The highest risk an e-mail decision link decides without a session (SAGA below).
EMAIL_LINK_MAX_RISK = os.environ.get("SAGA_EMAIL_LINK_MAX_RISK", "medium").strip().lower()
if EMAIL_LINK_MAX_RISK not in {"none", "low", "medium", "high", "critical"}:
    raise ImproperlyConfigured(
        f"SAGA_EMAIL_LINK_MAX_RISK={EMAIL_LINK_MAX_RISK!r}: set it to none, low, medium, high or "
        "critical (the highest risk an e-mail's Approve or Reject link decides without signing in)."
    )
SAGA: dict[str, Any] = {
    # API
    "MAX_BODY_BYTES": env_int("SAGA_MAX_BODY_BYTES", 1024 * 1024),
    "MAX_JSON_DEPTH": env_int("SAGA_MAX_JSON_DEPTH", 20),
    # How long an Idempotency-Key is remembered (SAGA_IDEMPOTENCY_RETENTION, a duration: 7d; never
    # below a day; the older SAGA_IDEMPOTENCY_KEY_TTL_H in hours is still read): ledger.prune_windows.
    "IDEMPOTENCY_RETENTION_S": idempotency_retention_s(),
    # Per API key, across all web processes. One busy agent is not the thing to cap: the default
    # sits well above what one server takes in appends (docs/BENCHMARKS.md), so it stops a runaway
    # loop, not a normal agent.
    "THROTTLE_RATE": os.environ.get("SAGA_THROTTLE_RATE", "60000/m"),
    # Request body bytes per API key, counted by declared length before the body is read: the CPU
    # a key can make the server spend parsing and storing JSON grows with its bytes, not with its
    # requests ("10MiB/m": ten near-limit bodies a minute; units B, KB, KiB, MB, MiB, GB, GiB).
    "THROTTLE_BYTES": os.environ.get("SAGA_THROTTLE_BYTES", "10MiB/m"),
    # Requests per API key that carry a URL the server checks (resolving its host) and will call —
    # a run's resume_url: no key makes the outbound guard resolve names at its own pace.
    "URL_RATE": os.environ.get("SAGA_URL_RATE", "60/m"),
    # How long a web process trusts an API key it has looked up (ledger.services.keys): a key
    # revoked in another process stops working within this many seconds (at once in its own).
    # 0: look the key up on every request.
    "KEY_CACHE_S": env_float("SAGA_KEY_CACHE_S", 5.0),
    # Requests under /api/ refused for want of a valid key, per client address (REMOTE_ADDR; the
    # address X-Forwarded-For gives only with this many trusted proxies in front, e.g. 1 behind
    # one nginx): over the rate, 429 instead of 401.
    "UNAUTHENTICATED_RATE": os.environ.get("SAGA_UNAUTHENTICATED_RATE", "60/m"),
    "TRUSTED_PROXY_HOPS": env_int("SAGA_TRUSTED_PROXY_HOPS", 0),
    # Signed requests Slack sends (button presses, the link command), per Slack workspace (team),
    # across all web processes: over the rate, 429. Refused ones (bad signature, malformed) count
    # per client address under SAGA_UNAUTHENTICATED_RATE instead.
    "SLACK_RATE": os.environ.get("SAGA_SLACK_RATE", "120/m"),
    # The installation's own Slack app's signing secret, which only the operator holds: a tenant
    # connected to it (`manage.py slack_app --tenant SLUG --installation-app`) decides with a press.
    # A tenant whose admin set a secret of its own only asks, and the person confirms in the
    # dashboard (recovery.actions.channels).
    "SLACK_SIGNING_SECRET": env_secret("SAGA_SLACK_SIGNING_SECRET").strip(),
    # Recovery engine
    "STEP_LEASE_S": env_int("SAGA_STEP_LEASE_S", 45),
    # The longest one compensator call may run: its worker renews the step's lease meanwhile, and
    # past this the job is stopped (its lease then expires and the step is retried).
    "STEP_MAX_S": env_int("SAGA_STEP_MAX_S", 900),
    "SWEEP_INTERVAL_S": env_int("SAGA_SWEEP_INTERVAL_S", 15),
    "HEARTBEAT_TIMEOUT_S": env_int("SAGA_HEARTBEAT_TIMEOUT_S", 300),
    # A resume command its agent has not acknowledged this long after it was issued is shown as
    # "not picked up" on the run and announced (e-mail, webhooks), once per command.
    "RESUME_ACK_TIMEOUT_S": env_int("SAGA_RESUME_ACK_TIMEOUT_S", 180),
    "APPROVAL_EXPIRY_H": env_float("SAGA_APPROVAL_EXPIRY_H", 24),
    "WEBHOOK_TIMEOUT_S": env_float("SAGA_WEBHOOK_TIMEOUT_S", 10),
    "COMPENSATOR_CHECK_MAX_AGE_DAYS": env_float("SAGA_COMPENSATOR_CHECK_MAX_AGE_DAYS", 30),
    "RETRY_BACKOFF_BASE_S": env_float("SAGA_RETRY_BACKOFF_BASE_S", 1.0),
    "RETRY_BACKOFF_MAX_S": env_float("SAGA_RETRY_BACKOFF_MAX_S", 60.0),
    "DEFAULT_MAX_ATTEMPTS": env_int("SAGA_MAX_ATTEMPTS", 5),
    # How long one worker job runs an unwind's steps back to back before the unwind goes to the
    # back of the queue (fairness between concurrent unwinds vs per-job overhead).
    "UNWIND_BATCH_S": env_float("SAGA_UNWIND_BATCH_S", 2.0),
    # Dashboard
    "QUEUE_SLA_MINUTES": env_int("SAGA_QUEUE_SLA_MINUTES", 30),
    "BULK_MAX_ITEMS": env_int("SAGA_BULK_MAX_ITEMS", 20),
    # A bulk decision by filter over more items than this asks the operator to type the count.
    "BULK_CONFIRM_THRESHOLD": env_int("SAGA_BULK_CONFIRM_THRESHOLD", 50),
    # A bulk decision by filter runs in this many parallel lanes (jobs): N workers decide N at a time.
    "BULK_LANES": env_int("SAGA_BULK_LANES", 4),
    # A lane's claim on a bulk item lasts this long (seconds): a killed lane's items wait that long.
    "BULK_LEASE_S": env_float("SAGA_BULK_LEASE_S", 30.0),
    "PAGE_SIZE": env_int("SAGA_PAGE_SIZE", 50),
    # Notifications: comma-separated e-mail addresses and webhook URLs.
    "NOTIFY_EMAILS": env_list("SAGA_NOTIFY_EMAILS", []),
    "NOTIFY_WEBHOOKS": env_list("SAGA_NOTIFY_WEBHOOKS", []),
    "NOTIFY_WEBHOOK_SECRET": env_secret("SAGA_NOTIFY_WEBHOOK_SECRET"),
    # Attempts per notification (backoff as compensators: SAGA_RETRY_BACKOFF_BASE_S doubling up
    # to 10x SAGA_RETRY_BACKOFF_MAX_S), then it is marked failed.
    "NOTIFY_MAX_ATTEMPTS": env_int("SAGA_NOTIFY_MAX_ATTEMPTS", 10),
    # Where PagerDuty channels that name no endpoint of their own send their events (the EU
    # service region: https://events.eu.pagerduty.com/v2/enqueue). The operator's: trusted.
    "PAGERDUTY_EVENTS_URL": os.environ.get(
        "SAGA_PAGERDUTY_EVENTS_URL", "https://events.pagerduty.com/v2/enqueue"
    ).strip(),
    # How long delivered, dropped and failed notifications are kept before the worker prunes them
    # (SAGA_NOTIFICATION_RETENTION, a duration: 30d; never below a day). Undelivered ones never are.
    "NOTIFICATION_RETENTION_S": notification_retention_s(),
    # An approval e-mail to a person who may decide it carries Approve and Reject links
    # (recovery.notifications.email_links): signed, single-use, bound to the approval, the person and the
    # arguments' hash, valid this many minutes (0: no decision links, only the inbox's). A link
    # decides without a session only for approvals of at most this risk (low, medium, high,
    # critical; "none": every link signs in first); above it, the link signs the person in first.
    "EMAIL_LINK_TTL_MIN": env_int("SAGA_EMAIL_LINK_TTL_MIN", 15),
    "EMAIL_LINK_MAX_RISK": EMAIL_LINK_MAX_RISK,
    # Where people reach this dashboard: the links in notifications point here.
    "PUBLIC_URL": os.environ.get("SAGA_PUBLIC_URL", "http://localhost:8000").rstrip("/"),
    # The master of the per-agent secrets that sign commands pushed to agents' resume_urls
    # (`manage.py resume_secret --tenant SLUG --agent NAME` prints one); unset: pushed unsigned.
    "RESUME_WEBHOOK_SECRET": env_secret("SAGA_RESUME_WEBHOOK_SECRET"),
    # URLs a tenant or agent chose (resume_url) reach only public addresses, except these internal
    # hosts (comma-separated `host` or `host:port`); resolving a name may take this long (short: a
    # name whose DNS server never answers holds the request or job that checks it this long).
    "OUTBOUND_ALLOWED_HOSTS": env_list("SAGA_OUTBOUND_ALLOWED_HOSTS", []),
    "OUTBOUND_RESOLVE_TIMEOUT_S": env_float("SAGA_OUTBOUND_RESOLVE_TIMEOUT_S", 1.0),
    # Retention (a policy file's audit.retention; recovery/archive): the archive destinations
    # tenants may name (comma-separated s3://bucket/prefix or file:///path; a tenant's must be at or
    # under one of them; none: retention cannot be configured), the S3 endpoint of an
    # S3-compatible store (else boto3's AWS_ENDPOINT_URL and credentials chain), how often the
    # worker archives the runs past their window, at most how many runs a pass (or a
    # `manage.py archive_runs` without --limit) archives, and whether records files are gzipped.
    "ARCHIVE_ALLOWED_URLS": env_list("SAGA_ARCHIVE_ALLOWED_URLS", []),
    "ARCHIVE_S3_ENDPOINT_URL": os.environ.get("SAGA_ARCHIVE_S3_ENDPOINT_URL", ""),
    "ARCHIVE_INTERVAL_S": env_float("SAGA_ARCHIVE_INTERVAL_S", 3600.0),
    "ARCHIVE_BATCH": env_int("SAGA_ARCHIVE_BATCH", 200),
    "ARCHIVE_GZIP": env_bool("SAGA_ARCHIVE_GZIP", True),
    # The bearer token GET /metrics (Prometheus) requires; unset, /metrics is 404.
    "METRICS_TOKEN": env_secret("SAGA_METRICS_TOKEN").strip(),
    # A worker that does not share the web's metrics directory (its own container or pod) serves
    # its own GET /metrics on this port, behind the same token (infra.metrics_endpoint); unset: none.
    "WORKER_METRICS_PORT": os.environ.get("SAGA_WORKER_METRICS_PORT", ""),
}

# The key that signs audit chain heads (ledger.audit_signing: the signed heads in the database and
# the audit stream's), kept outside the database; unset, nothing is signed. SAGA_AUDIT_KEY_FILE too.
AUDIT_KEY = env_secret("SAGA_AUDIT_KEY")
# How often the worker signs the chains that moved (seconds).
AUDIT_SIGN_INTERVAL_S = env_float("SAGA_AUDIT_SIGN_INTERVAL_S", 60.0)

# The audit stream to a SIEM (recovery/audit_stream; docs/OPERATIONS.md, "Audit stream"): the
# installation's own sinks (trusted, as the operator's) and the key that signs the chain heads.
AUDIT_STREAM: dict[str, Any] = {
    "SYSLOG_URL": os.environ.get("SAGA_AUDIT_SYSLOG_URL", ""),  # tcp://host:port, tcp+tls://host:port
    "SYSLOG_CA_FILE": os.environ.get("SAGA_AUDIT_SYSLOG_CA_FILE", ""),
    "SYSLOG_TLS_VERIFY": env_bool("SAGA_AUDIT_SYSLOG_TLS_VERIFY", True),
    "HEC_URL": os.environ.get("SAGA_AUDIT_HEC_URL", ""),
    "HEC_TOKEN": env_secret("SAGA_AUDIT_HEC_TOKEN"),
    "HEC_CA_FILE": os.environ.get("SAGA_AUDIT_HEC_CA_FILE", ""),
    "HEC_TLS_VERIFY": env_bool("SAGA_AUDIT_HEC_TLS_VERIFY", True),
    "KEY": AUDIT_KEY,
    "HEAD_INTERVAL_S": env_float("SAGA_AUDIT_HEAD_INTERVAL_S", 60.0),
    "BATCH": env_int("SAGA_AUDIT_BATCH", 500),
    "TIMEOUT_S": env_float("SAGA_AUDIT_TIMEOUT_S", 10.0),
}

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
RQ_LOG_LEVEL = os.environ.get("RQ_LOG_LEVEL", "WARNING").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "saga_admin.logs.json_formatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # Outbound HTTP: httpx logs every request URL at INFO (a chat webhook's URL is its secret)
        # and httpcore every response's headers at DEBUG (cookies). Callers log what matters.
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
        # RQ's per-job lines are asked for (RQ_LOG_LEVEL=INFO, or saga_worker -v 2), not shown by
        # default: the worker's own structured events say what went wrong.
        "rq.worker": {"level": RQ_LOG_LEVEL},
    },
}
