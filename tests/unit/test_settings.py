"""Settings of the database connection: SLAWATCH_DB_TIMEOUT and SLAWATCH_POOLER."""

from __future__ import annotations

import pytest

from slawatch.cli import main
from slawatch.config.settings import Settings


def test_db_timeout_and_pooler_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLAWATCH_DB_TIMEOUT", raising=False)
    monkeypatch.delenv("SLAWATCH_POOLER", raising=False)
    assert (Settings().db_timeout, Settings().pooler) == (30.0, "auto")
    monkeypatch.setenv("SLAWATCH_DB_TIMEOUT", "2.5")
    monkeypatch.setenv("SLAWATCH_POOLER", "transaction")
    assert (Settings().db_timeout, Settings().pooler) == (2.5, "transaction")


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("SLAWATCH_DB_TIMEOUT", "0", "greater than 0"),
        ("SLAWATCH_DB_TIMEOUT", "soon", "valid number"),
        ("SLAWATCH_POOLER", "statement", "'transaction'"),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    says: str,
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(["check"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"slawatch: error: {variable}: ") and says in line


@pytest.mark.parametrize("command", [["check"], ["run", "--once"]])
@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        # A digits-only duration in the environment was told to unquote it "as in YAML".
        ("SLAWATCH_RETENTION", "30", "'30' is not a duration: a number needs a unit here"),
        ("SLAWATCH_DEDUPE_WINDOW", "600", "'600' is not a duration: a number needs a unit"),
        ("SLAWATCH_RETENTION", "P1.5D", "'P1.5D' is not a duration: ISO 8601 fractions are"),
    ],
)
def test_a_duration_in_the_environment_is_advised_as_text(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
    variable: str,
    value: str,
    says: str,
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(command) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"slawatch: error: {variable}: {says}"), line
    assert "YAML" not in line and "a number of seconds" not in line, line
