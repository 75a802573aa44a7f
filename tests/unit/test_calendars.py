"""Business calendars: the working-time math (slawatch/config/calendars.py) and the files.

The math is checked on named cases (a weekend, a holiday, both DST changes in
Europe/Berlin, a working day that ends mid-span) and by hypothesis against a slow
reference that walks minute by minute.
"""

from __future__ import annotations

import functools
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time
from hypothesis import given, settings
from hypothesis import strategies as st

from slawatch.clock import Clock
from slawatch.config.calendars import Calendar, load_calendars
from slawatch.config.rules import Rule, check_calendar_names
from slawatch.errors import ConfigError

BERLIN = ZoneInfo("Europe/Berlin")
H, M = timedelta(hours=1), timedelta(minutes=1)


def calendar(**fields: Any) -> Calendar:
    data: dict[str, Any] = {
        "name": "office",
        "timezone": "Europe/Berlin",
        "hours": {"mon-fri": "09:00-17:00"},
    }
    return Calendar.model_validate(data | fields)


def berlin(*args: int) -> datetime:
    return datetime(*args, tzinfo=BERLIN)  # type: ignore[misc]


OFFICE = calendar(holidays={"dates": ["2026-12-24"], "country": "DE", "subdivision": "BE"})


def rule_with(cal: Calendar, after: str) -> Rule:
    rule = Rule.model_validate(
        {
            "name": "ticket_unanswered",
            "table": "tickets",
            "key": "id",
            "deadline": "opened_at",
            "after": after,
            "open_when": "answered_at IS NULL",
            "notify": ["console"],
            "calendar": cal.name,
        }
    )
    check_calendar_names([rule], {cal.name: cal})
    return rule


def due(rule: Rule, deadline: datetime) -> bool:
    """What the claim decides at the application clock's now: deadline < cutoff."""
    return deadline < rule.cutoff(Clock().now())


# --- named cases, the clock moved with freezegun ------------------------------------


def test_a_weekend_does_not_count() -> None:
    """4 working hours from Friday 15:00: 2 on Friday, 2 on Monday from 09:00."""
    rule = rule_with(OFFICE, "4h")
    deadline = berlin(2026, 11, 27, 15)
    assert rule.due_at(deadline) == berlin(2026, 11, 30, 11)
    with freeze_time(berlin(2026, 11, 28, 12)) as clock:  # Saturday
        assert not due(rule, deadline)
        clock.move_to(berlin(2026, 11, 30, 11))  # Monday 11:00: exactly 4 h
        assert not due(rule, deadline)
        clock.move_to(berlin(2026, 11, 30, 11, 0, 1))
        assert due(rule, deadline)


def test_a_deadline_whose_span_ends_at_the_close_is_due_after_hours() -> None:
    """2 h from Friday 15:00 run out at 17:00: due on Friday evening, not on Monday."""
    rule = rule_with(OFFICE, "2h")
    deadline = berlin(2026, 11, 27, 15)
    # The span fits the day exactly: due at the close, not at Monday's opening.
    assert rule.due_at(deadline) == berlin(2026, 11, 27, 17)
    with freeze_time(berlin(2026, 11, 27, 17)) as clock:
        assert not due(rule, deadline)
        clock.move_to(berlin(2026, 11, 27, 17, 0, 1))
        assert due(rule, deadline)
        clock.move_to(berlin(2026, 11, 28, 12))
        assert due(rule, deadline)


def test_a_deadline_in_closed_hours_counts_from_the_opening() -> None:
    rule = rule_with(OFFICE, "2h")
    deadline = berlin(2026, 11, 29, 12)  # Sunday
    assert rule.due_at(deadline) == berlin(2026, 11, 30, 11)
    with freeze_time(berlin(2026, 11, 30, 11)) as clock:
        assert not due(rule, deadline)
        clock.tick(timedelta(seconds=1))
        assert due(rule, deadline)


