"""Notifier configuration: ``notifiers/<name>.yaml`` validated into models.

Each file is validated into one of the config models below (chosen by
``type``); :func:`slawatch.delivery.notifiers.build` turns a config into a
sender.

``${VAR}`` in any string value is replaced by the environment variable VAR
before validation; secrets (webhook ``secret``, SMTP ``password``, broker, Slack and
Teams URLs, PagerDuty ``routing_key``, Opsgenie ``api_key``) are kept as ``SecretStr``
and never printed.

Every number and duration is bounded (``timeout`` at most 1 hour, ``retry``
intervals at most 30 days): a value that passes ``check`` must also work when
an alert is sent, months later.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import string
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast
from urllib.parse import unquote, urlsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    FilePath,
    SecretStr,
    field_validator,
    model_validator,
)

from slawatch.config.durations import duration_validator
from slawatch.config.extras import require_extra
from slawatch.config.files import FileModel, load_dir, shorten
from slawatch.errors import ConfigError

if TYPE_CHECKING:
    import ssl

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
TEMPLATE_FIELDS = {"rule", "severity", "key", "n"}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# RFC 9110 field names (tokens) and values (visible ASCII, spaces and tabs).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,256}")
_HEADER_VALUE = re.compile(r"[\x20-\x7e\t]{0,8192}")

# One send may take at most this long: the delivery's lease is twice it, and a
# longer wait only delays noticing a dead receiver.
Timeout = Annotated[
    timedelta, duration_validator(positive=True, limit=timedelta(hours=1), limit_text="1 hour")
]
# A retry interval: a month between attempts is already longer than any page is useful.
RetryInterval = Annotated[
    timedelta, duration_validator(positive=True, limit=timedelta(days=30), limit_text="30 days")
]


class RetrySettings(FileModel):
    """Capped doubling backoff between attempts: ``min(first * 2^(attempt-1), max)``."""

    first: RetryInterval = timedelta(seconds=1)
    max: RetryInterval = timedelta(minutes=10)
    attempts: int = Field(default=12, ge=1, le=1000)

    def delay(self, attempt: int) -> timedelta:
        """The wait after failed attempt number ``attempt`` (1-based), before jitter."""
        # In seconds first: 30 days * 2^30 is more than a timedelta can hold.
        seconds = self.first.total_seconds() * 2.0 ** min(max(attempt - 1, 0), 60)
        return min(timedelta(seconds=min(seconds, self.max.total_seconds())), self.max)


# Storms (slawatch/delivery/storm.py): how long a new summary waits for the rest of its storm.
StormWait = Annotated[
    timedelta, duration_validator(positive=False, limit=timedelta(minutes=10), limit_text="10m")
]


class StormSettings(FileModel):
    """More than ``threshold`` alerts of one rule due at once for this notifier are sent
    as one summary listing the first ``listed``; the summary waits ``wait`` before it is
    sent, and what of the storm comes due meanwhile is folded into it."""

    threshold: int = Field(ge=1, le=1_000_000)
    # The summary carries these alerts whole: kept small (a Slack message shows fewer).
    listed: int = Field(default=20, ge=0, le=100)
    wait: StormWait = timedelta(seconds=10)


def _storm(value: Any) -> Any:
    # `storm: 100` is short for `storm: {threshold: 100}`; YAML's `true` is an int to
    # Python and would pass as a threshold of 1.
    if value is None or isinstance(value, dict | StormSettings):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return {"threshold": value}
    raise ValueError(
        f"{shorten(value)} is neither a threshold (storm: 100) nor a mapping "
        "(storm: {threshold: 100, listed: 20, wait: 10s})"
    )


class CaFileError(ConfigError):
    """A ``ca_file`` that holds no certificate or cannot be read."""

    def __init__(self, ca_file: Path, problem: str) -> None:
        super().__init__(f"ca_file {shorten(str(ca_file), 500)}: {problem}")
        self.problem = problem


def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """Certificate-verifying TLS, trusting the PEM bundle ``ca_file`` instead of the
    system's CAs if given; :class:`CaFileError` (one line, exit 2) when that file holds
    no certificate or cannot be read."""
    import ssl  # here: `slawatch event` from cron loads no TLS

    if ca_file is None:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except ssl.SSLError as exc:
        problem = f"not a PEM file of CA certificates ({exc.reason or type(exc).__name__})"
        raise CaFileError(ca_file, problem) from exc
    except OSError as exc:
        raise CaFileError(ca_file, f"cannot be read ({exc.strerror or exc})") from exc


def _ca_file(value: Path | None) -> Path | None:
    # Loaded now: a file that is not a certificate bundle would otherwise pass check,
    # then stop run at its start (or fail every send).
    if value is not None:
        try:
            tls_context(value)
        except CaFileError as exc:
            raise ValueError(exc.problem) from None
    return value


# A PEM bundle to trust for TLS instead of the system's CAs.
CaFile = Annotated[FilePath | None, AfterValidator(_ca_file)]


class NotifierBase(FileModel):
    """The settings every notifier type has."""

    name: str = Field(pattern=NAME_PATTERN)
    batch: int = Field(default=100, ge=1, le=10_000)
    # Batches in flight at once, each under its own lease: a receiver's round
    # trip and the database's commits overlap. Each is a worker thread and, while
    # it claims or settles, a database connection: kept small.
    concurrency: int = Field(default=4, ge=1, le=16)
    timeout: Timeout = timedelta(seconds=10)
    retry: RetrySettings = RetrySettings()
    # Off unless set: a consumer of a queue or webhook may want every alert.
    storm: Annotated[StormSettings | None, BeforeValidator(_storm)] = None

    def http_target(self) -> tuple[str, str] | None:
        """The field and URL an HTTP notifier posts to; None for the others."""
        return None


def _template(value: Any) -> Any:
    if not isinstance(value, str):
        return value  # pydantic's str check words the error
    placeholders = ", ".join("{" + f + "}" for f in sorted(TEMPLATE_FIELDS))
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(value) if f is not None}
    except ValueError as exc:  # a lone { or }
        raise ValueError(f"{exc} (placeholders are {placeholders}; write {{{{ for a {{)") from exc
    unknown = fields - TEMPLATE_FIELDS
    if unknown:
        raise ValueError(
            f"unknown placeholder {{{shorten(sorted(unknown)[0])[1:-1]}}} (use {placeholders})"
        )
    # A conversion or format spec ({rule!z}, {rule:d}) fails only when rendered:
    # render once now, or every send would fail later.
    try:
        value.format(rule="r", severity="warning", key="1", n=1)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise ValueError(f"cannot be filled in: {shorten(str(exc))[1:-1]}") from exc
    return value


Template = Annotated[str, BeforeValidator(_template)]


class ConsoleConfig(NotifierBase):
    """Prints one line per alert on standard output (for the demo and debugging)."""

    type: Literal["console"]


class _HttpTarget(NotifierBase):
    """A service reached at ``url``, with optional extra headers and a private CA."""

    url: str
    headers: dict[str, str] = Field(default_factory=dict)

    def http_target(self) -> tuple[str, str] | None:
        return "url", self.url

    ca_file: CaFile = None  # PEM bundle to trust for https (default: the system's)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        # Webhook URLs often carry a secret (user:password@, a secret path, ?token=):
        # errors show only what comes before the path, never the value itself.
        if not re.match(r"^https?://[^/\s]+", v):
            shown = shorten(v) if "@" not in v and "?" not in v else "the value"
            raise ValueError(f"{shown} is not an http:// or https:// URL")
        import httpx  # here: `slawatch event` from cron loads no HTTP client

        try:
            _check_host(httpx.URL(v).raw_host)
            urlsplit(v).port  # noqa: B018 - raises ValueError on a bad port
        except (httpx.InvalidURL, ValueError) as exc:
            raise ValueError(f"not a valid URL: {_url_problem(exc)}") from exc
        return v

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        # Checked now: a bad header only fails when a request is made, every time.
        for name, value in v.items():
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"{shorten(name)} is not an HTTP header name")
            if not _HEADER_VALUE.fullmatch(value):
                # The value is often a secret (Authorization): never quote it.
                raise ValueError(
                    f"{name}: the value must be printable ASCII on one line, "
                    "at most 8192 characters"
                )
        return v


class WebhookConfig(_HttpTarget):
    """``POST {"alerts": [...]}`` as JSON, signed per Standard Webhooks when a secret is set."""

    type: Literal["webhook"]
    secret: SecretStr | None = None

    @field_validator("secret")
    @classmethod
    def _secret(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            raw = v.get_secret_value().removeprefix("whsec_")
            try:
                key = base64.b64decode(raw + "==", validate=False)
                base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
            except (binascii.Error, ValueError):
                key = b""
            if not key:
                raise ValueError(
                    "must be a Standard Webhooks secret: 'whsec_' and base64 "
                    '(make one: python3 -c "import base64,os; '
                    "print('whsec_' + base64.b64encode(os.urandom(24)).decode())\")"
                )
        return v


# RFC 5321's bounds on an address (:func:`_mail_address`).
MAX_ADDRESS, MAX_LOCAL_PART = 254, 64


def _mail_address(value: str) -> str:
    # Checked now: a bad address fails only at send time, every batch, as the
    # server's refusal (or a Python error before it is even sent).
    from email.errors import HeaderParseError
    from email.headerregistry import HeaderRegistry

    form = "name@example.com or Name <name@example.com>"
    try:
        header: Any = HeaderRegistry()("to", value)  # an AddressHeader
        addresses, defects = header.addresses, header.defects
    except (HeaderParseError, IndexError, ValueError):  # the parser's own stumbles
        addresses, defects = (), ()
    if len(addresses) > 1:
        raise ValueError(f"{shorten(value)} is more than one address: give each as its own")
    if defects or len(addresses) != 1 or not addresses[0].username or not addresses[0].domain:
        if addresses and addresses[0].username and not addresses[0].domain:
            why = " (no @domain)"
        else:
            why = f" ({str(defects[0]).rstrip(')')})" if defects else ""
        raise ValueError(f"{shorten(value)} is not an e-mail address{why}: write {form}")
    # RFC 5321 (4.5.3.1): a path is at most 256 octets with its angle brackets, so 254
    # for the address, and a local part at most 64: a longer one would be refused by
    # the server at send time, every batch. Counted in bytes as sent (UTF-8).
    spec = addresses[0].addr_spec
    local = spec[: spec.rindex("@")]
    if len(local.encode()) > MAX_LOCAL_PART:
        raise ValueError(
            f"{shorten(value)}: the part before @ is {len(local.encode())} bytes, over the"
            f" {MAX_LOCAL_PART} an e-mail address may have (RFC 5321)"
        )
    if len(spec.encode()) > MAX_ADDRESS:
        raise ValueError(
            f"{shorten(value)}: the address is {len(spec.encode())} bytes, over the"
            f" {MAX_ADDRESS} an e-mail address may have (RFC 5321)"
        )
    return value


MailAddress = Annotated[str, AfterValidator(_mail_address)]


class EmailConfig(NotifierBase):
    """One digest e-mail per batch (plain text + HTML), over SMTP."""

    type: Literal["email"]
    host: str
    port: int | None = Field(default=None, ge=1, le=65535)
    security: Literal["starttls", "tls", "none"] = "starttls"
    username: str | None = None
    password: SecretStr | None = None
    from_: MailAddress = Field(alias="from")
    to: list[MailAddress] = Field(min_length=1)
    subject_prefix: str = "[slawatch]"
    ca_file: CaFile = None  # PEM bundle to trust for TLS (default: the system's)

    @model_validator(mode="after")
    def _auth_pair(self) -> EmailConfig:
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")
        return self

    @property
    def effective_port(self) -> int:
        return self.port or {"starttls": 587, "tls": 465, "none": 25}[self.security]


def _check_host(host: bytes) -> None:
    """Refuse a DNS name that no resolver takes (a label over 63 characters or empty, or
    over 253 in all): every send to it would fail, as a transient error, retried for
    ever. One trailing dot (a fully qualified name) is a name."""
    if b":" in host:  # an IPv6 address
        return
    labels = host.removesuffix(b".").split(b".")
    # No colon, no quote in the messages: _url_problem keeps the text up to the first.
    if len(host) > 253 or any(len(label) > 63 for label in labels):
        raise ValueError("its host name has a part over 63 characters, or is over 253 in all")
    if host and not all(labels):
        raise ValueError("its host name has an empty part (two dots in a row, or a leading dot)")


def _url_problem(exc: Exception) -> str:
    """What is wrong with a URL, without quoting it: its parsers quote the bad part,
    which for a password with an unencoded '/', '?' or '#' is the password itself."""
    text = str(exc)
    if "Port" in text or "port" in text:
        return (
            "the port is not a number from 0 to 65535 (a password or path with '/', '?', "
            "'#' or '@' must be percent-encoded: %2F, %3F, %23, %40)"
        )
    return text.split(":", 1)[0].split("'", 1)[0].strip() or type(exc).__name__


def broker_url(schemes: tuple[str, ...], parse: Callable[[str], object] | None = None) -> Any:
    """A validator for a broker URL kept as a secret: the scheme and port are checked
    now, with errors that never quote the URL."""

    def validate(v: Any) -> Any:
        raw = v.get_secret_value() if isinstance(v, SecretStr) else v
        if not isinstance(raw, str):
            return v  # pydantic words the type error
        scheme = raw.split("://", 1)[0].lower() if "://" in raw else ""
        if scheme not in schemes:
            raise ValueError(f"must start with {' or '.join(s + '://' for s in schemes)}")
        try:
            urlsplit(raw).port  # noqa: B018 - raises ValueError on a bad port
            if parse is not None:
                parse(raw)
        except ValueError as exc:
            raise ValueError(f"not a valid URL: {_url_problem(exc)}") from exc
        return v

    return BeforeValidator(validate)


def redis_parse(url: str) -> object:
    import redis.connection

    return redis.connection.parse_url(url)  # type: ignore[no-untyped-call]


def amqp_parse(url: str) -> object:
    import pika

    return pika.URLParameters(url)


class AmqpConfig(NotifierBase):
    """RabbitMQ: one persistent message per alert, confirmed by the broker."""

    type: Literal["amqp"]
    url: Annotated[SecretStr, broker_url(("amqp", "amqps"), amqp_parse)] = SecretStr(
        "amqp://guest:guest@127.0.0.1:5672/%2F"
    )
    exchange: str = "slawatch"
    exchange_type: Literal["topic", "direct", "fanout", "headers"] = "topic"
    routing_key: Template = "{rule}.{severity}"
    declare: bool = True  # declare the exchange (durable) if it does not exist


class RedisConfig(NotifierBase):
    """Redis Streams: one XADD per alert, trimmed to about ``maxlen`` entries."""

    type: Literal["redis"]
    url: Annotated[SecretStr, broker_url(("redis", "rediss", "unix"), redis_parse)] = SecretStr(
        "redis://127.0.0.1:6379/0"
    )
    stream: Template = "slawatch:alerts"
    maxlen: int = Field(default=100_000, ge=1, le=1_000_000_000)


class NatsConfig(NotifierBase):
    """NATS JetStream: one publish per alert with ``Nats-Msg-Id`` = the alert id."""

    type: Literal["nats"]
    url: Annotated[SecretStr, broker_url(("nats", "tls", "ws", "wss"))] = SecretStr(
        "nats://127.0.0.1:4222"
    )
    subject: Template = "slawatch.{rule}.{severity}"
    stream: str | None = None  # created (subjects: the subject's prefix + ".>") if missing


_KAFKA_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})")
KAFKA_SCHEMES = ("kafka", "kafkas")


def kafka_url(value: Any) -> Any:
    """A Kafka URL: ``kafka://`` (plaintext) or ``kafkas://`` (TLS), then the bootstrap
    brokers as ``host:port`` joined by commas; ``user:password@`` before them signs in
    with SASL. Checked without ever quoting it (it may hold a password)."""
    raw = value.get_secret_value() if isinstance(value, SecretStr) else value
    if not isinstance(raw, str):
        return value
    scheme, _, rest = raw.partition("://")
    if scheme.lower() not in KAFKA_SCHEMES or not rest:
        raise ValueError("must start with kafka:// or kafkas://")
    hosts = rest.rpartition("@")[2].rstrip("/")
    for host in hosts.split(","):
        m = _KAFKA_HOST.fullmatch(host)
        if m is None or not 0 < int(m.group(2)) < 65536:
            raise ValueError(
                "not a valid URL: the brokers are host:port joined by commas (a password"
                " with '/', '@' or ',' must be percent-encoded)"
            )
    return value


def kafka_client(url: str, mechanism: str) -> dict[str, str]:
    """librdkafka's settings for a URL checked by :func:`kafka_url`."""
    scheme, _, rest = url.partition("://")
    auth, _, hosts = rest.rpartition("@")
    tls = scheme.lower() == "kafkas"
    conf = {"bootstrap.servers": hosts.rstrip("/")}
    if auth:
        user, _, password = auth.partition(":")
        conf.update(
            {
                "security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
                "sasl.mechanism": mechanism,
                "sasl.username": unquote(user),
                "sasl.password": unquote(password),
            }
        )
    else:
        conf["security.protocol"] = "SSL" if tls else "PLAINTEXT"
    return conf


