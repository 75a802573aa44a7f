"""The generated reference pages are what scripts/docs_reference.py makes now."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from tests.conftest import ROOT


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "scripts/docs_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_pages_are_current() -> None:
    for path, text in _generator().pages().items():
        assert path.read_text() == text, (
            f"{path.relative_to(ROOT)} is stale: run .venv/bin/python scripts/docs_reference.py"
        )


def test_every_setting_and_route_is_on_its_page() -> None:
    from slawatch.config.settings import Settings

    gen = _generator()
    settings = (ROOT / "docs/reference/settings.md").read_text()
    for name in Settings.model_fields:
        assert f"`SLAWATCH_{name.upper()}`" in settings
    http = (ROOT / "docs/reference/http-api.md").read_text()
    for path, ops in gen.openapi()["paths"].items():
        for method in ops:
            assert f"## `{method.upper()} {path}`" in http
