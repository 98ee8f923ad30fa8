"""The app's own error pages: a 404 in the app's frame, and a 500 page that needs no context."""

from __future__ import annotations

import pytest
from django.template.loader import render_to_string
from django.test import Client, override_settings


@pytest.mark.django_db
@override_settings(DEBUG=False)
def test_an_unknown_page_is_the_apps_404_not_djangos():
    response = Client().get("/no-such-page/")
    assert response.status_code == 404
    body = response.content.decode()
    assert "There is nothing here" in body and "URLconf" not in body


def test_the_500_page_renders_without_a_request_or_context():
    body = render_to_string("500.html")
    assert "Something went wrong on our side" in body and "request's id" in body
