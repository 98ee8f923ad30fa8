"""Seeds a throwaway database for the database outage test, run as ``python -m
tests.reliability.outage_seed <webhook base URL> <sagas>`` with DATABASE_URL pointing at it: the
test process's own ORM is on the suite's database, not on the server the test stops. Prints JSON:
the operator key's secret, Alice's session cookie and, per failed saga, its recovery item and its actions."""

from __future__ import annotations

import json
import os
import sys


class _Hooks:
    def __init__(self, base: str) -> None:
        self.base = base

    def url(self, path: str) -> str:
        return f"{self.base}{path}"


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "saga_admin.settings")
    import django

    django.setup()
    from ledger.audit import Actor
    from ledger.models import Tenant
    from ledger.services.keys import agent_key_create
    from tests.factories import failed_saga, load_reliability_policies

    base, count = sys.argv[1], int(sys.argv[2])
    tenant = Tenant.objects.create(slug="acme", name="Acme Corp")
    system = Actor.system("tests")
    agent = Actor.for_key(
        agent_key_create(tenant=tenant, name="onboarding-agent", scopes=["agent"], actor=system).key
    )
    operator = agent_key_create(tenant=tenant, name="supervisor", scopes=["operator"], actor=system)
    load_reliability_policies(hooks=_Hooks(base))  # type: ignore[arg-type]  # only its url() is used
    sagas = [failed_saga(tenant, agent, steps=2) for _ in range(count)]
    # Alice's dashboard session, stored in the database like every session.
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    from ledger.models import Membership

    alice = get_user_model().objects.create_user(username="alice", password="correct-horse-battery")
    Membership.objects.create(user=alice, tenant=tenant, role="operator")
    browser = Client()
    browser.force_login(alice)
    session = {settings.SESSION_COOKIE_NAME: browser.cookies[settings.SESSION_COOKIE_NAME].value}
    print(
        json.dumps(
            {
                "operator": operator.secret,
                "session": session,
                "sagas": [{"item": str(s.item.pk), "actions": [str(a.pk) for a in s.actions]} for s in sagas],
            }
        )
    )


if __name__ == "__main__":
    main()
