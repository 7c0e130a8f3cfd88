"""`nodbot serve`'s logs (`log:`): a line per request, review opened, decision, run step and
delivery, as JSON or text on stderr, at the configured level, and never a secret."""

from __future__ import annotations

import enum
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from nodbot.bot.config import ConfigError, load_config
from nodbot.bot.logs import JsonFormatter, TextFormatter
from nodbot.bot.web import sign_in_link
from tests.bot.ledger_agent import config_yaml
from tests.bot.processes import Running, nodbot_serve
from tests.bot.webhook_receiver import SECRET as WEBHOOK_SECRET
from tests.bot.webhook_receiver import receiving
from tests.fakes.slack import SlackFake, slack_fake
from tests.support import eventually

TOKEN = "token-of-lead-00000"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
WEB_SECRET = "web-secret-for-tests-0000"
LEAD = "U0123LEADS"
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z (debug|info|warning|error) \S+ \S")


def write_config(
    tmp_path: Path, log: str, hook: str | None = None, slack: SlackFake | None = None
) -> Path:
    """A bot whose one rule has the refunds reviewed by the API token's holder; Slack's the
    fake `slack` (whose user is that holder), when given."""
    path = tmp_path / "nodbot.yml"
    webhooks = f"webhooks: [{{name: ops, url: '{hook}', secret: {WEBHOOK_SECRET}}}]" if hook else ""
    lead, slack_section = LEAD, ""
    if slack is not None:
        lead = slack.add_user("lead", email="lead@example.com").id
        slack_section = (
            f"slack: {{bot_token: {slack.bot_token}, signing_secret: {slack.signing_secret}, "
            f"api_url: '{slack.api_url}'}}"
        )
    settings = f"""{webhooks}
log: {log}
{slack_section}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
web: {{secret: {WEB_SECRET}}}"""
    store = f"sqlite:///{tmp_path / 'nodbot.db'}"
    path.write_text(
        config_yaml(store, settings=settings, token=TOKEN, lead=lead, self_approval=True)
    )
    return path


def log_of(config: Path) -> str:
    """What the bot of `config` wrote to stderr so far (`nodbot_serve` keeps it beside)."""
    return config.with_suffix(".log").read_text()


def json_lines(config: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log_of(config).splitlines()]


def named(lines: list[dict[str, Any]], message: str, **fields: Any) -> list[dict[str, Any]]:
    return [
        line
        for line in lines
        if line["message"] == message and all(line.get(k) == v for k, v in fields.items())
    ]


async def start_and_decide(bot: Running) -> tuple[str, str]:
    """Start a run that waits for a refund's review, approve it over the API, and wait until
    the run has finished; its run id and approval id."""
    async with httpx.AsyncClient(base_url=bot.url, headers=HEADERS) as client:
        body = {"agent": "ledger", "input": "refund o-1 5"}
        started = await client.post("/runs?from=test", json=body)
        assert started.status_code == 201, started.text
        run_id, approval_id = started.json()["run_id"], started.json()["pending"][0]["approval_id"]
        decided = await client.post(f"/approvals/{approval_id}/decide", json={"action": "approve"})
        assert decided.status_code == 200, decided.text

        async def finished() -> bool:
            run = (await client.get(f"/runs/{run_id}")).json()
            return bool(run["status"] == "finished")

        await eventually(finished, "the run finishes")
    return run_id, approval_id


async def test_a_json_log_has_a_line_per_request_review_decision_step_and_delivery(
    tmp_path: Path,
) -> None:
    async with receiving() as receiver:
        config = write_config(tmp_path, "{format: json, level: info}", hook=receiver.url)
        async with nodbot_serve(config) as bot:
            run_id, approval_id = await start_and_decide(bot)
            await receiver.wait_for(2)  # the review opened, then decided

            async def delivered() -> bool:
                return len(named(json_lines(config), "delivery sent")) >= 2

            await eventually(delivered, "the deliveries are logged")
    lines = json_lines(config)  # every line is JSON
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    assert all(line["time"].endswith("Z") for line in lines)
    [request] = named(lines, "request", method="POST", path="/runs")  # no query string
    assert request["status"] == 201 and request["duration_ms"] >= 0
    assert request["level"] == "info" and request["logger"] == "nodbot.bot.http.access"
    [opened] = named(lines, "review opened", approval_id=approval_id)
    assert (opened["run_id"], opened["tool"], opened["reviewers"]) == (run_id, "refund", [LEAD])
    [decision] = named(lines, "decision", approval_id=approval_id)
    assert (decision["decided_by"], decision["action"], decision["channel"]) == (
        LEAD,
        "approve",
        "api",
    )
    assert decision["run_id"] == run_id
    steps = named(lines, "run step", run_id=run_id)
    # A run is claimed (running) before each step: it waits for the review, then finishes.
    assert [(s["status_before"], s["status_after"]) for s in steps] == [
        ("running", "waiting"),
        ("running", "finished"),
    ]
    sent = named(lines, "delivery sent", approval_id=approval_id, target="webhook:ops")
    assert {line["kind"] for line in sent} >= {"request", "outcome"}
    assert all(line["attempt"] == 1 for line in sent)


