"""nodbot as a user gets it: the wheel built from this checkout, installed with pip in a fresh
virtual environment outside it, claims the one import name `nodbot` in `site-packages`, and
its `nodbot serve` renders the web inbox and posts a review to Slack (the fake) from the
templates it carries. The base wheel (`pip install nodbot`, for agents) brings none of the
bot's packages: an agent asks for a review through a bridge without them, against a bot
served by the full install, and `nodbot` there says in one line what to install.

The wheel is built without its dependencies; the new environment finds those in this
checkout's `.venv` through a path file (`deps.pth`), which adds the folder to `sys.path`
without running the checkout's own path files, so the checkout's editable install of
nodbot stays out of sight and only the wheel's copy can be imported.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.parser
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import sysconfig
import venv
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from packaging.requirements import Requirement

from tests.bot.processes import nodbot_serve
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
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nodbot's wheel, built from this checkout by pip with this environment's setuptools
    (no build isolation: nothing is fetched from a package index)."""
    wheels = tmp_path_factory.mktemp("wheels")
    build = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q"),
            *("--no-build-isolation", "-w", str(wheels)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    [built] = wheels.glob("nodbot-*.whl")
    return built


def fresh_venv(place: Path, wheel: Path) -> Path:
    """A new virtual environment at `place` with `wheel` installed without its dependencies,
    which it finds in this environment's site-packages through `deps.pth`."""
    venv.EnvBuilder(with_pip=False).create(place)
    python = place / "bin" / "python"
    (site_packages(place) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    return place


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A fresh virtual environment, outside the checkout, with the wheel installed."""
    return fresh_venv(tmp_path_factory.mktemp("installed") / "venv", wheel)


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


# The light install: `pip install nodbot` for an agent, `pip install 'nodbot[bot]'` for the bot

BOT_ONLY = {
    *("starlette", "uvicorn", "slack-bolt", "slack-sdk"),
    *("aiosmtpd", "aiosmtplib", "aioimaplib"),
}
"""What an agent application that only asks for reviews must not get."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_requirements(wheel: Path, extra: str = "") -> list[Requirement]:
    """The wheel's Requires-Dist that hold for this Python with `extra` ("": none) asked for."""
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    requirements = [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": extra})]


def closure(requirements: list[Requirement]) -> set[str]:
    """The distributions `requirements` bring, transitively, as this environment has them
    installed (each one's Requires-Dist, with the extras asked of it)."""
    extras_of: dict[str, set[str]] = {}
    todo = list(requirements)
    while todo:
        requirement = todo.pop()
        name = canonical(requirement.name)
        asked = set(requirement.extras)
        if name in extras_of and asked <= extras_of[name]:
            continue
        extras_of[name] = extras_of.get(name, set()) | asked
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f"{name}, which nodbot needs, is not installed here: run make test")
        for line in requires:
            inner = Requirement(line)
            wanted = {""} | extras_of[name]
            if inner.marker is None or any(inner.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(inner)
    return set(extras_of)


def modules_of(distributions: set[str]) -> set[str]:
    """The top-level import names of installed `distributions`."""
    return {
        module
        for module, owners in importlib.metadata.packages_distributions().items()
        if {canonical(owner) for owner in owners} & distributions
    }


def test_the_base_wheel_brings_none_of_the_bots_packages(wheel: Path) -> None:
    base = closure(wheel_requirements(wheel))
    assert not BOT_ONLY & base, sorted(BOT_ONLY & base)
    assert {"pydantic", "httpx", "sqlalchemy", "alembic", "aiosqlite"} <= base
    with_bot = closure(wheel_requirements(wheel, "bot"))
    assert with_bot >= BOT_ONLY | base | {"jinja2", "pyyaml"}


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A fresh virtual environment with the base wheel, where the packages that only the
    `bot` extra brings cannot be imported: they are in the site-packages its deps.pth names,
    so an import hook refuses them, as if they were not installed."""
    bot_only = closure(wheel_requirements(wheel, "bot")) - closure(wheel_requirements(wheel))
    assert bot_only >= BOT_ONLY, sorted(BOT_ONLY - bot_only)
    refused = modules_of(bot_only)
    assert {"starlette", "slack_bolt", "slack_sdk", "aiosmtpd", "yaml", "jinja2"} <= refused
    environment = fresh_venv(tmp_path_factory.mktemp("light") / "venv", wheel)
    (site_packages(environment) / "not_installed.py").write_text(
        NOT_INSTALLED.format(refused=sorted(refused))
    )
    # Before deps.pth's folder is searched: .pth files run in name order.
    (site_packages(environment) / "_not_installed.pth").write_text("import not_installed\n")
    return environment


NOT_INSTALLED = '''
"""Makes the bot's packages look not installed: their imports fail as a missing module's."""

import sys

REFUSED = frozenset({refused})


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
'''

LIGHT_AGENT = '''
"""An agent application on the base install: pydantic-ai, its refund reviewed through nodbot."""

import asyncio
import json
import os
import sys

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel

from nodbot.core.bridges.pydantic_ai import run_with_reviews
from nodbot.core.client import ApprovalClient

refunds = []


def reply(messages, info):
    parts = [part for message in messages for part in getattr(message, "parts", [])]
    returns = [part for part in parts if isinstance(part, ToolReturnPart)]
    if not returns:
        call = ToolCallPart("refund", {"order_id": "o-7", "amount": 500}, tool_call_id="call-1")
        return ModelResponse(parts=[call])
    return ModelResponse(parts=[TextPart("done: " + str(returns[0].content))])


agent = Agent(FunctionModel(reply), output_type=[str, DeferredToolRequests])


@agent.tool_plain(requires_approval=True)
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    refunds.append([order_id, amount])
    return f"refunded {amount} on {order_id}"


async def main() -> None:
    async with ApprovalClient(sys.argv[1], token=os.environ["NODBOT_AGENT_TOKEN"]) as nodbot:
        result = await run_with_reviews(agent, "refund o-7", nodbot, run_id="light-1", within=30)
    modules = sorted({name.partition(".")[0] for name in sys.modules})
    print(json.dumps({"output": result.output, "refunds": refunds, "modules": modules}))


asyncio.run(main())
'''

LIGHT_CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: agent, token: "${{NODBOT_AGENT_TOKEN}}", scopes: [approvals:request]}}
    - {{name: lead@example.com, token: "${{NODBOT_REVIEWER_TOKEN}}",
        scopes: [approvals:read, approvals:decide]}}
external_tools: [refund]
rules:
  - tool: refund
    reviewers: [lead@example.com]
"""
AGENT_TOKEN = "token-of-the-light-agent-000000000"
REVIEWER_TOKEN = "token-of-the-light-reviewer-000000"


def light_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_the_light_install_cannot_import_the_bots_packages(light: Path, tmp_path: Path) -> None:
    tried = subprocess.run(
        [str(light / "bin" / "python"), "-c", "import starlette"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=light_environment(),
    )
    assert tried.returncode == 1
    assert "ModuleNotFoundError: No module named 'starlette'" in tried.stderr


async def test_an_agent_on_the_light_install_has_its_call_reviewed_by_the_bot(
    light: Path, tmp_path: Path
) -> None:
    (tmp_path / "agent.py").write_text(LIGHT_AGENT)
    config = tmp_path / "nodbot.yml"
    config.write_text(LIGHT_CONFIG.format(db=tmp_path / "nodbot.db"))
    tokens = {"NODBOT_AGENT_TOKEN": AGENT_TOKEN, "NODBOT_REVIEWER_TOKEN": REVIEWER_TOKEN}
    async with (
        nodbot_serve(config, **tokens) as bot,  # the bot of the full install, in its process
        httpx.AsyncClient(
            base_url=bot.url, headers={"Authorization": f"Bearer {REVIEWER_TOKEN}"}, timeout=30
        ) as reviewer,
    ):
        agent = await asyncio.create_subprocess_exec(
            *(str(light / "bin" / "python"), str(tmp_path / "agent.py"), bot.url),
            cwd=tmp_path,
            env={**light_environment(), "NODBOT_AGENT_TOKEN": AGENT_TOKEN},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:

            async def opened() -> list[dict[str, Any]]:
                found = await reviewer.get("/approvals", params={"status": "pending"})
                assert found.status_code == 200, found.text
                reviews: list[dict[str, Any]] = found.json()
                return reviews

            async def asked() -> bool:
                return bool(await opened())

            await eventually(asked, "the agent's refund opened a review", within=60)
            [review] = await opened()
            assert (review["tool"], review["arguments"]) == (
                "refund",
                {"order_id": "o-7", "amount": 500},
            )
            body = {"action": "edit", "arguments": {"amount": 450}}
            decided = await reviewer.post(f"/approvals/{review['approval_id']}/decide", json=body)
            assert decided.status_code == 200, decided.text
            out, err = await asyncio.wait_for(agent.communicate(), 60)
        finally:
            if agent.returncode is None:
                agent.kill()
                await agent.wait()
    assert agent.returncode == 0, err.decode()
    said = json.loads(out)
    assert said["refunds"] == [["o-7", 450.0]]
    assert said["output"] == "done: refunded 450.0 on o-7"
    assert "nodbot" in said["modules"] and "pydantic_ai" in said["modules"]
    assert not {m.replace("-", "_") for m in BOT_ONLY} & set(said["modules"])


def test_nodbot_on_the_light_install_says_in_one_line_what_to_install(
    light: Path, tmp_path: Path
) -> None:
    for arguments in (["serve", "--config", "nodbot.yml"], ["check-config", "nodbot.yml"], []):
        ran = subprocess.run(
            [str(light / "bin" / "nodbot"), *arguments],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=light_environment(),
        )
        assert ran.returncode == 1, (arguments, ran.stderr)
        assert ran.stdout == ""
        [line] = ran.stderr.splitlines()
        assert line.startswith("nodbot: the bot's packages are not installed"), line
        assert line.endswith("pip install 'nodbot[bot]'"), line
        assert "Traceback" not in ran.stderr
