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


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
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
        self._client = httpx.Client(
            timeout=self.timeout,
            verify=tls_context(config.ca_file),
            headers={"user-agent": f"slawatch/{__version__}", **config.headers},
            follow_redirects=False,
        )

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
            raise DeliveryError(self.scrub(f"{type(exc).__name__}: {exc}")) from exc
        status = response.status_code
        if 200 <= status < 300:
            return
        text = response.text.strip().replace("\n", " ")[:200]
        message = self.scrub(f"HTTP {status} {response.reason_phrase}: {text}".rstrip(": "))
        permanent = 400 <= status < 500 and status not in RETRYABLE
        raise DeliveryError(
            message,
            permanent=permanent,
            retry_after=retry_after(response.headers.get("retry-after")),
        )

    def close(self) -> None:
        self._client.close()
