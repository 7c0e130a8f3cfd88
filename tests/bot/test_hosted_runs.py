"""Agents of other frameworks hosted by the bot (`framework_agents:`), with a hosted agent
written for the test (`Scripted`: a `core.bridges.hosted.HostedAgent` keeping its whole
state in the text it hands the bot): started by `POST /runs`, each paused call reviewed by
the rules, resumed by the workers with the decisions in order, a call without a native id
denied, a second pause reviewed again, and the run finished with the agent's answer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.cli.commands import build_parser
from nodbot.bot.cli.runs import run_runs_command
from nodbot.bot.config import check_agents, load_config
from nodbot.bot.serve import Served, serving
from nodbot.core.bridges.common import NO_CALL_ID, PendingCall, Resolution
from nodbot.core.bridges.hosted import HostedStep

ROOT = Path(__file__).resolve().parents[2]
STARTER = {"Authorization": "Bearer token-of-the-starter-00000000000"}
LEAD = {"Authorization": "Bearer token-of-the-lead-00000000000"}
ran: list[dict[str, Any]] = []
"""The calls `Scripted` ran, in order (its "tool")."""


class Scripted:
    """Pauses for a refund and a call without an id, then (once those are decided) for a
    second refund, then answers what ran. Everything it knows between steps is in `state`."""

    async def start(self, text: str, *, run_id: str) -> HostedStep:
        calls = [
            PendingCall("refund", {"order_id": text, "amount": 120}, "call_1", description="big"),
            PendingCall("refund", {"order_id": text, "amount": 5}, None),
        ]
        return HostedStep(json.dumps({"round": 1, "order": text}), calls)

    async def resume(
        self, state: str, resolutions: Sequence[Resolution], *, run_id: str
    ) -> HostedStep:
        saved = json.loads(state)
        said = []
        for resolution in resolutions:
            if resolution.approved:
                ran.append({"run": run_id, **resolution.arguments})
            said.append(resolution.message)
        if saved["round"] == 1:
            again = [PendingCall("refund", {"order_id": saved["order"], "amount": 7}, "call_2")]
            return HostedStep(
                json.dumps({"round": 2, "order": saved["order"], "said": said}), again
            )
        return HostedStep(json.dumps({"done": True}), (), final_text=f"done: {said}")


hosted = Scripted()

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: starter, token: token-of-the-starter-00000000000, scopes: [runs:write]}}
    - {{name: lead@example.com, token: token-of-the-lead-00000000000,
        scopes: [approvals:read, approvals:decide]}}
framework_agents:
  scripted: tests.bot.test_hosted_runs:hosted
external_tools: [refund]
rules:
  - tool: refund
    when: {{lt: {{amount: 10}}}}
    decision: approve
  - tool: refund
    reviewers: [lead@example.com]
"""


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    monkeypatch.chdir(ROOT)
    ran.clear()
    path = tmp_path / "nodbot.yml"
    path.write_text(CONFIG.format(db=tmp_path / "nodbot.db"))
    async with serving(str(path)) as served:
        yield served


async def test_a_hosted_run_pauses_is_decided_and_finishes(bot: Served) -> None:
    async with httpx.AsyncClient(base_url=bot.url, timeout=30) as client:
        started = await client.post(
            "/runs", json={"agent": "scripted", "input": "o-7"}, headers=STARTER
        )
        assert started.status_code == 201, started.text
        run = started.json()
        assert run["status"] == "waiting"
        [pending] = run["pending"]  # the id-less call has no review
        assert (pending["call_id"], pending["arguments"]) == (
            "call_1",
            {"order_id": "o-7", "amount": 120},
        )
        detail = (await client.get(f"/approvals/{pending['approval_id']}", headers=LEAD)).json()
        assert ran == []
        deny = {"action": "deny", "reason": "too much"}
        decided = await client.post(
            f"/approvals/{pending['approval_id']}/decide", json=deny, headers=LEAD
        )
        assert decided.status_code == 200, decided.text
        # Resumed by the workers: the second pause (amount 7) is approved by the rule at once,
        # so the run goes on to its end.
        done = await client.get(f"/runs/{run['run_id']}?wait=15", headers=LEAD)
        finished = done.json()
        assert finished["status"] == "finished", finished
        assert finished["final_text"] == "done: [None]"
        assert ran == [{"run": run["run_id"], "order_id": "o-7", "amount": 7}]
        assert detail["status"] == "pending"
        listed = (await client.get(f"/approvals?run_id={run['run_id']}", headers=LEAD)).json()
        assert [(a["call_id"], a["status"], a["consumed"]) for a in listed] == [
            ("call_1", "denied", True),
            ("call_2", "approved", True),
        ]


