"""Settings from the environment (prefix ``SLAWATCH_``); command-line flags win."""

from __future__ import annotations

import ipaddress
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from slawatch.config.durations import parse_duration, shorter_than
from slawatch.config.files import describe_validation_error, role_problem, shorten
from slawatch.config.rules import EVENT_TYPE

DEFAULT_RETENTION = timedelta(days=30)
DEFAULT_DEDUPE_WINDOW = timedelta(days=1)
# Shorter than the maintenance's 10 minutes would not be kept to.
MIN_DEDUPE_WINDOW, MIN_DEDUPE_WINDOW_TEXT = timedelta(minutes=10), "10m"
# Shorter than an hour would prune what a receiver outage of a lunch break left dead;
# longer than ten years is a typo, and would still be added to "now" in SQL.
MIN_RETENTION, MIN_RETENTION_TEXT = timedelta(hours=1), "1h"
MAX_RETENTION, MAX_RETENTION_TEXT = timedelta(days=3650), "10 years"
# A host name or an IPv4 address (an IPv6 address is written in brackets).
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
MIN_TOKEN = 16

# SLAWATCH_OUTBOX: the shape of the outbox the claims write (docs/explanation/outbox-rows.md).
Outbox = Literal["alerts", "rows"]
# Rows of up to 100 alerts; "alerts", one alert and one delivery per notifier each.
DEFAULT_OUTBOX: Outbox = "rows"


def _at_least(kind: str, value: Any, least: timedelta, least_text: str, why: str = "") -> timedelta:
    """A duration from ``least`` to 10 years; the error is the reason alone (no pydantic
    prefix)."""
    try:
        got = parse_duration(value, MAX_RETENTION, MAX_RETENTION_TEXT)
    except ValueError as exc:
        raise PydanticCustomError(kind, "{reason}", {"reason": str(exc)}) from None
    if got < least:
        reason = shorter_than(value, least_text, why)
        raise PydanticCustomError(kind, "{reason}", {"reason": reason})
    return got


def _retention(value: Any) -> timedelta:
    return _at_least("retention", value, MIN_RETENTION, MIN_RETENTION_TEXT)


def _dedupe_window(value: Any) -> timedelta:
    return _at_least(
        "dedupe_window",
        value,
        MIN_DEDUPE_WINDOW,
        MIN_DEDUPE_WINDOW_TEXT,
        " (ids are pruned every 10 minutes)",
    )


def parse_bind(text: str) -> tuple[str, int] | None:
    """``host:port`` (``[::1]:8181`` for IPv6) as (host, port); None for ``""`` (off).
    ValueError with a one-line reason otherwise."""
    text = text.strip()
    if not text:
        return None
    problem = (
        f"{shorten(text)} is not host:port (e.g. 127.0.0.1:8181, [::1]:8181; empty turns the "
        "admin API off)"
    )
    host, colon, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(problem) from None
    elif not _HOST.fullmatch(host):
        raise ValueError(problem)
    if not (
        colon and port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536
    ):
        raise ValueError(problem)
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # another name: it may resolve anywhere


def _http(value: Any) -> str | None:
    if value is None:
        return None
    try:
        bind = parse_bind(str(value))
    except ValueError as exc:
        raise PydanticCustomError("http", "{reason}", {"reason": str(exc)}) from None
    return None if bind is None else str(value).strip()


def _public_url(value: Any) -> str | None:
    if value is None or value == "":
        return None
    text = str(value).strip()
    if not re.fullmatch(r"https?://[^/\s?#]+(/[^\s?#]*)?", text) or len(text) > 2000:
        reason = (
            f"{shorten(text)} is not an http:// or https:// URL without query "
            "(e.g. https://slawatch.example.com)"
        )
        raise PydanticCustomError("public_url", "{reason}", {"reason": reason})
    return text.rstrip("/")


def _forwarded(value: Any) -> str | None:
    if value is None or value == "":
        return None
    text = str(value).strip()
    for part in (p.strip() for p in text.split(",")):
        if part == "*":
            continue
        try:
            ipaddress.ip_network(part, strict=False)
        except ValueError:
            reason = (
                f"{shorten(part)} is not an IP address or network (e.g. 10.0.0.5,10.1.0.0/16, "
                "or * for any)"
            )
            raise PydanticCustomError("forwarded", "{reason}", {"reason": reason}) from None
    return text


