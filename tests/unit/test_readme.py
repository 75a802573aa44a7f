"""The README's and the docs' promises that code can check."""

from __future__ import annotations

import base64
import os
import re
import time
from typing import Any

from slawatch.delivery.notifiers.webhook import sign, signing_key
from tests.conftest import ROOT


def test_the_documented_receiver_check_verifies_our_signatures() -> None:
    page = (ROOT / "docs" / "reference" / "notifiers.md").read_text()
    (snippet,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "def verify" in b]
    scope: dict[str, Any] = {}
    exec(snippet, scope)  # the receiver code exactly as documented
    secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    body = b'{"alerts":[]}'
    ts = int(time.time())
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(ts),
        "webhook-signature": sign(signing_key(secret), "msg_1", ts, body),
    }
    assert scope["verify"](secret, headers, body)
    assert not scope["verify"](secret, headers, body + b" ")


def test_quick_start_has_exactly_two_commands_and_ci_runs_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [ln.split("#")[0].strip() for ln in quick.splitlines() if ln.strip()]
    assert commands == ["scripts/dev demo --seconds 30", "scripts/dev test"]
    assert "scripts/dev test\n" in (ROOT / ".ci" / "run").read_text()
