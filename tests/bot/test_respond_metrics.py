"""`GET /metrics` counts a respond as its own outcome: a real bot (SQLite, the ledger agent and
the asking agent, the API) records a reviewer's answer in a refund's place, a question's
answer and a declined question, and the decision histogram says `responded` for the two
answers (the question's on tool `ask`, though no rule names it) and `denied` only for the
decline. The other outcomes keep their names (`tests/bot/test_metrics.py`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.config import load_agents, load_config
from nodbot.bot.config.models import ApiToken
from nodbot.bot.http import create_app
from nodbot.bot.metrics import METRICS, OUTCOMES, outcome_of
from nodbot.bot.service import BotService
from nodbot.core import QUESTION_TOOL, Decision, SqlApprovalStore
from nodbot.core.store import TIMEOUT_DECIDER
from tests.bot.test_metrics import DECISION, LEAD, REVIEWER, SCOPES, TOKENS, Scrape
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
ANSWER = "Refunded by hand already: tell the customer it is on its way."

CONFIG = """
workers: {{poll: 0.05}}
store: {{url: "{url}"}}
agents:
  ledger: tests.bot.ledger_agent:agent
  asker: tests.bot.asking_agent:agent
rules:
  - tool: refund                      # rule 0
    reviewers: [U0777REVIEW]
    allowed_decisions: [approve, deny, respond]
defaults:                             # questions: no rule names `ask`
  reviewers: [U0777REVIEW]
"""


class Bot:
    """The bot and an API client per token."""

    def __init__(self, clients: dict[str, httpx.AsyncClient]) -> None:
        self.clients = clients

    async def start(self, agent: str, text: str) -> tuple[str, str]:
        """A run of `agent` on `text`: its id, and the approval it waits for."""
        answer = await self.clients[LEAD].post("/runs", json={"agent": agent, "input": text})
        assert answer.status_code == 201, answer.text
        run: dict[str, Any] = answer.json()
        [pending] = run["pending"]
        return run["run_id"], pending["approval_id"]

    async def decide(self, approval_id: str, **body: Any) -> None:
        answer = await self.clients[REVIEWER].post(f"/approvals/{approval_id}/decide", json=body)
        assert answer.status_code == 200, answer.text

    async def settled(self, run_id: str) -> dict[str, Any]:
        async def done() -> bool:
            answer = await self.clients[LEAD].get(f"/runs/{run_id}")
            return bool(answer.json()["status"] in ("finished", "failed"))

        await eventually(done, f"run {run_id} settled")
        found: dict[str, Any] = (await self.clients[LEAD].get(f"/runs/{run_id}")).json()
        return found

    async def scrape(self) -> Scrape:
        answer = await self.clients[LEAD].get("/metrics")
        assert answer.status_code == 200
        return Scrape.parse(answer.text)


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)  # where the test agents are imported from
    METRICS.reset()  # this process's series from nothing
    path = tmp_path / "nodbot.yml"
    path.write_text(CONFIG.format(url=f"sqlite:///{tmp_path / 'nodbot.db'}"))
    config = load_config(path)
    agents, problems = load_agents(config)
    assert not problems
    async with SqlApprovalStore(config.store.url) as store:
        service = BotService(config, store, agents, channels=[])
        tokens = [ApiToken(name=n, token=t, scopes=SCOPES[n]) for n, t in TOKENS.items()]
        app = create_app(store=store, registry=service.registry, tokens=tokens, service=service)
        stop = asyncio.Event()
        working = asyncio.create_task(service.work(stop))
        transport = httpx.ASGITransport(app=app)
        clients = {
            name: httpx.AsyncClient(
                transport=transport,
                base_url="http://bot",
                headers={"Authorization": f"Bearer {token}"},
            )
            for name, token in TOKENS.items()
            if name in (LEAD, REVIEWER)
        }
        try:
            yield Bot(clients)
        finally:
            for client in clients.values():
                await client.aclose()
            stop.set()
            await working


async def test_responds_and_answers_are_counted_apart_from_denials(bot: Bot) -> None:
    refund_run, refund_review = await bot.start("ledger", "refund o-r 40")
    await bot.decide(refund_review, action="respond", message=ANSWER)
    refunded = await bot.settled(refund_run)
    assert refunded["status"] == "finished"

    asked_run, question = await bot.start("asker", "ship A1")
    await bot.decide(question, action="respond", message="Porto")
    shipped = await bot.settled(asked_run)
    assert shipped["status"] == "finished"

    declined_run, declined = await bot.start("asker", "note A2")
    await bot.decide(declined, action="deny", reason="no note on this one")
    await bot.settled(declined_run)

    scrape = await bot.scrape()
    seen = {
        (dict(ls)["tool"], dict(ls)["rule"], dict(ls)["channel"], dict(ls)["outcome"]): value
        for (name, ls), value in scrape.samples.items()
        if name == f"{DECISION}_count"
    }
    assert seen == {
        ("refund", "0", "api", "responded"): 1,
        (QUESTION_TOOL, "defaults", "api", "responded"): 1,  # the question's answer
        (QUESTION_TOOL, "defaults", "api", "denied"): 1,  # the declined question
    }
    assert scrape.label_values(DECISION + "_count", "outcome") <= OUTCOMES
    # Stored as denials all three (nothing ran in the tool's place): the store's gauge.
    assert scrape.value("nodbot_approvals", status="denied") == 3


def test_the_outcome_of_each_decision() -> None:
    assert outcome_of(Decision(approved=True)) == "approved"
    assert outcome_of(Decision(approved=True, edited_args={"amount": 5})) == "edited"
    assert outcome_of(Decision(approved=False, reason="no")) == "denied"
    assert outcome_of(Decision(approved=False, response=ANSWER)) == "responded"
    assert outcome_of(Decision(approved=False, decided_by=TIMEOUT_DECIDER)) == "expired"
    assert {"approved", "edited", "denied", "responded", "expired"} == OUTCOMES
