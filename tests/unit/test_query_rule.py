"""The query rules of docs/how-to/watch-a-table.md (Watch a query) load as written."""

from __future__ import annotations

import re

import yaml

from slawatch.config.rules import Rule
from slawatch.engine.generation import definition, generation
from tests.conftest import ROOT


def test_the_documented_query_rules_load() -> None:
    page = (ROOT / "docs" / "how-to" / "watch-a-table.md").read_text()
    section = page.split("## Watch a query", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(# rules/(\w+)\.yaml.*?\n.*?)```", section, re.S)
    assert [name for _, name in blocks] == ["order_unshipped", "job_stalled"]
    for text, name in blocks:
        rule = Rule.model_validate({"name": name, **yaml.safe_load(text)})
        assert rule.query is not None and rule.query.startswith("SELECT ")
        assert rule.track == "table" and rule.key == ["id"]
    assert rule.action is not None and rule.action.placeholders == ["id"]


def test_a_changed_query_is_a_new_generation() -> None:
    """Scanners of the old query stop at the claim gate until migrate records the new."""
    body = {
        "name": "late",
        "query": "SELECT id, due FROM a",
        "track": "table",
        "key": "id",
        "deadline": "due",
        "open_when": "true",
        "notify": ["console"],
    }
    before = Rule.model_validate(body)
    after = Rule.model_validate(body | {"query": "SELECT id, due FROM b"})
    assert generation(before) != generation(after)
    assert definition(before)["table"] != definition(after)["table"]
