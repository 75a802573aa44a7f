"""docker-compose.yml deploys the image (docs/how-to/deploy.md):
migrate once, then run; a published port; the token from .env; config read-only; ready
by /readyz; nothing installed at start. CI also runs `docker-compose config` on it
(.ci/image); no daemon runs there to start it."""

from __future__ import annotations

from typing import Any

import yaml

from tests.conftest import ROOT


def _services() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    return services


def test_every_service_comes_back_after_a_restart_of_the_host() -> None:
    """Docker starts a container again after a reboot or a crash only with a restart
    policy; `unless-stopped` still lets `docker compose stop` stop it. `migrate` runs
    once per `up`, not again at each restart."""
    services = _services()
    assert set(services) == {"db", "migrate", "slawatch"}
    assert {name: s.get("restart") for name, s in services.items()} == {
        "db": "unless-stopped",
        "migrate": "no",
        "slawatch": "unless-stopped",
    }


def test_migrate_runs_once_before_run_from_the_same_image() -> None:
    services = _services()
    migrate, run = services["migrate"], services["slawatch"]
    # The image's ENTRYPOINT is slawatch: these are its arguments.
    assert (migrate["command"], run["command"]) == (["migrate"], ["run"])
    assert run["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    assert migrate["depends_on"] == {"db": {"condition": "service_healthy"}}
    for service in (migrate, run):
        assert service["build"] == {"context": ".", "dockerfile": "Containerfile"}
        assert service["image"] == migrate["image"]


def test_the_admin_port_is_published_and_guarded_by_the_token_from_dotenv() -> None:
    run = _services()["slawatch"]
    assert run["ports"] == ["8080:8080"]  # the image's SLAWATCH_HTTP is 0.0.0.0:8080
    # ${VAR:?...}: compose refuses to start (and `config` fails) without it in .env.
    assert run["environment"]["SLAWATCH_API_TOKEN"].startswith("${SLAWATCH_API_TOKEN:?")
    example = (ROOT / ".env.example").read_text().splitlines()
    assert "SLAWATCH_API_TOKEN=" in example
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()


def test_config_is_mounted_read_only() -> None:
    services = _services()
    for name in ("migrate", "slawatch"):
        assert services[name]["volumes"] == [
            f"./{folder}:/etc/slawatch/{folder}:ro"
            for folder in ("rules", "notifiers", "calendars")
        ]
    # A missing folder would be created by Docker, as root: the repository keeps one.
    assert all((ROOT / folder).is_dir() for folder in ("rules", "notifiers", "calendars"))


def test_readiness_is_readyz_with_the_token() -> None:
    test = _services()["slawatch"]["healthcheck"]["test"]
    assert test[0] == "CMD"
    probe = " ".join(test[1:])
    assert "http://127.0.0.1:8080/readyz" in probe
    assert "SLAWATCH_API_TOKEN" in probe  # /readyz needs the token; /healthz would not


def test_nothing_is_installed_at_start() -> None:
    """The image carries slawatch: a start needs no network and always runs the same
    code (the old file pip-installed the source tree at every start)."""
    for name, service in _services().items():
        started = yaml.safe_dump(
            {k: service.get(k) for k in ("command", "entrypoint", "healthcheck")}
        )
        for word in ("pip", "install", "apt-get", "uv "):
            assert word not in started, f"{name}: {word}"
        assert "/src" not in yaml.safe_dump(service.get("volumes", []))  # no source tree
