"""One typed view of the ``SAGA`` settings dict (saga_admin/settings.py, all from the environment).

``saga()`` builds it on every call rather than once at import, so ``override_settings`` and the
``settings`` fixture in tests apply at once, and nobody reads ``settings.SAGA[...]`` with a cast
of their own. Building it is a dict lookup per field: cheap next to any query.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class SagaSettings:
    # API
    max_body_bytes: int
    max_json_depth: int
    # The two pruned stores' windows (ledger.prune_windows), in seconds.
    idempotency_retention_s: int
    notification_retention_s: int
    throttle_rate: str
    throttle_bytes: str
    url_rate: str
    unauthenticated_rate: str
    trusted_proxy_hops: int
    slack_rate: str
    slack_signing_secret: str
    key_cache_s: float
    # Recovery engine
    step_lease_s: int
    step_max_s: int
    sweep_interval_s: float
    heartbeat_timeout_s: int
    resume_ack_timeout_s: int
    approval_expiry_h: float
    webhook_timeout_s: float
    retry_backoff_base_s: float
    retry_backoff_max_s: float
    default_max_attempts: int
    unwind_batch_s: float
    # A compensator's dashboard check older than this is flagged (recovery.compensator_checks).
    compensator_check_max_age_days: float
    # Dashboard
    queue_sla_minutes: int
    bulk_max_items: int
    bulk_confirm_threshold: int
    # How many lanes (parallel chains of jobs) one bulk decision by filter runs in.
    bulk_lanes: int
    # How long a lane's claim on a bulk item holds before another lane may take the item.
    bulk_lease_s: float
    page_size: int
    # Notifications and commands
    notify_emails: tuple[str, ...]
    notify_webhooks: tuple[str, ...]
    notify_webhook_secret: str
    notify_max_attempts: int
    # The Events API endpoint of PagerDuty channels that name none (recovery.notifications.pagerduty).
    pagerduty_events_url: str
    public_url: str
    # Approve and Reject links in approval e-mails (recovery.notifications.email_links): minutes they stay
    # valid (0: none sent), and the highest risk they decide without a session ("none": no risk).
    email_link_ttl_min: int
    email_link_max_risk: str
    resume_webhook_secret: str
    # Outbound requests to URLs tenants or agents chose (infra.outbound)
    outbound_allowed_hosts: tuple[str, ...]
    outbound_resolve_timeout_s: float
    # Retention's archives (ledger.archive, recovery.archive): the destinations the operator
    # allows tenants to name, the S3 endpoint (empty: boto3's own configuration), how often the
    # worker archives, how many runs one pass archives, and whether records files are gzipped.
    archive_allowed_urls: tuple[str, ...]
    archive_s3_endpoint_url: str
    archive_interval_s: float
    archive_batch: int
    archive_gzip: bool


def saga() -> SagaSettings:
    raw = settings.SAGA
    return SagaSettings(
        max_body_bytes=int(raw["MAX_BODY_BYTES"]),
        max_json_depth=int(raw["MAX_JSON_DEPTH"]),
        idempotency_retention_s=int(raw["IDEMPOTENCY_RETENTION_S"]),
        notification_retention_s=int(raw["NOTIFICATION_RETENTION_S"]),
        throttle_rate=str(raw["THROTTLE_RATE"]),
        throttle_bytes=str(raw.get("THROTTLE_BYTES", "10MiB/m")),
        url_rate=str(raw.get("URL_RATE", "60/m")),
        unauthenticated_rate=str(raw["UNAUTHENTICATED_RATE"]),
        trusted_proxy_hops=int(raw["TRUSTED_PROXY_HOPS"]),
        slack_rate=str(raw.get("SLACK_RATE", "120/m")),
        slack_signing_secret=str(raw.get("SLACK_SIGNING_SECRET", "")),
        key_cache_s=float(raw["KEY_CACHE_S"]),
        step_lease_s=int(raw["STEP_LEASE_S"]),
        step_max_s=int(raw["STEP_MAX_S"]),
        sweep_interval_s=float(raw["SWEEP_INTERVAL_S"]),
        heartbeat_timeout_s=int(raw["HEARTBEAT_TIMEOUT_S"]),
        resume_ack_timeout_s=int(raw["RESUME_ACK_TIMEOUT_S"]),
        approval_expiry_h=float(raw["APPROVAL_EXPIRY_H"]),
        webhook_timeout_s=float(raw["WEBHOOK_TIMEOUT_S"]),
        retry_backoff_base_s=float(raw["RETRY_BACKOFF_BASE_S"]),
        retry_backoff_max_s=float(raw["RETRY_BACKOFF_MAX_S"]),
        default_max_attempts=int(raw["DEFAULT_MAX_ATTEMPTS"]),
        unwind_batch_s=float(raw["UNWIND_BATCH_S"]),
        compensator_check_max_age_days=float(raw.get("COMPENSATOR_CHECK_MAX_AGE_DAYS", 30)),
        queue_sla_minutes=int(raw["QUEUE_SLA_MINUTES"]),
        bulk_max_items=int(raw["BULK_MAX_ITEMS"]),
        bulk_confirm_threshold=int(raw.get("BULK_CONFIRM_THRESHOLD", 50)),
        bulk_lanes=max(1, int(raw.get("BULK_LANES", 4))),
        bulk_lease_s=max(1.0, float(raw.get("BULK_LEASE_S", 30.0))),
        page_size=int(raw["PAGE_SIZE"]),
        notify_emails=tuple(raw["NOTIFY_EMAILS"]),
        notify_webhooks=tuple(raw["NOTIFY_WEBHOOKS"]),
        notify_webhook_secret=str(raw["NOTIFY_WEBHOOK_SECRET"]),
        notify_max_attempts=int(raw.get("NOTIFY_MAX_ATTEMPTS", 10)),
        pagerduty_events_url=str(raw.get("PAGERDUTY_EVENTS_URL", "https://events.pagerduty.com/v2/enqueue")),
        public_url=str(raw.get("PUBLIC_URL", "http://localhost:8000")).rstrip("/"),
        email_link_ttl_min=max(0, int(raw.get("EMAIL_LINK_TTL_MIN", 15))),
        email_link_max_risk=str(raw.get("EMAIL_LINK_MAX_RISK", "medium")),
        resume_webhook_secret=str(raw["RESUME_WEBHOOK_SECRET"]),
        outbound_allowed_hosts=tuple(raw["OUTBOUND_ALLOWED_HOSTS"]),
        outbound_resolve_timeout_s=float(raw["OUTBOUND_RESOLVE_TIMEOUT_S"]),
        archive_allowed_urls=tuple(raw.get("ARCHIVE_ALLOWED_URLS", ())),
        archive_s3_endpoint_url=str(raw.get("ARCHIVE_S3_ENDPOINT_URL", "")),
        archive_interval_s=float(raw.get("ARCHIVE_INTERVAL_S", 3600.0)),
        archive_batch=int(raw.get("ARCHIVE_BATCH", 200)),
        archive_gzip=bool(raw.get("ARCHIVE_GZIP", True)),
    )