KafkaUrl = Annotated[SecretStr, BeforeValidator(kafka_url)]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
_TOPIC = re.compile(r"(?!\.\.?$)[A-Za-z0-9._-]{1,249}")  # Kafka refuses "." and ".."


def _topic(value: Any) -> Any:
    if isinstance(value, str) and not _TOPIC.fullmatch(value.replace("{", "").replace("}", "")):
        raise ValueError(f"{shorten(value)} is not a topic (letters, digits, . _ -; not . or ..)")
    return value


class KafkaConfig(NotifierBase):
    """Kafka: one message per alert from an idempotent producer, acknowledged by all
    in-sync replicas; the key is the episode, so one partition keeps its order."""

    type: Literal["kafka"]
    url: KafkaUrl = SecretStr("kafka://127.0.0.1:9092")
    sasl_mechanism: SaslMechanism = "PLAIN"
    topic: Annotated[Template, BeforeValidator(_topic)] = "slawatch.alerts"


def _http_parse(url: str) -> object:
    if not urlsplit(url).hostname:
        raise ValueError("no host")
    if re.search(r"\s", url):
        # httpx would encode it and every send would fail.
        raise ValueError("a space in the URL (percent-encode it as %20)")
    import httpx

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(str(exc)) from exc
    _check_host(parsed.raw_host)
    return parsed