def test_a_working_day_that_ends_mid_span() -> None:
    """8 working hours from Tuesday 13:00: 4 on Tuesday, 4 on Wednesday (13:00)."""
    rule = rule_with(OFFICE, "8h")
    deadline = berlin(2026, 11, 24, 13)
    assert rule.due_at(deadline) == berlin(2026, 11, 25, 13)
    with freeze_time(berlin(2026, 11, 25, 12, 59)) as clock:
        assert not due(rule, deadline)
        clock.move_to(berlin(2026, 11, 25, 13, 0, 1))
        assert due(rule, deadline)


def test_holidays_from_dates_and_the_holidays_package_do_not_count() -> None:
    rule = rule_with(OFFICE, "4h")
    # Wednesday 23 December 15:00: 2 h; 24 (listed), 25 and 26 (German holidays),
    # then the weekend: the other 2 h on Monday 28 December.
    deadline = berlin(2026, 12, 23, 15)
    assert rule.due_at(deadline) == berlin(2026, 12, 28, 11)
    with freeze_time(berlin(2026, 12, 26, 12)):
        assert not due(rule, deadline)
    # Berlin's own holiday, 8 March (International Women's Day; 2027: a Monday).
    assert OFFICE.is_holiday(date(2027, 3, 8))
    assert not calendar(holidays={"country": "DE"}).is_holiday(date(2027, 3, 8))


def test_dst_spring_forward_shortens_a_day_of_working_time() -> None:
    """Berlin, Sunday 29 March 2026: 02:00 -> 03:00. Round the clock, that day has 23 h."""
    always = calendar(hours={"mon-sun": "00:00-24:00"})
    start = berlin(2026, 3, 29, 0)
    assert always.working_time(start, berlin(2026, 3, 30, 0)) == 23 * H
    assert always.forward(start, 24 * H) == berlin(2026, 3, 30, 1)
    assert always.back(berlin(2026, 3, 30, 1), 24 * H) == start
    # A night shift over the change: 01:00-04:00 local is 2 real hours.
    night = calendar(hours={"sun": "01:00-04:00"})
    assert night.working_time(berlin(2026, 3, 29), berlin(2026, 3, 30)) == 2 * H
    assert night.forward(berlin(2026, 3, 29), 90 * M) == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)


def test_dst_fall_back_lengthens_a_day_of_working_time() -> None:
    """Berlin, Sunday 25 October 2026: 03:00 -> 02:00. That day has 25 h."""
    always = calendar(hours={"mon-sun": "00:00-24:00"})
    start = berlin(2026, 10, 25, 0)
    assert always.working_time(start, berlin(2026, 10, 26, 0)) == 25 * H
    assert always.forward(start, 24 * H) == datetime(2026, 10, 25, 22, tzinfo=UTC)  # 23:00 CET
    night = calendar(hours={"sun": "01:00-04:00"})
    assert night.working_time(berlin(2026, 10, 25), berlin(2026, 10, 26)) == 4 * H
    # An office clock over the change: Friday 16:00 + 2 h is Monday 10:00, one more real
    # hour of night in between changes nothing.
    rule = rule_with(OFFICE, "2h")
    with freeze_time(berlin(2026, 10, 26, 10, 0, 1)):
        assert due(rule, berlin(2026, 10, 23, 16))
        assert not due(rule, berlin(2026, 10, 23, 16, 0, 2))


def test_several_ranges_a_day() -> None:
    split = calendar(hours={"mon-fri": "08:00-12:00, 13:00-17:00", "sat": ["10:00-12:00"]})
    assert split.forward(berlin(2026, 11, 27, 11), 2 * H) == berlin(2026, 11, 27, 14)
    assert split.forward(berlin(2026, 11, 27, 16), 2 * H) == berlin(2026, 11, 28, 11)
    assert split.back(berlin(2026, 11, 30, 9), 3 * H) == berlin(2026, 11, 28, 10)
    assert split.back(berlin(2026, 11, 30, 9), 4 * H) == berlin(2026, 11, 27, 16)


def test_no_calendar_is_wall_clock() -> None:
    rule = Rule.model_validate(
        {
            "name": "r",
            "table": "t",
            "deadline": "d",
            "after": "2h",
            "open_when": "true",
            "notify": ["n"],
        }
    )
    now = berlin(2026, 11, 28, 12)
    assert rule.cutoff(now) == now - 2 * H
    assert rule.due_at(now) == now + 2 * H


