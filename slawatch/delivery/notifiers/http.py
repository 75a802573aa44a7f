"""What the HTTP notifiers share: one bounded POST, its outcome as a DeliveryError,
and the secrets a target URL and its headers carry.

webhook, slack, teams, pagerduty, opsgenie and alertmanager all POST JSON and read the answer the
same way: a 2xx accepts; a 4xx other than 408/425/429 is permanent; Retry-After
is honoured up to ``retry.max``; the whole exchange, answer body included, is
bounded by the notifier's timeout; error text never shows a secret.

A POST goes straight to a kept-alive socket (wire.py: the request's head and body in one
write, the answer parsed from the bytes read; a fifth of httpcore's pool's CPU per POST,
docs/performance.md, "The lean outbox: the delivery side measured"), sending what the
Client would send (its default headers, Host, the URL's credentials as Basic auth, the
path as httpx encodes it); a URL that a proxy from the environment applies to
(HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY) goes through the httpx Client, which
handles it. Neither follows a redirect.
"""

from __future__ import annotations

import base64
import email.utils
import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpcore
import httpx

from slawatch import __version__
from slawatch.config.notifiers import NotifierBase
from slawatch.delivery.notifiers.base import BaseNotifier, cut, tls_context
from slawatch.delivery.notifiers.wire import Wire
from slawatch.errors import DeliveryError

RETRYABLE = {408, 425, 429}
# Of an error answer we keep what fits in an error line; reading more only costs time.
ANSWER_LIMIT = 65536
# What a POST can fail with: httpx's errors (through the Client) and httpcore's (wire.py
# raises them, with the texts httpcore gives them), whose names httpx gives them too.
TIMEOUTS = (httpx.TimeoutException, httpcore.TimeoutException)
FAILURES = (
    httpx.HTTPError,
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.ProxyError,
    httpcore.UnsupportedProtocol,
)
Head = list[tuple[bytes, bytes]]


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


def _drain(chunks: Iterator[bytes], deadline: float) -> None:
    """Read an accepted answer's body, up to ANSWER_LIMIT bytes and ``deadline``; a
    failure here changes nothing (the receiver has accepted), it only costs the
    connection."""
    read = 0
    try:
        for chunk in chunks:
            read += len(chunk)
            if read > ANSWER_LIMIT or time.monotonic() > deadline:
                return
    except FAILURES:
        return


@dataclass(frozen=True, slots=True)
class Direct:
    """A target URL no proxy applies to, as wire.py takes it: the URL, the Host header
    and the Authorization header its credentials make (None without)."""

    url: httpcore.URL
    host: bytes
    auth: bytes | None


