"""The bot's work: start runs, and keep moving them on as reviewers decide and deadlines pass.

```
POST /runs ──► start_run ──► running ──► waiting (calls wait for review)
decision (API, later Slack, email) ──► wake ──┐
deadline passed ──────────────────────────────┤
                                             ▼
                  work(): expire_due, then claim_ready ──► advance_run ──► finished / waiting
```

The store is the source of truth: `work` wakes at once when this process records a
decision, and otherwise looks every `workers.poll` seconds, so decisions made by another
process (or a replica) are picked up too, and a restarted bot finishes what a crashed one
left (once the dead worker's `workers.lease` has run out).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import weakref
from collections.abc import Mapping, Sequence
from typing import Protocol

from bot.config import Config
from bot.outbox import Channel, Dispatcher, OutboxStore
from bot.policy import rules_executor
from core import (
    Agent,
    Executor,
    RunConflict,
    RunRecord,
    RunStore,
    StoreError,
    ToolRegistry,
    advance_run,
)

__all__ = ["BotService", "BotStore", "UnknownAgentError"]

log = logging.getLogger(__name__)


CLAIM_BATCH = 10
"""Runs claimed at once by a worker, and moved on side by side."""


class BotStore(OutboxStore, RunStore, Protocol):
    """A store of approvals, their outbox and runs (`SqlApprovalStore`)."""


class UnknownAgentError(LookupError):
    """A run was asked of an agent the configuration does not name."""

    def __init__(self, agent: str, known: list[str]) -> None:
        super().__init__(f"unknown agent {agent!r}; configured agents: {', '.join(known)}")
        self.agent = agent


class BotService:
    """The configured agents over one store, and the worker loop that continues their runs."""

    def __init__(
        self,
        config: Config,
        store: BotStore,
        agents: Mapping[str, Agent],
        *,
        channels: Sequence[Channel] = (),
        worker: str | None = None,
        registry: ToolRegistry | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.agents = dict(agents)
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self.poll = config.workers.poll
        self.lease = float(config.workers.lease)
        # Every agent's tools (`registry`, when the caller has merged them already).
        if registry is None:
            registry = ToolRegistry.merged(agent.tools for agent in self.agents.values())
        self.registry = registry
        self._executors: dict[str, Executor] = {
            name: rules_executor(agent.tools, config, store) for name, agent in agents.items()
        }
        self._wake = asyncio.Event()
        # One event per run someone waits on (GET /runs/{id}?wait): a change wakes only the
        # waiters of that run. Weak: an event nobody waits on any more goes away.
        self._changes: weakref.WeakValueDictionary[str, asyncio.Event] = (
            weakref.WeakValueDictionary()
        )
        self.counters: dict[str, int] = {"runs_started": 0, "runs_advanced": 0}
        """What this process has done since it started, for /metrics."""
        self.dispatcher = Dispatcher(
            store, channels, worker=self.worker, lease=60.0, counters=self.counters
        )

    def agent(self, name: str) -> Agent:
        """The agent called `name`. Raises `UnknownAgentError`."""
        try:
            return self.agents[name]
        except KeyError:
            raise UnknownAgentError(name, sorted(self.agents)) from None

    async def start_run(self, agent: str, text: str, requested_by: str | None) -> RunRecord:
        """Start a run of `agent` on `text` and take it as far as it goes without a person."""
        chosen = self.agent(agent)
        run = await self.store.create_run(
            agent=agent,
            messages=chosen.first_messages(text),
            worker=self.worker,
            requested_by=requested_by,
            lease=self.lease,
        )
        self.counters["runs_started"] += 1
        run = await self._advance(run)
        self._wake.set()  # its calls may wait for review now: announce them
        return run

    def run_changes(self, run_id: str) -> asyncio.Event:
        """An event set the next time this process moves the run on (`GET /runs/{id}?wait`);
        hold on to it while waiting."""
        event = self._changes.get(run_id)
        if event is None:
            event = self._changes[run_id] = asyncio.Event()
        return event

    def _changed(self, run_id: str) -> None:
        event = self._changes.pop(run_id, None)
        if event is not None:
            event.set()

    def decided(self) -> None:
        """Tell the workers a decision was recorded here: a run may be ready now."""
        self._wake.set()

    async def step(self) -> int:
        """Time out overdue reviews, continue every run that is ready, then announce and
        deliver what the outbox holds; how many runs were continued."""
        if await self.store.expire_due():
            log.info("reviews timed out")
        advanced = 0
        while claimed := await self.store.claim_ready(
            worker=self.worker, lease=self.lease, limit=CLAIM_BATCH
        ):
            # The claimed runs go on side by side: one waiting on its database round trips
            # or its tool does not hold up the others.
            outcomes = await asyncio.gather(
                *(self._advance(run) for run in claimed), return_exceptions=True
            )
            for run, outcome in zip(claimed, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    if not isinstance(outcome, Exception):
                        raise outcome  # cancellation, interrupts: not the run's fault
                    log.error("run %s could not go on", run.run_id, exc_info=outcome)
                    continue
                advanced += 1
                self.counters["runs_advanced"] += 1
            if len(claimed) < CLAIM_BATCH:
                break  # that was every ready run; runs ready later wake the workers again
        await self.dispatcher.step()
        return advanced

    async def close(self) -> None:
        """Let go of the channels' connections."""
        await self.dispatcher.close()

    async def work(self, stop: asyncio.Event) -> None:
        """Run `step` whenever woken (by a decision here, or one that the database announces
        from another process), and at least every `poll` seconds, until `stop` is set."""
        listen = getattr(self.store, "listen", None)
        unlisten = await listen(self.decided) if listen is not None else None
        try:
            await self._work(stop)
        finally:
            if unlisten is not None:
                await unlisten()

    async def _work(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._wake.clear()
            try:
                await self.step()
            except StoreError:
                log.exception("the store cannot be used; trying again in %s s", self.poll)
            waiting = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
            try:
                await asyncio.wait(waiting, timeout=self.poll, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in waiting:
                    task.cancel()

    async def _advance(self, run: RunRecord) -> RunRecord:
        try:
            run = await self._advance_once(run)
        finally:
            self._changed(run.run_id)
        if run.status == "finished":
            await self.dispatcher.answer(run.run_id)  # delivered by this step's dispatch
        return run

    async def _advance_once(self, run: RunRecord) -> RunRecord:
        agent = self.agents.get(run.agent)
        if agent is None:
            error = f"agent {run.agent!r} is not configured any more"
            return await self.store.save_run(
                run, status="failed", messages=run.messages, error=error
            )
        try:
            executor = self._executors[run.agent]
            return await advance_run(
                run, agent=agent, executor=executor, runs=self.store, lease=self.lease
            )
        except RunConflict:
            # Another worker took the run over (this one was too slow): its work stands.
            log.warning("run %s was taken over by another worker", run.run_id)
            return await self.store.get_run(run.run_id)
