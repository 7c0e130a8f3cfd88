"""PostgreSQL's notices of decisions: each goes to the processes that listen for them, after
the decision commits, and none when no other process listens (a NOTIFY in a transaction
takes a lock, cluster-wide, held until its commit is durable: deciders then take turns with
their fsyncs). A wait in the deciding process itself is woken without a notice."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from nodbot.core import (
    ApprovalRequest,
    Decision,
    HumanMessage,
    SqlApprovalStore,
    arguments_digest,
    wait_for_decision,
)
from nodbot.core.sqlstore.notices import Teller
from nodbot.core.sqlstore.postgres import DECIDED_CHANNEL, RUNS_CHANNEL

ARGUMENTS = {"order_id": "o-7", "amount": 500.0}
ANA = Decision(approved=True, decided_by="ana")


def ask(call_id: str, **extra: object) -> ApprovalRequest:
    return ApprovalRequest(
        "run_1",
        call_id,
        "refund",
        ARGUMENTS,
        arguments_digest(ARGUMENTS),
        **extra,  # type: ignore[arg-type]
    )


@contextlib.asynccontextmanager
async def overheard(
    url: str, channel: str = DECIDED_CHANNEL
) -> AsyncIterator[Callable[[], Awaitable[list[str]]]]:
    """A plain session (not a nodbot store) that LISTENs to the decisions' channel. Yields
    what returns the run ids of every notice sent since it started: it sends a last notice of
    its own and collects until that arrives, because the server delivers notices in the order
    their transactions committed."""
    heard: asyncio.Queue[str] = asyncio.Queue()
    connection = await asyncpg.connect(url)
    await connection.add_listener(channel, lambda *args: heard.put_nowait(args[3]))

    async def notices() -> list[str]:
        await connection.execute(f"NOTIFY {channel}, 'end'")
        got = []
        async with asyncio.timeout(10):
            while (payload := await heard.get()) != "end":
                got.append(payload)
        return got

    try:
        yield notices
    finally:
        await connection.close()


async def decide_each_way(store: SqlApprovalStore) -> None:
    """A decision, a sole vote, the last of two votes, and a deadline passed: every way a
    review is decided, one review each."""
    decided = await store.create(ask("call_decided"))
    await store.decide(decided.approval_id, ANA)
    voted = await store.create(ask("call_voted"))
    await store.vote(voted.approval_id, ANA)
    two = await store.create(ask("call_two", approvals_required=2))
    await store.vote(two.approval_id, ANA)
    await store.vote(two.approval_id, Decision(approved=True, decided_by="bob"))
    await store.create(ask("call_timed", deadline=datetime.now(UTC) - timedelta(seconds=1)))
    assert len(await store.expire_due()) == 1


@pytest.mark.postgres
async def test_no_notice_goes_out_when_no_other_process_listens(postgres_url: str) -> None:
    async with SqlApprovalStore(postgres_url) as store, overheard(postgres_url) as notices:
        own = await store.listen(lambda: None)  # the deciding store's own listener
        try:
            await decide_each_way(store)
            assert await notices() == []
        finally:
            await own()


@pytest.mark.postgres
async def test_each_decision_is_told_to_another_listening_store(postgres_url: str) -> None:
    async with (
        SqlApprovalStore(postgres_url) as deciding,
        SqlApprovalStore(postgres_url) as elsewhere,
        overheard(postgres_url) as notices,
    ):
        woken = asyncio.Event()
        listening = await elsewhere.listen(woken.set)
        try:
            await decide_each_way(deciding)
            assert await notices() == ["run_1"] * 4
            async with asyncio.timeout(10):
                await woken.wait()
        finally:
            await listening()
        # Once it stops listening, nothing is told any more.
        later = await deciding.create(ask("call_later"))
        await deciding.decide(later.approval_id, ANA)
        assert await notices() == []


@pytest.mark.postgres
async def test_a_decision_wakes_a_wait_of_the_same_store_without_a_notice(
    postgres_url: str,
) -> None:
    async with SqlApprovalStore(postgres_url) as store, overheard(postgres_url) as notices:
        record = await store.create(ask("call_1"))

        async def decide_soon() -> None:
            await asyncio.sleep(0.1)
            await store.decide(record.approval_id, ANA)

        decider = asyncio.create_task(decide_soon())
        started = time.monotonic()
        async with asyncio.timeout(30):
            decided = await wait_for_decision(store, record.approval_id, poll=20)
        await decider
        assert decided.status == "approved"
        assert time.monotonic() - started < 5  # woken at once, not by the 20 s poll
        assert await notices() == []


@pytest.mark.postgres
async def test_a_listener_that_fails_does_not_fail_the_decision(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> None:
        raise RuntimeError("the listener's bug")

    async with SqlApprovalStore(postgres_url) as store:
        listening = await store.listen(broken)
        try:
            record = await store.create(ask("call_1"))
            decided = await store.decide(record.approval_id, ANA)
        finally:
            await listening()
        assert decided.status == "approved"
        assert (await store.get(record.approval_id)).status == "approved"
    assert "a listener of this store's decisions failed" in caplog.text
    assert "the listener's bug" in caplog.text


@pytest.mark.postgres
async def test_a_listener_that_went_away_without_a_word_is_forgotten(postgres_url: str) -> None:
    async with SqlApprovalStore(postgres_url) as store, overheard(postgres_url) as notices:
        # A listener's process died: its session is gone, its entry is left behind.
        admin = await asyncpg.connect(postgres_url)
        try:
            gone = await asyncpg.connect(postgres_url)
            pid = await gone.fetchval("SELECT pg_backend_pid()")
            await gone.close()
            await admin.execute(
                "INSERT INTO listeners (pid, store, since) VALUES ($1, 'gone', now())", pid
            )
        finally:
            await admin.close()
        first = await store.create(ask("call_1"))
        await store.decide(first.approval_id, ANA)
        assert await notices() == ["run_1"]  # told, in case it listens still
        # The next listener to start clears the entry; then nobody else listens.
        listening = await store.listen(lambda: None)
        try:
            second = await store.create(ask("call_2"))
            await store.decide(second.approval_id, ANA)
            assert await notices() == []
        finally:
            await listening()


# --- the teller, on its own ----------------------------------------------------------------


async def test_decisions_made_while_a_notice_is_on_its_way_go_out_together() -> None:
    sent: list[list[str]] = []
    on_its_way, release = asyncio.Event(), asyncio.Event()

    async def send(run_ids: list[str]) -> None:
        sent.append(run_ids)
        on_its_way.set()
        await release.wait()

    teller = Teller(send, "decided runs")
    first = asyncio.create_task(teller.tell(["run_1"]))
    async with asyncio.timeout(10):
        await on_its_way.wait()
    later = [asyncio.create_task(teller.tell([run])) for run in ("run_3", "run_2", "run_3")]
    await asyncio.sleep(0)
    assert not any(task.done() for task in [first, *later])  # each waits for its own notice
    release.set()
    async with asyncio.timeout(10):
        await asyncio.gather(first, *later)
    assert sent == [["run_1"], ["run_2", "run_3"]]


async def test_a_notice_that_cannot_be_sent_is_logged_and_the_decision_stands(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def send(run_ids: list[str]) -> None:
        raise ConnectionResetError("the server went away")

    teller = Teller(send, "decided runs")
    async with asyncio.timeout(10):
        await teller.tell(["run_1"])  # returns: nothing raised to the decider
    assert "could not send the notices of 1 decided runs" in caplog.text
    assert "ConnectionResetError: the server went away" in caplog.text


@pytest.mark.postgres
async def test_a_run_saved_where_it_stops_is_told_to_another_listening_store(
    postgres_url: str,
) -> None:
    """A step's save that leaves a run waiting, finished or failed tells the other stores
    that listen (a wait for the run there answers at once); a save that leaves it running
    tells nobody, nor does any save while only the saving store listens."""
    async with (
        SqlApprovalStore(postgres_url) as saving,
        SqlApprovalStore(postgres_url) as elsewhere,
        overheard(postgres_url, RUNS_CHANNEL) as notices,
    ):
        own = await saving.listen(lambda: None)
        try:
            alone = await saving.create_run(
                agent="a", messages=[HumanMessage(content="hi")], worker="w1"
            )
            await saving.save_run(alone, status="finished", messages=alone.messages)
            assert await notices() == []
            moved: asyncio.Queue[str] = asyncio.Queue()
            listening = await elsewhere.listen(lambda: None, moved.put_nowait)
            try:
                told = []
                for status in ("running", "waiting", "finished", "failed"):
                    run = await saving.create_run(
                        agent="a", messages=[HumanMessage(content=status)], worker="w1"
                    )
                    await saving.save_run(run, status=status, messages=run.messages)
                    if status != "running":
                        async with asyncio.timeout(10):
                            told.append(await moved.get())
                        assert told[-1] == run.run_id
                assert moved.empty()
            finally:
                await listening()
        finally:
            await own()
