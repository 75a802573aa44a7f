"""The admin HTTP API of ``slawatch run``: health, metrics, rules, alerts, actions, stats,
replay, acknowledgements, silences, and events (``POST /v1/events``).

The routes live in :mod:`slawatch.operate.api`, a router per resource; this module
wires them (:func:`create_app`) behind the request gate, and serves them.

FastAPI gives the routes their OpenAPI document (``/openapi.json``) from the
pydantic models of :mod:`slawatch.operate.inspect`, the same shapes the CLI's ``--json``
prints. uvicorn serves it in a thread of its own, and the requests use a small
pool of their own, so looking never takes a connection from the claim.

Every request first passes :class:`_Gate`, cheapest check first: who may ask
(:func:`refusal`: the Host, the Origin of a write, the token), a declared body over
its limit (413 before a byte of it is read), then one of ``Limits.requests``
slots, or for ``POST /v1/events`` one of ``Limits.ingest`` (slots of its own: readers
never turn producers away; more are answered 503 at once; ``/healthz`` and ``/readyz``
need none), a page session's lookup in the database, and the body, read whole
within its size and time limits (:mod:`slawatch.operate.guard`, which also closes
connections that send no request in time).

Auth: with a token, every request but ``/healthz`` (and the page's login and
static files) needs ``Authorization: Bearer <token>`` (compared in constant time)
or the on-call page's session cookie (:mod:`slawatch.operate.session`); without one, only
a loopback ``Host`` is answered (DNS rebinding: another site's name resolved to
127.0.0.1 reads nothing), ``/healthz`` excepted, and writes are refused unless
the server listens on loopback only. The ingest token (``SLAWATCH_INGEST_TOKEN``)
is accepted on ``POST /v1/events`` and nowhere else: producers post events without
the power to read, ack, silence or replay; a token of ``SLAWATCH_INGEST_TOKENS``
posts only the event types (and keys) of its scope. A write from a browser must come from this
server's own page: its ``Origin`` must be this server, and one carried by the
cookie needs the page's header. Bad input is a 4xx with ``{"error": "..."}``;
values reach SQL only as parameters.

Every 503 is JSON with ``Retry-After``. :meth:`AdminServer.stop` (SIGTERM) answers
every batch of events in flight: 202 once committed, or 503 when it was interrupted
before its commit (:class:`Drain`), never a 500.

``/readyz`` answers from :class:`Readiness`, a probe of the database on a
connection of its own every scan interval (at most 5 s), so it tells an outage and
its end within one interval and never waits for a connection itself.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from slawatch import __version__
from slawatch.clock import Clock
from slawatch.config.rules import Rule
from slawatch.config.settings import DEFAULT_RETENTION, IngestScope, is_loopback
from slawatch.db import (
    Database,
    DatabaseUnavailable,
    Interruptible,
    Pooler,
)
from slawatch.engine.migrate import schema_current
from slawatch.errors import BadInput, ConfigError, NotFound, SlawatchError
from slawatch.operate.api import acks as acks_api
from slawatch.operate.api import actions as actions_api
from slawatch.operate.api import alerts as alerts_api
from slawatch.operate.api import events as events_api
from slawatch.operate.api import health as health_api
from slawatch.operate.api import page as page_api
from slawatch.operate.api import reports as reports_api
from slawatch.operate.api import rules as rules_api
from slawatch.operate.api import silences as silences_api
from slawatch.operate.api.context import (
    CLOSE,
    RETRY_BUSY,
    RETRY_LATER,
    STOPPING,
    Context,
    Error,
)
from slawatch.operate.api.context import error as _error
from slawatch.operate.api.context import html as _html
from slawatch.operate.api.events import EVENTS, EVENTS_AT_ONCE, MAX_EVENTS_BODY, PING, SCOPE
from slawatch.operate.guard import (
    Disconnected,
    Limits,
    TooLarge,
    TooSlow,
    declared_length,
    guarded_protocol,
    read_body,
)
from slawatch.operate.guard import replay as replay_body
from slawatch.operate.metrics import Metrics
from slawatch.operate.page import (
    COOKIE,
    MAX_LOGIN_BODY,
    PAGE_HEADER,
    STATIC_PATHS,
    render_login,
)
from slawatch.operate.session import session_valid, well_formed
from slawatch.outage import Outage

log = logging.getLogger(__name__)
T = TypeVar("T")

# The admin API's own connections: reads are bounded (inspect.READ_TIMEOUT), so two
# are plenty for a person and a scraper, and the claim's pool is never touched.
POOL_SIZE = 2
# Need no token: a liveness probe carries none; the login form and its style must show.
_OPEN = {"/healthz", "/login", "/logout"} | STATIC_PATHS
# Answered whatever the Host: orchestrators probe liveness by IP, and it tells nothing.
_ANY_HOST = {"/healthz"}
# Need no request slot: they read no database, and must answer when the rest is busy.
_UNCOUNTED = {"/healthz", "/readyz"}
_WRITES = {"POST", "PUT", "PATCH", "DELETE"}
# At a stop, batches of events in flight get this long to commit; then those still
# writing are interrupted (rolled back, answered 503) within INTERRUPT more seconds.
DRAIN, INTERRUPT = 10.0, 5.0
GRACE_MARGIN = 3.0  # for the answers to be written after the interruption
# The bounds of `slawatch run`'s admin server.
LIMITS = Limits()
# /readyz's database probe: every scan interval of the fastest rule, within these.
PROBE_EVERY = (1.0, 5.0)
_MIGRATE = "slawatch's schema is missing or out of date; run 'slawatch migrate'"


def refusal(
    method: str,
    path: str,
    authorization: str | None,
    token: str | None,
    allow_writes: bool,
    *,
    session: bool = False,
    page: bool = False,
    origin: str | None = None,
    host: str | None = None,
    ingest_token: str | None = None,
) -> tuple[int, str] | None:
    """Why a request may not go on ((status, error); None: it may).

    With a token, everything but the open paths needs it: as a Bearer header, or as
    a valid on-call page ``session`` (its cookie, looked up by the caller; a write so
    carried also needs the page's header, ``page``). Without one, only a loopback
    ``host`` is answered (a name of another site that resolves to 127.0.0.1, DNS
    rebinding, reads and writes nothing), ``/healthz`` excepted; a request without a
    Host (HTTP/1.0; every browser sends one) is no rebinding. Writes also need a
    server that only this machine can reach (``allow_writes``). Any write whose
    ``origin`` (sent by browsers) is not this server is refused: a form on another
    site must not act for the person on call.

    ``ingest_token`` as a Bearer header lets ``POST /v1/events`` in, whatever the
    Host and the other token, and nothing else (the open paths stay open). Pings
    (``/ping/<key>``) need nothing: their key is the secret.
    """
    if path.startswith(PING) and method in ("GET", "HEAD", "POST"):
        return None  # the ping's key is its secret, whatever the Host or the token
    write = method in _WRITES
    if ingest_token is not None and _bearer(authorization, ingest_token):
        if write and origin is not None and not _same_origin(origin, host):
            return 403, "cross-origin writes are refused"
        if method == "POST" and path == EVENTS:
            return None
        if path not in _OPEN:
            return 403, f"an ingest token is only for POST {EVENTS}"
    if (
        token is None
        and path not in _ANY_HOST
        and host is not None
        and not is_loopback(_hostname(host))
    ):
        return 403, (
            "without SLAWATCH_API_TOKEN only a loopback Host is answered "
            "(localhost, 127.0.0.1, [::1])"
        )
    if write and origin is not None and not _same_origin(origin, host):
        return 403, "cross-origin writes are refused"
    if token is not None:
        if path in _OPEN:
            return None
        if _bearer(authorization, token):
            return None
        if authorization is None and session:
            if write and not page:
                return 403, f"a write with the login cookie needs the {PAGE_HEADER} header"
            return None
        return 401, "a valid 'Authorization: Bearer <token>' header is required"
    if write and not allow_writes:
        return 403, (
            "writes are refused: set SLAWATCH_API_TOKEN, or bind SLAWATCH_HTTP to loopback"
        )
    return None


def _bearer(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header is ``Bearer <token>`` (in constant time)."""
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


def _hostname(host: str) -> str:
    """The name in a Host header (``[::1]:8181`` → ``::1``)."""
    try:
        return urlsplit(f"//{host}").hostname or ""
    except ValueError:
        return ""


def _same_origin(origin: str, host: str | None) -> bool:
    """Whether an ``Origin`` header names the server the request was sent to."""
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    return (
        host is not None
        and parts.scheme in ("http", "https")
        and parts.netloc.lower() == host.lower()
    )


def _producer(
    authorization: str | None, tokens: Sequence[tuple[str, IngestScope | None]]
) -> tuple[str, IngestScope | None] | None:
    """The ingest token an ``Authorization`` header carries, with its scope (None: the
    unscoped one), or None; every token is compared, in constant time."""
    found = None
    for token, scope in tokens:
        if _bearer(authorization, token) and found is None:
            found = (token, scope)
    return found


class Drain:
    """The admin server's stop as its requests see it.

    From :meth:`begin` no request is let in (503 ``STOPPING``); the batches of events in
    flight are counted, so that the stop can wait for them (:meth:`wait`). From
    :meth:`cut` no batch starts writing and the ``pools`` interrupt the statements
    still running: each such batch is rolled back and answered 503, and a 202 is only
    ever sent for a committed batch.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.stopping = False
        self.cut_off = False
        self._batches = 0
        self.pools: list[Interruptible] = []

    def begin(self) -> None:
        self.stopping = True

    def enter(self) -> None:
        with self._changed:
            self._batches += 1

    def leave(self) -> None:
        with self._changed:
            self._batches -= 1
            self._changed.notify_all()

    def wait(self, timeout: float) -> bool:
        """Whether every batch in flight was answered within ``timeout`` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: self._batches == 0, timeout)

    def cut(self, within: float) -> None:
        """No batch starts writing from now on; interrupt those writing (``within`` s)."""
        self.cut_off = True
        for pool in self.pools:
            pool.interrupt(within)


