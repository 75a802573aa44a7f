"""Local stand-ins for Slack, PagerDuty and Alertmanager that check requests the way
the real services do and answer with their status codes and bodies.

Each is a real HTTP server in a thread. ``replies`` (scripted answers, used in
order) override the service's own answer, for 429s and outages.

- Slack incoming webhooks: the hook path is the credential (403 ``invalid_token``,
  404 ``no_service``); 400 ``invalid_payload`` / ``no_text`` / ``invalid_blocks``
  for a body Slack refuses: Block Kit limits (50 blocks, header 150 characters,
  text objects 3000, context 10 elements). 200 ``ok``.
- PagerDuty Events API v2 (``/v2/enqueue``): 400 ``invalid event`` with PagerDuty's
  error list; 202 with the dedup_key. Keeps incidents as PagerDuty does: a
  trigger opens one per dedup_key or adds an alert to the open one, a resolve
  closes the open one.
- Alertmanager ``POST /api/v2/alerts``: the postableAlert schema (422 for a
  schema violation, 400 for JSON it cannot parse or an alert that fails its
  validation), then its own defaults and merge by label set, with
  ``resolve_timeout`` 5m for alerts without ``endsAt``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.receivers import Reply, Request


class Service:
    """An HTTP server on 127.0.0.1 answering POSTs with :meth:`answer`."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.replies: list[Reply] = []
        self.lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                request = Request(headers, body, self.path)
                with service.lock:
                    service.requests.append(request)
                    reply = service.replies.pop(0) if service.replies else service.answer(request)
                time.sleep(reply.delay)
                try:
                    self.send_response(reply.status)
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.send_header("content-length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except OSError:
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll: shutdown() waits up to one poll interval (0.5 s by default).
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def answer(self, request: Request) -> Reply:
        raise NotImplementedError

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _json(request: Request) -> Any:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return ValueError("content-type")
    try:
        return json.loads(request.body)
    except ValueError as exc:
        return exc


# --- Slack -------------------------------------------------------------------------------


class BlockKitError(ValueError):
    pass


def _text_object(obj: Any, where: str, limit: int, plain_only: bool = False) -> None:
    if not isinstance(obj, dict) or obj.get("type") not in ("plain_text", "mrkdwn"):
        raise BlockKitError(f"{where}: must be a text object")
    if plain_only and obj["type"] != "plain_text":
        raise BlockKitError(f"{where}: must be plain_text")
    text = obj.get("text")
    if not isinstance(text, str) or not 1 <= len(text) <= limit:
        raise BlockKitError(f"{where}.text: must be 1 to {limit} characters")
    if "emoji" in obj and obj["type"] != "plain_text":
        raise BlockKitError(f"{where}: emoji is only for plain_text")


def check_blocks(blocks: Any) -> None:
    """Block Kit's rules for the blocks this notifier uses (header, section, context, divider)."""
    if not isinstance(blocks, list) or not 1 <= len(blocks) <= 50:
        raise BlockKitError("blocks: must be 1 to 50 blocks")
    for i, block in enumerate(blocks):
        where = f"blocks[{i}]"
        if not isinstance(block, dict):
            raise BlockKitError(f"{where}: must be an object")
        if "block_id" in block and not 1 <= len(str(block["block_id"])) <= 255:
            raise BlockKitError(f"{where}.block_id: too long")
        kind = block.get("type")
        if kind == "header":
            _text_object(block.get("text"), f"{where}.text", 150, plain_only=True)
        elif kind == "section":
            if "text" not in block and "fields" not in block:
                raise BlockKitError(f"{where}: needs text or fields")
            if "text" in block:
                _text_object(block["text"], f"{where}.text", 3000)
            for j, f in enumerate(block.get("fields", [])):
                _text_object(f, f"{where}.fields[{j}]", 2000)
            if len(block.get("fields", [])) > 10:
                raise BlockKitError(f"{where}.fields: at most 10")
        elif kind == "context":
            elements = block.get("elements")
            if not isinstance(elements, list) or not 1 <= len(elements) <= 10:
                raise BlockKitError(f"{where}.elements: must be 1 to 10")
            for j, e in enumerate(elements):
                _text_object(e, f"{where}.elements[{j}]", 3000)
        elif kind != "divider":
            raise BlockKitError(f"{where}.type: unknown block type {kind!r}")


class SlackService(Service):
    """A Slack incoming webhook at ``/services/T0SLAWATCH/B0SLAWATCH/<token>``."""

    TOKEN = "xoxtokenS3cretSlackHookPath00001"

    def __init__(self) -> None:
        super().__init__()
        self.url = f"{self.base}/services/T0SLAWATCH/B0SLAWATCH/{self.TOKEN}"
        self.messages: list[dict[str, Any]] = []
        self.refusals: list[str] = []

    def answer(self, request: Request) -> Reply:
        def refuse(status: int, error: str, why: str = "") -> Reply:
            self.refusals.append(f"{error}: {why}" if why else error)
            return Reply(status, {"content-type": "text/plain"}, body=error.encode())

        parts = request.path.split("/")
        if len(parts) != 5 or parts[1] != "services":
            return refuse(404, "no_service")
        if parts[4] != self.TOKEN:
            return refuse(403, "invalid_token")
        body = _json(request)
        if isinstance(body, Exception) or not isinstance(body, dict):
            return refuse(400, "invalid_payload")
        text, blocks = body.get("text"), body.get("blocks")
        if not text and not blocks:
            return refuse(400, "no_text")
        if text is not None and (not isinstance(text, str) or len(text) > 40_000):
            return refuse(400, "msg_too_long")
        if blocks is not None:
            try:
                check_blocks(blocks)
            except BlockKitError as exc:
                return refuse(400, "invalid_blocks", str(exc))
        self.messages.append(body)
        return Reply(200, {"content-type": "text/html"}, body=b"ok")


# --- PagerDuty ---------------------------------------------------------------------------


@dataclass
class Incident:
    dedup_key: str
    status: str = "triggered"  # triggered | resolved
    alerts: list[dict[str, Any]] = field(default_factory=list)  # the trigger events


PD_SEVERITIES = ("critical", "error", "warning", "info")


def _iso8601(value: Any) -> bool:
    try:
        datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def pagerduty_errors(event: Any) -> list[str]:
    """What PagerDuty's Events API v2 says is wrong with an event (its wording)."""
    if not isinstance(event, dict):
        return ["Event object is invalid"]
    errors = []
    key = event.get("routing_key")
    if not isinstance(key, str) or len(key) != 32:
        errors.append("Length of 'routing_key' is incorrect (should be 32 characters)")
    action = event.get("event_action")
    if action not in ("trigger", "acknowledge", "resolve"):
        errors.append("'event_action' is invalid (must be one of trigger, acknowledge, resolve)")
    dedup = event.get("dedup_key")
    if dedup is not None and (not isinstance(dedup, str) or not 1 <= len(dedup) <= 255):
        errors.append("'dedup_key' must be 1 to 255 characters")
    if action in ("acknowledge", "resolve") and not dedup:
        errors.append("'dedup_key' is required for acknowledge and resolve")
    if action == "trigger":
        payload = event.get("payload")
        if not isinstance(payload, dict):
            return [*errors, "'payload' is missing or not an object"]
        summary = payload.get("summary")
        if not isinstance(summary, str) or not summary.strip():
            errors.append("'payload.summary' is missing or blank")
        elif len(summary) > 1024:
            errors.append("'payload.summary' must be at most 1024 characters")
        source = payload.get("source")
        if not isinstance(source, str) or not source.strip():
            errors.append("'payload.source' is missing or blank")
        if payload.get("severity") not in PD_SEVERITIES:
            errors.append("'payload.severity' is invalid (must be critical, error, warning, info)")
        if "timestamp" in payload and not _iso8601(payload["timestamp"]):
            errors.append("'payload.timestamp' is not a valid ISO 8601 timestamp")
        details = payload.get("custom_details")
        if details is not None and not isinstance(details, dict):
            errors.append("'payload.custom_details' must be an object")
    return errors


class PagerDutyService(Service):
    """The Events API v2 at ``{base}/v2/enqueue``, keeping incidents by dedup_key."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []
        # Every incident ever opened, in order; at most one per dedup_key is open.
        self.incidents: list[Incident] = []

    def open_incident(self, dedup_key: str) -> Incident | None:
        return next(
            (i for i in self.incidents if i.dedup_key == dedup_key and i.status == "triggered"),
            None,
        )

    def answer(self, request: Request) -> Reply:
        if request.path != "/v2/enqueue":
            return Reply(404, body=b"Not Found")
        event = _json(request)
        if isinstance(event, Exception):
            return self._invalid(["Event object is invalid"])
        errors = pagerduty_errors(event)
        if errors:
            return self._invalid(errors)
        self.events.append(event)
        dedup = event.get("dedup_key") or f"generated-{len(self.events)}"
        incident = self.open_incident(dedup)
        if event["event_action"] == "trigger":
            if incident is None:
                incident = Incident(dedup)
                self.incidents.append(incident)
            incident.alerts.append(event)
        elif event["event_action"] == "resolve" and incident is not None:
            incident.status = "resolved"
        answer = {"status": "success", "message": "Event processed", "dedup_key": dedup}
        return Reply(202, {"content-type": "application/json"}, body=json.dumps(answer).encode())

    @staticmethod
    def _invalid(errors: list[str]) -> Reply:
        answer = {"status": "invalid event", "message": "Event object is invalid", "errors": errors}
        return Reply(400, {"content-type": "application/json"}, body=json.dumps(answer).encode())


# --- Alertmanager ------------------------------------------------------------------------

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


@dataclass
class AmAlert:
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    ends_at: datetime
    updated_at: datetime
    timeout: bool
    generator_url: str | None

    def active(self, at: datetime) -> bool:
        return self.ends_at > at


def _schema_errors(alerts: Any) -> list[str]:
    """The postableAlerts schema of Alertmanager's OpenAPI document."""
    if not isinstance(alerts, list):
        return ["body must be of type array"]
    errors = []
    for i, a in enumerate(alerts):
        if not isinstance(a, dict):
            errors.append(f"{i} must be of type object")
            continue
        if "labels" not in a:
            errors.append(f"{i}.labels in body is required")
        for part in ("labels", "annotations"):
            value = a.get(part, {})
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                errors.append(f"{i}.{part} in body must be a map of strings")
        for stamp in ("startsAt", "endsAt"):
            if stamp in a and not (isinstance(a[stamp], str) and _RFC3339.match(a[stamp])):
                errors.append(f"{i}.{stamp} in body must be of type date-time")
        url = a.get("generatorURL")
        if url is not None and not (isinstance(url, str) and re.match(r"^[a-z][a-z0-9+.-]*:", url)):
            errors.append(f"{i}.generatorURL in body must be of type uri")
    return errors


class AlertmanagerService(Service):
    """Alertmanager's ``POST /api/v2/alerts`` and what it does with the alerts."""

    RESOLVE_TIMEOUT = timedelta(minutes=5)

    def __init__(self) -> None:
        super().__init__()
        self.url = self.base
        self.alerts: dict[frozenset[tuple[str, str]], AmAlert] = {}

    def active(self, at: datetime | None = None) -> list[AmAlert]:
        now = at or datetime.now(UTC)
        return [a for a in self.alerts.values() if a.active(now)]

    def answer(self, request: Request) -> Reply:
        if request.path.split("?")[0] != "/api/v2/alerts":
            return Reply(404, body=b"404 page not found")
        if request.headers.get("content-type", "").split(";")[0] != "application/json":
            return Reply(415, body=b'{"code":415,"message":"unsupported media type"}')
        try:
            body = json.loads(request.body)
        except ValueError:
            return Reply(400, body=b'{"code":400,"message":"parsing alerts body failed"}')
        errors = _schema_errors(body)
        if errors:
            answer = {"code": 422, "message": "validation failure list:\n" + "\n".join(errors)}
            return Reply(422, body=json.dumps(answer).encode())
        now = datetime.now(UTC)
        invalid = []
        for a in body:
            labels = {k: v for k, v in a["labels"].items() if v != ""}  # removeEmptyLabels
            ends = _time(a.get("endsAt"))
            starts = _time(a.get("startsAt")) or ends or now
            timeout = ends is None
            ends = ends or now + self.RESOLVE_TIMEOUT
            problem = None
            if ends < starts:
                problem = "start time must be before end time"
            elif not labels:
                problem = "at least one label pair required"
            elif bad := [n for n in labels if not _LABEL_NAME.match(n)]:
                problem = f'invalid label set: invalid name "{bad[0]}"'
            if problem:
                invalid.append(problem)
                continue
            new = AmAlert(
                labels,
                dict(a.get("annotations", {})),
                starts,
                ends,
                now,
                timeout,
                a.get("generatorURL"),
            )
            fingerprint = frozenset(labels.items())
            old = self.alerts.get(fingerprint)
            self.alerts[fingerprint] = new if old is None else _merge(old, new)
        if invalid:
            return Reply(400, body=json.dumps("; ".join(invalid)).encode())
        return Reply(200)


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value.replace("Z", "+00:00"))


