"""Questions to a person (`ctx.ask`, seed 001's `interrupt()`), in the engine.

A tool asks; the call pauses on a review of the pseudo-tool `ask` kept in a real store
(memory, SQLite, PostgreSQL); a person answers (a respond: one of the choices, named as the
question spells it) and the resumed call runs the tool again from the top, when `ask`
returns the answer. A decline (a deny) or a timeout ends the call in `QuestionUnanswered`
and nothing after the question runs. An answer that is none of the choices is refused and
records nothing; the first answer wins; a tool whose call a reviewer approved may not ask;
a question that cannot be asked (blank, bad choices, bad id) is refused before anything is
stored.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodbot.core import (
    QUESTION_TOOL,
    ApprovalAlreadyDecided,
    ApprovalRequest,
    ApprovalStore,
    AutoDeny,
    CallbackApproval,
    ChatResponse,
    Decision,
    DeferredApproval,
    Executor,
    HumanMessage,
    InvalidDecisionError,
    InvalidQuestionError,
    MemoryApprovalStore,
    PortAnswer,
    QuestionPending,
    QuestionUnanswered,
    ScriptedChat,
    SqlApprovalStore,
    ToolCall,
    ToolContext,
    ToolRegistry,
    answer_of,
    is_question,
    run_tool_loop,
)
from nodbot.core.questions import (
    MAX_CHOICE,
    MAX_CHOICES,
    MAX_QUESTION,
    choice_for,
    make_question,
    question_of,
    question_request,
)
from tests.core.store.conftest import database_url

BACKENDS = ["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
WAREHOUSES = ["Leeds", "Porto"]


@dataclass
class Shop:
    """A store, an executor whose tools ask, and what got past each question."""

    store: ApprovalStore
    executor: Executor
    shipped: list[tuple[str, str]] = field(default_factory=list)
    before: list[str] = field(default_factory=list)
    """Orders whose tool started (code before the question runs once per run of the tool)."""

    async def asked(self, name: str = "ship", order: str = "A1", run_id: str = "run_1"):
        call = ToolCall(name=name, arguments={"order_id": order}, id=f"call_{order}")
        result = await self.executor.run_call(call, self.executor.context(run_id))
        return call, result


def shop_tools(shop_log: list[tuple[str, str]], before: list[str]) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool()
    async def ship(order_id: str, ctx: ToolContext) -> str:
        """Ship from the warehouse a person picks."""
        before.append(order_id)
        warehouse = await ctx.ask(f"Which warehouse ships {order_id}?", choices=WAREHOUSES)
        shop_log.append((order_id, warehouse))
        return f"{order_id} from {warehouse}"

    @registry.tool()
    async def note(order_id: str, ctx: ToolContext) -> str:
        """Write what a person says on the parcel."""
        text = await ctx.ask("What should the parcel say?", id="parcel_note")
        shop_log.append((order_id, text))
        return text

    @registry.tool(confirm=True)
    async def refund(order_id: str, ctx: ToolContext) -> str:
        """A reviewed tool that (wrongly) asks after its approval."""
        reason = await ctx.ask("Why?")
        shop_log.append((order_id, reason))
        return reason

    return registry


@contextlib.asynccontextmanager
async def opened(backend: str, tmp_path: Path) -> AsyncIterator[ApprovalStore]:
    if backend == "memory":
        yield MemoryApprovalStore()
        return
    async with database_url(backend, tmp_path) as url, SqlApprovalStore(url) as store:
        yield store


@pytest.fixture(params=BACKENDS)
async def shop(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Shop]:
    async with opened(request.param, tmp_path) as store:
        made = Shop(store, Executor(ToolRegistry()))
        made.executor = Executor(
            shop_tools(made.shipped, made.before), approval=DeferredApproval(store)
        )
        yield made


async def test_a_question_pauses_the_call_and_its_answer_resumes_it(shop: Shop) -> None:
    call, result = await shop.asked()

    assert result.status == "pending" and result.error is not None
    assert result.error.kind == "question-pending"
    assert result.arguments == {"order_id": "A1"}  # the asking call's, as for a review
    assert shop.shipped == []
    approval_id = result.error.details["approval_id"]
    record = await shop.store.get(approval_id)
    assert is_question(record.request) and record.request.tool == QUESTION_TOOL
    assert record.request.arguments == {
        "question": "Which warehouse ships A1?",
        "choices": WAREHOUSES,
        "asked_by": "ship",
    }
    assert record.request.call_id.startswith("call_A1.ask_q")
    assert record.status == "pending"

    decided = await shop.executor.decide(
        approval_id, {"action": "respond", "message": " porto "}, decided_by="ana"
    )
    assert answer_of(decided) == "Porto"  # the choice as the question spells it

    resumed = await shop.executor.run_call(call, shop.executor.context("run_1"))

    assert (resumed.status, resumed.value) == ("ok", "A1 from Porto")
    assert shop.shipped == [("A1", "Porto")]
    assert shop.before == ["A1", "A1"]  # the tool ran again from the top, once
    kinds = [event.kind for event in await shop.store.events(approval_id)]
    assert kinds == ["created", "voted", "decided", "consumed", "finished"]

    # Spent: the same call again asks again (a new question), and nothing is shipped twice.
    again = await shop.executor.run_call(call, shop.executor.context("run_1"))
    assert again.status == "pending"
    assert again.error is not None and again.error.details["approval_id"] != approval_id
    assert shop.shipped == [("A1", "Porto")]


@pytest.mark.parametrize(
    "given_answer", ["2", "PORTO", "Porto", {"type": "respond", "message": "2"}]
)
async def test_a_choice_is_named_by_its_text_or_number(shop: Shop, given_answer: object) -> None:
    _, result = await shop.asked()
    assert result.error is not None
    answer = (
        given_answer
        if isinstance(given_answer, dict)
        else {"action": "respond", "message": given_answer}
    )
    record = await shop.executor.decide(
        result.error.details["approval_id"], answer, decided_by="ana"
    )
    assert answer_of(record) == "Porto"


@pytest.mark.parametrize("wrong", ["Paris", "3", "0", "", "   ", "Leeds or Porto"])
async def test_an_answer_that_is_none_of_the_choices_is_refused_and_records_nothing(
    shop: Shop, wrong: str
) -> None:
    _, result = await shop.asked()
    assert result.error is not None
    approval_id = result.error.details["approval_id"]
    events = len(await shop.store.events(approval_id))

    with pytest.raises(InvalidDecisionError) as refused:
        await shop.executor.decide(
            approval_id, {"action": "respond", "message": wrong}, decided_by="ana"
        )

    assert refused.value.errors[0]["field"] in {"response", "message"}
    record = await shop.store.get(approval_id)
    assert record.status == "pending"
    assert len(await shop.store.events(approval_id)) == events


async def test_a_free_text_question_takes_any_line(shop: Shop) -> None:
    call, result = await shop.asked("note")
    assert result.error is not None
    approval_id = result.error.details["approval_id"]
    record = await shop.store.get(approval_id)
    assert record.request.call_id == "call_A1.ask_parcel_note"
    assert record.request.arguments["choices"] is None

    await shop.executor.decide(
        approval_id, {"type": "respond", "message": "Fragile: glass"}, decided_by="ana"
    )
    resumed = await shop.executor.run_call(call, shop.executor.context("run_1"))

    assert (resumed.status, resumed.value) == ("ok", "Fragile: glass")


async def test_a_declined_question_ends_the_call_and_nothing_after_it_runs(shop: Shop) -> None:
    call, result = await shop.asked()
    assert result.error is not None
    approval_id = result.error.details["approval_id"]

    await shop.executor.decide(
        approval_id, {"action": "deny", "message": "ask the customer"}, decided_by="ana"
    )
    resumed = await shop.executor.run_call(call, shop.executor.context("run_1"))

    assert resumed.status == "error" and resumed.error is not None
    assert resumed.error.kind == "question-unanswered"
    assert resumed.error.details["reason"] == "ask the customer"
    assert resumed.error.details["decided_by"] == "ana"
    assert shop.shipped == []


async def test_the_first_answer_wins(shop: Shop) -> None:
    _, result = await shop.asked()
    assert result.error is not None
    approval_id = result.error.details["approval_id"]
    await shop.executor.decide(
        approval_id, {"action": "respond", "message": "Leeds"}, decided_by="ana"
    )

    with pytest.raises(ApprovalAlreadyDecided):
        await shop.executor.decide(
            approval_id, {"action": "respond", "message": "Porto"}, decided_by="bo"
        )

    assert answer_of(await shop.store.get(approval_id)) == "Leeds"


class FiveMinutes(DeferredApproval):
    """A port that gives every new review a deadline five minutes on, denied at timeout (as
    the bot's rules do with a rule's `timeout`)."""

    def __init__(self, store: MemoryApprovalStore, now: list[datetime]) -> None:
        super().__init__(store)
        self.now = now

    async def request(self, request: ApprovalRequest) -> PortAnswer:
        deadline = self.now[0] + timedelta(minutes=5)
        return await super().request(replace(request, deadline=deadline, on_timeout="deny"))


async def test_a_question_that_times_out_is_unanswered() -> None:
    now = [datetime(2026, 12, 6, 12, tzinfo=UTC)]
    store = MemoryApprovalStore(clock=lambda: now[0])
    shipped: list[tuple[str, str]] = []
    executor = Executor(shop_tools(shipped, []), approval=FiveMinutes(store, now))
    call = ToolCall(name="ship", arguments={"order_id": "A1"}, id="call_1")
    ctx = executor.context("run_1")
    assert (await executor.run_call(call, ctx)).status == "pending"
    now[0] += timedelta(minutes=6)
    [expired] = await store.expire_due()

    resumed = await executor.run_call(call, ctx)

    assert expired.request.tool == QUESTION_TOOL
    assert resumed.error is not None and resumed.error.kind == "question-unanswered"
    assert "nobody decided before the deadline" in resumed.error.message
    assert shipped == []


async def test_a_tool_whose_call_a_reviewer_approved_may_not_ask(shop: Shop) -> None:
    call = ToolCall(name="refund", arguments={"order_id": "R1"}, id="call_r")
    ctx = shop.executor.context("run_1")
    pending = await shop.executor.run_call(call, ctx)
    assert pending.error is not None and pending.error.kind == "approval-pending"
    await shop.executor.decide(pending.error.details["approval_id"], True, decided_by="ana")

    ran = await shop.executor.run_call(call, ctx)

    assert ran.status == "error" and ran.error is not None
    assert ran.error.kind == "invalid-question"
    assert "after a reviewer approved its call" in ran.error.message
    assert shop.shipped == []
    # Nothing was asked: the store holds the refund's review only.
    assert [r.request.tool for r in await shop.store.list()] == ["refund"]


async def test_the_tool_loop_pauses_on_a_question_and_goes_on_with_the_answer(shop: Shop) -> None:
    call = ToolCall(name="ship", arguments={"order_id": "L1"}, id="call_l1")
    chat = ScriptedChat([ChatResponse(tool_calls=[call]), "shipped"])
    ctx = shop.executor.context("run_loop")

    paused = await run_tool_loop(chat, [HumanMessage(content="ship L1")], ctx)

    assert paused.finish == "pending"
    [waiting] = paused.pending
    assert waiting.interrupt.tool_name == "ship"
    await shop.executor.decide(
        waiting.approval_id, {"type": "respond", "message": "Leeds"}, decided_by="ana"
    )

    done = await run_tool_loop(chat, paused.messages, shop.executor.context("run_loop"))

    assert done.finish == "stop" and done.final_text == "shipped"
    assert shop.shipped == [("L1", "Leeds")]
    assert '"L1 from Leeds"' in done.messages[-2].content  # the tool's message


async def test_a_run_asks_outside_any_tool(shop: Shop) -> None:
    ctx = shop.executor.context("run_script")
    with pytest.raises(QuestionPending) as pending:
        await ctx.ask("Go ahead with the migration?", choices=["yes", "no"], id="go")
    record = await shop.store.get(pending.value.approval_id)
    assert record.request.call_id == "ask_go" and record.request.arguments["asked_by"] is None

    await shop.executor.decide(
        record.approval_id, {"action": "respond", "message": "yes"}, decided_by="ana"
    )

    assert await ctx.ask("Go ahead with the migration?", choices=["yes", "no"], id="go") == "yes"


async def test_without_anyone_to_ask_the_question_is_unanswered() -> None:
    shipped: list[tuple[str, str]] = []
    for port, reason in [
        (None, "no approval port configured"),
        (AutoDeny("no people here"), "no people here"),
    ]:
        executor = Executor(shop_tools(shipped, []), approval=port)
        with pytest.raises(QuestionUnanswered, match=reason):
            await executor.context("r").ask("Which one?", choices=WAREHOUSES)
    assert shipped == []


async def test_an_approval_is_no_answer() -> None:
    """A port that approves everything does not answer a question: it stays unanswered."""
    executor = Executor(
        shop_tools([], []), approval=CallbackApproval(lambda request: Decision(approved=True))
    )
    with pytest.raises(QuestionUnanswered, match="approved, not answered"):
        await executor.context("r").ask("Which one?", choices=WAREHOUSES)


async def test_a_callback_answer_outside_the_choices_is_unanswered() -> None:
    answer = Decision(approved=False, response="Paris")
    executor = Executor(shop_tools([], []), approval=CallbackApproval(lambda request: answer))
    with pytest.raises(QuestionUnanswered, match="none of the choices"):
        await executor.context("r").ask("Which one?", choices=WAREHOUSES)
    answer = Decision(approved=False, response="2")
    executor = Executor(shop_tools([], []), approval=CallbackApproval(lambda request: answer))
    assert await executor.context("r").ask("Which one?", choices=WAREHOUSES) == "Porto"


BAD = [
    ({"text": ""}, "question"),
    ({"text": "   "}, "question"),
    ({"text": 7}, "question"),
    ({"text": "x" * (MAX_QUESTION + 1)}, "question"),
    ({"text": "Q?", "choices": ["only"]}, "choices"),
    ({"text": "Q?", "choices": [f"c{i}" for i in range(MAX_CHOICES + 1)]}, "choices"),
    ({"text": "Q?", "choices": "ab"}, "choices"),
    ({"text": "Q?", "choices": ["a", "A "]}, "choices"),
    ({"text": "Q?", "choices": ["a", ""]}, "choices.1"),
    ({"text": "Q?", "choices": ["a", "b" * (MAX_CHOICE + 1)]}, "choices.1"),
    ({"text": "Q?", "choices": ["a", "two\nlines"]}, "choices.1"),
    ({"text": "Q?", "choices": ["a", 3]}, "choices.1"),
    ({"text": "Q?", "id": "a/b"}, "id"),
    ({"text": "Q?", "id": "x" * 41}, "id"),
    ({"text": "Q?", "id": ""}, "id"),
]


@pytest.mark.parametrize(("given_question", "at"), BAD)
async def test_a_question_that_cannot_be_asked_is_refused_before_anything_is_stored(
    given_question: dict[str, object], at: str
) -> None:
    store = MemoryApprovalStore()
    executor = Executor(ToolRegistry(), approval=DeferredApproval(store))
    text = given_question.pop("text")

    with pytest.raises(InvalidQuestionError) as refused:
        await executor.context("r").ask(text, **given_question)  # type: ignore[arg-type]

    assert refused.value.errors[0]["field"] == at
    assert await store.list() == []


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.one_of(st.text(max_size=60), st.integers(), st.none()),
    choices=st.one_of(st.none(), st.lists(st.text(max_size=10), max_size=30)),
    key=st.one_of(st.none(), st.text(max_size=45)),
)
def test_make_question_either_refuses_or_makes_a_question_that_reads_back(
    text: object, choices: list[str] | None, key: str | None
) -> None:
    try:
        question = make_question(text, choices=choices, key=key)
    except InvalidQuestionError as refused:
        errors = refused.errors
        question = None
    if question is None:
        assert errors[0]["field"].split(".")[0] in {"question", "choices", "id"}
        return
    request = question_request(question, run_id="r", call_id="c", requested_by=None)
    assert question_of(request) == question
    if question.choices is not None:
        for number, choice in enumerate(question.choices, 1):
            assert choice_for(question.choices, choice) == choice
            assert choice_for(question.choices, str(number)) == choice


async def test_the_default_id_is_the_same_question_however_often_the_call_runs(shop: Shop) -> None:
    _, first = await shop.asked()
    _, second = await shop.asked()
    assert first.error is not None and second.error is not None
    assert first.error.details["approval_id"] == second.error.details["approval_id"]
    _, other = await shop.asked(order="B2")
    assert other.error is not None
    assert other.error.details["approval_id"] != first.error.details["approval_id"]


async def test_a_resume_answers_the_question_of_a_call_by_its_key(shop: Shop) -> None:
    """Seed 001's `Resume(answers={key: value})`: the asking call's key takes the answer as
    plain text; an answer that is none of the choices, or an approval, records nothing."""
    call = ToolCall(name="ship", arguments={"order_id": "K1"}, id="call_k1")
    chat = ScriptedChat([ChatResponse(tool_calls=[call]), "shipped"])
    paused = await run_tool_loop(
        chat, [HumanMessage(content="ship K1")], shop.executor.context("run_k")
    )
    assert list(paused.interrupts) == ["approve_call_k1"]
    [waiting] = paused.pending

    for wrong in ["Paris", True, {"action": "approve"}]:
        with pytest.raises(InvalidDecisionError):
            await run_tool_loop(
                chat,
                paused.messages,
                shop.executor.context("run_k"),
                answers={"approve_call_k1": wrong},
                decided_by="ana",
            )
        assert (await shop.store.get(waiting.approval_id)).status == "pending"

    done = await run_tool_loop(
        chat,
        paused.messages,
        shop.executor.context("run_k"),
        answers={"approve_call_k1": "porto"},
        decided_by="ana",
    )

    assert done.finish == "stop"
    assert shop.shipped == [("K1", "Porto")]
    assert answer_of(await shop.store.get(waiting.approval_id)) == "Porto"
