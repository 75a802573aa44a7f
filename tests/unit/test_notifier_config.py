from __future__ import annotations

from pathlib import Path

import certifi
import pytest
import yaml

from slawatch.config.notifiers import (
    EmailConfig,
    NatsConfig,
    OpsgenieConfig,
    SlackConfig,
    WebhookConfig,
    load_notifiers,
)
from slawatch.delivery.notifiers import build
from slawatch.delivery.notifiers.nats import stream_subjects
from slawatch.errors import ConfigError
from tests.conftest import ROOT

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def load(tmp_path: Path, text: str, name: str = "hook.yaml") -> list[object]:
    (tmp_path / name).write_text(text)
    return list(load_notifiers(tmp_path))


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, text)
    return str(exc.value)


def test_shipped_examples_cover_every_type_but_only_console_is_live(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPS_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("SMTP_PASSWORD", "pw")
    monkeypatch.setenv("SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/T0/B0/x")
    monkeypatch.setenv("PAGERDUTY_ROUTING_KEY", "0123456789abcdef0123456789ABCDEF")
    monkeypatch.setenv("TEAMS_WEBHOOK_URL", "https://x.logic.azure.com/workflows/w?sig=s")
    monkeypatch.setenv("OPSGENIE_API_KEY", "0b5c3f9e-1d2a-4e6b-8c7d-9e0f1a2b3c4d")
    configs = load_notifiers(ROOT / "notifiers" / "examples")
    assert [c.type for c in load_notifiers(ROOT / "notifiers")] == ["console"]
    assert {c.type for c in configs} == {
        "webhook",
        "email",
        "amqp",
        "redis",
        "nats",
        "slack",
        "pagerduty",
        "alertmanager",
        "teams",
        "opsgenie",
    }
    for config in configs:
        build(config).close()


def test_env_interpolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    monkeypatch.setenv("HOOK_HOST", "hooks.example")
    (config,) = load(
        tmp_path,
        "type: webhook\nurl: https://${HOOK_HOST}/in\nsecret: ${HOOK_SECRET}\n"
        "headers: {x-host: '${HOOK_HOST}'}\n",
    )
    assert isinstance(config, WebhookConfig)
    assert config.url == "https://hooks.example/in"
    assert config.secret is not None and config.secret.get_secret_value() == SECRET
    assert config.headers == {"x-host": "hooks.example"}
    # Secrets never show in the config's printed form.
    assert SECRET not in repr(config) and SECRET not in str(config)


def test_missing_variable_names_file_field_and_variable(tmp_path: Path) -> None:
    message = error_of(tmp_path, "type: webhook\nurl: http://x\nsecret: ${NOPE_NOT_SET_1}\n")
    assert (
        message == f"{tmp_path}/hook.yaml: secret: environment variable NOPE_NOT_SET_1 is not set"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("type: pigeon\n", "type: 'pigeon' is not a notifier type (one of console, webhook"),
        ("url: http://x\n", "type: is required"),
        ("type: webhook\nurl: ftp://x\n", "url: 'ftp://x' is not an http:// or https:// URL"),
        (
            "type: webhook\nurl: 'http://h:8o8o/'\n",
            "url: not a valid URL: the port is not a number",
        ),
        (
            f"type: webhook\nurl: 'http://{'a' * 64}.example/hook'\n",
            "url: not a valid URL: its host name has a part over 63 characters",
        ),
        (
            "type: webhook\nurl: 'http://hooks..example/hook'\n",
            "url: not a valid URL: its host name has an empty part (two dots in a row",
        ),
        ("type: webhook\nurl: http://x\nsecret: 'not base64!'\n", "secret: must be a Standard"),
        ("type: webhook\nurl: http://x\ntimeout: soon\n", "timeout: 'soon' is not a duration"),
        ("type: webhook\nurl: http://x\nretry: {attempts: 0}\n", "retry.attempts: 0: Input"),
        ("type: webhook\nurl: http://x\ncolour: red\n", "colour: unknown field"),
        ("type: email\nhost: h\nfrom: a@b\n", "to: is required"),
        ("type: email\nhost: h\nfrom: a@b\nto: [c@d]\nusername: u\n", "username and password go"),
        (
            "type: amqp\nrouting_key: '{rule}.{colour}'\n",
            "routing_key: unknown placeholder {colour}",
        ),
    ],
)
def test_bad_notifiers(tmp_path: Path, text: str, expected: str) -> None:
    message = error_of(tmp_path, text)
    assert message.startswith(f"{tmp_path}/hook.yaml: "), message
    assert expected in message


