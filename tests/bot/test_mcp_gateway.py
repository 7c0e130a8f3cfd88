"""`nodbot mcp`: the MCP gateway, started as the console script in front of a small upstream
MCP server (`tests/bot/mcp_upstream.py`, which counts the runs of its `refund`), driven by
the `mcp` SDK's own client over stdio or streamable HTTP, with the bot served in-process
(`tests/bridges/support.py`); reviewers decide over the bot's HTTP API, or in Slack (the
local fake of Slack's Web API, a signed click)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import mcp_types as types
from mcp.client.session import ClientRequestContext, ClientSession, ElicitationFnT
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from nodbot.bot.serve import serving
from tests.bot.test_cli import mistake, nodbot
from tests.bridges.support import AGENT_TOKEN, Bridged, bridged_bot
from tests.fakes.slack import send_interactive, slack_fake

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = Path(__file__).with_name("mcp_upstream.py")
UPSTREAM_COMMAND = shlex.join([sys.executable, str(UPSTREAM)])
WITHIN = 60


def runs(tmp_path: Path) -> list[dict[str, Any]]:
    """The upstream `refund` calls that really ran, with their arguments."""
    path = tmp_path / "runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@contextlib.asynccontextmanager
async def connected(
    tmp_path: Path,
    command: str,
    *arguments: str,
    env: dict[str, str],
    elicitation: ElicitationFnT | None = None,
) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session with `command` `arguments`, started over stdio."""
    server = StdioServerParameters(
        command=command,
        args=list(arguments),
        env={"MCP_UPSTREAM_RUNS": str(tmp_path / "runs.jsonl"), **env},
    )
    with (tmp_path / "stderr.txt").open("a") as errlog:
        async with (
            stdio_client(server, errlog=errlog) as (read, write),
            ClientSession(read, write, elicitation_callback=elicitation) as session,
        ):
            async with asyncio.timeout(WITHIN):
                await session.initialize()
            yield session


def gateway(
    tmp_path: Path,
    bot: Bridged | str | None,
    *options: str,
    elicitation: ElicitationFnT | None = None,
) -> contextlib.AbstractAsyncContextManager[ClientSession]:
    """`nodbot mcp` in front of the upstream server, asking `bot` (a bot, or its URL; without
    one, the client's user)."""
    url = bot.served.url if isinstance(bot, Bridged) else bot
    bot_options = ["--bot", url] if url is not None else []
    env = {"NODBOT_TOKEN": AGENT_TOKEN} if bot is not None else {}
    return connected(
        tmp_path,
        nodbot(),
        "mcp",
        "--upstream-command",
        UPSTREAM_COMMAND,
        *bot_options,
        *options,
        env=env,
        elicitation=elicitation,
    )


def text(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def pending_call(
    bot: Bridged, session: ClientSession, arguments: dict[str, Any]
) -> tuple[asyncio.Task[types.CallToolResult], dict[str, Any]]:
    """A `refund` call under way, and its review once it opened."""
    call = asyncio.create_task(session.call_tool("refund", arguments))
    [review] = await bot.when_pending(1)
    assert not call.done()
    return call, review


async def test_the_tool_list_passes_through_unchanged(tmp_path: Path) -> None:
    async with connected(tmp_path, sys.executable, str(UPSTREAM), env={}) as upstream:
        direct = await upstream.list_tools()
    async with bridged_bot(tmp_path, ["refund", "lookup"]) as bot, gateway(tmp_path, bot) as s:
        through = await s.list_tools()
        assert [t.name for t in through.tools] == ["refund", "lookup"]
        for seen, real in zip(through.tools, direct.tools, strict=True):
            assert seen.model_dump(by_alias=True) == real.model_dump(by_alias=True)
        assert await bot.pending() == []  # listing asks nobody


async def test_a_reviewed_call_waits_and_runs_once_when_approved(tmp_path: Path) -> None:
    async with bridged_bot(tmp_path, ["refund"]) as bot, gateway(tmp_path, bot) as session:
        call, review = await pending_call(bot, session, {"order_id": "o-7", "amount": 500})
        assert review["tool"] == "refund"
        assert review["arguments"] == {"order_id": "o-7", "amount": 500}
        assert review["run_id"].startswith("mcp_")
        assert review["call_id"].isdigit()  # the JSON-RPC id of the tools/call request
        assert runs(tmp_path) == []  # nothing runs while the review is open

        await bot.decide(review["approval_id"], "approve")
        result = await asyncio.wait_for(call, WITHIN)
        assert not result.is_error, text(result)
        assert text(result) == "refunded 500.0 on o-7"
        assert runs(tmp_path) == [{"order_id": "o-7", "amount": 500.0}]
        assert await bot.pending() == []


SLACK_CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: agent, token: "{token}", scopes: [approvals:request]}}
external_tools: [refund]
slack:
  bot_token: {bot_token}
  signing_secret: {signing_secret}
  api_url: {api_url}
