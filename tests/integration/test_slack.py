"""The Slack notifier against a local incoming webhook that checks Block Kit as Slack does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from freezegun import freeze_time

from slawatch.clock import Clock
from slawatch.config.notifiers import SlackConfig
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_due, deliver_notifier
from slawatch.delivery.notifiers.slack import SlackNotifier
from slawatch.errors import DeliveryError
from tests.integration.helpers import Conn
from tests.integration.test_deliver import CLAIMED
from tests.integration.test_pagerduty import OUTBOXES, last_errors, overdue_orders, statuses
from tests.receivers import Reply, closed_port
from tests.services import SlackService, make_alert


@pytest.fixture
def slack() -> Iterator[SlackService]:
    with SlackService() as s:
        yield s


def notifier(url: str, **fields: Any) -> SlackNotifier:
    return SlackNotifier(
        SlackConfig.model_validate({"name": "slack", "type": "slack", "url": url} | fields)
    )


def sections(message: dict[str, Any]) -> list[str]:
    return [b["text"]["text"] for b in message["blocks"] if b["type"] == "section"]


def test_one_alert_is_a_header_and_a_section(slack: SlackService) -> None:
    hook = notifier(slack.url)
    hook.send([make_alert("1042", n=3, severity="critical")])
    (message,) = slack.messages
    header = message["blocks"][0]
    assert header == {
        "type": "header",
        "text": {
            "type": "plain_text",
            "text": "order_unshipped: key 1042 overdue (critical)",
            "emoji": True,
        },
    }
    (text,) = sections(message)
    assert text.startswith(":red_circle: *critical* · *order_unshipped* · key `1042`\n")
    assert "Overdue since 2026-03-03T12:00:00Z (episode 1, notification 3)" in text
    assert "Paid orders not shipped within 48 hours" in text
    assert '```{"id": "1042", "status": "paid"}```' in text
    assert message["text"].startswith("order_unshipped: key 1042 overdue (critical)\n")
    hook.close()


def test_a_resolved_notice_says_so(slack: SlackService) -> None:
    hook = notifier(slack.url)
    hook.send([make_alert("7", status="resolved")])
    (message,) = slack.messages
    assert message["blocks"][0]["text"]["text"] == "order_unshipped: key 7 resolved"
    (text,) = sections(message)
    assert text.startswith(":white_check_mark: *resolved* · *order_unshipped* · key `7`")
    assert "Ended by 2026-03-04T08:00:00Z (episode 1)" in text
    hook.close()


def test_a_big_batch_with_huge_values_stays_within_slacks_limits(slack: SlackService) -> None:
    """60 alerts with 10 kB keys, rows and descriptions: Slack takes the message (at most 50
    blocks, every text within its limit), listing ``listed`` of them and counting the rest."""
    huge = "x" * 10_000
    alerts = [
        make_alert(f"{i}-{huge}", row={"note": huge}, description=huge, rule=f"rule_{i % 3}")
        for i in range(60)
    ]
    hook = notifier(slack.url, listed=45)
    hook.send(alerts)
    assert slack.refusals == []
    (message,) = slack.messages
    assert len(message["blocks"]) == 47  # header, 45 alerts, the count of the rest
    assert message["blocks"][-1]["elements"][0]["text"] == "+15 more in this batch, not listed"
    assert message["blocks"][0]["text"]["text"] == "60 overdue: rule_0, rule_1, rule_2"
    assert all(len(t) <= 3000 for t in sections(message))
    assert all(t.endswith("…```") for t in sections(message))  # the row, cut, still closed
    assert len(message["text"]) <= 3000
    hook.send([make_alert(huge, row={"note": huge}, description=huge)])  # one alert alone
    assert slack.refusals == []
    assert len(slack.messages[1]["blocks"][0]["text"]["text"]) == 150
    hook.close()


def test_markup_in_the_data_is_shown_not_obeyed(slack: SlackService) -> None:
    """A row saying <!channel> must not page the whole channel."""
    hook = notifier(slack.url)
    hook.send([make_alert("a<b>&c", row={"note": "<!channel> <https://evil|click>"})])
    (text,) = sections(slack.messages[0])
    assert "<!channel>" not in text and "<https://evil" not in text
    assert "&lt;!channel&gt;" in text and "key `a&lt;b&gt;&amp;c`" in text
    assert "<!channel>" not in slack.messages[0]["text"]
    hook.close()


@pytest.mark.parametrize("outbox", OUTBOXES)
def test_batches_from_the_outbox_are_one_message_each(
    conn: Conn, db: Database, slack: SlackService, outbox: Outbox
) -> None:
    overdue_orders(conn, 25, "slack", outbox)
    hook = notifier(slack.url, batch=20)
    with freeze_time(CLAIMED):
        assert deliver_due(db, {"slack": hook}, Clock()).sent == 25
    assert [len(m["blocks"]) for m in slack.messages] == [12, 6]  # header + 10 (+ rest), 1 + 5
    assert slack.messages[0]["blocks"][-1]["elements"][0]["text"].startswith("+10 more")
    assert statuses(conn) == {"sent": 25}
    hook.close()


@pytest.mark.parametrize(
    ("reply", "permanent", "wait"),
    [
        (Reply(400, body=b"invalid_payload"), True, None),
        (Reply(404, body=b"no_service"), True, None),
        (Reply(410, body=b"channel_is_archived"), True, None),
        (Reply(429, {"Retry-After": "30"}, body=b"rate_limited"), False, 30),
        (Reply(500, body=b"rollup_error"), False, None),
    ],
)
def test_slacks_answers(
    slack: SlackService, reply: Reply, permanent: bool, wait: float | None
) -> None:
    slack.replies = [reply]
    hook = notifier(slack.url)
    with pytest.raises(DeliveryError) as exc:
        hook.send([make_alert()])
    assert exc.value.permanent is permanent
    assert exc.value.retry_after == wait
    assert reply.body.decode() in str(exc.value)
    hook.close()


@pytest.mark.parametrize("outbox", OUTBOXES)
def test_a_wrong_token_is_dead_at_once_and_the_url_never_shows(
    conn: Conn, db: Database, slack: SlackService, outbox: Outbox
) -> None:
    overdue_orders(conn, 1, "slack", outbox)
    wrong = slack.url.replace(SlackService.TOKEN, "WrongTokenS3cret")
    hook = notifier(wrong)
    # Slack's error page (as a careless proxy's would) repeating the path.
    slack.replies = [Reply(403, echo=False, body=f"invalid_token for {wrong}".encode())]
    with freeze_time(CLAIMED):
        assert deliver_notifier(db, hook, Clock()).dead == 1
    (error,) = last_errors(conn)
    assert "WrongTokenS3cret" not in error and "/services/" not in error, error
    assert error.startswith("HTTP 403 Forbidden: invalid_token for http://127.0.0.1:")
    hook.close()
    # Unreachable: where it failed, without the path.
    port = closed_port()
    down = notifier(f"http://127.0.0.1:{port}/services/T1/B1/DownS3cret")
    with pytest.raises(DeliveryError) as exc:
        down.send([make_alert()])
    assert not exc.value.permanent
    assert "DownS3cret" not in str(exc.value)
    assert str(exc.value).endswith(f"(POST http://127.0.0.1:{port}/…)")
    down.close()


def test_the_service_refuses_what_slack_refuses(slack: SlackService) -> None:
    """The stand-in's checks are real: a message over Slack's limits is refused."""
    hook = notifier(slack.url)
    too_many = {"text": "x", "blocks": [{"type": "divider"}] * 51}
    header = {"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}
    section = {"type": "section", "text": {"type": "mrkdwn", "text": "s" * 3001}}
    long_header, long_section = {"blocks": [header]}, {"blocks": [section]}
    for body in (too_many, long_header, long_section, {"blocks": []}, {}):
        with pytest.raises(DeliveryError, match="HTTP 400") as exc:
            hook.post(hook.url, json.dumps(body).encode())
        assert exc.value.permanent
    assert len(slack.refusals) == 5
    hook.close()