def _merge(old: AmAlert, new: AmAlert) -> AmAlert:
    """Alertmanager's types.Alert.Merge, ``new`` being the younger alert."""
    starts = min(old.starts_at, new.starts_at)
    ends = new.ends_at
    old_resolved = old.ends_at <= new.updated_at
    if new.ends_at <= new.updated_at:  # the new one is resolved
        if old_resolved and old.ends_at > new.ends_at:
            ends = old.ends_at
    elif old.ends_at > new.ends_at and not old.timeout:
        ends = old.ends_at
    return AmAlert(
        new.labels,
        new.annotations,
        starts,
        ends,
        new.updated_at,
        new.timeout,
        new.generator_url,
    )


def make_alert(
    key: str = "1",
    episode: int = 1,
    n: int = 1,
    status: str = "firing",
    severity: str = "warning",
    rule: str = "order_unshipped",
    row: Any = None,
    description: str = "Paid orders not shipped within 48 hours",
) -> dict[str, Any]:
    """An alert as ``deliver.alert_payload`` makes it (a resolved notice: n 0, ``:resolved``)."""
    resolved = status == "resolved"
    return {
        "id": f"{rule}:{key}:e{episode}:" + ("resolved" if resolved else f"n{n}"),
        "status": status,
        "rule": rule,
        "key": key,
        "episode": episode,
        "n": 0 if resolved else n,
        "severity": severity,
        "deadline": "2026-03-01T12:00:00Z",
        "due_at": "2026-03-03T12:00:00Z",
        "fired_at": "2026-03-03T12:00:01Z" if not resolved else "2026-03-04T08:00:00Z",
        "row": {"id": key, "status": "paid"} if row is None else row,
        "description": description,
    }