class _Gate:
    """Every request's way in, cheapest check first: :func:`refusal` (no database, no
    body), a declared body over its limit, a request slot, the page session's lookup,
    then the body, read whole within its limits before the application sees it."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        allow_writes: bool,
        db: Database,
        clock: Clock,
        limits: Limits,
        ingest_token: str | None = None,
        ingest_tokens: Sequence[IngestScope] = (),
        drain: Drain | None = None,
    ) -> None:
        self.app = app
        self.token, self.allow_writes = token, allow_writes
        self.producers: list[tuple[str, IngestScope | None]] = [
            (s.token.get_secret_value(), s) for s in ingest_tokens
        ]
        if ingest_token is not None:
            self.producers.append((ingest_token, None))
        self.db, self.clock, self.limits = db, clock, limits
        self.drain = drain or Drain()
        # Requests holding a slot, reads and producers apart (changed on the event loop only).
        self.busy = {False: 0, True: 0}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        path, headers = str(scope["path"]), request.headers
        cookie = request.cookies.get(COOKIE)
        producer = _producer(headers.get("authorization"), self.producers)
        if producer is not None:
            # The scope is checked against the events themselves (take_events).
            scope.setdefault("state", {})[SCOPE] = producer[1]

        def refused(session: bool) -> tuple[int, str] | None:
            return refusal(
                request.method,
                path,
                headers.get("authorization"),
                self.token,
                self.allow_writes,
                session=session,
                page=PAGE_HEADER.lower() in headers,
                origin=headers.get("origin"),
                host=headers.get("host"),
                ingest_token=None if producer is None else producer[0],
            )

        answer = refused(False)
        # Only a request that would be let in with a session waits for its lookup in
        # the database, and only once it holds a slot.
        ask = (
            answer is not None
            and answer[0] == 401
            and "authorization" not in headers
            and well_formed(cookie)
        )
        if answer is not None and not ask:
            await self._refuse(answer, scope, receive, send)
            return
        limit = self.limits.body_limit(path)
        try:
            declared = declared_length(headers.get("content-length"))
        except ValueError as exc:
            await _error(400, str(exc), CLOSE)(scope, receive, send)
            return
        if declared is not None and declared > limit:
            # Before a byte of the body is read (nor a 100 Continue sent).
            await _too_large(limit)(scope, receive, send)
            return
        counted = path not in _UNCOUNTED
        # Pings are producers too: they take the producers' slots.
        events = (path == EVENTS and request.method == "POST") or path.startswith(PING)
        if counted:
            if self.drain.stopping:
                await _error(503, STOPPING, {"Retry-After": RETRY_LATER, **CLOSE})(
                    scope, receive, send
                )
                return
            slots = self.limits.ingest if events else self.limits.requests
            if self.busy[events] >= slots:
                what = "batches of events" if events else "requests"
                busy = f"the admin API is busy ({slots} {what} at once); retry"
                await _error(503, busy, {"Retry-After": RETRY_BUSY})(scope, receive, send)
                return
            self.busy[events] += 1
            if events:
                self.drain.enter()
        try:
            if ask:
                token = self.token
                assert token is not None  # a 401 is only ever asked for with a token
                try:
                    valid = await run_in_threadpool(
                        session_valid, self.db, cookie, token, self.clock.now()
                    )
                except SlawatchError as exc:
                    await _error(503, str(exc).splitlines()[0])(scope, receive, send)
                    return
                answer = refused(valid)
                if answer is not None:
                    await self._refuse(answer, scope, receive, send)
                    return
            try:
                body = await read_body(receive, limit, self.limits.body_timeout)
            except TooLarge:
                await _too_large(limit)(scope, receive, send)
                return
            except TooSlow:
                slow = f"the request body did not arrive within {self.limits.body_timeout:g}s"
                await _error(408, slow, CLOSE)(scope, receive, send)
                return
            except Disconnected:
                return
            started = False

            async def sending(message: Message) -> None:
                nonlocal started
                started = started or message["type"] == "http.response.start"
                await send(message)

            try:
                await self.app(scope, replay_body(body, receive), sending)
            except asyncio.CancelledError:
                # uvicorn's last resort at a stop (its grace ran out): an answer all the
                # same, never its bare 500 and a traceback.
                if not started:
                    stopping = _error(503, STOPPING, {"Retry-After": RETRY_LATER, **CLOSE})
                    await stopping(scope, receive, send)
        finally:
            if counted:
                self.busy[events] -= 1
                if events:
                    self.drain.leave()

    async def _refuse(
        self, answer: tuple[int, str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        status, message = answer
        if status == 401 and scope["path"] == "/" and scope["method"] == "GET":
            response: Response = _html(render_login(), 401)  # a browser: ask for the token
        else:
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
            response = _error(status, message, headers)
        await response(scope, receive, send)


def _too_large(limit: int) -> JSONResponse:
    return _error(413, f"a request body here is at most {limit:,} bytes", CLOSE)


class Readiness:
    """``/readyz``'s view of the database: whether it answers and slawatch's schema is
    current, from a probe on a connection of its own every ``every()`` seconds.

    ``/readyz`` reads the last result and never waits for the database itself: it
    answers at once however busy the admin pool is, and turns not ready within one
    interval of an outage (and ready within one interval of its end). A probe that
    hangs (a network that stopped answering) is a result too old to trust: not ready.
    """

    def __init__(self, db: Database, every: Callable[[], float]) -> None:
        self.db, self.every = db, every
        self._lock = threading.Lock()
        self._state: tuple[float, bool, bool, str | None] | None = None
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None
        self._trouble = Outage("readiness probe", log)

    def start(self) -> None:
        """Probe from a thread from now on; return after the first probe (or its timeout)."""
        self._thread = threading.Thread(target=self._run, name="slawatch-ready", daemon=True)
        self._thread.start()
        self._first.wait(self.db.timeout + 2)

    def stop(self) -> None:
        """End the probing (its connection closes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.db.timeout + 2)

    def report(self) -> tuple[dict[str, bool], str | None]:
        """``({"schema": ..., "database": ...}, the first problem or None)``."""
        with self._lock:
            state = self._state
        if state is None:
            return {"schema": False, "database": False}, "the database has not been probed yet"
        at, database, schema, error = state
        age = time.monotonic() - at
        # A failed probe waits one interval, then up to the connect timeout, to finish.
        if age > self.every() + self.db.timeout + 1:
            return {"schema": False, "database": False}, (
                f"the database has not answered the readiness probe for {age:.0f}s"
            )
        return {"schema": schema, "database": database}, error

    def _record(self, database: bool, schema: bool, error: str | None) -> None:
        with self._lock:
            self._state = (time.monotonic(), database, schema, error)
        self._first.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            since = time.monotonic()
            try:
                # One connection for as long as it works: no new session every interval.
                with self.db.dedicated("readiness probe") as conn:
                    while not self._stop.is_set():
                        current = schema_current(conn)
                        self._record(True, current, None if current else _MIGRATE)
                        self._trouble.ok()
                        self._stop.wait(self.every())
            except DatabaseUnavailable as exc:
                # The database's own outage line (db.py) says it in the log.
                self._record(False, False, f"database unreachable: {str(exc).splitlines()[0]}")
            except SlawatchError as exc:
                self._record(False, False, str(exc).splitlines()[0])
            except Exception as exc:  # a bug: not ready, said once, and probing goes on
                self._record(False, False, f"readiness probe: unexpected {type(exc).__name__}")
                self._trouble.failed(f"unexpected {type(exc).__name__}: {exc}", since, exc_info=exc)
            self._stop.wait(self.every())


