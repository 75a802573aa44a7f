"""The e-mail notifier: one digest per batch, plain text and HTML, grouped by rule."""

from __future__ import annotations

import html
import logging
import smtplib
from collections import defaultdict
from email.message import EmailMessage
from email.utils import make_msgid
from typing import Any

from slawatch.config.notifiers import EmailConfig
from slawatch.delivery.notifiers.base import (
    BaseNotifier,
    is_resolved,
    is_summary,
    number,
    tls_context,
)
from slawatch.errors import DeliveryError

log = logging.getLogger(__name__)


def subject(prefix: str, alerts: list[dict[str, Any]]) -> str:
    """``[slawatch] 3 overdue: order_unshipped`` or ``... 5 overdue: a (3), b (2)``."""
    by_rule: dict[str, int] = defaultdict(int)
    for a in alerts:
        by_rule[a["rule"]] += 1
    if len(by_rule) == 1:
        rules = next(iter(by_rule))
    else:
        rules = ", ".join(f"{r} ({c})" for r, c in sorted(by_rule.items(), key=lambda x: -x[1]))
    firing = [a for a in alerts if not is_resolved(a)]
    critical = any(a["severity"] == "critical" for a in firing)
    # A storm summary stands for `count` overdue rows.
    overdue = sum(a["count"] if is_summary(a) else 1 for a in firing)
    storm = " (storm)" if any(is_summary(a) for a in firing) else ""
    counts = [f"{overdue:,} overdue{storm}"] if firing else []
    if len(firing) < len(alerts):
        counts.append(f"{len(alerts) - len(firing)} resolved")
    return f"{prefix} {'CRITICAL: ' if critical else ''}{', '.join(counts)}: {rules}".strip()


def _groups(alerts: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for a in alerts:
        groups[a["rule"]].append(a)
    return dict(sorted(groups.items()))


def _columns(group: list[dict[str, Any]]) -> list[str]:
    cols: list[str] = []
    for a in group:
        cols.extend(c for c in a["row"] if c not in cols)
    return cols


def _storms(alerts: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The storm summaries and the other alerts: a summary's listed alerts join the
    others (shown in its rule's table) and its description goes above them."""
    storms = [a for a in alerts if is_summary(a)]
    rest = [a for a in alerts if not is_summary(a)]
    return storms, rest + [f for s in storms for f in s["first"]]


def plain_text(alerts: list[dict[str, Any]]) -> str:
    storms, alerts = _storms(alerts)
    out = [f"STORM: {s['description']}\n" for s in storms]
    for rule, group in _groups(alerts).items():
        desc = group[0].get("description") or ""
        out.append(f"{rule}: {len(group)} overdue" + (f" - {desc}" if desc else ""))
        for a in group:
            row = ", ".join(f"{k}={v}" for k, v in a["row"].items())
            out.append(f"  [{a['severity']}] key {a['key']} {number(a)} due {a['due_at']}  {row}")
        out.append("")
    return "\n".join(out)


def html_body(alerts: list[dict[str, Any]]) -> str:
    e = html.escape
    parts = ["<html><body style='font-family:sans-serif'>"]
    storms, alerts = _storms(alerts)
    for s in storms:
        link = f" <a href='{e(s['link'])}'>All of them</a>" if s.get("link") else ""
        parts.append(f"<p><b>Storm:</b> {e(s['description'])}{link}</p>")
    for rule, group in _groups(alerts).items():
        desc = group[0].get("description") or ""
        parts.append(f"<h3>{e(rule)}: {len(group)} overdue</h3>")
        if desc:
            parts.append(f"<p>{e(desc)}</p>")
        cols = _columns(group)
        head = "".join(f"<th>{e(c)}</th>" for c in ["key", "#", "severity", "due", *cols])
        parts.append(f"<table border='1' cellpadding='4' cellspacing='0'><tr>{head}</tr>")
        for a in group:
            cells = [
                a["key"],
                number(a),
                a["severity"],
                a["due_at"],
                *(a["row"].get(c) for c in cols),
            ]
            parts.append("<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in cells) + "</tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


class EmailNotifier(BaseNotifier):
    """Sends a digest to every recipient over SMTP."""

    def __init__(self, config: EmailConfig) -> None:
        super().__init__(config)
        self.config = config
        # Built once: a ca_file that holds no certificate fails here, at the start.
        self._tls = tls_context(config.ca_file) if config.security != "none" else None

    def message(self, alerts: list[dict[str, Any]]) -> EmailMessage:
        c = self.config
        msg = EmailMessage()
        msg["Subject"] = subject(c.subject_prefix, alerts)
        msg["From"] = c.from_
        msg["To"] = ", ".join(c.to)
        msg["Message-ID"] = make_msgid(domain="slawatch")
        msg.set_content(plain_text(alerts))
        msg.add_alternative(html_body(alerts), subtype="html")
        return msg

    def send(self, alerts: list[dict[str, Any]]) -> None:
        c = self.config
        try:
            smtp: smtplib.SMTP
            if c.security == "tls":
                smtp = smtplib.SMTP_SSL(
                    c.host,
                    c.effective_port,
                    timeout=self.timeout,
                    context=self._tls,
                )
            else:
                smtp = smtplib.SMTP(c.host, c.effective_port, timeout=self.timeout)
            with smtp:
                if c.security == "starttls":
                    smtp.starttls(context=self._tls)
                if c.username is not None and c.password is not None:
                    smtp.login(c.username, c.password.get_secret_value())
                refused = smtp.send_message(self.message(alerts))
        except smtplib.SMTPRecipientsRefused as exc:
            raise DeliveryError(
                f"every recipient refused: {', '.join(exc.recipients)}", permanent=True
            ) from exc
        except smtplib.SMTPResponseException as exc:
            text = (
                exc.smtp_error.decode(errors="replace")
                if isinstance(exc.smtp_error, bytes)
                else str(exc.smtp_error)
            )
            raise DeliveryError(
                self.scrub(f"SMTP {exc.smtp_code}: {text}"), permanent=500 <= exc.smtp_code < 600
            ) from exc
        except (OSError, smtplib.SMTPException) as exc:
            raise DeliveryError(self.scrub(f"{type(exc).__name__}: {exc}")) from exc
        if refused:
            # Some recipients took it: the alert was delivered; say who did not.
            log.warning("notifier %s: recipients refused: %s", self.name, ", ".join(refused))