# --- Microsoft Teams (Workflows webhook) -------------------------------------------------

TEAMS_MESSAGE_LIMIT = 28 * 1024  # Teams refuses a message over about 28 KB
_CARD_ELEMENTS = {"TextBlock", "Container", "FactSet", "ColumnSet", "Column", "Image"}


class CardError(ValueError):
    pass


def check_card_elements(elements: Any, where: str) -> None:
    """The Adaptive Card elements this notifier may use, as the card schema has them."""
    if not isinstance(elements, list):
        raise CardError(f"{where}: must be an array")
    for i, e in enumerate(elements):
        here = f"{where}[{i}]"
        if not isinstance(e, dict) or e.get("type") not in _CARD_ELEMENTS:
            raise CardError(f"{here}.type: unknown element type")
        if e["type"] == "TextBlock":
            if not isinstance(e.get("text"), str) or not e["text"]:
                raise CardError(f"{here}.text: required")
            if e.get("color", "default").lower() not in (
                ["default", "dark", "light", "accent", "good", "warning", "attention"]
            ):
                raise CardError(f"{here}.color: invalid")
        elif e["type"] == "Container":
            check_card_elements(e.get("items"), f"{here}.items")
        elif e["type"] == "FactSet":
            facts = e.get("facts")
            if not isinstance(facts, list) or not all(
                isinstance(f, dict) and isinstance(f.get("title"), str) for f in facts
            ):
                raise CardError(f"{here}.facts: must be title/value pairs")


