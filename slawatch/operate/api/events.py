"""``POST /v1/events``: producers' events, checked whole, then stored in one
transaction (docs/how-to/events.md); ``/ping/<key>``: healthchecks-compatible pings
that send an event rule's events (docs/how-to/events.md#pings)."""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import orjson
from anyio import CapacityLimiter, to_thread
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer
from starlette.exceptions import HTTPException as StarletteHTTPException

from slawatch.config.rules import EVENT_TYPE, Events
from slawatch.config.settings import IngestScope
from slawatch.db import Database
from slawatch.engine.timers import KEY_MAX, known_types
from slawatch.errors import BadInput, DatabaseError
from slawatch.events.ingest import (
    MAX_BATCH,
    MAX_DATA,
    MAX_DEPTH,
    MAX_ID,
    Event,
    EventError,
    Ingested,
    id_problem,
    ingest,
    parse_events,
)
from slawatch.operate.api.context import CLOSE, RETRY_BUSY, RETRY_LATER, STOPPING, Context, Error
from slawatch.operate.guard import MIB
from slawatch.operate.metrics import Metrics

# Where producers post events: the one route the ingest token opens.
EVENTS = "/v1/events"
# A batch of 10,000 events with a few hundred bytes of data each, and room to spare.
MAX_EVENTS_BODY = 16 * MIB
# Batches of events written at once, each on a connection of the events' own pool (so
# producers never take the reads' two). More wait their turn here, up to EVENTS_WAIT
# seconds, then get a 503 to retry: waiting in the pool instead would count a busy
# pool as a database outage.
EVENTS_AT_ONCE = 4
EVENTS_WAIT = 30.0
# Where healthchecks-compatible pings go: /ping/<key>[/start|/fail|/log|/<exit status>].
PING = "/ping/"
# The event key of every ping: a rule's pings are one check, as in healthchecks.
PING_KEY = "ping"
# Of a ping's body, what fits in an event's data (with room for the other fields).
PING_BODY_KEPT = MAX_DATA - 1024
# Where the gate leaves the scope of the ingest token a request carries (scope["state"]).
SCOPE = "slawatch_ingest_scope"


class EventsTaken(BaseModel):
    """What a batch of events did, once it is committed."""

    accepted: int = Field(description="events stored")
    duplicates: int = Field(description="repeats of an event's type and id, dropped")
    held: int = Field(
        default=0,
        description="of a type the database's slawatch.event() knows no rule for (rules"
        " changed, not migrated yet): kept, applied by the migrate that brings its rule;"
        " left out when none",
    )

    @model_serializer(mode="wrap")
    def _without_none_held(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if not out.get("held"):
            out.pop("held", None)
        return out


def _text_or_number(longest: int) -> dict[str, Any]:
    text = {"type": "string", "minLength": 1, "maxLength": longest}
    return {"anyOf": [text, {"type": "integer"}]}


_EVENT = {
    "type": "object",
    "description": "One event: `type` must be one a rule uses; `at` defaults to the time it "
    "is received; a repeat of `type` and `id` is dropped; `data` goes into the alert's row.",
    "required": ["type", "key"],
    "additionalProperties": False,
    "properties": {
        "type": {"type": "string", "pattern": f"^{EVENT_TYPE.pattern}$"},
        "key": _text_or_number(KEY_MAX),
        "at": {"type": "string", "format": "date-time", "description": "ISO 8601, with a zone"},
        "data": {"type": "object"},
        "id": _text_or_number(MAX_ID),
    },
}
# The request body of POST /v1/events, for the OpenAPI document: the route reads the
# body itself, so that a bad event is named by its index and field.
_EVENTS_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "anyOf": [
                    _EVENT,
                    {
                        "type": "object",
                        "required": ["events"],
                        "additionalProperties": False,
                        "properties": {
                            "events": {
                                "type": "array",
                                "minItems": 1,
                                "maxItems": MAX_BATCH,
                                "items": _EVENT,
                            }
                        },
                    },
                ]
            }
        }
    },
}


