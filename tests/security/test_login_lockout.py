"""The login lockout cannot be escaped by changing address: an IPv6 client is counted by its /64,
the address is the one our own proxies saw (``SAGA_TRUSTED_PROXY_HOPS``), and many addresses
guessing one username are stopped at a higher, per-username ceiling. Through the whole middleware
and URL stack (axes runs inside the pages' middleware and its authentication backend)."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery"  # tests/conftest.py's _user


def _login(username: str, password: str, *, address: str, forwarded: str | None = None):
    headers = {"X-Forwarded-For": forwarded} if forwarded is not None else {}
    return Client(REMOTE_ADDR=address).post(
        "/login/", {"username": username, "password": password}, headers=headers
    )


def _signed_in(response) -> bool:
    return response.status_code == 302 and response.headers["Location"] == "/"


def test_an_ipv6_client_cannot_rotate_addresses_within_its_64_to_keep_guessing(alice, settings):
    """Pass: five wrong passwords for alice, each from another address of one /64, lock alice out
    of that whole /64 (429 saying for how long, even with the right password), while alice from
    another /64 still signs in. Before, each IPv6 address was a fresh counter."""
    assert settings.AXES_FAILURE_LIMIT == 5
    answers = [
        _login("alice", f"guess-{n}", address=f"2001:db8:aa:1:{n:x}:{n:x}:{n:x}:{n:x}").status_code
        for n in range(1, 6)
    ]
    assert answers == [200, 200, 200, 200, 429]
    same_64 = _login("alice", PASSWORD, address="2001:db8:aa:1:ffff:ffff:ffff:ffff")
    assert same_64.status_code == 429 and "Signing in is paused for 15 minutes" in same_64.content.decode()
    assert same_64.headers["Retry-After"] == "900"
    assert _signed_in(_login("alice", PASSWORD, address="2001:db8:aa:2::1"))


def test_many_addresses_guessing_one_username_are_stopped_at_its_ceiling(alice, bob, settings):
    """Pass: with a per-username ceiling of 8, eight wrong passwords for alice from eight addresses
    (one each, never reaching the per-address limit) lock alice out everywhere: the eighth guess
    and then her right password from a ninth address get the login page with 429, saying why and
    for how long; bob still signs in from that address."""
    settings.LOGIN_USERNAME_FAILURE_LIMIT = 8
    answers = [_login("alice", f"guess-{n}", address=f"198.51.100.{n}").status_code for n in range(1, 9)]
    assert answers == [200] * 7 + [429]
    elsewhere = _login("alice", PASSWORD, address="203.0.113.9")
    text = elsewhere.content.decode()
    assert elsewhere.status_code == 429 and "sessionid" not in elsewhere.cookies
    assert "from many addresses" in text and "Signing in is paused for 15 minutes" in text
    assert elsewhere.headers["Retry-After"] == "900"
    assert _signed_in(_login("bob", PASSWORD, address="203.0.113.9"))


def test_behind_our_proxy_each_client_is_counted_by_the_address_the_proxy_saw(alice, settings):
    """Pass: with one trusted proxy (``SAGA_TRUSTED_PROXY_HOPS=1``) every request comes from the
    proxy's address; alice's five wrong passwords from one client lock that client out (whatever
    it writes further left in X-Forwarded-For), and alice from another client still signs in.
    Before, everyone behind the proxy shared one counter per username."""
    settings.SAGA = {**settings.SAGA, "TRUSTED_PROXY_HOPS": 1}
    proxy = "10.0.0.2"
    for n in range(1, 6):
        # The client rotates what it claims; the proxy appends what it saw.
        _login("alice", f"guess-{n}", address=proxy, forwarded=f"192.0.2.{n}, 203.0.113.50")
    locked = _login("alice", PASSWORD, address=proxy, forwarded="192.0.2.99, 203.0.113.50")
    assert locked.status_code == 429
    assert _signed_in(_login("alice", PASSWORD, address=proxy, forwarded="203.0.113.51"))


def test_a_proxy_no_setting_names_is_said_in_the_log_once(alice, settings):
    """Pass: with SAGA_TRUSTED_PROXY_HOPS=0 (the default), a sign-in without X-Forwarded-For logs
    nothing about proxies; the first one with it (a proxy stands in front, and every client it
    forwards is counted as the proxy's address) logs ``login.untrusted_proxy`` naming the setting,
    and later ones do not repeat it. With the hop trusted, nothing is logged."""
    from structlog.testing import capture_logs

    from dashboard import login

    def warnings() -> list[dict]:
        return [line for line in logs if line["event"] == "login.untrusted_proxy"]

    login._warned.clear()
    with capture_logs() as logs:
        _login("alice", "guess", address="10.0.0.2")
        assert warnings() == []
        _login("alice", "guess", address="10.0.0.2", forwarded="203.0.113.50")
        _login("alice", "guess", address="10.0.0.2", forwarded="203.0.113.51")
    assert len(warnings()) == 1
    assert "SAGA_TRUSTED_PROXY_HOPS" in warnings()[0]["hint"]
    assert warnings()[0]["remote_addr"] == "10.0.0.2"

    login._warned.clear()
    settings.SAGA = {**settings.SAGA, "TRUSTED_PROXY_HOPS": 1}
    with capture_logs() as logs:
        _login("alice", "guess", address="10.0.0.2", forwarded="203.0.113.52")
    assert warnings() == []


def _known_browser(address: str) -> Client:
    """A browser that has signed in as alice (and signed out): it holds the known-device cookie."""
    browser = Client(REMOTE_ADDR=address)
    assert _signed_in(browser.post("/login/", {"username": "alice", "password": PASSWORD}))
    assert "saga_known_device" in browser.cookies
    browser.post("/logout/")
    return browser


def test_behind_a_proxy_no_setting_names_a_browser_that_signed_in_before_is_not_locked_out(alice, settings):
    """Pass: with SAGA_TRUSTED_PROXY_HOPS left at 0 behind a proxy, every client has the proxy's
    address. Five wrong passwords for alice from one client lock that address out (a browser
    that never signed in gets 429 even with the right password), but alice's own browser, which
    signed in before, still signs in. Before, alice was locked out everywhere."""
    assert settings.SAGA["TRUSTED_PROXY_HOPS"] == 0
    proxy = "10.0.0.2"
    alices = _known_browser(proxy)
    answers = [_login("alice", f"guess-{n}", address=proxy).status_code for n in range(1, 6)]
    assert answers == [200, 200, 200, 200, 429]
    assert _login("alice", PASSWORD, address=proxy).status_code == 429  # a stranger's browser
    assert _signed_in(alices.post("/login/", {"username": "alice", "password": PASSWORD}))


def test_a_known_browser_is_locked_by_its_own_failures_and_its_cookie_cannot_be_made(alice, bob, settings):
    """Pass: alice's known browser is counted by itself: five wrong passwords lock it (429, "from
    this browser", even with the right password) while another browser at the same address is not
    held by them; the cookie names alice only (for bob it is a stranger's); an altered cookie is no
    cookie."""
    proxy = "10.0.0.3"
    alices = _known_browser(proxy)
    answers = [
        alices.post("/login/", {"username": "alice", "password": f"guess-{n}"}).status_code
        for n in range(1, 6)
    ]
    assert answers == [200, 200, 200, 200, 429]
    locked = alices.post("/login/", {"username": "alice", "password": PASSWORD})
    assert locked.status_code == 429 and "from this browser" in locked.content.decode()
    # Its failures were counted for its address too: a stranger's browser there meets the
    # address rule, as before.
    assert _login("alice", PASSWORD, address=proxy).status_code == 429
    # For bob the cookie means nothing: his own sign-in from that browser is judged by address.
    assert _signed_in(alices.post("/login/", {"username": "bob", "password": PASSWORD}))

    forged = Client(REMOTE_ADDR="10.0.0.4")
    value = alices.cookies["saga_known_device"].value
    forged.cookies["saga_known_device"] = value[:-2] + ("A" if value[-2] != "A" else "B") + value[-1]
    for n in range(1, 6):
        _login("alice", f"guess-{n}", address="10.0.0.4")
    assert forged.post("/login/", {"username": "alice", "password": PASSWORD}).status_code == 429