class SlackConfig(NotifierBase):
    """Slack incoming webhook: one Block Kit message per batch."""

    type: Literal["slack"]
    # The hook URL is the credential (https://hooks.slack.com/services/T…/B…/<token>).
    url: Annotated[SecretStr, broker_url(("https", "http"), _http_parse)]
    batch: int = Field(default=20, ge=1, le=10_000)
    # Alerts shown in one message, each a section block; the rest of the batch is
    # counted in a last line. Slack takes at most 50 blocks per message.
    listed: int = Field(default=10, ge=1, le=45)
    ca_file: CaFile = None

    def http_target(self) -> tuple[str, str] | None:
        return "url", self.url.get_secret_value()


class PagerDutyConfig(NotifierBase):
    """PagerDuty Events API v2: one event per alert, an incident per episode."""

    type: Literal["pagerduty"]
    routing_key: SecretStr
    base_url: str = "https://events.pagerduty.com"
    # payload.source, "the unique location of the affected system" (``source`` is
    # every config's file name, hence the alias).
    source_: str = Field(default="slawatch", alias="source", min_length=1, max_length=255)
    # PagerDuty takes about 120 events a minute per routing key: small batches.
    batch: int = Field(default=20, ge=1, le=10_000)
    ca_file: CaFile = None

    @field_validator("routing_key")
    @classmethod
    def _routing_key(cls, v: SecretStr) -> SecretStr:
        # Checked now (PagerDuty refuses any other with a 400, every time); never quoted.
        if not re.fullmatch(r"[A-Za-z0-9]{32}", v.get_secret_value()):
            raise ValueError(
                "must be the 32-character integration key of an Events API v2 integration"
            )
        return v

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, v: str) -> str:
        return _base_only(_plain_url(v), "/v2/enqueue")

    def http_target(self) -> tuple[str, str] | None:
        return "base_url", self.base_url