def check_teams_message(body: Any, size: int) -> None:
    """A Workflows webhook's "post card" body: a message with Adaptive Card attachments."""
    if size > TEAMS_MESSAGE_LIMIT:
        raise CardError("message too large")
    if not isinstance(body, dict) or body.get("type") != "message":
        raise CardError("type: must be 'message'")
    attachments = body.get("attachments")
    if not isinstance(attachments, list) or not attachments:
        raise CardError("attachments: required")
    for a in attachments:
        if not isinstance(a, dict) or a.get("contentType") != (
            "application/vnd.microsoft.card.adaptive"
        ):
            raise CardError("attachments.contentType: must be an Adaptive Card")
        card = a.get("content")
        if not isinstance(card, dict) or card.get("type") != "AdaptiveCard":
            raise CardError("content.type: must be 'AdaptiveCard'")
        if card.get("version") not in ("1.0", "1.1", "1.2", "1.3", "1.4", "1.5"):
            raise CardError("content.version: not a version Teams renders")
        check_card_elements(card.get("body"), "content.body")


class TeamsService(Service):
    """A Workflows "When a Teams webhook request is received" trigger: the ``sig``
    in the query is the credential (401), a bad body a 400, an accepted card 202."""

    WORKFLOW = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
    SIG = "S1gTeamsWorkflowS3cret00000000000000000000x"

    def __init__(self) -> None:
        super().__init__()
        self.path = f"/workflows/{self.WORKFLOW}/triggers/manual/paths/invoke"
        self.url = (
            f"{self.base}{self.path}?api-version=2016-06-01"
            f"&sp=%2Ftriggers%2Fmanual%2Frun&sv=1.0&sig={self.SIG}"
        )
        self.messages: list[dict[str, Any]] = []
        self.refusals: list[str] = []

    def cards(self) -> list[dict[str, Any]]:
        return [m["attachments"][0]["content"] for m in self.messages]

    def answer(self, request: Request) -> Reply:
        def refuse(status: int, code: str, why: str) -> Reply:
            self.refusals.append(f"{code}: {why}")
            answer = {"error": {"code": code, "message": why}}
            body = json.dumps(answer).encode()
            return Reply(status, {"content-type": "application/json"}, body=body)

        path, _, query = request.path.partition("?")
        if path != self.path:
            return refuse(404, "WorkflowNotFound", "The workflow could not be found.")
        params = dict(p.partition("=")[::2] for p in query.split("&") if p)
        if params.get("sig") != self.SIG or params.get("api-version") != "2016-06-01":
            return refuse(401, "DirectApiAuthorizationRequired", "The request must be signed.")
        body = _json(request)
        if isinstance(body, Exception):
            return refuse(400, "InvalidRequestContent", "The request content is not valid JSON.")
        try:
            check_teams_message(body, len(request.body))
        except CardError as exc:
            return refuse(400, "InvalidRequestContent", str(exc))
        self.messages.append(body)
        return Reply(202)