@pytest.mark.parametrize(
    "text",
    [
        "type: webhook\nurl: https://x\n",
        "type: email\nhost: h\nfrom: a@b\nto: [c@d]\n",
        "type: alertmanager\nurl: https://x\n",
        "type: pagerduty\nrouting_key: 0123456789abcdef0123456789ABCDEF\n",
    ],
)
def test_a_ca_file_that_holds_no_certificate_is_refused_at_load(tmp_path: Path, text: str) -> None:
    """An existing file that is no PEM bundle (the probe's /etc/shadow) passed check, then
    `run` died with ssl.SSLError at its start: it is loaded, and refused, with the file."""
    bundle = tmp_path / "not-a-ca.pem"
    bundle.write_text("root:*:19000:0:99999:7:::\n")
    message = error_of(tmp_path, f"{text}ca_file: {bundle}\n")
    assert message == (
        f"{tmp_path}/hook.yaml: ca_file: not a PEM file of CA certificates"
        " (NO_CERTIFICATE_OR_CRL_FOUND)"
    )


def test_a_ca_file_spoilt_after_load_fails_build_in_one_line(tmp_path: Path) -> None:
    """run builds its notifiers after loading them: a file changed in between (or on a
    reload) is a ConfigError, one line, never an ssl traceback."""
    bundle = tmp_path / "ca.pem"
    bundle.write_text(Path(certifi.where()).read_text())
    (hook,) = load(tmp_path, f"type: webhook\nurl: https://x\nca_file: {bundle}\n")
    assert isinstance(hook, WebhookConfig)
    bundle.write_text("not a certificate\n")
    with pytest.raises(ConfigError) as exc:
        build(hook)
    assert str(exc.value) == (
        f"ca_file {str(bundle)!r}: not a PEM file of CA certificates (NO_CERTIFICATE_OR_CRL_FOUND)"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "from: a@b\nto: [not-an-address]\n",
            "to.0: 'not-an-address' is not an e-mail address (no @domain): write"
            " name@example.com or Name <name@example.com>",
        ),
        ("from: x\nto: [c@d]\n", "from: 'x' is not an e-mail address (no @domain)"),
        ("from: a@b\nto: [c@d, '@e']\n", "to.1: '@e' is not an e-mail address"),
        ("from: a@b\nto: ['c@d, e@f']\n", "to.0: 'c@d, e@f' is more than one address"),
        ("from: 'a@b.com>'\nto: [c@d]\n", "from: 'a@b.com>' is not an e-mail address"),
        ("from: 'a@'\nto: [c@d]\n", "from: 'a@' is not an e-mail address: write"),
    ],
)
def test_email_addresses_are_checked_at_load(tmp_path: Path, text: str, expected: str) -> None:
    message = error_of(tmp_path, f"type: email\nhost: h\n{text}")
    assert message.startswith(f"{tmp_path}/hook.yaml: {expected}"), message
    assert "\n" not in message


def test_email_addresses_in_their_usual_forms_pass(tmp_path: Path) -> None:
    (config,) = load(
        tmp_path,
        "type: email\nhost: h\nfrom: 'Slawatch <slawatch@shop.example.com>'\n"
        "to: [oncall@shop.example.com, '<lead@shop.example.com>', 'ops@[192.0.2.1]']\n",
    )
    assert isinstance(config, EmailConfig)
    assert config.from_ == "Slawatch <slawatch@shop.example.com>"