class TeamsConfig(NotifierBase):
    """Microsoft Teams (a Workflows webhook or a channel's incoming webhook): one
    Adaptive Card per batch."""

    type: Literal["teams"]
    # The Workflows URL's ``sig`` (or the incoming webhook's path) is the credential.
    url: Annotated[SecretStr, broker_url(("https", "http"), _http_parse)]
    batch: int = Field(default=20, ge=1, le=10_000)
    # Alerts shown in one card; the rest of the batch is counted in a last line.
    # Teams refuses a message over about 28 KB: each alert is cut to fit 10.
    listed: int = Field(default=10, ge=1, le=10)
    ca_file: CaFile = None

    def http_target(self) -> tuple[str, str] | None:
        return "url", self.url.get_secret_value()


# slawatch's severities as Opsgenie priorities (P1 the highest, P3 its default).
_SEVERITY = Literal["critical", "warning", "info"]
_PRIORITY = Literal["P1", "P2", "P3", "P4", "P5"]
OPSGENIE_PRIORITIES: dict[_SEVERITY, _PRIORITY] = {"critical": "P1", "warning": "P3", "info": "P5"}


class OpsgenieConfig(NotifierBase):
    """Opsgenie Alert API v2: an alert per episode (``alias``), closed by its resolved notice."""

    type: Literal["opsgenie"]
    api_key: SecretStr  # an API integration's key, sent as ``Authorization: GenieKey …``
    url: str = "https://api.opsgenie.com"  # https://api.eu.opsgenie.com for the EU instance
    # ``source`` is every config's file name, hence the alias; Opsgenie keeps 100 characters.
    source_: str = Field(default="slawatch", alias="source", min_length=1, max_length=100)
    # Opsgenie keeps 20 tags: slawatch adds "slawatch", the rule, the severity, "storm".
    tags: list[Annotated[str, Field(min_length=1, max_length=50)]] = Field(
        default_factory=list, max_length=16
    )
    priorities: dict[_SEVERITY, _PRIORITY] = Field(
        default_factory=lambda: dict(OPSGENIE_PRIORITIES)
    )
    # Opsgenie's API takes a few requests a second per integration: small batches.
    batch: int = Field(default=20, ge=1, le=10_000)
    ca_file: CaFile = None

    def http_target(self) -> tuple[str, str] | None:
        return "url", self.url

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, v: SecretStr) -> SecretStr:
        # Never quoted: an API key is a UUID-like token of printable ASCII.
        if not re.fullmatch(r"[A-Za-z0-9-]{8,128}", v.get_secret_value()):
            raise ValueError("must be the API key of an Opsgenie API integration")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _base_only(_plain_url(v), "/v2/alerts")

    @field_validator("priorities", mode="after")
    @classmethod
    def _priorities(cls, v: dict[_SEVERITY, _PRIORITY]) -> dict[_SEVERITY, _PRIORITY]:
        # A partial mapping keeps the defaults for the severities it leaves out.
        return {**OPSGENIE_PRIORITIES, **v}


