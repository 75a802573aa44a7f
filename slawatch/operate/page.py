"""The on-call page at ``/`` of the admin server: each rule's state, a chart of its
alerts per hour, the SLA chart (breaches per day and compliance, drawn by
``web/page.js`` from ``/v1/report``), the recent alerts with their deliveries, the attempts of the
action each triggered, acks and silences.

Rendered on the server with f-strings, every value through :func:`esc`
(``html.escape``): the page is one screen of markup, and a template engine would
be a dependency for a few loops. Anything that came from the database (row
values, keys, comments, error texts) reaches the HTML only escaped; the little
JavaScript (``web/page.js``, no build step, nothing fetched from elsewhere) reads
ids from ``data-`` attributes and writes only ``textContent``. The
Content-Security-Policy allows scripts and styles from this server only, so an
escaping slip could still not run a script.

The buttons call the JSON API (``/v1/alerts/{id}/ack``, ``/v1/silences``) with
``fetch``. With ``SLAWATCH_API_TOKEN`` a browser logs in once: ``POST /login``
checks the token and sets an HttpOnly, SameSite=Strict cookie holding a random
session id (:mod:`slawatch.operate.session`: kept in the database, ended by logout or after
12 hours), which the admin API accepts beside the Bearer header. A write carried by
that cookie must also carry the ``X-Slawatch-Page`` header, which no form of
another site can send (and a cross-origin ``fetch`` with it needs a CORS
preflight that this server never grants); every write whose ``Origin`` is not
this server is refused too (see ``admin.refusal``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html import escape
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlencode

from slawatch.actions.history import ActionAttempt
from slawatch.operate.inspect import Alert, EpisodeAck, HourlyAlerts, RuleStatus
from slawatch.operate.lifecycle import Silence
from slawatch.operate.session import SESSION_AGE

COOKIE = "slawatch_session"
PAGE_HEADER = "X-Slawatch-Page"
COOKIE_AGE = SESSION_AGE  # the browser forgets the cookie when the session ends
PAGE_ALERTS = 30  # alerts per page of the list
# Rows of the rules table: every rule that needs a look, then quiet rules up to this
# many rows in all; the other quiet rules are one link each, folded (2,000 rules in
# full made a page of 9 MB, mostly their charts).
FULL_RULES = 50
MAX_LOGIN_BODY = 4096

_WEB = resources.files("slawatch.operate").joinpath("web")
STATIC = {
    "page.css": (_WEB.joinpath("page.css").read_bytes(), "text/css; charset=utf-8"),
    "page.js": (_WEB.joinpath("page.js").read_bytes(), "text/javascript; charset=utf-8"),
}
STATIC_PATHS = {f"/static/{name}" for name in STATIC}

# Every HTML answer: nothing but this server's own scripts, styles and connections.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def esc(value: object) -> str:
    """``value`` as HTML text or attribute value (quotes escaped too)."""
    return escape(str(value), quote=True)


def login_token(body: bytes) -> str | None:
    """The ``token`` field of an url-encoded login form (None: none given)."""
    try:
        fields = parse_qs(body.decode("utf-8", errors="replace"), max_num_fields=4)
    except ValueError:  # more fields than a login form has
        return None
    values = fields.get("token")
    return values[0] if values else None


# ---------------------------------------------------------------- pieces


def _when(value: datetime | None, now: datetime) -> str:
    """A time as UTC, with how long ago (or ahead) it is, in a <time> element."""
    if value is None:
        return "—"
    at = value.astimezone(UTC)
    seconds = (now - at).total_seconds()
    return (
        f'<time datetime="{esc(at.isoformat())}" title="{esc(at.isoformat())}">'
        f"{esc(at.strftime('%Y-%m-%d %H:%M'))} UTC <small>({esc(_ago(seconds))})</small></time>"
    )


def _ago(seconds: float) -> str:
    later, seconds = seconds < 0, abs(seconds)
    if seconds < 60:
        text = f"{int(seconds)} s"
    elif seconds < 3600:
        text = f"{int(seconds // 60)} min"
    elif seconds < 2 * 86400:
        text = f"{seconds / 3600:.1f} h"
    else:
        text = f"{seconds / 86400:.1f} d"
    return f"in {text}" if later else f"{text} ago"


def _count(value: int | None, capped: bool = False) -> str:
    if value is None:
        return '<span class="muted">—</span>'
    return f"{value:,}+" if capped else f"{value:,}"


def chart(hourly: HourlyAlerts) -> str:
    """An inline SVG bar chart of ``hourly.counts`` (one bar an hour, scaled to the
    busiest hour), each bar titled with its hour and count."""
    width, height, bar = 4, 24, 3
    top = max(hourly.counts, default=0) or 1
    bars = []
    for i, count in enumerate(hourly.counts):
        hour = (hourly.start + timedelta(hours=i)).strftime("%H:00")
        h = 0 if count == 0 else max(1, round(count / top * height))
        bars.append(
            f'<rect x="{i * width}" y="{height - h}" width="{bar}" height="{h}">'
            f"<title>{esc(hour)} UTC: {count:,} alerts</title></rect>"
            f'<rect class="axis" x="{i * width}" y="{height - 0.5}" width="{bar}" height="0.5"/>'
        )
    total = sum(hourly.counts)
    label = f"alerts per hour over the last {len(hourly.counts)} hours: {total:,} in all"
    svg = (
        f'<svg class="chart" viewBox="0 0 {len(hourly.counts) * width} {height}" '
        f'role="img" aria-label="{esc(label)}" data-rule="{esc(hourly.rule)}" '
        f'data-start="{esc(hourly.start.isoformat())}" '
        f'data-counts="{esc(",".join(map(str, hourly.counts)))}">{"".join(bars)}</svg>'
    )
    more = "+" if hourly.capped else ""
    return f'{svg}<span class="total">{total:,}{more}</span>'


def _value(value: Any) -> str:
    """A row value as text: strings as they are, everything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _rule_row(status: RuleStatus, hourly: HourlyAlerts | None, writes: bool, now: datetime) -> str:
    scan = status.last_scan
    if scan is None:
        last = '<span class="muted">no scan yet</span>'
    else:
        last = f"last scan {_when(scan.at, now)}: {scan.claimed:,} alerts"
        if scan.error:
            last += f' <span class="bad">failed: {esc(scan.error)}</span>'
    problem = f'<p class="bad">{esc(status.problem)}</p>' if status.problem else ""
    silence = (
        f'<button type="button" data-action="silence" data-rule="{esc(status.name)}">'
        "Silence…</button>"
        if writes
        else ""
    )
    link = f"/?{urlencode({'rule': status.name})}#alerts"
    # An event rule's table is slawatch's own: what it watches says more.
    watches = status.table if status.events is None else f"events: {status.events}"
    overdue = _count(status.overdue, status.overdue_capped)
    unnotified = _count(status.not_notified, status.not_notified_capped)
    return f"""<tr data-rule="{esc(status.name)}">
<td data-label="Rule"><a href="{esc(link)}"><strong>{esc(status.name)}</strong></a>
<span class="sev sev-{esc(status.severity)}">{esc(status.severity)}</span>
<small>{esc(status.description)}<br>{esc(watches)} · {last}</small>{problem}</td>
<td data-label="Overdue now" class="num overdue">{overdue}</td>
<td data-label="Not yet notified" class="num unnotified">{unnotified}</td>
<td data-label="Open episodes" class="num episodes">{_count(status.notified)}</td>
<td data-label="Pending" class="num pending">{_count(status.pending)}</td>
<td data-label="Dead" class="num dead{" bad" if status.dead else ""}">{_count(status.dead)}</td>
<td data-label="Last 24 h" class="spark">{chart(hourly) if hourly else ""}</td>
<td class="act">{silence}</td>
</tr>"""


