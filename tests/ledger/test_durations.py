"""One duration grammar (``infra.durations``) for a limit's window, the agentSafety step time-out
and a rate's period: each reader takes every spelling the grammar has, and adds only its own
range (a rate's period also its unit in a word, "100/day")."""

import pytest

from infra.durations import duration_read, parse_duration
from infra.throttle import parse_rate
from ledger.policies.rule_checks import limits_problems
from ledger.policies.rule_compile import compile_rules
from ledger.policies.rule_words import describe_limit


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("2m", 120),
        ("1h", 3600),
        ("7d", 7 * 86400),
        ("1.5h", 5400),
        ("500ms", 0.5),
        ("45", 45),
        (" 2 M ", 120),
        ("1 d", 86400),
        ("250 MS", 0.25),
    ],
)
def test_the_grammar(text, seconds):
    duration = duration_read(text)
    assert duration is not None and duration.seconds == seconds
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "1y", "h", "-1s", "1e3s", "1 .5h", "1hours", "1,5h", "1 hour", "10min"])
def test_what_is_not_a_duration(text):
    assert duration_read(text) is None
    with pytest.raises(ValueError, match="must be a duration such as 30s or 2m"):
        parse_duration(text)


def test_a_boolean_is_not_a_number_of_seconds():
    with pytest.raises(ValueError, match="must be a duration"):
        parse_duration(True)


def _window(window):
    return {"window": window, "per": "agent", "max_count": 1}


@pytest.mark.parametrize(
    ("window", "seconds"), [("1d", 86400), ("90m", 5400), ("1.5h", 5400), ("2H", 7200), (" 10 s", 10)]
)
def test_a_window_takes_every_spelling_of_the_grammar(window, seconds):
    assert limits_problems([_window(window)]) == []
    [limit] = compile_rules([], [_window(window)]).limits
    assert limit.window_s == seconds


@pytest.mark.parametrize("window", ["0s", "500ms", "1.5s", "1 hour"])
def test_a_window_is_a_whole_number_of_seconds_above_0(window):
    assert limits_problems([_window(window)]) == [
        f"limits[0].window: expected a duration such as 30s, 15m, 1h, 24h or 7d, got '{window}'"
    ]


def test_a_window_reads_in_words_as_written():
    assert describe_limit(_window("15m")).startswith("at most 1 per agent per 15 minutes")
    assert describe_limit(_window("1.5h")).startswith("at most 1 per agent per 1.5 hours")
    assert describe_limit(_window("1D")).startswith("at most 1 per agent per day")


@pytest.mark.parametrize(
    ("rate", "expected"),
    [
        ("60/m", (60, 60)),
        ("60/15min", (60, 900)),
        ("5/2 H", (5, 7200)),
        ("1/1.5m", (1, 90)),
        ("2/hour", (2, 3600)),
        ("7", (7, 1)),
    ],
)
def test_a_rate_period_is_a_duration(rate, expected):
    assert parse_rate(rate) == expected


@pytest.mark.parametrize("rate", ["60/y", "60/0s", "60/500ms", "60/1.5s"])
def test_a_rate_period_is_a_whole_number_of_seconds(rate):
    with pytest.raises(ValueError, match="Unknown throttle period"):
        parse_rate(rate)
