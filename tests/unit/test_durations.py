from __future__ import annotations

from datetime import timedelta

import pytest

from slawatch.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("15m", timedelta(minutes=15)),
        ("48h", timedelta(hours=48)),
        ("1d", timedelta(days=1)),
        ("1w", timedelta(weeks=1)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1h 30m", timedelta(hours=1, minutes=30)),
        ("PT48H", timedelta(hours=48)),
        ("P1DT2H", timedelta(days=1, hours=2)),
        ("PT0.5S", timedelta(seconds=0.5)),
        ("0s", timedelta(0)),
        (30, timedelta(seconds=30)),
    ],
)
def test_parse(text: str | int, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["6 hourz", "", "h", "P", "PT", "1.5h", "-5s", -5, True, "48"])
def test_parse_rejects_with_hint(text: object) -> None:
    with pytest.raises(ValueError, match=r"duration|negative"):
        parse_duration(text)  # type: ignore[arg-type]


def test_format_round_trips() -> None:
    for text in ("1d6h", "45s", "2w", "1h30m"):
        assert format_duration(parse_duration(text)) == text
    assert format_duration(timedelta(0)) == "0s"