def needs_look(status: RuleStatus, hourly: HourlyAlerts | None) -> bool:
    """Whether the rule has anything for on-call: a problem, a failed scan, a count it
    could not make, rows overdue, open episodes, deliveries pending or dead, or an
    alert in the last 24 hours."""
    scan = status.last_scan
    return bool(
        status.problem
        or (scan is not None and scan.error)
        or status.overdue is None
        or status.overdue
        or status.not_notified
        or status.notified
        or status.pending
        or status.dead
        or (hourly is not None and any(hourly.counts))
    )


def _quiet_rules(folded: Sequence[RuleStatus]) -> str:
    """The quiet rules past :data:`FULL_RULES`: a link to each one's alerts, folded."""
    if not folded:
        return ""
    links = " ".join(
        f'<a href="{esc("/?" + urlencode({"rule": s.name}) + "#alerts")}" '
        f'data-rule="{esc(s.name)}">{esc(s.name)}</a>'
        for s in folded
    )
    return (
        f'<details class="quiet"><summary>{len(folded):,} more rules with nothing overdue, '
        "open, pending, dead or failing, and no alerts in the last 24 h</summary>"
        f'<p class="quiet-rules">{links}</p></details>'
    )


def _alert(
    alert: Alert,
    acked: EpisodeAck | None,
    columns: Sequence[str],
    writes: bool,
    now: datetime,
) -> str:
    # The rule's columns in its order (jsonb keeps its own), then any the rule no longer has.
    names = [c for c in columns if c in alert.row] + [c for c in alert.row if c not in columns]
    fields = "".join(
        f"<dt>{esc(name)}</dt><dd>{esc(_value(alert.row[name]))}</dd>" for name in names
    )
    deliveries = (
        "".join(
            f'<li class="st-{esc(d.status)}"><b>{esc(d.notifier)}</b> {esc(d.status)}'
            f" · {d.attempts} attempt{'s' if d.attempts != 1 else ''}"
            + (f" · next {_when(d.next_attempt_at, now)}" if d.next_attempt_at else "")
            + (f" · sent {_when(d.sent_at, now)}" if d.sent_at else "")
            + (f'<br><span class="err">{esc(d.last_error)}</span>' if d.last_error else "")
            + "</li>"
            for d in alert.deliveries
        )
        or '<li class="muted">no deliveries</li>'
    )
    acted = "".join(_action(a, now) for a in alert.actions)
    if acted:
        acted = f'<ul class="acted">{acted}</ul>'
    actions = []
    if acked is not None:
        actions.append(
            f'<span class="acked">acknowledged by {esc(acked.acked_by)} '
            f"{_when(acked.acked_at, now)}</span>"
        )
    elif writes and alert.kind == "firing":
        actions.append(
            f'<button type="button" data-action="ack" data-alert="{alert.id}">Ack episode</button>'
        )
    if writes:
        actions.append(
            f'<button type="button" data-action="silence" data-rule="{esc(alert.rule)}" '
            f'data-key="{esc(alert.key)}">Silence key…</button>'
        )
    number = "resolved" if alert.kind == "resolved" else f"#{alert.n}"
    return f"""<article class="alert alert-{esc(alert.severity)}" data-alert="{alert.id}" \
data-id="{esc(alert.idempotency_id)}">
<header><strong>{esc(alert.rule)}</strong> <code class="key">{esc(alert.key)}</code>
<span>episode {alert.episode} · {esc(number)}</span>
<span class="sev sev-{esc(alert.severity)}">{esc(alert.severity)}</span></header>
<p class="times">fired {_when(alert.fired_at, now)} · deadline {_when(alert.deadline, now)}</p>
<dl class="row">{fields}</dl>
<ul class="deliveries">{deliveries}</ul>
{acted}<div class="actions">{" ".join(actions)}</div>
</article>"""