def test_email_addresses_are_bounded_as_smtp_bounds_them(tmp_path: Path) -> None:
    """RFC 5321: at most 64 bytes before the @ and 254 in all (a display name aside);
    one more is a one-line error at load, not a refusal by the server every batch."""
    domain = ".".join(["d" * 60, "d" * 60, "d" * 61]) + ".example"
    assert len("x" * 62 + "@" + domain) == 254
    at_most = [
        "x" * 64 + "@example.com",
        "x" * 62 + "@" + domain,  # 254
        "N" * 300 + " <" + "x" * 62 + "@" + domain + ">",
    ]
    (config,) = load(
        tmp_path, yaml.safe_dump({"type": "email", "host": "h", "from": at_most[0], "to": at_most})
    )
    assert isinstance(config, EmailConfig) and config.to == at_most
    for address, expected in [
        ("x" * 65 + "@example.com", "the part before @ is 65 bytes, over the 64"),
        ('"' + "x y" * 21 + '"@example.com', "the part before @ is 65 bytes, over the 64"),
        ("x" * 63 + "@" + domain, "the address is 255 bytes, over the 254"),
        ("Ops <" + "x" * 63 + "@" + domain + ">", "the address is 255 bytes, over the 254"),
    ]:
        for body in ({"from": address, "to": ["a@b"]}, {"from": "a@b", "to": ["a@b", address]}):
            message = error_of(tmp_path, yaml.safe_dump({"type": "email", "host": "h"} | body))
            field = "from" if body["from"] == address else "to.1"
            assert message.startswith(f"{tmp_path}/hook.yaml: {field}: "), message
            assert f": {expected} an e-mail address may have (RFC 5321)" in message, message
            assert "\n" not in message


def test_email_port_follows_security() -> None:
    base = {"name": "m", "type": "email", "host": "h", "from": "a@b", "to": ["c@d"]}
    assert EmailConfig.model_validate(base).effective_port == 587
    assert EmailConfig.model_validate(base | {"security": "tls"}).effective_port == 465
    assert EmailConfig.model_validate(base | {"security": "none"}).effective_port == 25
    assert EmailConfig.model_validate(base | {"port": 2525}).effective_port == 2525


def test_nats_stream_subjects() -> None:
    assert stream_subjects("slawatch.{rule}.{severity}") == ["slawatch.>"]
    assert stream_subjects("{rule}") == [">"]


def test_secrets_are_scrubbed_from_errors() -> None:
    config = NatsConfig.model_validate({"name": "n", "type": "nats", "url": "nats://u:pw123@h:1"})
    notifier = build(config)
    try:
        assert notifier.scrub("failed nats://u:pw123@h:1") == "failed ***"  # type: ignore[attr-defined]
    finally:
        notifier.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "type: webhook\nurl: http://x\nheaders: {x-a: 'caf\u00e9'}\n",
            "headers: x-a: the value must",
        ),
        ('type: webhook\nurl: http://x\nheaders: {x-a: "a\\nb"}\n', "headers: x-a: the value must"),
        ("type: webhook\nurl: http://x\nheaders: {'a b': c}\n", "headers: 'a b' is not an HTTP"),
        ("type: amqp\nrouting_key: '{rule!z}'\n", "routing_key: cannot be filled in: Unknown conv"),
        ("type: redis\nstream: '{rule:d}'\n", "stream: cannot be filled in: "),
        ("type: nats\nsubject: 'a.{rule'\n", "subject: expected '}' before end of string"),
        ("type: redis\nmaxlen: 10000000000\n", "maxlen: 10000000000: Input should be less"),
        ("type: redis\nurl: http://h\n", "url: must start with redis:// or rediss:// or unix://"),
    ],
)
def test_values_that_would_fail_at_send_time_fail_at_load(
    tmp_path: Path, text: str, expected: str
) -> None:
    message = error_of(tmp_path, text)
    assert expected in message, message
    assert "caf" not in message  # a header value may be a secret: never quoted


@pytest.mark.parametrize(
    "url",
    [
        "redis://:zq#ss-word@127.0.0.1:6379/0",
        "redis://:zq/ss-word@127.0.0.1:6379/0",
        "redis://:zq?ss-word@127.0.0.1:6379/0",
        "amqp://guest:zq#ss-word@127.0.0.1:5672/",
        "amqp://guest:zq/ss-word@127.0.0.1:5672/",
        "nats://u:zq#ss-word@127.0.0.1:4222",
        "http://u:zq#ss-word@127.0.0.1:80/hook",
    ],
)
def test_a_password_that_breaks_its_url_is_never_quoted(tmp_path: Path, url: str) -> None:
    """The URL parsers quote what they took for a port, here the password's head ('zq')."""
    kind = url.split("://")[0].replace("http", "webhook")
    message = error_of(tmp_path, f"type: {kind}\nurl: '{url}'\n")
    assert "url: not a valid URL: the port is not a number" in message, message
    # The message names the file, whose folder is pytest's, of random letters.
    assert "zq" not in message.replace(str(tmp_path), ""), message