def _types_of(payload: Any) -> list[object]:
    """The ``type`` of each event of a refused body, as sent (for the metrics)."""
    if isinstance(payload, dict) and isinstance(payload.get("events"), list):
        return [e.get("type") if isinstance(e, dict) else None for e in payload["events"]]
    return [payload.get("type") if isinstance(payload, dict) else None]


log = logging.getLogger(__name__)


def ping_type(events: Events, action: str) -> str | None:
    """The event type a ping ``action`` sends to a rule with ``events`` (None: it sends
    none, as ``log`` and a ``start`` to a heartbeat); ValueError for an unknown action."""
    if action in ("", "0"):
        return (events.stop or events.beat or [""])[0]
    if action == "start":
        return None if events.start is None else events.start[0]
    if action == "log":
        return None
    digits = action.isascii() and action.isdigit() and len(action) <= 3
    if action == "fail" or (digits and 1 <= int(action) <= 255):
        return (events.fail or [""])[0]
    raise ValueError(action)


def ping_data(body: bytes, action: str, rid: str | None) -> dict[str, Any]:
    """A ping's event data: its body as text (what fits in an event's data), its exit
    status and its run id."""
    data: dict[str, Any] = {}
    if action.isascii() and action.isdigit():
        data["exit_status"] = int(action)
    if rid is not None:
        data["rid"] = rid
    if body:
        # jsonb cannot hold NUL; escapes may make the JSON longer than the text.
        text = body.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
        data["body"] = text
        while len(orjson.dumps(data)) > PING_BODY_KEPT:
            text = text[: len(text) * 3 // 4]
            data["body"], data["body_truncated"] = text, True
    return data


def router(
    ctx: Context,
    *,
    retention: timedelta,
    runner_metrics: Metrics | None,
    events_db: Database | None,
    slots: int,
    cut_off: Callable[[], bool],
) -> APIRouter:
    """``retention``: events older than this are refused; ``runner_metrics``: where
    events are counted; ``events_db``: the pool events are written on (default: one of
    ``ctx.db``'s at a time); ``slots``: batches taken at once; ``cut_off()``: the
    server's stop has begun interrupting writes."""
    api = APIRouter(tags=["events"])
    # Producers' batches run on threads of their own: reads holding every thread of
    # the shared pool cannot hold a batch up.
    producers = CapacityLimiter(slots)
    writer = events_db or ctx.db
    writing = threading.BoundedSemaphore(EVENTS_AT_ONCE if events_db is not None else 1)

    def take_events(body: bytes, scope: IngestScope | None) -> EventsTaken:
        """Check a body of events whole (against the ``scope`` of the token that sent
        it, if any), then store it in one transaction."""
        now = ctx.clock.now()
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            if runner_metrics is not None:
                runner_metrics.events_rejected("http")
            if "depth limit" in str(exc):  # orjson's 1,024
                raise BadInput(
                    "body: nested too deep (over 1,024 levels; an event's data may nest"
                    f" {MAX_DEPTH})"
                ) from None
            raise BadInput(f"body: not JSON: {str(exc).splitlines()[0]}") from None
        try:
            events = parse_events(
                payload,
                known_types(list(ctx.configured().values())),
                now,
                retention,
                ctx.unmigrated(),
            )
        except EventError:
            if runner_metrics is not None:
                runner_metrics.events_rejected("http", _types_of(payload))
            raise
        if scope is not None:
            batch = not (isinstance(payload, dict) and "type" in payload)
            for i, event in enumerate(events):
                why = scope.refuses(event.type, event.key)
                if why is not None:
                    if runner_metrics is not None:
                        runner_metrics.events_rejected("http", [e.type for e in events])
                    where = f"events[{i}]" if batch else "event"
                    raise StarletteHTTPException(403, f"{where}: {why}; nothing was stored")
        got = store(events, now)
        if runner_metrics is not None:
            runner_metrics.events_ingested("http", got)
        return EventsTaken(accepted=got.accepted, duplicates=got.duplicates, held=got.held)

    def store(events: list[Event], now: datetime) -> Ingested:
        """Write checked ``events`` in one transaction, one of EVENTS_AT_ONCE."""
        stopped = StarletteHTTPException(
            503, STOPPING, headers={"Retry-After": RETRY_LATER, **CLOSE}
        )
        if not writing.acquire(timeout=EVENTS_WAIT):
            busy = f"{EVENTS_AT_ONCE} batches of events are being written; retry"
            raise StarletteHTTPException(503, busy, headers={"Retry-After": RETRY_BUSY})
        try:
            if cut_off():
                raise stopped
            got = ingest(writer, events, now)
        except DatabaseError as exc:
            # Interrupted by the stop: rolled back (an error before the commit is no commit).
            if cut_off():
                raise stopped from exc
            raise
        finally:
            writing.release()
        return got

    def take_ping(key: str, action: str, rid: str | None, body: bytes) -> str:
        """The event of one ping, stored; its answer's text. Every rule's key is
        compared, in constant time: a key is found, never guessed by timing."""
        found: Events | None = None
        for rule in ctx.configured().values():
            ping = None if rule.events is None else rule.events.ping
            if ping is not None and hmac.compare_digest(
                key.encode(), ping.key.get_secret_value().encode()
            ):
                found = rule.events
        try:
            kind = None if found is None else ping_type(found, action)
        except ValueError:
            found = None
        if found is None:
            if runner_metrics is not None:
                runner_metrics.events_rejected("ping")
            raise StarletteHTTPException(404, "not found")
        if rid is not None and (problem := id_problem(rid)):
            raise BadInput(f"rid: {problem}")
        data = ping_data(body, action, rid)
        if kind is None:
            # Data only (a log, a start of a heartbeat): answered, logged, nothing stored.
            log.info("ping %s: %s", action, orjson.dumps(data).decode()[:200])
            return "OK"
        now = ctx.clock.now()
        got = store([Event(kind, PING_KEY, None, data, rid)], now)
        if runner_metrics is not None:
            runner_metrics.events_ingested("ping", got)
        return "OK"

    async def ping(request: Request, key: str, action: str, rid: str | None) -> Response:
        body = await request.body()  # read whole, within its limit, by the gate
        text = await to_thread.run_sync(take_ping, key, action, rid, body, limiter=producers)
        return Response(text, media_type="text/plain")

    async def ping_success(request: Request, key: str, rid: str | None = None) -> Response:
        """A healthchecks-compatible ping of the event rule whose ``ping.key`` is
        ``key``: success (its stop or beat). No token: the key is the secret; a key no
        rule has is a 404. The body is kept as the event's ``data.body``, ``?rid=`` as
        its id (docs/how-to/events.md#pings)."""
        return await ping(request, key, "", rid)

    async def ping_action(
        request: Request, key: str, action: str, rid: str | None = None
    ) -> Response:
        """A healthchecks-compatible ping as ``GET /ping/{key}``, with ``action``:
        ``start``, ``fail``, ``log`` (data only: nothing stored) or an exit status
        (``0`` success, ``1`` to ``255`` fail)."""
        return await ping(request, key, action, rid)

    # One route per method and path: each its own operation in the OpenAPI document.
    for path, handler in ((PING + "{key}", ping_success), (PING + "{key}/{action}", ping_action)):
        for method in ("GET", "HEAD", "POST"):
            api.add_api_route(
                path,
                handler,
                methods=[method],
                response_class=Response,
                responses={200: {"content": {"text/plain": {}}, "description": "OK"}},
            )

    @api.post(
        EVENTS,
        response_model=EventsTaken,
        status_code=202,
        openapi_extra={"requestBody": _EVENTS_BODY},
        responses={413: {"model": Error, "description": "the body is over its limit"}},
    )
    async def post_events(request: Request) -> EventsTaken:
        """One event, or ``{"events": [...]}`` (1 to 10,000): all stored, or none (a 400
        names the index and field of the first bad one). A type no rule uses is a 400.
        Answered once the batch is committed."""
        body = await request.body()  # read whole, within its limit, by the gate
        scope: IngestScope | None = request.scope.get("state", {}).get(SCOPE)
        return await to_thread.run_sync(take_events, body, scope, limiter=producers)

    return api