def _action(attempt: ActionAttempt, now: datetime) -> str:
    """One attempt of the rule's action, beside the alert that triggered it."""
    rows = ""
    if attempt.rows is not None:
        rows = f" · {attempt.rows} row{'s' if attempt.rows != 1 else ''}"
    again = f" · attempt {attempt.attempt}" if attempt.attempt > 1 else ""
    why = f'<br><span class="err">{esc(attempt.error)}</span>' if attempt.error else ""
    return (
        f'<li class="act-{esc(attempt.status)}"><b>action</b> {esc(attempt.status)}{rows}{again}'
        f" · {_when(attempt.at, now)}{why}</li>"
    )


def _silence(silence: Silence, writes: bool, now: datetime) -> str:
    matchers = json.dumps(silence.matchers, ensure_ascii=False) if silence.matchers else ""
    what = f"<strong>{esc(silence.rule)}</strong>"
    if silence.key is not None:
        what += f' key <code class="key">{esc(silence.key)}</code>'
    if matchers:
        what += f" where <code>{esc(matchers)}</code>"
    expire = (
        f'<button type="button" data-action="expire" data-silence="{silence.id}">Expire</button>'
        if writes
        else ""
    )
    comment = f" — {esc(silence.comment)}" if silence.comment else ""
    return (
        f'<li data-silence="{silence.id}">{what}<br><small>until {_when(silence.ends_at, now)}'
        f" by {esc(silence.author)}{comment}</small> {expire}</li>"
    )