def test_a_rule_whose_calendar_was_not_loaded_refuses_to_guess() -> None:
    rule = Rule.model_validate(
        {
            "name": "r",
            "table": "t",
            "deadline": "d",
            "after": "2h",
            "open_when": "true",
            "notify": ["n"],
            "calendar": "office",
        }
    )
    with pytest.raises(ConfigError, match="calendar: 'office' was not loaded"):
        rule.cutoff(berlin(2026, 11, 28, 12))


# --- property tests against a minute-by-minute reference -----------------------------

# A small week with odd hours, a split day, a day ending at midnight, a holiday, and
# both of 2026's DST changes in Berlin inside the range the tests draw from.
ODD = calendar(
    hours={
        "mon": "08:30-12:00, 13:00-17:45",
        "tue-wed": "09:00-17:00",
        "thu": "22:00-24:00",
        "fri": "00:00-03:00, 10:00-11:00",
        "sun": "01:00-04:00",
    },
    holidays={"dates": ["2026-03-25", "2026-10-21"]},
)
# Minutes, local wall time changes included (UTC instants on a minute grid).
RANGES = [
    (datetime(2026, 3, 18, tzinfo=UTC), datetime(2026, 4, 8, tzinfo=UTC)),
    (datetime(2026, 10, 14, tzinfo=UTC), datetime(2026, 11, 4, tzinfo=UTC)),
]


# ODD's hours by weekday (Monday 0), in minutes of the local day.
ODD_MINUTES: dict[int, list[tuple[int, int]]] = {
    0: [(510, 720), (780, 1065)],
    1: [(540, 1020)],
    2: [(540, 1020)],
    3: [(1320, 1440)],
    4: [(0, 180), (600, 660)],
    5: [],
    6: [(60, 240)],
}


@functools.cache  # the walks below cross the same minutes again and again
def working_minute(t: datetime) -> bool:
    """Whether the minute [t, t + 1m) is working time, read from the wall clock alone."""
    local = t.astimezone(BERLIN)
    if local.date() in {date(2026, 3, 25), date(2026, 10, 21)}:
        return False
    hm = local.hour * 60 + local.minute
    return any(a <= hm < b for a, b in ODD_MINUTES[local.weekday()])


def ref_forward(start: datetime, minutes: int) -> datetime:
    t, left = start, minutes
    while left:
        if working_minute(t):
            left -= 1
        t += M
    return t


def ref_back(now: datetime, minutes: int) -> datetime:
    t, left = now, minutes
    while left:
        t -= M
        if working_minute(t):
            left -= 1
    return t


def ref_latest_back(now: datetime, minutes: int) -> datetime:
    """The latest t: ref_back stops on a working minute, which is already the latest."""
    return ref_back(now, minutes)


instants = st.sampled_from(RANGES).flatmap(
    lambda r: st.integers(0, int((r[1] - r[0]) / M) - 1).map(lambda m: r[0] + m * M)
)
spans = st.integers(0, 60 * 30)


@settings(max_examples=300, deadline=None)
@given(start=instants, minutes=spans)
def test_forward_matches_a_minute_walk(start: datetime, minutes: int) -> None:
    assert ODD.forward(start, minutes * M) == ref_forward(start, minutes)


@settings(max_examples=300, deadline=None)
@given(now=instants, minutes=spans)
def test_back_matches_a_minute_walk(now: datetime, minutes: int) -> None:
    assert ODD.back(now, minutes * M) == ref_latest_back(now, minutes)


@settings(max_examples=300, deadline=None)
@given(deadline=instants, now=instants, minutes=spans)
def test_due_exactly_when_forward_has_passed(
    deadline: datetime, now: datetime, minutes: int
) -> None:
    """The claim's test (deadline < cutoff) against the definition: due once
    forward(deadline, after) < now, as deadline + after < now without a calendar."""
    expect = ref_forward(deadline, minutes) < now
    assert (deadline < ODD.cutoff(now, minutes * M)) == expect


