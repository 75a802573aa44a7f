"""A key given twice in one mapping is refused: YAML would keep the last one silently, so
a rule written with two ``events:`` (or a flow ``{within: 1h, within: 2h}``) would watch
something other than what its author read."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slawatch.config.files import load_yaml_file
from slawatch.config.rules import load_rules
from slawatch.errors import ConfigError

RULE = "events: {beat: x, within: 1h}\nnotify: [console]\n"


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        (RULE + "events: {beat: y, within: 2h}\n", 3, "events"),
        ("events: {beat: x, within: 1h, within: 2h}\nnotify: [console]\n", 1, "within"),
        (RULE + "description: a\ndescription: b\n", 4, "description"),
    ],
    ids=["block", "flow", "scalar"],
)
def test_a_key_given_twice_is_one_line_naming_file_line_and_key(
    tmp_path: Path, text: str, line: int, key: str
) -> None:
    (tmp_path / "r.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_rules(tmp_path)
    (msg,) = str(info.value).splitlines()
    assert msg.startswith(f"{tmp_path / 'r.yaml'}: line {line}: invalid YAML: '{key}': "), msg
    assert "given twice" in msg, msg


def test_the_pure_python_loader_refuses_a_key_given_twice(tmp_path: Path) -> None:
    # Text that could nest 1000 deep is read by the pure-Python loader, not libyaml's
    # (files.py's _loader_for counts these characters, comments included).
    text = "# " + ":" * 1000 + "\nm: {a: 1, a: 2}\n"
    (tmp_path / "r.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"line 2: invalid YAML: 'a': given twice"):
        load_yaml_file(tmp_path / "r.yaml")


def test_a_merged_key_may_be_overridden(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("b: &b {beat: x, within: 1h}\nevents: {<<: *b, within: 2h}\n")
    assert load_yaml_file(tmp_path / "r.yaml")["events"] == {"beat": "x", "within": "2h"}


def test_equal_looking_keys_of_different_types_are_not_duplicates(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text('m: {1: a, "1": b}\n')
    assert load_yaml_file(tmp_path / "r.yaml")["m"] == {1: "a", "1": "b"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("d" * 2_001, "description: is 2,001 characters; at most 2,000 (it is in every alert)"),
        ("a\x00b", "description: must not contain a NUL character"),
    ],
    ids=["long", "nul"],
)
def test_a_description_every_alert_could_not_carry_is_one_line(
    tmp_path: Path, value: str, expected: str
) -> None:
    """A rule's description goes into each of its alerts: 10 MB of it made every
    payload 10 MB (and a NUL one no JSON receiver or PostgreSQL keeps)."""
    (tmp_path / "r.yaml").write_text(RULE + yaml.safe_dump({"description": value}, width=10**6))
    with pytest.raises(ConfigError) as info:
        load_rules(tmp_path)
    assert str(info.value) == f"{tmp_path / 'r.yaml'}: {expected}"
    (tmp_path / "r.yaml").write_text(RULE + f"description: {'d' * 2_000}\n")
    (rule,) = load_rules(tmp_path)
    assert len(rule.description) == 2_000
