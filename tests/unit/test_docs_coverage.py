"""The hand-written reference pages name everything they are the reference of:
a new rule field, command, notifier or source type, or metric without its line in
docs/reference/ fails here."""

from __future__ import annotations

import argparse
import re

from slawatch.cli import build_parser
from slawatch.config.rules import Events, Rule
from tests.conftest import ROOT

REFERENCE = ROOT / "docs" / "reference"


def _types(module: str) -> list[str]:
    source = (ROOT / "slawatch" / "config" / f"{module}.py").read_text()
    return re.findall(r'^    type: Literal\["([a-z]+)"\]', source, re.M)


def test_every_rule_field_is_on_the_rules_page() -> None:
    page = (REFERENCE / "rules.md").read_text()
    fields = [f.alias or name for name, f in Rule.model_fields.items()]
    assert len(fields) > 20
    missing = [f for f in fields if not re.search(rf"(^|[\s#`]){re.escape(f)}[:`]", page, re.M)]
    assert not missing


def test_every_events_field_is_on_the_rules_page() -> None:
    page = (REFERENCE / "rules.md").read_text()
    section = page[page.index("- **`events`**") :].split("\n- **", 1)[0]
    assert not [f for f in Events.model_fields if f"`{f}" not in section]


def test_every_command_is_on_the_cli_page() -> None:
    page = (REFERENCE / "cli.md").read_text()
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert "migrate" in sub.choices
    missing = [c for c in sub.choices if not re.search(rf"^  {c}\b", page, re.M)]
    assert not missing


def test_every_notifier_and_source_type_has_its_section() -> None:
    notifiers = (REFERENCE / "notifiers.md").read_text()
    types = _types("notifiers")
    assert {"webhook", "pagerduty"} <= set(types)
    assert not [t for t in types if not re.search(rf"^##+ {t}\b", notifiers, re.M)]
    sources = (REFERENCE / "sources.md").read_text()
    types = _types("sources")
    assert {"amqp", "redis", "nats"} <= set(types)
    assert not [t for t in types if f"type: {t}\n" not in sources]


def test_every_metric_is_on_the_metrics_page() -> None:
    page = (REFERENCE / "metrics.md").read_text()
    source = (ROOT / "slawatch" / "operate" / "metrics.py").read_text()
    names = set(re.findall(r'"(slawatch_[a-z_]+)"', source))
    assert "slawatch_alerts_claimed" in names
    assert not [n for n in sorted(names) if f"`{n}" not in page]