def _handle_errors(app: FastAPI) -> None:
    """Every error as JSON ``{"error": ...}``: bad input 400, not found 404, the
    database away or not migrated 503, a bug 500 (logged)."""

    @app.exception_handler(BadInput)
    async def bad_input(request: Request, exc: BadInput) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> JSONResponse:
        return _error(404, str(exc))

    @app.exception_handler(SlawatchError)
    async def unavailable(request: Request, exc: SlawatchError) -> JSONResponse:
        # The database is down or not migrated: the request may work later.
        return _error(503, str(exc).splitlines()[0])

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "path"))
        return _error(422, f"{where}: {first.get('msg')}" if where else str(first.get("msg")))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail), exc.headers)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        # The last resort: a bug. Logged with its traceback; the client learns nothing more.
        log.error("admin API: %s %s failed", request.method, request.url.path, exc_info=exc)
        return _error(500, "internal error (logged)")


def create_app(
    db: Database,
    rules: list[Rule] | Callable[[], list[Rule]],
    notifiers: list[str] | Callable[[], list[str]],
    *,
    token: str | None,
    allow_writes: bool,
    health: Callable[[], Mapping[str, Any]] | None = None,
    registry: CollectorRegistry | None = None,
    clock: Clock | None = None,
    limits: Limits = LIMITS,
    ingest_token: str | None = None,
    retention: timedelta = DEFAULT_RETENTION,
    runner_metrics: Metrics | None = None,
    events_db: Database | None = None,
    ingest_tokens: Sequence[IngestScope] = (),
    public_url: str | None = None,
    unmigrated: Callable[[], Collection[str]] = lambda: (),
) -> FastAPI:
    """The admin API over ``db`` for the configured ``rules`` and ``notifiers`` (names);
    either may be a callable, read per request, so that a reload shows at once.

    ``health()``: the process's own parts (scheduler, each delivery worker) as
    ``{name: alive}`` (nested mappings allowed: ``{"workers": {"console": True}}``),
    added to ``/readyz``; ``registry``: what ``/metrics`` exports (default:
    prometheus_client's global registry); ``limits``: the server's bounds
    (:func:`serve_in_thread` applies those of the connections). The database probe
    of ``/readyz`` (``app.state.readiness``) runs while :func:`serve_in_thread` serves.

    ``ingest_token``: accepted on ``POST /v1/events`` only; ``retention``: events
    older than this are refused (they would be pruned at once); ``runner_metrics``:
    where events are counted (``slawatch_events_total``); ``events_db``: the pool
    events are written on (:data:`EVENTS_AT_ONCE` connections; default: one of ``db``'s
    at a time, leaving the other to the reads); ``ingest_tokens``: producer tokens
    limited to event types and keys; ``public_url``: the page's address as people
    reach it (https: the login cookie is ``Secure`` whatever the request's scheme);
    ``unmigrated()``: event types of rules in the files that wait for a migrate.

    ``app.state.drain`` is the server's stop (:class:`Drain`): pools of ``db`` and
    ``events_db`` that are :class:`~slawatch.db.Interruptible` are interrupted by it.
    """
    clock = clock or Clock()
    ctx = Context(
        db, clock, rules, notifiers, token=token, allow_writes=allow_writes, unmigrated=unmigrated
    )

    def probe_every() -> float:
        # Within one scan interval of the fastest rule, so /readyz is never further behind.
        fastest = min((r.every.total_seconds() for r in ctx.configured().values()), default=60.0)
        low, high = PROBE_EVERY
        return min(max(fastest, low), high)

    errors: dict[int | str, dict[str, Any]] = {
        code: {"model": Error} for code in (400, 401, 403, 404, 422, 503)
    }
    app = FastAPI(
        title="slawatch admin API",
        version=__version__,
        docs_url=None,  # the interactive docs load scripts from a CDN
        redoc_url=None,
        responses=errors,
    )

    readiness = Readiness(db, probe_every)
    # A login form is small, and a batch of events large, whatever else the limits allow.
    limits = replace(
        limits, bodies={"/login": MAX_LOGIN_BODY, EVENTS: MAX_EVENTS_BODY, **limits.bodies}
    )
    drain = Drain()
    drain.pools = [
        p for p in {id(p): p for p in (db, events_db)}.values() if isinstance(p, Interruptible)
    ]
    app.state.readiness, app.state.limits, app.state.drain = readiness, limits, drain
    app.add_middleware(
        _Gate,
        token=token,
        allow_writes=allow_writes,
        db=db,
        clock=clock,
        limits=limits,
        ingest_token=ingest_token,
        ingest_tokens=ingest_tokens,
        drain=drain,
    )
    _handle_errors(app)
    app.include_router(health_api.router(readiness.report, health, registry))
    app.include_router(rules_api.router(ctx))
    app.include_router(alerts_api.router(ctx))
    app.include_router(actions_api.router(ctx))
    app.include_router(reports_api.router(ctx))
    app.include_router(acks_api.router(ctx))
    app.include_router(silences_api.router(ctx))
    app.include_router(
        events_api.router(
            ctx,
            retention=retention,
            runner_metrics=runner_metrics,
            events_db=events_db,
            slots=limits.ingest,
            cut_off=lambda: drain.cut_off,
        )
    )
    app.include_router(page_api.router(ctx, public_url))
    return app


