"""Rules as operators write them (``rules/<name>.yaml``), validated into models.

A table rule watches one table: a row is *due* when ``deadline + after < now``
while ``open_when`` holds, and is notified again on the ``renotify`` schedule
until ``renotify.max`` notifications were sent or the row completes.

An event rule (``events:``, docs/explanation/events.md) watches events instead: a start opens a
deadline for its key, a stop closes it. Its deadlines are rows of a table of
slawatch's own (``slawatch."<rule>_timers"``, engine/timers.py), which the rule
watches as a table rule would: the model fills in that table, its key, deadline
and condition, so everything downstream of a rule (claim, episodes, status,
explain, the page) treats both kinds alike.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from psycopg import sql
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from slawatch.config.batched import SetForm, set_form
from slawatch.config.calendars import (
    CALENDAR_NAME,
    MAX_WORKING_SPAN,
    MAX_WORKING_SPAN_TEXT,
    Calendar,
)
from slawatch.config.durations import Duration, PositiveDuration, duration_validator
from slawatch.config.files import (
    FileModel,
    check_name,
    ident_letters,
    ident_problem,
    is_ident,
    load_dir,
    role_problem,
    shorten,
)
from slawatch.config.notifiers import WebhookConfig, interpolate
from slawatch.errors import ConfigError

RULE_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")

Severity = Literal["info", "warning", "critical"]


def _ident(value: str) -> str:
    # An identifier exactly as it is in the catalog (quoted in SQL, so case matters).
    if problem := ident_problem(value, "a column name"):
        raise ValueError(problem)
    return value


Ident = Annotated[str, BeforeValidator(_ident)]


def _deadline_name_problem(text: str) -> str | None:
    """Why a deadline written as a name (letters, digits, _ and $ only) is not a column
    name (too long, not NFC); None when it is one or is written as an expression. Such
    text is a name: taken for an expression, PostgreSQL would fold or truncate it."""
    return ident_problem(text, "a column name") if ident_letters(text) else None


def _deadline_text(value: object) -> object:
    if not isinstance(value, str):
        raise ValueError(
            f"{shorten(value)} is not a column name (nor an SQL expression: quote it in YAML)"
        )
    return value.strip()


def _key(value: object) -> object:
    """``key: id`` or ``key: [id, created]``: always a list of names."""
    if isinstance(value, str):
        return [value]
    return value


def _key_columns(value: list[str]) -> list[str]:
    if not 1 <= len(value) <= 8:
        raise ValueError("must name 1 to 8 columns, e.g. key: id or key: [id, created]")
    if len(set(value)) != len(value):
        raise ValueError("names a column twice")
    return value


KeyColumns = Annotated[list[Ident], BeforeValidator(_key), AfterValidator(_key_columns)]


# The shortest wait before a re-notification: one is taken by a scan, at most one a
# second (MIN_EVERY), so a shorter wait re-notified at every scan all the same (and,
# without renotify.max, for as long as the row stayed overdue).
MIN_RENOTIFY = timedelta(seconds=1)
RenotifyWait = Annotated[
    timedelta,
    duration_validator(
        positive=True,
        least=MIN_RENOTIFY,
        least_why=" (a re-notification is taken by a scan, at most one a second)",
    ),
]


class Backoff(FileModel):
    """Doubling intervals: ``first``, ``2*first``, ``4*first`` ... capped at ``max``."""

    first: RenotifyWait
    max: RenotifyWait

    @model_validator(mode="after")
    def _max_not_below_first(self) -> Backoff:
        if self.max < self.first:
            raise ValueError("backoff.max must not be shorter than backoff.first")
        return self

    @property
    def doublings(self) -> int:
        """How many doublings of ``first`` reach ``max``: past it the wait stays at ``max``,
        and computing ``first * 2^n`` for a large n would overflow (n has no bound when
        ``renotify.max`` is unset)."""
        k = 0
        while self.first * (1 << k) < self.max:
            k += 1
        return k


class Renotify(FileModel):
    """When to notify again while a row stays overdue."""

    every: RenotifyWait | None = None
    backoff: Backoff | None = None
    max: int | None = Field(default=None, ge=1, le=1_000_000)

    @model_validator(mode="after")
    def _one_schedule(self) -> Renotify:
        if (self.every is None) == (self.backoff is None):
            raise ValueError("renotify needs exactly one of 'every' or 'backoff'")
        return self

    def interval_after(self, n: int) -> timedelta:
        """The wait after notification number ``n`` (1-based) before the next one."""
        if self.every is not None:
            return self.every
        assert self.backoff is not None
        doublings = min(n - 1, self.backoff.doublings)
        return min(self.backoff.first * (1 << doublings), self.backoff.max)


class Tier(FileModel):
    """From notification number ``from`` on, alerts use this severity and/or notifiers."""

    from_: int = Field(alias="from", ge=1)
    severity: Severity | None = None
    notify: list[str] | None = Field(default=None, min_length=1)

    @field_validator("notify")
    @classmethod
    def _notify(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError("lists a notifier twice")
        return v


# An event type: what producers write in "type"; dotted names (CloudEvents) allowed.
EVENT_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_.:/-]{0,99}")


def _types(value: object) -> object:
    """``start: parcel_shipped`` or ``start: [a, b]``: always a list of type names."""
    if isinstance(value, str):
        return [value]
    return value


def _type_names(value: list[str]) -> list[str]:
    if not 1 <= len(value) <= 100:
        raise ValueError("must name 1 to 100 event types")
    for name in value:
        if not EVENT_TYPE.fullmatch(name):
            raise ValueError(
                f"{shorten(name)} is not an event type: a letter, then letters, digits and"
                " _ . : / -, at most 100 characters"
            )
    if len(set(value)) != len(value):
        raise ValueError("names a type twice")
    return value


EventTypes = Annotated[list[str], BeforeValidator(_types), AfterValidator(_type_names)]

# The columns of an event rule's timer table that its alerts carry as ``row``.
TIMER_ROW = ["data", "started_at", "events"]


# A ping URL's key: as unguessable as healthchecks' UUIDs (docs/how-to/pings.md).
PING_KEY_MIN = 22
_UUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")
_PING_KEY = re.compile(rf"[A-Za-z0-9_-]{{{PING_KEY_MIN},200}}")


class Ping(FileModel):
    """``ping: {key: ...}`` of an event rule: ``/ping/<key>`` sends its events."""

    key: SecretStr

    @field_validator("key")
    @classmethod
    def _key(cls, v: SecretStr) -> SecretStr:
        given = v.get_secret_value()
        if not (_UUID.fullmatch(given) or _PING_KEY.fullmatch(given)):
            raise ValueError(
                f"a ping key is a UUID or {PING_KEY_MIN} to 200 letters, digits, _ and -"
                " (anyone who knows it can ping): e.g. the output of 'uuidgen'"
            )
        return v


class Events(FileModel):
    """``events:`` of a rule: which events open and close its deadlines."""

    start: EventTypes | None = None
    stop: EventTypes | None = None
    beat: EventTypes | None = None
    fail: EventTypes | None = None
    within: PositiveDuration | None = None
    min: PositiveDuration | None = None
    # A beat expected at each time of a cron schedule, late after grace; with ``start``:
    # a run expected to start by each time (docs/how-to/events.md#scheduled-runs).
    schedule: str | None = None
    # With ``start``: a run expected to start ``period`` after the last one ended (plus
    # grace), as healthchecks' simple checks count it from the last success.
    period: PositiveDuration | None = None
    grace: Duration = timedelta(0)
    timezone: str = "UTC"
    # Healthchecks-compatible ping URLs for this rule's events.
    ping: Ping | None = None

    @model_validator(mode="after")
    def _shape(self) -> Events:
        if self.ping is not None and self.fail is None:
            raise ValueError("'ping' needs 'fail': the type /ping/<key>/fail sends")
        if (self.start is None) == (self.beat is None):
            raise ValueError("needs exactly one of 'start' (with 'stop') or 'beat'")
        if self.start is not None:
            if self.stop is None:
                raise ValueError("'start' needs 'stop': the type(s) that close it")
            if self.within is None:
                raise ValueError("'start' needs 'within', e.g. within: 72h")
            if self.schedule is not None and self.period is not None:
                raise ValueError(
                    "'schedule' and 'period' both say when a run is expected: give one"
                )
            if self.min is not None and self.scheduled:
                raise ValueError("'min' does not go with 'schedule' or 'period'")
            if self.min is not None and self.min >= self.within:
                raise ValueError("'min' must be shorter than 'within'")
        else:
            if self.stop is not None:
                raise ValueError("'stop' goes with 'start'; a beat closes the last beat")
            if self.min is not None:
                raise ValueError("'min' goes with 'start' and 'stop'")
            if self.period is not None:
                raise ValueError(
                    "'period' goes with 'start'; a heartbeat's period is 'within' (e.g. 25h)"
                )
            if (self.within is None) == (self.schedule is None):
                raise ValueError(
                    "'beat' needs exactly one of 'within' (e.g. 25h) or 'schedule'"
                    " (a cron expression, e.g. '0 2 * * *')"
                )
        if self.schedule is None and "timezone" in self.model_fields_set:
            raise ValueError("'timezone' goes with 'schedule'")
        if self.schedule is None and self.period is None and "grace" in self.model_fields_set:
            raise ValueError(
                "'grace' goes with 'schedule'"
                + (" or 'period'" if self.start is not None else "")
                + ": how late an expected run may start"
            )
        seen: dict[str, str] = {}
        for role in ("start", "stop", "beat", "fail"):
            for name in getattr(self, role) or ():
                if name in seen:
                    raise ValueError(f"type {name!r} is both {seen[name]} and {role}")
                seen[name] = role
        return self

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from apscheduler.triggers.cron import CronTrigger

        try:
            trigger = CronTrigger.from_crontab(v, timezone=UTC)
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f"{shorten(v)} is not a cron expression (five fields, e.g. '0 2 * * *'):"
                f" {str(exc).splitlines()[0][:100]}"
            ) from None
        # A date no month has (31 February): the check would wait for a start forever.
        if trigger.get_next_fire_time(None, datetime(2000, 1, 1, tzinfo=UTC)) is None:
            raise ValueError(f"{shorten(v)} never fires (no month has that day)")
        return v

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, v: str) -> str:
        return _zone(v)

    @property
    def scheduled(self) -> bool:
        """A start/stop rule whose runs are expected (``schedule`` or ``period``): between
        runs its timer waits, open, for the next start (docs/explanation/events.md)."""
        return self.start is not None and (self.schedule is not None or self.period is not None)

    def types(self) -> dict[str, str]:
        """Every type this rule uses, with its role: start, stop, beat or fail."""
        return {
            name: role
            for role in ("start", "stop", "beat", "fail")
            for name in getattr(self, role) or ()
        }

    def next_due(self, beat: datetime) -> datetime | None:
        """``schedule``: when a beat at ``beat`` (with ``start``: a run that ended then)
        is late: the next scheduled time after it, plus ``grace`` (None when the schedule
        has no next time)."""
        from apscheduler.triggers.cron import CronTrigger

        assert self.schedule is not None
        trigger = CronTrigger.from_crontab(self.schedule, timezone=ZoneInfo(self.timezone))
        fire = trigger.get_next_fire_time(None, beat + timedelta(microseconds=1))
        return None if fire is None else fire + self.grace


# What names a webhook action's target among the notifiers (a delivery's ``notifier``):
# a ':' no notifier name may hold (NAME_PATTERN), so it never collides with one.
ACTION_TARGET = "action:"
# A notifier's settings that an action's webhook does not take: the rule names it.
_NOT_FOR_ACTION = ("name", "type", "storm")


class ActionWebhook(WebhookConfig):
    """``action: {webhook: ...}``: a webhook notifier's settings (url, secret, headers,
    ca_file, timeout, retry, batch, concurrency) and nothing else; sent by the webhook
    notifier's own sender as the notifier ``action:<rule>`` (:meth:`Rule.action_target`).
    ``batch`` defaults to 1: one request per action, so each 2xx answers for one."""

    name: str = "action"
    type: Literal["webhook"] = "webhook"
    batch: int = Field(default=1, ge=1, le=10_000)
    concurrency: int = Field(default=1, ge=1, le=16)

    @model_validator(mode="before")
    @classmethod
    def _only_webhook_settings(cls, data: Any) -> Any:
        if isinstance(data, dict):
            given = [k for k in _NOT_FOR_ACTION if k in data]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: not for an action's webhook (it is sent as the"
                    " notifier action:<rule>, one alert at a time unless batch says otherwise)"
                )
        return data


# An action's statement timeout and lock timeout by default (docs/how-to/actions.md), and the
# most either may be: the claim holds its batch's row locks while actions run.
ACTION_TIMEOUT = timedelta(milliseconds=1500)
ACTION_LOCK_TIMEOUT = timedelta(milliseconds=500)
MAX_ACTION_TIMEOUT = timedelta(minutes=1)


def _milliseconds(v: object) -> object:
    """``500ms`` as well as a duration (1.5s is 1500ms, or 1.5)."""
    if isinstance(v, str) and re.fullmatch(r"\s*\d{1,6}\s*ms\s*", v):
        return timedelta(milliseconds=int(v.strip().removesuffix("ms")))
    return v


def _action_timeout(v: timedelta) -> timedelta:
    if not timedelta(milliseconds=1) <= v <= MAX_ACTION_TIMEOUT:
        raise ValueError("must be from 1ms to 1m (the claim holds its locks meanwhile)")
    return v


ActionTimeout = Annotated[Duration, BeforeValidator(_milliseconds), AfterValidator(_action_timeout)]


def _role(v: object) -> object:
    if v is None:
        return v
    if not isinstance(v, str):
        raise ValueError(ident_problem(v, "a role name"))
    if problem := role_problem(v):
        raise ValueError(problem)
    return v


class Action(FileModel):
    """``action:`` of a rule (docs/explanation/actions.md), run when notification number
    ``on`` of an episode is claimed: either ``sql``, one statement run in the claim's transaction,
    or ``webhook``, the alert POSTed through the outbox (actions/webhook.py).

    ``sql`` is checked by PostgreSQL's parser here (:func:`action_problem`); its
    ``:name`` placeholders are checked against the rule's columns by the rule.
    ``max_rows`` is refused beside ``webhook`` (a POST touches no rows).
    """

    sql: str | None = None
    webhook: ActionWebhook | None = None
    # The notification number that triggers it, or "cap": the episode's last one.
    on: int | Literal["cap"] = Field(default=1)
    # A statement touching more rows is rolled back and recorded failed.
    max_rows: int = Field(default=1, ge=0, le=1_000_000)
    # How long one statement of the action may run, and wait for a row's lock: the
    # claim holds its batch's locks meanwhile (docs/how-to/actions.md). The batch's actions
    # together get three times ``timeout`` (:attr:`budget`).
    timeout: ActionTimeout = ACTION_TIMEOUT
    lock_timeout: ActionTimeout = ACTION_LOCK_TIMEOUT
    # The role the statement runs as (SET LOCAL ROLE); unset: SLAWATCH_ACTION_ROLE, else
    # the role slawatch connects as.
    role: Annotated[str | None, BeforeValidator(_role)] = None
    # Objects the statement may touch although check refuses them (unsafe_objects):
    # each named, e.g. [set_config] or [pg_catalog.pg_stat_activity].
    allow: list[str] = Field(default_factory=list, max_length=50)

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: Any) -> Any:
        """YAML 1.1 reads a bare ``on:`` key as the boolean true: it is ``on``."""
        if isinstance(data, dict) and True in data:
            data = {("on" if k is True else k): v for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _one_kind(self) -> Action:
        if self.sql is None and self.webhook is None:
            raise ValueError("needs sql: (a statement) or webhook: (a URL to POST the alert to)")
        if self.sql is not None and self.webhook is not None:
            raise ValueError("sql: and webhook: both given; an action is one of them")
        if self.webhook is not None:
            for name in ("max_rows", "lock_timeout", "role", "allow"):
                if name in self.model_fields_set:
                    raise ValueError(f"{name}: not for a webhook action (it runs no SQL)")
            if "timeout" in self.model_fields_set:
                raise ValueError("timeout: a webhook action's is webhook.timeout")
        if self.lock_timeout > self.timeout:
            raise ValueError(
                "lock_timeout: longer than timeout (a lock not had would end as a timeout)"
            )
        if self.sql is not None:
            found = unsafe_objects(self.sql)
            extra = sorted(set(self.allow) - {name for name, _why in found})
            if extra:
                raise ValueError(
                    f"allow: {shorten(extra[0])} is not something the statement needs allowed"
                )
            for name, why in found:
                if name not in self.allow:
                    raise ValueError(
                        f"{why} is refused (a rule file is code: add allow: [{name}]"
                        " to the action to run it anyway)"
                    )
        return self

    @property
    def budget(self) -> timedelta:
        """The time a claim batch's actions get in all (each statement at most
        ``timeout``): what the batch's locks are held for beyond the claim itself.
        Three timeouts: the batch as one statement, then (when that did not go) one
        action alone that takes all of its own, and the rest; so each scan settles at
        least one action of a batch, and a slow one is recorded failed, not put off."""
        return 3 * self.timeout

    @field_validator("on", mode="before")
    @classmethod
    def _on(cls, v: object) -> object:
        if v == "cap" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            return v
        raise ValueError(f"{shorten(v)} is not a notification number (1, 2, ...) or 'cap'")

    @field_validator("sql")
    @classmethod
    def _sql(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.strip()
        problem = action_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @property
    def kind(self) -> Literal["sql", "webhook"]:
        """Which of the two it is (``slawatch.action.kind``)."""
        return "sql" if self.sql is not None else "webhook"

    @property
    def placeholders(self) -> list[str]:
        """The ``:name`` placeholders, in order of first use (none for a webhook)."""
        return [] if self.sql is None else action_statement(self.sql)[1]

    @property
    def statement(self) -> str:
        """The statement with each ``:name`` as a psycopg parameter ``%(name)s`` (a
        literal ``%`` doubled): values are always bound, never text."""
        assert self.sql is not None, "a webhook action has no statement"
        return action_statement(self.sql)[0]

    @property
    def set_form(self) -> SetForm | None:
        """The statement run once for a whole batch (config/batched.py), or None when
        this shape runs one row at a time."""
        return None if self.sql is None else _set_form(self.sql)


# The most actions a claim runs one by one: each that goes holds a subtransaction
# until the claim commits, and past 64 PostgreSQL's per-backend cache of them
# overflows (every session's snapshots then look subtransactions up on disk).
ONE_BY_ONE_BATCH = 48


@cache
def _set_form(sql: str) -> SetForm | None:
    try:
        return set_form(*action_statement(sql))
    except ValueError:
        return None


# Fields of a table rule that an event rule has no use for: its table is slawatch's.
_TABLE_ONLY = (
    "table",
    "query",
    "key",
    "track",
    "sweep",
    "inline_triggers",
    "deadline",
    "after",
    "open_when",
    "columns",
    "timezone",
)


# The one field of an alert's row that stands in for row data over the bound
# (engine/outbox.py, MAX_DATA), beside the row's key columns: no column of a rule's
# row may have this name (Rule.row_problem), or a row would be read as replaced.
TRUNCATED = "_slawatch_truncated"

# How far ahead of a scan's time a re-notification is taken (Rule.renotify_cutoff).
RENOTIFY_LEAD = timedelta(seconds=1)
# The shortest `every` (docs/reference/rules.md): a scan is at least one transaction, and
# 1 s is what the benchmarks measure (docs/performance.md); an `every: 0.001` rule ran
# ~735 transactions a second and used a third of a CPU.
MIN_EVERY = timedelta(seconds=1)
Every = Annotated[
    timedelta,
    duration_validator(
        positive=True, least=MIN_EVERY, least_why=" (each scan is a transaction or more)"
    ),
]
# The shortest `sweep` (track: table): a sweep is part of a scan, so one shorter than
# the shortest `every` would sweep at every scan all the same (and read every open
# overdue row each time).
MIN_SWEEP = MIN_EVERY
Sweep = Annotated[
    timedelta,
    duration_validator(
        positive=True,
        least=MIN_SWEEP,
        least_why=" (a sweep is part of a scan, at most one a second)",
    ),
]


def _zone(v: str) -> str:
    try:
        ZoneInfo(v)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(f"{shorten(v)} is not a time zone (try UTC or Europe/Berlin)") from exc
    return v


MAX_DESCRIPTION = 2_000


class Rule(FileModel):
    """One rule file: a table rule, or an event rule (``events``)."""

    name: str
    description: str = ""
    # Event rules: which events open and close deadlines (then table..columns are set
    # from it: the rule watches slawatch."<name>_timers").
    events: Events | None = None
    table: str
    # track: table: one SELECT watched instead of a table (its output's columns are the
    # rule's key, deadline and columns); re-read at each scan (docs/reference/rules.md).
    query: str | None = None
    # Column(s) that identify a row: one name or a list; None: the table's primary key.
    key: KeyColumns | None = None
    # Where the rule's state lives: columns on the watched table, or a table of slawatch's.
    track: Literal["inline", "table"] = "inline"
    # track: table: how often a scan also reads every open overdue row (see statetable.py).
    sweep: Sweep = timedelta(minutes=10)
    # track: inline: what to do when a claim's UPDATE of the watched table would set off
    # something (triggers, rewrite rules, publications): refuse the rule, or let them fire.
    inline_triggers: Literal["refuse", "fire"] = "refuse"
    # A column, or an immutable SQL expression over the row's columns (a per-row deadline).
    deadline: Annotated[str, BeforeValidator(_deadline_text)]
    after: Duration = timedelta(0)
    open_when: str
    every: Every = timedelta(seconds=30)
    batch: int = Field(default=10_000, ge=1, le=1_000_000)
    renotify: Renotify | None = None
    severity: Severity = "warning"
    columns: list[Ident] | None = None
    notify: list[str] = Field(min_length=1)
    escalate: list[Tier] = Field(default_factory=list)
    # One "resolved" notice when a notified episode ends, to the notifiers it paged.
    resolve: bool = False
    # An episode still open this long after its due time is ended as abandoned
    # (engine/abandon.py): no more re-notifications; an event rule's timer is closed.
    give_up_after: PositiveDuration | None = None
    # The zone that values of a `timestamp` (without time zone) deadline are in.
    timezone: str = "UTC"
    # What to do when a notification is claimed (docs/explanation/actions.md): a statement
    # in the claim.
    action: Action | None = None
    # A business calendar (calendars/<name>.yaml): `after` counts its working time only.
    calendar: str | None = None
    _calendar: Calendar | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _event_rule(cls, data: Any) -> Any:
        """An event rule watches its timer table: fill in what a table rule writes."""
        if not isinstance(data, dict) or data.get("events") is None:
            return data
        if "calendar" in data:
            raise ValueError(
                "calendar: not supported for event rules yet (within: counts wall-clock time);"
                " business hours apply to table rules"
            )
        given = [f for f in _TABLE_ONLY if f in data]
        if given:
            raise ValueError(
                f"{', '.join(given)}: not for an event rule (events: watches slawatch's own"
                " timer table); a rule has either table: or events:"
            )
        name = data.get("name")
        events = data["events"]
        fast = isinstance(events, dict) and events.get("min") is not None
        return {
            **data,
            "table": f"slawatch.{name}_timers" if isinstance(name, str) else "slawatch.x",
            "key": ["key"],
            "deadline": "due_at",
            "open_when": "open",
            "columns": [*TIMER_ROW, *(["too_fast"] if fast else [])],
        }

    @model_validator(mode="before")
    @classmethod
    def _query_rule(cls, data: Any) -> Any:
        """A query rule watches its SELECT's output: ``table`` is its name in messages."""
        if not isinstance(data, dict) or data.get("query") is None:
            return data
        if "table" in data or data.get("events") is not None:
            raise ValueError("a rule has one of table:, query: or events:")
        if data.get("track") != "table":
            raise ValueError(
                "query: needs track: table (slawatch keeps the state in a table of its own)"
            )
        if data.get("key") is None:
            raise ValueError(
                "query: needs key: the column(s) of the query's output that identify a row"
            )
        deadline = data.get("deadline")
        if isinstance(deadline, str) and (problem := _deadline_name_problem(deadline.strip())):
            raise ValueError(f"deadline: {problem}")
        if isinstance(deadline, str) and not is_ident(deadline.strip()):
            raise ValueError(
                "query: deadline: must be a column of the query's output (compute it in the query)"
            )
        return {**data, "table": QUERY_TABLE}

    @model_validator(mode="before")
    @classmethod
    def _table_of_the_application(cls, data: Any) -> Any:
        """A table rule's ``table:`` is not a system catalog's nor slawatch's own (an
        event rule's timer table is filled in by the model, not written)."""
        if isinstance(data, dict) and data.get("events") is None and data.get("query") is None:
            table = data.get("table")
            if isinstance(table, str) and (problem := table_refusal(table)):
                raise ValueError(problem)
        return data

    @field_validator("query")
    @classmethod
    def _query(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = v.strip().rstrip(";").strip()
        problem = query_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="before")
    @classmethod
    def _one_by_one_batch(cls, data: Any) -> Any:
        """A rule whose action runs one row at a time claims at most ONE_BY_ONE_BATCH
        rows at a time unless it says otherwise (then ``_action_fits`` refuses more)."""
        if not isinstance(data, dict) or "batch" in data:
            return data
        action = data.get("action")
        sql = action.get("sql") if isinstance(action, dict) else None
        if isinstance(sql, str) and _set_form(sql.strip()) is None:
            return {**data, "batch": ONE_BY_ONE_BATCH}
        return data

    @model_validator(mode="after")
    def _action_fits(self) -> Rule:
        if self.action is None:
            return self
        one_by_one = self.action.sql is not None and self.action.set_form is None
        if self.batch > ONE_BY_ONE_BATCH and one_by_one:
            raise ValueError(
                f"batch: {self.batch} is more than {ONE_BY_ONE_BATCH}, and this action runs one"
                " row at a time (a subtransaction each, held until the claim commits; past 64"
                " PostgreSQL's cache of them overflows): lower batch, or write an UPDATE,"
                " DELETE, INSERT ... VALUES/SELECT or SELECT fn(...) slawatch can run as one"
                " statement"
            )
        on, cap = self.action.on, self.renotify.max if self.renotify else None
        if on == "cap" and cap is None:
            raise ValueError(
                "action.on: 'cap' needs renotify.max (the notification that is the episode's last)"
            )
        if isinstance(on, int) and on > (self.max_notifications or on):
            raise ValueError(
                f"action.on: {on} is past the cap: an episode has at most"
                f" {self.max_notifications} notification(s)"
            )
        # The key is known here unless it is the table's primary key (then
        # ready.prepare_ready checks once the catalog has named it).
        if self.key is not None:
            problem = self.placeholder_problem(self.key)
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _row_has_no_marker(self) -> Rule:
        # As _action_fits: a rule keyed by the table's primary key without
        # `columns` is checked by ready.prepare_ready.
        if self.key is not None or self.columns is not None:
            problem = self.row_problem(list(self.key or ()))
            if problem:
                raise ValueError(problem)
        return self

    def row_problem(self, key: list[str]) -> str | None:
        """Why this rule's alerts cannot carry their row as it is (a column named as the
        field that stands in for a row over the bound), or None."""
        if TRUNCATED not in self.alert_columns(key):
            return None
        where, fix = (
            ("columns", "leave it out")
            if self.columns is not None
            else ("key or deadline", "set columns: without it")
        )
        return (
            f"{where}: a column named {TRUNCATED} cannot be in an alert's row (slawatch"
            f" writes that field in place of row data over 64 KiB): {fix}, or select it"
            " under another name (query:, a view)"
        )

    def placeholder_problem(self, key: list[str]) -> str | None:
        """Why the action's placeholders are not all values an alert of this rule has
        (its key and alert columns), or None."""
        if self.action is None:
            return None
        allowed = self.action_columns(key)
        unknown = [p for p in self.action.placeholders if p not in allowed]
        if unknown:
            return (
                f"action.sql: unknown placeholder {', '.join(':' + u for u in unknown)}"
                f" (a rule's action may use {', '.join(':' + a for a in allowed)}:"
                " its key and columns)"
            )
        return None

    def action_columns(self, key: list[str]) -> list[str]:
        """The placeholders an action may use: the alert's columns, and a one-column key
        (the alert's key is that column's text); a column of a composite key needs to
        be in ``columns``."""
        cols = self.alert_columns(key)
        return [*([key[0]] if len(key) == 1 and key[0] not in cols else []), *cols]

    @property
    def action_on(self) -> int | None:
        """The notification number that triggers the action (``cap``: the cap)."""
        if self.action is None:
            return None
        return self.max_notifications if self.action.on == "cap" else self.action.on

    @property
    def action_target(self) -> WebhookConfig | None:
        """A webhook action's sender, as the notifier ``action:<rule>`` (None for a
        rule without one): its deliveries are the outbox rows the claim writes."""
        if self.action is None or self.action.webhook is None:
            return None
        return self.action.webhook.model_copy(update={"name": ACTION_TARGET + self.name})

    @model_validator(mode="after")
    def _sweep_is_for_table(self) -> Rule:
        if "sweep" in self.model_fields_set and self.track != "table":
            raise ValueError("sweep: applies to track: table only")
        return self

    @model_validator(mode="after")
    def _inline_triggers_is_for_inline(self) -> Rule:
        if "inline_triggers" in self.model_fields_set and self.track != "inline":
            # track: table never writes the watched table: there is nothing to accept.
            raise ValueError("inline_triggers: applies to track: inline only")
        return self

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v, RULE_NAME, "rule", "lower-case letters, digits and _")

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        # It goes into every alert of the rule: a 10 MB one made every payload 10 MB.
        if len(v) > MAX_DESCRIPTION:
            raise ValueError(
                f"is {len(v):,} characters; at most {MAX_DESCRIPTION:,} (it is in every alert)"
            )
        if "\x00" in v:
            raise ValueError("must not contain a NUL character")
        return v

    @field_validator("table")
    @classmethod
    def _table(cls, v: str) -> str:
        parts = v.split(".")
        if len(parts) > 2:
            raise ValueError(f"{shorten(v)} is not a table name (table or schema.table)")
        # The part that is wrong, by its name: schema.table's first part is the schema.
        whats = ["a table name"] if len(parts) == 1 else ["a schema name", "a table name"]
        for part, what in zip(parts, whats, strict=True):
            if problem := ident_problem(part, what):
                raise ValueError(problem if part == v else f"{shorten(v)}: {problem}")
        return v

    @field_validator("open_when")
    @classmethod
    def _open_when(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("must be an SQL condition, e.g. status = 'paid'")
        problem = predicate_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, v: str, info: ValidationInfo) -> str:
        if is_ident(v):
            return v
        if problem := _deadline_name_problem(v):
            raise ValueError(problem)
        problem = deadline_problem(v, str(info.data.get("table", "")).split(".")[-1])
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, v: str) -> str:
        return _zone(v)

    @field_validator("calendar")
    @classmethod
    def _calendar_name(cls, v: str | None) -> str | None:
        if v is not None and not CALENDAR_NAME.fullmatch(v):
            raise ValueError(f"{shorten(v)} is not a calendar name (a file calendars/<name>.yaml)")
        return v

    @model_validator(mode="after")
    def _calendar_span(self) -> Rule:
        if self.calendar is not None and self.after > MAX_WORKING_SPAN:
            raise ValueError(
                f"after: more than {MAX_WORKING_SPAN_TEXT} of working time, the most a rule"
                " with a calendar may wait"
            )
        return self

    def use_calendar(self, calendar: Calendar) -> None:
        """Give the rule its ``calendar`` (loaded from calendars/; see check_calendar_names)."""
        self._calendar = calendar

    @property
    def loaded_calendar(self) -> Calendar | None:
        """The calendar :meth:`use_calendar` gave the rule, if any."""
        return self._calendar

    def cutoff(self, now: datetime) -> datetime:
        """The claim's cutoff at ``now`` (aware): a deadline less than this is due.
        ``now - after``, or with a calendar ``after`` of its working time before now."""
        if self.calendar is None:
            return now - self.after
        if self._calendar is None:
            raise ConfigError(f"{self.source}: calendar: {self.calendar!r} was not loaded")
        return self._calendar.cutoff(now, self.after)

    def renotify_cutoff(self, now: datetime) -> datetime:
        """The claim's cutoff for re-notifications at ``now``: one whose time is less than
        this is due. A little after ``now`` (:data:`RENOTIFY_LEAD`, at most a tenth of
        ``every``): a scan that starts a few milliseconds before a re-notification's time
        takes it, instead of the next scan a whole ``every`` later (docs/explanation/guarantees.md).
        First notices have no lead (:meth:`cutoff`): a row is never paged before it is due."""
        return now + min(RENOTIFY_LEAD, self.every / 10)

    def due_at(self, deadline: datetime) -> datetime:
        """When a row with this deadline (aware) falls due: it is due once this has passed."""
        if self.calendar is None:
            return deadline + self.after
        if self._calendar is None:
            raise ConfigError(f"{self.source}: calendar: {self.calendar!r} was not loaded")
        return self._calendar.forward(deadline, self.after)

    @field_validator("notify")
    @classmethod
    def _notify(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("lists a notifier twice")
        return v

    @field_validator("escalate")
    @classmethod
    def _tiers(cls, v: list[Tier]) -> list[Tier]:
        froms = [t.from_ for t in v]
        if len(set(froms)) != len(froms):
            raise ValueError("two tiers have the same 'from'")
        return sorted(v, key=lambda t: t.from_)

    @property
    def timers(self) -> str:
        """An event rule's timer table (in schema slawatch)."""
        return f"{self.name}_timers"

    @property
    def schema_name(self) -> str:
        return self.table.split(".")[0] if "." in self.table else "public"

    @property
    def table_name(self) -> str:
        return self.table.split(".")[-1]

    def alert_columns(self, key: list[str]) -> list[str]:
        """Columns copied into each alert's ``row``: ``columns``, else the key and the
        deadline's column(s) (those a deadline expression reads)."""
        if self.columns is not None:
            return list(self.columns)
        return [*key, *(c for c in self.deadline_columns if c not in key)]

    @property
    def deadline_column(self) -> str | None:
        """The deadline's column; None when the deadline is an expression."""
        return self.deadline if is_ident(self.deadline) else None

    @property
    def deadline_columns(self) -> list[str]:
        """The columns the deadline reads, in order of first use."""
        if self.deadline_column is not None:
            return [self.deadline_column]
        return list(dict.fromkeys(expression_columns(self.deadline)))

    def deadline_sql(self, alias: str | None = None) -> str:
        """The deadline as printable SQL: its quoted column, or the expression in
        parentheses; with ``alias``, its columns qualified by it (``t.paid_at``), so
        the expression reads the watched row where other tables are in scope too."""
        column = self.deadline_column
        if column is not None:
            names = (alias, column) if alias else (column,)
            return sql.Identifier(*names).as_string(None)
        return f"({qualify(self.deadline, alias) if alias else self.deadline})"

    @property
    def max_notifications(self) -> int | None:
        """Cap on notifications per row; None means no cap."""
        return 1 if self.renotify is None else self.renotify.max

    @property
    def n_column(self) -> str:
        """Notifications sent in the current episode (0: none)."""
        return f"sw_{self.name}_n"

    @property
    def next_column(self) -> str:
        """When the next re-notification is due; NULL when none is (capped, or no episode)."""
        return f"sw_{self.name}_next"

    @property
    def seen_column(self) -> str:
        """The deadline value the current episode is for; NULL when no episode is open."""
        return f"sw_{self.name}_seen"

    @property
    def episode_column(self) -> str:
        """The number of the row's current (or last) episode: 1, 2, ...; 0 before the first."""
        return f"sw_{self.name}_ep"

    @property
    def tracking_columns(self) -> list[str]:
        return [self.n_column, self.next_column, self.seen_column, self.episode_column]

    @property
    def due_index(self) -> str:
        """track: table: the watched table's index on the deadline of open rows."""
        return f"sw_{self.name}_due"

    @property
    def deadline_index(self) -> str:
        """track: table: the watched table's index on the deadline of every row, for the
        report's ``due`` (docs/how-to/report.md)."""
        return f"sw_{self.name}_deadline"

    @property
    def first_index(self) -> str:
        return f"sw_{self.name}_first"

    @property
    def again_index(self) -> str:
        return f"sw_{self.name}_again"

    @property
    def ended_index(self) -> str:
        return f"sw_{self.name}_ended"

    def all_notifiers(self) -> set[str]:
        names = set(self.notify)
        for tier in self.escalate:
            names.update(tier.notify or ())
        return names

    def tier_for(self, n: int) -> tuple[Severity, list[str]]:
        """Severity and notifiers of notification number ``n``; the last tier reached wins."""
        severity, notify = self.severity, self.notify
        for tier in self.escalate:
            if n >= tier.from_:
                severity = tier.severity or severity
                notify = tier.notify or notify
        return severity, list(notify)

    def paged_notifiers(self, n: int) -> list[str]:
        """Every notifier that notifications 1..``n`` of an episode went to, in order of
        first use: a tier's notifiers only once its ``from`` was reached."""
        out: list[str] = []
        for k in [1, *(t.from_ for t in self.escalate if t.from_ <= n)]:
            for name in self.tier_for(k)[1]:
                if name not in out:
                    out.append(name)
        return out


# Clauses of ``SELECT 1 WHERE <open_when>`` that must stay empty: anything there came
# from the condition's text and would change the statement it is put into.
_SELECT_EXTRAS = (
    "distinctClause",
    "intoClause",
    "fromClause",
    "groupClause",
    "havingClause",
    "windowClause",
    "valuesLists",
    "sortClause",
    "limitOffset",
    "limitCount",
    "lockingClause",
    "withClause",
    "larg",
    "rarg",
)


# The most characters of SQL a rule may give PostgreSQL's parser (a condition, a
# deadline, a query, an action). pglast converts the parse tree recursively: a text of
# some 60,000 characters nesting 30,000 deep ("1+1+1...") overflows the C stack and
# kills the process; at most 20,000 nest at most 10,000 deep, which it reads.
MAX_SQL = 20_000


def _too_long(text: str) -> str | None:
    if len(text) > MAX_SQL:
        return f"is {len(text):,} characters; at most {MAX_SQL:,}"
    return None


def predicate_problem(text: str) -> str | None:
    """Why ``text`` is not exactly one SQL expression, or None.

    PostgreSQL's own parser (pglast) reads it as the WHERE clause of a SELECT; it
    must be the whole clause and nothing else, so no text in it (a stray ``)``,
    ``;``, ``UNION``, a comment) can reach beyond the ``AND (...)`` slawatch
    puts it in; and it calls none of the functions :func:`call_refusal` names.
    Whether it is boolean, immutable and names real columns is for the database to
    say at ``check``/``migrate`` time.
    """
    # Imported here: parsing rules is the only use, and the module is large.
    import pglast
    from pglast import ast, parser

    if too_long := _too_long(text):
        return too_long
    if "\x00" in text:  # the parser and libpq would both stop reading there
        return "must not contain a NUL character"
    try:
        tokens = parser.scan(text)
    except pglast.parser.ParseError as exc:
        return f"not one SQL condition: {exc.args[0]}"
    if any(t.name in ("SQL_COMMENT", "C_COMMENT") for t in tokens):
        return "must not contain SQL comments"
    try:
        statements = pglast.parse_sql("SELECT 1 WHERE " + text)
    except pglast.parser.ParseError as exc:
        return f"not one SQL condition: {exc.args[0]}"
    if len(statements) != 1:
        return "must be one SQL condition, without ';'"
    select = statements[0].stmt
    if (
        not isinstance(select, ast.SelectStmt)
        or select.op != pglast.enums.SetOperation.SETOP_NONE
        or any(getattr(select, f) for f in _SELECT_EXTRAS)
        or len(select.targetList or ()) != 1
        or select.whereClause is None
    ):
        return "must be one SQL condition, not a query (no UNION, ORDER BY, LIMIT, ...)"
    for node in walk(select.whereClause):
        if isinstance(node, ast.SubLink):
            return "must not contain a subquery (a partial index cannot use one)"
        if isinstance(node, ast.ParamRef):
            return "must not contain parameters ($1); write the value"
        if isinstance(node, ast.FuncCall | ast.TypeCast) and (
            refused := call_refusal(node, reads=True)
        ):
            return f"must not call {refused[1]}"
    return None


# A query rule's ``table``, as its messages name what it watches: the query's output.
QUERY_TABLE = "query"


def query_problem(text: str) -> str | None:
    """Why ``text`` is not one plain SELECT to watch, or None. PostgreSQL's parser
    (pglast) reads it: exactly one ``SELECT`` (joins, subqueries, ``UNION`` and
    read-only ``WITH`` allowed), no data-modifying ``WITH``, no ``FOR UPDATE``/``SHARE``,
    no ``SELECT INTO``, no parameters, no comment, no table of :func:`relation_refusal`
    (system catalogs, slawatch's own) and no function of :func:`call_refusal`. The query
    is put in parentheses in the scan's statements: nothing in it may reach beyond them."""
    import pglast
    from pglast import ast, parser

    if too_long := _too_long(text):
        return too_long
    if "\x00" in text:
        return "must not contain a NUL character"
    try:
        tokens = parser.scan(text)
        statements = pglast.parse_sql(text)
    except pglast.parser.ParseError as exc:
        return f"not one SELECT: {exc.args[0]}"
    if any(t.name in ("SQL_COMMENT", "C_COMMENT") for t in tokens):
        return "must not contain SQL comments"
    if len(statements) != 1 or not isinstance(statements[0].stmt, ast.SelectStmt):
        return "must be exactly one SELECT (no ';', no other statement)"
    for node in walk(statements[0].stmt):
        if isinstance(node, ast.InsertStmt | ast.UpdateStmt | ast.DeleteStmt | ast.MergeStmt):
            return "must only read: no INSERT, UPDATE, DELETE or MERGE in a WITH"
        if isinstance(node, ast.SelectStmt) and node.lockingClause:
            return "must not lock rows (no FOR UPDATE / FOR SHARE): slawatch only reads"
        if isinstance(node, ast.SelectStmt) and node.intoClause is not None:
            return "must not be SELECT INTO"
        if isinstance(node, ast.ParamRef):
            return "must not contain parameters ($1); write the value"
        if isinstance(node, ast.RangeVar) and (refused := relation_refusal(node)):
            return f"must not read {refused[0]}: {refused[1]}"
        if isinstance(node, ast.FuncCall | ast.TypeCast) and (
            refused := call_refusal(node, reads=True)
        ):
            return f"must not call {refused[1]}"
    return None


# How a deadline that needs a value from another table can be had
# (docs/how-to/watch-a-table.md).
OTHER_TABLE = (
    "a deadline is computed from the row's own columns; for a value from another table,"
    " keep the deadline in a column of this table that a trigger fills in, or use an"
    " event rule (docs/how-to/watch-a-table.md)"
)


def deadline_problem(text: str, table: str) -> str | None:
    """Why ``text`` is not a deadline expression over the columns of one row of
    ``table`` (its unqualified name), or None. PostgreSQL's parser (pglast) reads it
    as :func:`predicate_problem` reads a condition; that its columns exist, its type
    is a timestamp and its functions are immutable is for the database to say."""
    from pglast import ast

    problem = predicate_problem(text)
    if problem:
        return problem.replace("SQL condition", "SQL expression").replace(
            "must not contain a subquery (a partial index cannot use one)",
            f"must not contain a subquery: {OTHER_TABLE}",
        )
    for node in walk(_where(text)):
        if isinstance(node, ast.ColumnRef):
            fields = [f.sval or "" if isinstance(f, ast.String) else "*" for f in node.fields or ()]
            if "*" in fields:
                return "must not read a whole row (*): name the columns"
            if len(fields) > 1 and fields[:-1] != [table]:
                return f"{'.'.join(fields)} is another table's column: {OTHER_TABLE}"
            if len(fields) > 1:
                return f"write {'.'.join(fields)} as {fields[-1]} (the row's own columns)"
        if isinstance(node, ast.FuncCall) and (node.agg_star or node.over is not None):
            return "must be one row's value: no aggregate or window function"
    return None


def _where(text: str) -> Any:
    import pglast

    return pglast.parse_sql("SELECT 1 WHERE " + text)[0].stmt.whereClause  # type: ignore[union-attr]


def expression_columns(text: str) -> list[str]:
    """The column names an expression reads (last name part), in order of use."""
    from pglast import ast

    refs = [n for n in walk(_where(text)) if isinstance(n, ast.ColumnRef) and n.fields]
    refs.sort(key=lambda n: n.location or 0)
    out = []
    for node in refs:
        last = (node.fields or ("",))[-1]
        if isinstance(last, ast.String) and last.sval:
            out.append(last.sval)
    return out


def qualify(text: str, alias: str) -> str:
    """``text`` (an expression of unqualified columns) with each column as ``alias.column``.

    The parser gives each column reference's place in the text, so the operator's
    text is kept as written and only the qualifier is inserted."""
    from pglast import ast

    prefix = "SELECT 1 WHERE "
    # pglast gives locations in characters of the text it parsed.
    at = sorted(
        (n.location or 0) - len(prefix)
        for n in walk(_where(text))
        if isinstance(n, ast.ColumnRef) and len(n.fields or ()) == 1
    )
    qualifier = sql.Identifier(alias).as_string(None) + "."
    out, last = [], 0
    for pos in at:
        out += [text[last:pos], qualifier]
        last = pos
    out.append(text[last:])
    return "".join(out)


# What an action statement may be: DML, or a SELECT that calls a function.
_DML = ("InsertStmt", "UpdateStmt", "DeleteStmt")


def action_problem(text: str) -> str | None:
    """Why ``text`` is not one INSERT, UPDATE, DELETE or ``SELECT fn(...)``, or None.

    PostgreSQL's parser (pglast) decides; ``:name`` placeholders are read from its
    tokens (so neither a ``::cast`` nor a ``:x`` inside a string literal is one).
    """
    import pglast
    from pglast import ast

    if not text:
        return "must be an SQL statement, e.g. update jobs set status = 'queued' where id = :id"
    if "\x00" in text:
        return "must not contain a NUL character"
    try:
        statement, names = action_statement(text)
    except ValueError as exc:
        return str(exc)
    try:
        # The statement as psycopg will send it, each placeholder a parameter ($n).
        statements = pglast.parse_sql(action_numbered(statement, names))
    except pglast.parser.ParseError as exc:
        return f"not an SQL statement: {exc.args[0]}"
    if len(statements) != 1:
        return "must be exactly one statement (no ';' between two)"
    stmt = statements[0].stmt
    kind = type(stmt).__name__
    if kind in _DML:
        if getattr(stmt, "withClause", None):
            # A data-modifying WITH would write rows that max_rows does not count.
            return "must not have a WITH clause: one INSERT, UPDATE or DELETE"
        return None
    if isinstance(stmt, ast.SelectStmt):
        plain = (
            stmt.op == pglast.enums.SetOperation.SETOP_NONE
            and not stmt.fromClause
            and not stmt.intoClause
            and not stmt.withClause
            and len(stmt.targetList or ()) == 1
        )
        target = stmt.targetList[0].val if stmt.targetList else None
        if plain and isinstance(target, ast.FuncCall):
            return None
        return "a SELECT must be one function call, e.g. select requeue(:id)"
    what = {
        "TransactionStmt": "a transaction statement",
        "CopyStmt": "COPY",
    }.get(kind, f"{kind.removesuffix('Stmt').upper()} (DDL or a utility statement)")
    return f"{what} is not allowed: one INSERT, UPDATE, DELETE or SELECT fn(...)"


# Schemas of the system catalogs: a rule reads and writes the application's tables.
_CATALOG_SCHEMAS = ("pg_catalog", "information_schema", "pg_toast")
# slawatch's own schema (its alerts, outbox, history, timers and the functions that keep
# them): a rule's SQL treats it as a system catalog.
OWN_SCHEMA = "slawatch"
# PostgreSQL's own functions are refused by name: every ``pg_*`` one (unqualified or in
# pg_catalog: sessions, settings, configuration files, statistics, locks, replication,
# definitions of other objects; a list of the dangerous ones would miss the next), but
# these, which tell about a value only:
_PLAIN_PG_FUNCTIONS = ("pg_typeof", "pg_column_size", "pg_size_pretty", "pg_size_bytes")
# The types whose values are catalog rows found by name: a cast to one
# (``g::regrole``, ``'pg_authid'::regclass``) reads a catalog, as does a call of its
# name (``regclass('x')``).
_REG_TYPES = (
    "regclass",
    "regcollation",
    "regconfig",
    "regdictionary",
    "regnamespace",
    "regoper",
    "regoperator",
    "regproc",
    "regprocedure",
    "regrole",
    "regtype",
)
# ... and those of PostgreSQL's that reach as far without the prefix: files and large
# objects, other servers, settings, SQL given as text (which no reading of the statement
# sees into), a table read by its name, index maintenance that writes. A name ending in
# "*" is a prefix.
_UNSAFE_FUNCTIONS = (
    "lo_*",
    "loread",
    "lowrite",
    "dblink*",
    "set_config",
    "current_setting",
    "setseed",
    "query_to_xml*",
    "cursor_to_xml*",
    "table_to_xml*",
    "schema_to_xml*",
    "database_to_xml*",
    "ts_stat",
    "ts_rewrite",
    "currtid*",
    "binary_upgrade_*",
    "brin_summarize_*",
    "brin_desummarize_range",
    "gin_clean_pending_list",
    # Extensions' functions that run SQL given as text (tablefunc, xml2) or read raw
    # pages (pageinspect): the text is run with slawatch's role, unseen by any check.
    "crosstab*",
    "connectby",
    "xpath_table",
    "get_raw_page",
    "heap_page_items",
    # Catalogs and the server read without a pg_ prefix: other roles' and objects'
    # comments, the server's version and address, other sessions' transactions, whether
    # a role may do what, any object found by its name.
    "obj_description",
    "shobj_description",
    "col_description",
    "version",
    "inet_server_*",
    "inet_client_*",
    "txid_current_snapshot",
    "txid_current_if_assigned",
    "txid_snapshot_*",
    "txid_status",
    "txid_visible_in_snapshot",
    *(
        f"has_{what}_privilege"
        for what in (
            "any_column",
            "column",
            "database",
            "foreign_data_wrapper",
            "function",
            "language",
            "parameter",
            "schema",
            "sequence",
            "server",
            "table",
            "tablespace",
            "type",
        )
    ),
    "to_reg*",
    *_REG_TYPES,
)
# Functions a read-only query must not call, though an action may: they advance a
# sequence, take an advisory lock, assign a transaction id, notify listeners or wait,
# each time the query runs (every sweep).
_WRITING_FUNCTIONS = (
    "nextval",
    "setval",
    "currval",
    "lastval",
    "txid_current",
    "pg_current_xact_id",
    "pg_advisory_*",
    "pg_try_advisory_*",
    "pg_notify",
    "pg_sleep*",
)
# The pg_* functions an action may call besides _PLAIN_PG_FUNCTIONS: it writes, and these
# lock until the claim commits or notify listeners when it does (a session's advisory
# lock would outlive the claim on a pooled connection: refused).
_ACTION_PG_FUNCTIONS = (
    "pg_advisory_xact_lock*",
    "pg_try_advisory_xact_lock*",
    "pg_notify",
)


def _named(name: str, patterns: tuple[str, ...]) -> bool:
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)


