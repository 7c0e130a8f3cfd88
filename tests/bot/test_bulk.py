"""`bot.bulk.Decider` itself, on a real SQLite store with the bot's authorizer: what every
channel that decides in bulk relies on beyond what the API and CLI tests show (the runs woken
once per act, also when the store fails midway; a channel's own check asked only after the
rules allowed; a list refused whole before anything is read)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodbot.bot.bulk import MAX_ITEMS, Check, Decider, bulk_problem
from nodbot.bot.config import load_config
from nodbot.bot.policy.authorize import Verdict, authorizer_for
from nodbot.bot.policy.rules import rules_executor
from nodbot.core import (
    ApprovalRecord,
    Decision,
    Executor,
    SqlApprovalStore,
    StoreError,
    ToolCall,
)
from tests.bot.test_bulk_api import ARGUMENTS, CAROL, CONFIG, LEAD, Outage, registry


@dataclass
class Desk:
    """A store with reviews made pending by the rules, and a Decider over it."""

    store: SqlApprovalStore
    executor: Executor
    decider: Decider
    woken: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    runs: int = 0

    async def pending(self, tool: str = "refund", *, requested_by: str = CAROL) -> str:
        self.runs += 1
        call = ToolCall(name=tool, arguments=ARGUMENTS[tool], id="c1")
        context = self.executor.context(f"run_{self.runs}", requested_by=requested_by)
        result = await self.executor.run_call(call, context)
        assert result.error is not None, result
        return str(result.error.details["approval_id"])


@contextlib.asynccontextmanager
async def desk(tmp_path: Path, *, check: Check | None = None) -> AsyncIterator[Desk]:
    path = tmp_path / "nodbot.yml"
    path.write_text(CONFIG)
    config = load_config(path)
    tools = registry()
    url = f"sqlite:///{tmp_path / 'nodbot.db'}"
    async with SqlApprovalStore(url, lock_timeout=0.2) as store:
        woken: list[str] = []
        decider = Decider(
            store,
            tools,
            authorizer_for(config, runs=store),
            "api",
            on_decided=lambda: woken.append("woken"),
            check=check,
        )
        found = Desk(store, rules_executor(tools, config, store), decider, woken)
        yield found


async def test_the_runs_are_woken_once_per_act_that_recorded_something(tmp_path: Path) -> None:
    async with desk(tmp_path) as found:
        ids = [await found.pending() for _ in range(3)]
        outcomes = await found.decider.decide_many(ids, approved=True, who=LEAD)
        assert [o.status for o in outcomes] == ["decided"] * 3
        assert found.woken == ["woken"]
        own = await found.pending(requested_by=LEAD)
        refused = await found.decider.decide_many(
            [own, "apr_unknown", ids[0]], approved=True, who=LEAD
        )
        assert [o.status for o in refused] == ["refused", "not_found", "already_decided"]
        assert found.woken == ["woken"]  # nothing recorded: nothing to wake for
        one = await found.decider.decide_one(await found.pending(), approved=False, who=LEAD)
        assert one.ok and one.record is not None and one.record.status == "denied"
        assert found.woken == ["woken", "woken"]


async def test_a_store_failing_midway_raises_and_still_wakes_the_runs(tmp_path: Path) -> None:
    async with desk(tmp_path) as found:
        ids = [await found.pending() for _ in range(3)]
        await found.decider.decide_one(ids[0], approved=True, who=LEAD)
        found.woken.clear()
        outage = Outage(f"sqlite:///{tmp_path / 'nodbot.db'}")
        first = ids[1]
        real = found.decider.authorize

        async def then_break(handle: str, record: ApprovalRecord, decision: Decision) -> Verdict:
            verdict = await real(handle, record, decision)
            if record.approval_id == ids[2]:
                await outage.start()
            return verdict

        found.decider.authorize = then_break
        try:
            with pytest.raises(StoreError):
                await found.decider.decide_many([first, ids[2]], approved=True, who=LEAD)
        finally:
            await outage.end()
        assert found.woken == ["woken"]  # the decision of `first` is recorded: its run goes on
        assert [(await found.store.get(i)).status for i in ids] == [
            "approved",
            "approved",
            "pending",
        ]


async def test_a_channels_check_is_asked_only_after_the_rules_allowed(tmp_path: Path) -> None:
    asked: list[str] = []

    def no_approvals(record: ApprovalRecord, decision: Decision, verdict: Verdict) -> Verdict:
        asked.append(record.approval_id)
        return Verdict(verdict.person, "no approvals here") if decision.approved else verdict

    async with desk(tmp_path, check=no_approvals) as found:
        allowed, stranger = await found.pending(), await found.pending("send_email")
        outcomes = await found.decider.decide_many([allowed, stranger], approved=True, who=LEAD)
        assert [(o.status, o.error) for o in outcomes] == [
            ("refused", "no approvals here"),
            ("refused", "you are not one of the reviewers of this call"),
        ]
        assert asked == [allowed]
        refused = [e for e in await found.store.events(allowed) if e.kind == "refused"]
        assert [(e.actor, e.channel, e.detail["reason"]) for e in refused] == [
            (LEAD, "api", "no approvals here")
        ]
        denied = await found.decider.decide_many([allowed], approved=False, who=LEAD)
        assert [o.status for o in denied] == ["decided"]


@pytest.mark.parametrize(
    ("ids", "problem"),
    [
        ([], "no reviews are listed"),
        (["a", "b", "a"], "'a' is listed twice"),
        (["a", ""], "item 1 is an empty id"),
        ([f"apr_{n}" for n in range(MAX_ITEMS + 1)], f"{MAX_ITEMS + 1} reviews are listed"),
    ],
)
async def test_a_list_not_accepted_is_refused_before_anything_is_read(
    tmp_path: Path, ids: list[str], problem: str
) -> None:
    async with desk(tmp_path) as found:
        approval_id = await found.pending()
        listed = [approval_id if i == "a" else i for i in ids]
        with pytest.raises(ValueError, match=problem.replace("'a'", repr(approval_id))):
            await found.decider.decide_many(listed, approved=True, who=LEAD)
        assert [e.kind for e in await found.store.events(approval_id)] == ["created"]
        assert found.woken == []


@given(st.lists(st.text(alphabet="ab ", max_size=3), max_size=MAX_ITEMS + 2))
def test_a_list_is_accepted_exactly_when_short_enough_nonempty_and_without_repeats(
    ids: list[str],
) -> None:
    accepted = (
        1 <= len(ids) <= MAX_ITEMS and all(i.strip() for i in ids) and len(set(ids)) == len(ids)
    )
    assert (bulk_problem(ids) is None) == accepted
