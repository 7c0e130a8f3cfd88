"""Configuration that cannot be trusted is warned of, at its file, line and key, by `nodbot
check-config` (exit status 0) and by `nodbot serve` at start: secrets written in the file or
as a `${VAR:-default}`, weak secrets, one secret in two places, plain http beyond loopback.
No warning shows a secret."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import textwrap
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodbot.bot.config import (
    Config,
    load_config,
    trust_warnings,
    undecidable_warning,
    unread_replies_warning,
)
from nodbot.bot.serve import serving
from tests.bot.test_cli import nodbot

ROOT = Path(__file__).resolve().parents[2]

STRONG = {  # from the environment, long, varied and each its own
    "NODBOT_TOKEN_ANA": "k3Vq9PzL2mX8rT5wY1nB7cD4fG6hJ0sA-ana",
    "NODBOT_WEB_SECRET": "Qm7Rt2Yx9Lp4Wv6Zb1Nc8Hd3Kf5Js0Ga-web",
    "SLACK_BOT_TOKEN": "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx",
    "SLACK_SIGNING_SECRET": "8f14e45fceea167a5a36dedd4bea2543aa",
    "NODBOT_WEBHOOK_SECRET": "Wh9Lk2Pq7Zr4Tx1Vb8Nm5Cs3Df6Gh0Jy-hook",
    "NODBOT_AUDIT_KEY": "Au4Dk8Ey2Fz6Gw0Hv3Ju7Ks1Lr5Mq9Np-audit",
    "SMTP_PASSWORD": "Sm9Tp2Pw7Qx4Ry1Vz8Wa5Bc3Cd6De0Ef-mail",
    "IMAP_PASSWORD": "Im3Ap7Pw2Qx9Ry4Vz1Wa6Bc8Cd5De0Ef-imap",
}

CLEAN = """
store:
  url: sqlite:///{db}
server:
  host: {host}
  port: 0
api:
  tokens:
    - name: ana
      token: ${{NODBOT_TOKEN_ANA}}
      scopes: [approvals:read]
web:
  secret: ${{NODBOT_WEB_SECRET}}
  public_url: {public_url}
slack:
  bot_token: ${{SLACK_BOT_TOKEN}}
  signing_secret: ${{SLACK_SIGNING_SECRET}}
webhooks:
  - name: ops
    url: https://ops.example.com/nodbot
    secret: ${{NODBOT_WEBHOOK_SECRET}}
audit:
  key: ${{NODBOT_AUDIT_KEY}}
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp:
    host: smtp.example.com
    username: nodbot@example.com
    password: ${{SMTP_PASSWORD}}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "nodbot.yml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def clean(
    tmp_path: Path, *, host: str = "127.0.0.1", public_url: str = "https://nodbot.example.com"
) -> Path:
    text = CLEAN.format(db=tmp_path / "nodbot.db", host=host, public_url=public_url)
    return write(tmp_path, text)


