"""Browsers ask every site for /favicon.ico; every dashboard page names its icon."""

from __future__ import annotations

from pathlib import Path

from django.contrib.staticfiles import finders
from django.urls import reverse


def test_favicon_ico_is_served_without_a_login(client, db):
    response = client.get("/favicon.ico")

    assert response.status_code == 200 and response["Content-Type"] == "image/x-icon"
    body = response.content
    assert body[:4] == b"\x00\x00\x01\x00"  # an ICO file (its PNG inside is the icon)
    assert b"\x89PNG" in body


def test_every_page_links_its_icon_and_the_icon_is_served(client, alice):
    icon = '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">'
    assert icon in client.get(reverse("login")).content.decode()
    client.force_login(alice)
    page = client.get(reverse("dashboard:queue")).content.decode()
    assert icon in page and 'href="/static/favicon.ico"' in page
    # The static files themselves (served by WhiteNoise; here found where it finds them).
    svg = finders.find("favicon.svg")
    assert isinstance(svg, str) and Path(svg).read_text().startswith("<svg")
