"""A bot for the bridges' tests: served in-process on SQLite with the approval request API,
an agent's token (`approvals:request`), a reviewer's token (`approvals:decide`), the tools
of the test as `external_tools` and a rule reviewing each of them; `Bridged.decide` decides
as that reviewer over the HTTP API, and `Bridged.when_pending` waits until a review opens."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from nodbot.bot.serve import Served, serving
from nodbot.core.client import ApprovalClient

ROOT = Path(__file__).resolve().parents[2]
AGENT_TOKEN = "token-of-the-bridged-agent-0000000"
REVIEWER_TOKEN = "token-of-the-reviewer-000000000000"
REVIEWER = "lead@example.com"

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: agent, token: "${{NODBOT_BRIDGE_AGENT}}", scopes: [approvals:request]}}
    - {{name: {reviewer}, token: "${{NODBOT_BRIDGE_REVIEWER}}",
        scopes: [approvals:read, approvals:decide]}}
external_tools: [{tools}]
rules:
{rules}
"""


def review_rule(tool: str, **extra: str) -> str:
    """A rule sending every call of `tool` to the reviewer (`extra`: more keys, as YAML)."""
    lines = [f"  - tool: {tool}", f"    reviewers: [{REVIEWER}]"]
    lines += [f"    {key}: {value}" for key, value in extra.items()]
    return "\n".join(lines)


@dataclass
class Bridged:
    """The running bot, an approval client of the agent, and the reviewer's HTTP client."""

    served: Served
    client: ApprovalClient
    reviewer: httpx.AsyncClient

    async def pending(self) -> list[dict[str, Any]]:
        answer = await self.reviewer.get("/approvals", params={"status": "pending"})
        assert answer.status_code == 200, answer.text
        found: list[dict[str, Any]] = answer.json()
        return found

    async def when_pending(self, count: int = 1, within: float = 20) -> list[dict[str, Any]]:
        """The pending reviews, once there are `count` of them."""
        deadline = asyncio.get_running_loop().time() + within
        found = await self.pending()
        while len(found) < count:
            assert asyncio.get_running_loop().time() < deadline, f"{count} reviews did not open"
            await asyncio.sleep(0.02)  # polling the bot for an outcome, with a deadline
            found = await self.pending()
        return found

    async def decide(
        self,
        approval_id: str,
        action: str,
        *,
        reason: str | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"action": action}
        if reason is not None:
            body["reason"] = reason
        if arguments is not None:
            body["arguments"] = arguments
        answer = await self.reviewer.post(f"/approvals/{approval_id}/decide", json=body)
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found


@contextlib.asynccontextmanager
async def bridged_bot(
    tmp_path: Path, tools: Sequence[str], rules: Sequence[str] | None = None
) -> AsyncIterator[Bridged]:
    """The bot, reviewing every call of `tools` (or by the YAML `rules` given)."""
    path = tmp_path / "nodbot.yml"
    text = CONFIG.format(
        db=tmp_path / "nodbot.db",
        reviewer=REVIEWER,
        tools=", ".join(tools),
        rules="\n".join(rules or [review_rule(tool) for tool in tools]),
    )
    path.write_text(text)
    saved = {
        name: os.environ.get(name) for name in ("NODBOT_BRIDGE_AGENT", "NODBOT_BRIDGE_REVIEWER")
    }
    os.environ["NODBOT_BRIDGE_AGENT"] = AGENT_TOKEN
    os.environ["NODBOT_BRIDGE_REVIEWER"] = REVIEWER_TOKEN
    try:
        async with (
            serving(str(path)) as served,
            ApprovalClient(served.url, token=AGENT_TOKEN) as client,
            httpx.AsyncClient(
                base_url=served.url,
                headers={"Authorization": f"Bearer {REVIEWER_TOKEN}"},
                timeout=30,
            ) as reviewer,
        ):
            yield Bridged(served, client, reviewer)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# --- agents of other frameworks hosted by the bot ---------------------------------------------

STARTER = "token-of-the-starter-00000000000"

HOSTED_CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: starter, token: "${{NODBOT_HOSTED_STARTER}}", scopes: [runs:write]}}
    - {{name: {reviewer}, token: "${{NODBOT_BRIDGE_REVIEWER}}",
        scopes: [approvals:read, approvals:decide]}}
framework_agents:
{agents}
external_tools: [{tools}]
rules:
{rules}
"""


@dataclass
class Hosted:
    """A bot hosting agents of other frameworks, and a client of its API: `start` a run as
    the starter, `decide` as the reviewer, wait until it has `finished`."""

    served: Served
    http: httpx.AsyncClient

    async def start(self, agent: str, text: str) -> dict[str, Any]:
        answer = await self.http.post(
            "/runs",
            json={"agent": agent, "input": text},
            headers={"Authorization": f"Bearer {STARTER}"},
        )
        assert answer.status_code == 201, answer.text
        found: dict[str, Any] = answer.json()
        return found

    async def decide(self, approval_id: str, **body: Any) -> None:
        answer = await self.http.post(
            f"/approvals/{approval_id}/decide",
            json=body,
            headers={"Authorization": f"Bearer {REVIEWER_TOKEN}"},
        )
        assert answer.status_code == 200, answer.text

    async def finished(self, run_id: str) -> dict[str, Any]:
        """The run once it has settled again (15 s at most), as `GET /runs/{id}` shows it."""
        answer = await self.http.get(
            f"/runs/{run_id}?wait=15", headers={"Authorization": f"Bearer {REVIEWER_TOKEN}"}
        )
        found: dict[str, Any] = answer.json()
        return found


@contextlib.asynccontextmanager
async def hosted_bot(
    tmp_path: Path,
    agents: Mapping[str, str],
    tools: Sequence[str],
    rules: Sequence[str] | None = None,
) -> AsyncIterator[Hosted]:
    """The bot hosting `agents` (name -> import path, as `framework_agents:` takes them),
    every call of `tools` reviewed by the reviewer (or by the YAML `rules` given)."""
    path = tmp_path / "nodbot.yml"
    path.write_text(
        HOSTED_CONFIG.format(
            db=tmp_path / "nodbot.db",
            reviewer=REVIEWER,
            agents="\n".join(f"  {name}: {target}" for name, target in agents.items()),
            tools=", ".join(tools),
            rules="\n".join(rules or [review_rule(tool) for tool in tools]),
        )
    )
    names = ("NODBOT_HOSTED_STARTER", "NODBOT_BRIDGE_REVIEWER")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(NODBOT_HOSTED_STARTER=STARTER, NODBOT_BRIDGE_REVIEWER=REVIEWER_TOKEN)
    try:
        async with (
            serving(str(path)) as served,
            httpx.AsyncClient(base_url=served.url, timeout=30) as http,
        ):
            yield Hosted(served, http)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
