"""The configuration's rules as the executor's approval port.

Every call is put to `RulesPort`, and the first rule of the file that matches it decides:

| first matching rule     | the call                                                    |
|-------------------------|-------------------------------------------------------------|
| none                    | runs without review                                         |
| `decision: approve`     | runs, decided by `nodbot:rules.<n>`                         |
| `decision: deny`        | is denied, with the rule's description as the reason        |
| `reviewers: [...]`      | waits in the store for a person (`DeferredApproval`), until  |
|                         | the rule's `timeout`, when `expire_due` applies its          |
|                         | `timeout_decision`                                          |

`<n>` is the rule's position in the file (from 0), as in the configuration's error messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from bot.config import Config
from core import (
    ApprovalRequest,
    ApprovalStore,
    Decided,
    Decision,
    DeferredApproval,
    Executor,
    InterruptRule,
    PortAnswer,
    ToolRegistry,
)
from core.store import utc_now

__all__ = ["RulesPort", "rules_executor"]

NO_RULE = "nodbot:no-rule"
"""Who `decided` a call that no rule covers: nobody had to."""


class RulesPort(DeferredApproval):
    """A deferred approval port with the rules of `config` in front: reviews wait in `store`
    (so `Executor.decide` works as with `DeferredApproval`), the rest is decided at once."""

    def __init__(
        self, config: Config, store: ApprovalStore, *, clock: Callable[[], datetime] = utc_now
    ) -> None:
        super().__init__(store)
        self.config = config
        self._clock = clock

    async def request(self, request: ApprovalRequest) -> PortAnswer:
        for index, rule in enumerate(self.config.rules):
            if not rule.covers(request.tool, request.arguments):
                continue
            by = f"nodbot:rules.{index}"
            if rule.decision == "approve":
                return Decided(Decision(approved=True, reason=rule.description, decided_by=by))
            if rule.decision == "deny":
                reason = rule.description or f"denied by rule {index} of the configuration"
                return Decided(Decision(approved=False, reason=reason, decided_by=by))
            if rule.timeout is not None:
                # Only a new review takes this deadline: an existing one keeps its own.
                deadline = self._clock() + timedelta(seconds=rule.timeout)
                request = replace(request, deadline=deadline, on_timeout=rule.timeout_decision)
            return await super().request(request)
        return Decided(Decision(approved=True, decided_by=NO_RULE))


def rules_executor(
    registry: ToolRegistry,
    config: Config,
    store: ApprovalStore,
    *,
    clock: Callable[[], datetime] = utc_now,
) -> Executor:
    """An executor over `registry` that puts every call to the rules of `config`; `clock`
    dates the deadlines of new reviews."""
    every_call: Sequence[InterruptRule] = (InterruptRule(tool="*"),)
    return Executor(registry, approval=RulesPort(config, store, clock=clock), rules=every_call)