# Alertmanager's own labels: slawatch sets them, so a configured label may not.
ALERTMANAGER_LABELS = ("alertname", "rule", "key", "episode", "severity", "storm")
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


class AlertmanagerConfig(_HttpTarget):
    """Alertmanager (or a compatible receiver): ``POST {url}/api/v2/alerts``."""

    type: Literal["alertmanager"]
    # How long a firing notice keeps its alert active in Alertmanager: clients are
    # expected to re-send active alerts, slawatch sends one notice per notification.
    firing_for: Annotated[
        timedelta,
        duration_validator(positive=True, limit=timedelta(days=30), limit_text="30 days"),
    ] = timedelta(hours=24)
    labels: dict[str, str] = Field(default_factory=dict)  # added to every alert
    generator_url: Template | None = None  # a link back, e.g. to slawatch's page

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not _LABEL_NAME.fullmatch(name):
                raise ValueError(
                    f"{shorten(name)} is not a label name (letters, digits and _, "
                    "not starting with a digit)"
                )
            if name in ALERTMANAGER_LABELS:
                raise ValueError(f"{name} is set by slawatch ({', '.join(ALERTMANAGER_LABELS)})")
            if not value or len(value) > 1024:
                # Alertmanager drops a label with an empty value.
                raise ValueError(f"{name}: the value must be 1 to 1024 characters")
        return v

    @field_validator("generator_url")
    @classmethod
    def _generator_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"{shorten(v)} is not an http:// or https:// URL")
        return v