def _silence_form(rules: Sequence[str]) -> str:
    options = "".join(f'<option value="{esc(r)}">{esc(r)}</option>' for r in rules)
    return f"""<details id="new-silence"><summary>New silence</summary>
<form id="silence-form" class="grid">
<label>Rule <select name="rule" required>{options}</select></label>
<label>Key <input name="key" maxlength="2000" placeholder="every key"></label>
<label>Row fields <input name="matchers" maxlength="4000"
 placeholder='{esc('{"user_id": 7}')}'></label>
<label>Until <input name="until" value="2h" required maxlength="100"
 placeholder="2h or 2026-03-01T18:00Z"></label>
<label>Comment <input name="comment" maxlength="2000"></label>
<button type="submit">Silence</button>
</form></details>"""


# ---------------------------------------------------------------- pages


@dataclass(frozen=True)
class View:
    """What one rendering of the page shows."""

    now: datetime
    rules: list[RuleStatus]
    hourly: Mapping[str, HourlyAlerts]
    alerts: list[Alert]
    next_cursor: str | None
    acks: Mapping[tuple[str, str, int], EpisodeAck]
    columns: Mapping[str, Sequence[str]]  # each rule's columns, in its order
    silences: list[Silence]
    rule: str | None  # the alerts list shows this rule only
    writes: bool  # the buttons work (a token, or a loopback server)
    logout: bool  # logged in by the cookie: offer to log out


