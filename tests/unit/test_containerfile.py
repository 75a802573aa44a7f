"""The Containerfile's promises (docs/how-to/deploy.md); CI builds
the image and runs it (.ci/image)."""

from __future__ import annotations

import json
import re

from tests.conftest import ROOT


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = (ROOT / "Containerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def _final_stage() -> list[tuple[str, str]]:
    steps = _instructions()
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def test_the_base_is_a_build_argument_defaulting_to_the_official_slim_python() -> None:
    steps = _instructions()
    assert steps[0] == ("ARG", "BASE=docker.io/library/python:3.12-slim")
    froms = [rest for word, rest in steps if word == "FROM"]
    # Multi-stage: the wheel is built in one, installed in the other, both on BASE.
    assert froms == ["${BASE} AS build", "${BASE}"]
    assert any(w == "COPY" and rest.startswith("--from=build ") for w, rest in _final_stage())


def test_it_runs_as_a_user_that_is_not_root() -> None:
    users = [rest for word, rest in _final_stage() if word == "USER"]
    assert len(users) == 1
    user = users[0].split(":")[0]
    assert user not in ("root", "0") and user.isdigit()  # numeric: runAsNonRoot can tell


def test_entrypoint_cmd_config_and_the_admin_api() -> None:
    final = dict(_final_stage())
    assert json.loads(final["ENTRYPOINT"]) == ["slawatch"]
    assert json.loads(final["CMD"]) == ["run"]
    assert final["WORKDIR"] == "/etc/slawatch"
    assert "SLAWATCH_HTTP=0.0.0.0:8080" in final["ENV"].split()
    assert final["EXPOSE"] == "8080"


def test_the_healthcheck_asks_healthz() -> None:
    (check,) = [rest for word, rest in _final_stage() if word == "HEALTHCHECK"]
    options, _, command = check.partition(" CMD ")
    assert "--interval=" in options
    argv = json.loads(command)
    assert argv[:2] == ["python3", "-c"] and "/healthz" in argv[2]


def test_the_image_holds_the_brokers_clients_not_the_embedded_server() -> None:
    runs = " ".join(rest for word, rest in _final_stage() if word == "RUN")
    assert "[amqp,redis,nats]" in runs and "embedded" not in runs