async def test_no_secret_is_ever_logged(tmp_path: Path) -> None:
    async with receiving() as receiver, slack_fake() as slack:
        config = write_config(
            tmp_path, "{format: json, level: debug}", hook=receiver.url, slack=slack
        )
        async with nodbot_serve(config) as bot:
            await start_and_decide(bot)
            link = sign_in_link(load_config(config), LEAD, base=bot.url)
            link_token = parse_qs(urlsplit(link).query)["token"][0]
            async with httpx.AsyncClient() as browser:
                signed_in = await browser.get(link)
                assert signed_in.status_code == 303, signed_in.text
                cookie = signed_in.cookies["nodbot_session"]
                browser.cookies.clear()  # sent by hand, as a browser sends it
                inbox = await browser.get(
                    f"{bot.url}/inbox", headers={"Cookie": f"nodbot_session={cookie}"}
                )
                assert inbox.status_code == 200
            await receiver.wait_for(2)

            async def seen() -> bool:
                return bool(named(json_lines(config), "request", path="/inbox", status=200))

            await eventually(seen, "the inbox request is logged")
    log = log_of(config)
    assert named(json_lines(config), "request", path="/inbox/login", status=303)
    secrets = (TOKEN, WEB_SECRET, WEBHOOK_SECRET, slack.bot_token, slack.signing_secret)
    for secret in (*secrets, link_token, cookie):
        assert secret not in log


async def test_a_text_log_has_one_line_per_record(tmp_path: Path) -> None:
    config = write_config(tmp_path, "{format: text}")
    async with nodbot_serve(config) as bot:
        run_id, approval_id = await start_and_decide(bot)

        async def stepped() -> bool:
            return "status_after=finished" in log_of(config)

        await eventually(stepped, "the last run step is logged")
    lines = log_of(config).splitlines()
    assert all(TEXT_LINE.match(line) for line in lines), lines
    assert any(
        " info nodbot.bot.http.access request method=POST path=/runs status=201 " in line
        for line in lines
    )
    assert any(
        f" decision approval_id={approval_id} run_id={run_id} " in line and "channel=api" in line
        for line in lines
    )


async def test_level_warning_hides_the_info_lines(tmp_path: Path) -> None:
    config = write_config(tmp_path, "{format: json, level: warning}")
    async with nodbot_serve(config) as bot:
        await start_and_decide(bot)
    lines = json_lines(config)
    assert lines  # the file's own warnings (secrets written in it) are still there
    assert all(line["level"] in ("warning", "error") for line in lines), lines


def test_a_bad_log_format_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    config = write_config(tmp_path, "{format: xml}")
    with pytest.raises(ConfigError) as raised:
        load_config(str(config))
    [problem] = raised.value.problems
    assert f"{config}:2: log.format: Input should be 'text' or 'json'" in problem


def test_an_exception_and_the_configured_secrets_stay_on_one_line() -> None:
    try:
        raise ValueError(f"refused {TOKEN}\nsecond line")
    except ValueError:
        record = logging.LogRecord(
            "nodbot.test", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    record.__dict__["approval_id"] = "apr_1"
    as_json = JsonFormatter([TOKEN]).format(record)
    assert "\n" not in as_json and TOKEN not in as_json
    entry = json.loads(as_json)
    assert entry["approval_id"] == "apr_1"
    assert "ValueError: refused [secret]" in entry["error"]
    as_text = TextFormatter([TOKEN]).format(record)
    assert "\n" not in as_text and TOKEN not in as_text
    assert " error nodbot.test failed approval_id=apr_1 error=" in as_text


def test_text_values_are_quoted_when_they_would_not_split_back() -> None:
    class Kind(enum.StrEnum):
        REFUND = "refund now"

    values = {
        "plain": ("abc", "abc"),
        "empty": ("", '""'),
        "spaced": ("a b", '"a b"'),
        "no_break_space": ("a\u00a0b", '"a\u00a0b"'),
        "tab": ("a\tb", '"a\\tb"'),
        "newline": ("a\nb", '"a\\nb"'),
        "quote": ('say "hi"', '"say \\"hi\\""'),
        "apostrophe": ("it's", '"it\'s"'),
        "equals": ("a=b", '"a=b"'),
        "backslash": ("a\\b", '"a\\\\b"'),
        "unicode": ("café", "café"),
        "number": (3, "3"),
        "big": (10**30, "1000000000000000000000000000000"),
        "fraction": (3.1, "3.1"),
        "tiny": (1e-300, "1e-300"),
        "not_a_number": (float("nan"), "NaN"),
        "infinite": (float("inf"), "Infinity"),
        "yes": (True, "true"),
        "no": (False, "false"),
        "nothing": (None, "null"),
        "listed": ([1, "x y"], '[1,"x y"]'),
        "enum_text": (Kind.REFUND, '"refund now"'),
    }
    record = logging.LogRecord("nodbot.test", logging.INFO, __file__, 1, "event", (), None)
    for key, (value, _) in values.items():
        record.__dict__[key] = value
    line = TextFormatter().format(record)
    fields = " ".join(f"{key}={shown}" for key, (_, shown) in values.items())
    assert line.endswith(f" info nodbot.test event {fields}"), line
