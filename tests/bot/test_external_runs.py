"""An app that runs the executor itself, against the bot's database: its paused call is
decided through the bot, the bot tells the app with a signed webhook, and the app resumes
the call with the same run and call ids; the tool runs once."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from nodbot.bot.serve import serving
from nodbot.core import (
    DeferredApproval,
    Executor,
    SqlApprovalStore,
    ToolCall,
    ToolRegistry,
)
from tests.bot.webhook_receiver import SECRET, receiving

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "token-of-lead-00000"


async def test_an_external_run_is_resumed_by_the_decided_webhook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    url = f"sqlite:///{tmp_path / 'nodbot.db'}"
    refunds: list[float] = []
    registry = ToolRegistry()

    @registry.tool(confirm=True)
    def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        refunds.append(amount)
        return f"refunded {amount} on {order_id}"

    async with receiving() as app_hook:
        path = tmp_path / "nodbot.yml"
        path.write_text(
            f"""
store: {{url: "{url}"}}
server: {{host: 127.0.0.1, port: 0}}
api:
  tokens:
    - {{name: U0123LEADS, token: {TOKEN}, scopes: [approvals:read, approvals:decide]}}
webhooks:
  - {{name: app, url: "{app_hook.url}", secret: {SECRET}, events: [approval.decided]}}
"""
        )
        async with (
            serving(str(path)) as bot,
            httpx.AsyncClient(base_url=bot.url) as client,
            SqlApprovalStore(url) as app_store,  # the app's own connection to the database
        ):
            executor = Executor(registry, approval=DeferredApproval(app_store))
            ctx = executor.context("run_external_1")
            call = ToolCall(name="refund", arguments={"order_id": "o-7", "amount": 40}, id="c1")
            paused = await executor.run_call(call, ctx)
            assert paused.status == "pending" and paused.error is not None
            approval_id = paused.error.details["approval_id"]

            decide = f"/approvals/{approval_id}/decide"
            auth = {"Authorization": f"Bearer {TOKEN}"}
            # The bot has no such tool to check an edit with: refused, nothing recorded.
            edit = {"action": "edit", "arguments": {"amount": 30}}
            refused = await client.post(decide, json=edit, headers=auth)
            assert refused.status_code == 422
            assert refused.json()["error"].startswith("edits of refund cannot be checked here")
            assert (await app_store.get(approval_id)).decision is None
            answer = await client.post(decide, json={"action": "approve"}, headers=auth)
            assert answer.status_code == 200, answer.text

            await app_hook.wait_for(1)
            [told] = app_hook.received
            assert told.signed and told.event == "approval.decided"
            assert told.body["approval"]["run_id"] == ctx.run_id
            assert told.body["approval"]["call_id"] == call.id
            resumed = await executor.run_call(call, ctx)  # what the app's handler does
            assert (resumed.status, refunds) == ("ok", [40.0])
            again = await executor.run_call(call, ctx)  # a repeated webhook runs nothing
            assert again.status == "pending" and refunds == [40.0]
