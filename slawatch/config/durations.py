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
from decimal import Decimal
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
# What parse_duration reads, in every error about a value that is not a duration: in a
# YAML file (a bare number there is seconds), and in text (an environment variable, a
# command-line argument, a query parameter: all text, so a number needs a unit).
_FORMS = "whole s, m, h, d, w (90s, 1h30m) or ISO 8601 (PT48H)"
_HINT = f"a number of seconds, {_FORMS}"
_TEXT_HINT = _FORMS
_WORD = re.compile(r"(?:\d+(?:\.\d+)?[a-zµ]+)+")
_WORD_PART = re.compile(r"(\d+(?:\.\d+)?)([a-zµ]+)")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?")
_ISO_DATE = re.compile(r"P(?:\d+(?:\.\d+)?[YMWD])+(?:T.*)?")
# ISO 8601 with a decimal fraction (PT0.5S is read; P1.5D is not): ``,`` is ISO's sign too.
_ISO_FRACTION = re.compile(
    r"P(?:(?P<w>\d+(?:[.,]\d+)?)W)?(?:(?P<d>\d+(?:[.,]\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:[.,]\d+)?)H)?(?:(?P<m>\d+(?:[.,]\d+)?)M)?(?:(?P<s>\d+(?:[.,]\d+)?)S)?)?"
)

# 100 years: PostgreSQL's timestamps reach the year 294276, so any "now" plus
# this (or a sum of a few of these) stays in range, and no rule needs more.
MAX_DURATION = timedelta(days=36500)
MAX_DURATION_TEXT = "100 years"


def parse_duration(
    text: object,
    limit: timedelta = MAX_DURATION,
    limit_text: str = MAX_DURATION_TEXT,
    *,
    yaml: bool = False,
) -> timedelta:
    """Parse a duration of at most ``limit``; raise ``ValueError`` with a hint otherwise.

    A bare number is seconds, so YAML's ``every: 30`` means 30 seconds; text that is
    only a number (``"30"``) is not a duration. ``yaml``: the value is from a YAML file,
    where such text is a quoted number (the error says to unquote it); else it is from
    an environment variable, an argument or a query parameter (the error says to add a
    unit). The message quotes at most about 80 characters of a bad value.
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
    raise ValueError(_not_a_duration(s, compact, upper, yaml))


def _not_a_duration(s: str, compact: str, upper: str, yaml: bool) -> str:
    """Why ``s`` is not a duration: what is wrong with one that nearly is, and the forms
    (``yaml``: see :func:`parse_duration`)."""
    why = ""
    hint = _HINT if yaml else _TEXT_HINT
    if _NUMBER.fullmatch(compact):
        if yaml:
            # YAML reads 1e9 (no dot) and a quoted number as text, not as a number.
            why = ": YAML reads it as text; write the seconds in digits, unquoted"
        elif compact.isdigit():
            n = compact.lstrip("0")[:20] or "0"
            why = f": a number needs a unit here, e.g. {n}m or {n}d"
        else:
            why = ": a number needs a unit here, e.g. 90s or 30d"
    elif _ISO_DATE.fullmatch(upper) and ("Y" in upper or "M" in upper.split("T")[0]):
        return (
            f"{shorten(s)} is not a duration: ISO 8601 years and months are not accepted"
            " (their length varies); write days, e.g. P3650D"
        )
    elif fraction := _ISO_FRACTION.fullmatch(upper.replace(" ", "")):
        if upper.replace(" ", "") not in ("P", "PT") and not upper.endswith("T"):
            return f"{shorten(s)} is not a duration: {_iso_fraction(fraction)}"
    elif _WORD.fullmatch(compact):
        for number, unit in _WORD_PART.findall(compact):
            if unit not in _UNITS:
                why = f": {unit!r} is not a unit"
                break
            if "." in number:
                why = f": {number}{unit} is not a whole number of {unit}"
                break
    return f"{shorten(s)} is not a duration{why} ({hint})"


def _iso_fraction(match: re.Match[str]) -> str:
    """What to write for an ISO 8601 duration with a fraction of a unit other than
    seconds (``P1.5D``): only seconds take one, so the same length in whole units."""
    why = "ISO 8601 fractions are accepted in seconds only (PT0.5S)"
    values = {u: Decimal(v.replace(",", ".")) for u, v in match.groupdict().items() if v}
    total = sum((v * _UNITS[u] for u, v in values.items()), Decimal(0))
    if total > 10**12:  # far longer than any bound: no equivalent to offer
        return why
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    clock = "".join(
        f"{format(n.normalize(), 'f')}{u}"
        for n, u in ((hours, "H"), (minutes, "M"), (seconds, "S"))
        if n
    )
    iso = "P" + (f"{days}D" if days else "") + (f"T{clock}" if clock else "")
    if iso == "P":
        iso = "PT0S"
    if total == total.to_integral_value():
        iso += f" or {format_duration(timedelta(seconds=int(total)))}"
    return f"{why}; write {iso}"


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
    """A pydantic validator for a duration field of a YAML file's model, of at most
    ``limit`` (named ``limit_text`` in errors), longer than zero when ``positive``, and at
    least ``least`` (the error gives ``least_why``)."""

    def validate(value: Any) -> timedelta:
        d = parse_duration(value, limit, limit_text, yaml=True)
        if least is not None and d < least:
            raise ValueError(shorter_than(value, format_duration(least), least_why))
        if positive and d <= timedelta(0):
            raise ValueError(f"{shorten(value)} must be longer than 0s")
        return d

    return BeforeValidator(validate)


# Pydantic field types for config models: 0 (or more than 0) up to 100 years.
Duration = Annotated[timedelta, duration_validator(positive=False)]
PositiveDuration = Annotated[timedelta, duration_validator(positive=True)]