def _document(title: str, body: str) -> str:
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="same-origin">
<title>{esc(title)}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/static/page.css">
<script src="/static/page.js" defer></script>
</head>
<body>
{body}
</body>
</html>
"""


def render_page(view: View) -> str:
    """The whole on-call page."""
    now = view.now
    # The rules that need a look first, each in full; quiet ones after, folded past
    # FULL_RULES rows.
    look: list[RuleStatus] = []
    quiet: list[RuleStatus] = []
    for s in view.rules:
        (look if needs_look(s, view.hourly.get(s.name)) else quiet).append(s)
    room = max(FULL_RULES - len(look), 0)
    rows = (
        "".join(
            _rule_row(s, view.hourly.get(s.name), view.writes, now) for s in look + quiet[:room]
        )
        or '<tr><td colspan="7" class="muted">no rules configured</td></tr>'
    )
    summary = ""
    if view.rules:
        summary = (
            f'<p class="rules-summary">{len(view.rules):,} rules, {len(look):,} with something '
            "to look at (listed first)</p>"
        )
    folded = _quiet_rules(quiet[room:])
    alerts = (
        "".join(
            _alert(
                a,
                view.acks.get((a.rule, a.key, a.episode)),
                view.columns.get(a.rule, ()),
                view.writes,
                now,
            )
            for a in view.alerts
        )
        or '<p class="muted">no alerts</p>'
    )
    more = ""
    if view.next_cursor is not None:
        query = {"cursor": view.next_cursor} | ({"rule": view.rule} if view.rule else {})
        more = f'<p><a class="more" href="/?{esc(urlencode(query))}#alerts">Older alerts →</a></p>'
    which = "Recent alerts"
    if view.rule:
        which = f'Alerts of {esc(view.rule)} <a href="/#alerts"><small>(all rules)</small></a>'
    silences = "".join(_silence(s, view.writes, now) for s in view.silences) or (
        '<li class="muted">none active</li>'
    )
    form = _silence_form([s.name for s in view.rules]) if view.writes else ""
    readonly = (
        ""
        if view.writes
        else '<p class="note">Read-only: this server has no SLAWATCH_API_TOKEN and is not '
        "bound to loopback, so acks and silences are refused.</p>"
    )
    logout = (
        '<form method="post" action="/logout"><button type="submit">Log out</button></form>'
        if view.logout
        else ""
    )
    who = (
        '<label class="who">Acting as <input id="who" maxlength="200" autocomplete="name" '
        'placeholder="your name"></label>'
        if view.writes
        else ""
    )
    body = f"""<header class="top">
<h1>slawatch <small>on call</small></h1>
<span class="now">{esc(now.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"))} UTC</span>
{who}{logout}
</header>
<p id="status" role="status" aria-live="polite"></p>
{readonly}
<main>
<section id="rules"><h2>Rules</h2>
{summary}
<table class="rules">
<thead><tr><th>Rule</th><th>Overdue now</th><th>Not yet notified</th><th>Open episodes</th>
<th>Pending</th><th>Dead</th><th>Alerts per hour, last 24 h</th><th></th></tr></thead>
<tbody>{rows}</tbody>
</table>
{folded}
</section>
<section id="sla"><h2>SLA, last 7 days</h2>
<p class="muted">Episodes that fell due each day (bars) and the compliance where due
deadlines are counted (line), from <a href="/v1/report?by=day&amp;since=7d">/v1/report</a>.</p>
<div class="sla-charts" data-src="/v1/report?by=day&amp;since=7d"></div>
</section>
<section id="silences"><h2>Active silences</h2>
<ul class="silences">{silences}</ul>
{form}
</section>
<section id="alerts"><h2>{which}</h2>
<div class="alerts">{alerts}</div>
{more}
</section>
</main>"""
    return _document("slawatch — on call", body)


def render_login(error: str | None = None) -> str:
    """The token form shown to a browser without a valid cookie."""
    problem = f'<p class="bad">{esc(error)}</p>' if error else ""
    body = f"""<main class="login">
<h1>slawatch <small>on call</small></h1>
<form method="post" action="/login">
<label>API token <input type="password" name="token" required autofocus
 autocomplete="current-password"></label>
<button type="submit">Log in</button>
</form>
{problem}
<p class="muted">The token is this server's SLAWATCH_API_TOKEN. It is checked here; the browser
then keeps a session cookie (HttpOnly, SameSite=Strict) for
{COOKIE_AGE.seconds // 3600} hours, or until you log out.</p>
</main>"""
    return _document("slawatch — log in", body)


def render_error(message: str) -> str:
    """The page when it cannot be shown (bad input, the database unreachable)."""
    body = f"""<main class="login">
<h1>slawatch <small>on call</small></h1>
<p class="bad">{esc(message)}</p>
<p><a href="/">Back to the page</a></p>
</main>"""
    return _document("slawatch — error", body)