@settings(max_examples=200, deadline=None)
@given(deadline=instants, minutes=st.integers(1, 60 * 30), second=st.integers(-1, 1))
def test_due_flips_at_the_due_time(deadline: datetime, minutes: int, second: int) -> None:
    """Around the due instant itself (where a grid of minutes is exactly on the edge)."""
    due_at = ref_forward(deadline, minutes)
    now = due_at + second * timedelta(seconds=1)
    assert (deadline < ODD.cutoff(now, minutes * M)) == (second > 0)


# --- files and their errors -----------------------------------------------------------


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_a_calendar_folder_with_an_ics_file(tmp_path: Path) -> None:
    write(
        tmp_path,
        "office.yaml",
        "timezone: Europe/Berlin\nhours:\n  mon-fri: 09:00-17:00\n  sat: off\n"
        "holidays:\n  ics: closed.ics\n",
    )
    write(
        tmp_path,
        "closed.ics",
        "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//t//t//EN\r\n"
        "BEGIN:VEVENT\r\nUID:1\r\nDTSTAMP:20260101T000000Z\r\nSUMMARY:Company retreat\r\n"
        "DTSTART;VALUE=DATE:20261202\r\nDTEND;VALUE=DATE:20261204\r\nEND:VEVENT\r\n"
        "END:VCALENDAR\r\n",
    )
    cals = load_calendars(tmp_path)
    office = cals["office"]
    assert [office.is_holiday(date(2026, 12, d)) for d in (1, 2, 3, 4)] == [
        False,
        True,
        True,
        False,
    ]
    assert office.forward(berlin(2026, 12, 1, 16), 2 * H) == berlin(2026, 12, 4, 10)


def test_a_calendar_read_again_equals_the_one_in_use(tmp_path: Path) -> None:
    """A reload reads every calendar again: one already used (its days cached) must
    not look changed, or every reload reports its rules as changed; a new .ics does."""
    write(
        tmp_path,
        "office.yaml",
        "timezone: Europe/Berlin\nhours:\n  mon-fri: 09:00-17:00\n"
        "holidays:\n  country: DE\n  ics: closed.ics\n",
    )
    ics = (
        "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//t//t//EN\r\n"
        "BEGIN:VEVENT\r\nUID:1\r\nDTSTAMP:20260101T000000Z\r\nSUMMARY:Retreat\r\n"
        "DTSTART;VALUE=DATE:{day}\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n"
    )
    write(tmp_path, "closed.ics", ics.format(day="20261202"))
    running = load_calendars(tmp_path)["office"]
    rule = rule_with(running, "2h")
    assert rule.due_at(berlin(2026, 12, 1, 16)) == berlin(2026, 12, 3, 10)  # cached days
    again = load_calendars(tmp_path)["office"]
    assert again == running
    assert rule_with(again, "2h") == rule
    write(tmp_path, "closed.ics", ics.format(day="20261203"))
    assert load_calendars(tmp_path)["office"] != running


def test_a_missing_default_folder_is_no_calendars_and_a_named_one_is_an_error(
    tmp_path: Path,
) -> None:
    assert load_calendars(tmp_path / "calendars") == {}
    with pytest.raises(ConfigError, match="calendars folder not found"):
        load_calendars(tmp_path / "calendars", required=True)