rules:
  - tool: refund
    reviewers: [{lead}]
"""


async def test_a_call_approved_in_slack_runs_once(tmp_path: Path) -> None:
    async with slack_fake() as slack:
        lead = slack.add_user("lead", email="lead@example.com")
        config = tmp_path / "nodbot.yml"
        config.write_text(
            SLACK_CONFIG.format(
                db=tmp_path / "nodbot.db",
                token=AGENT_TOKEN,
                bot_token=slack.bot_token,
                signing_secret=slack.signing_secret,
                api_url=slack.api_url,
                lead=lead.id,
            )
        )
        async with serving(str(config)) as served, gateway(tmp_path, served.url) as session:
            call = asyncio.create_task(
                session.call_tool("refund", {"order_id": "o-5", "amount": 250})
            )
            deadline = asyncio.get_running_loop().time() + WITHIN
            while not slack.messages(lead):
                assert asyncio.get_running_loop().time() < deadline, "the review was not posted"
                await asyncio.sleep(0.02)  # polling the fake for the post, with a deadline
            [message] = slack.messages(lead)
            assert not call.done() and runs(tmp_path) == []

            click = slack.click(message, "nodbot.approve", lead)
            events = f"{served.url}/slack/events"
            answer = await send_interactive(events, click, slack.signing_secret)
            assert answer.status_code == 200, answer.text
            result = await asyncio.wait_for(call, WITHIN)
            assert not result.is_error, text(result)
            assert text(result) == "refunded 250.0 on o-5"

            again = await send_interactive(events, click, slack.signing_secret)
            assert again.status_code == 200, again.text  # a second click runs nothing more
            assert runs(tmp_path) == [{"order_id": "o-5", "amount": 250.0}]


async def test_a_denied_call_returns_the_reason_and_never_runs(tmp_path: Path) -> None:
    async with bridged_bot(tmp_path, ["refund"]) as bot, gateway(tmp_path, bot) as session:
        call, review = await pending_call(bot, session, {"order_id": "o-9", "amount": 900})
        await bot.decide(review["approval_id"], "deny", reason="refund policy: max 500")
        result = await asyncio.wait_for(call, WITHIN)
        assert result.is_error
        assert "refund policy: max 500" in text(result)
        assert runs(tmp_path) == []


async def test_an_edited_call_runs_once_with_the_edited_arguments(tmp_path: Path) -> None:
    async with bridged_bot(tmp_path, ["refund"]) as bot, gateway(tmp_path, bot) as session:
        call, review = await pending_call(bot, session, {"order_id": "o-7", "amount": 500})
        await bot.decide(review["approval_id"], "edit", arguments={"amount": 450})
        result = await asyncio.wait_for(call, WITHIN)
        assert not result.is_error, text(result)
        assert text(result) == "refunded 450.0 on o-7"
        assert runs(tmp_path) == [{"order_id": "o-7", "amount": 450.0}]


async def test_a_call_nobody_decides_in_time_fails_and_nothing_runs(tmp_path: Path) -> None:
    async with (
        bridged_bot(tmp_path, ["refund"]) as bot,
        gateway(tmp_path, bot, "--timeout", "1") as session,
    ):
        result = await asyncio.wait_for(
            session.call_tool("refund", {"order_id": "o-3", "amount": 300}), WITHIN
        )
        assert result.is_error
        assert "nobody decided" in text(result) and "nothing ran" in text(result)
        assert len(await bot.pending()) == 1  # the review is still open
        assert runs(tmp_path) == []


def answering(action: Literal["accept", "decline"], asked: list[str]) -> ElicitationFnT:
    async def answer(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        asked.append(params.message)
        return types.ElicitResult(action=action)

    return answer


async def test_client_approval_runs_on_accept_and_not_on_decline(tmp_path: Path) -> None:
    asked: list[str] = []
    accept = answering("accept", asked)
    async with gateway(tmp_path, None, "--client-approval", elicitation=accept) as session:
        result = await session.call_tool("refund", {"order_id": "o-1", "amount": 20})
        assert not result.is_error, text(result)
        assert runs(tmp_path) == [{"order_id": "o-1", "amount": 20.0}]
    assert len(asked) == 1 and "refund" in asked[0] and "o-1" in asked[0]

    decline = answering("decline", asked)
    async with gateway(tmp_path, None, "--client-approval", elicitation=decline) as session:
        result = await session.call_tool("refund", {"order_id": "o-2", "amount": 30})
        assert result.is_error
        assert "did not approve" in text(result)
    assert len(asked) == 2
    assert runs(tmp_path) == [{"order_id": "o-1", "amount": 20.0}]  # the declined one never ran


async def test_client_approval_without_elicitation_runs_nothing(tmp_path: Path) -> None:
    async with gateway(tmp_path, None, "--client-approval") as session:
        result = await session.call_tool("refund", {"order_id": "o-1", "amount": 20})
        assert result.is_error
        assert "elicitation" in text(result)
    assert runs(tmp_path) == []


def test_bad_command_lines_exit_2_with_one_line(tmp_path: Path) -> None:
    saved = os.environ.pop("NODBOT_TOKEN", None)
    try:
        assert "say what to serve" in mistake(tmp_path, "mcp")
        said = mistake(
            tmp_path, "mcp", "--upstream-command", "python -m x", "--upstream-url", "http://h/mcp"
        )
        assert "--upstream-command and --upstream-url" in said
        said = mistake(tmp_path, "mcp", "--upstream-command", "python -m x")
        assert "NODBOT_TOKEN" in said
        said = mistake(tmp_path, "mcp", "--upstream-command", "python -m x", "--timeout", "0")
        assert "--timeout" in said
        said = mistake(tmp_path, "mcp", "--upstream-command", "python -m x", "--http", "nowhere")
        assert "--http" in said
    finally:
        if saved is not None:
            os.environ["NODBOT_TOKEN"] = saved


def test_a_token_on_the_command_line_is_no_option(tmp_path: Path) -> None:
    completed = subprocess.run(
        [nodbot(), "mcp", "--help"], capture_output=True, text=True, check=True
    )
    assert "--token-env" in completed.stdout and "--token " not in completed.stdout


async def test_a_registry_over_http_one_run_per_session(tmp_path: Path) -> None:
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        process = await asyncio.create_subprocess_exec(
            nodbot(),
            "mcp",
            "--tools",
            "tests.bot.mcp_upstream:registry",
            "--http",
            "127.0.0.1:0",
            "--bot",
            bot.served.url,
            env={
                **os.environ,
                "NODBOT_TOKEN": AGENT_TOKEN,
                "MCP_UPSTREAM_RUNS": str(tmp_path / "runs.jsonl"),
                "PYTHONPATH": str(ROOT),
            },
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert process.stderr is not None
            line = (await asyncio.wait_for(process.stderr.readline(), WITHIN)).decode()
            assert line.startswith("nodbot mcp: serving MCP at http://127.0.0.1:"), line
            url = line.split()[-1]
            async with (
                streamable_http_client(url) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                [tool] = (await session.list_tools()).tools
                assert tool.name == "refund" and tool.description == "Refund an order."
                assert set(tool.input_schema["properties"]) == {"order_id", "amount"}

                call, review = await pending_call(bot, session, {"order_id": "o-8", "amount": 80})
                assert review["arguments"] == {"order_id": "o-8", "amount": 80.0}
                assert review["run_id"].startswith("mcp_") and "." in review["run_id"]
                assert review["call_id"].isdigit()  # the JSON-RPC id, over HTTP too
                await bot.decide(review["approval_id"], "edit", arguments={"amount": 40})
                result = await asyncio.wait_for(call, WITHIN)
                assert not result.is_error, text(result)
                assert text(result) == "refunded 40.0 on o-8"
                assert runs(tmp_path) == [{"order_id": "o-8", "amount": 40.0}]
        finally:
            process.terminate()
            await process.wait()
