"""The bot end to end: `nodbot serve` starts runs, posts nothing it should not, waits for a
decision made over HTTP, and finishes the run with the same run id, the tool run once."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot import service as service_module
from nodbot.bot.serve import _listen, serving
from nodbot.bot.service import BotService
from nodbot.core import (
    Agent,
    AssistantMessage,
    ChatCompletionsModel,
    ChatResponse,
    Decision,
    Message,
    ToolCall,
    ToolRegistry,
    ToolSpec,
)
from tests.bot.processes import Running, nodbot_serve
from tests.bot.test_cli import nodbot
from tests.bot.webhook_receiver import SECRET as RECEIVER_SECRET
from tests.bot.webhook_receiver import Receiver, receiving
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
TOKENS = {
    "NODBOT_TOKEN_ANA": "token-of-ana-000000",
    "NODBOT_TOKEN_LEAD": "token-of-lead-00000",
    "NODBOT_TOKEN_OTHER": "token-of-other-0000",
}
WHO = {"ana": "NODBOT_TOKEN_ANA", "lead": "NODBOT_TOKEN_LEAD", "other": "NODBOT_TOKEN_OTHER"}


REVIEW = "    reviewers: [U0123LEADS]"


def config(tmp_path: Path, review: str = REVIEW) -> Path:
    path = tmp_path / "nodbot.yml"
    path.write_text(
        f"""
store:
  url: sqlite:///{tmp_path / "nodbot.db"}
server:
  host: 127.0.0.1
  port: 0
api:
  tokens:
    - name: ana
      token: ${{NODBOT_TOKEN_ANA}}
      scopes: [runs:write, runs:write-as, approvals:read]
    - name: U0123LEADS
      token: ${{NODBOT_TOKEN_LEAD}}
      scopes: [approvals:read, approvals:decide]
    - name: U0777OTHER
      token: ${{NODBOT_TOKEN_OTHER}}
      scopes: [approvals:read, approvals:decide]
agents:
  support: examples.support_agent:agent
rules:
  - tool: refund
    when: {{gt: {{amount: 100}}}}
{review}
"""
    )
    return path


def as_(name: str) -> dict[str, str]:
    secret = TOKENS[WHO[name]]
    return {"Authorization": f"Bearer {secret}"}


async def until_finished(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    """The run once it has finished; the workers were woken by the decision."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        run: dict[str, Any] = (await client.get(f"/runs/{run_id}", headers=as_("lead"))).json()
        if run["status"] in ("finished", "failed"):
            return run
        await asyncio.sleep(0.02)
    raise AssertionError(f"run {run_id} did not finish: {run}")


async def approve_flow(client: httpx.AsyncClient) -> None:
    """Start a run, see its refund wait, approve it, see the run finish and the tool run once."""
    started = await client.post(
        "/runs",
        json={"agent": "support", "input": "Refund order A-1001", "requested_by": "U0999CAROL"},
        headers=as_("ana"),
    )
    assert started.status_code == 201, started.text
    run = started.json()
    assert run["status"] == "waiting"
    [pending] = run["pending"]
    assert (pending["tool"], pending["arguments"]) == (
        "refund",
        {"order_id": "A-1001", "amount": 120.0},
    )
    stranger = await client.post(
        f"/approvals/{pending['approval_id']}/decide",
        json={"action": "approve"},
        headers=as_("other"),
    )
    assert stranger.status_code == 403
    assert stranger.json()["error"] == "you are not one of the reviewers of this call"
    decided = await client.post(
        f"/approvals/{pending['approval_id']}/decide",
        json={"action": "approve"},
        headers=as_("lead"),
    )
    assert decided.status_code == 200, decided.text
    finished = await until_finished(client, run["run_id"])
    assert finished["status"] == "finished"
    assert finished["final_text"].startswith("I asked for the refund of order A-1001")
    [result] = finished["tool_results"]
    assert (result["status"], result["arguments"]["amount"]) == ("ok", 120.0)
    assert finished["pending"] == []
    approval = (
        await client.get(f"/approvals/{pending['approval_id']}", headers=as_("lead"))
    ).json()
    assert (approval["consumed"], approval["finished"], approval["outcome"]) == (True, True, "ok")
    assert approval["decision"]["decided_by"] == "U0123LEADS"
    assert approval["run_id"] == run["run_id"]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Running]:
    async with nodbot_serve(config(tmp_path), **TOKENS) as bot:
        yield bot


