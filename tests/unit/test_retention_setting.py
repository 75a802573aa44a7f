"""SLAWATCH_RETENTION: a bounded duration; a bad value is one line and exit 2."""

from __future__ import annotations

from datetime import timedelta

import pytest

from slawatch.cli import main
from slawatch.config.settings import Settings


@pytest.mark.parametrize(
    ("value", "expected"),
    [("30d", timedelta(days=30)), ("1h", timedelta(hours=1)), ("P2W", timedelta(weeks=2))],
)
def test_a_retention_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: timedelta
) -> None:
    monkeypatch.setenv("SLAWATCH_RETENTION", value)
    assert Settings().retention == expected


def test_the_default_is_30_days(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLAWATCH_RETENTION", raising=False)
    assert Settings().retention == timedelta(days=30)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "a fortnight",
            # A variable is text: a bare number is not one of its forms.
            "SLAWATCH_RETENTION: 'a fortnight' is not a duration (whole s, m, h, d, w",
        ),
        ("59m", "SLAWATCH_RETENTION: '59m' is shorter than 1h, the least slawatch accepts"),
        ("3651d", "SLAWATCH_RETENTION: '3651d' is longer than 10 years, the most slawatch"),
        ("9" * 400 + "d", "is longer than 10 years"),
    ],
)
def test_a_bad_retention_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    monkeypatch.setenv("SLAWATCH_RETENTION", value)
    assert main(["check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("slawatch: error: "), err
    assert message in err
    assert len(err) < 200  # an absurd value is quoted short


def test_the_dedupe_window_is_a_setting_of_a_day_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SLAWATCH_DEDUPE_WINDOW", raising=False)
    assert Settings().dedupe_window == timedelta(days=1)
    monkeypatch.setenv("SLAWATCH_DEDUPE_WINDOW", "2h")
    assert Settings().dedupe_window == timedelta(hours=2)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "SLAWATCH_DEDUPE_WINDOW: 'soon' is not a duration"),
        ("5m", "SLAWATCH_DEDUPE_WINDOW: '5m' is shorter than 10m, the least slawatch accepts"),
        ("3651d", "SLAWATCH_DEDUPE_WINDOW: '3651d' is longer than 10 years"),
    ],
)
def test_a_bad_dedupe_window_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    monkeypatch.setenv("SLAWATCH_DEDUPE_WINDOW", value)
    assert main(["check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("slawatch: error: "), err
    assert message in err