def relation_refusal(node: Any) -> tuple[str, str] | None:
    """(its name as written, what kind of table it is) when the table or view ``node``
    (a RangeVar) is one a rule must not touch unasked: a system catalog's (a schema of
    the catalogs, or a ``pg_`` name, which PostgreSQL looks up in pg_catalog first) or
    slawatch's own."""
    schema, rel = node.schemaname, str(node.relname)
    name = f"{schema}.{rel}" if schema else rel
    if (schema or "").lower() == OWN_SCHEMA:
        return name, "slawatch's own table (every rule's alerts, the outbox, history)"
    if (schema or "").lower() in _CATALOG_SCHEMAS or (
        schema is None and rel.lower().startswith("pg_")
    ):
        return name, "a system catalog"
    return None


def table_refusal(table: str) -> str | None:
    """Why a table rule may not watch ``table`` (as written in ``table:``), in one line,
    or None: a table of the system catalogs (``pg_catalog``, ``information_schema``,
    ``pg_toast``, any ``pg_*`` schema: PostgreSQL reserves the prefix) or of slawatch's
    own schema. ``check`` would count its rows and ``migrate`` alter it. A name without
    a schema is in ``public``."""
    schema = table.split(".")[0] if "." in table else None
    if schema == OWN_SCHEMA:
        return (
            f"table: {shorten(table)} is slawatch's own table (its alerts, outbox, history):"
            " a rule watches the application's tables"
        )
    if schema is not None and (schema in _CATALOG_SCHEMAS or schema.startswith("pg_")):
        return (
            f"table: {shorten(table)} is a system catalog: a rule watches the application's tables"
        )
    return None


