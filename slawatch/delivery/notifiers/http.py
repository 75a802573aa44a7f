"""What the HTTP notifiers share: one bounded POST, its outcome as a DeliveryError,
and the secrets a target URL and its headers carry.

webhook, slack, teams, pagerduty, opsgenie and alertmanager all POST JSON and read the answer the
same way: a 2xx accepts; a 4xx other than 408/425/429 is permanent; Retry-After
is honoured up to ``retry.max``; the whole exchange, answer body included, is
bounded by the notifier's timeout; error text never shows a secret.
"""

from __future__ import annotations

import base64
import email.utils
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx

from slawatch import __version__
from slawatch.config.notifiers import NotifierBase
from slawatch.delivery.notifiers.base import BaseNotifier, cut, tls_context
from slawatch.errors import DeliveryError

RETRYABLE = {408, 425, 429}
# Of an error answer we keep what fits in an error line; reading more only costs time.
ANSWER_LIMIT = 65536


def public_url(url: str) -> str:
    """``scheme://host:port/…``: a target URL as errors may show it.

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


def endpoint(base: str, path: str) -> str:
    """``{base}{path}``, under the base's own path (a route prefix) and before its query."""
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + path))


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


def _drain(response: httpx.Response, deadline: float) -> None:
    """Read an accepted answer's body, up to ANSWER_LIMIT bytes and ``deadline``; a
    failure here changes nothing (the receiver has accepted), it only costs the
    connection."""
    read = 0
    try:
        for chunk in response.iter_raw():
            read += len(chunk)
            if read > ANSWER_LIMIT or time.monotonic() > deadline:
                return
    except httpx.HTTPError:
        return


class HttpNotifier(BaseNotifier):
    """A notifier that POSTs to an HTTP service; subclasses build the bodies."""

    def __init__(
        self,
        config: NotifierBase,
        ca_file: Path | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(config)
        self._client = httpx.Client(
            timeout=self.timeout,
            verify=tls_context(ca_file),
            headers={"user-agent": f"slawatch/{__version__}", **(headers or {})},
            follow_redirects=False,
        )

    def keep_target_secrets(self, url: str, headers: dict[str, str] | None = None) -> None:
        """Scrub the secrets of a target URL (its password, path and query; the URL
        itself shows as ``scheme://host:port/…``) and every value of ``headers``."""
        # The URL's public form wins over a "***" kept for it as a SecretStr.
        self._secrets[url] = public_url(url)
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
        for value in (headers or {}).values():
            self.keep_secret(value)
            # "Bearer <token>", "Basic <base64>": the token alone is echoed too.
            _, _, token = value.partition(" ")
            if token:
                self.keep_secret(token.strip())

    def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str] | None = None,
        deadline: float | None = None,
    ) -> int:
        """POST ``body`` as JSON; the 2xx status, or a DeliveryError.

        ``deadline`` (``time.monotonic()``) bounds the whole exchange; by default
        the notifier's timeout from now. A notifier that sends several requests
        per batch passes one deadline for all of them: the lease covers one send.
        """
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeliveryError(f"timed out after {self.timeout:g}s (before the request)")
        request_headers = {"content-type": "application/json", **(headers or {})}
        # httpx's timeout bounds each read, not the whole answer: a receiver that sends
        # its body a byte at a time would hold this worker (and outlive the lease).
        try:
            with self._client.stream(
                "POST", url, content=body, headers=request_headers, timeout=remaining
            ) as response:
                status = response.status_code
                if 200 <= status < 300:
                    # Accepted: the body does not matter, but reading it (what fits in
                    # ANSWER_LIMIT, before the deadline) lets the connection go back to
                    # the pool. Left unread, httpx closes it: every batch paid for a new
                    # connection (and the receiver for a new thread or process).
                    _drain(response, deadline)
                    return status
                answer = bytearray()
                for chunk in response.iter_bytes():
                    if time.monotonic() > deadline:
                        raise DeliveryError(
                            f"timed out after {self.timeout:g}s (HTTP {status}, answer too slow)"
                        )
                    answer += chunk[: ANSWER_LIMIT - len(answer)]
                    if len(answer) >= ANSWER_LIMIT:
                        break
                reason = response.reason_phrase
                wait = retry_after(response.headers.get("retry-after"))
        except httpx.TimeoutException as exc:
            raise DeliveryError(
                f"timed out after {self.timeout:g}s ({type(exc).__name__})"
            ) from exc
        except httpx.HTTPError as exc:
            # Where it failed, as scrub() shows the URL: scheme://host:port/…
            raise DeliveryError(self.scrub(f"{type(exc).__name__}: {exc} (POST {url})")) from exc
        # Scrubbed before it is cut: a cut through a secret would keep its head.
        text = self.scrub(answer.decode("utf-8", "replace")).strip().replace("\n", " ")
        text = cut(text, 200)
        message = self.scrub(f"HTTP {status} {reason}: {text}".rstrip(": "))
        permanent = 400 <= status < 500 and status not in RETRYABLE
        raise DeliveryError(
            message,
            permanent=permanent,
            # Honoured up to retry.max: "Retry-After: 99999999999" must not park
            # the alerts for ever (nor overflow a timedelta).
            retry_after=None if wait is None else min(wait, self.retry.max.total_seconds()),
        )

    def post_each(
        self, requests: list[tuple[str, bytes]], ids: list[str], what: str = "request"
    ) -> None:
        """POST each of ``requests`` (url, body) in order, under one deadline for the
        batch (its lease covers one send, not one per request). A failure names the
        request (``what`` ``i`` of ``n``, the alert of ``ids[i]``) when there are
        several: those before it were accepted, and sent again they only repeat (the
        same dedup key or alias), so the batch as a whole is retried or dead."""
        deadline = time.monotonic() + self.timeout
        for i, (url, body) in enumerate(requests, 1):
            try:
                self.post(url, body, deadline=deadline)
            except DeliveryError as exc:
                if len(requests) == 1:
                    raise
                where = f"{what} {i} of {len(requests)}, {cut(ids[i - 1], 120)}"
                raise DeliveryError(
                    f"{exc} [{where}]", permanent=exc.permanent, retry_after=exc.retry_after
                ) from exc

    def close(self) -> None:
        self._client.close()