def check_config(path: Path, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environment = {name: value for name, value in os.environ.items() if name not in STRONG}
    return subprocess.run(
        [nodbot(), "check-config", str(path)],
        capture_output=True,
        text=True,
        cwd=path.parent,
        env={**environment, **environ},
    )


def brief(warning: str) -> str:
    """The place of a warning and the first three words of what it says."""
    where, said = warning.split(": warning: ")
    return f"{where}: {' '.join(said.split()[:3])}"


def warnings_of(path: Path, environ: dict[str, str] | None = None) -> list[str]:
    return trust_warnings(load_config(path, environ=STRONG if environ is None else environ))


def test_secrets_from_the_environment_leave_nothing_to_warn_of(tmp_path: Path) -> None:
    assert warnings_of(clean(tmp_path)) == []


def test_the_example_stays_free_of_warnings() -> None:
    environment = {name: value for name, value in os.environ.items() if name != "NODBOT_PORT"}
    completed = subprocess.run(
        [nodbot(), "check-config", "nodbot.example.yml"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environment,
    )
    assert (completed.returncode, completed.stderr) == (0, "")
    assert completed.stdout == "nodbot.example.yml: ok (4 rules, 1 agent)\n"


def test_the_examples_commented_sections_are_clean_once_uncommented(tmp_path: Path) -> None:
    """Every section the example shows commented out, uncommented, with its variables set."""
    text = (ROOT / "nodbot.example.yml").read_text(encoding="utf-8")
    sections = ("audit", "api", "web", "slack", "email", "webhooks")
    lines = []
    inside = False
    for line in text.splitlines():
        if re.match(rf"# ({'|'.join(sections)}):$", line):
            inside = True
        elif inside and not line.startswith("#   "):
            inside = False
        if inside and not line.startswith("#   # "):
            line = line[2:]
        lines.append(line)
    path = tmp_path / "nodbot.yml"
    path.write_text("\n".join(lines).replace("examples.support_agent:agent", "x.y:z"))
    environ = {**STRONG, "NODBOT_TOKEN_DASHBOARD": "Db5Sh8Bd2Rd7Ta4Sh1Bo9Ar3Dx6Yz0Qw-dash"}
    config = load_config(path, environ=environ)
    assert config.audit.key is not None and config.web.secret is not None
    assert config.slack is not None and config.webhooks and config.email
    assert len(config.api.tokens) == 2
    assert trust_warnings(config) == []


LITERAL = """
api:
  tokens:
    - name: lead@example.com
      token: Lt7Kq2Wz9Xp4Rv1Yn8Bm5Cd3Fg6Hj0Ls-lead
      scopes: [approvals:read]
web:
  secret: "Ws4Ex8Rc2Tv6Yb0Un3Im7Ok1Pl5Az9Sx-web"
slack:
  mode: socket
  bot_token: xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx
  app_token: xapp-1-A0123456789-0123456789012-abcdef0123456789abcdef
webhooks:
  - name: ops-hook
    url: https://ops.example.com/nodbot
    secret: Wh9Lk2Pq7Zr4Tx1Vb8Nm5Cs3Df6Gh0Jy-hook
audit:
  key: Au4Dk8Ey2Fz6Gw0Hv3Ju7Ks1Lr5Mq9Np-audit
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp:
    host: smtp.example.com
    username: nodbot@example.com
    password: Sm9Tp2Pw7Qx4Ry1Vz8Wa5Bc3Cd6De0Ef-mail
"""
LITERAL_SECRETS = re.findall(r"(?:token|secret|key|password): \"?([\w-]{20,})", LITERAL)


def test_each_secret_written_in_the_file_is_warned_of(tmp_path: Path) -> None:
    path = write(tmp_path, LITERAL)
    listed = [
        (3, "api.tokens.0.token", "NODBOT_TOKEN_LEAD_EXAMPLE_COM"),
        (6, "web.secret", "NODBOT_WEB_SECRET"),
        (9, "slack.bot_token", "SLACK_BOT_TOKEN"),
        (10, "slack.app_token", "SLACK_APP_TOKEN"),
        (14, "webhooks.0.secret", "NODBOT_WEBHOOK_SECRET_OPS_HOOK"),
        (16, "audit.key", "NODBOT_AUDIT_KEY"),
        (23, "email.smtp.password", "SMTP_PASSWORD"),
    ]
    assert warnings_of(path) == [
        f"{path}:{line + 1}: {key}: warning: a secret written in the file: whoever reads the "
        f"file (or its history) has it; write ${{{name}}} and set {name} in the environment"
        for line, key, name in listed
    ]


def test_a_secret_with_a_default_is_a_secret_written_in_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        web:
          secret: ${NODBOT_WEB_SECRET:-Df3Lt8Sc2Rt7Wr4It1Te9Nf5Il6Ex0Qa-dflt}
        """,
    )
    expected = [
        f"{path}:2: web.secret: warning: the secret has a default, ${{NODBOT_WEB_SECRET:-...}}"
        ": a default is written in the file, so it is a secret written in the file; write "
        "${NODBOT_WEB_SECRET} without a default and set NODBOT_WEB_SECRET in the environment"
    ]
    assert warnings_of(path, {}) == expected
    assert warnings_of(path, {"NODBOT_WEB_SECRET": ""}) == expected  # empty: the default
    assert warnings_of(path) == expected  # set, the default is still in the file


def test_weak_secrets_are_warned_of(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        api:
          tokens:
            - {name: a, token: "${A}", scopes: [approvals:read]}
            - {name: b, token: "${B}", scopes: [approvals:read]}
            - {name: c, token: "${C}", scopes: [approvals:read]}
            - {name: d, token: "${D}", scopes: [approvals:read]}
            - {name: e, token: "${E}", scopes: [approvals:read]}
        """,
    )
    environ = {
        "A": "short-but-valid-Xy7",  # 19 characters
        "B": "x" * 40,
        "C": "1234567890" * 4,
        "D": "abcabcabcabcabcabcabcabcabcabcabcabc",
        "E": "Ok5Lg8Vr2Ty6Rn0Dm3Sc7Rt1Ex9Mp4Lz-fine",
    }
    advice = (
        "use at least 32 random characters, such as the output of "
        "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
    )
    assert warnings_of(path, environ) == [
        f"{path}:3: api.tokens.0.token: warning: a weak secret (shorter than 32 characters): "
        f"{advice}",
        f"{path}:4: api.tokens.1.token: warning: a weak secret (one character repeated): {advice}",
        f"{path}:5: api.tokens.2.token: warning: a weak secret (only digits): {advice}",
        f"{path}:6: api.tokens.3.token: warning: a weak secret (fewer than 8 different "
        f"characters): {advice}",
    ]


def test_one_secret_in_two_places_names_both(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        api:
          tokens:
            - name: ana
              token: ${NODBOT_TOKEN_ANA}
              scopes: [approvals:read]
        web:
          secret: ${NODBOT_TOKEN_ANA}
        webhooks:
          - name: ops
            url: https://ops.example.com/nodbot
            secret: ${NODBOT_AUDIT_KEY}
        audit:
          key: ${NODBOT_AUDIT_KEY}
        """,
    )
    advice = "give each its own, so that one that leaks does not give the other away"
    assert warnings_of(path) == [
        f"{path}:7: web.secret: warning: the same secret as api.tokens.0.token (line 4): {advice}",
        f"{path}:13: audit.key: warning: the same secret as webhooks.0.secret (line 11): {advice}",
    ]


HOST_ADVICE = (
    "API tokens, sign-in links and sessions cross the network readable; put it behind a TLS "
    "proxy and set web.public_url to the proxy's https:// address (or listen on 127.0.0.1)"
)


@pytest.mark.parametrize("public_url", [None, "http://nodbot.example.com"])
def test_listening_beyond_loopback_over_plain_http_is_warned_of(
    tmp_path: Path, public_url: str | None
) -> None:
    path = clean(tmp_path, host="0.0.0.0", public_url=public_url or "null")
    why = "web.public_url is not set" if public_url is None else f"web.public_url is {public_url}"
    assert warnings_of(path) == [
        f"{path}:4: server.host: warning: the bot listens on 0.0.0.0 (beyond loopback) over "
        f"plain http ({why}): {HOST_ADVICE}"
    ]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.5"])
def test_loopback_or_https_leaves_nothing_to_warn_of(tmp_path: Path, host: str) -> None:
    assert warnings_of(clean(tmp_path, host=host, public_url="http://localhost:8080")) == []
    assert warnings_of(clean(tmp_path, host="0.0.0.0")) == []  # https://: behind a proxy


def test_the_host_serve_is_told_counts(tmp_path: Path) -> None:
    config = load_config(clean(tmp_path, public_url="null"), environ=STRONG)
    assert trust_warnings(config, host="127.0.0.1") == []
    assert trust_warnings(config, host="0.0.0.0") == [
        f"{tmp_path / 'nodbot.yml'}:4: server.host: warning: the bot listens on 0.0.0.0 "
        "(beyond loopback), as --host says, over plain http (web.public_url is not set): "
        f"{HOST_ADVICE}"
    ]


def test_a_host_from_the_environment_is_not_shown(tmp_path: Path) -> None:
    path = clean(tmp_path, host="${NODBOT_HOST}", public_url="null")
    [warning] = warnings_of(path, {**STRONG, "NODBOT_HOST": "10.1.2.3"})
    assert "10.1.2.3" not in warning
    assert warning.startswith(f"{path}:4: server.host: warning: the bot listens beyond loopback")


def test_check_config_prints_the_warnings_without_a_secret_and_exits_0(tmp_path: Path) -> None:
    default = "${NODBOT_AUDIT_KEY:-a-default-audit-key}"
    text = LITERAL.replace("Au4Dk8Ey2Fz6Gw0Hv3Ju7Ks1Lr5Mq9Np-audit", default)
    path = write(tmp_path, text + "server:\n  host: 0.0.0.0\n")
    completed = check_config(path, {})
    assert completed.returncode == 0
    assert completed.stdout == f"{path}: ok (0 rules, 0 agents, 9 warnings)\n"
    assert [brief(line) for line in completed.stderr.splitlines()] == [
        f"{path}:4: api.tokens.0.token: a secret written",
        f"{path}:7: web.secret: a secret written",
        f"{path}:10: slack.bot_token: a secret written",
        f"{path}:11: slack.app_token: a secret written",
        f"{path}:15: webhooks.0.secret: a secret written",
        f"{path}:17: audit.key: the secret has",
        f"{path}:17: audit.key: a weak secret",
        f"{path}:24: email.smtp.password: a secret written",
        f"{path}:26: server.host: the bot listens",
    ]
    for secret in [*LITERAL_SECRETS, "a-default-audit-key"]:
        assert secret not in completed.stderr + completed.stdout


async def test_serve_logs_the_warnings_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = clean(tmp_path)
    text = path.read_text().replace("${NODBOT_WEB_SECRET}", "Ws4Ex8Rc2Tv6Yb0Un3Im7Ok1Pl5Az9Sx")
    path.write_text(text.replace("${NODBOT_AUDIT_KEY}", "${NODBOT_TOKEN_ANA}"))
    for name, value in STRONG.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NODBOT_TOKEN_ANA", "short-token-of-ana-00")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="nodbot.bot.serve"):
        async with serving(str(path)) as bot:
            assert bot.url.startswith("http://127.0.0.1:")
    logged = [record.getMessage() for record in caplog.records if record.name == "nodbot.bot.serve"]
    assert [brief(line) for line in logged] == [
        f"{path}:9: api.tokens.0.token: a weak secret",
        f"{path}:12: web.secret: a secret written",
        f"{path}:22: audit.key: a weak secret",
        f"{path}:22: audit.key: the same secret",
        f"{path}:23: email: no email reply",  # its email: section trusts no server
    ]
    for secret in ("Ws4Ex8Rc2Tv6Yb0Un3Im7Ok1Pl5Az9Sx", "short-token-of-ana-00"):
        assert secret not in caplog.text


def test_a_configuration_not_read_from_a_file_is_checked_too() -> None:
    config = Config.model_validate({"web": {"secret": "z" * 20}, "server": {"host": "::"}})
    assert [brief(warning) for warning in trust_warnings(config)] == [
        "<config>: web.secret: a weak secret",
        "<config>: server.host: the bot listens",
    ]


def test_serve_warns_when_nobody_can_decide_a_review() -> None:
    rule = {"tool": "refund", "reviewers": ["lead@example.com"]}
    lonely = Config.model_validate({"rules": [rule]})
    warning = undecidable_warning(lonely)
    assert warning is not None and "nobody can decide a review" in warning
    assert "approvals:decide" in warning and "web.secret" in warning and "slack" in warning
    assert undecidable_warning(Config.model_validate({})) is None  # no review is ever opened
    with_inbox = Config.model_validate({"rules": [rule], "web": {"secret": "s" * 40}})
    assert undecidable_warning(with_inbox) is None
    token = {"name": "lead", "token": "t" * 40, "scopes": ["approvals:decide"]}
    with_token = Config.model_validate({"rules": [rule], "api": {"tokens": [token]}})
    assert undecidable_warning(with_token) is None
    teams = {"app_id": "app-1", "app_password": "p" * 40}
    assert undecidable_warning(Config.model_validate({"rules": [rule], "teams": teams})) is None
    discord = {
        "application_id": "123456789",
        "public_key": "ab" * 32,
        "bot_token": "b" * 40,
        "channels": ["987654321"],
    }
    with_discord = Config.model_validate({"rules": [rule], "discord": discord})
    assert undecidable_warning(with_discord) is None


def test_serve_warns_when_no_email_reply_can_decide() -> None:
    email = {
        "from": "nodbot@example.com",
        "reply_to": "approvals@example.com",
        "smtp": {"host": "127.0.0.1", "tls": "none"},
    }
    web = {"secret": "s" * 40}
    unbelieved = Config.model_validate({"web": web, "email": email})
    warning = unread_replies_warning(unbelieved)
    assert warning is not None and "no email reply can decide" in warning
    assert "trusted_authserv_id" in warning
    trusted = {**email, "trusted_authserv_id": "mx.example.com"}
    assert unread_replies_warning(Config.model_validate({"web": web, "email": trusted})) is None
    believed = {**email, "require_authenticated_sender": False}
    assert unread_replies_warning(Config.model_validate({"web": web, "email": believed})) is None
    assert unread_replies_warning(Config.model_validate({})) is None


# --- a password in the store URL ------------------------------------------------------------

STORE_LITERAL = (
    "a password written in the file: whoever reads the file (or its history) has it; write "
    "postgresql://user:${DB_PASSWORD}@host/db and set DB_PASSWORD in the environment"
)


def store_default(name: str) -> str:
    return (
        f"the store URL's password has a default, ${{{name}:-...}}: a default is written in "
        f"the file, so it is a password written in the file; write ${{{name}}} without a "
        f"default and set {name} in the environment"
    )


def store_warnings(tmp_path: Path, url: str, environ: dict[str, str] | None = None) -> list[str]:
    """The warnings of a file whose `store.url` (line 2) is `url`, written as a JSON string."""
    path = write(tmp_path, f"store:\n  url: {json.dumps(url)}\n")
    return warnings_of(path, environ or {})


@pytest.mark.parametrize(
    ("url", "environ"),
    [
        ("postgresql://nodbot:hunter2@db/nodbot", {}),
        ("postgresql+asyncpg://nodbot:hunter2@db:5432/nodbot?ssl=require", {}),
        ("postgresql://nodbot:hunter2@${DB_HOST}/nodbot", {"DB_HOST": "db"}),
        ("postgresql://${DB_USER}:hunter2@db/nodbot", {"DB_USER": "nodbot"}),
        ("postgresql://nodbot:hunter2${DB_SUFFIX}@db/nodbot", {"DB_SUFFIX": "-x"}),
        ("postgresql://nodbot@db/nodbot?sslmode=require&password=hunter2", {}),
        ("postgresql://nodbot:hunter2@db/nodbot?password=${DB_PASSWORD}", {"DB_PASSWORD": "x"}),
    ],
)
def test_a_password_written_in_the_store_url_is_warned_of(
    tmp_path: Path, url: str, environ: dict[str, str]
) -> None:
    path = tmp_path / "nodbot.yml"
    warnings = store_warnings(tmp_path, url, environ)
    assert warnings == [f"{path}:2: store.url: warning: {STORE_LITERAL}"]
    assert "hunter2" not in warnings[0]


@pytest.mark.parametrize("environ", [{}, {"DB_PASSWORD": ""}, {"DB_PASSWORD": "from-the-env"}])
def test_a_store_password_with_a_default_is_a_password_written_in_the_file(
    tmp_path: Path, environ: dict[str, str]
) -> None:
    url = "postgresql://nodbot:${DB_PASSWORD:-hunter2}@db/nodbot"
    warnings = store_warnings(tmp_path, url, environ)
    assert warnings == [
        f"{tmp_path / 'nodbot.yml'}:2: store.url: warning: {store_default('DB_PASSWORD')}"
    ]
    assert "hunter2" not in warnings[0]


@pytest.mark.parametrize(
    ("url", "environ"),
    [
        ("postgresql://nodbot:${DB_PASSWORD}@db/nodbot", {"DB_PASSWORD": "hunter2"}),
        ("postgresql://nodbot:${DB_PASSWORD}@${DB_HOST:-db}/nodbot", {"DB_PASSWORD": "hunter2"}),
        ("postgresql://nodbot@db/nodbot?password=${DB_PASSWORD}", {"DB_PASSWORD": "hunter2"}),
        ("${DATABASE_URL}", {"DATABASE_URL": "postgresql://nodbot:hunter2@db/nodbot"}),
        ("postgresql://${DB_USERINFO}@db/nodbot", {"DB_USERINFO": "nodbot:hunter2"}),
        ("postgresql://nodbot@db/nodbot", {}),
        ("postgresql://db/nodbot?sslmode=require", {}),
        ("sqlite:///var/lib/nodbot/nodbot.db", {}),
        ("nodbot.db", {}),
    ],
)
def test_a_store_url_without_a_password_in_the_file_leaves_nothing_to_warn_of(
    tmp_path: Path, url: str, environ: dict[str, str]
) -> None:
    assert store_warnings(tmp_path, url, environ) == []


def test_check_config_warns_of_the_store_password_without_showing_it(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        store:
          url: postgresql://nodbot:hunter2-Secret@db.internal:5432/nodbot
        """,
    )
    completed = check_config(path, {})
    assert completed.returncode == 0
    assert completed.stdout == f"{path}: ok (0 rules, 0 agents, 1 warning)\n"
    assert completed.stderr == f"{path}:2: store.url: warning: {STORE_LITERAL}\n"
    assert "hunter2" not in completed.stdout + completed.stderr
    fixed = path.read_text().replace("hunter2-Secret", "${DB_PASSWORD}")
    path.write_text(fixed)
    completed = check_config(path, {"DB_PASSWORD": "hunter2-Secret"})
    assert (completed.returncode, completed.stderr) == (0, "")
    assert completed.stdout == f"{path}: ok (0 rules, 0 agents)\n"


# Where a password may be written in the store URL: `{}` is the password, URL-quoted.
PASSWORD_FORMS = {
    "literal": ("postgresql://nodbot:{}@db/nodbot", STORE_LITERAL),
    "literal, the host from the environment": (
        "postgresql://nodbot:{}@${{DB_HOST}}/nodbot",
        STORE_LITERAL,
    ),
    "literal, as a query parameter": ("postgresql://nodbot@db/nodbot?password={}", STORE_LITERAL),
    "a default": (
        "postgresql://nodbot:${{DB_PASSWORD:-{}}}@db/nodbot",
        store_default("DB_PASSWORD"),
    ),
}


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(password=st.text(min_size=1, max_size=40), form=st.sampled_from(sorted(PASSWORD_FORMS)))
def test_no_warning_ever_shows_the_store_password(tmp_path: Path, password: str, form: str) -> None:
    template, said = PASSWORD_FORMS[form]
    quoted = quote(password, safe="")
    warnings = store_warnings(tmp_path, template.format(quoted), {"DB_HOST": "db"})
    expected = [f"{tmp_path / 'nodbot.yml'}:2: store.url: warning: {said}"]
    assert warnings == expected  # the same text whatever the password: it cannot show it
    for shown in {password, quoted}:
        if shown not in expected[0]:  # a password such as "a" is in any text
            assert shown not in warnings[0]


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(password=st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=40))
def test_a_store_password_from_the_environment_is_never_warned_of(
    tmp_path: Path, password: str
) -> None:
    url = "postgresql://nodbot:${DB_PASSWORD}@db/nodbot"
    assert store_warnings(tmp_path, url, {"DB_PASSWORD": password}) == []
