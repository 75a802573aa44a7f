"""The webhook notifier: one signed JSON POST per batch (Standard Webhooks).

``webhook-id`` is derived from the batch's alert ids, so a retried batch keeps
its id; each alert also carries its own idempotency ``id``.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx

from slawatch import __version__
from slawatch.errors import DeliveryError
from slawatch.notifiers import WebhookConfig
from slawatch.notifiers.base import BaseNotifier, tls_context

RETRYABLE = {408, 425, 429}


def signing_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret (``whsec_`` + base64)."""
    raw = secret.removeprefix("whsec_")
    return base64.b64decode(raw + "=" * (-len(raw) % 4))


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``."""
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def verify(secret: str, headers: dict[str, str], body: bytes, tolerance: float = 300) -> bool:
    """What a receiver does: recompute the signature and compare in constant time.

    ``headers`` with lower-case names. Rejects timestamps more than ``tolerance``
    seconds away (replays).
    """
    try:
        msg_id, ts = headers["webhook-id"], int(headers["webhook-timestamp"])
        signatures = headers["webhook-signature"].split()
    except (KeyError, ValueError):
        return False
    if abs(time.time() - ts) > tolerance:
        return False
    expected = sign(signing_key(secret), msg_id, ts, body)
    return any(hmac.compare_digest(expected, s) for s in signatures)


def public_url(url: str) -> str:
    """``scheme://host:port/…``: a webhook URL as errors may show it.

    The path and query of a webhook URL are often its secret (Slack's
    ``/services/T…/B…/X…``, ``?token=…``), and so is a password before the host.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}/…"


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


class WebhookNotifier(BaseNotifier):
    """POSTs ``{"alerts": [...]}``; any 2xx accepts the whole batch."""

    def __init__(self, config: WebhookConfig) -> None:
        super().__init__(config)
        self.config = config
        self._key = signing_key(config.secret.get_secret_value()) if config.secret else None
        self._keep_webhook_secrets(config)
        self._client = httpx.Client(
            timeout=self.timeout,
            verify=tls_context(config.ca_file),
            headers={"user-agent": f"slawatch/{__version__}", **config.headers},
            follow_redirects=False,
        )

    def _keep_webhook_secrets(self, config: WebhookConfig) -> None:
        # The URL: its password, path and query. The headers: every value, since
        # they are where receivers want tokens (Authorization: Bearer ...).
        url = config.url
        public = public_url(url)
        self.keep_secret(url, public)
        self.keep_url_secrets(url)
        parts = urlsplit(url)
        if parts.password is not None:
            # httpx sends the userinfo as "Authorization: Basic base64(user:password)".
            userinfo = f"{unquote(parts.username or '')}:{unquote(parts.password)}"
            self.keep_secret(base64.b64encode(userinfo.encode()).decode())
        if parts.path not in ("", "/"):
            self.keep_secret(parts.path, "/…")
        if parts.query:
            self.keep_secret(f"{parts.path}?{parts.query}", "/…")
            self.keep_secret(parts.query, "…")
        # The path and query as httpx sends them (percent-encoded where needed).
        self.keep_secret(httpx.URL(url).raw_path.decode("ascii"), "/…")
        for value in config.headers.values():
            self.keep_secret(value)
            # "Bearer <token>", "Basic <base64>": the token alone is echoed too.
            _, _, token = value.partition(" ")
            if token:
                self.keep_secret(token.strip())

    def send(self, alerts: list[dict[str, Any]]) -> None:
        body = json.dumps({"alerts": alerts}, separators=(",", ":"), default=str).encode()
        ids = ",".join(sorted(a["id"] for a in alerts))
        msg_id = "msg_" + hashlib.sha256(ids.encode()).hexdigest()[:32]
        headers = {"content-type": "application/json", "webhook-id": msg_id}
        if self._key is not None:
            ts = int(time.time())
            headers["webhook-timestamp"] = str(ts)
            headers["webhook-signature"] = sign(self._key, msg_id, ts, body)
        try:
            response = self._client.post(self.config.url, content=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise DeliveryError(
                f"timed out after {self.timeout:g}s ({type(exc).__name__})"
            ) from exc
        except httpx.HTTPError as exc:
            # Where it failed, as scrub() shows the URL: scheme://host:port/…
            where = f"POST {self.config.url}"
            raise DeliveryError(self.scrub(f"{type(exc).__name__}: {exc} ({where})")) from exc
        status = response.status_code
        if 200 <= status < 300:
            return
        # Scrubbed before it is cut: a cut through a secret would keep its head.
        text = self.scrub(response.text[:65536]).strip().replace("\n", " ")
        text = text if len(text) <= 200 else text[:199] + "…"
        message = self.scrub(f"HTTP {status} {response.reason_phrase}: {text}".rstrip(": "))
        permanent = 400 <= status < 500 and status not in RETRYABLE
        wait = retry_after(response.headers.get("retry-after"))
        raise DeliveryError(
            message,
            permanent=permanent,
            # Honoured up to retry.max: "Retry-After: 99999999999" must not park
            # the alerts for ever (nor overflow a timedelta).
            retry_after=None if wait is None else min(wait, self.retry.max.total_seconds()),
        )

    def close(self) -> None:
        self._client.close()
