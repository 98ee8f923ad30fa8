"""Single sign-on (OIDC) for the dashboard, on mozilla-django-oidc: ``conf`` (the environment's
settings), ``discovery`` (the provider's metadata), ``claims`` (a claim's values → tenant and role),
``accounts`` (the one Django user per issuer and subject, and the memberships SSO manages),
``backend`` (the authentication backend the callback signs in through)."""
