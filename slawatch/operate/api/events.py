"""``POST /v1/events``: producers' events, checked whole, then stored in one
transaction (docs/how-to/events.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import orjson
from anyio import CapacityLimiter, to_thread
from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer
from starlette.exceptions import HTTPException as StarletteHTTPException

from slawatch.config.rules import EVENT_TYPE
from slawatch.config.settings import IngestScope
from slawatch.db import Database
from slawatch.engine.timers import KEY_MAX, known_types
from slawatch.errors import BadInput, DatabaseError
from slawatch.events.ingest import MAX_BATCH, MAX_ID, EventError, ingest, parse_events
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
            raise BadInput(f"body: not JSON: {str(exc).splitlines()[0]}") from None
        try:
            events = parse_events(
                payload, known_types(list(ctx.configured().values())), now, retention
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
        if runner_metrics is not None:
            runner_metrics.events_ingested("http", got)
        return EventsTaken(accepted=got.accepted, duplicates=got.duplicates, held=got.held)

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