async def test_a_run_waits_for_the_decision_then_finishes(served: Running) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        await approve_flow(client)


async def test_runs_need_the_runs_write_scope_and_a_known_agent(served: Running) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        body = {"agent": "support", "input": "hi"}
        refused = await client.post("/runs", json=body, headers=as_("lead"))
        assert refused.status_code == 403
        assert "runs:write" in refused.json()["error"]
        unknown = await client.post("/runs", json={**body, "agent": "sales"}, headers=as_("ana"))
        assert unknown.status_code == 422
        assert "unknown agent 'sales'" in unknown.json()["error"]
        missing = await client.get("/runs/run_nope", headers=as_("ana"))
        assert missing.status_code == 404


async def test_the_requester_may_not_approve_the_runs_calls(served: Running) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        started = await client.post(
            "/runs",
            json={"agent": "support", "input": "Refund", "requested_by": "U0123LEADS"},
            headers=as_("ana"),
        )
        [pending] = started.json()["pending"]
        decided = await client.post(
            f"/approvals/{pending['approval_id']}/decide",
            json={"action": "approve"},
            headers=as_("lead"),
        )
        assert decided.status_code == 403


def test_nodbot_serve_runs_the_bot_until_interrupted(tmp_path: Path) -> None:
    command = [nodbot(), "serve", "--config", str(config(tmp_path))]
    environment = {**os.environ, **TOKENS}
    with subprocess.Popen(
        command,
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()  # the bot says where it serves, once it does
            assert line.startswith("nodbot: serving http://127.0.0.1:"), line

            async def flow() -> None:
                async with httpx.AsyncClient(base_url=line.split()[2]) as client:
                    await approve_flow(client)

            asyncio.run(flow())
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=20) == 0
        finally:
            if process.poll() is None:
                process.kill()


def test_sigterm_stops_nodbot_serve_cleanly(tmp_path: Path) -> None:
    command = [nodbot(), "serve", "--config", str(config(tmp_path))]
    with subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, **TOKENS}, stdout=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline().startswith("nodbot: serving ")
            assert (tmp_path / "nodbot.db-wal").exists()  # the store is open
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0
        finally:
            if process.poll() is None:
                process.kill()
    # The store was closed before the process ended: SQLite folded its log into the file.
    assert not (tmp_path / "nodbot.db-wal").exists()


def test_a_review_nobody_decides_times_out_into_a_denial_in_nodbot_serve(tmp_path: Path) -> None:
    review = "    reviewers: [U0123LEADS]\n    timeout: 1s\nworkers: {poll: 0.2}"
    command = [nodbot(), "serve", "--config", str(config(tmp_path, review))]
    with subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, **TOKENS},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.startswith("nodbot: serving http://127.0.0.1:"), line

            async def flow() -> None:
                async with httpx.AsyncClient(base_url=line.split()[2]) as client:
                    body = {"agent": "support", "input": "Refund order A-1001"}
                    run = (await client.post("/runs", json=body, headers=as_("ana"))).json()
                    [pending] = run["pending"]
                    finished = await until_finished(client, run["run_id"])
                    assert finished["status"] == "finished"
                    [result] = finished["tool_results"]
                    assert result["status"] == "error" and result["arguments"] is None
                    assert "nobody decided before the deadline" in result["content"]
                    approval = await client.get(
                        f"/approvals/{pending['approval_id']}", headers=as_("lead")
                    )
                    decision = approval.json()["decision"]
                    assert (decision["approved"], decision["decided_by"]) == (
                        False,
                        "nodbot:timeout",
                    )
                    late = await client.post(
                        f"/approvals/{pending['approval_id']}/decide",
                        json={"action": "approve"},
                        headers=as_("lead"),
                    )
                    assert late.status_code == 409  # the timeout decided first

            asyncio.run(flow())
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=20) == 0
        finally:
            if process.poll() is None:
                process.kill()


