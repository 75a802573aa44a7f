"""The Teams notifier against a local Workflows webhook that checks the message and
its Adaptive Card as Teams does."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from freezegun import freeze_time

from slawatch.clock import Clock
from slawatch.config.notifiers import TeamsConfig
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_due, deliver_notifier
from slawatch.delivery.notifiers.teams import TeamsNotifier
from slawatch.errors import DeliveryError
from tests.integration.helpers import Conn
from tests.integration.test_deliver import CLAIMED
from tests.integration.test_pagerduty import OUTBOXES, last_errors, overdue_orders, statuses
from tests.receivers import Reply, closed_port
from tests.services import TEAMS_MESSAGE_LIMIT, TeamsService, make_alert


@pytest.fixture
def teams() -> Iterator[TeamsService]:
    with TeamsService() as s:
        yield s


def notifier(url: str, **fields: Any) -> TeamsNotifier:
    return TeamsNotifier(
        TeamsConfig.model_validate({"name": "teams", "type": "teams", "url": url} | fields)
    )


def texts(element: dict[str, Any]) -> list[str]:
    """Every TextBlock's text under ``element``, in order."""
    if element["type"] == "TextBlock":
        return [element["text"]]
    return [t for item in element.get("items", element.get("body", [])) for t in texts(item)]


def test_one_alert_is_a_card_with_a_title_and_the_alert(teams: TeamsService) -> None:
    hook = notifier(teams.url)
    hook.send([make_alert("1042", n=3, severity="critical")])
    (message,) = teams.messages
    assert message["type"] == "message"
    (attachment,) = message["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert (card["type"], card["version"]) == ("AdaptiveCard", "1.4")
    title, container = card["body"]
    assert title["text"] == "order_unshipped: key 1042 overdue (critical)"
    first = container["items"][0]
    assert (first["text"], first["color"]) == (
        "critical · order_unshipped · key 1042",
        "attention",
    )
    assert texts(container)[1:] == [
        "Overdue since 2026-03-03T12:00:00Z (episode 1, notification 3)",
        "Paid orders not shipped within 48 hours",
        '{"id": "1042", "status": "paid"}',
    ]
    hook.close()


def test_a_resolved_notice_posts_a_resolved_card(teams: TeamsService) -> None:
    hook = notifier(teams.url)
    hook.send([make_alert("7", status="resolved")])
    (card,) = teams.cards()
    title, container = card["body"]
    assert title["text"] == "order_unshipped: key 7 resolved"
    first = container["items"][0]
    assert (first["text"], first["color"]) == ("resolved · order_unshipped · key 7", "good")
    assert "Ended by 2026-03-04T08:00:00Z (episode 1)" in texts(container)
    hook.close()


def test_a_big_batch_with_huge_values_stays_within_teams_limits(teams: TeamsService) -> None:
    """30 alerts with 10 kB keys, rows and descriptions of characters that take 4 bytes
    or a JSON escape each: Teams takes the card (under 28 KB), listing 10 of them and
    counting the rest."""
    huge = '\U0001f525"\x01' * 3_400
    alerts = [
        make_alert(f"{i}-{huge}", row={"note": huge}, description=huge, rule=f"rule_{i % 3}")
        for i in range(30)
    ]
    hook = notifier(teams.url, batch=30)
    hook.send(alerts)
    (request,) = teams.requests
    assert len(request.body) <= TEAMS_MESSAGE_LIMIT
    (card,) = teams.cards()
    containers = [e for e in card["body"] if e["type"] == "Container"]
    assert len(containers) == 10
    assert card["body"][-1]["text"] == "+20 more in this batch, not listed"
    assert card["body"][0]["text"] == "30 overdue: rule_0, rule_1, rule_2"
    hook.close()


@pytest.mark.parametrize("outbox", OUTBOXES)
def test_batches_from_the_outbox_one_card_per_batch(
    conn: Conn, db: Database, teams: TeamsService, outbox: Outbox
) -> None:
    overdue_orders(conn, 25, "teams", outbox)
    hook = notifier(teams.url)  # batch 20 by default
    with freeze_time(CLAIMED):
        assert deliver_due(db, {"teams": hook}, Clock()).sent == 25
    assert [len(c["body"]) for c in teams.cards()] == [1 + 10 + 1, 1 + 5]
    assert statuses(conn) == {"sent": 25}
    hook.close()


@pytest.mark.parametrize("outbox", OUTBOXES)
def test_a_refused_card_is_dead_at_once_and_the_signature_never_shows(
    conn: Conn,
    db: Database,
    teams: TeamsService,
    caplog: pytest.LogCaptureFixture,
    outbox: Outbox,
) -> None:
    overdue_orders(conn, 1, "teams", outbox)
    # A 400 repeating the request's URL, as a gateway's error page might.
    answer = {"error": {"code": "InvalidRequestContent", "message": teams.url}}
    teams.replies = [Reply(400, body=json.dumps(answer).encode())]
    hook = notifier(teams.url)
    with freeze_time(CLAIMED), caplog.at_level(logging.DEBUG):
        assert deliver_notifier(db, hook, Clock()).dead == 1
    (error,) = last_errors(conn)
    assert error.startswith('HTTP 400 Bad Request: {"error": {"code": "InvalidRequestContent"')
    assert TeamsService.SIG not in error
    assert f'"message": "{teams.base}/…"' in error  # the URL as errors show it
    # slawatch's own lines (logs.py keeps httpx's, which show the URL, at WARNING).
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("slawatch"))
    assert "dead" in logged and TeamsService.SIG not in logged
    assert statuses(conn) == {"dead": 1}
    hook.close()


