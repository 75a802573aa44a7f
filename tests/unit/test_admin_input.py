"""What the operator's surface accepts: SLAWATCH_HTTP, SLAWATCH_API_TOKEN, the admin
API's auth decision, and the alert filters' parsing (no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slawatch.cli import main
from slawatch.config.settings import Settings, is_loopback, parse_bind
from slawatch.errors import BadInput
from slawatch.operate.admin import refusal
from slawatch.operate.inspect import parse_cursor, parse_since
from slawatch.runtime.boot import admin_bind

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TOKEN = "0123456789abcdef"


@pytest.mark.parametrize(
    ("text", "bind"),
    [
        ("127.0.0.1:8181", ("127.0.0.1", 8181)),
        (" localhost:1 ", ("localhost", 1)),
        ("[::1]:65535", ("::1", 65535)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
        ("", None),
        ("   ", None),
    ],
)
def test_http_binds(text: str, bind: tuple[str, int] | None) -> None:
    assert parse_bind(text) == bind


@pytest.mark.parametrize(
    "text",
    [
        "8181",
        ":8181",
        "host:",
        "host:0",
        "host:65536",
        "host:00008181",
        "host:-1",
        "host:8e3",
        "[zz]:80",
        "[::1]",
        "::1:80",
        "a b:80",
        "-host:80",
        "x" * 10_000 + ":80",
        "h\x00:80",
    ],
)
def test_bad_http_binds(text: str) -> None:
    with pytest.raises(ValueError, match="is not host:port"):
        parse_bind(text)


def test_http_settings_are_one_line_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SLAWATCH_HTTP", raising=False)
    monkeypatch.delenv("SLAWATCH_API_TOKEN", raising=False)
    assert (Settings().http, Settings().api_token) == ("127.0.0.1:8181", None)
    monkeypatch.setenv("SLAWATCH_HTTP", "")
    assert Settings().http is None
    monkeypatch.setenv("SLAWATCH_API_TOKEN", TOKEN)
    token = Settings().api_token
    assert token is not None and token.get_secret_value() == TOKEN
    assert TOKEN not in repr(Settings())  # a secret: never printed

    for variable, value, says in (
        ("SLAWATCH_HTTP", "localhost", "SLAWATCH_HTTP: 'localhost' is not host:port"),
        ("SLAWATCH_API_TOKEN", "short", "SLAWATCH_API_TOKEN: must be at least 16"),
        ("SLAWATCH_API_TOKEN", "with spaces in the token", "without spaces"),
    ):
        monkeypatch.setenv(variable, value)
        assert main(["check"]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("slawatch: error: ") and says in line, line
        monkeypatch.delenv(variable)


def test_loopback() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.9.9.9", "::1", "localhost", "LOCALHOST"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.1", "example.org", "localhost.x"]))


def test_the_auth_decision() -> None:
    bearer = f"Bearer {TOKEN}"
    # A token: every request but /healthz needs it, reads and writes alike.
    assert refusal("GET", "/healthz", None, TOKEN, False) is None
    assert refusal("GET", "/v1/stats", bearer, TOKEN, False) is None
    assert refusal("GET", "/v1/stats", f"bearer  {TOKEN}", TOKEN, False) is None
    assert refusal("POST", "/v1/replay", bearer, TOKEN, False) is None
    for header in (None, "", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN}0", "Bearer é"):
        assert refusal("GET", "/v1/stats", header, TOKEN, True) == (401, refusal_text(header))
    assert refusal("GET", "/healthz/", None, TOKEN, True) is not None  # exactly /healthz
    # No token: reads are open; writes only where only this machine can connect.
    assert refusal("GET", "/v1/stats", None, None, False) is None
    for method in ("POST", "DELETE", "PUT", "PATCH"):
        refused = refusal(method, "/v1/replay", None, None, False)
        assert refused is not None and refused[0] == 403
        assert refusal(method, "/v1/replay", None, None, True) is None


def refusal_text(header: str | None) -> str:
    return "a valid 'Authorization: Bearer <token>' header is required"


def test_since() -> None:
    assert parse_since("1h", NOW) == NOW - timedelta(hours=1)
    assert parse_since("PT30M", NOW) == NOW - timedelta(minutes=30)
    assert parse_since("2026-02-01", NOW) == datetime(2026, 2, 1, tzinfo=UTC)
    assert parse_since("2026-02-01T10:00:00+02:00", NOW) == datetime(2026, 2, 1, 8, tzinfo=UTC)
    assert parse_since("2026-02-01T10:00Z", NOW) == datetime(2026, 2, 1, 10, tzinfo=UTC)
    for bad in ("", "soon", "-1h", "2026-02-30", "101y", "9" * 5000, "1h\x00"):
        with pytest.raises(BadInput, match="since: "):
            parse_since(bad, NOW)


def test_cursors() -> None:
    assert parse_cursor("17") == 17
    assert parse_cursor("-1281") == -1281  # in the outbox's rows (queries.sql, list_alerts)
    for bad in ("", "0", "-0", "--1", "-", "1.5", "٣", "9" * 20, "9223372036854775808"):
        with pytest.raises(BadInput, match="cursor: "):
            parse_cursor(bad)


def test_the_auth_decision_for_the_page() -> None:
    host = "127.0.0.1:8181"
    # A valid login session reads; a write with it needs the page's header.
    assert refusal("GET", "/", None, TOKEN, True, session=True) is None
    assert refusal("GET", "/v1/stats", None, TOKEN, True, session=True) is None
    refused = refusal("POST", "/v1/silences", None, TOKEN, True, session=True)
    assert refused == (403, "a write with the login cookie needs the X-Slawatch-Page header")
    assert refusal("POST", "/v1/silences", None, TOKEN, True, session=True, page=True) is None
    assert refusal("GET", "/", None, TOKEN, True, session=False) is not None
    # A wrong Bearer header is not rescued by a good session.
    assert refusal("GET", "/", "Bearer x", TOKEN, True, session=True) is not None
    # The login form and the page's files need no token.
    for path in ("/login", "/logout", "/static/page.css", "/static/page.js"):
        assert refusal("POST" if "log" in path else "GET", path, None, TOKEN, True) is None
    assert refusal("GET", "/static/other.js", None, TOKEN, True) is not None
    # Writes from another origin: refused, with or without a token, before anything else.
    for origin in ("http://evil.example", "null", "http://127.0.0.1:8182", "ftp://127.0.0.1:8181"):
        assert refusal(
            "POST", "/v1/replay", f"Bearer {TOKEN}", TOKEN, True, origin=origin, host=host
        ) == (403, "cross-origin writes are refused"), origin
        assert (
            refusal("DELETE", "/v1/silences/1", None, None, True, origin=origin, host=host)
            is not None
        )
    assert (
        refusal("GET", "/v1/stats", None, None, True, origin="http://evil.example", host=host)
        is None
    )  # reads are not refused for it (CORS keeps the answer)
    assert (
        refusal("POST", "/login", None, TOKEN, True, origin="http://evil.example", host=host)
        is not None
    )
    same = {"origin": f"http://{host}", "host": host}
    assert refusal("POST", "/v1/replay", None, TOKEN, True, session=True, page=True, **same) is None
    assert refusal("POST", "/v1/replay", None, None, True, **same) is None
    assert (
        refusal("POST", "/v1/replay", None, None, True, origin="HTTP://127.0.0.1:8181", host=host)
        is None
    )
    # No token: a write's Host must be loopback (a rebound name is not).
    for good in ("localhost:8181", "127.0.0.1", "[::1]:8181", "LOCALHOST"):
        assert refusal("POST", "/v1/replay", None, None, True, host=good) is None, good
    for bad in ("evil.example:8181", "10.0.0.1", "[::1", "localhost.evil.example"):
        refused = refusal("POST", "/v1/replay", None, None, True, host=bad)
        assert refused is not None and "loopback Host" in refused[1], bad
    # Issue 13: without a token a foreign Host reads nothing either (DNS rebinding), but
    # /healthz answers whatever the Host.
    for method, path in (("GET", "/v1/stats"), ("GET", "/"), ("GET", "/static/page.js")):
        refused = refusal(method, path, None, None, True, host="evil.example")
        assert refused is not None and "loopback Host" in refused[1], path
    assert refusal("GET", "/healthz", None, None, False, host="evil.example") is None
    assert refusal("GET", "/v1/stats", None, TOKEN, True, host="evil.example") is not None
    assert refusal("GET", "/v1/stats", f"Bearer {TOKEN}", TOKEN, True, host="evil.example") is None


def test_run_refuses_an_admin_api_off_loopback_without_a_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The container's 0.0.0.0 (Containerfile) with no token: `run` does not start, and
    says so in one line before it looks for a database (none is configured here)."""
    monkeypatch.chdir(tmp_path)  # no rules/: the refusal comes first
    monkeypatch.delenv("SLAWATCH_API_TOKEN", raising=False)
    monkeypatch.delenv("SLAWATCH_DSN", raising=False)
    for http in ("0.0.0.0:8080", "[::]:8080", "10.1.2.3:8181", "example.org:80"):
        monkeypatch.setenv("SLAWATCH_HTTP", http)
        assert main(["run"]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line == (
            f"slawatch: error: SLAWATCH_HTTP: {http} is reachable from other machines: "
            "set SLAWATCH_API_TOKEN, or bind to loopback (127.0.0.1:8181)"
        )
    # Loopback without a token, off loopback with one, or no API: it starts.
    for http, token, bind in (
        ("127.0.0.1:8181", None, ("127.0.0.1", 8181)),
        ("[::1]:8181", None, ("::1", 8181)),
        ("0.0.0.0:8080", TOKEN, ("0.0.0.0", 8080)),
        ("", None, None),
    ):
        monkeypatch.setenv("SLAWATCH_HTTP", http)
        if token:
            monkeypatch.setenv("SLAWATCH_API_TOKEN", token)
        assert admin_bind(Settings()) == bind