def call_refusal(node: Any, *, reads: bool) -> tuple[str, str] | None:
    """(the name to allow, ``name(): what it is``) when the function call ``node``
    (a FuncCall) is one a rule must not make unasked, or the cast ``node`` (a TypeCast)
    one to a type of :data:`_REG_TYPES`. ``reads``: a query, condition or
    deadline, which only read, and run at every scan; else an action, which writes."""
    from pglast import ast

    if isinstance(node, ast.TypeCast):  # a cast to a reg* type reads a catalog by name
        names = node.typeName.names if node.typeName is not None else ()
        typ = [str(p.sval).lower() for p in names or () if isinstance(p, ast.String)]
        if typ and typ[-1] in _REG_TYPES:
            return typ[-1], f"::{typ[-1]} (a cast to {typ[-1]} finds catalog rows by name)"
        return None
    parts = [str(p.sval).lower() for p in node.funcname or () if isinstance(p, ast.String)]
    fn = parts[-1] if parts else ""
    schema = parts[-2] if len(parts) > 1 else None
    if schema == OWN_SCHEMA:
        name = f"{schema}.{fn}"
        return name, f"{name}(): slawatch's own function (it keeps the alerts, outbox, history)"
    if schema in _CATALOG_SCHEMAS and schema != "pg_catalog":  # pg_catalog's: by name
        name = f"{schema}.{fn}"
        return name, f"{name}(): a system catalog's function"
    if reads and _named(fn, _WRITING_FUNCTIONS):
        return fn, (
            f"{fn}(): a function that writes, locks, notifies or waits (what a rule watches"
            " is read at every scan: it would do so each time)"
        )
    if _named(fn, _UNSAFE_FUNCTIONS):
        return fn, (
            f"{fn}(): a function that reaches files, servers, settings or catalogs, or runs"
            " SQL given as text"
        )
    if schema in (None, "pg_catalog") and fn.startswith("pg_"):
        if fn in _PLAIN_PG_FUNCTIONS or (not reads and _named(fn, _ACTION_PG_FUNCTIONS)):
            return None
        return fn, (
            f"{fn}(): a server function of PostgreSQL's (pg_*: sessions, settings, files,"
            " statistics, catalogs)"
        )
    return None