def test_scrub_covers_every_form_of_a_url_secret() -> None:
    config = NatsConfig.model_validate(
        {"name": "n", "type": "nats", "url": "nats://u:p%40ss-word@h:1?token=query-tok"}
    )
    notifier = build(config)
    scrub = notifier.scrub  # type: ignore[attr-defined]
    try:
        assert scrub("auth p%40ss-word / p@ss-word / query-tok") == "auth *** / *** / ***"
    finally:
        notifier.close()
    token = build(
        NatsConfig.model_validate({"name": "t", "type": "nats", "url": "nats://tok-en@h"})
    )
    try:
        assert token.scrub("bad token tok-en") == "bad token ***"  # type: ignore[attr-defined]
    finally:
        token.close()


SLACK_TOKEN = "zzSlackS3cretTokenzz"
ROUTING_KEY = "0123456789abcdef0123456789ABCDEF"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("type: slack\n", "url: is required"),
        ("type: slack\nurl: hooks.slack.com/x\n", "url: must start with https:// or http://"),
        (
            f"type: slack\nurl: 'https://h:99x/services/T/B/{SLACK_TOKEN}'\n",
            "url: not a valid URL: the port is not a number",
        ),
        ("type: slack\nurl: 'https:///services'\n", "url: not a valid URL: no host"),
        (
            f"type: slack\nurl: 'https://{'b' * 64}.example/services/T/B/x'\n",
            "url: not a valid URL: its host name has a part over 63 characters",
        ),
        (
            "type: slack\nurl: 'https://.hooks.slack.com/services/T/B/x'\n",
            "url: not a valid URL: its host name has an empty part (two dots in a row",
        ),
        ("type: slack\nurl: 'https://ho st/x'\n", "a space in the URL (percent-encode it as %20)"),
        ("type: slack\nurl: https://h/x\nlisted: 46\n", "listed: 46: Input should be less"),
        ("type: pagerduty\n", "routing_key: is required"),
        (
            f"type: pagerduty\nrouting_key: {ROUTING_KEY}x\n",
            "routing_key: must be the 32-character integration key of an Events API v2",
        ),
        (
            f"type: pagerduty\nrouting_key: {ROUTING_KEY}\nbase_url: events.pagerduty.com\n",
            "base_url: 'events.pagerduty.com' is not an http:// or https:// URL",
        ),
        (f"type: pagerduty\nrouting_key: {ROUTING_KEY}\nsource: ''\n", "source: '': String"),
        ("type: teams\n", "url: is required"),
        (
            f"type: teams\nurl: 'logic.azure.com/workflows/w?sig={SLACK_TOKEN}'\n",
            "url: must start with https:// or http://",
        ),
        ("type: teams\nurl: https://h/x\nlisted: 11\n", "listed: 11: Input should be less"),
        ("type: opsgenie\n", "api_key: is required"),
        (
            f"type: opsgenie\napi_key: '{SLACK_TOKEN}!'\n",
            "api_key: must be the API key of an Opsgenie API integration",
        ),
        (
            f"type: opsgenie\napi_key: {ROUTING_KEY}\nurl: api.opsgenie.com\n",
            "url: 'api.opsgenie.com' is not an http:// or https:// URL",
        ),
        (
            f"type: opsgenie\napi_key: {ROUTING_KEY}\npriorities: {{critical: P0}}\n",
            "priorities.critical: 'P0': Input should be 'P1', 'P2', 'P3', 'P4' or 'P5'",
        ),
        (
            f"type: opsgenie\napi_key: {ROUTING_KEY}\npriorities: {{error: P1}}\n",
            "priorities.error.[key]: 'error': Input should be 'critical', 'warning'",
        ),
        (
            f"type: opsgenie\napi_key: {ROUTING_KEY}\ntags: ['{'t' * 51}']\n",
            "at most 50 characters",
        ),
        (f"type: opsgenie\napi_key: {ROUTING_KEY}\nsource: {'s' * 101}\n", "source: '"),
        (
            f"type: opsgenie\napi_key: {ROUTING_KEY}\ntags: [{', '.join('t' * 17)}]\n",
            "List should have at most 16 items after validation, not 17",
        ),
        ("type: alertmanager\nurl: http://am\nlabels: {severity: x}\n", "labels: severity is set"),
        ("type: alertmanager\nurl: http://am\nlabels: {a-b: x}\n", "labels: 'a-b' is not a label"),
        ("type: alertmanager\nurl: http://am\nlabels: {team: ''}\n", "labels: team: the value"),
        ("type: alertmanager\nurl: http://am\nfiring_for: 31d\n", "firing_for: '31d' is longer"),
        (
            "type: alertmanager\nurl: http://am\ngenerator_url: 'http://s/{colour}'\n",
            "generator_url: unknown placeholder {colour}",
        ),
        (
            "type: alertmanager\nurl: http://am\ngenerator_url: '/alerts?rule={rule}'\n",
            "generator_url: '/alerts?rule={rule}' is not an http:// or https:// URL",
        ),
        ("type: alertmanager\nurl: am:9093\n", "url: 'am:9093' is not an http:// or https://"),
    ],
)
def test_bad_paging_notifiers(tmp_path: Path, text: str, expected: str) -> None:
    message = error_of(tmp_path, text)
    assert message.startswith(f"{tmp_path}/hook.yaml: "), message
    assert expected in message, message
    assert "\n" not in message
    # The hook URL's token and the routing key are secrets: never quoted.
    assert SLACK_TOKEN not in message and ROUTING_KEY not in message


