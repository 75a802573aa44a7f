"""Business calendars (``calendars/<name>.yaml``): when the clock of a rule's ``after`` runs.

A calendar is a time zone, working hours per weekday and holidays (dates, a
country/subdivision from the ``holidays`` package, an ICS file). A rule with
``calendar: <name>`` counts ``after`` in working time only, and the claim stays
the same statement: Python computes the cutoff (the earliest deadline value not
yet due) and passes it as the parameter, so the partial index is used as before.

The math works on UTC instants. Working hours are local wall times, turned into
UTC per local date, so a DST change shortens or lengthens the day it falls on
(a local time in the spring gap counts as the hour before it; an October hour
that repeats counts both times). With ``work(a, b)`` the working time in [a, b]:

- ``forward(start, span)``: the earliest t with work(start, t) = span (the time a
  deadline falls due: shown as ``due_at``);
- ``back(now, span)``: the latest t with work(t, now) = span;
- ``cutoff(now, span)``: a row is due when ``deadline < cutoff``, exactly when
  ``forward(deadline, span) < now`` (as ``deadline + after < now`` without a
  calendar). That is ``back`` except at the edges of working time: after hours a
  deadline whose working time ran out at the close is due (+1 µs, PostgreSQL's
  resolution), and at an opening a deadline in the closed hours before it is not yet.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from slawatch.config.files import FileModel, check_name, load_dir, shorten
from slawatch.errors import ConfigError

CALENDAR_NAME = re.compile(r"[a-z][a-z0-9_-]{0,39}")
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_RANGE = re.compile(r"(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})")
_MICRO = timedelta(microseconds=1)
# How far back or forward the math walks before giving up: a span needs at most its
# working time's worth of weeks (holidays are finite), so this only stops a runaway.
MAX_WALK_DAYS = 366 * 30
# The longest `after` a calendar rule may have, in working time: a year of it is
# several years of calendar, walked day by day on every scan.
MAX_WORKING_SPAN, MAX_WORKING_SPAN_TEXT = timedelta(days=366), "366 days"

Interval = tuple[datetime, datetime]  # [start, end) in UTC, start < end


def _day_keys(key: str) -> list[int]:
    """``mon``, ``mon-fri`` or ``sat,sun`` as weekday numbers (Monday 0)."""
    out: list[int] = []
    for part in key.lower().replace(" ", "").split(","):
        first, dash, last = part.partition("-")
        if first not in DAYS or (dash and last not in DAYS):
            raise ValueError(
                f"{shorten(key)} is not a weekday or range of weekdays (e.g. mon-fri, sat, sat,sun)"
            )
        a, b = DAYS.index(first), DAYS.index(last if dash else first)
        if b < a:
            raise ValueError(f"{shorten(key)}: the range runs backwards (write e.g. mon-fri)")
        out.extend(range(a, b + 1))
    return out


def _clock(h: str, m: str, text: str) -> time | None:
    """``hh:mm`` as a time; None for 24:00 (the end of the day)."""
    hour, minute = int(h), int(m)
    if hour == 24 and minute == 0:
        return None
    if hour > 23 or minute > 59:
        raise ValueError(f"{shorten(text)}: {h}:{m} is not a time of day (00:00 to 24:00)")
    return time(hour, minute)


def _ranges(value: object) -> list[tuple[time, time | None]]:
    """``"09:00-12:00, 13:00-17:00"`` (or a list of such strings; ``off`` or ``[]``: no
    working time) as sorted, non-overlapping (start, end) pairs; end None is 24:00."""
    if value is None or value is False:  # YAML reads a bare `off` or `no` as false
        parts = []
    elif isinstance(value, str):
        parts = [] if value.strip().lower() == "off" else value.split(",")
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        parts = [p for v in value for p in v.split(",")]
    else:
        raise ValueError(f"{shorten(value)} is not working hours (e.g. '09:00-17:00' or off)")
    out: list[tuple[time, time | None]] = []
    for part in parts:
        m = _RANGE.fullmatch(part.strip())
        if not m:
            raise ValueError(
                f"{shorten(part.strip())} is not a range of hours (e.g. 09:00-17:00; "
                "several: '08:00-12:00, 13:00-17:00')"
            )
        start = _clock(m[1], m[2], part.strip())
        end = _clock(m[3], m[4], part.strip())
        if start is None:
            raise ValueError(f"{shorten(part.strip())}: a range cannot start at 24:00")
        if end is not None and end <= start:
            raise ValueError(
                f"{shorten(part.strip())} ends before it starts (a range over midnight is two:"
                " 22:00-24:00 on one day, 00:00-06:00 on the next)"
            )
        out.append((start, end))
    out.sort(key=lambda r: r[0])
    for (_, end), (start, _) in pairwise(out):
        if end is None or end > start:
            raise ValueError(f"{shorten(value)}: ranges overlap")
    return out


class Holidays(BaseModel):
    """Days without working time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dates: list[date] = Field(default_factory=list)
    # A country (ISO 3166 alpha-2, e.g. DE) and optional subdivision (e.g. BE) of the
    # `holidays` package: its public holidays, every year.
    country: str | None = None
    subdivision: str | None = None
    # An ICS file (relative to the calendar file): its all-day events are holidays.
    ics: str | None = None

    @field_validator("dates", mode="before")
    @classmethod
    def _dates(cls, v: Any) -> Any:
        if isinstance(v, list):
            for item in v:
                if isinstance(item, datetime) or not isinstance(item, date | str):
                    raise ValueError(f"{shorten(item)} is not a date (write 2026-12-24)")
        return v

    @model_validator(mode="after")
    def _known_country(self) -> Holidays:
        if self.subdivision is not None and self.country is None:
            raise ValueError("subdivision: needs country")
        if self.country is not None:
            _country(self.country, self.subdivision)  # raises a one-line ValueError
        return self