def _token(value: Any) -> str | None:
    if value is None or value == "":
        return None
    text = str(value)
    if len(text) < MIN_TOKEN or not text.isascii() or not text.isprintable() or " " in text:
        reason = (
            f"must be at least {MIN_TOKEN} printable ASCII characters without spaces "
            "(e.g. the output of 'openssl rand -hex 32')"
        )
        raise PydanticCustomError("token", "{reason}", {"reason": reason})
    return text


def _event_type(value: Any) -> str:
    if not isinstance(value, str) or not EVENT_TYPE.fullmatch(value):
        raise ValueError(f"{shorten(value)} is not an event type")
    return value


class IngestScope(BaseModel):
    """One producer token of ``SLAWATCH_INGEST_TOKENS``: accepted on ``POST /v1/events``
    for events of ``types`` (and, with ``key_prefix``, keys that start with it) only."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    token: Annotated[SecretStr, BeforeValidator(_token)]
    types: list[Annotated[str, BeforeValidator(_event_type)]] = Field(min_length=1)
    key_prefix: str | None = Field(default=None, min_length=1, max_length=200)

    def refuses(self, kind: str, key: str) -> str | None:
        """Why an event of ``kind`` and ``key`` is outside this token's scope (None: inside)."""
        if kind not in self.types:
            return f"{kind!r} is not a type this token may post ({', '.join(self.types)})"
        if self.key_prefix is not None and not key.startswith(self.key_prefix):
            return f"{shorten(key)} does not start with this token's key_prefix {self.key_prefix!r}"
        return None


def _ingest_tokens(value: Any) -> list[IngestScope]:
    """A JSON list of scopes, or the path of a file holding one (a mounted secret)."""
    if value is None or value == "":
        return []
    if isinstance(value, str | bytes):
        text = value.decode() if isinstance(value, bytes) else value
        if not text.lstrip().startswith(("[", "{")):
            try:
                text = Path(text.strip()).read_text()
            except OSError as exc:
                reason = f"not a JSON list, nor a file that can be read ({exc.strerror or exc})"
                raise PydanticCustomError("tokens", "{reason}", {"reason": reason}) from None
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            reason = f"not JSON: {str(exc).splitlines()[0]}"
            raise PydanticCustomError("tokens", "{reason}", {"reason": reason}) from None
    if not isinstance(value, list):
        reason = 'a JSON list: [{"token": "...", "types": ["..."], "key_prefix": "..."}]'
        raise PydanticCustomError("tokens", "{reason}", {"reason": reason})
    scopes = []
    for i, item in enumerate(value):
        try:
            scopes.append(IngestScope.model_validate(item))
        except ValidationError as exc:
            # The token itself is never quoted back: a secret.
            first = describe_validation_error(exc, IngestScope)[0]
            first = "token: " + first.split(": ", 2)[-1] if first.startswith("token:") else first
            reason = f"[{i}].{first}"
            raise PydanticCustomError("tokens", "{reason}", {"reason": reason}) from None
    return scopes


def _action_role(value: Any) -> str | None:
    if value is None or value == "":
        return None
    text = str(value)
    # A role name as in the catalog (set with set_config, so case matters): as a rule's
    # action.role.
    if (reason := role_problem(text)) is not None:
        raise PydanticCustomError("role", "{reason}", {"reason": reason})
    return text


