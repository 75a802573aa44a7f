"""SLAWATCH_INGEST_TOKEN: validated as the API token, and never the same as it;
SLAWATCH_INGEST_TOKENS (scoped producer tokens) and SLAWATCH_FORWARDED_ALLOW_IPS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slawatch.cli import main
from slawatch.config.settings import Settings

TOKEN = "s3cret-token-0123456789"


def test_the_ingest_token_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SLAWATCH_API_TOKEN", raising=False)
    monkeypatch.delenv("SLAWATCH_INGEST_TOKEN", raising=False)
    assert Settings().ingest_token is None
    monkeypatch.setenv("SLAWATCH_INGEST_TOKEN", "ingest-" + TOKEN)
    token = Settings().ingest_token
    assert token is not None and token.get_secret_value() == "ingest-" + TOKEN
    assert TOKEN not in repr(Settings())  # a secret: never printed
    monkeypatch.setenv("SLAWATCH_API_TOKEN", TOKEN)
    assert Settings().api_token is not None

    for value, says in (
        ("short", "SLAWATCH_INGEST_TOKEN: must be at least 16 printable ASCII characters"),
        ("with spaces in the token", "SLAWATCH_INGEST_TOKEN: must be at least 16"),
        (TOKEN, "SLAWATCH_INGEST_TOKEN: must differ from SLAWATCH_API_TOKEN"),
    ):
        monkeypatch.setenv("SLAWATCH_INGEST_TOKEN", value)
        assert main(["check"]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("slawatch: error: ") and says in line, line


SCOPED = "scoped-token-0123456789"


def test_scoped_ingest_tokens_from_json_or_a_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for name in ("SLAWATCH_API_TOKEN", "SLAWATCH_INGEST_TOKEN", "SLAWATCH_INGEST_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    assert Settings().ingest_tokens == []
    scopes = [{"token": SCOPED, "types": ["backup_ping"], "key_prefix": "db"}]
    monkeypatch.setenv("SLAWATCH_INGEST_TOKENS", json.dumps(scopes))
    (scope,) = Settings().ingest_tokens
    assert scope.token.get_secret_value() == SCOPED and SCOPED not in repr(Settings())
    assert scope.refuses("backup_ping", "db1") is None
    assert scope.refuses("parcel_shipped", "db1") == (
        "'parcel_shipped' is not a type this token may post (backup_ping)"
    )
    assert scope.refuses("backup_ping", "web1") == (
        "'web1' does not start with this token's key_prefix 'db'"
    )
    secret = tmp_path / "tokens.json"
    secret.write_text(json.dumps(scopes))
    monkeypatch.setenv("SLAWATCH_INGEST_TOKENS", str(secret))
    assert Settings().ingest_tokens == [scope]

    monkeypatch.setenv("SLAWATCH_API_TOKEN", TOKEN)
    for value, says in (
        ("[{", "SLAWATCH_INGEST_TOKENS: not JSON: "),
        (str(tmp_path / "missing.json"), "SLAWATCH_INGEST_TOKENS: not a JSON list, nor a file"),
        ('{"token": "x"}', "SLAWATCH_INGEST_TOKENS: a JSON list: "),
        (json.dumps([{"token": "short", "types": ["a"]}]), "[0].token: must be at least 16"),
        (json.dumps([{"token": SCOPED, "types": []}]), "[0].types: "),
        (json.dumps([{"token": SCOPED, "types": ["a b"]}]), "'a b' is not an event type"),
        (json.dumps([{"token": SCOPED, "types": ["a"], "prefix": "x"}]), "[0].prefix: unknown"),
        (json.dumps([{"token": TOKEN, "types": ["a"]}]), "[0].token: must differ from"),
        (json.dumps(scopes * 2), "[1].token: must differ from"),
    ):
        monkeypatch.setenv("SLAWATCH_INGEST_TOKENS", value)
        assert main(["check"]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("slawatch: error: ") and says in line, line
        assert SCOPED not in line and "short" not in line, line


def test_forwarded_allow_ips(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SLAWATCH_FORWARDED_ALLOW_IPS", raising=False)
    assert Settings().forwarded_allow_ips is None
    monkeypatch.setenv("SLAWATCH_FORWARDED_ALLOW_IPS", "10.0.0.5, 10.1.0.0/16,::1")
    assert Settings().forwarded_allow_ips == "10.0.0.5, 10.1.0.0/16,::1"
    monkeypatch.setenv("SLAWATCH_FORWARDED_ALLOW_IPS", "*")
    assert Settings().forwarded_allow_ips == "*"
    monkeypatch.setenv("SLAWATCH_FORWARDED_ALLOW_IPS", "10.0.0.5,proxy.internal")
    assert main(["check"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "SLAWATCH_FORWARDED_ALLOW_IPS: 'proxy.internal' is not an IP address" in line, line
