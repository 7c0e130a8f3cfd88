"""An agent for the bot's tests whose refund tool writes down every time it really runs.

Every run asks for one refund (of the amount in its input, as `refund <order> <amount>`)
and then answers. `RUNS` is shared by every bot of the process, so replicas can be counted;
a bot in another process appends `<order> <amount>` lines to the file named by
`NODBOT_TEST_LEDGER`. A refund of an order whose id starts with `stuck` never returns (for
60 s): the bot can be killed while the tool runs. One whose id starts with `held` returns
once a file named as the ledger with `.go` added exists (at most 60 s): a test can do
something while the tool runs, then let it return.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from nodbot.core import (
    Agent,
    AssistantMessage,
    ChatResponse,
    HumanMessage,
    Message,
    ToolCall,
    ToolRegistry,
    ToolSpec,
)

RUNS: list[tuple[str, float]] = []

tools = ToolRegistry()


@tools.tool(effects="destructive")
def refund(order_id: str, amount: float) -> str:
    """Refund an amount on an order."""
    RUNS.append((order_id, amount))
    ledger = os.environ.get("NODBOT_TEST_LEDGER")
    if ledger:
        with open(ledger, "a") as file:
            file.write(f"{order_id} {amount}\n")
    if order_id.startswith("stuck"):
        time.sleep(60)
    if order_id.startswith("held") and ledger:
        until = time.monotonic() + 60
        while not os.path.exists(f"{ledger}.go") and time.monotonic() < until:
            time.sleep(0.01)
    return f"refunded {amount} on {order_id}"


class LedgerChat:
    """Asks for the refund named in the run's input, then says it is done."""

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        if any(isinstance(message, AssistantMessage) for message in messages):
            return ChatResponse(content="done")
        [asked] = [m for m in messages if isinstance(m, HumanMessage)]
        _, order_id, amount = asked.content.split()
        call = ToolCall(
            id="call_1", name="refund", arguments={"order_id": order_id, "amount": amount}
        )
        return ChatResponse(tool_calls=[call])


agent = Agent(LedgerChat(), tools)


LEAD = "U0123LEADS"
"""Who reviews the ledger's refunds unless a test names another."""


def config_yaml(
    store_url: str,
    *,
    settings: str = "",
    token: str | None = None,
    lead: str = LEAD,
    self_approval: bool = False,
) -> str:
    """A bot's configuration with this agent as `ledger`, whose refunds `lead` reviews:
    `settings` (the file's other sections) first, then the store at `store_url`, `lead`'s API
    token (to start runs and to decide them) when `token` is given, the agent and its rule
    (with `allow_self_approval` when `self_approval`: `lead` decides the runs it starts)."""
    api = ""
    if token is not None:
        scopes = "[runs:write, approvals:read, approvals:decide]"
        api = f"api:\n  tokens:\n    - {{name: {lead}, token: {token}, scopes: {scopes}}}\n"
    allow = "    allow_self_approval: true\n" if self_approval else ""
    return (
        f"{settings}\n"
        f'store: {{url: "{store_url}"}}\n'
        f"{api}"
        "agents:\n  ledger: tests.bot.ledger_agent:agent\n"
        f"rules:\n  - tool: refund\n    reviewers: [{lead}]\n{allow}"
    )
