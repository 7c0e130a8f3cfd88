"""nodbot as a user gets it: the wheel built from this checkout, installed with pip in a fresh
virtual environment outside it, claims the one import name `nodbot` in `site-packages`, and
its `nodbot serve` renders the web inbox and posts a review to Slack (the fake) from the
templates it carries.

The wheel is built without its dependencies; the new environment finds those in this
checkout's `.venv` through a path file (`deps.pth`), which adds the folder to `sys.path`
without running the checkout's own path files, so the checkout's editable install of
nodbot stays out of sight and only the wheel's copy can be imported.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import sysconfig
import venv
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.slack import slack_fake
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "token-of-starter-00000000000000000"
SECRETS = {
    **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    "NODBOT_TEST_WEB_SECRET": "a-web-secret-for-the-wheel-test-000000",
    "NODBOT_TEST_TOKEN": TOKEN,
}
"""The installed bot's environment: no PYTHONPATH (nothing of the checkout), its secrets."""

AGENT = '''
"""An agent of the user's own, importing nodbot by its one name."""

from nodbot import Agent, ChatResponse, HumanMessage, ToolCall, ToolRegistry

tools = ToolRegistry()


@tools.tool(effects="destructive")
def refund(order_id: str, amount: float) -> str:
    """Refund an amount on an order."""
    return f"refunded {amount} on {order_id}"


class Chat:
    async def respond(self, messages, tools):
        if len(messages) > 1:
            return ChatResponse(content="done")
        call = ToolCall(id="call_1", name="refund", arguments={"order_id": "A-1", "amount": 20})
        return ChatResponse(tool_calls=[call])


agent = Agent(Chat(), tools)
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment, outside the checkout, with the wheel installed."""
    place = tmp_path_factory.mktemp("installed")
    wheels = place / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-w", str(wheels), "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    [wheel] = wheels.glob("nodbot-*.whl")
    environment = place / "venv"
    venv.EnvBuilder(with_pip=False).create(environment)
    python = environment / "bin" / "python"
    purelib = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    (purelib / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    return environment


def site_packages(environment: Path) -> Path:
    return next((environment / "lib").glob("python3*/site-packages"))


def test_the_wheel_claims_only_the_name_nodbot(installed: Path) -> None:
    names = {p.name for p in site_packages(installed).iterdir()}
    assert "nodbot" in names
    assert not {"core", "bot", "templates", "tests", "examples"} & names, names
    ours = [n for n in names if n.startswith("nodbot")]
    assert sorted(ours) == ["nodbot", "nodbot-0.1.0.dist-info"], ours
    info = site_packages(installed) / "nodbot-0.1.0.dist-info"
    assert "Apache License" in (info / "licenses" / "LICENSE").read_text()
    shipped = site_packages(installed) / "nodbot"
    assert (shipped / "templates" / "web" / "inbox.html").is_file()
    assert (shipped / "templates" / "slack" / "request.json.j2").is_file()
    assert (shipped / "manifest.yml").is_file()
    assert (shipped / "core" / "sqlstore" / "migrations" / "script.py.mako").is_file()


def test_the_installed_package_is_the_wheels_and_exports_the_engine(
    installed: Path, tmp_path: Path
) -> None:
    found = subprocess.run(
        [
            str(installed / "bin" / "python"),
            "-c",
            "import nodbot, nodbot.bot.serve; from nodbot import Executor; "
            "print(nodbot.__file__); print(Executor.__module__)",
        ],
        cwd=tmp_path,  # not the checkout: nothing of it is on the path
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert found.returncode == 0, found.stderr
    where, module = found.stdout.split()
    assert Path(where).is_relative_to(site_packages(installed)), where
    assert module == "nodbot.core.executor"


@contextlib.asynccontextmanager
async def installed_bot(environment: Path, config: Path) -> AsyncIterator[str]:
    """`nodbot serve` of the installed wheel, run from the configuration's folder."""
    log = (config.parent / "bot.log").open("w")
    process = await asyncio.to_thread(
        subprocess.Popen,
        [str(environment / "bin" / "nodbot"), "serve", "--config", str(config)],
        cwd=config.parent,
        env=SECRETS,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.to_thread(process.stdout.readline)
        assert line.startswith("nodbot: serving http://127.0.0.1:"), (
            line + (config.parent / "bot.log").read_text()
        )
        yield line.split()[2]
    finally:
        process.terminate()
        await asyncio.to_thread(process.wait, 20)
        if process.stdout is not None:
            process.stdout.close()
        log.close()


async def test_the_installed_bot_serves_the_inbox_and_posts_to_slack(
    installed: Path, tmp_path: Path
) -> None:
    (tmp_path / "refunds.py").write_text(AGENT)
    async with slack_fake() as slack:
        lead = slack.add_user("lead", email="lead@example.com")
        config = tmp_path / "nodbot.yml"
        config.write_text(
            f"""
store: {{url: "sqlite:///{tmp_path / "nodbot.db"}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
web: {{secret: "${{NODBOT_TEST_WEB_SECRET}}"}}
api:
  tokens:
    - {{name: starter, token: "${{NODBOT_TEST_TOKEN}}", scopes: [runs:write, approvals:read]}}
agents:
  refunds: refunds:agent
slack:
  bot_token: {slack.bot_token}
  signing_secret: {slack.signing_secret}
  api_url: {slack.api_url}
rules:
  - tool: refund
    reviewers: [lead@example.com]
"""
        )
        async with (
            installed_bot(installed, config) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            headers = {"Authorization": f"Bearer {TOKEN}"}
            started = await client.post(
                "/runs", json={"agent": "refunds", "input": "refund A-1"}, headers=headers
            )
            assert started.status_code == 201, started.text
            approval_id = started.json()["pending"][0]["approval_id"]

            async def posted() -> bool:
                return bool(slack.messages(lead))

            await eventually(posted, "the review posted to the lead in Slack")
            [message] = slack.messages(lead)
            assert "refund" in str(message.blocks)
            link = await asyncio.to_thread(
                subprocess.run,
                [str(installed / "bin" / "nodbot"), "inbox-link", "--reviewer", lead.email],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                env=SECRETS,
            )
            assert link.returncode == 0, link.stderr
            token = link.stdout.strip().split("token=", 1)[1]
            signed = await client.get(f"/inbox/login?token={token}")
            assert signed.status_code == 303, signed.text
            page = await client.get(f"/inbox/approvals/{approval_id}")
            assert page.status_code == 200, page.text
            assert "refund" in page.text and "A-1" in page.text
