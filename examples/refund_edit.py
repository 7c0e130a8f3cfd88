"""Pause for approval inside an agent's tool loop, and edit the call before it runs.

A scripted model asks for a refund of 120.0. The rule pauses the call; the reviewer edits
the amount to 100.0; the run resumes with the same run id and call id, and the refund runs
once, with the edited amount.
"""

from __future__ import annotations

import asyncio

from nodbot.core import (
    Agent,
    ChatResponse,
    DeferredApproval,
    InterruptRule,
    MemoryApprovalStore,
    ScriptedChat,
    ToolCall,
    ToolDecision,
    ToolRegistry,
    gt,
)

tools = ToolRegistry()


@tools.tool
def refund(order_id: str, amount: float) -> str:
    """Refund an amount on an order."""
    return f"refunded {amount} on {order_id}"


chat = ScriptedChat(
    [
        ChatResponse(
            tool_calls=[
                ToolCall(
                    id="call_1",
                    name="refund",
                    arguments={"order_id": "A-1001", "amount": 120.0},
                )
            ]
        ),
        "The refund is done.",
    ]
)
agent = Agent(chat, tools)


async def main() -> None:
    store = MemoryApprovalStore()
    executor = agent.executor(
        approval=DeferredApproval(store),
        rules=[InterruptRule(tool="refund", match=gt("amount", 100))],
    )
    ctx = executor.context(run_id="support-1")

    paused = await agent.run("Refund order A-1001", ctx)
    print(paused.finish)
    key, pending = next(iter(paused.interrupts.items()))
    print(key, pending.interrupt.tool_name, pending.interrupt.arguments)

    decision = ToolDecision(action="edit", arguments={"amount": 100.0})
    await executor.decide(pending.approval_id, decision, decided_by="ana")
    done = await agent.run(paused.messages, ctx)  # same messages, same run id
    print(done.finish)
    print(done.messages[2].content)
    print(done.final_text)


if __name__ == "__main__":
    asyncio.run(main())
