"""The seed's "auto-approve with memory" scenario, with the memory where it belongs: in the
bot, as a rule's `remember:`. The first email to a recipient pauses and the reviewer approves
it "and remember"; the same action again pauses in the middleware too, but the bridge finds it
approved at once (recorded as that reviewer's remembered decision) and the thread goes on
without anyone asked; an email to someone else is reviewed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nodbot.core.bridges.langgraph import resolve_and_resume
from tests.bridges.support import bridged_bot, review_rule
from tests.bridges.test_langgraph import SEED_HITL, assert_finished, email_agent, email_call, paused

WITHIN = 20.0


async def test_a_remembered_approval_auto_approves_the_same_action(tmp_path: Path) -> None:
    rule = review_rule("send_email", remember="1d")  # scoped to the tool and all its arguments
    async with bridged_bot(tmp_path, ["send_email"], rules=[rule]) as bot:
        # First call: a new action, reviewed, approved and remembered.
        first, sent, tools = email_agent([email_call("call_a", "bob@example.com")], SEED_HITL)
        config = await paused(first, "memory-1")
        resuming = asyncio.create_task(
            resolve_and_resume(first, config, bot.client, within=WITHIN, tools=tools)
        )
        [review] = await bot.when_pending(1)
        answer = await bot.reviewer.post(
            f"/approvals/{review['approval_id']}/decide",
            json={"action": "approve", "remember": True},
        )
        assert answer.status_code == 200, answer.text
        await resuming
        await assert_finished(first, config)
        assert [email["to"] for email in sent] == ["bob@example.com"]

        # The same action in another thread: approved at once, nobody asked.
        again, sent_again, tools = email_agent([email_call("call_b", "bob@example.com")], SEED_HITL)
        config = await paused(again, "memory-2")
        await resolve_and_resume(again, config, bot.client, within=WITHIN, tools=tools)
        await assert_finished(again, config)
        assert [email["to"] for email in sent_again] == ["bob@example.com"]
        listed = await bot.reviewer.get("/approvals", params={"run_id": "memory-2"})
        [approval] = listed.json()
        assert approval["decision"]["decided_by"] == "lead@example.com"
        detail = await bot.reviewer.get(f"/approvals/{approval['approval_id']}")
        [decided] = [e for e in detail.json()["events"] if e["kind"] == "decided"]
        assert decided["channel"] == "remembered"
        assert decided["detail"]["evidence"]["from_review"] == review["approval_id"]

        # Another recipient is another action: it waits for the reviewer.
        other, sent_other, tools = email_agent([email_call("call_c", "eve@example.com")], SEED_HITL)
        config = await paused(other, "memory-3")
        waiting = asyncio.create_task(
            resolve_and_resume(other, config, bot.client, within=WITHIN, tools=tools)
        )
        [pending] = await bot.when_pending(1)
        assert pending["run_id"] == "memory-3"
        await bot.decide(pending["approval_id"], "deny", reason="not to eve")
        await waiting
        assert sent_other == []