def test_a_wrong_signature_is_dead(teams: TeamsService) -> None:
    hook = notifier(teams.url.replace(TeamsService.SIG, "S1gWrongWorkflowSignature000000"))
    with pytest.raises(DeliveryError, match="HTTP 401") as exc:
        hook.send([make_alert()])
    assert exc.value.permanent
    assert teams.messages == []
    hook.close()


def test_a_receiver_down_is_retried_and_its_url_shows_without_the_signature() -> None:
    port = closed_port()
    url = f"http://127.0.0.1:{port}/workflows/w1/triggers/manual/paths/invoke?sig=DownS1gSecret"
    down = notifier(url)
    with pytest.raises(DeliveryError) as exc:
        down.send([make_alert()])
    assert not exc.value.permanent
    assert "DownS1gSecret" not in str(exc.value)
    assert str(exc.value).endswith(f"(POST http://127.0.0.1:{port}/…)")
    down.close()


@pytest.mark.parametrize(
    ("reply", "permanent", "wait"),
    [
        (Reply(429, {"Retry-After": "20"}), False, 20),
        (Reply(429), False, None),
        (Reply(500), False, None),
        (Reply(502), False, None),
        (Reply(400), True, None),
        (Reply(404), True, None),
    ],
)
def test_teams_answers(
    teams: TeamsService, reply: Reply, permanent: bool, wait: float | None
) -> None:
    teams.replies = [reply]
    hook = notifier(teams.url)
    with pytest.raises(DeliveryError) as exc:
        hook.send([make_alert()])
    assert (exc.value.permanent, exc.value.retry_after) == (permanent, wait)
    hook.close()


def test_the_service_refuses_what_teams_refuses(teams: TeamsService) -> None:
    hook = notifier(teams.url)
    card = {"type": "AdaptiveCard", "version": "1.4", "body": [{"type": "TextBlock", "text": "t"}]}
    kind = "application/vnd.microsoft.card.adaptive"
    good = {"type": "message", "attachments": [{"contentType": kind, "content": card}]}
    attachment = good["attachments"][0]  # type: ignore[index]
    big = {"type": "TextBlock", "text": "x" * 30_000}  # over 28 KB
    bad = [
        good | {"type": "card"},
        good | {"attachments": []},
        good | {"attachments": [attachment | {"contentType": "text/plain"}]},
        good | {"attachments": [attachment | {"content": card | {"version": "2.0"}}]},
        good | {"attachments": [attachment | {"content": card | {"body": [{"type": "Blink"}]}}]},
        good | {"attachments": [attachment | {"content": card | {"body": [big]}}]},
    ]
    for body in bad:
        with pytest.raises(DeliveryError, match="HTTP 400") as exc:
            hook.post(hook.url, json.dumps(body).encode())
        assert exc.value.permanent
    hook.post(hook.url, json.dumps(good).encode())
    assert len(teams.messages) == 1
    hook.close()