def _country(country: str, subdivision: str | None) -> Any:
    import holidays

    try:
        return holidays.country_holidays(country, subdiv=subdivision)
    except NotImplementedError:
        pass
    known = holidays.list_supported_countries()
    if country not in known:
        raise ValueError(
            f"country: {shorten(country)} is not a country the holidays package knows"
            " (ISO 3166 alpha-2 in capitals, e.g. DE, US, GB)"
        )
    subs = ", ".join(known[country][:12]) + (", ..." if len(known[country]) > 12 else "")
    raise ValueError(
        f"subdivision: {shorten(subdivision)} is not a subdivision of {country}"
        f" (known: {subs or 'none'})"
    )


def read_ics(path: Path, zone: ZoneInfo) -> set[date]:
    """The days the events of an ICS file cover (in ``zone`` for timed events);
    ValueError with a one-line reason otherwise."""
    import icalendar  # type: ignore[import-untyped]

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        cal = icalendar.Calendar.from_ical(data)
    except ValueError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "not iCalendar"
        raise ValueError(f"{path}: not an ICS file: {shorten(first)}") from None
    days: set[date] = set()
    for event in cal.walk("VEVENT"):
        summary = str(event.get("SUMMARY", "?"))
        if event.get("RRULE") is not None:
            raise ValueError(
                f"{path}: event {shorten(summary)} repeats (RRULE), which slawatch does not"
                " expand: list each occurrence, or use holidays.country"
            )
        start = event.get("DTSTART")
        if start is None:
            raise ValueError(f"{path}: event {shorten(summary)} has no DTSTART")
        first_day, last_day = _event_days(start.dt, event.get("DTEND"), zone)
        if (last_day - first_day).days > 3660:
            raise ValueError(f"{path}: event {shorten(summary)} lasts more than ten years")
        day = first_day
        while day <= last_day:
            days.add(day)
            day += timedelta(days=1)
    return days


def _event_days(start: date | datetime, end_prop: Any, zone: ZoneInfo) -> tuple[date, date]:
    """The first and last day an event covers: an all-day event's DTEND is exclusive."""
    end = end_prop.dt if end_prop is not None else None
    if isinstance(start, datetime):
        local = (start if start.tzinfo else start.replace(tzinfo=zone)).astimezone(zone)
        if not isinstance(end, datetime):
            return local.date(), local.date()
        last = (end if end.tzinfo else end.replace(tzinfo=zone)).astimezone(zone)
        last_day = last.date() - timedelta(days=1) if last.time() == time(0) else last.date()
        return local.date(), max(local.date(), last_day)
    if isinstance(end, date) and not isinstance(end, datetime) and end > start:
        return start, end - timedelta(days=1)
    return start, start