class Settings(BaseSettings):
    """Where the rules, notifiers, database and data live."""

    model_config = SettingsConfigDict(env_prefix="SLAWATCH_", extra="ignore")

    dsn: str | None = None
    rules_dir: Path = Path("rules")
    notifiers_dir: Path = Path("notifiers")
    # Event sources (brokers): a missing default folder means none; one named by
    # SLAWATCH_SOURCES_DIR or --sources must exist.
    sources_dir: Path = Path("sources")
    # Business calendars for rules' `calendar:`: the same (a missing default folder: none).
    calendars_dir: Path = Path("calendars")
    data_dir: Path = Path(".slawatch")
    log_level: str = "INFO"
    # text, json, or auto: JSON when standard error is not a terminal (slawatch/logs.py).
    log_format: Literal["auto", "text", "json"] = "auto"
    # How long alerts and their deliveries are kept (none with a delivery still pending
    # is removed); `slawatch run` prunes older history every 10 minutes.
    retention: Annotated[timedelta, BeforeValidator(_retention)] = DEFAULT_RETENTION
    # How long event ids are kept to drop a repeat of (type, id); `slawatch run` prunes
    # older ones every 10 minutes.
    dedupe_window: Annotated[timedelta, BeforeValidator(_dedupe_window)] = DEFAULT_DEDUPE_WINDOW
    # Seconds to wait for a database connection before counting the database as down.
    db_timeout: float = Field(default=30.0, gt=0, le=3600)
    # "transaction": PgBouncer (or another pooler) in transaction mode: no prepared
    # statements, and no LISTEN (deliveries are polled).
    # "none"/"session": direct to PostgreSQL (or a session pooler): prepared statements.
    # "auto" (default): prepared statements only on a connection proven direct
    # (db.direct), since a transaction pooler may sit in between.
    pooler: Literal["auto", "none", "session", "transaction"] = "auto"
    # Database connections that the scans of every rule share (however many rules),
    # and so the rules scanned at once: a rule whose turn comes while every one is busy
    # (a long claim, a table the application holds locked) waits for the next.
    # `slawatch run` opens at most this + the notifiers' concurrency + the event
    # sources + 2 (the rest's one, and the delivery listener's).
    scan_connections: int = Field(default=2, ge=1, le=100)
    # The admin API's address (slawatch/operate/admin.py); empty: no admin API.
    http: Annotated[str | None, BeforeValidator(_http)] = "127.0.0.1:8181"
    # With a token every admin request but /healthz needs "Authorization: Bearer <token>";
    # without one, writes are refused unless the API listens on loopback only.
    api_token: Annotated[SecretStr | None, BeforeValidator(_token)] = None
    # Accepted on POST /v1/events only: producers post events, and can do nothing else.
    ingest_token: Annotated[SecretStr | None, BeforeValidator(_token)] = None
    # Producer tokens limited to some event types (and a key prefix): a JSON list, or the
    # path of a file holding one (docs/how-to/events.md).
    ingest_tokens: Annotated[list[IngestScope], NoDecode, BeforeValidator(_ingest_tokens)] = []
    # The admin API's address as people reach it (a DNS name, a proxy), for the link in
    # storm summaries; unset: http://<SLAWATCH_HTTP> unless that binds every interface.
    public_url: Annotated[str | None, BeforeValidator(_public_url)] = None
    # Proxies whose X-Forwarded-Proto/-For the admin API believes (uvicorn's
    # forwarded_allow_ips: addresses, networks, or *); unset: FORWARDED_ALLOW_IPS, else
    # 127.0.0.1 and ::1.
    forwarded_allow_ips: Annotated[str | None, BeforeValidator(_forwarded)] = None
    # Rules' actions (docs/how-to/actions.md): "on" runs them; "off" and "dry-run" record and log
    # each as "would run" instead.
    actions: Literal["on", "off", "dry-run"] = "on"
    # The role rules' sql actions run as (SET LOCAL ROLE), unless a rule's action names
    # its own (action.role); unset: the role slawatch connects as
    # (docs/explanation/safety.md).
    action_role: Annotated[str | None, BeforeValidator(_action_role)] = None
    # The outbox's shape: "rows" (default) writes rows of up to 100 alerts and one send
    # per notifier of each row; "alerts" writes an alert and a delivery per notifier for
    # each notification (docs/explanation/outbox-rows.md).
    outbox: Outbox = DEFAULT_OUTBOX

    @field_validator("ingest_token")
    @classmethod
    def _tokens_differ(cls, v: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        api = info.data.get("api_token")
        if v is not None and api is not None and v.get_secret_value() == api.get_secret_value():
            raise PydanticCustomError(
                "token",
                "must differ from SLAWATCH_API_TOKEN (the ingest token may only post events)",
            )
        return v

    @field_validator("ingest_tokens")
    @classmethod
    def _scoped_differ(cls, v: list[IngestScope], info: ValidationInfo) -> list[IngestScope]:
        others = [info.data.get("api_token"), info.data.get("ingest_token")]
        seen = {t.get_secret_value() for t in others if t is not None}
        for i, scope in enumerate(v):
            token = scope.token.get_secret_value()
            if token in seen:
                raise PydanticCustomError(
                    "token",
                    "[{i}].token: must differ from SLAWATCH_API_TOKEN, SLAWATCH_INGEST_TOKEN "
                    "and the other tokens (a token has one scope)",
                    {"i": i},
                )
            seen.add(token)
        return v

    @property
    def admin_url(self) -> str | None:
        """Where the admin API is reached, for links; None when unknown or off."""
        if self.public_url:
            return self.public_url
        bind = parse_bind(self.http or "")
        if bind is None or bind[0] in ("0.0.0.0", "::"):
            return None
        host = f"[{bind[0]}]" if ":" in bind[0] else bind[0]
        return f"http://{host}:{bind[1]}"
