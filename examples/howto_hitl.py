"""Human in the loop: pause a risky call, review it, resume it, deny one, and the one-use rule.

Run it with `make demo` (or `python examples/howto_hitl.py`). It needs no network and no
credentials; the memory store stands in for the database-backed one.
"""

from __future__ import annotations

import asyncio

from nodbot.core import (
    ApprovalAlreadyDecided,
    Decision,
    DeferredApproval,
    Executor,
    MemoryApprovalStore,
    ToolCall,
    ToolContext,
    ToolRegistry,
)

registry = ToolRegistry()
paid: list[float] = []


# 1. Mark the risky tool
def big_refund(call: ToolCall, ctx: ToolContext) -> bool:
    return float(call.arguments["amount"]) > 100  # small refunds run without review


@registry.tool(confirm=big_refund, effects="destructive")
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    paid.append(amount)
    return f"refunded {amount} on {order_id}"


async def main() -> None:
    # 2. Pick a port
    store = MemoryApprovalStore()  # use a database-backed ApprovalStore across processes
    executor = Executor(registry, approval=DeferredApproval(store))
    ctx = executor.context(run_id="run_support_42")  # keep the run id to resume later

    small = ToolCall(name="refund", arguments={"order_id": "o-1", "amount": 20}, id="call_0")
    print((await executor.run_call(small, ctx)).value)  # no review needed

    # 3. Pause
    call = ToolCall(name="refund", arguments={"order_id": "o-7", "amount": 500}, id="call_1")
    first = await executor.run_call(call, ctx)
    print(first.status, first.error.kind if first.error else "")  # pending, nothing ran

    # 4. Review
    [waiting] = await store.list(run_id=ctx.run_id, status="pending")
    print(waiting.request.tool, waiting.request.arguments)  # what the reviewer sees
    edit = Decision(approved=True, edited_args={"order_id": "o-7", "amount": 450}, decided_by="ana")
    await store.decide(waiting.approval_id, edit)
    try:
        await store.decide(waiting.approval_id, Decision(approved=False, decided_by="bob"))
    except ApprovalAlreadyDecided:
        print("first decision wins")

    # 5. Resume
    resumed = await executor.run_call(call, ctx)  # same run, same call id
    print(resumed.status, resumed.value)  # runs once, with the edited amount

    # The one-use rule
    print((await store.get(waiting.approval_id)).consumed)  # the decision is spent
    again = await executor.run_call(call, ctx)  # a replay of the same call ...
    new_id = again.error.details["approval_id"] if again.error else ""
    print(again.status, new_id != waiting.approval_id)  # ... is a new review, not a rerun

    # 6. Deny
    call = ToolCall(name="refund", arguments={"order_id": "o-9", "amount": 900}, id="call_2")
    pending = await executor.run_call(call, ctx)
    approval_id = pending.error.details["approval_id"] if pending.error else ""
    no = Decision(approved=False, reason="refund policy: max 500", decided_by="ana")
    await store.decide(approval_id, no)
    denied = await executor.run_call(call, ctx)
    print(denied.status, denied.error.message if denied.error else "")  # the tool never ran

    print(paid)


if __name__ == "__main__":
    asyncio.run(main())