async def test_the_resume_gets_the_decisions_in_order(bot: Served) -> None:
    seen: list[list[tuple[bool, str | None]]] = []

    async def resume(state: str, resolutions: Sequence[Resolution], *, run_id: str) -> HostedStep:
        seen.append([(r.approved, r.message) for r in resolutions])
        return HostedStep("{}", (), final_text="ok")

    hosted.resume = resume  # type: ignore[method-assign]
    try:
        async with httpx.AsyncClient(base_url=bot.url, timeout=30) as client:
            run = (
                await client.post(
                    "/runs", json={"agent": "scripted", "input": "o-8"}, headers=STARTER
                )
            ).json()
            [pending] = run["pending"]
            await client.post(
                f"/approvals/{pending['approval_id']}/decide",
                json={"action": "approve"},
                headers=LEAD,
            )
            done = await client.get(f"/runs/{run['run_id']}?wait=15", headers=LEAD)
            assert done.json()["status"] == "finished"
    finally:
        del hosted.resume  # type: ignore[method-assign]
    assert seen == [[(True, None), (False, NO_CALL_ID)]]


async def test_an_unknown_agent_names_the_hosted_ones(bot: Served) -> None:
    async with httpx.AsyncClient(base_url=bot.url) as client:
        answer = await client.post("/runs", json={"agent": "nope", "input": "x"}, headers=STARTER)
    assert answer.status_code == 422 and "scripted" in answer.json()["error"]


async def test_a_resume_that_fails_fails_the_run_and_runs_nothing_again(bot: Served) -> None:
    async def resume(state: str, resolutions: Sequence[Resolution], *, run_id: str) -> HostedStep:
        raise RuntimeError("the framework broke")

    hosted.resume = resume  # type: ignore[method-assign]
    try:
        async with httpx.AsyncClient(base_url=bot.url, timeout=30) as client:
            body = {"agent": "scripted", "input": "o-9"}
            run = (await client.post("/runs", json=body, headers=STARTER)).json()
            [pending] = run["pending"]
            await client.post(
                f"/approvals/{pending['approval_id']}/decide",
                json={"action": "approve"},
                headers=LEAD,
            )
            done = (await client.get(f"/runs/{run['run_id']}?wait=15", headers=LEAD)).json()
            assert done["status"] == "failed"
            assert "the agent failed: RuntimeError: the framework broke" in done["error"]
            approval = (
                await client.get(f"/approvals/{pending['approval_id']}", headers=LEAD)
            ).json()
            assert (approval["consumed"], approval["finished"], approval["outcome"]) == (
                True,
                True,
                "error",
            )
    finally:
        del hosted.resume  # type: ignore[method-assign]
    assert ran == []


not_hosted = object()


def test_framework_agents_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    path = tmp_path / "nodbot.yml"
    path.write_text(
        "agents:\n  scripted: tests.bot.ledger_agent:agent\n"
        "framework_agents:\n"
        "  scripted: tests.bot.test_hosted_runs:hosted\n"
        "  other: tests.bot.test_hosted_runs:not_hosted\n"
        "  gone: tests.bot.no_such_module:hosted\n"
    )
    found = check_agents(load_config(path))
    assert any("framework_agents.scripted: 'scripted' is under agents: too" in p for p in found)
    assert any("framework_agents.other:" in p and "not a hosted agent" in p for p in found)
    assert any("framework_agents.gone: cannot import" in p for p in found)


async def test_nodbot_runs_start_starts_a_hosted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    path = tmp_path / "nodbot.yml"
    path.write_text(CONFIG.format(db=tmp_path / "nodbot.db"))
    start = ["runs", "start", "scripted", "o-10", "--config", str(path)]
    said = await run_runs_command(build_parser().parse_args(start))
    assert said.startswith("run run_") and "of scripted: waiting" in said
    assert "waits for approval apr_" in said


async def test_a_hosted_start_sent_again_with_its_key_makes_one_run(bot: Served) -> None:
    """`Idempotency-Key` on a framework agent's start: its key is written with the run, so a
    repeat answers that run and starts nothing."""
    keyed = {**STARTER, "Idempotency-Key": "start-o-8"}
    async with httpx.AsyncClient(base_url=bot.url, timeout=30) as client:
        body = {"agent": "scripted", "input": "o-8"}
        first = await client.post("/runs", json=body, headers=keyed)
        again = await client.post("/runs", json=body, headers=keyed)
        assert (first.status_code, again.status_code) == (201, 201), again.text
        assert again.json()["run_id"] == first.json()["run_id"]
        other = await client.post("/runs", json={**body, "input": "o-9"}, headers=keyed)
        assert other.status_code == 409, other.text
        listed = (await client.get("/approvals?status=pending", headers=LEAD)).json()
        assert {view["run_id"] for view in listed} == {first.json()["run_id"]}
