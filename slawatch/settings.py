"""Settings from the environment (prefix ``SLAWATCH_``); command-line flags win."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Where the rules, notifiers, database and data live."""

    model_config = SettingsConfigDict(env_prefix="SLAWATCH_", extra="ignore")

    dsn: str | None = None
    rules_dir: Path = Path("rules")
    notifiers_dir: Path = Path("notifiers")
    data_dir: Path = Path(".slawatch")
    log_level: str = "INFO"
