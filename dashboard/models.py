"""Single sign-on's records (dashboard/sso/): who a provider's account is here, and which roles
single sign-on granted (and so may take away)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from ledger.models import Membership


class SsoIdentity(models.Model):
    """One Django user per account at an identity provider, keyed by the issuer and its ``sub``:
    never by e-mail or username, which the provider lets people change and which two accounts may
    share. The same account is the same user (one person, one approver) whatever it is renamed to."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity"
    )
    issuer = models.CharField(max_length=255)
    # OIDC Core 2: "It MUST NOT exceed 255 ASCII characters in length."
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_one_user_per_subject"),
        ]
        verbose_name = "single sign-on identity"
        verbose_name_plural = "single sign-on identities"

    def __str__(self) -> str:
        return f"{self.subject} @ {self.issuer}"


class SsoMembership(models.Model):
    """A membership single sign-on granted from the provider's claim. Only these are changed and
    removed when the claim changes; a role granted here by hand (create_staff, the Django admin)
    stays as granted."""

    membership = models.OneToOneField(Membership, on_delete=models.CASCADE, related_name="sso_managed")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "membership granted by single sign-on"

    def __str__(self) -> str:
        return f"SSO: {self.membership}"


class SavedFilter(models.Model):
    """A queue filter an operator named for themselves: the queue's query string as it was when
    saved (whatever fields the filter had then), read back through the queue's filter form each
    time it is used — never trusted as stored. Written only by ``dashboard.saved_filters``."""

    NAME_MAX_LENGTH = 80
    QUERY_MAX_LENGTH = 2000

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_filters")
    name = models.CharField(max_length=NAME_MAX_LENGTH)
    query = models.CharField(max_length=QUERY_MAX_LENGTH)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "name"], name="saved_filter_name_unique_per_user"),
            models.CheckConstraint(condition=~models.Q(name=""), name="saved_filter_name_not_empty"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.user_id})"