# --- Opsgenie (Alert API v2) -------------------------------------------------------------

OG_LIMITS = {"message": 130, "alias": 512, "description": 15000, "source": 100, "entity": 512}


def opsgenie_errors(body: Any) -> dict[str, str]:
    """What Opsgenie's create-alert validation says, field by field."""
    if not isinstance(body, dict):
        return {"body": "must be an object"}
    errors = {}
    message = body.get("message")
    if not isinstance(message, str) or not message.strip():
        errors["message"] = "Message can not be empty."
    for name, limit in OG_LIMITS.items():
        value = body.get(name)
        if value is not None and (not isinstance(value, str) or len(value) > limit):
            errors[name] = f"{name} can not be longer than {limit} characters."
    if body.get("priority", "P3") not in ("P1", "P2", "P3", "P4", "P5"):
        errors["priority"] = "Priority should be one of [P1, P2, P3, P4, P5]"
    tags = body.get("tags", [])
    if not isinstance(tags, list) or len(tags) > 20:
        errors["tags"] = "Tags can not be more than 20."
    elif any(not isinstance(t, str) or len(t) > 50 for t in tags):
        errors["tags"] = "Tag can not be longer than 50 characters."
    details = body.get("details", {})
    if not isinstance(details, dict) or not all(isinstance(v, str) for v in details.values()):
        errors["details"] = "Details must be a map of strings."
    elif sum(len(k) + len(v) for k, v in details.items()) > 8000:
        errors["details"] = "Details can not be longer than 8000 characters."
    return errors