async def test_a_review_that_needs_two_approvals_waits_for_both(tmp_path: Path) -> None:
    review = "    reviewers: [U0123LEADS, U0777OTHER]\n    approvals_required: 2"
    async with (
        nodbot_serve(config(tmp_path, review), **TOKENS) as bot,
        httpx.AsyncClient(base_url=bot.url) as client,
    ):
        body = {"agent": "support", "input": "Refund", "requested_by": "U0999CAROL"}
        run = (await client.post("/runs", json=body, headers=as_("ana"))).json()
        [pending] = run["pending"]
        decide = f"/approvals/{pending['approval_id']}/decide"
        first = await client.post(decide, json={"action": "approve"}, headers=as_("lead"))
        assert (first.status_code, first.json()["status"]) == (200, "pending")
        again = await client.post(decide, json={"action": "approve"}, headers=as_("lead"))
        assert again.status_code == 409
        assert again.json()["error"] == "you have voted on this approval already"
        edit = {"action": "edit", "arguments": {"amount": 1}}
        refused = await client.post(decide, json=edit, headers=as_("other"))
        assert refused.status_code == 422
        second = await client.post(decide, json={"action": "approve"}, headers=as_("other"))
        assert second.json()["decision"]["decided_by"] == "U0123LEADS, U0777OTHER"
        finished = await until_finished(client, run["run_id"])
        assert finished["status"] == "finished"


def refs(node: object) -> set[str]:
    """Every `$ref` in a JSON document."""
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(refs(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(value) for value in node))
    return set()


async def test_the_openapi_document_describes_every_route(served: Running) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        document = (await client.get("/openapi.json")).json()
    assert document["openapi"] == "3.1.0"
    assert set(document["paths"]) == {
        "/healthz",
        "/readyz",
        "/approvals",
        "/approvals/{approval_id}",
        "/approvals/{approval_id}/decide",
        "/approvals/decide",
        "/approvals/{approval_id}/consume",
        "/questions",
        "/runs",
        "/runs/{run_id}",
    }
    assert set(document["paths"]["/approvals"]) == {"get", "post"}
    schemas = document["components"]["schemas"]
    assert {"tool", "arguments", "schema", "run_id", "call_id"} <= set(
        schemas["RequestBody"]["properties"]
    )
    assert set(schemas["DecideBody"]["properties"]) == {
        "action",
        "type",
        "arguments",
        "edited_arguments",
        "edited_action",
        "reason",
        "message",
        "remember",
    }
    assert {ref.rsplit("/", 1)[1] for ref in refs(document)} <= set(schemas)
    decide = document["paths"]["/approvals/{approval_id}/decide"]["post"]
    assert set(decide["responses"]) == {"200", "401", "403", "404", "409", "413", "422"}


async def test_metrics_count_approvals_runs_and_decisions(served: Running) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        await approve_flow(client)
        answer = await client.get("/metrics")
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    lines = set(answer.text.splitlines())
    assert 'nodbot_approvals{status="approved"} 1' in lines
    assert 'nodbot_approvals{status="pending"} 0' in lines
    assert "nodbot_runs_started_total 1" in lines
    assert "nodbot_runs_advanced_total 1" in lines
    assert "nodbot_decisions_total 1" in lines
    assert "# TYPE nodbot_decisions_total counter" in lines


