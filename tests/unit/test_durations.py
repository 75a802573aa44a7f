from __future__ import annotations

from datetime import timedelta

import pytest

from slawatch.config.durations import MAX_DURATION, format_duration, parse_duration
from slawatch.config.files import shorten


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
        parse_duration(text)


def test_format_round_trips() -> None:
    for text in ("1d6h", "45s", "2w", "1h30m"):
        assert format_duration(parse_duration(text)) == text
    assert format_duration(timedelta(0)) == "0s"


@pytest.mark.parametrize(
    "value",
    [
        "36500d",
        "5214w2d",  # 36500 days
        "P36500D",
        "PT876000H",
        36500 * 86400,
        float(36500 * 86400),
        "0" * 5000 + "1s",  # leading zeros are not digits of size
    ],
    ids=lambda v: shorten(v, 40),
)
def test_up_to_100_years_is_accepted(value: object) -> None:
    assert parse_duration(value) <= MAX_DURATION


@pytest.mark.parametrize(
    "value",
    [
        "36501d",
        "9999999d",
        "999999999d",
        "99999999999d",
        "9" * 400 + "s",  # more digits than float's range: inf
        "9" * 5000 + "w",  # more digits than int() will read
        "P999999999D",
        "P" + "9" * 400 + "W",
        "PT" + "9" * 400 + ".5S",
        36500 * 86400 + 1,
        10**400,
        1e300,
        float("inf"),
        timedelta(days=36501),
        timedelta.max,
    ],
    ids=lambda v: shorten(v, 40),
)
def test_longer_than_100_years_is_refused_naming_the_limit(value: object) -> None:
    with pytest.raises(ValueError) as exc:
        parse_duration(value)
    message = str(exc.value)
    assert message.endswith("is longer than 100 years, the most slawatch accepts"), message
    assert len(message) < 200


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (float("nan"), "nan is not a duration"),
        (float("-inf"), "-inf is negative"),
        (-1e300, "-1e+300 is negative"),
        ("PT1e400S", "'PT1e400S' is not a duration"),
        ("1e300", "'1e300' is not a duration"),
        (False, "False is not a duration"),
        ([1, 2], "[1, 2] is not a duration"),
        ({"h": 1}, "{'h': 1} is not a duration"),
        (None, "None is not a duration"),
    ],
)
def test_absurd_values_are_one_clear_error(value: object, expected: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_duration(value)
    assert str(exc.value).startswith(expected), str(exc.value)


def test_a_limit_of_the_callers_choosing() -> None:
    hour = timedelta(hours=1)
    assert parse_duration("PT1H", hour, "1 hour") == hour
    with pytest.raises(ValueError, match=r"^'61m' is longer than 1 hour, the most slawatch"):
        parse_duration("61m", hour, "1 hour")


def test_a_huge_value_is_quoted_in_short() -> None:
    with pytest.raises(ValueError) as exc:
        parse_duration("x" * 10_485_760)
    message = str(exc.value)
    assert "(10,485,760 characters) is not a duration" in message
    assert len(message) < 200


# What the forms are, and what is wrong with a value that nearly is one (an operator
# probe: '1ms' only said "not a duration", P10Y the same though it is ISO 8601).
AS_TEXT = "YAML reads it as text; write the seconds in digits, unquoted"
NO_YEARS = (
    "ISO 8601 years and months are not accepted (their length varies); write days, e.g. P3650D"
)
FORMS = "(a number of seconds, whole s, m, h, d, w (90s, 1h30m) or ISO 8601 (PT48H))"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1ms", f"'1ms' is not a duration: 'ms' is not a unit {FORMS}"),
        ("6 hourz", f"'6 hourz' is not a duration: 'hourz' is not a unit {FORMS}"),
        ("1.5h", f"'1.5h' is not a duration: 1.5h is not a whole number of h {FORMS}"),
        # YAML reads 1e9 (no dot, no sign in the exponent) and a quoted number as text.
        (
            "1e9",
            f"'1e9' is not a duration: {AS_TEXT} {FORMS}",
        ),
        (
            "30",
            f"'30' is not a duration: {AS_TEXT} {FORMS}",
        ),
        (
            "P10Y",
            f"'P10Y' is not a duration: {NO_YEARS}",
        ),
        (
            "P1M",
            f"'P1M' is not a duration: {NO_YEARS}",
        ),
        ("a fortnight", f"'a fortnight' is not a duration {FORMS}"),
        ("36501d", "'36501d' is longer than 100 years, the most slawatch accepts"),
    ],
)
def test_an_error_says_what_is_wrong_and_which_forms_are_read(text: str, expected: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_duration(text, yaml=True)
    assert str(exc.value) == expected


# Outside YAML (an environment variable, an argument, a query parameter) every value is
# text: a number there needs a unit, and "unquote it" would be advice for another file
# (an operator's SLAWATCH_RETENTION=30 was told YAML reads it as text).
TEXT_FORMS = "(whole s, m, h, d, w (90s, 1h30m) or ISO 8601 (PT48H))"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30", f"'30' is not a duration: a number needs a unit here, e.g. 30m or 30d {TEXT_FORMS}"),
        (" 0600", "'0600' is not a duration: a number needs a unit here, e.g. 600m or 600d"),
        (
            "1e9",
            f"'1e9' is not a duration: a number needs a unit here, e.g. 90s or 30d {TEXT_FORMS}",
        ),
        ("1.5", "'1.5' is not a duration: a number needs a unit here, e.g. 90s or 30d"),
        ("1ms", f"'1ms' is not a duration: 'ms' is not a unit {TEXT_FORMS}"),
        ("a fortnight", f"'a fortnight' is not a duration {TEXT_FORMS}"),
    ],
)
def test_outside_yaml_a_number_needs_a_unit(text: str, expected: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_duration(text)
    assert str(exc.value).startswith(expected), str(exc.value)
    assert "YAML" not in str(exc.value) and "a number of seconds" not in str(exc.value)


# ISO 8601 allows a fraction in its smallest unit; slawatch reads one in seconds only
# (an operator's P1.5D got the message of any text that is not a duration).
FRACTION = "ISO 8601 fractions are accepted in seconds only (PT0.5S)"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("P1.5D", f"'P1.5D' is not a duration: {FRACTION}; write P1DT12H or 1d12h"),
        ("P1,5D", f"'P1,5D' is not a duration: {FRACTION}; write P1DT12H or 1d12h"),
        ("p2.5d", f"'p2.5d' is not a duration: {FRACTION}; write P2DT12H or 2d12h"),
        ("P1.5W", f"'P1.5W' is not a duration: {FRACTION}; write P10DT12H or 1w3d12h"),
        ("PT1.5H", f"'PT1.5H' is not a duration: {FRACTION}; write PT1H30M or 1h30m"),
        ("P1DT0.5M", f"'P1DT0.5M' is not a duration: {FRACTION}; write P1DT30S or 1d30s"),
        ("P0.00001D", f"'P0.00001D' is not a duration: {FRACTION}; write PT0.864S"),
        ("P1.5DT0.5S", f"'P1.5DT0.5S' is not a duration: {FRACTION}; write P1DT12H0.5S"),
        ("P" + "9" * 5000 + ".5D", f"is not a duration: {FRACTION}"),
    ],
)
def test_an_iso_fraction_of_a_day_says_what_to_write(text: str, expected: str) -> None:
    for yaml in (True, False):
        with pytest.raises(ValueError) as exc:
            parse_duration(text, yaml=yaml)
        assert str(exc.value).endswith(expected), str(exc.value)
        assert len(str(exc.value)) < 200
    written = expected.rsplit("write ", 1)[-1].split(" or ")
    if "write" in expected:  # what the message offers is read, as the same length
        assert len({parse_duration(w) for w in written}) == 1


def test_the_forms_the_errors_name_are_read() -> None:
    assert parse_duration(1e9) == timedelta(seconds=1e9)
    assert parse_duration(1000000000) == timedelta(seconds=1e9)
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("3650d") == timedelta(days=3650)
    assert parse_duration("P3650D") == timedelta(days=3650)
    assert parse_duration("P1DT12H") == timedelta(days=1, hours=12)