BAD = [
    ("timezone: Mars/Olympus\nhours: {mon: 09:00-17:00}\n", "timezone: 'Mars/Olympus' is not"),
    ("hours: {mon: 09:00-17:00}\n", "timezone: is required"),
    ("timezone: UTC\nhours: {mon: 17:00-09:00}\n", "ends before it starts"),
    ("timezone: UTC\nhours: {mon: '09:00-13:00, 12:00-17:00'}\n", "ranges overlap"),
    ("timezone: UTC\nhours: {mon: 25:00-26:00}\n", "is not a time of day"),
    ("timezone: UTC\nhours: {mon: 9 to 5}\n", "is not a range of hours"),
    ("timezone: UTC\nhours: {mon: 24:00-24:00}\n", "cannot start at 24:00"),
    ("timezone: UTC\nhours: {mon-fry: 09:00-17:00}\n", "is not a weekday"),
    ("timezone: UTC\nhours: {fri-mon: 09:00-17:00}\n", "runs backwards"),
    ("timezone: UTC\nhours: {mon-fri: 09:00-17:00, wed: 10:00-11:00}\n", "wed is given twice"),
    ("timezone: UTC\nhours: {mon-sun: off}\n", "no working time on any day"),
    ("timezone: UTC\nhours: {}\n", "no working time on any day"),
    ("timezone: UTC\nhours: {mon: true}\n", "is not working hours"),
    ("timezone: UTC\nhours: {mon: 09:00-17:00}\nholidays: {country: XX}\n", "country: 'XX'"),
    (
        "timezone: UTC\nhours: {mon: 09:00-17:00}\nholidays: {country: DE, subdivision: ZZ}\n",
        "subdivision: 'ZZ' is not a subdivision of DE",
    ),
    ("timezone: UTC\nhours: {mon: 09:00-17:00}\nholidays: {subdivision: BE}\n", "needs country"),
    ("timezone: UTC\nhours: {mon: 09:00-17:00}\nholidays: {dates: [12]}\n", "12 is not a date"),
    ("timezone: UTC\nhours: {mon: 09:00-17:00}\nholidays: {dates: [2026-02-30]}\n", "invalid"),
    ("timezone: UTC\nhours: {mon: 09:00-17:00}\nholidays: {ics: gone.ics}\n", "cannot read"),
    ("timezone: UTC\nhours: {mon: 09:00-17:00}\nholidays: {easter: yes}\n", "unknown field"),
    ("name: Office!\ntimezone: UTC\nhours: {mon: 09:00-17:00}\n", "is not a calendar name"),
    ("timezone: UTC\nhours: {mon: 09:00-17:00}\nweekends: off\n", "unknown field"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_a_bad_calendar_is_one_line_naming_file_and_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, "office.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_calendars(tmp_path)
    lines = str(info.value).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{path}: "), lines
    assert message in lines[0], lines


def test_an_ics_with_a_repeating_event_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "office.yaml", "timezone: UTC\nhours: {mon: 09:00-17:00}\n")
    write(
        tmp_path,
        "office.yaml",
        "timezone: UTC\nhours: {mon: 09:00-17:00}\nholidays: {ics: x.ics}\n",
    )
    write(
        tmp_path,
        "x.ics",
        "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//t//t//EN\r\nBEGIN:VEVENT\r\nUID:1\r\n"
        "DTSTAMP:20260101T000000Z\r\nSUMMARY:Xmas\r\nDTSTART;VALUE=DATE:20261225\r\n"
        "RRULE:FREQ=YEARLY\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n",
    )
    with pytest.raises(ConfigError, match=r"x.ics: event 'Xmas' repeats \(RRULE\)"):
        load_calendars(tmp_path)
    write(tmp_path, "x.ics", "this is not a calendar")
    with pytest.raises(ConfigError, match="not an ICS file"):
        load_calendars(tmp_path)


def rule_data(**fields: Any) -> dict[str, Any]:
    return {
        "name": "r",
        "table": "t",
        "deadline": "d",
        "after": "2h",
        "open_when": "true",
        "notify": ["n"],
    } | fields


def test_a_rule_names_a_known_calendar() -> None:
    rule = Rule.model_validate(rule_data(calendar="ofice"))
    with pytest.raises(ConfigError, match=r"calendar: unknown calendar 'ofice' \(defined: office"):
        check_calendar_names([rule], {"office": OFFICE})


def test_a_rule_with_a_calendar_waits_at_most_a_year_of_working_time() -> None:
    with pytest.raises(ValueError, match="more than 366 days of working time"):
        Rule.model_validate(rule_data(calendar="office", after="367d"))
    Rule.model_validate(rule_data(after="367d"))  # without one: wall clock, as before


def test_an_event_rule_with_a_calendar_is_refused() -> None:
    with pytest.raises(ValueError, match="calendar: not supported for event rules yet"):
        Rule.model_validate(
            {
                "name": "r",
                "events": {"start": "a", "stop": "b", "within": "1h"},
                "notify": ["n"],
                "calendar": "office",
            }
        )
