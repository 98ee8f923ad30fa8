"""Money as people read it: 1400 cents → "$14.00"."""

from __future__ import annotations

from decimal import Decimal

from django import template

register = template.Library()

_SYMBOLS = {"usd": "$", "eur": "€", "gbp": "£"}


@register.filter
def cents(value: int | None, currency: str = "usd") -> str:
    if value is None:
        return "—"
    amount = Decimal(int(value)) / 100
    symbol = _SYMBOLS.get(str(currency or "usd").lower())
    text = f"{amount:,.2f}"
    return f"{symbol}{text}" if symbol else f"{text} {str(currency).upper()}"