def unsafe_objects(text: str) -> list[tuple[str, str]]:
    """What the action statement ``text`` touches that a rule must allow by name
    (``action.allow``): (the name to allow, what it is), read from PostgreSQL's parse
    tree: a table or view of :func:`relation_refusal`, a function of
    :func:`call_refusal`. Statements other than one INSERT, UPDATE, DELETE or
    ``SELECT fn(...)`` (COPY, SET, DO, CALL, DDL, GRANT) are refused outright
    (:func:`action_problem`); ``text`` that does not parse touches nothing here."""
    import pglast
    from pglast import ast

    try:
        statement, names = action_statement(text)
        tree = pglast.parse_sql(action_numbered(statement, names))
    except (ValueError, pglast.parser.ParseError):
        return []
    found: dict[str, str] = {}
    for node in walk(tree):
        if isinstance(node, ast.RangeVar) and (refused := relation_refusal(node)):
            found.setdefault(refused[0], f"{refused[0]}: {refused[1]}")
        elif isinstance(node, ast.FuncCall | ast.TypeCast) and (
            refused := call_refusal(node, reads=False)
        ):
            found.setdefault(*refused)
    return list(found.items())


def action_numbered(statement: str, names: list[str]) -> str:
    """``statement`` (of :func:`action_statement`) as the server parses it: each
    ``%(name)s`` of ``names`` as ``$1``, ``$2``, ... in that order."""
    out = statement.replace("%%", "\x00")
    for i, name in enumerate(names, 1):
        out = out.replace(f"%({name})s", f"${i}")
    return out.replace("\x00", "%")