def test_paging_secrets_never_print(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "p").mkdir()
    (slack,) = load(
        tmp_path / "s", f"type: slack\nurl: https://hooks.slack.com/services/T/B/{SLACK_TOKEN}\n"
    )
    (pagerduty,) = load(tmp_path / "p", f"type: pagerduty\nrouting_key: {ROUTING_KEY}\n")
    for config in (slack, pagerduty):
        assert SLACK_TOKEN not in repr(config) and ROUTING_KEY not in repr(config)
    assert isinstance(slack, SlackConfig)
    notifier = build(slack)
    try:
        assert notifier.scrub(f"POST https://hooks.slack.com/services/T/B/{SLACK_TOKEN}") == (
            "POST https://hooks.slack.com/…"
        )
    finally:
        notifier.close()


def test_teams_and_opsgenie_secrets_never_print(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "o").mkdir()
    (teams,) = load(
        tmp_path / "t", f"type: teams\nurl: 'https://h/workflows/w?sig={SLACK_TOKEN}'\n"
    )
    (opsgenie,) = load(tmp_path / "o", f"type: opsgenie\napi_key: {ROUTING_KEY}\n")
    assert SLACK_TOKEN not in repr(teams) and ROUTING_KEY not in repr(opsgenie)
    for config, secret in ((teams, SLACK_TOKEN), (opsgenie, ROUTING_KEY)):
        notifier = build(config)  # type: ignore[arg-type]
        try:
            assert secret not in notifier.scrub(f"POST https://h/workflows/w?sig={secret} {secret}")
        finally:
            notifier.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "type: opsgenie\napi_key: 12345678-1234-1234-1234-123456789012\nurl: https://api.opsgenie.com/v2/alerts\n",
            "url: 'https://api.opsgenie.com/v2/alerts' ends with /v2/alerts, which slawatch"
            " adds: give the base URL (without /v2/alerts)",
        ),
        (
            "type: pagerduty\nrouting_key: 0123456789abcdef0123456789abcdef\nbase_url: https://events.pagerduty.com/v2/enqueue/\n",
            "base_url: 'https://events.pagerduty.com/v2/enqueue/' ends with /v2/enqueue",
        ),
    ],
    ids=["opsgenie", "pagerduty"],
)
def test_an_api_endpoint_given_as_the_base_url_is_one_line(
    tmp_path: Path, text: str, expected: str
) -> None:
    """The endpoint copied from the service's docs was accepted, and every alert was then
    posted to .../v2/alerts/v2/alerts (a 404: dead)."""
    message = error_of(tmp_path, text)
    assert f"hook.yaml: {expected}" in message, message


def test_a_base_url_under_a_route_prefix_is_accepted() -> None:
    OpsgenieConfig.model_validate(
        {
            "name": "o",
            "type": "opsgenie",
            "api_key": "12345678-1234-1234-1234-123456789012",
            "url": "https://proxy.example/og/",
        }
    )


def test_a_fully_qualified_host_name_with_its_trailing_dot_is_accepted(tmp_path: Path) -> None:
    """One trailing dot ends a fully qualified name; only a part left empty is refused."""
    (hook,) = load(tmp_path, "type: webhook\nurl: 'http://hooks.example./hook'\n")
    assert isinstance(hook, WebhookConfig)
    assert str(hook.url) == "http://hooks.example./hook"
