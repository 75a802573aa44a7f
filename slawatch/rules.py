"""Rules as operators write them (``rules/<name>.yaml``), validated into models.

A rule watches one table: a row is *due* when ``deadline + after < now`` while
``open_when`` holds, and is notified again on the ``renotify`` schedule until
``renotify.max`` notifications were sent or the row completes.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BeforeValidator, Field, field_validator, model_validator

from slawatch.config import FileModel, load_dir
from slawatch.durations import Duration, PositiveDuration
from slawatch.errors import ConfigError

RULE_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
# An identifier exactly as it is in the catalog (quoted in SQL, so case matters).
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")

Severity = Literal["info", "warning", "critical"]


def _ident(value: str) -> str:
    if not isinstance(value, str) or not IDENT.fullmatch(value):
        raise ValueError(f"{value!r} is not a column name (letters, digits, _ and $)")
    return value


Ident = Annotated[str, BeforeValidator(_ident)]


class Backoff(FileModel):
    """Doubling intervals: ``first``, ``2*first``, ``4*first`` ... capped at ``max``."""

    first: PositiveDuration
    max: PositiveDuration

    @model_validator(mode="after")
    def _max_not_below_first(self) -> Backoff:
        if self.max < self.first:
            raise ValueError("backoff.max must not be shorter than backoff.first")
        return self


class Renotify(FileModel):
    """When to notify again while a row stays overdue."""

    every: PositiveDuration | None = None
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
        seconds = self.backoff.first.total_seconds() * 2 ** min(n - 1, 60)
        return min(timedelta(seconds=seconds), self.backoff.max)


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


class Rule(FileModel):
    """One rule file."""

    name: str
    description: str = ""
    table: str
    key: Ident
    deadline: Ident
    after: Duration = timedelta(0)
    open_when: str
    every: PositiveDuration = timedelta(seconds=30)
    batch: int = Field(default=10_000, ge=1, le=1_000_000)
    renotify: Renotify | None = None
    severity: Severity = "warning"
    columns: list[Ident] | None = None
    notify: list[str] = Field(min_length=1)
    escalate: list[Tier] = Field(default_factory=list)
    # The zone that values of a `timestamp` (without time zone) deadline are in.
    timezone: str = "UTC"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not RULE_NAME.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a rule name: lower-case letters, digits and _, "
                "starting with a letter, at most 40 characters"
            )
        return v

    @field_validator("table")
    @classmethod
    def _table(cls, v: str) -> str:
        parts = v.split(".")
        if len(parts) > 2 or not all(IDENT.fullmatch(p) for p in parts):
            raise ValueError(f"{v!r} is not a table name (table or schema.table)")
        return v

    @field_validator("open_when")
    @classmethod
    def _open_when(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("must be an SQL condition, e.g. status = 'paid'")
        # One expression only. PostgreSQL parses it at check/migrate time; these
        # cheap checks just give a clearer error for the common mistakes.
        if ";" in _strip_literals(v):
            raise ValueError("must be one SQL condition, without ';'")
        if "--" in _strip_literals(v) or "/*" in _strip_literals(v):
            raise ValueError("must not contain SQL comments")
        return v

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"{v!r} is not a time zone (try UTC or Europe/Berlin)") from exc
        return v

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
    def schema_name(self) -> str:
        return self.table.split(".")[0] if "." in self.table else "public"

    @property
    def table_name(self) -> str:
        return self.table.split(".")[-1]

    @property
    def alert_columns(self) -> list[str]:
        """Columns copied into each alert's ``row``."""
        if self.columns is not None:
            return list(self.columns)
        return [self.key] if self.key == self.deadline else [self.key, self.deadline]

    @property
    def max_notifications(self) -> int | None:
        """Cap on notifications per row; None means no cap."""
        return 1 if self.renotify is None else self.renotify.max

    @property
    def n_column(self) -> str:
        return f"sw_{self.name}_n"

    @property
    def next_column(self) -> str:
        return f"sw_{self.name}_next"

    @property
    def first_index(self) -> str:
        return f"sw_{self.name}_first"

    @property
    def again_index(self) -> str:
        return f"sw_{self.name}_again"

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


def _strip_literals(text: str) -> str:
    """The text with quoted literals and identifiers removed."""
    return re.sub(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"", "''", text)


def load_rules(directory: Path) -> list[Rule]:
    """Load ``directory/*.yaml``; at least one rule."""
    rules = load_dir(directory, lambda _data, _path: Rule, "rules")
    if not rules:
        raise ConfigError(f"{directory}: no rules (*.yaml) found")
    return rules


def check_notifier_names(rules: list[Rule], known: set[str]) -> None:
    """Every notifier a rule names must be defined."""
    errors = []
    for rule in rules:
        unknown = sorted(rule.all_notifiers() - known)
        if unknown:
            have = ", ".join(sorted(known)) or "none"
            errors.append(
                f"{rule.source}: notify: unknown notifier "
                f"{', '.join(map(repr, unknown))} (defined: {have})"
            )
    if errors:
        raise ConfigError("\n".join(errors))