@dataclass
class OgAlert:
    alias: str
    create: dict[str, Any]
    status: str = "open"  # open | closed
    count: int = 1


class OpsgenieService(Service):
    """``POST /v2/alerts`` and ``POST /v2/alerts/{alias}/close?identifierType=alias``,
    keeping alerts as Opsgenie does: one open alert per alias, a repeat raises its count."""

    KEY = "0b5c3f9e-1d2a-4e6b-8c7d-S3cretGenieK3y"

    def __init__(self) -> None:
        super().__init__()
        self.creates: list[dict[str, Any]] = []
        self.closes: list[tuple[str, dict[str, Any]]] = []
        self.alerts: list[OgAlert] = []  # every alert ever opened, in order

    def open_alert(self, alias: str) -> OgAlert | None:
        return next((a for a in self.alerts if a.alias == alias and a.status == "open"), None)

    def _reply(self, status: int, answer: dict[str, Any]) -> Reply:
        answer = {**answer, "took": 0.01, "requestId": f"req-{len(self.requests)}"}
        body = json.dumps(answer).encode()
        return Reply(status, {"content-type": "application/json"}, body=body)

    def answer(self, request: Request) -> Reply:
        from urllib.parse import parse_qs, unquote

        if request.headers.get("authorization") != f"GenieKey {self.KEY}":
            return self._reply(401, {"message": "Could not authenticate"})
        path, _, query = request.path.partition("?")
        body = _json(request)
        if isinstance(body, Exception):
            return self._reply(400, {"message": "Invalid JSON or content type"})
        if path == "/v2/alerts":
            errors = opsgenie_errors(body)
            if errors:
                why = "Request has not been processed due to validation error."
                return self._reply(422, {"message": why, "errors": errors})
            self.creates.append(body)
            alias = body.get("alias") or body["message"]
            alert = self.open_alert(alias)
            if alert is None:
                self.alerts.append(OgAlert(alias, body))
            else:
                alert.count += 1
            return self._reply(202, {"result": "Request will be processed"})
        parts = path.split("/")
        if len(parts) == 5 and parts[:3] == ["", "v2", "alerts"] and parts[4] == "close":
            if parse_qs(query).get("identifierType") != ["alias"]:
                # Without it the identifier is read as the alert's id: it would not match.
                return self._reply(404, {"message": "Alert does not exist"})
            if not isinstance(body, dict):
                return self._reply(422, {"message": "body must be an object"})
            alias = unquote(parts[3])
            self.closes.append((alias, body))
            alert = self.open_alert(alias)
            if alert is not None:
                alert.status = "closed"
            # Asynchronous: a close of no open alert is accepted (and fails later).
            return self._reply(202, {"result": "Request will be processed"})
        return self._reply(404, {"message": "Not found"})