async def test_an_escalation_is_announced_and_lets_its_reviewers_decide(tmp_path: Path) -> None:
    async with receiving() as receiver:
        review = f"""    reviewers: [U0123LEADS]
    escalate_after: 1s
    escalate_to: [U0777OTHER]
webhooks:
  - {{name: ops, url: "{receiver.url}", secret: {RECEIVER_SECRET}}}"""
        path = config(tmp_path, review)
        async with (
            nodbot_serve(path, **TOKENS) as bot,
            httpx.AsyncClient(base_url=bot.url) as client,
        ):
            started = await client.post(
                "/runs",
                json={"agent": "support", "input": "Refund order A-1001"},
                headers=as_("ana"),
            )
            [pending] = started.json()["pending"]
            decide = f"/approvals/{pending['approval_id']}/decide"
            early = await client.post(decide, json={"action": "approve"}, headers=as_("other"))
            assert early.status_code == 403  # not a reviewer until the escalation
            await receiver.wait_for(2)  # the request, then the escalation a second later
            assert [r.event for r in receiver.received] == [
                "approval.pending",
                "approval.escalated",
            ]
            escalated = receiver.received[1]
            assert escalated.signed and escalated.at - receiver.received[0].at >= 0.9
            late = await client.post(decide, json={"action": "approve"}, headers=as_("other"))
            assert late.status_code == 200, late.text
            assert (await until_finished(client, started.json()["run_id"]))["status"] == "finished"
            await receiver.wait_for(3)
            assert receiver.received[2].event == "approval.decided"
            decided_by = receiver.received[2].body["approval"]["decision"]["decided_by"]
            assert decided_by == "U0777OTHER"


async def test_a_client_can_wait_for_a_run_without_polling(served: Running) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        body = {"agent": "support", "input": "Refund order A-1001"}
        run = (await client.post("/runs", json=body, headers=as_("ana"))).json()
        show = f"/runs/{run['run_id']}"
        began = time.monotonic()
        paused = (await client.get(show, params={"wait": 5}, headers=as_("lead"))).json()
        assert paused["status"] == "waiting" and paused["pending"]
        assert time.monotonic() - began < 1  # settled already: answered at once
        decide = f"/approvals/{run['pending'][0]['approval_id']}/decide"
        await client.post(decide, json={"action": "approve"}, headers=as_("lead"))
        began = time.monotonic()
        done = (await client.get(show, params={"wait": 5}, headers=as_("lead"))).json()
        assert done["status"] == "finished"
        assert time.monotonic() - began < 2
        for wrong in ("61", "-1", "soon"):
            answer = await client.get(show, params={"wait": wrong}, headers=as_("lead"))
            assert answer.status_code == 422, wrong
            assert answer.json()["details"]["errors"][0]["field"] == "wait"


def test_the_bots_connections_send_at_once() -> None:
    """The bot's listening socket says TCP, so every connection accepted from it does, and
    asyncio turns on TCP_NODELAY for it (for no other socket): a kept-alive client's second
    request is then not held back ~40 ms by its delayed ACK."""
    listening = _listen("127.0.0.1", 0, "nodbot.yml", host_from=None, port_from=None)
    try:
        client = socket.create_connection(listening.getsockname()[:2])
        accepted, _ = listening.accept()
        with client, accepted:
            assert accepted.proto == socket.IPPROTO_TCP
    finally:
        listening.close()


# An agent whose model talks to a chat completions server (never reached here).
chat_agent = Agent(
    ChatCompletionsModel(base_url="http://127.0.0.1:9/v1", model="local"), ToolRegistry()
)


def in_process_config(tmp_path: Path, rest: str) -> Path:
    """A nodbot.yml for a bot served in this process: SQLite in `tmp_path`, a free port."""
    path = tmp_path / "nodbot.yml"
    path.write_text(
        f"""
store: {{url: "sqlite:///{tmp_path / "nodbot.db"}"}}
server: {{host: 127.0.0.1, port: 0}}
{rest}"""
    )
    return path