def action_statement(text: str) -> tuple[str, list[str]]:
    """``text`` with each ``:name`` placeholder as ``%(name)s`` (and each ``%`` doubled),
    and the names in order of first use. ValueError if the text does not scan."""
    import pglast
    from pglast import parser

    if too_long := _too_long(text):
        raise ValueError(too_long)
    try:
        tokens = parser.scan(text)
    except pglast.parser.ParseError as exc:
        raise ValueError(f"not an SQL statement: {exc.args[0]}") from None
    if any(t.name == "PARAM" for t in tokens):
        raise ValueError("write :name placeholders (the rule's columns), not $1")
    out, names, at = [], [], 0
    for i, token in enumerate(tokens):
        # ':' then an identifier right after it, and not the second ':' of '::'.
        # ':' with a word right after it ('::' is one TYPECAST token; a ':' inside a
        # string literal is part of the literal's token).
        if token.name != "ASCII_58" or i + 1 >= len(tokens):
            continue
        name = tokens[i + 1]
        ident = text[name.start : name.end + 1]
        if name.start != token.end + 1:
            continue
        if not is_ident(ident):
            if ident_letters(ident):  # meant as a name: say what is wrong with it
                raise ValueError(f":{ident}: {ident_problem(ident, 'a column name')}")
            continue
        out.append(text[at : token.start].replace("%", "%%"))
        out.append(f"%({ident})s")
        names.append(ident)
        at = name.end + 1
    out.append(text[at:].replace("%", "%%"))
    return "".join(out), list(dict.fromkeys(names))


