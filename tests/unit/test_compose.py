"""docker-compose.yml: a monitor that is quiet after a joint restart pages nobody."""

from __future__ import annotations

import yaml

from tests.conftest import ROOT


def test_every_service_comes_back_after_a_restart_of_the_host() -> None:
    """Docker starts a container again after a reboot or a crash only with a restart
    policy; `unless-stopped` still lets `docker compose stop` stop it."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert set(services) == {"db", "slawatch"}
    assert {name: s.get("restart") for name, s in services.items()} == {
        "db": "unless-stopped",
        "slawatch": "unless-stopped",
    }
    # `run` last, as the process Docker stops with SIGTERM (exit 0, see test_startup.py).
    assert "exec slawatch run" in services["slawatch"]["command"]