async def test_the_agents_chat_models_send_on_the_bots_one_session(tmp_path: Path) -> None:
    path = in_process_config(tmp_path, "agents:\n  chatty: tests.bot.test_serve:chat_agent\n")
    chat = chat_agent.chat
    assert isinstance(chat, ChatCompletionsModel)
    for _ in range(2):  # a bot started again hands over its new session
        async with serving(str(path), configure_logs=False) as served:
            session = chat._session
            assert session is not None and not session.closed
            assert served.service.agents["chatty"].chat is chat
            assert not chat._owns_session  # the bot's: the model does not close it
        assert session.closed  # closed with the bot


@pytest.mark.parametrize(
    ("channels", "outcome_stage"),
    [
        ("", False),  # no channel at all
        ("webhooks:\n  - {name: ops, url: 'http://127.0.0.1:9/hook', secret: HOOK_SECRET,"
         " events: [approval.pending]}\n", False),
        ("webhooks:\n  - {name: ops, url: 'http://127.0.0.1:9/hook', secret: HOOK_SECRET}\n",
         True),  # every event, approval.decided among them
    ],
)  # fmt: skip
async def test_the_store_keeps_an_outcome_stage_only_for_channels_that_tell_outcomes(
    tmp_path: Path, channels: str, outcome_stage: bool
) -> None:
    path = in_process_config(tmp_path, channels.replace("HOOK_SECRET", "s" * 40))
    async with serving(str(path), configure_logs=False) as served:
        assert served.service.store.outcome_stage is outcome_stage


async def test_what_the_bot_holds_from_its_start_is_kept_out_of_full_collections(
    tmp_path: Path,
) -> None:
    path = in_process_config(tmp_path, "agents:\n  support: examples.support_agent:agent\n")
    assert gc.get_freeze_count() == 0
    async with serving(str(path), configure_logs=False):
        assert gc.get_freeze_count() > 10_000  # the modules, agents and app, at least
    assert gc.get_freeze_count() == 0  # handed back to the collector with the bot


# An agent whose refunds wait for the test to let them finish.
slow_tools = ToolRegistry()
refunds_may_finish = asyncio.Event()
"""Made anew for each test by `slow_refunds` (an event belongs to the loop that waits on it)."""
refunds_started: list[str] = []


@pytest.fixture
def slow_refunds() -> None:
    """The slow agent's refunds wait for a new `refunds_may_finish`; none started yet."""
    global refunds_may_finish
    refunds_may_finish = asyncio.Event()
    refunds_started.clear()


@slow_tools.tool(effects="destructive")
async def refund(order_id: str, amount: float) -> str:
    """Refund an amount on an order (once the test lets it)."""
    refunds_started.append(order_id)
    await refunds_may_finish.wait()
    return f"refunded {amount} on {order_id}"


class RefundChat:
    """Asks for the refund its input names (`refund <order> <amount>`), then says done."""

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        if any(isinstance(message, AssistantMessage) for message in messages):
            return ChatResponse(content="done")
        _, order_id, amount = str(messages[-1].content).split()
        arguments = {"order_id": order_id, "amount": float(amount)}
        return ChatResponse(tool_calls=[ToolCall(id="call_1", name="refund", arguments=arguments)])


slow_agent = Agent(RefundChat(), slow_tools)


@pytest.mark.usefixtures("slow_refunds")
async def test_a_review_is_posted_while_another_runs_tool_is_still_running(
    tmp_path: Path,
) -> None:
    async with receiving() as receiver:
        path = in_process_config(
            tmp_path,
            f"""workers: {{poll: 60}}
agents:
  slow: tests.bot.test_serve:slow_agent
rules:
  - tool: refund
    reviewers: [U0123LEADS]
webhooks:
  - {{name: ops, url: "{receiver.url}", secret: {RECEIVER_SECRET}}}
""",
        )
        async with serving(str(path), configure_logs=False) as served:
            try:
                await _post_while_refunding(served.service, receiver)
            finally:
                refunds_may_finish.set()  # the bot stops only once its tools have returned