class Calendar(FileModel):
    """One calendar file: the time zone, working hours per weekday and holidays."""

    name: str
    description: str = ""
    timezone: str
    # e.g. {"mon-fri": "09:00-17:00", "sat": "10:00-14:00"}; days not named have none.
    hours: dict[str, str | list[str] | bool | None]
    holidays: Holidays = Field(default_factory=Holidays)

    _week: list[list[tuple[time, time | None]]] = PrivateAttr(default_factory=list)
    _zone: ZoneInfo = PrivateAttr(default=ZoneInfo("UTC"))
    _days_off: set[date] = PrivateAttr(default_factory=set)
    _country: Any = PrivateAttr(default=None)
    _cache: dict[date, list[Interval]] = PrivateAttr(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v, CALENDAR_NAME, "calendar", "lower-case letters, digits, _ and -")

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
            raise ValueError(f"{shorten(v)} is not a time zone (try Europe/Berlin)") from exc
        return v

    @field_validator("hours")
    @classmethod
    def _hours(
        cls, v: dict[str, str | list[str] | bool | None]
    ) -> dict[str, str | list[str] | bool | None]:
        seen: dict[int, str] = {}
        for key, value in v.items():
            try:
                days = _day_keys(key)
                _ranges(value)
            except ValueError as exc:
                raise ValueError(f"{shorten(key)}: {exc}") from None
            for d in days:
                if d in seen:
                    raise ValueError(
                        f"{DAYS[d]} is given twice ({shorten(seen[d])} and {shorten(key)})"
                    )
                seen[d] = key
        if not any(_ranges(value) for value in v.values()):
            raise ValueError("no working time on any day (e.g. mon-fri: '09:00-17:00')")
        return v

    def model_post_init(self, context: Any, /) -> None:
        week: list[list[tuple[time, time | None]]] = [[] for _ in DAYS]
        for key, value in self.hours.items():
            for d in _day_keys(key):
                week[d] = _ranges(value)
        self._week = week
        self._zone = ZoneInfo(self.timezone)
        self._days_off = set(self.holidays.dates)
        if self.holidays.country is not None:
            self._country = _country(self.holidays.country, self.holidays.subdivision)

    def __eq__(self, other: object) -> bool:
        # What the file says and the holidays read (an .ics file may change alone); not
        # the cache of days already looked at, nor the country's holidays object (made
        # from the fields): a reload must not see a calendar in use as changed.
        if not isinstance(other, Calendar):
            return NotImplemented
        return (self.__dict__, self._days_off) == (other.__dict__, other._days_off)

    def __hash__(self) -> int:
        return hash((self.name, self.timezone))

    def load_ics(self, base: Path) -> None:
        """Add the holidays of ``holidays.ics`` (relative to ``base``, the calendar's
        folder); ValueError with a one-line reason otherwise."""
        if self.holidays.ics is None:
            return
        path = Path(self.holidays.ics)
        self._days_off |= read_ics(path if path.is_absolute() else base / path, self._zone)
        self._cache.clear()

    def definition(self) -> dict[str, Any]:
        """What decides its working time, as plain data (a rule's generation hashes it)."""
        return {
            "timezone": self.timezone,
            "hours": self.hours,
            "holidays": self.holidays.model_dump(mode="json"),
            "days_off": sorted(d.isoformat() for d in self._days_off),
        }

    def is_holiday(self, day: date) -> bool:
        """Whether ``day`` (a local date) has no working time for a holiday."""
        return day in self._days_off or (self._country is not None and day in self._country)

    def intervals(self, day: date) -> list[Interval]:
        """The working time of local date ``day`` as UTC intervals, in order."""
        got = self._cache.get(day)
        if got is not None:
            return got
        out: list[Interval] = []
        if not self.is_holiday(day):
            for start, end in self._week[day.weekday()]:
                a = self._instant(day, start)
                b = self._instant(day + timedelta(days=1), time(0)) if end is None else None
                b = b if b is not None else self._instant(day, cast(time, end))
                if a < b:  # a range inside the spring gap has no length
                    out.append((a, b))
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[day] = out
        return out

    def _instant(self, day: date, at: time) -> datetime:
        # fold=0: a time in the spring gap is read with the offset before it, and
        # a time that repeats in the autumn is its first occurrence.
        return datetime.combine(day, at, tzinfo=self._zone).astimezone(UTC)

    def _days(self, t: datetime, step: int) -> Iterator[list[Interval]]:
        day = t.astimezone(self._zone).date()
        # The first local date whose intervals may reach t (a day's intervals lie in it).
        for _ in range(MAX_WALK_DAYS):
            yield self.intervals(day)
            day += timedelta(days=step)
        raise ConfigError(
            f"{self.source}: no working time found within {MAX_WALK_DAYS // 366} years"
        )

    def forward(self, start: datetime, span: timedelta) -> datetime:
        """The earliest instant t with ``span`` of working time in [start, t]."""
        start = start.astimezone(UTC)
        left = span
        if left <= timedelta(0):
            return start
        for day in self._days(start, 1):
            for a, b in day:
                a = max(a, start)
                if a >= b:
                    continue
                if left <= b - a:
                    return a + left
                left -= b - a
        raise AssertionError("unreachable")  # pragma: no cover

    def back(self, now: datetime, span: timedelta) -> datetime:
        """The latest instant t with ``span`` of working time in [t, now]."""
        now = now.astimezone(UTC)
        left = span
        if left <= timedelta(0):
            return now
        for day in self._days(now, -1):
            for a, b in reversed(day):
                b = min(b, now)
                if a >= b:
                    continue
                if left <= b - a:
                    return b - left
                left -= b - a
        raise AssertionError("unreachable")  # pragma: no cover

    def last_work(self, t: datetime) -> datetime | None:
        """The latest instant at or before ``t`` that ends working time: ``t`` itself
        while working (or at a closing), else the last closing before it."""
        t = t.astimezone(UTC)
        for day in self._days(t, -1):
            for a, b in reversed(day):
                if a < t:
                    return min(b, t)
        return None  # pragma: no cover

    def cutoff(self, now: datetime, span: timedelta) -> datetime:
        """The claim's parameter: a deadline is due at ``now`` when it is less than this,
        which is exactly when ``forward(deadline, span) < now``."""
        now = now.astimezone(UTC)
        if span <= timedelta(0):
            return now
        latest = self.back(now, span)
        if self.last_work(now) != now:
            # After hours: the working time of a deadline up to `latest` ran out by the
            # close, so that one is due too (deadlines are microseconds in PostgreSQL).
            return latest + _MICRO
        # Working: a deadline in the closed hours before `latest` falls due only now.
        before = self.last_work(latest)
        return before if before is not None else latest

    def working_time(self, start: datetime, end: datetime) -> timedelta:
        """The working time in [start, end] (for explanations and tests)."""
        start, end = start.astimezone(UTC), end.astimezone(UTC)
        total = timedelta(0)
        if end <= start:
            return total
        for day in self._days(start, 1):
            for a, b in day:
                if a >= end:
                    return total
                a, b = max(a, start), min(b, end)
                if a < b:
                    total += b - a
        return total  # pragma: no cover


def load_calendars(directory: Path, *, required: bool = False) -> dict[str, Calendar]:
    """Load ``directory/*.yaml`` by name. A missing folder means no calendars, unless
    ``required`` (it was named by ``--calendars`` or ``SLAWATCH_CALENDARS_DIR``)."""
    if not directory.exists() and not required:
        return {}
    calendars = load_dir(directory, lambda _data, _path: Calendar, "calendars")
    errors = []
    for cal in calendars:
        try:
            cal.load_ics(Path(cal.source).parent)
        except ValueError as exc:
            errors.append(f"{cal.source}: holidays.ics: {exc}")
    if errors:
        raise ConfigError("\n".join(errors))
    return {c.name: c for c in calendars}