def condition_columns(text: str) -> set[str]:
    """The column names ``open_when`` reads (its last name part: ``t.status`` is status)."""
    import pglast
    from pglast import ast

    where = pglast.parse_sql("SELECT 1 WHERE " + text)[0].stmt.whereClause  # type: ignore[union-attr]
    names: set[str] = set()
    for node in walk(where):
        if isinstance(node, ast.ColumnRef) and node.fields:
            last = node.fields[-1]
            if isinstance(last, ast.String) and last.sval:
                names.add(last.sval)
    return names


def walk(node: object) -> list[object]:
    """Every AST node below ``node``, itself included."""
    from pglast import ast

    out: list[object] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple | list):
            stack.extend(item)
        elif isinstance(item, ast.Node):
            out.append(item)
            stack.extend(getattr(item, slot) for slot in getattr(item, "__slots__", ()))
    return out


def with_action_role(rules: list[Rule], role: str | None) -> list[Rule]:
    """``rules`` with ``role`` (SLAWATCH_ACTION_ROLE) as the role of each sql action
    that names none of its own."""
    if role is None:
        return rules
    out = []
    for rule in rules:
        action = rule.action
        if action is not None and action.sql is not None and action.role is None:
            rule = rule.model_copy(update={"action": action.model_copy(update={"role": role})})
        out.append(rule)
    return out


