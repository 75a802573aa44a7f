"""Settings from the environment (prefix ``SLAWATCH_``); command-line flags win."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Where the rules, notifiers, database and data live."""

    model_config = SettingsConfigDict(env_prefix="SLAWATCH_", extra="ignore")

    dsn: str | None = None
    rules_dir: Path = Path("rules")
    notifiers_dir: Path = Path("notifiers")
    data_dir: Path = Path(".slawatch")
    log_level: str = "INFO"
    # Seconds to wait for a database connection before counting the database as down.
    db_timeout: float = Field(default=30.0, gt=0, le=3600)
    # "transaction": PgBouncer (or another pooler) in transaction mode: no prepared
    # statements, and no LISTEN (deliveries are polled).
    pooler: Literal["none", "session", "transaction"] = "none"
