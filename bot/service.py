"""The bot's work: start runs, and keep moving them on as reviewers decide and deadlines pass.

```
POST /runs ──► start_run ──► running ──► waiting (calls wait for review)
decision (API, later Slack, email) ──► wake ──┐
deadline passed ──────────────────────────────┤
                                             ▼
                  work(): expire_due, then claim_ready ──► advance_run ──► finished / waiting
                  beside it, the outbox: announce, deliver (reviews, outcomes, answers)
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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from nodbot.bot.config import Config
from nodbot.bot.hosted import HostedRuns
from nodbot.bot.metrics import METRICS
from nodbot.bot.outbox import Channel, Dispatcher, OutboxStore
from nodbot.bot.policy.rules import Authorize, RulesPort, rules_executor
from nodbot.core import (
    Agent,
    ApprovalRecord,
    CallInFlight,
    Executor,
    RunConflict,
    RunRecord,
    RunStore,
    StoreError,
    ToolRegistry,
    advance_run,
)
from nodbot.core.bridges.hosted import HostedAgent, RunStates
from nodbot.core.sqlstore.notices import Listening
from nodbot.core.store import IdempotencyKey

__all__ = ["BotService", "BotStore", "UnknownAgentError", "WorkerHealth"]

log = logging.getLogger(__name__)


CLAIM_BATCH = 10
"""Runs claimed at once by a worker, and moved on side by side."""
ADVANCING_MOST = 32
"""Runs the workers' runs lane moves on at once, each in a task of its own: a run made ready
while others are moving on (their tools running, their saves on the way) is claimed and
started at once, not after the slowest of them."""


class BotStore(OutboxStore, RunStore, Protocol):
    """A store of approvals, their outbox and runs (`SqlApprovalStore`)."""


@runtime_checkable
class MakesDue(Protocol):
    """A channel that may learn that some of its deliveries can go now, sooner than their
    retry (Slack: the bot was invited to a channel that refused its posts): it makes them due
    in the store, then calls `wake_outbox`, which the service sets."""

    wake_outbox: Callable[[], None] | None


class RunChange(asyncio.Event):
    """Set when this process moves a run on (`BotService.run_changes`)."""

    run: RunRecord | None = None
    """The run as the step saved it; None when the step failed."""


FIRST_BACKOFF = 0.1
MOST_BACKOFF = 5.0
"""Seconds a worker waits after a failed step before the next: doubling, up to the most."""

EXPIRY_EVERY = 0.1
"""Seconds the workers' runs lane lets pass between two looks for reviews past their
deadline: it steps at every decision and new run, and a deadline is kept to within this (a
time-out is a decision of seconds, not milliseconds) at the cost of one query, not one a
step."""

ADMIT_LAG = 0.002
"""Seconds: a new run starts once the event loop runs a callback within this long of its
scheduling and the store has a database connection free (`BotService.begin_run`)."""
ADMIT_PAUSE = 0.001
"""Seconds a new run waiting for a database connection to come free pauses between looks."""
ADMIT_WAIT_MOST = 1.0
"""Seconds a new run waits for its start at most: a bot that stays busy still starts runs."""

IN_FLIGHT_LOOK = 0.5
"""Seconds between two looks at a run whose call is in flight in an earlier step, for the
result that step keeps (`core.ports.DeferredApproval`'s `in_flight_wait`)."""

UNHEALTHY_AFTER = 2
"""Failed steps in a row after which the workers count as down (one can be a blip)."""


@dataclass
class WorkerHealth:
    """What the workers of this process last did, as `/healthz` reports it."""

    running: bool = False
    """The worker loop is on (it stops only when the bot does)."""
    listening: Listening | None = None
    """The database's notices, where the store has them."""
    stepped: bool = False
    """A step has succeeded since the workers started (`/readyz` waits for one)."""
    mailbox: str | None = None
    """Why the mailbox of `email.inbound.imap` cannot be read, while it cannot."""
    lanes: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Per lane of the workers (runs, outbox) that is failing: its failures and last error."""
    down: dict[str, str] = field(default_factory=dict)
    """The long-lived tasks of `nodbot serve` that are down, and why (`bot.supervise`)."""
    tasks: set[str] = field(default_factory=set)
    """The long-lived tasks that have been down once (`/metrics` says each up or down)."""

    @property
    def failures(self) -> int:
        """Failed steps since the last one that succeeded, of the lane failing longest."""
        return max(self.lanes.values(), default=(0, ""))[0]

    @property
    def error(self) -> str | None:
        """Why that lane's last step failed, while it keeps failing."""
        return max(self.lanes.values())[1] if self.lanes else None

    def failed(self, exc: Exception, lane: str = "runs") -> None:
        count = self.lanes.get(lane, (0, ""))[0] + 1
        self.lanes[lane] = (count, f"{type(exc).__name__}: {exc}")

    def mailbox_problem(self, reason: str | None) -> None:
        self.mailbox = reason

    def task_down(self, name: str, why: str | None) -> None:
        """Note that the task `name` is down and why, or (None) that it is running again."""
        self.tasks.add(name)
        if why is None:
            self.down.pop(name, None)
        else:
            self.down[name] = why

    def succeeded(self, lane: str = "runs") -> None:
        self.lanes.pop(lane, None)
        self.stepped = True

    def problems(self) -> list[str]:
        """What is wrong, in words; empty when the workers are well."""
        found = [f"the {name} is down: {why}" for name, why in sorted(self.down.items())]
        if not self.running and "workers" not in self.down:
            found.append("the workers are not running")
        elif self.failures >= UNHEALTHY_AFTER:
            found.append(f"the workers' last {self.failures} steps failed: {self.error}")
        if self.listening is not None and not self.listening.connected:
            found.append("the database's notices of decisions are not being received")
        if self.mailbox is not None:
            found.append(f"the replies' mailbox cannot be read: {self.mailbox}")
        return found


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
        hosted: Mapping[str, HostedAgent] | None = None,
        authorize: Authorize | None = None,
    ) -> None:
        self.config = config
        self.authorize = authorize
        """Checks the reviewer of a remembered approval before it decides a call (the bot's
        `Authorizer`, as for a click); None: one of `config`'s `people:` (`RulesPort`)."""
        self.store = store
        self.agents = dict(agents)
        self.hosted = dict(hosted or {})
        """The agents of other frameworks (`framework_agents:`), by name."""
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self.poll = config.workers.poll
        self.lease = float(config.workers.lease)
        # Every agent's tools (`registry`, when the caller has merged them already).
        if registry is None:
            registry = ToolRegistry.merged(agent.tools for agent in self.agents.values())
        self.registry = registry
        METRICS.configure(config, (tool.name for tool in registry))
        self._executors: dict[str, Executor] = {
            name: rules_executor(
                agent.tools, config, store, authorize=authorize, worker=self.worker
            )
            for name, agent in agents.items()
        }
        self._wake = asyncio.Event()
        """Set when runs may be ready (a decision, a new run): the runs' lane looks."""
        self._outbox_wake = asyncio.Event()
        """Set when something may be announced or delivered: the outbox's lane looks."""
        self._decisions = asyncio.Event()
        # One event per run someone waits on (GET /runs/{id}?wait): a change wakes only the
        # waiters of that run. Weak: an event nobody waits on any more goes away.
        self._changes: weakref.WeakValueDictionary[str, RunChange] = weakref.WeakValueDictionary()
        self.counters: dict[str, int] = {"runs_started": 0, "runs_advanced": 0}
        """What this process has done since it started, for /metrics."""
        self.dispatcher = Dispatcher(
            store, channels, worker=self.worker, lease=60.0, counters=self.counters
        )
        for channel in channels:
            if isinstance(channel, MakesDue):
                channel.wake_outbox = self.deliveries_due
        # Runs whose step this worker could not save for a database reason, and finished
        # runs whose answer it could not hand to the outbox: tried again at the next step.
        # Their claim is this worker's until its lease runs out, so nobody else would.
        self._unsaved: set[str] = set()
        self._expiry_looked = float("-inf")
        """When (the loop's clock) the runs' lane last looked for reviews past their deadline."""
        self._unanswered: set[str] = set()
        self._in_flight_until: dict[str, float] = {}
        """Runs of `_unsaved` whose call is in flight elsewhere: when to look again."""
        self._announcing: set[asyncio.Task[None]] = set()
        """The announcements of reviews just opened still going (`_announce_opened`)."""
        self._advancing: set[asyncio.Task[None]] = set()
        """The runs the runs lane is moving on (`_advance_in_lane`)."""
        self._starting = asyncio.Lock()
        """Held by the new run waiting for its start (`_admitted`); the next wait behind it."""
        self._full = False
        """The lane left ready runs unclaimed, having `ADVANCING_MOST` moving on already."""
        self._lane_failure: StoreError | None = None
        """A database failure of a run the lane moved on, which its next step raises."""
        self.health = WorkerHealth()
        """How the workers are doing, for /healthz and /readyz."""
        self._hosted_runs: HostedRuns | None = None
        if self.hosted:
            states = getattr(store, "run_states", None)
            if not isinstance(states, RunStates):
                raise ValueError("framework_agents need a store that keeps run states (SQL)")
            port = RulesPort(config, store, registry=self.registry, authorize=authorize)
            self._hosted_runs = HostedRuns(
                store, states, port, worker=self.worker, lease=self.lease
            )

    def agent(self, name: str) -> Agent:
        """The agent called `name`. Raises `UnknownAgentError`."""
        try:
            return self.agents[name]
        except KeyError:
            raise UnknownAgentError(name, sorted([*self.agents, *self.hosted])) from None

    async def start_run(
        self,
        agent: str,
        text: str,
        requested_by: str | None,
        *,
        started_by: str | None = None,
        idempotency: IdempotencyKey | None = None,
    ) -> RunRecord:
        """Start a run of `agent` on `text` and take it as far as it goes without a person;
        `started_by` who started it for `requested_by`, when another did. With
        `idempotency` (`POST /runs`' key), the run is written at once with the key: raises
        `IdempotencyKeyUsed`, starting nothing, when the key is stored already."""
        run, _ = await self.begin_run(
            agent, text, requested_by, started_by=started_by, idempotency=idempotency
        )
        return run

    async def begin_run(
        self,
        agent: str,
        text: str,
        requested_by: str | None,
        *,
        started_by: str | None = None,
        idempotency: IdempotencyKey | None = None,
    ) -> tuple[RunRecord, list[ApprovalRecord] | None]:
        """`start_run`, and the reviews the run waits for when its first step paused it, as
        read once for the caller to show (None: not read). While the workers run, those
        reviews are announced at once, with the records read (`Dispatcher.announce_opened`),
        instead of by the outbox lane's next read of what is unannounced.

        A busy bot finishes what it has under way before it starts more: a new run waits for
        its start while the event loop is behind with its work or the store waits for
        connections (`_admitted`), so that a decided call runs and a new review is posted
        without queueing behind the first steps of new runs (each a burst of CPU and
        database work)."""
        await self._admitted()
        if agent in self.hosted and self._hosted_runs is not None:
            run = await self._hosted_runs.start(
                agent,
                self.hosted[agent],
                text,
                requested_by,
                started_by=started_by,
                idempotency=idempotency,
            )
            self.counters["runs_started"] += 1
            self._changed(run.run_id)
            self._outbox_wake.set()  # its calls may wait for review now: announce them
            return run, None
        chosen = self.agent(agent)
        # A draft: the run, the reviews its first step opens and the step's save are written
        # in one transaction (with a SQL store), by the save; while the workers run, the
        # reviews are announced in it too (where the store can), their deliveries made
        # claimed by this worker, which starts them once the save is written.
        run = await self.store.draft_run(
            agent=agent,
            messages=chosen.first_messages(text),
            worker=self.worker,
            requested_by=requested_by,
            lease=self.lease,
            started_by=started_by,
            announcer=self.dispatcher if self.health.running else None,
            idempotency=idempotency,  # written at once with its key, then: no draft
        )
        self.counters["runs_started"] += 1
        try:
            run = await self._advance(run)
        except StoreError:
            raise  # the draft is kept: the step is tried again (`_again`), which writes it
        except BaseException:
            self.store.forget_draft(run.run_id)  # never saved, so never written
            raise
        # As its first save wrote them, when the store knows (a SQL store's draft): a read
        # less an approval; a review decided meanwhile is then shown pending, as the run is
        # shown as saved.
        opened = self.store.opened_reviews(run.run_id)
        if opened is not None and opened.deliveries is not None:
            self.dispatcher.start_opened(opened)  # announced by the save: claimed by us
            if run.status == "waiting":
                return run, opened.reviews
        if run.status != "waiting":
            self._outbox_wake.set()  # what the step decided: the lane announces it
            return run, None
        try:
            if opened is not None:
                reviews = opened.reviews
            else:
                reviews = await self.store.list(run_id=run.run_id)
        except BaseException:
            self._outbox_wake.set()  # the lane announces what it opened
            raise
        pending = [record for record in reviews if record.status == "pending"]
        if len(pending) < len(reviews) or not self._announce_opened(pending):
            self._outbox_wake.set()  # a review decided already, or no workers: the lane
        return run, pending

    async def _admitted(self) -> None:
        """Wait until a new run may start: the event loop runs what is ready within
        `ADMIT_LAG` and the store is not `backlogged`, or `ADMIT_WAIT_MOST` has gone by.
        The loop is looked at once a turn of it (a turn of a loop that is behind is long, so
        the looks cost little), the store every `ADMIT_PAUSE` while the loop is not behind.
        New runs wait one at a time, in the order they came; an idle bot starts one after a
        single turn of its loop. Models and tools that wait on the network keep the loop
        free, so they hold up nobody's start."""
        loop = asyncio.get_running_loop()
        async with self._starting:
            until = loop.time() + ADMIT_WAIT_MOST
            while True:
                asked = loop.time()
                await asyncio.sleep(0)  # resumed once every callback ready before it has run
                now = loop.time()
                if now >= until:
                    return
                if now - asked > ADMIT_LAG:
                    continue  # behind: look again after the next turn, which takes as long
                if not self._backlogged():
                    return
                await asyncio.sleep(ADMIT_PAUSE)

    def _backlogged(self) -> bool:
        """Whether the store's operations wait for a database connection now (a store that
        does not say never does)."""
        return bool(getattr(self.store, "backlogged", False))

    def _announce_opened(self, records: list[ApprovalRecord]) -> bool:
        """Announce reviews just opened, in a task of their own (the caller answers
        meanwhile), while the workers run; whether it was started. On a failure the outbox
        lane is woken, which finds what is left unannounced."""
        if not self.health.running or not records:
            return False  # no workers (`nodbot runs start`): whoever runs them announces
        task = asyncio.get_running_loop().create_task(self._announcing_opened(records))
        self._announcing.add(task)
        task.add_done_callback(self._announcing.discard)
        return True

    async def _announcing_opened(self, records: list[ApprovalRecord]) -> None:
        try:
            await self.dispatcher.announce_opened(records)
        except Exception:
            log.warning(
                "new reviews could not be announced at once; the outbox lane will", exc_info=True
            )
            self._outbox_wake.set()

    def run_changes(self, run_id: str) -> RunChange:
        """An event set the next time this process moves the run on (`GET /runs/{id}?wait`),
        with the run as that step saved it; hold on to it while waiting."""
        event = self._changes.get(run_id)
        if event is None:
            event = self._changes[run_id] = RunChange()
        return event

    def _changed(self, run_id: str, run: RunRecord | None = None) -> None:
        event = self._changes.pop(run_id, None)
        if event is not None:
            event.run = run
            event.set()

    def decided(self) -> None:
        """Tell the workers a decision was recorded here: a run may be ready now, and the
        decision's outcome is to be announced where a channel tells outcomes (none does:
        the outbox lane is not woken for nothing). Whoever waits on `decisions` is woken
        too."""
        self._wake.set()
        if self.dispatcher.tells_outcomes:
            self._outbox_wake.set()
        self._decided()

    def deliveries_due(self) -> None:
        """Tell the outbox's lane that a channel made deliveries due now (Slack: the bot was
        invited to a channel that refused its posts): it claims them at once, instead of at
        its next look (`workers.poll`)."""
        self.dispatcher.due_now()
        self._outbox_wake.set()

    def _decided(self) -> None:
        self._decisions.set()
        self._decisions = asyncio.Event()

    def decisions(self) -> asyncio.Event:
        """An event set at the next decision recorded by this process (`GET
        /approvals/{id}?wait`); take it before reading the store, so none is missed."""
        return self._decisions

    async def step(self) -> int:
        """Time out overdue reviews and continue every run that is ready while the outbox
        announces and delivers what it holds, so that a new review is posted without waiting
        for the runs; then the outbox once more for what the runs moved on (outcomes, new
        reviews); how many runs were continued."""
        moved, dispatched = await asyncio.gather(
            self._move_runs(), self.dispatcher.step(), return_exceptions=True
        )
        if isinstance(moved, BaseException):
            raise moved  # the runs' failure first: it is what the worker backs off for
        if isinstance(dispatched, BaseException):
            raise dispatched
        expired, advanced = moved
        if expired or advanced:
            await self.dispatcher.step()
        return advanced

    async def _move_runs(self) -> tuple[bool, int]:
        """Time out overdue reviews and continue every ready run, until each has moved on:
        whether any timed out, and how many runs were continued (`step`; the workers' lane
        is `_move_and_tell`)."""
        expired = bool(timed_out := await self.store.expire_due())
        METRICS.timed_out(timed_out)
        if expired:
            log.info("reviews timed out")
            self._decided()
        advanced = await self._again()
        unavailable: StoreError | None = None
        while claimed := await self.store.claim_ready(
            worker=self.worker, lease=self.lease, limit=CLAIM_BATCH
        ):
            # The claimed runs go on side by side: one waiting on its database round trips
            # or its tool does not hold up the others.
            outcomes = await asyncio.gather(
                *(self._advance(run) for run in claimed), return_exceptions=True
            )
            for run, outcome in zip(claimed, outcomes, strict=True):
                if isinstance(outcome, StoreError):
                    unavailable = unavailable or outcome
                    continue  # tried again (`_again`) once the store answers
                if isinstance(outcome, BaseException):
                    if not isinstance(outcome, Exception):
                        raise outcome  # cancellation, interrupts: not the run's fault
                    log.error("run %s could not go on", run.run_id, exc_info=outcome)
                    continue
                advanced += 1
                self.counters["runs_advanced"] += 1
            if unavailable is not None or len(claimed) < CLAIM_BATCH:
                break  # that was every ready run; runs ready later wake the workers again
        if unavailable is not None:
            raise unavailable  # the step failed: the worker backs off and tries again
        return expired, advanced

    async def close(self) -> None:
        """Let go of the channels' connections, and of the agents' models' (a model with an
        `aclose`, such as `ChatCompletionsModel` with a session of its own)."""
        await self.dispatcher.close()
        for agent in self.agents.values():
            closing = getattr(agent.chat, "aclose", None)
            if closing is not None:
                try:
                    await closing()
                except Exception:
                    log.exception("the model of an agent could not be closed")

    async def work(self, stop: asyncio.Event) -> None:
        """Run `step` whenever woken (by a decision here, or one that the database announces
        from another process), and at least every `poll` seconds, until `stop` is set.

        Nothing but `stop` ends it: a step that fails (the database unreachable, a channel's
        bug) is logged and tried again after a backoff, `health` saying so meanwhile, and
        the database's notices are listened to again whenever their connection is lost.
        """
        self.health.running = True
        try:
            await self._work(stop)
        finally:
            self.health.running = False
            if self.health.listening is not None:
                await self.health.listening()
                self.health.listening = None

    async def _listen(self) -> None:
        listen = getattr(self.store, "listen", None)  # the memory store has no notices
        listening = self.health.listening
        if listening is not None and listening.ended:  # it gave up: listen again
            await listening()
            self.health.listening = None
            log.warning("listening to the database's notices again")
        if self.health.listening is None and listen is not None:
            self.health.listening = await listen(self.decided, self._changed)

    async def _work(self, stop: asyncio.Event) -> None:
        """Two lanes side by side: the runs (time-outs, ready runs) and the outbox (announce,
        deliver), so that a review is posted while runs move on, however many there are."""
        # A task group: what ends one lane (a cancellation, an interrupt) ends the other too.
        try:
            async with asyncio.TaskGroup() as lanes:
                lanes.create_task(self._lane(stop, self._wake, self._move_and_tell, "runs"))
                outbox = self.dispatcher.start_step  # deliveries go on beside the next steps
                lanes.create_task(self._lane(stop, self._outbox_wake, outbox, "outbox"))
                lanes.create_task(self._stopping(stop))
        finally:
            while self._advancing:  # the runs moving on end (their tools return) first
                await asyncio.wait(list(self._advancing))
            while self._announcing:  # they start deliveries: before those are drained
                await asyncio.wait(list(self._announcing))
            await self.dispatcher.drain()  # the deliveries under way end before the channels

    async def _move_and_tell(self) -> None:
        """The runs lane's step: time-outs, the runs left to try again, then the ready runs
        claimed and each started in a task of its own (`_advance_in_lane`), which tells the
        outbox when it has moved its run on. A task's database failure fails the next step
        (so the lane backs off, and `/healthz` says so), which tries the run again."""
        await self._listen()
        failure, self._lane_failure = self._lane_failure, None
        if failure is not None:
            raise failure
        now = asyncio.get_running_loop().time()
        if now - self._expiry_looked >= EXPIRY_EVERY:
            self._expiry_looked = now
            if timed_out := await self.store.expire_due():
                METRICS.timed_out(timed_out)
                log.info("reviews timed out")
                self._decided()
                self._outbox_wake.set()  # their outcomes
        if self._unsaved or self._unanswered:
            await self._again()
            self._outbox_wake.set()  # what those steps and answers made
        while (room := ADVANCING_MOST - len(self._advancing)) > 0:
            limit = min(CLAIM_BATCH, room)
            claimed = await self.store.claim_ready(
                worker=self.worker, lease=self.lease, limit=limit
            )
            for run in claimed:
                task = asyncio.get_running_loop().create_task(self._advance_in_lane(run))
                self._advancing.add(task)
                task.add_done_callback(self._advanced)
            if len(claimed) < limit:
                return  # that was every ready run; runs ready later wake the lane again
        self._full = True  # more may be ready: the lane looks again when a task ends

    async def _advance_in_lane(self, run: RunRecord) -> None:
        try:
            run = await self._advance(run)
        except CallInFlight:
            self._look_again_later(run.run_id)  # tried again (`_again`): no store failure
            return
        except StoreError as exc:
            # Tried again (`_again`) by the next step, which this failure fails first.
            self._lane_failure = self._lane_failure or exc
            self._wake.set()
            return
        except Exception:
            log.exception("run %s could not go on", run.run_id)
            return
        self.counters["runs_advanced"] += 1
        dispatcher = self.dispatcher
        if run.status != "finished" or dispatcher.tells_outcomes or dispatcher.answers:
            self._outbox_wake.set()  # the reviews of a run that paused again, outcomes, answers

    def _advanced(self, task: asyncio.Task[None]) -> None:
        self._advancing.discard(task)
        if self._full:
            self._full = False
            self._wake.set()  # there is room again: claim what is ready

    async def _lane(
        self,
        stop: asyncio.Event,
        wake: asyncio.Event,
        step: Callable[[], Awaitable[object]],
        lane: str,
    ) -> None:
        backoff = FIRST_BACKOFF
        while not stop.is_set():
            wake.clear()
            try:
                await step()
            except Exception as exc:
                self.health.failed(exc, lane)
                if isinstance(exc, StoreError):
                    log.error("the store cannot be used (%s); trying again in %.1f s", exc, backoff)
                else:
                    log.exception(
                        "a worker step failed (%s); trying again in %.1f s", lane, backoff
                    )
                pause, backoff = backoff, min(backoff * 2, MOST_BACKOFF)
            else:
                self.health.succeeded(lane)
                pause, backoff = self.poll, FIRST_BACKOFF
            # Until woken, or `pause` is up (the timer wakes it too), or `stop` is set (which
            # wakes it: `_stopping`). One future and one timer: no task, at every step.
            timer = asyncio.get_running_loop().call_later(pause, wake.set)
            try:
                await wake.wait()
            finally:
                timer.cancel()

    async def _stopping(self, stop: asyncio.Event) -> None:
        """Wake both lanes once `stop` is set, so that they see it and end."""
        await stop.wait()
        self._wake.set()
        self._outbox_wake.set()

    async def _again(self) -> int:
        """Take the steps on that failed for a database reason, with the run as saved."""
        advanced = 0
        for run_id in list(self._unanswered):
            await self.dispatcher.answer(run_id)
            self._unanswered.discard(run_id)
        now = asyncio.get_running_loop().time()
        for run_id in list(self._unsaved):
            if self._in_flight_until.get(run_id, now) > now:
                continue  # its call in flight is looked at again later (`_look_again_later`)
            self._in_flight_until.pop(run_id, None)
            run = await self.store.get_run(run_id)
            self._unsaved.discard(run_id)
            if run.status != "running" or run.claimed_by != self.worker:
                continue  # saved after all (its answer was lost), or taken over since
            try:
                await self._advance(run)
            except CallInFlight:
                self._look_again_later(run_id)  # still in flight: kept in `_unsaved`
                continue
            advanced += 1
        return advanced

    def _look_again_later(self, run_id: str) -> None:
        """Look at a run whose call is in flight in an earlier step (`CallInFlight`) again in
        `IN_FLIGHT_LOOK` seconds, not before: it waits in `_unsaved` meanwhile, and the
        runs' lane is woken then."""
        loop = asyncio.get_running_loop()
        self._in_flight_until[run_id] = loop.time() + IN_FLIGHT_LOOK
        loop.call_later(IN_FLIGHT_LOOK, self._wake.set)

    async def _advance(self, run: RunRecord) -> RunRecord:
        before = run.status
        moved = None
        try:
            run = moved = await self._advance_once(run)
        except StoreError:
            self._unsaved.add(run.run_id)
            raise
        finally:
            self._changed(run.run_id, moved)
        log.info(
            "run step",
            extra={
                "run_id": run.run_id,
                "agent": run.agent,
                "status_before": before,
                "status_after": run.status,
            },
        )
        if run.status == "finished":
            try:
                await self.dispatcher.answer(run.run_id)  # delivered by this step's dispatch
            except StoreError:
                self._unanswered.add(run.run_id)
                raise
        return run

    async def _advance_once(self, run: RunRecord) -> RunRecord:
        hosted = self.hosted.get(run.agent)
        if hosted is not None and self._hosted_runs is not None:
            try:
                return await self._hosted_runs.advance(run, hosted)
            except RunConflict:
                log.warning("run %s was taken over by another worker", run.run_id)
                return await self.store.get_run(run.run_id)
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