def load_rules(directory: Path) -> list[Rule]:
    """Load ``directory/*.yaml``; at least one rule."""
    rules = load_dir(directory, lambda _data, _path: Rule, "rules", prepare=_action_secrets)
    if not rules:
        raise ConfigError(f"{directory}: no rules (*.yaml) found")
    seen: dict[str, str] = {}
    for rule in rules:
        if rule.events is not None and rule.events.ping is not None:
            key = rule.events.ping.key.get_secret_value()
            if key in seen:
                raise ConfigError(
                    f"{rule.source}: events.ping.key: the same key as rule {seen[key]}'s;"
                    " each rule needs a key of its own"
                )
            seen[key] = rule.name
    return rules


def _action_secrets(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """``${VAR}`` in a webhook action's settings (its ``secret``, a token in a header or
    the URL) is read from the environment, as in a notifier's file; nowhere else in a
    rule (``open_when`` and ``sql`` are SQL, where ``${`` means what it says)."""
    events = data.get("events") if isinstance(data, dict) else None
    if isinstance(events, dict) and isinstance(events.get("ping"), dict):
        # A ping key is a secret too: ${VAR} keeps it out of the rules folder.
        data = {
            **data,
            "events": {**events, "ping": interpolate(events["ping"], path, "events.ping")},
        }
    action = data.get("action") if isinstance(data, dict) else None
    if not isinstance(action, dict) or not isinstance(action.get("webhook"), dict):
        return data
    hook = action["webhook"]
    hook = interpolate(hook, path, "action.webhook")
    return {**data, "action": {**action, "webhook": hook}}


def action_targets(rules: list[Rule]) -> list[WebhookConfig]:
    """The senders of the rules' webhook actions, as notifiers (``action:<rule>``)."""
    return [t for t in (r.action_target for r in rules) if t is not None]


def check_calendar_names(rules: list[Rule], calendars: dict[str, Calendar]) -> None:
    """Give each rule with ``calendar:`` its calendar; every name must be defined."""
    errors = []
    for rule in rules:
        if rule.calendar is None:
            continue
        calendar = calendars.get(rule.calendar)
        if calendar is None:
            have = ", ".join(sorted(calendars)) or "none"
            errors.append(
                f"{rule.source}: calendar: unknown calendar {rule.calendar!r} (defined: {have})"
            )
            continue
        rule.use_calendar(calendar)
    if errors:
        raise ConfigError("\n".join(errors))


def check_notifier_names(rules: list[Rule], known: set[str]) -> None:
    """Every notifier a rule names must be defined."""
    errors = []
    for rule in rules:
        unknown = sorted(rule.all_notifiers() - known)
        if unknown:
            have = ", ".join(sorted(known)) or "none"
            errors.append(
                f"{rule.source}: notify: unknown notifier "
                f"{', '.join(map(shorten, unknown))} (defined: {have})"
            )
    if errors:
        raise ConfigError("\n".join(errors))