class HttpNotifier(BaseNotifier):
    """A notifier that POSTs to an HTTP service; subclasses build the bodies."""

    def __init__(
        self,
        config: NotifierBase,
        ca_file: Path | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(config)
        tls = tls_context(ca_file)
        self._client = httpx.Client(
            timeout=self.timeout,
            verify=tls,
            headers={"user-agent": f"slawatch/{__version__}", **(headers or {})},
            follow_redirects=False,
        )
        # Kept-alive connections for the URLs no proxy applies to (wire.py), as many and
        # as long as the Client's own pool kept them (httpx.HTTPTransport's defaults).
        self._wire = Wire(tls)
        # The Client's headers (Accept, Accept-Encoding, Connection, User-Agent, the
        # notifier's) as it sends them, each with its name in lower case.
        self._headers = [(k.decode().lower(), k, v) for k, v in self._client.headers.raw]
        self._routes: dict[str, Direct | None] = {}

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
            # A receiver may echo one part of the path (Slack's token, a Teams GUID):
            # each part that looks like a token (long, or with a digit) is a secret too.
            for part in parts.path.split("/"):
                if len(part) >= 20 or (len(part) >= 8 and any(c.isdigit() for c in part)):
                    self.keep_secret(part, "…")
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

    def route(self, url: str) -> Direct | None:
        """How ``url`` is sent: straight to a socket, or None when a proxy from the
        environment applies to it (the Client sends it). Decided once per URL, as the
        Client read the environment once."""
        try:
            return self._routes[url]
        except KeyError:
            pass
        target = httpx.URL(url)
        direct = None
        # The Client's own matching of the environment's proxies (a private method of
        # httpx; tests/integration/test_http_transport.py holds it to its word).
        if self._client._transport_for_url(target) is self._client._transport:
            auth = None
            if target.username or target.password:  # as httpx's BasicAuth
                userinfo = f"{target.username}:{target.password}".encode()
                auth = b"Basic " + base64.b64encode(userinfo)
            where = httpcore.URL(
                scheme=target.raw_scheme,
                host=target.raw_host,
                port=target.port,
                target=target.raw_path,
            )
            direct = Direct(where, target.netloc, auth)
        self._routes[url] = direct
        return direct

    def _head(self, direct: Direct, headers: dict[str, str], length: int) -> Head:
        """The request's headers in the order and case httpx.Client sends them: the
        Client's less those the request names again, the request's, Content-Length,
        the Host first, the URL's credentials in the first Authorization's place."""
        named = {name.lower() for name in headers}
        head = [(k, v) for lower, k, v in self._headers if lower not in named]
        head += [(k.encode("ascii"), v.encode("ascii")) for k, v in headers.items()]
        named.update(lower for lower, _, _ in self._headers)
        if "content-length" not in named:
            head.append((b"Content-Length", str(length).encode()))
        if direct.auth is not None:
            kept = [h for h in head if h[0].lower() != b"authorization"]
            at = next(
                (i for i, h in enumerate(head) if h[0].lower() == b"authorization"), len(kept)
            )
            head = [*kept[:at], (b"Authorization", direct.auth), *kept[at:]]
        return head if "host" in named else [(b"Host", direct.host), *head]

    @contextmanager
    def _exchange(
        self, url: str, body: bytes, headers: dict[str, str], timeout: float
    ) -> Iterator[tuple[int, Head, MutableMapping[str, Any], Iterator[bytes]]]:
        """POST ``body``: the answer's status, headers, extensions and raw body chunks."""
        direct = self.route(url)
        if direct is None:
            with self._client.stream(
                "POST", url, content=body, headers=headers, timeout=timeout
            ) as response:
                yield (
                    response.status_code,
                    response.headers.raw,
                    response.extensions,
                    response.iter_raw(),
                )
            return
        head = self._head(direct, headers, len(body))
        with self._wire.post(direct.url, head, body, time.monotonic() + timeout) as answer:
            yield answer

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
        # Straight to a socket (wire.py) the deadline bounds every read; through a proxy
        # (the Client) the timeout bounds each read, and the deadline is checked between
        # the answer's chunks below: a receiver that sends its head a byte at a time
        # there would hold this worker (and outlive the lease).
        try:
            with self._exchange(url, body, request_headers, remaining) as exchange:
                status, head, extensions, chunks = exchange
                if 200 <= status < 300:
                    # Accepted: the body does not matter, but reading it (what fits in
                    # ANSWER_LIMIT, before the deadline) lets the connection be kept.
                    # Left unread, it is closed: every batch paid for a new
                    # connection (and the receiver for a new thread or process).
                    _drain(chunks, deadline)
                    return status
                raw = bytearray()
                for chunk in chunks:
                    if time.monotonic() > deadline:
                        raise DeliveryError(
                            f"timed out after {self.timeout:g}s (HTTP {status}, answer too slow)"
                        )
                    raw += chunk[: ANSWER_LIMIT - len(raw)]
                    if len(raw) >= ANSWER_LIMIT:
                        break
            # Decoded (gzip, deflate: the Client asked for them) as httpx reads an answer.
            response = httpx.Response(
                status, headers=head, content=bytes(raw), extensions=extensions
            )
            answer = response.content[:ANSWER_LIMIT]
            reason = response.reason_phrase
            wait = retry_after(response.headers.get("retry-after"))
        except TIMEOUTS as exc:
            raise DeliveryError(
                f"timed out after {self.timeout:g}s ({type(exc).__name__})"
            ) from exc
        except FAILURES as exc:
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
        self._wire.close()
        self._client.close()
