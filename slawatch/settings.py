"""Settings from the environment (prefix ``SLAWATCH_``); command-line flags win."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from slawatch.config import shorten
from slawatch.durations import parse_duration

DEFAULT_RETENTION = timedelta(days=30)
# Shorter than an hour would prune what a receiver outage of a lunch break left dead;
# longer than ten years is a typo, and would still be added to "now" in SQL.
MIN_RETENTION, MIN_RETENTION_TEXT = timedelta(hours=1), "1h"
MAX_RETENTION, MAX_RETENTION_TEXT = timedelta(days=3650), "10 years"


def _retention(value: Any) -> timedelta:
    """A duration from 1h to 10 years; the error is the reason alone (no pydantic prefix)."""
    try:
        retention = parse_duration(value, MAX_RETENTION, MAX_RETENTION_TEXT)
    except ValueError as exc:
        raise PydanticCustomError("retention", "{reason}", {"reason": str(exc)}) from None
    if retention < MIN_RETENTION:
        reason = (
            f"{shorten(value)} is shorter than {MIN_RETENTION_TEXT}, the least slawatch accepts"
        )
        raise PydanticCustomError("retention", "{reason}", {"reason": reason})
    return retention


class Settings(BaseSettings):
    """Where the rules, notifiers, database and data live."""

    model_config = SettingsConfigDict(env_prefix="SLAWATCH_", extra="ignore")

    dsn: str | None = None
    rules_dir: Path = Path("rules")
    notifiers_dir: Path = Path("notifiers")
    data_dir: Path = Path(".slawatch")
    log_level: str = "INFO"
    # text, json, or auto: JSON when standard error is not a terminal (slawatch/logs.py).
    log_format: Literal["auto", "text", "json"] = "auto"
    # How long alerts and their deliveries are kept (none with a delivery still pending
    # is removed); `slawatch run` prunes older history every 10 minutes.
    retention: Annotated[timedelta, BeforeValidator(_retention)] = DEFAULT_RETENTION
    # Seconds to wait for a database connection before counting the database as down.
    db_timeout: float = Field(default=30.0, gt=0, le=3600)
    # "transaction": PgBouncer (or another pooler) in transaction mode: no prepared
    # statements, and no LISTEN (deliveries are polled).
    # "none"/"session": direct to PostgreSQL (or a session pooler): prepared statements.
    # "auto" (default): none, since a transaction pooler may sit in between.
    pooler: Literal["auto", "none", "session", "transaction"] = "auto"
