"""SLAWATCH_INGEST_TOKEN: validated as the API token, and never the same as it."""

from __future__ import annotations

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