def _base_only(v: str, path: str) -> str:
    """``v``, a service's base URL, unless it already ends with the API's ``path``, which
    slawatch adds: the endpoint copied from the service's docs would be posted to at
    ``…/v2/alerts/v2/alerts`` and every alert end dead."""
    if urlsplit(v).path.rstrip("/").endswith(path):
        raise ValueError(
            f"{shorten(v)} ends with {path}, which slawatch adds: give the base URL"
            f" (without {path})"
        )
    return v


def _plain_url(v: str) -> str:
    """An http(s) URL that is no secret (a service's base URL)."""
    if not re.match(r"^https?://[^/\s]+", v):
        raise ValueError(f"{shorten(v)} is not an http:// or https:// URL")
    try:
        _http_parse(v)
        urlsplit(v).port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"not a valid URL: {_url_problem(exc)}") from exc
    return v


NotifierConfig = (
    ConsoleConfig
    | WebhookConfig
    | EmailConfig
    | AmqpConfig
    | RedisConfig
    | NatsConfig
    | KafkaConfig
    | SlackConfig
    | PagerDutyConfig
    | AlertmanagerConfig
    | TeamsConfig
    | OpsgenieConfig
)
BY_TYPE: dict[str, type[FileModel]] = {
    "console": ConsoleConfig,
    "webhook": WebhookConfig,
    "email": EmailConfig,
    "amqp": AmqpConfig,
    "redis": RedisConfig,
    "nats": NatsConfig,
    "kafka": KafkaConfig,
    "slack": SlackConfig,
    "pagerduty": PagerDutyConfig,
    "alertmanager": AlertmanagerConfig,
    "teams": TeamsConfig,
    "opsgenie": OpsgenieConfig,
}


