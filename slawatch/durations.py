"""Durations as operators write them: ``30s``, ``1h30m``, ``1d``, ``2w`` or ISO 8601 ``PT48H``."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SHORT = re.compile(r"(?:(\d+)([smhdw]))+")
_SHORT_PART = re.compile(r"(\d+)([smhdw])")
_ISO = re.compile(
    r"P(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?"
    r"(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?"
)


def parse_duration(text: str | int | float | timedelta) -> timedelta:
    """Parse a duration; raise ``ValueError`` with a hint when it is not one.

    A bare number is seconds, so YAML's ``every: 30`` means 30 seconds.
    """
    if isinstance(text, timedelta):
        return text
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration (try 30s, 15m, 6h, 1d)")
    if isinstance(text, int | float):
        if text < 0:
            raise ValueError(f"{text!r} is negative; a duration must be 0 or more")
        return timedelta(seconds=text)
    s = str(text).strip()
    compact = s.replace(" ", "").lower()
    if compact and _SHORT.fullmatch(compact):
        return timedelta(seconds=sum(int(n) * _UNITS[u] for n, u in _SHORT_PART.findall(compact)))
    iso = _ISO.fullmatch(s.upper())
    if iso and s.upper() not in ("P", "PT") and not s.upper().endswith("T"):
        parts = {k: float(v) for k, v in iso.groupdict().items() if v}
        return timedelta(
            weeks=parts.get("w", 0),
            days=parts.get("d", 0),
            hours=parts.get("h", 0),
            minutes=parts.get("m", 0),
            seconds=parts.get("s", 0),
        )
    raise ValueError(f"{s!r} is not a duration (try 30s, 15m, 6h, 1d, 1h30m or PT48H)")


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


def _positive(value: Any) -> timedelta:
    d = parse_duration(value)
    if d <= timedelta(0):
        raise ValueError(f"{value!r} must be longer than 0s")
    return d


# Pydantic field types for config models.
Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
PositiveDuration = Annotated[timedelta, BeforeValidator(_positive)]
