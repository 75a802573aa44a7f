"""Durations as operators write them: ``30s``, ``1h30m``, ``1d``, ``2w`` or ISO 8601 ``PT48H``.

Every duration slawatch accepts is bounded. A rule's durations are added to
"now" by PostgreSQL (``now + after``, ``now + renotify.every``) on every claim;
a value PostgreSQL cannot add (``timestamp out of range``) would pass ``check``
and then fail every claim for good, and a value Python cannot hold
(``1e300`` seconds) is an ``OverflowError``. So the bound is checked here,
at load time, on the number before any ``timedelta`` is made.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator

from slawatch.config.files import shorten

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SHORT = re.compile(r"(?:(\d+)([smhdw]))+")
_SHORT_PART = re.compile(r"(\d+)([smhdw])")
_ISO = re.compile(
    r"P(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?"
    r"(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?"
)
# What parse_duration reads, in every error about a value that is not a duration.
_HINT = "a number of seconds, whole s, m, h, d, w (90s, 1h30m) or ISO 8601 (PT48H)"
_WORD = re.compile(r"(?:\d+(?:\.\d+)?[a-zµ]+)+")
_WORD_PART = re.compile(r"(\d+(?:\.\d+)?)([a-zµ]+)")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?")
_ISO_DATE = re.compile(r"P(?:\d+(?:\.\d+)?[YMWD])+(?:T.*)?")

# 100 years: PostgreSQL's timestamps reach the year 294276, so any "now" plus
# this (or a sum of a few of these) stays in range, and no rule needs more.
MAX_DURATION = timedelta(days=36500)
MAX_DURATION_TEXT = "100 years"


def parse_duration(
    text: object, limit: timedelta = MAX_DURATION, limit_text: str = MAX_DURATION_TEXT
) -> timedelta:
    """Parse a duration of at most ``limit``; raise ``ValueError`` with a hint otherwise.

    A bare number is seconds, so YAML's ``every: 30`` means 30 seconds. The
    message quotes at most about 80 characters of a bad value.
    """
    if isinstance(text, timedelta):
        return _bounded(text.total_seconds(), text, limit, limit_text, lambda: text)
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"{shorten(text)} is not a duration ({_HINT})")
    if isinstance(text, int | float):
        if isinstance(text, float) and math.isnan(text):
            raise ValueError(f"{shorten(text)} is not a duration ({_HINT})")
        number = text
        return _bounded(number, text, limit, limit_text, lambda: timedelta(seconds=number))
    s = text.strip()
    compact = s.replace(" ", "").lower()
    if compact and _SHORT.fullmatch(compact):
        parts = _SHORT_PART.findall(compact)
        # float() reads any number of digits; int() refuses more than 4300.
        approx = sum(float(n) * _UNITS[u] for n, u in parts)
        return _bounded(
            approx,
            text,
            limit,
            limit_text,
            lambda: timedelta(seconds=sum(int(n.lstrip("0") or "0") * _UNITS[u] for n, u in parts)),
        )
    upper = s.upper()
    iso = _ISO.fullmatch(upper)
    if iso and upper not in ("P", "PT") and not upper.endswith("T"):
        values = {k: float(v) for k, v in iso.groupdict().items() if v}
        approx = sum(values.get(u, 0.0) * _UNITS[u.lower()] for u in "wdhms")
        return _bounded(
            approx,
            text,
            limit,
            limit_text,
            lambda: timedelta(
                weeks=values.get("w", 0),
                days=values.get("d", 0),
                hours=values.get("h", 0),
                minutes=values.get("m", 0),
                seconds=values.get("s", 0),
            ),
        )
    raise ValueError(_not_a_duration(s, compact, upper))


def _not_a_duration(s: str, compact: str, upper: str) -> str:
    """Why ``s`` is not a duration: what is wrong with one that nearly is, and the forms."""
    why = ""
    if _NUMBER.fullmatch(compact):
        # YAML reads 1e9 (no dot) and a quoted number as text, not as a number.
        why = ": YAML reads it as text; write the seconds in digits, unquoted"
    elif _ISO_DATE.fullmatch(upper) and ("Y" in upper or "M" in upper.split("T")[0]):
        return (
            f"{shorten(s)} is not a duration: ISO 8601 years and months are not accepted"
            " (their length varies); write days, e.g. P3650D"
        )
    elif _WORD.fullmatch(compact):
        for number, unit in _WORD_PART.findall(compact):
            if unit not in _UNITS:
                why = f": {unit!r} is not a unit"
                break
            if "." in number:
                why = f": {number}{unit} is not a whole number of {unit}"
                break
    return f"{shorten(s)} is not a duration{why} ({_HINT})"


def _bounded(
    seconds: float,
    original: object,
    limit: timedelta,
    limit_text: str,
    make: Callable[[], timedelta],
) -> timedelta:
    """``make()`` once ``seconds`` is known to be in [0, limit]; the check comes first
    because making the timedelta of an absurd value raises OverflowError."""
    if seconds < 0:
        raise ValueError(f"{shorten(original)} is negative; a duration must be 0 or more")
    if seconds > limit.total_seconds():
        raise ValueError(
            f"{shorten(original)} is longer than {limit_text}, the most slawatch accepts"
        )
    return make()


def format_duration(value: timedelta) -> str:
    """The short form of a duration, e.g. ``1d6h``; ``0s`` for zero."""
    total = int(value.total_seconds())
    if total == 0:
        return "0s"
    out = []
    for unit in ("w", "d", "h", "m", "s"):
        size = _UNITS[unit]
        if total >= size:
            out.append(f"{total // size}{unit}")
            total %= size
    return "".join(out)


def shorter_than(value: Any, least_text: str, why: str = "") -> str:
    """The error for a duration ``value`` under the least slawatch accepts (``least_text``,
    e.g. "1s"; ``why``: the reason, as " (…)")."""
    return f"{shorten(value)} is shorter than {least_text}, the least slawatch accepts{why}"


def duration_validator(
    *,
    positive: bool,
    limit: timedelta = MAX_DURATION,
    limit_text: str = MAX_DURATION_TEXT,
    least: timedelta | None = None,
    least_why: str = "",
) -> BeforeValidator:
    """A pydantic validator for a duration field of at most ``limit`` (named ``limit_text``
    in errors), longer than zero when ``positive``, and at least ``least`` (the error
    gives ``least_why``)."""

    def validate(value: Any) -> timedelta:
        d = parse_duration(value, limit, limit_text)
        if least is not None and d < least:
            raise ValueError(shorter_than(value, format_duration(least), least_why))
        if positive and d <= timedelta(0):
            raise ValueError(f"{shorten(value)} must be longer than 0s")
        return d

    return BeforeValidator(validate)


# Pydantic field types for config models: 0 (or more than 0) up to 100 years.
Duration = Annotated[timedelta, duration_validator(positive=False)]
PositiveDuration = Annotated[timedelta, duration_validator(positive=True)]