def _slow_config(tmp_path: Path) -> Path:
    """The slow agent, its refunds put to review, the workers woken only by this process."""
    return in_process_config(
        tmp_path,
        """workers: {poll: 60}
agents:
  slow: tests.bot.test_serve:slow_agent
rules:
  - tool: refund
    reviewers: [U0123LEADS]
""",
    )


async def _approved_run(service: BotService, order: str) -> str:
    """A run of the slow agent refunding `order`, its review approved (the workers not told)."""
    run = await service.start_run("slow", f"refund {order} 5", requested_by="ana")
    [pending] = await service.store.list(run_id=run.run_id, status="pending")
    await service.store.decide(
        pending.approval_id, Decision(approved=True, decided_by="U0123LEADS")
    )
    return run.run_id


@pytest.mark.usefixtures("slow_refunds")
async def test_a_decided_run_goes_on_while_another_runs_tool_is_still_running(
    tmp_path: Path,
) -> None:
    async with serving(str(_slow_config(tmp_path)), configure_logs=False) as served:
        service = served.service
        try:
            started_runs = []
            for order in ("o-1", "o-2"):
                started_runs.append(await _approved_run(service, order))
                service.decided()

                async def started(order: str = order) -> bool:
                    return order in refunds_started

                # The first refund is still running: the second run is claimed all the same.
                await eventually(started, f"the refund of {order} started")
            assert refunds_started == ["o-1", "o-2"]
            both = [await service.store.get_run(run_id) for run_id in started_runs]
            assert [run.status for run in both] == ["running", "running"]  # both refunds wait
        finally:
            refunds_may_finish.set()  # the bot stops only once its tools have returned


@pytest.mark.usefixtures("slow_refunds")
async def test_ready_runs_past_the_lanes_room_are_claimed_once_one_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "ADVANCING_MOST", 1)  # room for one run at a time
    async with serving(str(_slow_config(tmp_path)), configure_logs=False) as served:
        service = served.service
        try:
            runs = [await _approved_run(service, order) for order in ("o-1", "o-2")]
            service.decided()

            async def first_started() -> bool:
                return refunds_started == ["o-1"]

            await eventually(first_started, "the first refund started")
            assert (await service.store.get_run(runs[1])).status == "waiting"  # no room
            refunds_may_finish.set()

            async def both_finished() -> bool:
                found = [await service.store.get_run(run_id) for run_id in runs]
                return all(run.status == "finished" for run in found)

            await eventually(both_finished, "the second run claimed once the first ended")
            assert refunds_started == ["o-1", "o-2"]
        finally:
            refunds_may_finish.set()


async def _post_while_refunding(service: BotService, receiver: Receiver) -> None:
    first = await service.start_run("slow", "refund o-1 5", requested_by="ana")
    [pending] = await service.store.list(run_id=first.run_id, status="pending")
    await receiver.wait_for(1)  # its review, posted
    await service.store.decide(
        pending.approval_id, Decision(approved=True, decided_by="U0123LEADS")
    )
    service.decided()

    async def refunding() -> bool:
        run = await service.store.get_run(first.run_id)
        return run.status == "running"

    await eventually(refunding, "the first run's refund running")
    # Its refund holds the runs' lane; the next review is posted all the same.
    await service.start_run("slow", "refund o-2 5", requested_by="ana")
    await receiver.wait_for(2, within=5)
    assert (await service.store.get_run(first.run_id)).status == "running"
    refunds_may_finish.set()

    async def finished() -> bool:
        return (await service.store.get_run(first.run_id)).status == "finished"

    await eventually(finished, "the first run finished")