class AdminServer:
    """The admin API served by uvicorn in a thread; :meth:`stop` ends it."""

    def __init__(
        self, server: uvicorn.Server, thread: threading.Thread, address: tuple[str, int]
    ) -> None:
        self._server, self._thread = server, thread
        self.host, self.port = address
        self.readiness: Readiness | None = None  # /readyz's probe, stopped with the server
        self.drain: Drain | None = None  # the app's (create_app), for the stop
        self.on_stop: Callable[[], None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self, drain: float = DRAIN) -> None:
        """Stop accepting; let the batches of events in flight commit for up to ``drain``
        seconds, then interrupt the rest (rolled back, answered 503); end the thread.

        Every request in flight is answered: uvicorn's own cancellation (a bare 500) is
        set later than the drain and its interruption."""
        if self.drain is not None:
            self.drain.begin()  # requests still arriving on open connections: 503
        self._server.should_exit = True
        if self.drain is not None:
            if not self.drain.wait(drain):
                log.warning(
                    "stopping: batches of events still writing after %gs are interrupted"
                    " (answered 503: their producers send them again)",
                    drain,
                )
            self.drain.cut(INTERRUPT)
        self._thread.join(drain + INTERRUPT + GRACE_MARGIN)
        if self.readiness is not None:
            self.readiness.stop()
        if self.on_stop is not None:
            self.on_stop()