def interpolate(
    value: Any, path: Path, field: str = "", _seen: dict[int, Any] | None = None
) -> Any:
    """Replace ``${VAR}`` in every string with the environment's value."""
    # YAML aliases make one object appear many times (exponentially, in an alias
    # bomb): each container is interpolated once and shared again.
    seen: dict[int, Any] = {} if _seen is None else _seen
    if isinstance(value, str):

        def lookup(m: re.Match[str]) -> str:
            var = m.group(1)
            if var not in os.environ:
                where = field if len(field) <= 80 else shorten(field)
                name = var if len(var) <= 80 else shorten(var)
                raise ConfigError(
                    f"{path}: {where or 'value'}: environment variable {name} is not set"
                )
            return os.environ[var]

        return _VAR.sub(lookup, value)
    if isinstance(value, dict | list) and id(value) in seen:
        return seen[id(value)]
    if isinstance(value, dict):
        out: Any = seen.setdefault(id(value), {})
        for k, v in value.items():
            out[k] = interpolate(v, path, f"{field}.{k}" if field else str(k), seen)
        return out
    if isinstance(value, list):
        out = seen.setdefault(id(value), [])
        out.extend(interpolate(v, path, f"{field}.{i}", seen) for i, v in enumerate(value))
        return out
    return value


def load_notifiers(directory: Path) -> list[NotifierConfig]:
    """Load ``directory/*.yaml``; a missing folder means no notifiers."""
    if not directory.exists():
        return []
    configs = load_dir(directory, _model_for, "notifiers", prepare=interpolate)
    return cast(list[NotifierConfig], configs)


def _model_for(data: dict[str, Any], path: Path) -> type[FileModel]:
    """The config model for a file, by its ``type``; errors then name that model's fields."""
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in BY_TYPE:
        known = ", ".join(BY_TYPE)
        got = "is required" if kind is None else f"{shorten(kind)} is not a notifier type"
        raise ConfigError(f"{path}: type: {got} (one of {known})")
    require_extra(kind, path)
    return BY_TYPE[kind]
