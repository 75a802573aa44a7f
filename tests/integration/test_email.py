"""The e-mail notifier against a real SMTP server (aiosmtpd) in a thread."""

from __future__ import annotations

import email
import email.policy
from collections.abc import Iterator
from email.message import EmailMessage
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from slawatch.config.notifiers import EmailConfig
from slawatch.delivery.notifiers.email import EmailNotifier
from slawatch.errors import DeliveryError
from tests.receivers import closed_port


class Inbox:
    """An aiosmtpd handler that keeps every message; refuses recipients at @nowhere."""

    def __init__(self) -> None:
        self.envelopes: list[tuple[str, list[str], EmailMessage]] = []

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:
        if address.endswith("@nowhere.example"):
            return "550 no such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos), msg))  # type: ignore[arg-type]
        return "250 Message accepted"


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    port = closed_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


def alert(rule: str, key: int, severity: str = "warning") -> dict[str, Any]:
    return {
        "id": f"{rule}:{key}:1",
        "rule": rule,
        "key": str(key),
        "n": 1,
        "severity": severity,
        "deadline": "2026-03-01T12:00:00Z",
        "due_at": "2026-03-03T12:00:00Z",
        "fired_at": "2026-03-03T12:00:01Z",
        "row": {"id": key, "note": "<b>fragile</b>"},
        "description": f"{rule} description",
    }


def notifier(port: int, **fields: Any) -> EmailNotifier:
    base = {
        "name": "ops-mail",
        "type": "email",
        "host": "127.0.0.1",
        "port": port,
        "security": "none",
        "from": "slawatch@shop.example",
        "to": ["ops@shop.example", "lead@shop.example"],
    }
    return EmailNotifier(EmailConfig.model_validate(base | fields))


def test_one_digest_with_text_and_html_to_every_recipient(smtp: tuple[Inbox, int]) -> None:
    inbox, port = smtp
    alerts = [
        alert("order_unshipped", 1),
        alert("order_unshipped", 2),
        alert("job_hung", 9, "critical"),
    ]
    notifier(port).send(alerts)
    ((mail_from, rcpts, msg),) = inbox.envelopes
    assert mail_from == "slawatch@shop.example"
    assert sorted(rcpts) == ["lead@shop.example", "ops@shop.example"]
    assert msg["Subject"] == "[slawatch] CRITICAL: 3 overdue: order_unshipped (2), job_hung (1)"
    text = msg.get_body(preferencelist=("plain",))
    html = msg.get_body(preferencelist=("html",))
    assert text is not None and html is not None
    plain = text.get_content()
    assert "order_unshipped: 2 overdue - order_unshipped description" in plain
    assert "[critical] key 9 #1 due 2026-03-03T12:00:00Z" in plain
    markup = html.get_content()
    assert "<h3>job_hung: 1 overdue</h3>" in markup
    assert "&lt;b&gt;fragile&lt;/b&gt;" in markup and "<b>fragile</b>" not in markup  # escaped
    assert markup.index("job_hung") < markup.index("order_unshipped")  # grouped by rule


def test_single_rule_subject(smtp: tuple[Inbox, int]) -> None:
    inbox, port = smtp
    notifier(port, subject_prefix="[shop]").send([alert("refund_unprocessed", 1)])
    assert inbox.envelopes[0][2]["Subject"] == "[shop] 1 overdue: refund_unprocessed"


def test_rejected_recipients_are_a_permanent_failure(smtp: tuple[Inbox, int]) -> None:
    inbox, port = smtp
    with pytest.raises(DeliveryError) as exc:
        notifier(port, to=["a@nowhere.example"]).send([alert("job_hung", 1)])
    assert exc.value.permanent
    assert "a@nowhere.example" in str(exc.value)
    assert inbox.envelopes == []


def test_some_recipients_refused_still_delivers_to_the_others(smtp: tuple[Inbox, int]) -> None:
    inbox, port = smtp
    notifier(port, to=["ops@shop.example", "x@nowhere.example"]).send([alert("job_hung", 1)])
    assert inbox.envelopes[0][1] == ["ops@shop.example"]


def test_server_down_is_retried() -> None:
    with pytest.raises(DeliveryError) as exc:
        notifier(closed_port(), timeout="2s").send([alert("job_hung", 1)])
    assert not exc.value.permanent
    assert "ConnectionRefusedError" in str(exc.value)


class Authenticator:
    """Accepts one user/password pair (aiosmtpd's authenticator protocol)."""

    def __call__(self, server: Any, session: Any, envelope: Any, mechanism: str, auth: Any) -> Any:
        from aiosmtpd.smtp import AuthResult

        ok = auth.login == b"slawatch" and auth.password == b"s3cret-pw"
        return AuthResult(success=ok)


@pytest.fixture
def ca(tmp_path: Any) -> Any:
    import trustme

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    return ca


def test_starttls_with_login(ca: Any, tmp_path: Any) -> None:
    import ssl

    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    inbox, port = Inbox(), closed_port()
    controller = Controller(
        inbox,
        hostname="127.0.0.1",
        port=port,
        tls_context=server_ctx,
        require_starttls=True,
        authenticator=Authenticator(),
        auth_required=True,
    )
    controller.start()
    try:
        ca_file = str(tmp_path / "ca.pem")
        notifier(
            port, security="starttls", username="slawatch", password="s3cret-pw", ca_file=ca_file
        ).send([alert("job_hung", 1)])
        assert len(inbox.envelopes) == 1
        with pytest.raises(DeliveryError) as exc:  # not trusting the server's CA: retried
            notifier(port, security="starttls", username="slawatch", password="s3cret-pw").send(
                [alert("job_hung", 3)]
            )
        assert "CERTIFICATE_VERIFY_FAILED" in str(exc.value)
    finally:
        controller.stop()


def test_implicit_tls(ca: Any, tmp_path: Any) -> None:
    import ssl

    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    inbox, port = Inbox(), closed_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port, ssl_context=server_ctx)
    controller.start()
    try:
        notifier(port, security="tls", ca_file=str(tmp_path / "ca.pem")).send(
            [alert("job_hung", 1)]
        )
        assert len(inbox.envelopes) == 1
    finally:
        controller.stop()