def serve_in_thread(
    app: FastAPI, host: str, port: int, *, forwarded_allow_ips: str | None = None
) -> AdminServer:
    """Serve ``app`` on ``host:port`` (port 0: any free port) from a daemon thread,
    with the connection bounds of ``create_app``'s ``limits``, and start its
    ``/readyz`` probe. ``forwarded_allow_ips``: the proxies whose ``X-Forwarded-*``
    headers are believed (None: uvicorn's ``FORWARDED_ALLOW_IPS``, else loopback).

    The socket is bound here, so a port in use is a ConfigError now, not a log line
    from a thread that quietly ended.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        raise ConfigError(f"SLAWATCH_HTTP: cannot resolve {host}: {exc.strerror or exc}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"SLAWATCH_HTTP: cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    limits: Limits = getattr(app.state, "limits", LIMITS)
    readiness: Readiness | None = getattr(app.state, "readiness", None)
    config = uvicorn.Config(
        app,
        # No limit_concurrency: uvicorn counts open connections against it, so idle
        # sockets would turn every request away; the gate counts requests instead.
        http=guarded_protocol(limits),
        # The guard closes idle connections (limits.keep_alive); uvicorn's own timer agrees.
        timeout_keep_alive=max(1, math.ceil(limits.keep_alive)),
        forwarded_allow_ips=forwarded_allow_ips,
        log_config=None,  # slawatch's logging stays as it is
        log_level="warning",
        access_log=False,
        lifespan="off",
        # Later than AdminServer.stop's drain and interruption: those answer every batch.
        timeout_graceful_shutdown=math.ceil(DRAIN + INTERRUPT + GRACE_MARGIN),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="slawatch-admin", daemon=True
    )
    if readiness is not None:
        readiness.start()
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            if readiness is not None:
                readiness.stop()
            raise SlawatchError(f"the admin API did not start on {host}:{port} (see the log)")
        time.sleep(0.01)
    bound = sock.getsockname()
    served = AdminServer(server, thread, (bound[0], bound[1]))
    served.readiness = readiness
    served.drain = getattr(app.state, "drain", None)
    return served


def serve_admin(
    dsn: str,
    bind: tuple[str, int],
    rules: list[Rule] | Callable[[], list[Rule]],
    notifiers: list[str] | Callable[[], list[str]],
    *,
    token: str | None,
    timeout: float,
    pooler: Pooler,
    health: Callable[[], Mapping[str, Any]] | None = None,
    registry: CollectorRegistry | None = None,
    ingest_token: str | None = None,
    retention: timedelta = DEFAULT_RETENTION,
    runner_metrics: Metrics | None = None,
    ingest_tokens: Sequence[IngestScope] = (),
    public_url: str | None = None,
    forwarded_allow_ips: str | None = None,
    outage: Outage | None = None,
    unmigrated: Callable[[], Collection[str]] = lambda: (),
) -> AdminServer:
    """``slawatch run``'s admin API on ``bind``, with a pool of its own; logs its address.
    ``outage``: the runner's database outage record, which its pools share."""
    host, port = bind
    # A request waits at most a few seconds for one of the admin pool's connections.
    # Both pools are interrupted at a stop (Drain): a request stuck in the database is
    # answered, not abandoned.
    db = Interruptible(
        dsn, size=POOL_SIZE, timeout=min(timeout, 5.0), pooler=pooler, name="admin", outage=outage
    )
    try:
        events_db = Interruptible(
            dsn,
            size=EVENTS_AT_ONCE,
            timeout=min(timeout, 5.0),
            pooler=pooler,
            name="events",
            outage=outage,
        )
    except BaseException:
        db.close()
        raise

    def close() -> None:
        db.close()
        events_db.close()

    try:
        app = create_app(
            db,
            rules,
            notifiers,
            token=token,
            allow_writes=token is not None or is_loopback(host),
            health=health,
            registry=registry,
            ingest_token=ingest_token,
            retention=retention,
            runner_metrics=runner_metrics,
            events_db=events_db,
            ingest_tokens=ingest_tokens,
            public_url=public_url,
            unmigrated=unmigrated,
        )
        server = serve_in_thread(app, host, port, forwarded_allow_ips=forwarded_allow_ips)
    except BaseException:
        close()
        raise
    server.on_stop = close
    if token is not None:
        access = "a bearer token required"
    elif is_loopback(host):
        access = "no token: open to this machine"
    else:
        # The Host check answers loopback names only: other machines' browsers get 403s.
        access = "no token: read-only, loopback Host names only (set SLAWATCH_API_TOKEN)"
    if ingest_token is not None or ingest_tokens:
        scoped = f" ({len(ingest_tokens)} scoped)" if ingest_tokens else ""
        access += f"; ingest tokens{scoped} for POST {EVENTS} only"
    log.info("admin API on %s (%s); metrics at %s/metrics", server.url, access, server.url)
    return server
